"""npz:PATH: the user's own arrays in an .npz file, checked from its headers before they are loaded."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from ..config import regular_file
from ..devices import available_memory
from ..errors import UsageError
from .base import Arrays as _Arrays
from .base import DatasetInfo
from .base import one_line as _one_line
from .sources import _empty_like, _Source

NPZ_PREFIX = "npz:"
_FLOAT32_MAX = float(np.finfo(np.float32).max)

_NPZ_KEYS = ("x", "y", "x_test", "y_test")
_NPZ_HELP = (
    "an npz dataset holds x (N x H x W or N x C x H x W), y (N integer labels), optionally x_test and y_test"
)


class _Npz(_Source):
    def info(self, arg: str, root: Path) -> DatasetInfo:
        path = _npz_path(arg)
        return _check_npz(arg, path, _npz_headers(path), _read_npz(path, ("y", "y_test")))

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        path = _npz_path(arg)
        _check_memory(path, _npz_headers(path))
        loaded = _read_npz(path, _NPZ_KEYS)
        headers = {k: (v.shape, v.dtype) for k, v in loaded.items() if k.startswith("x")}
        _check_npz(arg, path, headers, {k: v for k, v in loaded.items() if k.startswith("y")})
        x = _as_nchw(loaded["x"])
        x_test = _as_nchw(loaded["x_test"]) if "x_test" in loaded else _empty_like(x)
        y_test = loaded.get("y_test", np.zeros(0, dtype=np.int64))
        for key, part in (("x", x), ("x_test", x_test)):
            if part.dtype.kind == "f" and not np.isfinite(part).all():
                raise UsageError(f"{path}: {key} holds NaN or infinite values; replace them before loading")
            # The model computes in float32, where a larger value is infinite (x1e300 also overflowed
            # the float64 statistics and trained on all-zero inputs, without a word).
            largest = float(np.abs(part).max()) if part.dtype.kind == "f" and part.size else 0.0
            if largest > _FLOAT32_MAX:
                raise UsageError(f"{path}: {key} holds values as large as {largest:.3g}, beyond float32's "
                                 f"{_FLOAT32_MAX:.3g} that the model computes in; rescale them "
                                 "(pixels are usually 0..255 or 0..1)")
        return _Arrays(x, loaded["y"].astype(np.int64), x_test, y_test.astype(np.int64))


def _npz_path(arg: str) -> Path:
    if not arg:
        raise UsageError("npz: needs a file path after the colon, e.g. npz:data/my_arrays.npz")
    return regular_file(Path(arg).expanduser(), "npz file", "; pass an existing .npz file as npz:PATH")


def _read_npz(path: Path, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """The arrays among `keys` that the file holds; pickled (object) arrays are refused."""
    unreadable = (ValueError, OSError, EOFError, zipfile.BadZipFile)
    try:
        f = np.load(path, allow_pickle=False)
    except unreadable as err:
        raise UsageError(f"cannot read {path} as an .npz file ({_one_line(err)}); {_NPZ_HELP}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise UsageError(f"{path} holds a single array, not an .npz archive; {_NPZ_HELP}")
    try:
        with f:
            return {k: f[k] for k in keys if k in f.files}
    except unreadable as err:
        raise UsageError(f"cannot read the arrays in {path} ({_one_line(err)}); {_NPZ_HELP}") from None


def _npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array from its .npy header, without reading the data. An array whose
    header declares more bytes than its entry in the archive holds is refused: np.load allocates
    what the header declares before it reads (10**13 labels: a 73 TiB allocation error)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for key in _NPZ_KEYS:
                if f"{key}.npy" not in zf.namelist():
                    continue
                entry = zf.getinfo(f"{key}.npy")
                with zf.open(entry) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
                    else:  # 3.0 is for structured dtypes with non-Latin-1 names, which are no images
                        raise UsageError(f"{path}: {key} is saved in .npy format {version[0]}.{version[1]}; "
                                         f"save plain numeric arrays with numpy.savez; {_NPZ_HELP}")
                    stored = entry.file_size - fh.tell()
                shape, dtype = tuple(shape), np.dtype(dtype)
                declared = math.prod(shape) * dtype.itemsize
                if declared > stored:
                    raise UsageError(f"{path}: the header of {key} declares shape {shape} of {dtype} ({declared:,} "
                                     f"bytes), but the file holds {stored:,} bytes of it; the file is damaged")
                out[key] = (shape, dtype)
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        raise UsageError(f"cannot read {path} as an .npz file ({_one_line(err)}); {_NPZ_HELP}") from None
    return out


def _check_memory(path: Path, headers: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """Refuse, before loading, an npz whose arrays and the float32 copy of its images the model
    trains on cannot fit in the memory this process may still take; loading it would end in the
    allocator's error halfway."""
    stored = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers.values())
    need = stored + sum(4 * math.prod(headers[k][0]) for k in ("x", "x_test") if k in headers)
    free = available_memory()
    if free is not None and need > free:
        raise UsageError(f"{path}: its arrays take {stored / 2**30:.2f} GiB and their float32 images "
                         f"{(need - stored) / 2**30:.2f} GiB more, but this process may take only {free / 2**30:.2f} "
                         "GiB more memory; use a machine with more memory (or raise `ulimit -v`), or fewer samples")


def _check_npz(
    arg: str,
    path: Path,
    headers: dict[str, tuple[tuple[int, ...], np.dtype]],
    labels: dict[str, np.ndarray],
) -> DatasetInfo:
    """Validate what an npz holds (x by shape and dtype only) and return its DatasetInfo."""
    missing = [k for k, present in (("x", "x" in headers), ("y", "y" in labels)) if not present]
    if missing:
        raise UsageError(f"{path} has no array {' or '.join(map(repr, missing))}; {_NPZ_HELP}")
    if ("x_test" in headers) != ("y_test" in labels):
        raise UsageError(f"{path} has only one of x_test and y_test; save both or neither")
    image_shape: tuple[int, ...] | None = None
    for xk, yk in (("x", "y"), ("x_test", "y_test")):
        if xk not in headers:
            continue
        shape, dtype = headers[xk]
        if len(shape) not in (3, 4):
            raise UsageError(f"{path}: {xk} has shape {shape}; it must be N x H x W or N x C x H x W")
        if dtype.kind not in "biuf":
            raise UsageError(f"{path}: {xk} has dtype {dtype}; it must hold numbers (int, uint or float)")
        chw = shape[1:] if len(shape) == 4 else (1, *shape[1:])
        if min(chw) < 1:
            raise UsageError(f"{path}: {xk} has shape {shape}; channels, height and width must be >= 1")
        if image_shape is not None and chw != image_shape:
            raise UsageError(
                f"{path}: x_test images are {chw} but x images are {image_shape}; they must match"
            )
        image_shape = chw
        _check_labels(path, yk, labels[yk], shape[0], xk)
    if headers["x"][0][0] == 0:
        raise UsageError(f"{path}: x holds no samples; it needs at least one")
    num_classes = _count_classes(path, labels)
    c, h, w = image_shape  # type: ignore[misc]
    return DatasetInfo(NPZ_PREFIX + arg, int(c), int(h), int(w), num_classes, "none")


def _check_labels(path: Path, key: str, y: np.ndarray, n: int, x_key: str) -> None:
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise UsageError(
            f"{path}: {key} must be a 1-D array of integer labels (got {y.dtype} of shape {y.shape})"
        )
    if len(y) != n:
        raise UsageError(f"{path}: {x_key} has {n} samples but {key} has {len(y)} labels; they must match")
    if len(y) and int(y.min()) < 0:
        raise UsageError(f"{path}: {key} holds the negative label {int(y.min())}; labels must be 0..K-1")


def _count_classes(path: Path, labels: dict[str, np.ndarray]) -> int:
    """K = the largest label + 1, once every class 0..K-1 is known to have a sample.

    The model gets K outputs, so a stray label (200000 among digits) must not make it 200001.
    """
    # labels are already known to be non-negative, so uint64 holds them all (mixing int64 and
    # uint64 arrays would give float64)
    present = np.unique(np.concatenate([y.astype(np.uint64) for y in labels.values()]))
    largest = int(present[-1])
    if len(present) <= largest:
        raise UsageError(
            f"{path}: {largest + 1 - len(present)} of the {largest + 1} classes 0..{largest} have no "
            f"sample in y or y_test (the largest label is {largest}); number the classes 0..K-1 without gaps"
        )
    if largest == 0:
        raise UsageError(
            f"{path}: every label is 0; a dataset needs at least two classes (with one, every "
            "prediction would be right)"
        )
    return largest + 1


def _as_nchw(x: np.ndarray) -> np.ndarray:
    return x[:, None] if x.ndim == 3 else x
