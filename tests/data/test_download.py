"""Missing and damaged files, and downloads: checksums, archives that cannot be extracted, unreachable
servers, and what to place by hand, each said in one line naming the file."""

from __future__ import annotations

import errno
import gzip
import http.server
import io
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
from torchvision import datasets as tvd

from fedfactor.cli import main
from fedfactor.data import load_dataset, prepare_dataset
from fedfactor.errors import UsageError

from .conftest import assert_one_line, check_loaded, md5
from .test_torchvision_sources import TINY, patch_cifar, write_cifar, write_mnist, write_svhn, write_tiny_imagenet


# ---------------------------------------------------------------------------------------------
# Files missing or failing their checksum


def write_unpatched(name: str, root: Path) -> None:
    """Real-format files whose md5s differ from the constants torchvision ships."""
    if name == "cifar10":
        write_cifar(root, tvd.CIFAR10)
    elif name == "svhn":
        write_svhn(root)
    elif name == "tinyimagenet":  # only the zip has a checksum
        (root / TINY.ARCHIVE).write_bytes(b"not the real zip")
    else:  # torchvision only checksums MNIST's .gz archives
        write_mnist(root / "MNIST" / "raw")


@pytest.mark.parametrize("name", ["cifar10", "svhn", "mnist", "tinyimagenet"])
def test_checksum_mismatch_is_a_usage_error(tmp_path, name):
    write_unpatched(name, tmp_path)
    with pytest.raises(UsageError, match="failed its checksum") as err:
        load_dataset(name, tmp_path)
    assert "delete it" in assert_one_line(err)


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "svhn", "mnist", "tinyimagenet"])
def test_missing_files_tell_the_user_to_prepare_data(tmp_path, name):
    with pytest.raises(UsageError, match=f"fedfactor prepare-data --dataset {name}") as err:
        load_dataset(name, tmp_path)
    assert "checksum" not in assert_one_line(err)


def test_one_missing_file_is_reported_as_missing_not_corrupt(tmp_path, monkeypatch):
    written = write_cifar(tmp_path, tvd.CIFAR10)
    patch_cifar(monkeypatch, tvd.CIFAR10, written)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(UsageError, match="missing cifar-10-batches-py/test_batch"):
        load_dataset("cifar10", tmp_path)


# ---------------------------------------------------------------------------------------------
# Downloads through torchvision's own downloader, from an HTTP server on localhost
# (file:// URLs do not work: torchvision reads the HTTP response's `length`)


@pytest.fixture
def server(tmp_path):
    """(folder, base URL): an HTTP server on 127.0.0.1 serving the folder, for this test only."""
    folder = tmp_path / "server"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there: connection refused


def write_cifar_archive(folder: Path) -> tuple[dict, Path]:
    written = write_cifar(folder, tvd.CIFAR10)
    archive = folder / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return written, archive


def test_prepare_downloads_verifies_and_loads_cifar10(tmp_path, monkeypatch, server):
    folder, base = server
    root = tmp_path / "root"
    written, archive = write_cifar_archive(folder)
    patch_cifar(monkeypatch, tvd.CIFAR10, written)
    monkeypatch.setattr(tvd.CIFAR10, "url", f"{base}/{archive.name}")
    monkeypatch.setattr(tvd.CIFAR10, "tgz_md5", md5(archive))

    with pytest.raises(UsageError, match="prepare-data"):
        load_dataset("cifar10", root)  # download=False never downloads
    summary = prepare_dataset("cifar10", root)
    assert md5(root / archive.name) == md5(archive)
    assert (root / "cifar-10-batches-py" / "data_batch_5").is_file()
    assert (summary["samples"], summary["official_train"], summary["official_test"]) == (19, 15, 4)
    check_loaded(load_dataset("cifar10", root), written, 15)


def test_download_failing_its_checksum_is_a_usage_error(tmp_path, monkeypatch, server):
    folder, base = server
    written, archive = write_cifar_archive(folder)
    patch_cifar(monkeypatch, tvd.CIFAR10, written)
    monkeypatch.setattr(tvd.CIFAR10, "url", f"{base}/{archive.name}")
    with pytest.raises(UsageError, match="cifar-10-python.tar.gz failed its checksum") as err:
        prepare_dataset("cifar10", tmp_path / "root")  # tgz_md5 left at the real archive's md5
    assert_one_line(err)


def test_load_with_download_true_fetches_svhn(tmp_path, monkeypatch, server):
    folder, base = server
    written = write_svhn(folder)
    split_list = {s: [f"{base}/{e[1]}", e[1], e[2]] for s, e in written["split_list"].items()}
    monkeypatch.setattr(tvd.SVHN, "split_list", split_list)
    check_loaded(load_dataset("svhn", tmp_path / "root", download=True), written, 7)


def test_prepare_downloads_mnist_archives(tmp_path, monkeypatch, server):
    folder, base = server
    root = tmp_path / "root"
    written = write_mnist(folder, gz_only=True)
    monkeypatch.setattr(tvd.MNIST, "resources", written["resources"])
    # the first mirror is down: torchvision moves on to the next
    monkeypatch.setattr(tvd.MNIST, "mirrors", [closed_port_url() + "/", base + "/"])
    summary = prepare_dataset("mnist", root)
    assert (summary["official_train"], summary["official_test"], summary["shape"]) == (6, 3, [1, 28, 28])
    check_loaded(load_dataset("mnist", root), written, 6)


def write_tiny_imagenet_zip(folder: Path) -> tuple[dict, Path]:
    written = write_tiny_imagenet(folder / "build")
    archive = folder / TINY.ARCHIVE
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted((folder / "build").rglob("*")):
            zf.write(path, path.relative_to(folder / "build"))
    return written, archive


def test_prepare_downloads_extracts_and_caches_tinyimagenet(tmp_path, monkeypatch, server):
    folder, base = server
    root = tmp_path / "root"
    written, archive = write_tiny_imagenet_zip(folder)
    monkeypatch.setattr(TINY, "URL", f"{base}/{archive.name}")
    monkeypatch.setattr(TINY, "MD5", md5(archive))

    with pytest.raises(UsageError, match="prepare-data --dataset tinyimagenet"):
        load_dataset("tinyimagenet", root)  # download=False never downloads
    summary = prepare_dataset("tinyimagenet", root)
    assert md5(root / archive.name) == md5(archive)
    assert (root / "tiny-imagenet-200" / "val" / "val_annotations.txt").is_file()
    assert (root / TINY.CACHE).is_file()
    assert (summary["samples"], summary["official_train"], summary["official_test"]) == (11, 7, 4)
    assert summary["shape"] == [3, 64, 64] and len(summary["class_counts"]) == 200
    assert summary["class_counts"][:4] == [3, 4, 4, 0]
    check_loaded(load_dataset("tinyimagenet", root), written, 7)


def test_tinyimagenet_download_failing_its_checksum_is_a_usage_error(tmp_path, monkeypatch, server):
    folder, base = server
    _, archive = write_tiny_imagenet_zip(folder)
    monkeypatch.setattr(TINY, "URL", f"{base}/{archive.name}")  # MD5 left at the real zip's
    with pytest.raises(UsageError, match="tiny-imagenet-200.zip failed its checksum") as err:
        prepare_dataset("tinyimagenet", tmp_path / "root")
    assert_one_line(err)


@pytest.mark.parametrize("name", ["cifar10", "svhn", "mnist", "tinyimagenet"])
def test_unreachable_download_is_a_one_line_usage_error(tmp_path, monkeypatch, name):
    nowhere = closed_port_url()
    if name == "cifar10":
        monkeypatch.setattr(tvd.CIFAR10, "url", nowhere + "/cifar-10-python.tar.gz")
    elif name == "svhn":
        monkeypatch.setattr(
            tvd.SVHN, "split_list", {s: [f"{nowhere}/{e[1]}", e[1], e[2]] for s, e in tvd.SVHN.split_list.items()}
        )
    elif name == "tinyimagenet":
        monkeypatch.setattr(TINY, "URL", nowhere + "/" + TINY.ARCHIVE)
    else:
        monkeypatch.setattr(tvd.MNIST, "mirrors", [nowhere + "/a/", nowhere + "/b/"])
    with pytest.raises(UsageError, match=f"could not download {name}") as err:
        prepare_dataset(name, tmp_path / "root")
    # it names what to place by hand, where, and the command that then reads it
    first = {"cifar10": "cifar-10-python.tar.gz", "svhn": "train_32x32.mat", "mnist": "MNIST/raw/",
             "tinyimagenet": "tiny-imagenet-200.zip"}[name]
    message = assert_one_line(err)
    assert f"or place {first}" in message and f"under {tmp_path / 'root'} yourself" in message, message
    assert f"fedfactor prepare-data --dataset {name}" in message, message


# ---------------------------------------------------------------------------------------------
# prepare-data on a damaged archive in the data root (no network: downloads go to a closed port)


def place_archive(name: str, root: Path, build: Path, monkeypatch: pytest.MonkeyPatch):
    """A good copy of what `name` downloads, in `root` where torchvision looks for it, and a function
    that patches the md5 torchvision expects of it."""
    nowhere = closed_port_url()
    if name in ("cifar10", "cifar100"):
        cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
        patch_cifar(monkeypatch, cls, write_cifar(build, cls))
        archive = root / cls.filename
        root.mkdir()
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(build / cls.base_folder, arcname=cls.base_folder)
        monkeypatch.setattr(cls, "url", f"{nowhere}/{cls.filename}")
        return archive, lambda m: monkeypatch.setattr(cls, "tgz_md5", m)
    if name == "mnist":
        resources = write_mnist(root / "MNIST" / "raw", gz_only=True)["resources"]
        monkeypatch.setattr(tvd.MNIST, "resources", resources)
        monkeypatch.setattr(tvd.MNIST, "mirrors", [nowhere + "/"])
        return root / "MNIST" / "raw" / resources[0][0], lambda m: resources.__setitem__(0, (resources[0][0], m))
    if name == "svhn":
        split_list = {s: [f"{nowhere}/{e[1]}", e[1], e[2]] for s, e in write_svhn(root)["split_list"].items()}
        monkeypatch.setattr(tvd.SVHN, "split_list", split_list)
        return root / split_list["train"][1], lambda m: split_list["train"].__setitem__(2, m)
    _, archive = write_tiny_imagenet_zip(build)
    root.mkdir()
    monkeypatch.setattr(TINY, "URL", f"{nowhere}/{TINY.ARCHIVE}")
    return archive.rename(root / TINY.ARCHIVE), lambda m: monkeypatch.setattr(TINY, "MD5", m)


def another_format(path: Path) -> bytes:
    if path.suffix == ".zip":
        return gzip.compress(b"a gzip file by the zip's name")
    with zipfile.ZipFile(buffer := io.BytesIO(), "w") as zf:
        zf.writestr("a.txt", f"a zip file by the name {path.name}")
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "mnist", "svhn", "tinyimagenet"])
@pytest.mark.parametrize("damage", ["truncated", "another format", "failing its checksum"])
def test_prepare_data_names_a_damaged_archive_and_leaves_nothing_half_written(tmp_path, monkeypatch, capsys, name,
                                                                            damage):
    root, out = tmp_path / "root", tmp_path / "stats.json"
    archive, expect_md5 = place_archive(name, root, tmp_path / "build", monkeypatch)
    good = archive.read_bytes()
    archive.write_bytes(another_format(archive) if damage == "another format" else good[: len(good) // 2])
    if damage != "failing its checksum":
        expect_md5(md5(archive))  # torchvision takes it for the real one and extracts (or reads) it
    before = sorted(root.rglob("*"))
    assert main(["prepare-data", "--dataset", name, "--root", str(root), "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert message.startswith("fedfactor: error:") and message.count("\n") == 1, message
    assert str(archive) in message and "delete it and run `fedfactor prepare-data" in message
    if damage == "failing its checksum":
        assert "failed its checksum" in message and "could not be downloaded" in message
    elif name == "svhn":  # downloaded as is: torchvision reads it where it lies
        assert f"cannot read {archive} as SVHN's MATLAB file" in message
    else:
        assert f"cannot extract {archive}" in message
    assert sorted(root.rglob("*")) == before and not out.exists()


@pytest.mark.parametrize("stop", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_an_extraction_cut_short_leaves_no_half_extracted_folder(tmp_path, monkeypatch, stop):
    # a disk that fills up or a Ctrl-C during the extraction: the half-extracted folder would otherwise
    # be blamed next time instead of the cause (or, for Tiny-ImageNet, pass for the dataset)
    root = tmp_path / "root"
    archive, expect_md5 = place_archive("cifar10", root, tmp_path / "build", monkeypatch)
    expect_md5(md5(archive))
    extract = tarfile.TarFile.extractall

    def cut_short(self, *args, **kwargs):
        extract(self, *args, **kwargs)
        raise stop

    monkeypatch.setattr(tarfile.TarFile, "extractall", cut_short)
    with pytest.raises(type(stop) if isinstance(stop, KeyboardInterrupt) else UsageError) as err:
        prepare_dataset("cifar10", root)
    assert list(root.iterdir()) == [archive]
    if isinstance(stop, OSError):
        assert "No space left on device" in assert_one_line(err)
