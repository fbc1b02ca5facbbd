"""GPU slots for workflow jobs: two jobs never get the same GPU; a scheduler's choice is kept."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fedfactor import devices
from fedfactor.errors import UsageError


@pytest.fixture
def two_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(devices, "count_gpus", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield tmp_path / "locks"
    devices.release_gpus()


def test_two_claims_get_different_gpus_and_a_third_waits_for_one_to_free(two_gpus, monkeypatch):
    assert devices.claim_gpus(1, two_gpus) == [0]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    # a second job (its own lock file handles) finds GPU 0 taken
    held, devices._HELD[:] = list(devices._HELD), []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices.claim_gpus(1, two_gpus) == [1]
    first, devices._HELD[:] = held, list(devices._HELD)
    # a third waits until one is let go
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    got = []
    waiter = threading.Thread(target=lambda: got.append(devices.claim_gpus(1, two_gpus, poll_seconds=0.05)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and got == []
    first.pop().close()  # the job holding GPU 0 ends
    waiter.join(5)
    assert got == [[0]]


@pytest.mark.slow
def test_a_killed_job_leaves_no_gpu_claimed(two_gpus):
    code = ("import sys; from fedfactor import devices; devices.count_gpus = lambda: 2; "
            f"print(devices.claim_gpus(2, {str(two_gpus)!r})); sys.stdout.flush(); import os; os._exit(9)")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 9 and r.stdout.strip() == "[0, 1]", r.stderr
    assert devices.claim_gpus(2, two_gpus, poll_seconds=0.05) == [0, 1]


def test_a_scheduler_choice_is_kept(two_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert devices.claim_gpus(1, two_gpus) is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3" and not two_gpus.exists()


def test_no_gpus_or_none_asked_for_changes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "count_gpus", lambda: 0)
    assert devices.claim_gpus(1, tmp_path) is None
    assert devices.claim_gpus(0, tmp_path) is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_more_gpus_than_the_machine_has_is_an_error(two_gpus):
    with pytest.raises(UsageError, match="3 GPUs asked for per job, but this machine has 2"):
        devices.claim_gpus(3, two_gpus)


@pytest.mark.parametrize("name, pattern", [
    ("mps", "no Apple MPS device is available"), ("meta", "is not supported"), ("xyz", "is not a torch device"),
])
def test_a_device_this_machine_lacks_or_we_do_not_support_is_refused(name, pattern, monkeypatch):
    monkeypatch.setattr(devices.torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(UsageError, match=pattern):
        devices.resolve_device(name)


def test_a_cuda_index_past_the_machines_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 2)
    assert devices.resolve_device("cuda:1").index == 1
    with pytest.raises(UsageError, match=r"has 2 CUDA device\(s\), cuda:0..cuda:1"):
        devices.resolve_device("cuda:2")


def test_the_memory_a_process_may_take_respects_an_address_space_limit(monkeypatch):
    import resource

    from fedfactor import devices

    limit = 64 * 2**40
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    mapped = int(Path("/proc/self/statm").read_text().split()[0]) * devices.os.sysconf("SC_PAGE_SIZE")
    assert devices.available_memory() <= limit - mapped + 2**30  # the process may grow meanwhile


@pytest.mark.parametrize("cgroup, files, left", [
    ("0::/job_7\n", {"job_7/memory.max": "1000\n", "job_7/memory.current": "300\n"}, 700),  # v2, SLURM's limit
    ("0::/job_7\n", {"job_7/memory.max": "max\n", "job_7/memory.current": "300\n"}, None),  # v2 without a limit
    ("4:memory:/slurm/job_7\n0::/\n", {"memory/slurm/job_7/memory.limit_in_bytes": "2000\n",
                                       "memory/slurm/job_7/memory.usage_in_bytes": "500\n"}, 1500),  # v1
    ("4:memory:/x\n", {"memory/x/memory.limit_in_bytes": str(2**63 - 4096),
                       "memory/x/memory.usage_in_bytes": "5"}, None),  # v1's "no limit"
    ("4:memory:/gone\n", {}, None),  # a hierarchy this namespace cannot see
    ("0::/job\n", {"job/memory.max": "100", "job/memory.current": "400"}, 0),  # over its limit: nothing left
])
def test_a_control_groups_memory_limit_is_what_a_job_may_still_use(tmp_path, cgroup, files, left):
    """Catches: a SLURM job's mem_mb ignored (the node's MemAvailable taken instead: `auto` would keep
    client states in host memory the job may not use), v1 or v2 misread, or "no limit" read as one."""
    proc = tmp_path / "cgroup"
    proc.write_text(cgroup)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    assert devices.cgroup_memory_left(proc, tmp_path / "fs") == left


def test_available_memory_is_held_to_the_control_groups_limit(monkeypatch):
    """Catches: available_memory reading MemAvailable alone inside a job's control group."""
    monkeypatch.setattr(devices, "cgroup_memory_left", lambda: 12345)
    assert devices.available_memory() == 12345
