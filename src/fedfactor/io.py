"""Atomic file output: a killed job leaves either the old file or the new one, never half of one.

Files are created with the mode the umask allows (group-readable under the usual 022/002), not the
0600 a temporary file starts with, so results on a shared cluster are readable by the group.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Iterator, Literal

from .errors import UsageError

log = logging.getLogger("fedfactor")

_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK
TMP_SUFFIX = ".tmp"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or the user's quota on it


def no_space(error: BaseException) -> OSError | None:
    """The full-disk OSError behind `error`, or None. torch.save reports its file's failed write as a
    RuntimeError ("unexpected pos") whose context is that OSError, so the chain is searched."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in NO_SPACE:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def naming_full_disk(path: Path) -> Iterator[None]:
    """A full disk met in the block is raised as an OSError that names `path`: a failed write or
    fsync names no file, and torch.save hides the error in a RuntimeError."""
    try:
        yield
    except Exception as e:
        full = no_space(e)
        if full is None:
            raise
        raise OSError(full.errno, full.strerror, str(path)) from None


def full_disk_message(error: OSError, writing: str | Path | None = None) -> str:
    """One line for a full disk: the file that could not be written and the space left beside it.
    Where the error names no file (a write by a library, outside atomic_open), `writing`, the file or
    folder the command was writing, is named instead, and the space left there."""
    if error.filename:
        what, folder = str(error.filename), Path(error.filename).parent
    else:
        what = f"into {writing}" if writing else "its output"
        folder = Path(writing or ".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    return (f"no space left to write {what} ({_size(free)} free on the file system of {folder}); free some "
            "space and run the same command again")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@contextlib.contextmanager
def atomic_open(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file object whose content replaces `path` only once the block completes; a full
    disk is an OSError naming `path` (naming_full_disk), and leaves `path` as it was."""
    path = Path(path)
    with naming_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_write_npy(path: str | Path, array: Any) -> None:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())


def remove_stale_temporaries(folder: Path) -> int:
    """Delete the temporaries a killed writer left in `folder` (call it only under `folder_lock`)."""
    stale = [p for p in folder.rglob(f".*{TMP_SUFFIX}") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout: float | None = None) -> Iterator[IO[str]]:
    """Hold an exclusive `flock` on `path` (created if needed) while the block runs.

    Waits at most `timeout` seconds (None: as long as it takes), then raises TimeoutError. The
    kernel releases the lock when its holder dies, however it dies, so a killed job never leaves
    one behind. The first wait is logged with what the holder wrote into the file.
    """
    with naming_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")
    with f:
        deadline = None if timeout is None else time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stays locked by another process") from None
                if not waited:
                    f.seek(0)
                    log.warning("%s is held by %s; waiting for it", path, f.read().strip() or "another process")
                    waited = True
                time.sleep(0.02 + 0.08 * random.random())
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """One writer per output folder: a second job for the same folder (a re-run while a killed
    Snakemake's orphan still runs) waits instead of interleaving its files."""
    lock = folder / ".lock"
    with exclusive_lock(lock) as f:
        with naming_full_disk(lock):
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            f.flush()
        yield


def check_output(path: str | Path, kind: Literal["folder", "file"] = "folder", option: str = "--out") -> None:
    """Refuse an output path that cannot become a writable `kind`, before anything runs or is written.

    Whether a folder can be created is tried, not read from its mode: root may write anywhere
    os.access says no, and /proc or /sys refuse creation whatever the mode says.
    """
    if not str(path).strip():
        raise UsageError(f"{option} is empty; name a {kind}")  # Path("") is the current folder
    path = Path(path)
    name_max = 255
    with contextlib.suppress(OSError, ValueError):
        name_max = os.pathconf(os.path.dirname(os.path.abspath(path)) or "/", "PC_NAME_MAX")
    long = next((p for p in path.parts if len(os.fsencode(p)) > name_max), None)
    if long is not None:
        raise UsageError(f"{option}: the name {long[:40]}... is {len(os.fsencode(long))} bytes long; this file system "
                         f"allows {name_max}")
    if path.exists():
        if kind == "folder" and not path.is_dir():
            raise UsageError(f"{option} {path} is a file, not a folder; choose a folder path")
        if kind == "file" and path.is_dir():
            raise UsageError(f"{option} {path} is a folder; name a file")
    parent = path if kind == "folder" and path.is_dir() else path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {path} lies under {parent}, which is a file; choose a {kind} path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: {parent} is not writable; choose a {kind} you can write to")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".fedfactor-check-"))
    except OSError as e:
        raise UsageError(f"{option} {path}: nothing can be created in {parent} ({e.strerror})") from None
