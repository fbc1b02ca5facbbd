"""The files torchvision checks, and which of them is damaged: checksums, archives, what to place.

Torchvision says only "not found or corrupted"; these find the file behind it (an archive that fails
its checksum or cannot be read to its end) and what a user without network places by hand, so that
`torchvision_sources.py` can name it in one line.
"""

from __future__ import annotations

import gzip
import hashlib
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import UsageError
from .base import one_line as _one_line
from .base import prepare_command as _prepare_command


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


def _md5(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()


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
                    for entry in tar:
                        if entry.isfile():
                            _read_through(tar.extractfile(entry))
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
