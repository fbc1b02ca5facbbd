"""FEMNIST and Shakespeare from LEAF: parsing its JSON shards, the cache, the checksum-verified
download and LEAF's preprocessing, and the synthetic stand-ins.

The tests write small shards in LEAF's format. The download tests serve a fake LEAF repository
archive and fake raw files from file:// URLs (module-level DOWNLOADS, patched): the fake
preprocess.sh checks that the raw files were unpacked where LEAF's scripts look for them and copies
shards from them, so the real download -> checksum -> preprocess -> parse -> cache path runs, with no
network.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import string
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfactor.cli import main
from fedfactor.data import dataset_info, load_dataset, prepare_dataset
from fedfactor.data import leaf
from fedfactor.errors import UsageError

PRINTABLE = string.printable


def assert_one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.strip() == text and text
    return text


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# LEAF-format shards


def femnist_user(rng: np.random.Generator, n: int) -> dict:
    """n images as LEAF writes them: 784 grey values / 255 (PIL's 8-bit values), labels 0..61."""
    pixels = rng.integers(0, 256, size=(n, 784))
    return {"x": (pixels / 255).tolist(), "y": rng.integers(0, 62, size=n).tolist()}


def shakespeare_user(rng: np.random.Generator, n: int) -> dict:
    """n sliding windows of a random text over printable characters, as LEAF's shake_utils cuts them."""
    chars = list("abcdefghij ,.!?ABC\n'")
    text = "".join(rng.choice(chars, size=n + 80))
    return {"x": [text[i : i + 80] for i in range(n)], "y": [text[i + 80] for i in range(n)]}


def shard(users: dict[str, dict]) -> dict:
    return {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}


def write_shards(folder: Path, name: str, layout: dict[str, list[tuple[str, int]]], seed: int = 0) -> dict:
    """Shards under folder/<file>.json, each user with the given number of samples; returns
    {file: shard document}."""
    rng = np.random.default_rng(seed)
    make = femnist_user if name == "femnist" else shakespeare_user
    written = {}
    for file, users in layout.items():
        doc = shard({user: make(rng, n) for user, n in users})
        if name == "shakespeare":
            doc["hierarchies"] = ["A_PLAY"] * len(users)  # LEAF's optional key, ignored
        path = folder / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
        written[file] = doc
    return written


# three shards, a writer spread over two of them (as one writer, one client)
LAYOUT = {
    "all_data/all_data_0.json": [("f0001", 5), ("f0002", 3)],
    "all_data/all_data_1.json": [("f0003", 4)],
    "all_data/all_data_10.json": [("f0004", 2), ("f0001", 1)],
}
ORDER = ["all_data/all_data_0.json", "all_data/all_data_1.json", "all_data/all_data_10.json"]  # 10 after 1


def expected(name: str, written: dict, order: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(x, y, owners, names) as the parser should read them: shards in order, users by first appearance."""
    xs, ys, owners, names = [], [], [], []
    for file in order:
        doc = written[file]
        for user in doc["users"]:
            if user not in names:
                names.append(user)
            data = doc["user_data"][user]
            if name == "femnist":
                xs += [np.rint(np.asarray(v) * 255).astype(np.uint8).reshape(1, 28, 28) for v in data["x"]]
                ys += data["y"]
            else:
                xs += [np.array([PRINTABLE.index(c) for c in s], np.uint8).reshape(1, 1, 80) for s in data["x"]]
                ys += [PRINTABLE.index(c) for c in data["y"]]
            owners += [names.index(user)] * len(data["y"])
    return np.stack(xs), np.array(ys), np.array(owners), names


def read_raw(name: str, root: Path, download: bool = False):
    """What the LEAF source returns before load_dataset normalises it."""
    return leaf.arrays(dataset_info(name, root), root, download)


@pytest.mark.parametrize("name", ["femnist", "shakespeare"])
def test_shards_parse_with_each_samples_writer_or_role(tmp_path, name):
    written = write_shards(tmp_path / name / "leaf", name, LAYOUT)
    x, y, owners, names = expected(name, written, ORDER)
    arrays = read_raw(name, tmp_path)
    assert np.array_equal(arrays.x_train, x) and np.array_equal(arrays.y_train, y)
    assert np.array_equal(arrays.owners, owners) and list(arrays.client_names) == names == [
        "f0001", "f0002", "f0003", "f0004"]
    assert len(arrays.y_test) == 0  # all_data is all official train
    ds = load_dataset(name, tmp_path)
    assert ds.info.natural_clients == 4 and ds.n_official_train == 15
    assert np.array_equal(ds.owners, owners) and torch.equal(ds.y, torch.from_numpy(y))
    if name == "shakespeare":
        # token ids as they are, [N, 1, 1, 80] float32: not normalised
        assert ds.x.shape == (15, 1, 1, 80) and ds.x.dtype == torch.float32
        assert torch.equal(ds.x.long(), torch.from_numpy(x).long())
        assert ds.info.input == "tokens" and ds.info.augment == "none"
    else:
        assert ds.x.shape == (15, 1, 28, 28) and abs(float(ds.x.mean())) < 1e-5  # normalised as images


def test_femnist_pixels_are_leafs_8_bit_values_exactly(tmp_path):
    # LEAF writes PIL's 8-bit grey value / 255; rounding x * 255 gives every value 0..255 back
    values = np.arange(784) % 256
    doc = shard({"w": {"x": [(values / 255).tolist()], "y": [61]}})
    (tmp_path / "femnist" / "leaf" / "all_data").mkdir(parents=True)
    (tmp_path / "femnist" / "leaf" / "all_data" / "a.json").write_text(json.dumps(doc))
    arrays = read_raw("femnist", tmp_path)
    assert np.array_equal(arrays.x_train.reshape(-1), values.astype(np.uint8)) and arrays.y_train.tolist() == [61]


def test_train_and_test_shards_are_the_official_parts_and_a_user_in_both_is_one_client(tmp_path):
    layout = {"train/a_train.json": [("role_a", 6), ("role_b", 4)], "test/a_test.json": [("role_b", 2), ("role_c", 1)]}
    written = write_shards(tmp_path / "shakespeare" / "leaf", "shakespeare", layout)
    arrays = read_raw("shakespeare", tmp_path)
    assert (len(arrays.y_train), len(arrays.y_test)) == (10, 3)
    assert list(arrays.client_names) == ["role_a", "role_b", "role_c"]
    assert arrays.owners.tolist() == [0] * 6 + [1] * 4 + [1] * 2 + [2]
    _, y, _, _ = expected("shakespeare", written, list(layout))
    assert np.array_equal(np.concatenate([arrays.y_train, arrays.y_test]), y)


def test_all_data_is_preferred_to_train_and_test(tmp_path):
    write_shards(tmp_path / "femnist" / "leaf", "femnist", {"all_data/a.json": [("w", 2)],
                                                             "train/t.json": [("v", 3)]})
    assert list(read_raw("femnist", tmp_path).client_names) == ["w"]


# ---------------------------------------------------------------------------------------------
# The cache


def cache_of(root: Path, name: str) -> Path:
    return root / name / f"{name}.npz"


@pytest.mark.parametrize("name", ["femnist", "shakespeare"])
def test_the_cache_is_written_once_and_used_next_time(tmp_path, monkeypatch, name):
    write_shards(tmp_path / name / "leaf", name, LAYOUT)
    first = load_dataset(name, tmp_path)
    assert cache_of(tmp_path, name).is_file()
    with np.load(cache_of(tmp_path, name)) as f:  # the shards it came from, by sha256
        recorded = dict(zip(f["shard_files"].tolist(), f["shard_sha256"].tolist()))
        assert f["x"].dtype == np.uint8 and f["owners"].dtype == np.int32
    assert recorded == {file: sha256(tmp_path / name / "leaf" / file) for file in LAYOUT}
    assert dataset_info(name, tmp_path).natural_clients == 4  # read from the cache

    def no_parsing(*args):
        raise AssertionError("the shards were parsed again")

    monkeypatch.setattr(leaf, "_read_shard", no_parsing)
    again = load_dataset(name, tmp_path)
    assert torch.equal(first.x, again.x) and torch.equal(first.y, again.y)
    assert np.array_equal(first.owners, again.owners) and first.info == again.info
    assert first.n_official_train == again.n_official_train
    # without its shards (deleted to save space) the cache stands alone
    for file in LAYOUT:
        (tmp_path / name / "leaf" / file).unlink()
    assert torch.equal(load_dataset(name, tmp_path).x, first.x)


def test_prepare_data_reports_natural_clients_and_reuses_the_cache(tmp_path, capsys):
    write_shards(tmp_path / "femnist" / "leaf", "femnist", LAYOUT)
    out = tmp_path / "stats.json"
    assert main(["prepare-data", "--dataset", "femnist", "--root", str(tmp_path), "--out", str(out)]) == 0
    assert "15 samples, 62 classes, 4 natural clients" in capsys.readouterr().out
    stats = json.loads(out.read_text())
    assert (stats["natural_clients"], stats["samples"], stats["num_classes"]) == (4, 15, 62)
    assert stats["shape"] == [1, 28, 28] and sum(stats["class_counts"]) == 15
    before = cache_of(tmp_path, "femnist").stat().st_mtime_ns
    assert prepare_dataset("femnist", tmp_path) == stats
    assert cache_of(tmp_path, "femnist").stat().st_mtime_ns == before  # verified, not rewritten


def edit_a_label(path: Path) -> int:
    """Change the first label of user f0003 to another of as many digits (the file keeps its size);
    returns the new label."""
    doc = json.loads(path.read_text())
    old = doc["user_data"]["f0003"]["y"][0]
    new = old + 1 if len(str(old + 1)) == len(str(old)) else old - 1
    doc["user_data"]["f0003"]["y"][0] = new
    size = path.stat().st_size
    path.write_text(json.dumps(doc))
    assert path.stat().st_size == size
    return new


@pytest.mark.parametrize("change", ["edited", "added", "removed"])
def test_a_cache_whose_shards_changed_is_refused_and_prepare_data_rebuilds_it(tmp_path, change):
    leaf_dir = tmp_path / "femnist" / "leaf"
    write_shards(leaf_dir, "femnist", LAYOUT)
    load_dataset("femnist", tmp_path)
    if change == "edited":  # same size, a new modification time: the sha256 tells
        edit_a_label(leaf_dir / ORDER[1])
    elif change == "added":
        write_shards(leaf_dir, "femnist", {"all_data/all_data_2.json": [("f0009", 2)]}, seed=5)
    else:
        (leaf_dir / ORDER[2]).unlink()
    with pytest.raises(UsageError, match="is out of date") as err:
        load_dataset("femnist", tmp_path)
    assert "delete it and run `fedfactor prepare-data --dataset femnist" in assert_one_line(err)
    summary = prepare_dataset("femnist", tmp_path)  # builds it again from the shards as they are
    samples = {"edited": 15, "added": 17, "removed": 12}[change]
    assert summary["samples"] == samples and len(load_dataset("femnist", tmp_path).y) == samples


def test_an_edit_that_keeps_size_and_time_passes_a_training_job_but_not_prepare_data(tmp_path):
    # training jobs re-hash only shards whose size or modification time changed (hashing GBs of
    # JSON in every job would cost more than loading the cache); prepare-data hashes them all
    import os

    leaf_dir = tmp_path / "femnist" / "leaf"
    write_shards(leaf_dir, "femnist", LAYOUT)
    before = load_dataset("femnist", tmp_path)
    path = leaf_dir / ORDER[1]
    stat = path.stat()
    new = edit_a_label(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert torch.equal(load_dataset("femnist", tmp_path).y, before.y)
    prepare_dataset("femnist", tmp_path)
    after = load_dataset("femnist", tmp_path)
    first_of_f0003 = int(np.flatnonzero(after.owners == 2)[0])
    assert int(after.y[first_of_f0003]) == new != int(before.y[first_of_f0003])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing key"])
def test_a_damaged_cache_is_one_line_and_prepare_data_rebuilds_it(tmp_path, damage):
    write_shards(tmp_path / "shakespeare" / "leaf", "shakespeare", LAYOUT)
    good = load_dataset("shakespeare", tmp_path)
    cache = cache_of(tmp_path, "shakespeare")
    if damage == "truncated":
        cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    elif damage == "garbage":
        cache.write_bytes(b"not an npz")
    else:
        with np.load(cache) as f:
            content = {k: f[k] for k in f.files if k != "owners"}
        np.savez(cache, **content)
    with pytest.raises(UsageError, match=f"{cache} is damaged") as err:
        load_dataset("shakespeare", tmp_path)
    assert "delete it and run `fedfactor prepare-data --dataset shakespeare" in assert_one_line(err)
    prepare_dataset("shakespeare", tmp_path)
    assert torch.equal(load_dataset("shakespeare", tmp_path).x, good.x)


# ---------------------------------------------------------------------------------------------
# Damaged shards: one line naming the shard (and user), and no cache


def femnist_doc() -> dict:
    return shard({"w1": femnist_user(np.random.default_rng(0), 3), "w2": femnist_user(np.random.default_rng(1), 2)})


def shakespeare_doc() -> dict:
    return shard({"r1": shakespeare_user(np.random.default_rng(0), 3)})


def _set(doc: dict, path: tuple, value) -> dict:
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


BAD_SHARDS = [
    ("femnist", "truncated", lambda: json.dumps(femnist_doc())[:500], "not valid JSON"),
    ("femnist", "not an object", lambda: "[1, 2]", "not a LEAF shard"),
    ("femnist", "users a string", lambda: json.dumps({**femnist_doc(), "users": "w1"}), "must be lists"),
    ("femnist", "x/y lengths", lambda: json.dumps(_set(femnist_doc(), ("user_data", "w2", "y"), [1])),
     "user 'w2': x holds 2 samples but y 1"),
    ("femnist", "num_samples", lambda: json.dumps({**femnist_doc(), "num_samples": [3, 5]}),
     "user 'w2': num_samples says 5"),
    ("femnist", "short image", lambda: json.dumps(_set(femnist_doc(), ("user_data", "w1", "x", 0), [0.5] * 783)),
     "user 'w1': x must be lists of 784 numbers"),
    ("femnist", "strings as pixels", lambda: json.dumps(_set(femnist_doc(), ("user_data", "w1", "x", 1), ["a"] * 784)),
     "user 'w1': x must be lists of 784 numbers"),
    ("femnist", "pixel above 1", lambda: json.dumps(_set(femnist_doc(), ("user_data", "w1", "x", 0, 5), 2.0)),
     "outside [0, 1]"),
    ("femnist", "float label", lambda: json.dumps(_set(femnist_doc(), ("user_data", "w2", "y", 0), 3.0)),
     "user 'w2': y holds 3.0"),
    ("femnist", "label 62", lambda: json.dumps(_set(femnist_doc(), ("user_data", "w2", "y", 1), 62)),
     "labels must be integers 0..61"),
    ("femnist", "user without data", lambda: json.dumps({**femnist_doc(), "users": ["w1", "w2", "w3"],
                                                        "num_samples": [3, 2, 0]}), "user 'w3' is in only one"),
    ("shakespeare", "character outside string.printable",
     lambda: json.dumps(_set(shakespeare_doc(), ("user_data", "r1", "x", 1), "é" + "a" * 79)),
     "user 'r1': the character 'é' is outside the vocabulary"),
    ("shakespeare", "control character", lambda: json.dumps(_set(shakespeare_doc(), ("user_data", "r1", "y", 2), "\x01")),
     "the character '\\x01' is outside the vocabulary"),
    ("shakespeare", "79 characters", lambda: json.dumps(_set(shakespeare_doc(), ("user_data", "r1", "x", 0), "a" * 79)),
     "user 'r1': x[0] is 'aaaa"),
    ("shakespeare", "two-character y", lambda: json.dumps(_set(shakespeare_doc(), ("user_data", "r1", "y", 0), "ab")),
     "y[0] is 'ab', not a single character"),
    ("shakespeare", "number as x", lambda: json.dumps(_set(shakespeare_doc(), ("user_data", "r1", "x", 2), 7)),
     "x[2] is 7"),
    ("shakespeare", "bad UTF-8", lambda: b"\xff\xfe{}", "not valid JSON"),
]


@pytest.mark.parametrize("name, case, content, message", BAD_SHARDS, ids=[f"{n}-{c}" for n, c, _, _ in BAD_SHARDS])
def test_a_damaged_shard_is_one_line_naming_it_and_writes_no_cache(tmp_path, capsys, name, case, content, message):
    good = write_shards(tmp_path / name / "leaf", name, {"all_data/a_0.json": [("ok", 2)]})
    assert good
    bad = tmp_path / name / "leaf" / "all_data" / "a_1.json"
    text = content()
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError) as err:
        load_dataset(name, tmp_path)
    line = assert_one_line(err)
    assert line.startswith(f"{bad}: ") and message in line, line
    assert not cache_of(tmp_path, name).exists()
    out = tmp_path / "stats.json"
    assert main(["prepare-data", "--dataset", name, "--root", str(tmp_path), "--out", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not cache_of(tmp_path, name).exists() and not out.exists()


def test_nothing_to_read_tells_the_user_to_prepare_data(tmp_path):
    with pytest.raises(UsageError, match="dataset 'femnist' is not under") as err:
        load_dataset("femnist", tmp_path)
    assert "run `fedfactor prepare-data --dataset femnist" in assert_one_line(err)
    assert not (tmp_path / "femnist").exists()  # download=False never downloads


# ---------------------------------------------------------------------------------------------
# Download, checksums and LEAF's preprocessing (file:// URLs, a fake LEAF repository)

FEMNIST_SCRIPT = """#!/usr/bin/env bash
# the fake LEAF: runs in data/femnist with the flags fedfactor passes; the raw zips must be unpacked
# where LEAF's get_data.sh would have put them, and python3 must be one with numpy and Pillow
set -e
[ "$*" = "--nochecksum" ] || { echo "unexpected flags: $*"; exit 3; }
test -d data/raw_data/by_class/hsf_0 || { echo "by_class.zip not unpacked"; exit 4; }
python3 -c "from PIL import Image; Image.ANTIALIAS; import numpy"
mkdir -p data/all_data
cp data/raw_data/by_write/shards/*.json data/all_data/
echo "wrote the shards"
"""
SHAKESPEARE_SCRIPT = """#!/usr/bin/env bash
set -e
[ "$*" = "--nochecksum" ] || exit 3
mkdir -p data/all_data
cp data/raw_data/raw_data.txt data/all_data/all_data.json
"""


def tar_gz(files: dict[str, tuple[str, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for arcname, (text, mode) in files.items():
            data = text.encode()
            entry = tarfile.TarInfo(arcname)
            entry.size, entry.mode = len(data), mode
            tar.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


def zipped(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
    return buffer.getvalue()


def serve(monkeypatch, remote: Path, name: str, script: str | None = None) -> dict:
    """The files of `name`'s downloads under `remote`, DOWNLOADS pointing at them; returns the shards
    the fake preprocess.sh will write, by file name."""
    remote.mkdir(parents=True, exist_ok=True)
    downloads = leaf.DOWNLOADS[name]
    repo = f"leaf-{leaf.LEAF_COMMIT}/data/{name}/preprocess.sh"
    script = script or (FEMNIST_SCRIPT if name == "femnist" else SHAKESPEARE_SCRIPT)
    (remote / downloads[0].file).write_bytes(tar_gz({repo: (script, 0o755),
                                                     f"leaf-{leaf.LEAF_COMMIT}/README.md": ("LEAF", 0o644)}))
    layout = {"all_data_0.json": [("w_a", 4), ("w_b", 3)], "all_data_1.json": [("w_c", 5)]}
    if name == "shakespeare":
        layout = {"all_data.json": [("ROLE_A", 4), ("ROLE_B", 6), ("ROLE_C", 2)]}
    written = write_shards(remote / "shards", name, layout)
    texts = {f: (remote / "shards" / f).read_text() for f in written}
    if name == "femnist":
        (remote / "by_class.zip").write_bytes(zipped({"by_class/hsf_0/a.png": "png"}))
        (remote / "by_write.zip").write_bytes(zipped({f"by_write/shards/{f}": t for f, t in texts.items()}))
    else:
        (remote / "1994-01-100.zip").write_bytes(zipped({"100.txt": texts["all_data.json"]}))
    monkeypatch.setitem(leaf.DOWNLOADS, name, tuple(replace(d, url=(remote / d.file).as_uri()) for d in downloads))
    return written


@pytest.mark.parametrize("name", ["femnist", "shakespeare"])
def test_prepare_downloads_verifies_preprocesses_and_caches(tmp_path, monkeypatch, name):
    remote, root = tmp_path / "remote", tmp_path / "root"
    written = serve(monkeypatch, remote, name)
    summary = prepare_dataset(name, root)
    folder = root / name
    files = [d.file for d in leaf.DOWNLOADS[name]]
    for file in files:  # kept, and recorded on first use
        assert sha256(folder / "downloads" / file) == sha256(remote / file)
    sums = dict(reversed(line.split()) for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert sums == {file: sha256(remote / file) for file in files}
    assert sorted(p.name for p in (folder / "leaf" / "all_data").iterdir()) == sorted(written)
    assert cache_of(root, name).is_file()
    if name == "femnist":
        assert "wrote the shards" in (folder / "preprocess.log").read_text()
    assert not list(folder.glob(".leaf-*"))  # the temporary folder is gone
    n = sum(len(d["user_data"][u]["y"]) for d in written.values() for u in d["users"])
    assert (summary["samples"], summary["natural_clients"]) == (n, 3)
    x, y, owners, _ = expected(name, written, sorted(written, key=lambda f: leaf._natural_key(Path(f))))
    arrays = read_raw(name, root)
    assert np.array_equal(arrays.x_train, x) and np.array_equal(arrays.owners, owners)
    # a second preparation downloads nothing: it verifies the shards behind the cache
    for file in files:
        (remote / file).unlink()
    assert prepare_dataset(name, root) == summary


def test_preparing_again_after_deleting_the_data_verifies_the_downloads_against_sha256sums(tmp_path, monkeypatch,
                                                                                          capsys):
    remote, root = tmp_path / "remote", tmp_path / "root"
    serve(monkeypatch, remote, "shakespeare")
    prepare_dataset("shakespeare", root)
    folder = root / "shakespeare"
    first = sha256(remote / "1994-01-100.zip")
    # the source now serves other bytes under the same name
    (folder / "downloads" / "1994-01-100.zip").unlink()
    (remote / "1994-01-100.zip").write_bytes(zipped({"100.txt": "something else"}))
    cache_of(root, "shakespeare").unlink()
    for p in (folder / "leaf" / "all_data").iterdir():
        p.unlink()
    before = sorted(p for p in root.rglob("*") if p.name != "1994-01-100.zip")
    out = tmp_path / "stats.json"
    assert main(["prepare-data", "--dataset", "shakespeare", "--root", str(root), "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1, message
    got = sha256(remote / "1994-01-100.zip")
    assert f"{folder / 'downloads' / '1994-01-100.zip'} failed its checksum (sha256 {got}, expected {first}" in message
    assert "recorded in" in message and "SHA256SUMS" in message
    assert not (folder / "downloads" / "1994-01-100.zip").exists()  # the bad file is removed
    assert sorted(root.rglob("*")) == before and not out.exists()  # and nothing else written


def test_a_pinned_checksum_refuses_a_first_download_and_records_nothing(tmp_path, monkeypatch):
    remote, root = tmp_path / "remote", tmp_path / "root"
    serve(monkeypatch, remote, "femnist")
    monkeypatch.setitem(leaf.PINNED_SHA256, "by_class.zip", "0" * 64)
    with pytest.raises(UsageError, match=rf"by_class.zip failed its checksum \(sha256 [0-9a-f]{{64}}, expected "
                                         rf"{'0' * 64}, pinned in fedfactor.data.leaf\)") as err:
        prepare_dataset("femnist", root)
    assert_one_line(err)
    folder = root / "femnist"
    assert sorted(p.name for p in (folder / "downloads").iterdir()) == [leaf.DOWNLOADS["femnist"][0].file]
    assert not (folder / "SHA256SUMS").exists() and not (folder / "leaf").exists()
    assert not cache_of(root, "femnist").exists()
    # the right pin passes
    monkeypatch.setitem(leaf.PINNED_SHA256, "by_class.zip", sha256(remote / "by_class.zip"))
    assert prepare_dataset("femnist", root)["natural_clients"] == 3


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there: connection refused


def test_an_unreachable_source_is_one_line(tmp_path, monkeypatch):
    serve(monkeypatch, tmp_path / "remote", "femnist")
    downloads = leaf.DOWNLOADS["femnist"]
    monkeypatch.setitem(leaf.DOWNLOADS, "femnist", (downloads[0], replace(downloads[1], url=closed_port_url() + "/x"),
                                                   downloads[2]))
    with pytest.raises(UsageError, match="could not download femnist") as err:
        prepare_dataset("femnist", tmp_path / "root")
    message = assert_one_line(err)
    place = tmp_path / "root" / "femnist" / "downloads" / "by_class.zip"
    assert "check the network connection" in message and f"place that file at {place}" in message, message
    assert not place.exists()


def test_a_failing_preprocess_is_one_line_and_leaves_no_shards(tmp_path, monkeypatch):
    serve(monkeypatch, tmp_path / "remote", "shakespeare", script="#!/usr/bin/env bash\necho 'no wget here'\nexit 7\n")
    with pytest.raises(UsageError, match=r"preprocess.sh for shakespeare failed \(exit 7: no wget here\)") as err:
        prepare_dataset("shakespeare", tmp_path / "root")
    assert "preprocess.log" in assert_one_line(err)
    folder = tmp_path / "root" / "shakespeare"
    assert not (folder / "leaf").exists() and not list(folder.glob(".leaf-*"))
    assert not cache_of(tmp_path / "root", "shakespeare").exists()


def test_an_archive_that_is_not_leafs_is_one_line(tmp_path, monkeypatch):
    serve(monkeypatch, tmp_path / "remote", "shakespeare")
    (tmp_path / "remote" / leaf.DOWNLOADS["shakespeare"][0].file).write_bytes(b"not a tar")
    with pytest.raises(UsageError, match="cannot unpack .*leaf-.*tar.gz") as err:
        prepare_dataset("shakespeare", tmp_path / "root")
    assert "delete it and run" in assert_one_line(err)


def test_the_pinned_sources_are_leafs_own():
    # the URLs LEAF's get_data.sh downloads, LEAF's repository at a full commit hash
    assert len(leaf.LEAF_COMMIT) == 40
    urls = {d.file: d.url for name in ("femnist", "shakespeare") for d in leaf.DOWNLOADS[name]}
    assert urls["by_write.zip"] == "https://s3.amazonaws.com/nist-srd/SD19/by_write.zip"
    assert urls["1994-01-100.zip"] == "http://www.gutenberg.org/files/100/old/1994-01-100.zip"
    assert urls[f"leaf-{leaf.LEAF_COMMIT}.tar.gz"].endswith(f"/leaf/archive/{leaf.LEAF_COMMIT}.tar.gz")
    assert leaf.VOCABULARY == string.printable and len(leaf.VOCABULARY) == 100


# ---------------------------------------------------------------------------------------------
# Static info and the synthetic stand-ins


@pytest.mark.parametrize("name, shape, classes, kind", [("femnist", (1, 28, 28), 62, "image"),
                                                        ("shakespeare", (1, 1, 80), 100, "tokens")])
def test_static_info_needs_no_files_and_the_stand_in_matches_it(tmp_path, name, shape, classes, kind):
    info = dataset_info(name, tmp_path)
    assert ((info.channels, info.height, info.width), info.num_classes, info.input, info.augment) == (
        shape, classes, kind, "none")
    assert info.natural_clients == 0  # not prepared: not known
    stand_in = dataset_info(f"synthetic:{name}", tmp_path)
    assert stand_in == replace(info, name=f"synthetic:{name}", natural_clients=leaf.SYNTHETIC_CLIENTS)
    ds = load_dataset(f"synthetic:{name}", tmp_path)
    assert tuple(ds.x.shape[1:]) == shape and int(ds.y.max()) < classes
    assert ds.owners is not None and set(ds.owners.tolist()) == set(range(leaf.SYNTHETIC_CLIENTS))
    assert ds.info.natural_clients == leaf.SYNTHETIC_CLIENTS and 300 <= len(ds.y) <= 600
    assert list(tmp_path.iterdir()) == []  # no download, no file


def test_synthetic_writers_differ_in_their_class_mix():
    ds = load_dataset("synthetic:femnist")
    y, owners = ds.y.numpy(), ds.owners
    mixes = np.stack([np.bincount(y[owners == k], minlength=62) / (owners == k).sum() for k in range(10)])
    # each writer concentrates on a few classes, and not the same ones
    assert (np.sort(mixes, axis=1)[:, -3:].sum(axis=1) > 0.3).all()
    assert min(np.abs(mixes[a] - mixes[b]).sum() for a in range(10) for b in range(a)) > 0.5


def test_synthetic_roles_speak_learnable_markov_text_of_their_own():
    ds = load_dataset("synthetic:shakespeare")
    ds2 = load_dataset("synthetic:shakespeare")
    assert torch.equal(ds.x, ds2.x) and torch.equal(ds.y, ds2.y)  # seeded
    x, y, owners = ds.x[:, 0, 0].long().numpy(), ds.y.numpy(), ds.owners
    assert set(x.reshape(-1)) <= {PRINTABLE.index(c) for c in "etaoinsh ."}
    assert np.array_equal(x[1:, :-1][owners[1:] == owners[:-1]], x[:-1, 1:][owners[1:] == owners[:-1]])  # windows
    # per role, guessing the likeliest successor of the last character beats chance (1/10) by far
    right = 0
    for k in range(10):
        last, nxt = x[owners == k, -1], y[owners == k]
        right += sum(np.bincount(nxt[last == c]).max() for c in np.unique(last))
    assert right / len(y) > 0.4
