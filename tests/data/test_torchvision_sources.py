"""The torchvision datasets and Tiny-ImageNet, read from tiny files in each one's real on-disk format.

The tests write small files in each dataset's real on-disk format under a temporary root and patch
the md5 constants on torchvision's classes, so torchvision's own integrity checks and readers run
unchanged, with no network. The writers serve test_download.py too.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image
from torchvision import datasets as tvd

from fedfactor.data import DATASETS, load_dataset, make_splits, prepare_dataset
from fedfactor.errors import UsageError

from .conftest import assert_one_line, check_loaded, md5


TINY = type(DATASETS.get("tinyimagenet"))  # its URL and MD5 are patched like torchvision's constants


def images(rng: np.random.Generator, n: int, c: int, h: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, c, h, h), dtype=np.uint8)


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
        m.setattr("fedfactor.data.torchvision_sources._decode_jpeg", no_decoding)
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
