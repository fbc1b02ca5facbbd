"""The image datasets torchvision downloads and checksums: CIFAR-10/100, SVHN, MNIST, and Tiny-ImageNet.

Torchvision's own classes download and checksum the image datasets; this module only reads their
`.data`/`.targets` arrays and turns their errors into one-line UsageErrors naming the damaged file
(an archive that fails its checksum or cannot be extracted: `download.py`), removing whatever a
failed extraction left in the data root. Tiny-ImageNet has no torchvision class: torchvision's
downloader fetches and checks its zip, and this module decodes its JPEGs once into an .npz cache
(`cache.py`).
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import urllib.error
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from .base import Arrays as _Arrays
from .base import DatasetInfo
from .base import is_network_error as _is_network_error
from .base import one_line as _one_line
from .base import prepare_command as _prepare_command
from .cache import _read_cache, _write_cache
from .download import _checksum_error, _File, _first_broken_archive, _first_checksum_failure, _to_place
from .sources import _Source

log = logging.getLogger("fedfactor")


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


def _hwc_to_chw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2))


def _labels(y: Any) -> np.ndarray:
    if isinstance(y, torch.Tensor):
        y = y.numpy()
    return np.asarray(y, dtype=np.int64).reshape(-1)
