"""The one benchmark runner.

    python -m benchmarks [NAME ...] [--quick] [--device cpu|cuda|auto] [--threads N] [--out FILE]

runs the named benchmarks (default: all, in the order of ORDER). Each is a module benchmarks/<name>.py
with `DESCRIPTION: str` and `run(quick: bool, device: str) -> list[dict]`, a row being

    {"case": str, "value": float, "unit": str, "ratio": float | None, "target": str | None, "inputs": str}

The runner prints a header per benchmark and one aligned line per row (with the inputs the row was
measured under, so a reader can rerun it), then writes every row with the machine it ran on as JSON
to --out (default benchmarks/out/<UTC timestamp>.json, git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import math
import operator
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# The fixed order of a run of all benchmarks. `overhead` and `batched` are written separately; a module
# that does not exist yet is skipped with a note.
ORDER = ["overhead", "batched", "methods", "clients", "memory", "startup", "plan", "gpu"]
HERE = Path(__file__).resolve().parent
_COMPARE = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def load(name: str) -> ModuleType | None:
    """benchmarks.<name>, or None when that module does not exist (an import error inside it is raised)."""
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"benchmarks.{name}":
            return None
        raise


def met(ratio: float | None, target: str | None) -> str:
    """'ok' / 'MISSED' for a row with a target such as '<= 1.15', '' without one or without a ratio."""
    if not target or ratio is None or math.isnan(ratio):
        return ""
    op, bound = target.split()
    return "ok" if _COMPARE[op](ratio, float(bound)) else "MISSED"


def _number(x: float | None, fmt: str = ".4g") -> str:
    return "" if x is None else format(x, fmt)


def print_rows(rows: list[dict]) -> None:
    """One aligned line per row; a row's inputs on the line below, when they differ from the row above."""
    width = max((len(r["case"]) for r in rows), default=0)
    value_width = max((len(f"{_number(r['value'])} {r['unit']}") for r in rows), default=0)
    last_inputs = None
    for r in rows:
        value = f"{_number(r['value'])} {r['unit']}"
        ratio = "" if r["ratio"] is None else f"ratio {_number(r['ratio'], '.3f')}"
        target = f"target {r['target']}" if r["target"] else ""
        status = met(r["ratio"], r["target"])
        print(f"  {r['case']:<{width}}  {value:>{value_width}}  {ratio:<13} {target:<17} {status}".rstrip())
        if r["inputs"] != last_inputs:
            print(f"      inputs: {r['inputs']}")
            last_inputs = r["inputs"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """The commit measured, with '+dirty' when the working tree has changes (the numbers may be of those)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def machine_info(threads: int, argv: list[str]) -> dict[str, Any]:
    import torch

    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "threads": threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "git": git_commit(),
        "command": shlex.join(["python", "-m", "benchmarks", *argv]),
    }


def _plain(x: Any) -> Any:
    """NaN and infinities as null: strict JSON has no spelling for them."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run (default: all of {', '.join(ORDER)})")
    parser.add_argument("--quick", action="store_true", help="small settings: seconds to a minute or two each")
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N] or auto (default cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--out", help="JSON file for the rows (default benchmarks/out/<UTC timestamp>.json)")
    args = parser.parse_args(argv)

    unknown = [n for n in args.names if n not in ORDER]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}; choose from: {', '.join(ORDER)}", file=sys.stderr)
        return 2
    names = [n for n in ORDER if n in args.names] if args.names else list(ORDER)

    import torch

    from fedfactor.devices import resolve_device
    from fedfactor.errors import UsageError
    from fedfactor.io import atomic_write_json

    try:
        device = str(resolve_device(args.device))
    except UsageError as e:
        print(f"--device: {e}", file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"--threads must be >= 1 (got {args.threads})", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)  # once, for every benchmark: ratios compare like with like

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else HERE / "out" / f"{stamp}.json"
    report: dict[str, Any] = {"machine": machine_info(args.threads, argv), "quick": args.quick, "device": device,
                              "benchmarks": [], "skipped": {}, "failed": {}}
    for name in names:
        module = load(name)
        if module is None:
            print(f"== {name}: skipped, benchmarks/{name}.py does not exist yet\n")
            report["skipped"][name] = "module does not exist yet"
            continue
        print(f"== {name}: {module.DESCRIPTION}", flush=True)
        try:
            rows = module.run(args.quick, device)
        except Exception as e:  # one broken benchmark must not lose the others' numbers
            message = " ".join(f"{type(e).__name__}: {e}".split())
            print(f"  FAILED: {message}\n")
            report["failed"][name] = message
            continue
        print_rows(rows)
        print(flush=True)
        report["benchmarks"].append({"name": name, "description": module.DESCRIPTION, "rows": rows})
    atomic_write_json(out, _plain(report))
    print(f"wrote {out}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
