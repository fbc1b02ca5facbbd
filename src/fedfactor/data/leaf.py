"""FEMNIST and Shakespeare from LEAF (Caldas et al. 2018), one natural client per writer or speaking role.

LEAF publishes scripts, not data: its `data/<name>/preprocess.sh` downloads the raw sources (NIST
SD19 for FEMNIST, Gutenberg's complete works for Shakespeare) and writes JSON shards
`{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`. Everything
of a dataset lives under <root>/<name>/:

    leaf/all_data/*.json     LEAF's shards (or leaf/train/*.json and leaf/test/*.json), read if present
    downloads/               what `prepare-data` downloaded: LEAF's repository archive, the raw zips
    SHA256SUMS               the sha256 of each download, recorded when first downloaded
    <name>.npz               the parsed arrays every training job loads

Without shards, `prepare-data` downloads LEAF's repository at LEAF_COMMIT and the raw sources (each
checked against its sha256: pinned in PINNED_SHA256, or else recorded in SHA256SUMS on the first
download and required of every later one), unpacks the raw sources where LEAF's scripts look for
them (so they download nothing themselves), runs LEAF's own preprocess.sh with LEAF_FLAGS in a
temporary folder and keeps the shards it wrote. The shards are parsed once into the .npz (uint8
pixels or token ids, the natural client of each sample, the clients' names, and the sha256 of every
shard it came from); later reads load that in seconds and refuse one whose shards have changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import string
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..io import atomic_open, atomic_write_text
from .base import IMAGE_SIDE, SEQUENCE_LENGTH, DatasetInfo
from .base import Arrays as _Arrays
from .base import is_network_error as _is_network_error
from .base import one_line as _one_line
from .base import prepare_command as _prepare_command

log = logging.getLogger("fedfactor")

# LEAF's last commit (19 Dec 2021); its data/ scripts are unchanged since 7 Dec 2021.
LEAF_COMMIT = "09ec454a5675e32e1f0546b456b77857fdece018"
# No -s, -k or -t: LEAF then stops after writing data/all_data (every user, every sample, no
# sampling, no train/test split: the natural partition splits each client's samples itself);
# --nochecksum skips LEAF's md5 listing of its own output, whose sha256 the cache records anyway.
LEAF_FLAGS = ("--nochecksum",)
# The FedFac authors' code (img_utils_linux.py) embeds index-in-string.printable (100 characters).
VOCABULARY = string.printable
CACHE_FORMAT = 1
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Download:
    file: str  # its name under <root>/<name>/downloads/
    url: str
    # where LEAF's scripts look for its content, relative to LEAF's data/<name>/ folder; None for
    # LEAF's repository archive itself
    unpack_to: str | None = None
    rename: tuple[tuple[str, str], ...] = ()  # (name as unpacked, name LEAF expects), inside unpack_to


def _leaf_archive() -> Download:
    return Download(f"leaf-{LEAF_COMMIT}.tar.gz", f"https://github.com/TalwalkarLab/leaf/archive/{LEAF_COMMIT}.tar.gz")


# What each dataset downloads, the URLs LEAF's get_data.sh uses (tests point them at local files).
DOWNLOADS: dict[str, tuple[Download, ...]] = {
    "femnist": (
        _leaf_archive(),
        Download("by_class.zip", "https://s3.amazonaws.com/nist-srd/SD19/by_class.zip", "data/raw_data"),
        Download("by_write.zip", "https://s3.amazonaws.com/nist-srd/SD19/by_write.zip", "data/raw_data"),
    ),
    "shakespeare": (
        _leaf_archive(),
        Download("1994-01-100.zip", "http://www.gutenberg.org/files/100/old/1994-01-100.zip", "data/raw_data",
                 (("100.txt", "raw_data.txt"),)),
    ),
}
# sha256 of a download by file name, where a source establishes it. None could be (no source publishes
# one, and GitHub does not promise byte-stable archives), so every download is trusted on first use.
PINNED_SHA256: dict[str, str] = {}

# how many pseudo writers or roles synthetic:femnist and synthetic:shakespeare have
SYNTHETIC_CLIENTS = 10


# ---------------------------------------------------------------------------------------------
# Entry points (datasets.py's _Leaf calls these)


def cached_clients(name: str, root: Path) -> int:
    """The natural clients in the cache, or 0 without a readable one (dataset_info must not fail)."""
    try:
        with np.load(_cache_path(name, root), allow_pickle=False) as f:
            return int(len(f["names"]))
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return 0


def arrays(info: DatasetInfo, root: Path, download: bool) -> _Arrays:
    """The dataset's arrays from its cache, else from its shards (downloaded and made if `download`).

    A training job (download=False) refuses a damaged or out-of-date cache; `prepare-data` builds it
    again from the shards, verified in full.
    """
    name, folder = info.name, root / info.name
    cache = _cache_path(name, root)
    if cache.is_file():
        try:
            cached = _read_cache(cache, info, root)
            problem = _shards_changed(cached, folder / "leaf", full=download)
            if problem is None:
                return cached.arrays
            raise UsageError(f"{cache} is out of date: {problem}; delete it and run {_prepare_command(name, root)} "
                             "again")
        except UsageError as err:
            if not download:
                raise
            log.warning("%s; building the cache again", err)
    train, test = find_shards(folder / "leaf")
    if not train and not test:
        if not download:
            raise UsageError(f"dataset {name!r} is not under {root} (neither {cache} nor LEAF's JSON shards under "
                             f"{folder / 'leaf'}); run {_prepare_command(name, root)} to download and preprocess it, "
                             "or place the shards there")
        fetch_and_preprocess(name, root)
        train, test = find_shards(folder / "leaf")
    parsed = parse_shards(info, root, train, test)
    _write_cache(cache, parsed, required=download)
    return parsed.arrays


def synthetic_info(base: DatasetInfo, name: str) -> DatasetInfo:
    return replace(base, name=name, natural_clients=SYNTHETIC_CLIENTS)


def synthetic_arrays(info: DatasetInfo, rng: np.random.Generator) -> _Arrays:
    """A small offline stand-in with owners: SYNTHETIC_CLIENTS pseudo writers or roles, each with its
    own skewed data, so that personalisation matters and a smoke round takes seconds on a CPU."""
    make = _synthetic_tokens if info.input == "tokens" else _synthetic_images
    x, y, owners = make(info, rng)
    names = [f"synthetic_{k}" for k in range(SYNTHETIC_CLIENTS)]
    # everything is official train, as in LEAF's all_data
    return _Arrays(x, y, x[:0], y[:0], owners, names)


# ---------------------------------------------------------------------------------------------
# Shards: finding and parsing


def _natural_key(path: Path) -> list[Any]:
    """all_data_2.json before all_data_10.json."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def find_shards(leaf: Path) -> tuple[list[Path], list[Path]]:
    """(official train shards, official test shards): all_data/*.json as train if there are any,
    else train/*.json and test/*.json (what LEAF's -t sample split writes)."""
    def listed(folder: Path) -> list[Path]:
        return sorted((p for p in folder.glob("*.json") if p.is_file()), key=_natural_key)

    all_data = listed(leaf / "all_data")
    if all_data:
        return all_data, []
    return listed(leaf / "train"), listed(leaf / "test")


@dataclass(frozen=True)
class ShardRecord:
    """A shard the cache was built from: path relative to leaf/, sha256, and its size and
    modification time, so that a later read re-hashes only the shards whose stat changed."""

    file: str
    sha256: str
    size: int
    mtime_ns: int


@dataclass
class Parsed:
    arrays: _Arrays
    shards: list[ShardRecord]


@dataclass
class _Shard:
    record: ShardRecord
    users: list[tuple[str, np.ndarray, np.ndarray]]  # (user, x, y) in the shard's order


def parse_shards(info: DatasetInfo, root: Path, train: list[Path], test: list[Path]) -> Parsed:
    """Every sample of the shards, official train shards first, with its user as its natural client.

    A user in several shards (a writer in train and test) is one client, numbered by first appearance.
    """
    leaf = root / info.name / "leaf"
    hint = (f"replace it, or delete {leaf} and run {_prepare_command(info.name, root)} to download and "
            "preprocess the dataset again")
    parts: dict[str, list[_Shard]] = {"train": [], "test": []}
    for split, paths in (("train", train), ("test", test)):
        for path in paths:
            log.info("parsing %s", path)
            parts[split].append(_read_shard(path, leaf, info, hint))
    clients: dict[str, int] = {}
    out = {}
    for split, shards in parts.items():
        xs, ys, owners = [], [], []
        for shard in shards:
            for user, x, y in shard.users:
                k = clients.setdefault(user, len(clients))
                xs.append(x)
                ys.append(y)
                owners.append(np.full(len(y), k, dtype=np.int32))
        shape = (IMAGE_SIDE * IMAGE_SIDE,) if info.input == "image" else (SEQUENCE_LENGTH,)
        x = np.concatenate([np.zeros((0, *shape), np.uint8), *xs]).reshape(-1, info.channels, info.height, info.width)
        out[split] = (x, np.concatenate([np.zeros(0, np.int64), *ys]), np.concatenate([np.zeros(0, np.int32), *owners]))
    (x_train, y_train, o_train), (x_test, y_test, o_test) = out["train"], out["test"]
    if not len(y_train) + len(y_test):
        raise UsageError(f"the LEAF shards under {leaf} hold no samples; {hint}")
    arrays = _Arrays(x_train, y_train, x_test, y_test, np.concatenate([o_train, o_test]), list(clients))
    return Parsed(arrays, [s.record for shards in parts.values() for s in shards])


def _read_shard(path: Path, leaf: Path, info: DatasetInfo, hint: str) -> _Shard:
    def fail(problem: str) -> UsageError:
        return UsageError(f"{path}: {problem}; {hint}")

    try:
        stat = path.stat()  # before reading: a change while it is read then shows as a changed stat
        data = path.read_bytes()
        doc = json.loads(data)
    except OSError as err:
        raise UsageError(f"cannot read {path} ({_one_line(err.strerror or err)}); {hint}") from None
    except (ValueError, RecursionError) as err:  # bad JSON or bad UTF-8
        raise fail(f"not valid JSON ({_one_line(err)})") from None
    if not isinstance(doc, dict) or not all(k in doc for k in ("users", "num_samples", "user_data")):
        raise fail("not a LEAF shard (an object with users, num_samples and user_data)")
    users, counts, user_data = doc["users"], doc["num_samples"], doc["user_data"]
    if not (isinstance(users, list) and isinstance(counts, list) and isinstance(user_data, dict)):
        raise fail("users and num_samples must be lists and user_data an object")
    if len(counts) != len(users):
        raise fail(f"users lists {len(users)} users but num_samples {len(counts)} counts")
    if not all(isinstance(u, str) for u in users) or len(set(users)) < len(users):
        raise fail("users must be distinct strings")
    if set(user_data) != set(users):
        extra = sorted(set(user_data).symmetric_difference(users))[0]
        raise fail(f"user {extra!r} is in only one of users and user_data")
    convert = _tokens if info.input == "tokens" else _pixels
    parsed = []
    for user, count in zip(users, counts):
        entry = user_data[user]
        try:
            if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"), list):
                raise ValueError("its user_data needs lists x and y")
            x, y = entry["x"], entry["y"]
            if len(x) != len(y):
                raise ValueError(f"x holds {len(x)} samples but y {len(y)}")
            if type(count) is not int or count != len(y):
                raise ValueError(f"num_samples says {count!r} but x and y hold {len(y)} samples")
            parsed.append((user, *convert(x, y, info)))
        except ValueError as err:
            raise fail(f"user {user!r}: {err}") from None
    record = ShardRecord(str(path.relative_to(leaf)), hashlib.sha256(data).hexdigest(), stat.st_size,
                         stat.st_mtime_ns)
    return _Shard(record, parsed)


def _pixels(x: list, y: list, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's FEMNIST x: 784 grey values in [0, 1] per image (PIL's 8-bit 'L' values / 255, so
    rounding x * 255 gives the 8-bit pixels back exactly); y: the class, 0..61."""
    size = IMAGE_SIDE * IMAGE_SIDE
    try:
        values = np.asarray(x, dtype=np.float64)
    except (ValueError, TypeError):
        raise ValueError(f"x must be lists of {size} numbers") from None
    if len(x) and (values.ndim != 2 or values.shape[1] != size):
        raise ValueError(f"x must be lists of {size} numbers (got an array of shape {list(values.shape)})")
    if values.size and not (np.isfinite(values).all() and values.min() >= 0 and values.max() <= 1):
        raise ValueError("x holds values outside [0, 1] (LEAF writes grey values / 255)")
    return np.rint(values.reshape(len(x), size) * 255).astype(np.uint8), _labels(y, info.num_classes)


def _labels(y: list, num_classes: int) -> np.ndarray:
    bad = next((v for v in y if type(v) is not int or not 0 <= v < num_classes), None)
    if bad is not None:
        raise ValueError(f"y holds {bad!r}; labels must be integers 0..{num_classes - 1}")
    return np.asarray(y, dtype=np.int64)


# byte -> index in VOCABULARY, 255 for a byte outside it
_TOKEN_IDS = np.full(256, 255, dtype=np.uint8)
_TOKEN_IDS[[ord(c) for c in VOCABULARY]] = np.arange(len(VOCABULARY), dtype=np.uint8)


def _tokens(x: list, y: list, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's Shakespeare x: strings of 80 characters; y: the next character. Both become indices in
    VOCABULARY (string.printable)."""
    i = next((i for i, s in enumerate(x) if not isinstance(s, str) or len(s) != SEQUENCE_LENGTH), None)
    if i is not None:
        raise ValueError(f"x[{i}] is {_short(x[i])}, not a string of {SEQUENCE_LENGTH} characters")
    i = next((i for i, s in enumerate(y) if not isinstance(s, str) or len(s) != 1), None)
    if i is not None:
        raise ValueError(f"y[{i}] is {_short(y[i])}, not a single character")
    ids = _encode("".join(x)).reshape(len(x), SEQUENCE_LENGTH)
    return ids, _encode("".join(y)).astype(np.int64)


def _encode(text: str) -> np.ndarray:
    try:
        raw = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    except UnicodeEncodeError as err:
        raise ValueError(_outside(err.object[err.start])) from None
    ids = _TOKEN_IDS[raw]
    if len(ids) and ids.max() == 255:
        raise ValueError(_outside(chr(raw[np.argmax(ids == 255)])))
    return ids


def _outside(char: str) -> str:
    return f"the character {char!r} is outside the vocabulary (Python's string.printable)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------------------------------------
# The cache


def _cache_path(name: str, root: Path) -> Path:
    return root / name / f"{name}.npz"


def _write_cache(path: Path, parsed: Parsed, required: bool) -> None:
    """Uncompressed (loading must be fast), atomic. `prepare-data` fails without it; a training job
    that parsed the shards itself (no cache yet) only warns."""
    arrays, shards = parsed.arrays, parsed.shards
    content = {
        "format": np.int64(CACHE_FORMAT),
        "x": np.concatenate([arrays.x_train, arrays.x_test]),
        "y": np.concatenate([arrays.y_train, arrays.y_test]).astype(np.uint8),
        "owners": arrays.owners,
        "names": np.array(list(arrays.client_names), dtype=str),
        "n_official_train": np.int64(len(arrays.y_train)),
        "shard_files": np.array([s.file for s in shards], dtype=str),
        "shard_sha256": np.array([s.sha256 for s in shards], dtype=str),
        "shard_sizes": np.array([s.size for s in shards], dtype=np.int64),
        "shard_mtimes": np.array([s.mtime_ns for s in shards], dtype=np.int64),
    }
    try:
        with atomic_open(path) as f:
            np.savez(f, **content)  # type: ignore[arg-type]
    except OSError as err:
        if required:
            raise UsageError(f"cannot write {path} ({_one_line(err.strerror or err)}); free some space or make "
                             f"{path.parent} writable") from None
        log.warning("cannot write the cache %s (%s); the next read parses the shards again", path, _one_line(err))


_CACHE_KEYS = ("format", "x", "y", "owners", "names", "n_official_train", "shard_files", "shard_sha256",
               "shard_sizes", "shard_mtimes")


def _read_cache(path: Path, info: DatasetInfo, root: Path) -> Parsed:
    def damaged(problem: str) -> UsageError:
        return UsageError(f"{path} is damaged ({problem}); delete it and run {_prepare_command(info.name, root)} "
                          "again")

    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in _CACHE_KEYS if k not in f.files]
            if missing:
                raise damaged(f"no array {missing[0]!r}")
            c = {k: f[k] for k in _CACHE_KEYS}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise damaged(_one_line(err)) from None
    if c["format"].shape != () or int(c["format"]) != CACHE_FORMAT:
        raise damaged(f"format {c['format']!r}, this version of fedfactor reads {CACHE_FORMAT}")
    x, y, owners, names = c["x"], c["y"], c["owners"], c["names"]
    shape = (info.channels, info.height, info.width)
    n = len(y)
    if x.dtype != np.uint8 or len(x) != n or int(np.prod(x.shape[1:])) != int(np.prod(shape)):
        raise damaged(f"x is {x.dtype} of shape {list(x.shape)} for {n} labels")
    if owners.dtype != np.int32 or owners.shape != (n,) or names.ndim != 1 or names.dtype.kind != "U":
        raise damaged("owners or names have the wrong type or length")
    if n and (owners.min() < 0 or owners.max() >= len(names) or y.max() >= info.num_classes):
        raise damaged("an owner or a label is out of range")
    n_train = int(c["n_official_train"])
    if not 0 <= n_train <= n:
        raise damaged(f"n_official_train {n_train} is outside 0..{n}")
    x = x.reshape(n, *shape)
    y = y.astype(np.int64)
    try:
        shards = [ShardRecord(*r) for r in zip(c["shard_files"].tolist(), c["shard_sha256"].tolist(),
                                               c["shard_sizes"].tolist(), c["shard_mtimes"].tolist(), strict=True)]
    except ValueError:
        raise damaged("its shard lists differ in length") from None
    return Parsed(_Arrays(x[:n_train], y[:n_train], x[n_train:], y[n_train:], owners, names.tolist()), shards)


def _shards_changed(cached: Parsed, leaf: Path, full: bool) -> str | None:
    """What changed in the shards since the cache was built, or None.

    No shards at all is no change: they may have been deleted to save space, and the cache stands
    alone. A shard whose size and modification time are as recorded is taken as unchanged unless
    `full` (prepare-data hashes every one).
    """
    train, test = find_shards(leaf)
    present = {str(p.relative_to(leaf)): p for p in train + test}
    if not present:
        return None
    recorded = {s.file: s for s in cached.shards}
    if set(present) != set(recorded):
        which = sorted(set(present).symmetric_difference(recorded))[0]
        return f"the shards under {leaf} are not the ones it was built from ({which} is new or gone)"
    for rel, path in present.items():
        shard = recorded[rel]
        stat = path.stat()
        if not full and (stat.st_size, stat.st_mtime_ns) == (shard.size, shard.mtime_ns):
            continue
        got = _sha256(path)
        if got != shard.sha256:
            return f"{path} changed since it was built (sha256 {got}, recorded {shard.sha256})"
    return None


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------------------------------------------------------------
# Download, checksums, LEAF's preprocessing


def fetch_and_preprocess(name: str, root: Path) -> None:
    """Download what `name` needs (checksum-verified), run LEAF's preprocess.sh, keep its shards under
    <root>/<name>/leaf/all_data/."""
    folder = root / name
    downloads = DOWNLOADS[name]
    paths = fetch(name, root)  # creates the folder
    archive = next(paths[d.file] for d in downloads if d.unpack_to is None)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".leaf-") as tmp:
        work = _unpack_leaf(archive, Path(tmp), name, root)
        for d in downloads:
            if d.unpack_to is not None:
                _unpack_raw(paths[d.file], work / d.unpack_to, d.rename, name, root)
        _run_preprocess(name, root, work, Path(tmp) / "bin")
        written = work / "data" / "all_data"
        if not any(written.glob("*.json")):
            raise UsageError(f"LEAF's preprocess.sh for {name} wrote no JSON shards; its output is in "
                             f"{_log_path(folder)}")
        target = folder / "leaf" / "all_data"
        if target.is_dir():  # it holds no shard (else find_shards would have found it)
            try:
                target.rmdir()
            except OSError:
                raise UsageError(f"{target} holds files that are not JSON shards; move them away and run "
                                 f"{_prepare_command(name, root)} again") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(written, target)


def fetch(name: str, root: Path) -> dict[str, Path]:
    """Each download of `name` under <root>/<name>/downloads/, verified; returns file name -> path.

    A file's sha256 must equal its pinned value, else the one SHA256SUMS recorded when it was first
    downloaded. One that does not is removed and refused, and nothing else is written; the sha256 of
    a file seen for the first time is recorded only once every file has passed.
    """
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    sums = folder / "SHA256SUMS"
    recorded = _read_sums(sums)
    paths, new = {}, {}
    for d in DOWNLOADS[name]:
        path = paths[d.file] = folder / "downloads" / d.file
        if not path.is_file():
            _download(d.url, path, name, root)
        got = _sha256(path)
        expected, source = PINNED_SHA256.get(d.file), "pinned in fedfactor.data.leaf"
        if expected is None:
            expected, source = recorded.get(d.file), f"recorded in {sums} at its first download"
        if expected is None:
            new[d.file] = got
        elif got != expected:
            path.unlink()
            raise UsageError(f"{path} failed its checksum (sha256 {got}, expected {expected}, {source}); it was "
                             f"removed: run {_prepare_command(name, root)} to download it again (if its source "
                             "changed it on purpose, delete its line in SHA256SUMS)")
    if new:
        lines = [f"{sha}  {file}" for file, sha in sorted({**recorded, **new}.items())]
        atomic_write_text(sums, "\n".join(lines) + "\n")
        log.info("recorded the sha256 of %s in %s (trust on first use)", ", ".join(sorted(new)), sums)
    return paths


def _read_sums(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not re.fullmatch(r"[0-9a-f]{64}", fields[0]):
            raise UsageError(f"{path} line {n} is not '<sha256>  <file>' ({_one_line(line)[:60]!r}); fix or delete it")
        out[fields[1]] = fields[0]
    return out


def _download(url: str, path: Path, name: str, root: Path) -> None:
    log.info("downloading %s to %s", url, path)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, atomic_open(path) as f:
            shutil.copyfileobj(response, f, _READ_CHUNK)
    except OSError as err:  # URLError and socket errors are OSErrors
        if not _is_network_error(err):
            raise UsageError(f"cannot write {path} ({_one_line(err.strerror or err)})") from None
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        raise UsageError(f"could not download {name} ({url}): {_one_line(reason)}; check the network connection, "
                         f"or place that file at {path}, or LEAF's JSON shards under "
                         f"{root / name / 'leaf' / 'all_data'}, yourself") from None


def _unpack_leaf(archive: Path, tmp: Path, name: str, root: Path) -> Path:
    """LEAF's data/<name>/ folder, unpacked from its repository archive into `tmp`."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / "leaf", filter="data")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise _broken(archive, err, name, root) from None
    found = sorted((tmp / "leaf").glob(f"*/data/{name}/preprocess.sh"))
    if not found:
        raise _broken(archive, f"no data/{name}/preprocess.sh in it: not LEAF's repository", name, root)
    return found[0].parent


def _unpack_raw(path: Path, target: Path, rename: tuple[tuple[str, str], ...], name: str, root: Path) -> None:
    """Unpack a raw download where LEAF's scripts look (which then download nothing themselves)."""
    log.info("unpacking %s", path)
    try:
        with zipfile.ZipFile(path) as z:
            z.extractall(target)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
        raise _broken(path, err, name, root) from None
    for old, new in rename:
        if not (target / old).exists():
            raise _broken(path, f"no {old} in it", name, root)
        os.replace(target / old, target / new)


def _broken(path: Path, reason: Any, name: str, root: Path) -> UsageError:
    return UsageError(f"cannot unpack {path} ({_one_line(reason)}): it is damaged or not the file it should be; "
                      f"delete it and run {_prepare_command(name, root)} to download it again")


def _log_path(folder: Path) -> Path:
    return folder / "preprocess.log"


def _run_preprocess(name: str, root: Path, work: Path, bin_dir: Path) -> None:
    """LEAF's own preprocess.sh in its data/<name>/ folder, its output in <root>/<name>/preprocess.log.

    Its Python steps run on this interpreter (a `python3` on PATH that calls it: it has numpy and
    Pillow). Pillow 10 removed Image.ANTIALIAS, which LEAF's FEMNIST step uses; it was an alias of
    Image.LANCZOS, so a sitecustomize on the steps' PYTHONPATH restores the alias, same pixels.
    """
    bin_dir.mkdir()
    shim = bin_dir / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    (bin_dir / "sitecustomize.py").write_text(
        "try:\n    from PIL import Image\nexcept ImportError:\n    pass\nelse:\n"
        "    if not hasattr(Image, 'ANTIALIAS'):\n        Image.ANTIALIAS = Image.LANCZOS\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(bin_dir)}
    log_path = _log_path(root / name)
    log.info("running LEAF's preprocess.sh %s for %s (hours for FEMNIST); output in %s", " ".join(LEAF_FLAGS), name,
             log_path)
    with open(log_path, "w") as out:  # not atomic: one can follow a run of hours as it goes
        status = subprocess.run(["bash", "preprocess.sh", *LEAF_FLAGS], cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if status != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        last = _one_line(lines[-1])[:200] if lines else "no output"
        raise UsageError(f"LEAF's preprocess.sh for {name} failed (exit {status}: {last}); its output is in {log_path}")


# ---------------------------------------------------------------------------------------------
# Synthetic stand-ins


def _synthetic_images(info: DatasetInfo, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class templates, a per-writer style (a fixed offset pattern) and noise; each writer draws its
    classes from its own Dirichlet(0.3) mix, so writers differ both in style and in label mix."""
    k, shape = info.num_classes, (info.channels, info.height, info.width)
    templates = rng.uniform(0, 255, size=(k, *shape))
    styles = rng.uniform(-40, 40, size=(SYNTHETIC_CLIENTS, *shape))
    mixes = rng.dirichlet(np.full(k, 0.3), size=SYNTHETIC_CLIENTS)
    sizes = rng.integers(30, 50, size=SYNTHETIC_CLIENTS)
    owners = np.repeat(np.arange(SYNTHETIC_CLIENTS, dtype=np.int32), sizes)
    y = np.concatenate([rng.choice(k, size=n, p=mix) for n, mix in zip(sizes, mixes)]).astype(np.int64)
    noise = rng.uniform(0, 100, size=(len(y), *shape))
    x = np.clip(templates[y] * 0.5 + styles[owners] + noise, 0, 255).astype(np.uint8)
    return x, y, owners


def _synthetic_tokens(info: DatasetInfo, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per role, a text from its own random Markov chain over a few printable characters, cut into
    sliding windows as LEAF does (x = 80 characters, y = the next one): learnable, and different per role."""
    alphabet = np.array([VOCABULARY.index(c) for c in "etaoinsh ."], dtype=np.uint8)
    xs, ys, owners = [], [], []
    for k in range(SYNTHETIC_CLIENTS):
        chain = rng.dirichlet(np.full(len(alphabet), 0.2), size=len(alphabet))  # sharp: few likely successors
        n = int(rng.integers(30, 50))
        state = [int(rng.integers(len(alphabet)))]
        for _ in range(n + SEQUENCE_LENGTH - 1):
            state.append(int(rng.choice(len(alphabet), p=chain[state[-1]])))
        text = alphabet[state]
        windows = np.lib.stride_tricks.sliding_window_view(text, SEQUENCE_LENGTH + 1)[:n]
        xs.append(windows[:, :SEQUENCE_LENGTH])
        ys.append(windows[:, SEQUENCE_LENGTH].astype(np.int64))
        owners.append(np.full(n, k, dtype=np.int32))
    x = np.concatenate(xs).reshape(-1, info.channels, info.height, info.width)
    return np.ascontiguousarray(x), np.concatenate(ys), np.concatenate(owners)

