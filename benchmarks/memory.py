"""Memory against the number of clients K: peak RSS of a process that builds a simulator and runs one
round (VmHWM: see peak_rss_mb), and the bytes every client's persistent state holds.

Each (method, K) runs in a fresh process (`python -m benchmarks.memory --child SPEC`), so a peak is
that setting's own and not the largest seen so far. Every client holds 10 training samples of an
8x8 npz dataset (benchmarks/clients.py), so the data grow with K as the states do, but stay small.
State bytes count each tensor storage once: entries several clients still share (the initial model
before they train) are held once in memory. ratio = one client's state / the model's own bytes:
1 is one model per client; personalised methods keep more.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .common import client_sets, describe_sets, one_line, row, write_npz

DESCRIPTION = "peak RSS and per-client state bytes against K clients (one round, a fresh process each)"

METHODS = ["fedavg", "fedper", "feddecomp"]
ROOT = Path(__file__).resolve().parent.parent
PER_CLIENT = 10  # training samples per client


def method_entry(name: str) -> dict[str, Any]:
    """The default study's entry for a method (config/config.yaml), else the method's defaults."""
    import yaml

    entries = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["methods"]
    return dict(entries.get(name) or {"name": name})


def tensors(x: Any) -> Iterator[Any]:
    """Every tensor inside a state (a dict of tensors; a method may nest lists or dicts)."""
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensors(v)


def held_bytes(objs: list[Any], seen: set | None = None) -> int:
    """Bytes of the storages behind the tensors of `objs`, each storage counted once."""
    seen = set() if seen is None else seen
    total = 0
    for obj in objs:
        for t in tensors(obj):
            storage = t.untyped_storage()
            key = (t.device, storage.data_ptr())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB.

    Linux's ru_maxrss survives fork and exec: a child started by a parent that once held 2 GB reports
    at least 2 GB (every child reported the runner's own peak). /proc/self/status's VmHWM is the peak
    of this process's own address space, which exec starts afresh; ru_maxrss only where there is no /proc.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    scale = 2**20 if sys.platform == "darwin" else 2**10  # bytes on macOS, kilobytes on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the simulator, run one round, measure: runs in the fresh process."""
    import torch

    from fedfactor.config import load_config
    from fedfactor.run.simulator import Simulator

    torch.set_num_threads(spec["threads"])
    if spec.get("baseline"):  # the interpreter, torch and fedfactor alone: what every child pays
        return {"peak_rss_mb": peak_rss_mb()}
    sim = Simulator(load_config(None, spec["sets"]))
    sim.run_round(1)
    states = held_bytes(sim.states.as_list())
    out = {
        "peak_rss_mb": peak_rss_mb(),
        "states_bytes": states,
        "per_client_bytes": states / len(sim.states),
        "model_bytes": held_bytes([sim.model.state_dict()]),
        "server_bytes": held_bytes([sim.server]),
    }
    if sim.device.type == "cuda":
        out["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """`child(spec)` in a fresh interpreter; {"error": ...} when it fails."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child", json.dumps(spec)], cwd=ROOT,
                          capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool, device: str) -> list[dict]:
    import torch

    from fedfactor.study.workflow import method_sets

    sizes = (10, 50) if quick else (10, 100, 1000)
    threads = torch.get_num_threads()
    rows = []
    base = measure({"baseline": True, "threads": threads})
    rows.append(row("baseline: python + torch + fedfactor", base.get("peak_rss_mb", float("nan")), "MB", None, None,
                    "peak RSS of a child that only imports; every row below includes it"))
    with tempfile.TemporaryDirectory() as tmp:
        for k in sizes:
            npz = write_npz(Path(tmp) / f"k{k}.npz", n_train=k * PER_CLIENT, n_test=k)
            note = f"{k * PER_CLIENT} train + {k} test random 8x8 images (benchmarks/clients.py write_npz)"
            for name in METHODS:
                # E = 2: FedDecomp's default-study entry trains tau for e_lora = 1 epoch, sigma for the rest
                sets = client_sets(npz, k, PER_CLIENT, 1, device, epochs=2) + method_sets(method_entry(name), name)
                inputs = f"fresh process, one round, {threads} thread(s); " + describe_sets(sets, note)
                r = measure({"sets": sets, "threads": threads})
                case = f"{name} K={k}"
                if "error" in r:
                    rows.append(row(f"{case}: failed", float("nan"), "", None, None, f"{inputs}; {r['error']}"))
                    continue
                rows.append(row(f"{case}: peak RSS", r["peak_rss_mb"], "MB", None, None, inputs))
                rows.append(row(f"{case}: states, all clients", r["states_bytes"] / 2**20, "MB", None, None, inputs))
                # ratio = per-client state / model bytes: 1.0 is one model's worth per client
                rows.append(row(f"{case}: state per client (model {r['model_bytes'] / 2**10:.0f} KB, server "
                                f"{r['server_bytes'] / 2**10:.0f} KB)", r["per_client_bytes"] / 2**10, "KB",
                                r["per_client_bytes"] / r["model_bytes"], None, inputs))
                if "cuda_max_allocated_mb" in r:
                    rows.append(row(f"{case}: cuda max allocated", r["cuda_max_allocated_mb"], "MB", None, None,
                                    inputs))
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        try:
            result = child(json.loads(sys.argv[2]))
        except Exception as e:  # the parent reports it as the row's reason
            print(one_line(e), file=sys.stderr)
            sys.exit(1)
        print(json.dumps(result))
    else:
        print("usage: python -m benchmarks.memory --child SPEC (the runner starts it; run python -m benchmarks memory)",
              file=sys.stderr)
        sys.exit(2)
