"""Atomic writes and the exclusive lock: what a killed writer leaves behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from fedfactor.errors import UsageError
from fedfactor.io import (FILE_MODE, atomic_open, atomic_write_text, check_output, exclusive_lock,
                          remove_stale_temporaries)

HOLD = "import sys, time; from pathlib import Path; from fedfactor.io import exclusive_lock\n" \
       "with exclusive_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_open(path) as f:
            f.write(b"half")
            raise RuntimeError
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]
    assert path.stat().st_mode & 0o777 == FILE_MODE  # not the 0600 of a temporary file


def test_stale_temporaries_are_removed(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".metrics.csv.abc.tmp").write_text("half")
    (tmp_path / "keep.tmp").write_text("not ours: no leading dot")
    assert remove_stale_temporaries(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["keep.tmp"]


def test_the_lock_waits_for_its_holder_and_is_freed_when_the_holder_is_killed(tmp_path):
    lock = tmp_path / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="stays locked"):
            with exclusive_lock(lock, timeout=0.3):
                pass
        assert time.monotonic() - start >= 0.3
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with exclusive_lock(lock, timeout=5):  # the kernel released it with the process
            pass
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("path, kind, pattern", [
    ("", "folder", "--out is empty; name a folder"),
    ("  ", "file", "--out is empty; name a file"),
    ("/proc/fedfactor-run", "folder", "nothing can be created in /proc"),
    ("/sys/fedfactor/p.json", "file", "nothing can be created in /sys"),
    ("/tmp/" + "a" * 300, "folder", "is 300 bytes long; this file system allows 255"),
])
def test_an_output_that_cannot_be_created_is_refused(path, kind, pattern):
    with pytest.raises(UsageError, match=pattern):
        check_output(path, kind)


def test_an_output_of_the_wrong_kind_is_refused_and_nothing_is_left(tmp_path):
    (tmp_path / "file").write_text("")
    for path, kind, pattern in ((tmp_path, "file", "is a folder; name a file"),
                                (tmp_path / "file", "folder", "is a file, not a folder"),
                                (tmp_path / "file" / "p.json", "file", "lies under")):
        with pytest.raises(UsageError, match=pattern):
            check_output(path, kind)
    check_output(tmp_path / "new" / "p.json", "file")
    check_output(tmp_path, "folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # the trial folder is gone


def test_a_full_disk_names_the_file_and_leaves_the_old_one_and_no_temporary(tmp_path):
    import errno

    from fedfactor.io import full_disk_message

    path = tmp_path / "out.txt"
    atomic_write_text(path, "old")
    with pytest.raises(OSError) as full:
        with atomic_open(path) as f:
            f.write(b"half")
            try:  # as torch.save reports it: a RuntimeError raised while handling the write's OSError
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError:
                raise RuntimeError("unexpected pos 64 vs 0")
    assert full.value.errno == errno.ENOSPC and full.value.filename == str(path)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]
    assert full_disk_message(full.value).startswith(f"no space left to write {path} (")
    assert f"free on the file system of {tmp_path})" in full_disk_message(full.value)


def test_a_full_disk_that_names_no_file_names_what_was_being_written_and_its_free_space(tmp_path):
    import errno

    from fedfactor.io import full_disk_message

    unnamed = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a library's write: no filename
    message = full_disk_message(unnamed, tmp_path / "run" / "not yet made")
    assert message.startswith(f"no space left to write into {tmp_path / 'run' / 'not yet made'} (")
    assert f"free on the file system of {tmp_path});" in message and "None" not in message
    assert "write its output (" in full_disk_message(unnamed)
