"""Dataset loading, normalisation, splits, and the torchvision paths against tiny real-format files.

The torchvision tests write small files in each dataset's real on-disk format under a temporary
root and patch the md5 constants on torchvision's classes, so torchvision's own integrity checks
and readers run unchanged, with no network.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import http.server
import io
import pickle
import socket
import struct
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import datasets as tvd

from fedfactor.cli import main
from fedfactor.data import DATASETS, augment_batch, dataset_info, load_dataset, make_splits, prepare_dataset
from fedfactor.data.augment import default_pad
from fedfactor.errors import UsageError

TINY = type(DATASETS.get("tinyimagenet"))  # its URL and MD5 are patched like torchvision's constants


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def expected_x(parts: list[np.ndarray]) -> np.ndarray:
    """What load_dataset should return: parts stacked, normalised with the first part's stats."""
    train = parts[0].astype(np.float64)
    mean = train.mean(axis=(0, 2, 3), keepdims=True)
    std = train.std(axis=(0, 2, 3), keepdims=True)
    return (np.concatenate(parts).astype(np.float64) - mean) / std


def images(rng: np.random.Generator, n: int, c: int, h: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, c, h, h), dtype=np.uint8)


def assert_one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.strip() == text and text
    return text


# ---------------------------------------------------------------------------------------------
# Real-format writers


def write_cifar(root: Path, cls: type, n_train: int = 15, n_test: int = 4, seed: int = 0) -> dict:
    """cifar-10-batches-py/data_batch_1..5 + test_batch + batches.meta, or cifar-100-python/
    train + test + meta: pickled dicts with data [n, 3072] (CHW order) and label lists."""
    rng = np.random.default_rng(seed)
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    is_100 = cls is tvd.CIFAR100
    classes = 100 if is_100 else 10
    label_key = "fine_labels" if is_100 else "labels"

    def dump(name: str, x: np.ndarray, y: np.ndarray) -> None:
        entry = {"data": x.reshape(len(x), -1), label_key: y.tolist(), "filenames": ["f.png"] * len(x)}
        if is_100:
            entry["coarse_labels"] = (y // 5).tolist()
        (folder / name).write_bytes(pickle.dumps(entry))

    train_names = [f for f, _ in cls.train_list]
    per_file = [n_train // len(train_names)] * len(train_names)  # CIFAR-10 has 5 files, CIFAR-100 one
    xs = [images(rng, n, 3, 32) for n in per_file]
    ys = [rng.integers(0, classes, size=n) for n in per_file]
    for name, x, y in zip(train_names, xs, ys):
        dump(name, x, y)
    x_test, y_test = images(rng, n_test, 3, 32), rng.integers(0, classes, size=n_test)
    dump(cls.test_list[0][0], x_test, y_test)
    meta_key = cls.meta["key"]
    (folder / cls.meta["filename"]).write_bytes(pickle.dumps({meta_key: [f"c{i}" for i in range(classes)]}))
    return {
        "x": [np.concatenate(xs), x_test],
        "y": np.concatenate([*ys, y_test]),
        "train_list": [[f, md5(folder / f)] for f in train_names],
        "test_list": [[cls.test_list[0][0], md5(folder / cls.test_list[0][0])]],
        "meta": {**cls.meta, "md5": md5(folder / cls.meta["filename"])},
    }


def patch_cifar(monkeypatch: pytest.MonkeyPatch, cls: type, written: dict) -> None:
    for attr in ("train_list", "test_list", "meta"):
        monkeypatch.setattr(cls, attr, written[attr])


def write_svhn(folder: Path, n_train: int = 7, n_test: int = 5, seed: int = 1) -> dict:
    """train_32x32.mat / test_32x32.mat: X is H x W x C x N uint8, y is N x 1 with 10 for digit 0."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict = {"x": [], "y": [], "split_list": {}}
    for split, n in (("train", n_train), ("test", n_test)):
        x = images(rng, n, 3, 32)
        digits = np.arange(n) % 10  # every split holds a 0, stored as 10
        raw = np.where(digits == 0, 10, digits).astype(np.uint8)[:, None]
        path = folder / f"{split}_32x32.mat"
        scipy.io.savemat(path, {"X": x.transpose(2, 3, 1, 0), "y": raw})
        out["x"].append(x)
        out["y"].append(digits)
        url, name, _ = tvd.SVHN.split_list[split]
        out["split_list"][split] = [url, name, md5(path)]
    out["split_list"]["extra"] = tvd.SVHN.split_list["extra"]
    out["y"] = np.concatenate(out["y"])
    return out


def idx_bytes(array: np.ndarray) -> bytes:
    """The idx format: magic (0x08 = uint8, then the number of dims), big-endian dims, data."""
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(folder: Path, gz_only: bool = False, n_train: int = 6, n_test: int = 3, seed: int = 2) -> dict:
    """MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte, plus the .gz torchvision downloads."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict = {"x": [], "y": [], "resources": []}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, size=n)
        for name, arr in ((f"{prefix}-images-idx3-ubyte", x), (f"{prefix}-labels-idx1-ubyte", y)):
            data = idx_bytes(arr)
            if not gz_only:
                (folder / name).write_bytes(data)
            gz = folder / f"{name}.gz"
            gz.write_bytes(gzip.compress(data))
            out["resources"].append((gz.name, md5(gz)))
        out["x"].append(x[:, None])
        out["y"].append(y)
    out["y"] = np.concatenate(out["y"])
    return out


TINY_WNIDS = ["n03", "n01", "n02"]  # not sorted: labels must follow the file's order
TINY_TRAIN_PER_CLASS = [2, 3, 2]
TINY_VAL_WNIDS = ["n02", "n03", "n01", "n02"]


def write_tiny_imagenet(root: Path, seed: int = 3) -> dict:
    """tiny-imagenet-200/ as in the cs231n zip: wnids.txt, words.txt, train/<wnid>/images/<wnid>_<n>.JPEG
    (one of them greyscale) with <wnid>_boxes.txt, val/images/val_<n>.JPEG with val/val_annotations.txt,
    and an unlabelled test/images part. The expected arrays are the JPEGs as PIL decodes them."""
    rng = np.random.default_rng(seed)
    folder = root / "tiny-imagenet-200"
    (folder / "test" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("".join(f"{w}\n" for w in TINY_WNIDS))
    (folder / "words.txt").write_text("".join(f"{w}\tthing {w}\n" for w in sorted(TINY_WNIDS)))

    def jpeg(path: Path, grey: bool = False) -> np.ndarray:
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(64, 64) if grey else (64, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        with Image.open(path) as image:
            assert image.mode == ("L" if grey else "RGB")
            return np.asarray(image.convert("RGB")).transpose(2, 0, 1)

    x_train, y_train = [], []
    for label, (wnid, n) in enumerate(zip(TINY_WNIDS, TINY_TRAIN_PER_CLASS)):
        images_dir = folder / "train" / wnid / "images"
        x_train += [jpeg(images_dir / f"{wnid}_{i}.JPEG", grey=(label, i) == (1, 1)) for i in range(n)]
        y_train += [label] * n
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text(f"{wnid}_0.JPEG\t0\t0\t63\t63\n")
    x_val = [jpeg(folder / "val" / "images" / f"val_{i}.JPEG") for i in range(len(TINY_VAL_WNIDS))]
    (folder / "val" / "val_annotations.txt").write_text(
        "".join(f"val_{i}.JPEG\t{w}\t1\t2\t60\t61\n" for i, w in enumerate(TINY_VAL_WNIDS))
    )
    jpeg(folder / "test" / "images" / "test_0.JPEG")
    y_val = [TINY_WNIDS.index(w) for w in TINY_VAL_WNIDS]
    return {"x": [np.stack(x_train), np.stack(x_val)], "y": np.array(y_train + y_val), "grey": 3}


def check_loaded(ds, written: dict, n_train: int) -> None:
    assert ds.n_official_train == n_train
    assert ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
    np.testing.assert_array_equal(ds.y.numpy(), written["y"])
    np.testing.assert_allclose(ds.x.numpy(), expected_x(written["x"]), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Registry, info, digits


def test_registry_lists_every_dataset_with_one_line_descriptions():
    names = [n for n, _ in DATASETS.describe()]
    assert names == ["cifar10", "cifar100", "digits", "femnist", "mnist", "npz:PATH", "shakespeare", "svhn",
                     "synthetic:NAME", "tinyimagenet"]
    assert all(d and "\n" not in d for _, d in DATASETS.describe())


@pytest.mark.parametrize(
    "name, shape, classes, augment",
    [
        ("digits", (1, 8, 8), 10, "none"),
        ("mnist", (1, 28, 28), 10, "crop"),
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
    with pytest.raises(UsageError, match="choose one of: cifar10, cifar100, digits, femnist, mnist, npz:PATH, "
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


def test_digits_copied_by_prepare_load_bit_for_bit_without_scikit_learn(tmp_path, monkeypatch, caplog):
    source = load_dataset("digits", tmp_path)  # no copy in the root yet: read from scikit-learn
    assert not (tmp_path / "digits.npz").exists()  # a training job's read writes nothing
    prepare_dataset("digits", tmp_path)
    with np.load(tmp_path / "digits.npz") as f:
        assert (f["x_train"].dtype, f["x_train"].shape, f["y_train"].dtype) == (np.float32, (1797, 1, 8, 8), np.int64)
        assert f["x_test"].shape == (0, 1, 8, 8) and f["y_test"].shape == (0,)
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind

    def no_sklearn():
        raise AssertionError("read scikit-learn although the root holds digits.npz")

    with monkeypatch.context() as m:
        m.setattr(DATASETS.get("digits"), "_from_sklearn", no_sklearn)
        copied = load_dataset("digits", tmp_path)
    assert torch.equal(copied.x, source.x) and torch.equal(copied.y, source.y)  # bitwise: the same results
    assert copied.n_official_train == source.n_official_train == 1797

    (tmp_path / "digits.npz").write_bytes(b"half a file")  # unreadable: scikit-learn again, with a warning
    with caplog.at_level("WARNING", logger="fedfactor"):
        again = load_dataset("digits", tmp_path)
    assert torch.equal(again.x, source.x) and "digits.npz" in caplog.text
    prepare_dataset("digits", tmp_path)  # prepare-data repairs the copy
    with np.load(tmp_path / "digits.npz") as f:
        np.testing.assert_array_equal(f["y_train"], source.y.numpy())


def test_bad_device_is_a_usage_error():
    with pytest.raises(UsageError, match="not a torch device"):
        load_dataset("digits", device="gpu0")


# ---------------------------------------------------------------------------------------------
# make_splits


@pytest.mark.parametrize("n, counts", [(60000, (48000, 6000, 6000)), (99289, (79431, 9929, 9929))])
def test_pooled_split_counts_match_the_official_code(n, counts):
    s = make_splits(n, n - 10000, (0.8, 0.1, 0.1), "pooled", seed=0)
    assert (len(s["train"]), len(s["val"]), len(s["test"])) == counts


def test_pooled_splits_are_disjoint_sorted_covering_and_seeded():
    n = 1000
    s = make_splits(n, 800, seed=3)
    everything = np.concatenate([s["train"], s["val"], s["test"]])
    assert np.array_equal(np.sort(everything), np.arange(n))
    for idx in s.values():
        assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    again = make_splits(n, 800, seed=3)
    assert all(np.array_equal(s[k], again[k]) for k in s)
    other = make_splits(n, 800, seed=4)
    assert not np.array_equal(s["test"], other["test"])
    # pooled mode mixes official test samples (>= 800) into train
    assert np.any(s["train"] >= 800)


def test_pooled_order_is_train_then_test_then_val():
    perm = np.random.default_rng(5).permutation(100)
    s = make_splits(100, 100, (0.7, 0.2, 0.1), seed=5)
    assert np.array_equal(s["train"], np.sort(perm[:70]))
    assert np.array_equal(s["test"], np.sort(perm[70:80]))
    assert np.array_equal(s["val"], np.sort(perm[80:]))


def test_official_split_keeps_the_official_test_part():
    s = make_splits(1000, 700, (0.8, 0.1, 0.1), "official", seed=0)
    assert np.array_equal(s["test"], np.arange(700, 1000))
    assert np.all(s["train"] < 700) and np.all(s["val"] < 700)
    assert len(s["train"]) == round(700 * 0.8 / 0.9) and len(s["train"]) + len(s["val"]) == 700
    assert len(np.intersect1d(s["train"], s["val"])) == 0


@pytest.mark.parametrize(
    "args, match",
    [
        ((100, 100, (0.8, 0.1, 0.1), "official"), "no official test part"),
        ((100, 50, (0.8, 0.1, 0.2), "pooled"), "sum"),
        ((100, 50, (1.1, -0.1, 0.0), "pooled"), "non-negative"),
        ((100, 50, (0.5, 0.5), "pooled"), "three"),
        ((100, 50, (0.8, 0.1, 0.1), "random"), "split mode"),
        ((100, 150, (0.8, 0.1, 0.1), "pooled"), "n_official_train"),
    ],
)
def test_bad_split_arguments_are_usage_errors(args, match):
    with pytest.raises(UsageError, match=match):
        make_splits(*args)


# ---------------------------------------------------------------------------------------------
# npz:PATH


def test_npz_3d_and_4d_load(tmp_path):
    rng = np.random.default_rng(0)
    x3 = rng.integers(0, 255, size=(20, 6, 5)).astype(np.uint8)
    y = np.arange(20) % 4
    np.savez(tmp_path / "a.npz", x=x3, y=y)
    ds = load_dataset(f"npz:{tmp_path / 'a.npz'}")
    assert ds.x.shape == (20, 1, 6, 5) and ds.n_official_train == 20
    assert ds.info == dataset_info(f"npz:{tmp_path / 'a.npz'}")
    assert (ds.info.channels, ds.info.height, ds.info.width, ds.info.num_classes) == (1, 6, 5, 4)
    np.testing.assert_allclose(ds.x.numpy(), expected_x([x3[:, None]]), atol=1e-5)

    x4 = rng.normal(size=(10, 3, 4, 4)).astype(np.float64)
    np.savez_compressed(tmp_path / "b.npz", x=x4, y=(np.arange(10) % 7).astype(np.int32))
    ds = load_dataset(f"npz:{tmp_path / 'b.npz'}")
    assert ds.x.shape == (10, 3, 4, 4) and ds.info.num_classes == 7 and ds.info.augment == "none"
    np.testing.assert_allclose(ds.x.numpy(), expected_x([x4]), atol=1e-5)


def test_npz_test_part_is_appended_and_normalised_with_train_stats(tmp_path):
    rng = np.random.default_rng(1)
    x, x_test = rng.normal(3, 2, size=(12, 2, 3, 3)), rng.normal(-5, 1, size=(4, 2, 3, 3))
    y, y_test = np.arange(12) % 3, np.array([0, 1, 3, 4])  # classes 3 and 4 only in the test part
    path = tmp_path / "c.npz"
    np.savez(path, x=x, y=y, x_test=x_test, y_test=y_test)
    ds = load_dataset(f"npz:{path}")
    assert ds.n_official_train == 12 and len(ds.y) == 16
    assert ds.info.num_classes == 5  # max over train and test labels
    np.testing.assert_array_equal(ds.y.numpy(), np.concatenate([y, y_test]))
    np.testing.assert_allclose(ds.x.numpy(), expected_x([x, x_test]), atol=1e-5)
    # the test part keeps its offset: it is not re-centred
    assert ds.x[12:].mean().item() < -2
    splits = make_splits(len(ds.y), ds.n_official_train, mode="official")
    assert np.array_equal(splits["test"], np.arange(12, 16))


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"y": np.zeros(3, int)}, "no array 'x'"),
        ({"x": np.zeros((3, 4, 4))}, "no array 'y'"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(2, int)}, "3 samples but y has 2 labels"),
        ({"x": np.zeros((3, 4, 4)), "y": np.array([0, -1, 1])}, "negative label"),
        ({"x": np.zeros((3, 4)), "y": np.zeros(3, int)}, "N x H x W"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(3)}, "integer labels"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(3, int), "x_test": np.zeros((2, 4, 4))}, "x_test and y_test"),
        (
            {
                "x": np.zeros((3, 4, 4)),
                "y": np.zeros(3, int),
                "x_test": np.zeros((2, 5, 5)),
                "y_test": np.zeros(2, int),
            },
            "must match",
        ),
        ({"x": np.full((3, 4, 4), np.nan), "y": np.array([0, 1, 0])}, "NaN"),
        ({"x": np.zeros((3, 4, 4)), "y": np.array([0, 1, 200_000])}, "199998 of the 200001 classes"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(3, int)}, "every label is 0; .* at least two classes"),
        ({"x": np.zeros((3, 4, 4)), "y": np.full(3, 4, np.uint8)}, "4 of the 5 classes 0..4 have no"),
    ],
)
def test_bad_npz_files_are_usage_errors(tmp_path, arrays, match):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(UsageError, match=match) as err:
        load_dataset(f"npz:{path}")
    assert_one_line(err)


@pytest.mark.parametrize("key", ["x", "x_test"])
def test_npz_values_beyond_float32_are_refused_not_trained_on(tmp_path, key):
    # x1e300 is finite in float64, but not in the float32 the model computes in: it trained on all-zero inputs
    rng = np.random.default_rng(0)
    arrays = {"x": rng.uniform(0, 16, size=(6, 4, 4)), "y": np.arange(6) % 2,
              "x_test": rng.uniform(0, 16, size=(2, 4, 4)), "y_test": np.array([0, 1])}
    path = tmp_path / "scaled.npz"
    np.savez(path, **{**arrays, key: arrays[key] * 1e300})
    beyond = f"{key} holds values as large as .*e\\+301, beyond float32's 3.4e\\+38"
    with pytest.raises(UsageError, match=beyond) as err:
        load_dataset(f"npz:{path}")
    assert assert_one_line(err).startswith(f"{path}: ")
    np.savez(path, **{**arrays, key: arrays[key] * 1e37})  # large, but a float32 holds it
    x = load_dataset(f"npz:{path}").x
    assert torch.isfinite(x).all() and x.std() > 0.5


def test_npz_classes_count_labels_of_both_parts_and_refuse_gaps(tmp_path):
    x = np.zeros((4, 2, 2), np.float32)
    path = tmp_path / "gap.npz"
    # class 1 appears only in y_test and class 2 nowhere: dataset_info reads the labels only,
    # yet refuses the file just as load_dataset does
    np.savez(path, x=x, y=np.array([0, 0, 3, 3], np.uint16), x_test=x[:2], y_test=np.array([1, 1]))
    for read in (dataset_info, load_dataset):
        with pytest.raises(UsageError) as err:
            read(f"npz:{path}")
        text = assert_one_line(err)
        assert text.startswith(f"{path}: 1 of the 4 classes 0..3 have no sample")
        assert "the largest label is 3" in text
    np.savez(path, x=x, y=np.array([0, 0, 3, 3], np.uint16), x_test=x[:2], y_test=np.array([1, 2]))
    assert dataset_info(f"npz:{path}").num_classes == load_dataset(f"npz:{path}").info.num_classes == 4


def test_missing_or_unreadable_npz_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        dataset_info(f"npz:{tmp_path / 'nope.npz'}")
    with pytest.raises(UsageError, match="does not exist"):
        load_dataset(f"npz:{tmp_path / 'nope.npz'}")
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(UsageError, match="cannot read"):
        load_dataset(f"npz:{tmp_path / 'junk.npz'}")
    with pytest.raises(UsageError, match="needs a file path"):
        load_dataset("npz:")


# ---------------------------------------------------------------------------------------------
# Torchvision datasets from real-format files


@pytest.mark.parametrize("name, cls", [("cifar10", tvd.CIFAR10), ("cifar100", tvd.CIFAR100)])
def test_cifar_loads_the_files_written(tmp_path, monkeypatch, name, cls):
    written = write_cifar(tmp_path, cls)
    patch_cifar(monkeypatch, cls, written)
    ds = load_dataset(name, tmp_path)
    check_loaded(ds, written, len(written["x"][0]))
    assert ds.x.shape[1:] == (3, 32, 32)
    summary = prepare_dataset(name, tmp_path)
    assert summary["official_test"] == 4 and len(summary["class_counts"]) == ds.info.num_classes
    assert summary["class_counts"] == np.bincount(written["y"], minlength=ds.info.num_classes).tolist()


def test_svhn_loads_and_maps_label_10_to_0(tmp_path, monkeypatch):
    written = write_svhn(tmp_path)
    monkeypatch.setattr(tvd.SVHN, "split_list", written["split_list"])
    ds = load_dataset("svhn", tmp_path)
    check_loaded(ds, written, 7)
    assert (ds.y == 0).sum().item() == 2 and ds.y.max().item() < 10  # the two stored 10s


def test_mnist_loads_the_idx_files_written(tmp_path, monkeypatch):
    written = write_mnist(tmp_path / "MNIST" / "raw")
    monkeypatch.setattr(tvd.MNIST, "resources", written["resources"])
    ds = load_dataset("mnist", tmp_path)
    assert ds.x.shape == (9, 1, 28, 28)
    check_loaded(ds, written, 6)


def test_tinyimagenet_loads_train_then_labelled_val_in_wnids_order(tmp_path):
    written = write_tiny_imagenet(tmp_path)
    ds = load_dataset("tinyimagenet", tmp_path)
    assert ds.x.shape == (7 + 4, 3, 64, 64) and ds.info.num_classes == 200
    # the labels follow wnids.txt, the val part (labels from val_annotations.txt) is the test part,
    # and the unlabelled test/images part is left out
    assert ds.y.tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 0, 1, 2]
    check_loaded(ds, written, 7)
    grey = written["x"][0][written["grey"]]
    assert (grey[0] == grey[1]).all() and (grey[0] == grey[2]).all()  # "L" was spread over RGB
    splits = make_splits(len(ds.y), ds.n_official_train, mode="official")
    assert np.array_equal(splits["test"], np.arange(7, 11))


def test_tinyimagenet_decodes_once_into_a_cache(tmp_path, monkeypatch):
    written = write_tiny_imagenet(tmp_path)
    first = load_dataset("tinyimagenet", tmp_path)
    cache = tmp_path / TINY.CACHE
    with np.load(cache) as f:
        assert (f["x_train"].dtype, f["y_train"].dtype) == (np.uint8, np.int64)
        assert f["x_train"].shape == (7, 3, 64, 64) and f["x_test"].shape == (4, 3, 64, 64)
        np.testing.assert_array_equal(f["x_test"], written["x"][1])
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind

    def no_decoding(path):
        raise AssertionError(f"decoded {path} again")

    with monkeypatch.context() as m:
        m.setattr("fedfactor.data.datasets._decode_jpeg", no_decoding)
        second = load_dataset("tinyimagenet", tmp_path)
    assert torch.equal(first.x, second.x) and torch.equal(first.y, second.y)

    cache.write_bytes(b"half a cache")  # unreadable: decoded again and rewritten
    check_loaded(load_dataset("tinyimagenet", tmp_path), written, 7)
    with np.load(cache) as f:
        np.testing.assert_array_equal(f["y_test"], written["y"][7:])


@pytest.mark.parametrize(
    "damage, named",
    [
        ("wnids.txt", "missing tiny-imagenet-200/wnids.txt"),
        ("val/val_annotations.txt", "missing tiny-imagenet-200/val/val_annotations.txt"),
        ("val/images/val_2.JPEG", "cannot read {folder}/val/images/val_2.JPEG"),
        ("train/n01/images", "{folder}/train/n01/images holds no .JPEG images"),
    ],
)
def test_tinyimagenet_missing_file_is_named_in_one_line(tmp_path, damage, named):
    write_tiny_imagenet(tmp_path)
    folder = tmp_path / "tiny-imagenet-200"
    path = folder / damage
    if path.is_dir():
        for image in path.iterdir():
            image.unlink()
    else:
        path.unlink()
    with pytest.raises(UsageError) as err:
        load_dataset("tinyimagenet", tmp_path)
    text = assert_one_line(err)
    assert named.format(folder=folder) in text and "fedfactor prepare-data --dataset tinyimagenet" in text
    assert not (tmp_path / TINY.CACHE).exists()


def test_tinyimagenet_val_annotation_of_an_unknown_class_is_a_usage_error(tmp_path):
    write_tiny_imagenet(tmp_path)
    annotations = tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt"
    annotations.write_text(annotations.read_text() + "val_9.JPEG\tn99\t0\t0\t1\t1\n")
    with pytest.raises(UsageError, match="val_annotations.txt line 5 is not a file name and a class") as err:
        load_dataset("tinyimagenet", tmp_path)
    assert_one_line(err)


def test_default_augmentation_crops_and_flips_64px_images():
    x = torch.arange(1, 4 * 3 * 64 * 64 + 1, dtype=torch.float32).reshape(4, 3, 64, 64)
    out = augment_batch(x, dataset_info("tinyimagenet").augment, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and not torch.equal(out, x)
    pad = default_pad(64)
    for image, got in zip(x, out):
        padded = F.pad(image, (pad, pad, pad, pad))
        crops = [padded[:, i : i + 64, j : j + 64] for i in range(2 * pad + 1) for j in range(2 * pad + 1)]
        assert any(torch.equal(got, c) or torch.equal(got.flip(-1), c) for c in crops)


def write_unpatched(name: str, root: Path) -> None:
    """Real-format files whose md5s differ from the constants torchvision ships."""
    if name == "cifar10":
        write_cifar(root, tvd.CIFAR10)
    elif name == "svhn":
        write_svhn(root)
    elif name == "tinyimagenet":  # only the zip has a checksum
        (root / TINY.ARCHIVE).write_bytes(b"not the real zip")
    else:  # torchvision only checksums MNIST's .gz archives
        write_mnist(root / "MNIST" / "raw")


@pytest.mark.parametrize("name", ["cifar10", "svhn", "mnist", "tinyimagenet"])
def test_checksum_mismatch_is_a_usage_error(tmp_path, name):
    write_unpatched(name, tmp_path)
    with pytest.raises(UsageError, match="failed its checksum") as err:
        load_dataset(name, tmp_path)
    assert "delete it" in assert_one_line(err)


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "svhn", "mnist", "tinyimagenet"])
def test_missing_files_tell_the_user_to_prepare_data(tmp_path, name):
    with pytest.raises(UsageError, match=f"fedfactor prepare-data --dataset {name}") as err:
        load_dataset(name, tmp_path)
    assert "checksum" not in assert_one_line(err)


def test_one_missing_file_is_reported_as_missing_not_corrupt(tmp_path, monkeypatch):
    written = write_cifar(tmp_path, tvd.CIFAR10)
    patch_cifar(monkeypatch, tvd.CIFAR10, written)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(UsageError, match="missing cifar-10-batches-py/test_batch"):
        load_dataset("cifar10", tmp_path)


# ---------------------------------------------------------------------------------------------
# Downloads through torchvision's own downloader, from an HTTP server on localhost
# (file:// URLs do not work: torchvision reads the HTTP response's `length`)


@pytest.fixture
def server(tmp_path):
    """(folder, base URL): an HTTP server on 127.0.0.1 serving the folder, for this test only."""
    folder = tmp_path / "server"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there: connection refused


def write_cifar_archive(folder: Path) -> tuple[dict, Path]:
    written = write_cifar(folder, tvd.CIFAR10)
    archive = folder / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return written, archive


def test_prepare_downloads_verifies_and_loads_cifar10(tmp_path, monkeypatch, server):
    folder, base = server
    root = tmp_path / "root"
    written, archive = write_cifar_archive(folder)
    patch_cifar(monkeypatch, tvd.CIFAR10, written)
    monkeypatch.setattr(tvd.CIFAR10, "url", f"{base}/{archive.name}")
    monkeypatch.setattr(tvd.CIFAR10, "tgz_md5", md5(archive))

    with pytest.raises(UsageError, match="prepare-data"):
        load_dataset("cifar10", root)  # download=False never downloads
    summary = prepare_dataset("cifar10", root)
    assert md5(root / archive.name) == md5(archive)
    assert (root / "cifar-10-batches-py" / "data_batch_5").is_file()
    assert (summary["samples"], summary["official_train"], summary["official_test"]) == (19, 15, 4)
    check_loaded(load_dataset("cifar10", root), written, 15)


def test_download_failing_its_checksum_is_a_usage_error(tmp_path, monkeypatch, server):
    folder, base = server
    written, archive = write_cifar_archive(folder)
    patch_cifar(monkeypatch, tvd.CIFAR10, written)
    monkeypatch.setattr(tvd.CIFAR10, "url", f"{base}/{archive.name}")
    with pytest.raises(UsageError, match="cifar-10-python.tar.gz failed its checksum") as err:
        prepare_dataset("cifar10", tmp_path / "root")  # tgz_md5 left at the real archive's md5
    assert_one_line(err)


def test_load_with_download_true_fetches_svhn(tmp_path, monkeypatch, server):
    folder, base = server
    written = write_svhn(folder)
    split_list = {s: [f"{base}/{e[1]}", e[1], e[2]] for s, e in written["split_list"].items()}
    monkeypatch.setattr(tvd.SVHN, "split_list", split_list)
    check_loaded(load_dataset("svhn", tmp_path / "root", download=True), written, 7)


def test_prepare_downloads_mnist_archives(tmp_path, monkeypatch, server):
    folder, base = server
    root = tmp_path / "root"
    written = write_mnist(folder, gz_only=True)
    monkeypatch.setattr(tvd.MNIST, "resources", written["resources"])
    # the first mirror is down: torchvision moves on to the next
    monkeypatch.setattr(tvd.MNIST, "mirrors", [closed_port_url() + "/", base + "/"])
    summary = prepare_dataset("mnist", root)
    assert (summary["official_train"], summary["official_test"], summary["shape"]) == (6, 3, [1, 28, 28])
    check_loaded(load_dataset("mnist", root), written, 6)


def write_tiny_imagenet_zip(folder: Path) -> tuple[dict, Path]:
    written = write_tiny_imagenet(folder / "build")
    archive = folder / TINY.ARCHIVE
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted((folder / "build").rglob("*")):
            zf.write(path, path.relative_to(folder / "build"))
    return written, archive


def test_prepare_downloads_extracts_and_caches_tinyimagenet(tmp_path, monkeypatch, server):
    folder, base = server
    root = tmp_path / "root"
    written, archive = write_tiny_imagenet_zip(folder)
    monkeypatch.setattr(TINY, "URL", f"{base}/{archive.name}")
    monkeypatch.setattr(TINY, "MD5", md5(archive))

    with pytest.raises(UsageError, match="prepare-data --dataset tinyimagenet"):
        load_dataset("tinyimagenet", root)  # download=False never downloads
    summary = prepare_dataset("tinyimagenet", root)
    assert md5(root / archive.name) == md5(archive)
    assert (root / "tiny-imagenet-200" / "val" / "val_annotations.txt").is_file()
    assert (root / TINY.CACHE).is_file()
    assert (summary["samples"], summary["official_train"], summary["official_test"]) == (11, 7, 4)
    assert summary["shape"] == [3, 64, 64] and len(summary["class_counts"]) == 200
    assert summary["class_counts"][:4] == [3, 4, 4, 0]
    check_loaded(load_dataset("tinyimagenet", root), written, 7)


def test_tinyimagenet_download_failing_its_checksum_is_a_usage_error(tmp_path, monkeypatch, server):
    folder, base = server
    _, archive = write_tiny_imagenet_zip(folder)
    monkeypatch.setattr(TINY, "URL", f"{base}/{archive.name}")  # MD5 left at the real zip's
    with pytest.raises(UsageError, match="tiny-imagenet-200.zip failed its checksum") as err:
        prepare_dataset("tinyimagenet", tmp_path / "root")
    assert_one_line(err)


@pytest.mark.parametrize("name", ["cifar10", "svhn", "mnist", "tinyimagenet"])
def test_unreachable_download_is_a_one_line_usage_error(tmp_path, monkeypatch, name):
    nowhere = closed_port_url()
    if name == "cifar10":
        monkeypatch.setattr(tvd.CIFAR10, "url", nowhere + "/cifar-10-python.tar.gz")
    elif name == "svhn":
        monkeypatch.setattr(
            tvd.SVHN, "split_list", {s: [f"{nowhere}/{e[1]}", e[1], e[2]] for s, e in tvd.SVHN.split_list.items()}
        )
    elif name == "tinyimagenet":
        monkeypatch.setattr(TINY, "URL", nowhere + "/" + TINY.ARCHIVE)
    else:
        monkeypatch.setattr(tvd.MNIST, "mirrors", [nowhere + "/a/", nowhere + "/b/"])
    with pytest.raises(UsageError, match=f"could not download {name}") as err:
        prepare_dataset(name, tmp_path / "root")
    # it names what to place by hand, where, and the command that then reads it
    first = {"cifar10": "cifar-10-python.tar.gz", "svhn": "train_32x32.mat", "mnist": "MNIST/raw/",
             "tinyimagenet": "tiny-imagenet-200.zip"}[name]
    message = assert_one_line(err)
    assert f"or place {first}" in message and f"under {tmp_path / 'root'} yourself" in message, message
    assert f"fedfactor prepare-data --dataset {name}" in message, message


# ---------------------------------------------------------------------------------------------
# prepare-data on a damaged archive in the data root (no network: downloads go to a closed port)


def place_archive(name: str, root: Path, build: Path, monkeypatch: pytest.MonkeyPatch):
    """A good copy of what `name` downloads, in `root` where torchvision looks for it, and a function
    that patches the md5 torchvision expects of it."""
    nowhere = closed_port_url()
    if name in ("cifar10", "cifar100"):
        cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
        patch_cifar(monkeypatch, cls, write_cifar(build, cls))
        archive = root / cls.filename
        root.mkdir()
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(build / cls.base_folder, arcname=cls.base_folder)
        monkeypatch.setattr(cls, "url", f"{nowhere}/{cls.filename}")
        return archive, lambda m: monkeypatch.setattr(cls, "tgz_md5", m)
    if name == "mnist":
        resources = write_mnist(root / "MNIST" / "raw", gz_only=True)["resources"]
        monkeypatch.setattr(tvd.MNIST, "resources", resources)
        monkeypatch.setattr(tvd.MNIST, "mirrors", [nowhere + "/"])
        return root / "MNIST" / "raw" / resources[0][0], lambda m: resources.__setitem__(0, (resources[0][0], m))
    if name == "svhn":
        split_list = {s: [f"{nowhere}/{e[1]}", e[1], e[2]] for s, e in write_svhn(root)["split_list"].items()}
        monkeypatch.setattr(tvd.SVHN, "split_list", split_list)
        return root / split_list["train"][1], lambda m: split_list["train"].__setitem__(2, m)
    _, archive = write_tiny_imagenet_zip(build)
    root.mkdir()
    monkeypatch.setattr(TINY, "URL", f"{nowhere}/{TINY.ARCHIVE}")
    return archive.rename(root / TINY.ARCHIVE), lambda m: monkeypatch.setattr(TINY, "MD5", m)


def another_format(path: Path) -> bytes:
    if path.suffix == ".zip":
        return gzip.compress(b"a gzip file by the zip's name")
    with zipfile.ZipFile(buffer := io.BytesIO(), "w") as zf:
        zf.writestr("a.txt", f"a zip file by the name {path.name}")
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "mnist", "svhn", "tinyimagenet"])
@pytest.mark.parametrize("damage", ["truncated", "another format", "failing its checksum"])
def test_prepare_data_names_a_damaged_archive_and_leaves_nothing_half_written(tmp_path, monkeypatch, capsys, name,
                                                                            damage):
    root, out = tmp_path / "root", tmp_path / "stats.json"
    archive, expect_md5 = place_archive(name, root, tmp_path / "build", monkeypatch)
    good = archive.read_bytes()
    archive.write_bytes(another_format(archive) if damage == "another format" else good[: len(good) // 2])
    if damage != "failing its checksum":
        expect_md5(md5(archive))  # torchvision takes it for the real one and extracts (or reads) it
    before = sorted(root.rglob("*"))
    assert main(["prepare-data", "--dataset", name, "--root", str(root), "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert message.startswith("fedfactor: error:") and message.count("\n") == 1, message
    assert str(archive) in message and "delete it and run `fedfactor prepare-data" in message
    if damage == "failing its checksum":
        assert "failed its checksum" in message and "could not be downloaded" in message
    elif name == "svhn":  # downloaded as is: torchvision reads it where it lies
        assert f"cannot read {archive} as SVHN's MATLAB file" in message
    else:
        assert f"cannot extract {archive}" in message
    assert sorted(root.rglob("*")) == before and not out.exists()


@pytest.mark.parametrize("stop", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_an_extraction_cut_short_leaves_no_half_extracted_folder(tmp_path, monkeypatch, stop):
    # a disk that fills up or a Ctrl-C during the extraction: the half-extracted folder would otherwise
    # be blamed next time instead of the cause (or, for Tiny-ImageNet, pass for the dataset)
    root = tmp_path / "root"
    archive, expect_md5 = place_archive("cifar10", root, tmp_path / "build", monkeypatch)
    expect_md5(md5(archive))
    extract = tarfile.TarFile.extractall

    def cut_short(self, *args, **kwargs):
        extract(self, *args, **kwargs)
        raise stop

    monkeypatch.setattr(tarfile.TarFile, "extractall", cut_short)
    with pytest.raises(type(stop) if isinstance(stop, KeyboardInterrupt) else UsageError) as err:
        prepare_dataset("cifar10", root)
    assert list(root.iterdir()) == [archive]
    if isinstance(stop, OSError):
        assert "No space left on device" in assert_one_line(err)


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


# ---------------------------------------------------------------------------------------------
# issue 39: an npz's declared sizes and memory checked from its headers before anything is loaded


def _npy_bytes(header: dict, payload: bytes) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + payload


@pytest.mark.parametrize("key", ["x", "y", "x_test", "y_test"])
def test_npz_headers_declaring_more_than_the_file_holds_are_refused(tmp_path, key):
    arrays = {"x": np.zeros((4, 2, 2)), "y": np.arange(4) % 2, "x_test": np.zeros((2, 2, 2)), "y_test": np.arange(2)}
    path = tmp_path / "d.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for k, a in arrays.items():
            if k == key:  # 10**13 entries declared on 8 bytes: a 73 TiB allocation if believed
                shape = (10**13, *a.shape[1:])
                zf.writestr(f"{k}.npy", _npy_bytes({"descr": "<i8", "fortran_order": False, "shape": shape}, b"\0" * 8))
            else:
                buf = io.BytesIO()
                np.save(buf, a)
                zf.writestr(f"{k}.npy", buf.getvalue())
    for read in (dataset_info, load_dataset):
        with pytest.raises(UsageError, match=f"the header of {key} declares shape .* but the file holds 8 bytes"):
            read(f"npz:{path}")


def test_an_npz_that_cannot_fit_in_memory_is_refused_before_loading(tmp_path, monkeypatch):
    from fedfactor.data import datasets

    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((100, 8, 8), np.uint8), y=np.arange(100) % 2)
    # 6,400 bytes of pixels and 800 of labels as stored, 25,600 more as float32
    monkeypatch.setattr(datasets, "available_memory", lambda: 30_000)
    read = datasets._read_npz

    def labels_only(path, keys):
        assert "x" not in keys, "the images were loaded before the memory check"
        return read(path, keys)

    monkeypatch.setattr(datasets, "_read_npz", labels_only)
    with pytest.raises(UsageError, match=r"d.npz: its arrays take 0.00 GiB .* may take only 0.00 GiB more memory"):
        load_dataset(f"npz:{path}")


def test_an_npz_path_that_is_a_folder_is_named_a_folder(tmp_path):
    (tmp_path / "d.npz").mkdir()
    with pytest.raises(UsageError, match="is a folder, not a file"):
        dataset_info(f"npz:{tmp_path / 'd.npz'}")
