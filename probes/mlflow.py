"""MLflow under load: many real `fedfactor train` jobs started at once on one SQLite store while
busy loops keep the cores loaded, and SIGKILLs while a store is being created.

    python -m probes.mlflow [--jobs 16] [--load 2] [--kills 10] [--rounds 3]
                            [--cases fresh,existing,init] [--keep DIR]

Cases: (a) a fresh store, (b) the same store again (it exists now), (c) a fresh store made by
`fedfactor mlflow-init` first. A job counts as kept when the store holds exactly one run for its
folder, FINISHED, whose `bytes_up` history has every round. Then the kill probe times one
`fedfactor mlflow-init` on a fresh store (from its first store file appearing to its exit), kills K
more at delays spread over that window (counted from their own first store file; one that exits
before its kill shortens the window and is tried again), and runs one normal job on each store
left behind: it must log its run with every step.

Prints markdown tables; exits 1 when any job or step was lost. The store is read with sqlite3
directly: an MLflow client would try to migrate a half-made store itself.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPERIMENT = "probe"
JOB_SECONDS = 1800  # a case's jobs still running after this count as hung and are killed


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _fedfactor(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedfactor.cli", "-q", *args]


def _train(uri: str, out: Path, rounds: int, seed: int) -> list[str]:
    sets = ["data.name=digits", "model.name=mlp", "fl.clients=2", f"fl.rounds={rounds}", "fl.epochs=1",
            "fl.device=cpu", f"seed={seed}", "tracking.enabled=true", f"tracking.uri={uri}",
            f"tracking.experiment={EXPERIMENT}"]
    return _fedfactor("train", "--threads", "1", *(a for s in sets for a in ("--set", s)), "--out", str(out))


def _uri(db: Path) -> str:
    return f"sqlite:///{db}"


def _busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def _store_runs(db: Path) -> dict[str, list[tuple[str, list[int]]]]:
    """{run folder: [(status, sorted bytes_up steps)] per run} of the probe's experiment."""
    if not db.exists():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=30)
    try:
        rows = con.execute(
            "SELECT r.run_uuid, r.status, t.value FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
            "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'out' WHERE e.name = ?", (EXPERIMENT,)).fetchall()
        runs: dict[str, list[tuple[str, list[int]]]] = {}
        for run_id, status, out in rows:
            steps = sorted(s for (s,) in con.execute(
                "SELECT DISTINCT step FROM metrics WHERE run_uuid = ? AND key = 'bytes_up'", (run_id,)))
            runs.setdefault(out, []).append((status, steps))
        return runs
    except sqlite3.Error:  # no tables, a half-made schema
        return {}
    finally:
        con.close()


def _kept(db: Path, outs: list[Path], rounds: int) -> tuple[int, int, int]:
    """(runs FINISHED, runs with every step, folders with more than one run) over `outs`."""
    runs = _store_runs(db)
    found = [runs.get(str(o.resolve()), []) for o in outs]
    finished = sum(1 for f in found if len(f) == 1 and f[0][0] == "FINISHED")
    complete = sum(1 for f in found if len(f) == 1 and f[0][1] == list(range(1, rounds + 1)))
    return finished, complete, sum(1 for f in found if len(f) > 1)


def _run_jobs(db: Path, runs: Path, n: int, rounds: int) -> dict:
    """Start n jobs at once on the store `db`; wait for all; count what the store kept."""
    outs = [runs / f"job{i:02d}" for i in range(n)]
    logs = [open(runs.parent / f"{runs.name}-job{i:02d}.log", "w") for i in range(n)]
    start = time.monotonic()
    procs = [subprocess.Popen(_train(_uri(db), o, rounds, i), stdout=f, stderr=subprocess.STDOUT, env=_env())
             for i, (o, f) in enumerate(zip(outs, logs))]
    hung = 0
    for p in procs:
        try:
            p.wait(max(1.0, start + JOB_SECONDS - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            hung += 1
    wall = time.monotonic() - start
    for f in logs:
        f.close()
    text = [Path(f.name).read_text(errors="replace") for f in logs]
    finished, complete, duplicated = _kept(db, outs, rounds)
    return {"jobs": n, "exit 0": sum(p.returncode == 0 for p in procs), "hung": hung,
            "FINISHED": finished, "every step": complete, "duplicated": duplicated,
            "warned": sum("training goes on without it" in t for t in text),
            "tracebacks": sum("Traceback (most recent call last)" in t for t in text), "wall s": round(wall)}


def _store_files(folder: Path, db: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(db.name) and p.name != f"{db.name}.lock"]


def _creation_window(folder: Path) -> tuple[float, float]:
    """(seconds until the first store file appears, seconds until exit) of one mlflow-init."""
    folder.mkdir(parents=True)
    db = folder / "mlflow.db"
    start = time.monotonic()
    p = subprocess.Popen(_fedfactor("mlflow-init", "--uri", _uri(db), "--experiment", EXPERIMENT),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    first = None
    while p.poll() is None:
        if first is None and _store_files(folder, db):
            first = time.monotonic() - start
        time.sleep(0.005)
    end = time.monotonic() - start
    if p.returncode != 0:
        raise SystemExit(f"fedfactor mlflow-init on a fresh store failed (exit {p.returncode})")
    return (end if first is None else first), end


def _left_behind(folder: Path, db: Path) -> str:
    files = sorted(p.name for p in _store_files(folder, db))
    if not files:
        return "nothing"
    if db.name not in files:
        return "no store, " + ", ".join(files)
    try:
        con = sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=30)
        tables = con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        exps = con.execute("SELECT count(*) FROM experiments WHERE name = ?", (EXPERIMENT,)).fetchone()[0] \
            if tables else 0
        con.close()
    except sqlite3.Error as e:
        return f"a store ({e})"
    others = [f for f in files if f != db.name]
    return f"a store: {tables} tables, experiment {'yes' if exps else 'no'}" + \
        (f"; {', '.join(others)}" if others else "")


def _kill_probe(root: Path, kills: int, rounds: int) -> tuple[tuple[float, float], list[dict]]:
    """Kill k of K `mlflow-init` runs at (k + 1/2) / K of the creation window after its first store
    file appears (whatever the load does to the imports before), then run one job on the store.
    A run that exits before its kill shortens the window (the load changed) and is tried again."""
    first, end = _creation_window(root / "timing")
    span = end - first
    results = []
    for k in range(kills):
        for attempt in range(5):
            folder = root / f"kill{k:02d}-{attempt}"
            folder.mkdir(parents=True)
            db = folder / "mlflow.db"
            delay = span * (k + 0.5) / kills
            p = subprocess.Popen(_fedfactor("mlflow-init", "--uri", _uri(db), "--experiment", EXPERIMENT),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
            while p.poll() is None and not _store_files(folder, db):
                time.sleep(0.002)
            started = time.monotonic()
            while p.poll() is None and time.monotonic() - started < delay:
                time.sleep(0.002)
            killed = p.poll() is None
            if killed or attempt == 4:
                break
            span = min(span, time.monotonic() - started)
        p.send_signal(signal.SIGKILL)
        p.wait()
        left = _left_behind(folder, db)
        out = folder / "job"
        log = folder / "job.log"
        with open(log, "w") as f:
            rc = subprocess.run(_train(_uri(db), out, rounds, k), stdout=f, stderr=subprocess.STDOUT,
                                env=_env(), timeout=JOB_SECONDS).returncode
        finished, complete, duplicated = _kept(db, [out], rounds)
        text = log.read_text(errors="replace")
        results.append({"kill at s": f"{delay:.2f}", "killed": "yes" if killed else "no (had exited)",
                        "left behind": left, "next job exit": rc, "logged, every step":
                        "yes" if finished == complete == 1 and not duplicated else "NO",
                        "set aside": "yes" if any(".broken-" in p.name for p in folder.iterdir()) else "",
                        "warned": "yes" if "training goes on without it" in text else ""})
    return (first, end), results


def _table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m probes.mlflow", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=16, help="training jobs started at once per case (default 16)")
    ap.add_argument("--load", type=int, default=2, help="busy-loop processes keeping the cores loaded (default 2)")
    ap.add_argument("--kills", type=int, default=10, help="kills during store creation (default 10; 0: none)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per job (default 3)")
    ap.add_argument("--cases", default="fresh,existing,init",
                    help="which of fresh,existing,init to run ('': only the kills)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (must not exist) and keep it")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.load < 0 or args.kills < 0 or args.rounds < 1:
        ap.error("--jobs and --rounds must be at least 1, --load and --kills at least 0")
    cases = [c for c in args.cases.split(",") if c]
    if not set(cases) <= {"fresh", "existing", "init"}:
        ap.error("--cases takes fresh, existing and init, separated by commas ('': only the kills)")
    if args.keep:
        root = Path(args.keep).resolve()
        root.mkdir(parents=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="probe-mlflow-"))
    load = _busy_loops(args.load)
    rows, lost = [], False
    try:
        print(f"{args.jobs} jobs of {args.rounds} rounds at once, {args.load} busy loops on "
              f"{os.cpu_count()} cores; work in {root}", file=sys.stderr)
        if "fresh" in cases or "existing" in cases:
            db = root / "shared" / "mlflow.db"
            db.parent.mkdir()
            rows.append({"case": "(a) fresh store", **_run_jobs(db, root / "shared" / "a", args.jobs, args.rounds)})
            print(_table(rows[-1:]), file=sys.stderr)
            if "existing" in cases:
                rows.append({"case": "(b) existing store",
                             **_run_jobs(db, root / "shared" / "b", args.jobs, args.rounds)})
                print(_table(rows[-1:]), file=sys.stderr)
        if "init" in cases:
            db = root / "init" / "mlflow.db"
            db.parent.mkdir()
            rc = subprocess.run(_fedfactor("mlflow-init", "--uri", _uri(db), "--experiment", EXPERIMENT),
                                env=_env(), capture_output=True).returncode
            rows.append({"case": f"(c) after mlflow-init (exit {rc})",
                         **_run_jobs(db, root / "init" / "c", args.jobs, args.rounds)})
            print(_table(rows[-1:]), file=sys.stderr)
        kill_rows = []
        if args.kills:
            (first, end), kill_rows = _kill_probe(root / "kills", args.kills, args.rounds)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    finally:
        _stop(load)
    if rows:
        print(_table(rows))
        print(f"\npeak memory of one job: {peak:.0f} MiB")
        lost |= any(r["every step"] != r["jobs"] or r["FINISHED"] != r["jobs"] or r["duplicated"] or r["hung"]
                    or r["tracebacks"] for r in rows)
    if kill_rows:
        ok = sum(r["logged, every step"] == "yes" for r in kill_rows)
        print(f"\nKill during store creation: `fedfactor mlflow-init` on a fresh store, first store file at "
              f"{first:.2f} s, exit at {end:.2f} s; each kill at the time shown after its first store file; "
              f"{ok} of {len(kill_rows)} kills ended in a working store\n")
        print(_table(kill_rows))
        lost |= ok != len(kill_rows)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
