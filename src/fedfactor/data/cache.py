"""Decoded arrays kept in one uncompressed .npz beside their source, so that later reads (every
training job) load it instead of decoding again: scikit-learn's digits, Tiny-ImageNet's JPEGs.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import numpy as np

from ..io import atomic_open
from .base import Arrays as _Arrays
from .base import one_line as _one_line

log = logging.getLogger("fedfactor")

_CACHE_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _read_cache(path: Path) -> _Arrays | None:
    """The cached arrays, or None (and a warning) when the file cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return _Arrays(*(f[k] for k in _CACHE_KEYS))
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        log.warning("cannot read the cache %s (%s); reading the dataset from its source again", path,
                    _one_line(err))
        return None


def _write_cache(path: Path, arrays: _Arrays) -> None:
    # Uncompressed: the pixels barely compress and loading must be fast. A data root one may not
    # write to (a shared read-only copy) only costs the decoding again next time.
    try:
        with atomic_open(path) as f:
            np.savez(f, **{k: getattr(arrays, k) for k in _CACHE_KEYS})
    except OSError as err:
        log.warning("cannot write the cache %s (%s); the next read decodes again", path, _one_line(err))
