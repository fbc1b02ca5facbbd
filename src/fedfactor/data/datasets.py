"""Datasets as one pooled, normalised tensor, and the seeded train/val/test cut.

Factorized-FL pools each dataset's official train and test parts and cuts its own 80/10/10 split,
so a dataset here is all samples in one tensor (official train part first) and `make_splits`
decides which are train, val and test. Everything is loaded into memory at once: the simulator
indexes every client's samples out of that one tensor, on the GPU when there is one.

Torchvision's own classes download and checksum the image datasets; this module only reads their
`.data`/`.targets` arrays and turns their errors into one-line UsageErrors naming the damaged file
(an archive that fails its checksum or cannot be extracted), removing whatever a failed extraction
left in the data root. Tiny-ImageNet has no torchvision class: torchvision's downloader fetches and
checks its zip, and this module decodes its JPEGs once into an .npz cache. `prepare-data` copies
scikit-learn's digits into the data root as an .npz, so that training jobs need not import
scikit-learn. FEMNIST and Shakespeare come from LEAF's JSON shards, with the natural client (writer,
speaking role) of every sample: `leaf.py`.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import math
import shutil
import tarfile
import urllib.error
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..config import regular_file
from ..devices import available_memory
from ..devices import resolve_device
from ..errors import UsageError
from ..io import atomic_open
from ..registry import Registry
from . import leaf
from .base import IMAGE_SIDE, SEQUENCE_LENGTH, DatasetInfo, check_owners
from .base import Arrays as _Arrays
from .base import is_network_error as _is_network_error
from .base import one_line as _one_line
from .base import prepare_command as _prepare_command

log = logging.getLogger("fedfactor")

SPLIT_MODES = ("pooled", "official")
NPZ_PREFIX = "npz:"
_NPZ_ENTRY = "npz:PATH"
SYNTHETIC_PREFIX = "synthetic:"
_SYNTHETIC_ENTRY = "synthetic:NAME"
# Samples per chunk when computing statistics and normalising: keeps float64 temporaries small
# (a float64 copy of SVHN's official-train part alone would take 1.8 GB).
_CHUNK = 2048
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Dataset:
    info: DatasetInfo
    x: torch.Tensor  # float32 [N, C, H, W]: official train part first, then official test part
    y: torch.Tensor  # int64 [N]
    n_official_train: int  # how many of the N come from the official train part
    # int32 [N]: the natural client (0..info.natural_clients - 1) of each sample; None without
    owners: np.ndarray | None = None


class _Source:
    """A registry entry: knows a dataset's DatasetInfo and how to read its arrays.

    `arg` is the registry name, or the path for npz:PATH.
    """

    def info(self, arg: str, root: Path) -> DatasetInfo:
        raise NotImplementedError

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        raise NotImplementedError


DATASETS: Registry[_Source] = Registry("dataset")


def _md5(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()


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
# Torchvision datasets


@dataclass(frozen=True)
class _File:
    """A file torchvision checks; md5 None means torchvision only checks that it exists."""

    path: Path
    md5: str | None
    required: bool  # False for downloaded archives, which may have been deleted after extraction


def _to_place(files: list[_File], root: Path) -> str:
    """The files a user without network places by hand: the archives a download fetches (else every
    file read), relative to the data root."""
    wanted = [f.path for f in files if not f.required] or [f.path for f in files]
    names = [str(p.relative_to(root)) for p in wanted]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


class _Torchvision(_Source):
    """Shared error handling; subclasses name their files and read torchvision's arrays.

    The md5s are read from the torchvision class at call time, never copied, so they are the ones
    torchvision itself checks (and tests can patch them).
    """

    def __init__(self, info: DatasetInfo):
        self._info = info

    def info(self, arg: str, root: Path) -> DatasetInfo:
        return self._info

    def files(self, root: Path) -> list[_File]:
        raise NotImplementedError

    def extracted(self, root: Path) -> list[Path]:
        """What extracting the downloaded archives writes (files or folders)."""
        return []

    def read(self, root: Path, download: bool) -> _Arrays:
        raise NotImplementedError

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        # A half-extracted folder would pass for the dataset next time (or be blamed instead of its
        # archive), so whatever this call set out to extract goes again if it fails, even on Ctrl-C.
        new = [p for p in self.extracted(root) if not p.exists()] if download else []
        try:
            return self.read(root, download)
        except BaseException as err:
            for path in new:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if isinstance(err, UsageError) or not isinstance(err, _READ_ERRORS):
                raise
            raise self._explain(root, download, err) from err

    def _explain(self, root: Path, download: bool, err: BaseException) -> UsageError:
        """Turn torchvision's 'not found or corrupted' into which of the two it is, and what to do."""
        name = self._info.name
        bad = _first_checksum_failure(self.files(root))
        if download and _is_network_error(err):
            reason = _one_line(err.reason if isinstance(err, urllib.error.URLError) else err)
            if bad is not None:  # torchvision found a damaged copy and could not fetch another
                path, got, expected = bad
                return UsageError(
                    f"{path} failed its checksum (md5 {got}, expected {expected}) and a new copy could not be "
                    f"downloaded ({reason}); delete it and run {_prepare_command(name, root)} again, or place "
                    "a good copy there"
                )
            return UsageError(
                f"could not download {name}: {reason}; check the network connection, or place "
                f"{_to_place(self.files(root), root)} under {root} yourself and run {_prepare_command(name, root)}"
            )
        if bad is not None:
            return _checksum_error(name, root, *bad)
        broken = _first_broken_archive(self.files(root))
        if broken is not None:
            path, reason = broken
            return UsageError(
                f"cannot extract {path} ({reason}): it is damaged or not the archive it should be; delete it "
                f"and run {_prepare_command(name, root)} to download it again"
            )
        missing = [f.path for f in self.files(root) if f.required and not f.path.is_file()]
        if missing:
            where = missing[0].relative_to(root)
            if download:
                return UsageError(
                    f"{name}: {where} is missing under {root} after the download ({_one_line(err)}); delete "
                    f"the downloaded files and run {_prepare_command(name, root)} again"
                )
            return UsageError(
                f"dataset {name!r} is not under {root} (missing {where}); run "
                f"{_prepare_command(name, root)} to download it, or place the files there"
            )
        return UsageError(
            f"could not read {name} from {root}: {_one_line(err)}; delete its files and run "
            f"{_prepare_command(name, root)} to download them again"
        )


# What torchvision's readers and extractors raise on missing, damaged or foreign files
_READ_ERRORS = (RuntimeError, OSError, ValueError, AssertionError, EOFError, KeyError, tarfile.TarError,
                zipfile.BadZipFile, zlib.error)


def _first_checksum_failure(files: Sequence[_File]) -> tuple[Path, str, str] | None:
    # archives first: a damaged one explains the files extracted from it
    for f in sorted(files, key=lambda f: f.required):
        if f.md5 is None or not f.path.is_file():
            continue
        try:
            got = _md5(f.path)
        except OSError:  # unreadable (e.g. permissions): the caller's fallback message says why
            continue
        if got != f.md5:
            return f.path, got, f.md5
    return None


def _first_broken_archive(files: Sequence[_File]) -> tuple[Path, str] | None:
    """The first present archive among `files` that cannot be read to its end, and why."""
    for f in files:
        if f.required or not f.path.is_file():
            continue
        try:
            if f.path.suffix == ".zip":
                with zipfile.ZipFile(f.path) as z:
                    member = z.testzip()
                if member is not None:
                    return f.path, f"{member} in it fails its CRC check"
            elif f.path.name.endswith((".tar.gz", ".tgz", ".tar")):
                with tarfile.open(f.path, "r:" if f.path.suffix == ".tar" else "r:gz") as tar:
                    for member in tar:
                        if member.isfile():
                            _read_through(tar.extractfile(member))
            elif f.path.suffix == ".gz":
                with gzip.open(f.path) as g:
                    _read_through(g)
        except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, zlib.error) as err:
            return f.path, _one_line(err)
    return None


def _read_through(stream) -> None:
    while stream.read(1 << 20):
        pass


def _checksum_error(name: str, root: Path, path: Path, got: str, expected: str) -> UsageError:
    return UsageError(
        f"{path} failed its checksum (md5 {got}, expected {expected}); delete it and run "
        f"{_prepare_command(name, root)} to download it again"
    )


class _Cifar(_Torchvision):
    def __init__(self, info: DatasetInfo, class_name: str):
        super().__init__(info)
        self.class_name = class_name

    def _cls(self) -> Any:
        from torchvision import datasets

        return getattr(datasets, self.class_name)

    def files(self, root: Path) -> list[_File]:
        cls = self._cls()
        folder = root / cls.base_folder
        listed = [_File(folder / f, md5, True) for f, md5 in cls.train_list + cls.test_list]
        return listed + [
            _File(folder / cls.meta["filename"], cls.meta["md5"], True),
            _File(root / cls.filename, cls.tgz_md5, False),
        ]

    def extracted(self, root: Path) -> list[Path]:
        return [root / self._cls().base_folder]

    def read(self, root: Path, download: bool) -> _Arrays:
        cls = self._cls()
        train = cls(str(root), train=True, download=download)
        test = cls(str(root), train=False)
        return _Arrays(
            _hwc_to_chw(train.data), _labels(train.targets), _hwc_to_chw(test.data), _labels(test.targets)
        )


class _Svhn(_Torchvision):
    SPLITS = ("train", "test")  # the 531k-image "extra" split is not used

    def files(self, root: Path) -> list[_File]:
        from torchvision.datasets import SVHN

        return [_File(root / SVHN.split_list[s][1], SVHN.split_list[s][2], True) for s in self.SPLITS]

    def read(self, root: Path, download: bool) -> _Arrays:
        train, test = (self._split(root, s, f, download) for s, f in zip(self.SPLITS, self.files(root)))
        # torchvision already maps SVHN's label 10 to digit 0 and transposes X to [N, C, H, W].
        return _Arrays(train.data, _labels(train.labels), test.data, _labels(test.labels))

    def _split(self, root: Path, split: str, file: _File, download: bool) -> Any:
        from scipy.io.matlab import MatReadError
        from torchvision.datasets import SVHN

        try:
            return SVHN(str(root), split=split, download=download)
        except (*_READ_ERRORS, MatReadError) as err:
            if _is_network_error(err) or not file.path.is_file() or _first_checksum_failure([file]) is not None:
                raise  # not there or damaged: `_explain` says which
            # it passed its checksum, so reading it failed: name the file, which torchvision does not
            raise UsageError(
                f"cannot read {file.path} as SVHN's MATLAB file ({_one_line(err)}); delete it and run "
                f"{_prepare_command(self._info.name, root)} to download it again"
            ) from err


class _Mnist(_Torchvision):
    def files(self, root: Path) -> list[_File]:
        from torchvision.datasets import MNIST

        raw = root / MNIST.__name__ / "raw"
        # torchvision only checksums the .gz downloads; the extracted files are checked for presence.
        archives = [_File(raw / gz, md5, False) for gz, md5 in MNIST.resources]
        extracted = [_File(raw / gz.removesuffix(".gz"), None, True) for gz, _ in MNIST.resources]
        return extracted + archives

    def extracted(self, root: Path) -> list[Path]:
        return [f.path for f in self.files(root) if f.required]

    def read(self, root: Path, download: bool) -> _Arrays:
        from torchvision.datasets import MNIST

        train = MNIST(str(root), train=True, download=download)
        test = MNIST(str(root), train=False)
        # Unlike CIFAR and SVHN, torchvision never re-checks MNIST's archives once they are
        # extracted (and cannot check the extracted files), so check the archives still present.
        bad = _first_checksum_failure(self.files(root))
        if bad is not None:
            raise _checksum_error(self._info.name, root, *bad)
        # torchvision's MNIST images are [N, 28, 28]: add the channel axis.
        x_train, x_test = train.data.numpy()[:, None], test.data.numpy()[:, None]
        return _Arrays(x_train, _labels(train.targets), x_test, _labels(test.targets))


class _TinyImageNet(_Torchvision):
    """Tiny-ImageNet: the train part, then the labelled val part as the official test part.

    The zip's own test part has no labels and is not read. Labels follow wnids.txt. Decoding the
    110,000 JPEGs takes up to a minute or two, so the first read caches the arrays in one .npz next to
    the extracted folder and every later read (each training job) loads that; delete the .npz to
    decode the folder again.
    """

    # Class attributes read at call time, so tests can patch them.
    URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
    MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
    ARCHIVE = "tiny-imagenet-200.zip"
    FOLDER = "tiny-imagenet-200"
    CACHE = "tiny-imagenet-200.npz"

    def files(self, root: Path) -> list[_File]:
        folder = root / self.FOLDER
        return [
            _File(folder / "wnids.txt", None, True),
            _File(folder / "val" / "val_annotations.txt", None, True),
            _File(root / self.ARCHIVE, self.MD5, False),
        ]

    def extracted(self, root: Path) -> list[Path]:
        return [root / self.FOLDER]

    def read(self, root: Path, download: bool) -> _Arrays:
        cache = root / self.CACHE
        if cache.is_file():
            cached = _read_cache(cache)
            if cached is not None:
                return cached
        folder = root / self.FOLDER
        if download and not (folder / "wnids.txt").is_file():
            from torchvision.datasets.utils import download_and_extract_archive

            download_and_extract_archive(self.URL, str(root), filename=self.ARCHIVE, md5=self.MD5)
        log.info("decoding the Tiny-ImageNet JPEGs under %s once; later reads use %s", folder, cache)
        arrays = self._decode(root, folder)
        _write_cache(cache, arrays)
        return arrays

    def _decode(self, root: Path, folder: Path) -> _Arrays:
        again = f"delete {folder} and run {_prepare_command(self._info.name, root)} to extract it again"
        wnids = (folder / "wnids.txt").read_text().split()
        labels = {wnid: i for i, wnid in enumerate(wnids)}
        train: list[tuple[Path, int]] = []
        for i, wnid in enumerate(wnids):
            class_images = sorted((folder / "train" / wnid / "images").glob("*.JPEG"))
            if not class_images:
                raise UsageError(f"{folder / 'train' / wnid / 'images'} holds no .JPEG images; {again}")
            train += [(path, i) for path in class_images]
        annotations = folder / "val" / "val_annotations.txt"
        val: list[tuple[Path, int]] = []
        for n, line in enumerate(annotations.read_text().splitlines(), 1):
            fields = line.split("\t")
            if len(fields) < 2 or fields[1] not in labels:
                raise UsageError(
                    f"{annotations} line {n} is not a file name and a class from wnids.txt "
                    f"({_one_line(line)!r}); {again}"
                )
            val.append((folder / "val" / "images" / fields[0], labels[fields[1]]))
        x_train, y_train = self._decode_jpegs(train, again)
        x_test, y_test = self._decode_jpegs(val, again)
        return _Arrays(x_train, y_train, x_test, y_test)

    def _decode_jpegs(self, items: list[tuple[Path, int]], again: str) -> tuple[np.ndarray, np.ndarray]:
        c, h, w = self._info.channels, self._info.height, self._info.width
        x = np.empty((len(items), c, h, w), dtype=np.uint8)
        for i, (path, _) in enumerate(items):
            try:
                image = _decode_jpeg(path)
            except OSError as err:  # missing, corrupt or truncated: name the file, not just the error
                raise UsageError(f"cannot read {path} ({_one_line(err.strerror or err)}); {again}") from err
            if image.shape != (h, w, c):
                raise UsageError(f"{path} is {image.shape[1]}x{image.shape[0]}, not {w}x{h}; {again}")
            x[i] = image.transpose(2, 0, 1)
        return x, np.array([label for _, label in items], dtype=np.int64)


def _decode_jpeg(path: Path) -> np.ndarray:
    """An image file as an RGB uint8 [H, W, 3] array (some Tiny-ImageNet JPEGs are greyscale)."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


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


def _hwc_to_chw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2))


def _labels(y: Any) -> np.ndarray:
    if isinstance(y, torch.Tensor):
        y = y.numpy()
    return np.asarray(y, dtype=np.int64).reshape(-1)


# ---------------------------------------------------------------------------------------------
# npz:PATH: bring your own arrays

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
# LEAF: FEMNIST and Shakespeare, with the natural client of every sample (leaf.py)


class _Leaf(_Source):
    def __init__(self, info: DatasetInfo):
        self._info = info

    def info(self, arg: str, root: Path) -> DatasetInfo:
        return replace(self._info, natural_clients=leaf.cached_clients(arg, root))

    def arrays(self, arg: str, root: Path, download: bool) -> _Arrays:
        return leaf.arrays(self._info, root, download)


# ---------------------------------------------------------------------------------------------
# Registry

_ENTRIES: list[tuple[str, str, _Source]] = [
    (
        "digits",
        "scikit-learn's bundled handwritten digits, 1,797 8x8 grey images, 10 classes (embedded, no download)",
        _Digits(),
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


def make_splits(
    n: int,
    n_official_train: int,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    mode: str = "pooled",
    seed: int = 0,
    owners: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Seeded train/val/test indices into the pooled samples, each sorted ascending (int64).

    "pooled" follows Factorized-FL's official code: shuffle all n, take train, then test, and
    leave the remainder to val. "official" keeps the official test part as test and cuts the
    official-train part into train and val in the ratio of their fractions. With `owners` (the
    natural client of each sample), "pooled" cuts each client's samples on their own instead
    (`_per_owner`).
    """
    f_train, f_val, f_test = _check_split_args(n, n_official_train, fractions, mode)
    rng = np.random.default_rng(seed)
    if mode == "pooled" and owners is not None:
        parts = _per_owner(check_owners(owners, n), f_val, f_test, rng)
    elif mode == "pooled":
        perm = rng.permutation(n)
        n_train = round(n * f_train)
        n_test = min(round(n * f_test), n - n_train)
        test_end = n_train + n_test
        parts = {"train": perm[:n_train], "test": perm[n_train:test_end], "val": perm[test_end:]}
    else:
        if n_official_train == n:
            raise UsageError("this dataset has no official test part; use split mode 'pooled'")
        if f_train + f_val == 0:
            raise UsageError("split mode 'official' needs a train or val fraction above 0")
        perm = rng.permutation(n_official_train)
        n_train = round(n_official_train * f_train / (f_train + f_val))
        parts = {"train": perm[:n_train], "val": perm[n_train:], "test": np.arange(n_official_train, n)}
    return {k: np.sort(parts[k]).astype(np.int64) for k in ("train", "val", "test")}


# ---------------------------------------------------------------------------------------------
# Helpers for the public API


def _per_owner(owners: np.ndarray, f_val: float, f_test: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each natural client's samples shuffled and cut on their own ("we randomly split the dataset in
    each client", FedFac 5.1): test = round(m f_test) but at least one sample (when f_test > 0), val =
    round(m f_val) of the rest, train = the remainder, so 80/0/20 leaves nothing to val."""
    order = np.argsort(owners, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(owners[order])) + 1)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for group in groups:
        perm, m = rng.permutation(group), len(group)
        n_test = max(1, round(m * f_test)) if f_test > 0 else 0
        n_val = min(round(m * f_val), m - n_test)
        parts["test"].append(perm[:n_test])
        parts["val"].append(perm[n_test : n_test + n_val])
        parts["train"].append(perm[n_test + n_val :])
    return {k: np.concatenate([np.zeros(0, np.int64), *v]) for k, v in parts.items()}


def _check_split_args(
    n: int, n_official_train: int, fractions: Sequence[float], mode: str
) -> tuple[float, float, float]:
    if mode not in SPLIT_MODES:
        raise UsageError(f"unknown split mode {mode!r}; choose one of: {', '.join(SPLIT_MODES)}")
    if not (isinstance(n, (int, np.integer)) and isinstance(n_official_train, (int, np.integer))):
        raise UsageError(f"n and n_official_train must be integers (got {n!r} and {n_official_train!r})")
    if n < 0 or not 0 <= n_official_train <= n:
        raise UsageError(f"need 0 <= n_official_train <= n (got n={n}, n_official_train={n_official_train})")
    try:
        f = [float(v) for v in fractions]
    except (TypeError, ValueError):
        raise UsageError(
            f"split fractions must be three numbers train, val, test summing to 1 (got {fractions!r})"
        ) from None
    if len(f) != 3 or any(not np.isfinite(v) or v < 0 for v in f) or abs(sum(f) - 1) > 1e-6:
        raise UsageError(
            f"split fractions must be three non-negative numbers train, val, test summing to 1 (got {f!r})"
        )
    return f[0], f[1], f[2]


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
