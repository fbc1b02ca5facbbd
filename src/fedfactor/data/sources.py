"""What a dataset source is (`_Source`), and the two that need little of their own: scikit-learn's
digits and LEAF's datasets.

`prepare-data` copies scikit-learn's digits into the data root as an .npz, so that training jobs need
not import scikit-learn. FEMNIST and Shakespeare come from LEAF's JSON shards, with the natural client
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
# digits: embedded in scikit-learn, copied into the data root by prepare-data


class _Digits(_Source):
    """scikit-learn's digits. Importing scikit-learn costs a process about 1.5 s of CPU, more than a
    default-study job's whole data set-up, so `prepare-data` (download=True) copies the arrays as
    read into <root>/digits.npz and every later read (each training job) loads that 0.5 MB file
    instead: the same float32 and int64 arrays, so the same results bit for bit. Without the copy,
    or with an unreadable one, they come from scikit-learn; prepare-data always reads scikit-learn
    and rewrites the copy, so running it again repairs a damaged one.
    """

    INFO = DatasetInfo("digits", 1, 8, 8, 10, "none")
    CACHE = "digits.npz"  # under the data root

    def info(self, arg: str, root: Path) -> DatasetInfo:
        return self.INFO

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        cache = root / self.CACHE
        if not download and cache.is_file():
            cached = _read_cache(cache)
            if cached is not None:
                return cached
        arrays = self._from_sklearn()
        if download:
            _write_cache(cache, arrays)
        return arrays

    @staticmethod
    def _from_sklearn() -> _Arrays:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = bunch.images[:, None].astype(np.float32)  # [N, 1, 8, 8], pixel values 0..16
        y = bunch.target.astype(np.int64)
        # No official test split: everything counts as official train.
        return _Arrays(x, y, _empty_like(x), np.zeros(0, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# LEAF: FEMNIST and Shakespeare, with the natural client of every sample (leaf.py)


class _Leaf(_Source):
    def __init__(self, info: DatasetInfo):
        self._info = info

    def info(self, arg: str, root: Path) -> DatasetInfo:
        return replace(self._info, natural_clients=leaf.cached_clients(arg, root))

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        return leaf.arrays(self._info, root, download)
