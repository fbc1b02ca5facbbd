"""Which torch device a run uses, and which GPU a workflow job gets on a shared workstation."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import resource
import shutil
import subprocess
import time
from pathlib import Path

import torch

from .errors import UsageError

log = logging.getLogger("fedfactor")
# Open lock files of the GPUs this process holds: the locks last as long as the process (the kernel
# drops them when it exits, however it exits), so a killed job never leaves a GPU claimed.
_HELD: list = []


def resolve_device(name: str | torch.device = "auto", available: bool = True) -> torch.device:
    """"auto" is the GPU when there is one; anything else must name a supported device, available
    here unless `available` is false (`fedfactor cost` needs no device, only a valid name)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UsageError(f"device {name!r} is not a torch device; use auto, cpu, cuda[:N] or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):  # meta, xpu, ...: nothing here is written or tested for them
        raise UsageError(f"device {name!r} is not supported; use auto, cpu, cuda[:N] or mps")
    if not available:
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r} asked for, but no CUDA device is available; use auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"device {name!r} asked for, but this machine has {torch.cuda.device_count()} CUDA "
                             f"device(s), cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise UsageError(f"device {name!r} asked for, but no Apple MPS device is available; use auto or cpu")
    return device


def count_gpus() -> int:
    """GPUs nvidia-smi lists. Asking torch would initialise CUDA, after which CUDA_VISIBLE_DEVICES
    is no longer read."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def claim_gpus(n: int, lock_dir: str | Path, poll_seconds: float = 5.0) -> list[int] | None:
    """Give this process `n` GPUs no other job holds: CUDA_VISIBLE_DEVICES is set to them.

    Snakemake's `--resources gpu=K` only counts GPUs and assigns no devices, so two jobs would both
    take GPU 0. Each GPU has a lock file in `lock_dir` (on the machine's own disk); a job takes free
    ones, or waits for them. A device list a scheduler already set (SLURM does) is left alone, as is
    a machine without GPUs (the run then goes to the CPU). Must run before CUDA is initialised.
    """
    if n <= 0:
        return None
    preset = os.environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        log.info("GPUs set by the scheduler (CUDA_VISIBLE_DEVICES=%s); not claiming any", preset)
        return None
    total = count_gpus()
    if total == 0:
        log.warning("%d GPU(s) asked for, but nvidia-smi lists none: running where the config's device says", n)
        return None
    if n > total:
        raise UsageError(f"{n} GPUs asked for per job, but this machine has {total}")
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        held = []
        for i in range(total):
            f = open(lock_dir / f"gpu{i}.lock", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            held.append((i, f))
            if len(held) == n:
                _HELD.extend(f for _, f in held)
                ids = [i for i, _ in held]
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
                log.info("claimed GPU(s) %s (locks in %s)", ids, lock_dir)
                return ids
        for _, f in held:  # not enough free: let go, so two waiting jobs cannot deadlock
            f.close()
        if not waited:
            log.info("all %d GPUs are claimed by other jobs; waiting for %d to free up", total, n)
            waited = True
        time.sleep(poll_seconds)


def release_gpus() -> None:
    """Let go of the GPUs `claim_gpus` took (the process exiting does the same)."""
    while _HELD:
        _HELD.pop().close()


def cgroup_memory_left(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What this process's control group (cgroup v2: memory.max, or v1: memory.limit_in_bytes) may
    still use, or None without a limit: a SLURM job is held to its mem_mb this way while the node's
    MemAvailable counts the whole machine."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            folder, limit_file, usage_file = root / path.lstrip("/"), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            folder, limit_file, usage_file = root / "memory" / path.lstrip("/"), "memory.limit_in_bytes", \
                "memory.usage_in_bytes"
        else:
            continue
        try:
            limit, usage = ((folder / name).read_text().strip() for name in (limit_file, usage_file))
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max", or v1's huge number: no limit
            return max(int(limit) - int(usage), 0)
    return None


def memory_bytes(device: torch.device) -> int | None:
    """The memory of `device` (a GPU's own, else the machine's), or None where it cannot be read."""
    try:
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, RuntimeError, AssertionError):
        return None


def available_memory() -> int | None:
    """Bytes this process may still allocate: the memory the kernel counts as available, under a
    control group's limit (SLURM's mem_mb) what is left below it, and under an address-space limit
    (`ulimit -v`) what is left below that; None where none can be read."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        found = re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    except OSError:  # not Linux
        found = None
    free = int(found[1]) * 1024 if found else None  # None too for a kernel without MemAvailable
    left = cgroup_memory_left()
    if left is not None:
        free = left if free is None else min(free, left)
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        try:
            mapped = int(Path("/proc/self/statm").read_text().split()[0]) * page
        except OSError:
            mapped = 0
        free = limit - mapped if free is None else min(free, limit - mapped)
    return free
