"""A training job's fixed cost: CPU seconds from process start to the start of round 1.

Each measurement is a fresh process (`python -m benchmarks.startup --child ...`) that runs
`fedfactor train` as the workflow's train rule does: the default study's run config
(config/runs/digits.yaml), a partition file, the data root `prepare-data` filled, one thread, and,
for the MLflow rows, a SQLite store that `mlflow-init` created. The child imports nothing before
the job does, and wraps a few of the job's own functions to read its CPU clock (user + sys,
resource.getrusage) at the phase boundaries, the last at the first call of Simulator.run_round:

    imports   process start to fedfactor.run.job.train (Python, torch, fedfactor, argument and config parsing)
    data      the dataset load inside Simulator (digits from the data root, or scikit-learn)
    model     the rest of Simulator's set-up (partition, model, method, clients)
    mlflow    opening the MLflow run (import, client, experiment, run and its params)
    other     the rest until round 1 (folder lock, fingerprint, config.yaml)

The whole 1-round job's CPU is the child's own rusage (os.wait4): round 1, its scoring and the
job's end (summary.json, MLflow's final metrics and artifacts) come on top, then the interpreter's
exit (its teardown, read as the rest). torch imports torch._dynamo when a job builds its first
optimizer, inside round 1 (the `first optimizer` floor row measures it alone). The floor rows are
what no job can go below: the interpreter, `import torch`, and torch's first optimizer, read at the
code's end as the job's marks are (with the exit in their inputs).

The workflow runs `runs_per_job` runs in one `fedfactor train-runs` process: the `train-runs` rows
time such a job of as many one-round runs as the default study's `runs_per_job` (seeds 0, 1, ...;
with MLflow), the first run from the process start, every later run from the end of the run before
it (its summary, the progress line's place, the next config, Simulator, MLflow run) to its round 1.
Medians of the repeats; the machine's load raises every number.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Only the standard library at module level: the child is this module, and must start bare.

DESCRIPTION = ("a job's fixed CPU cost before round 1, a whole 1-round job, and each run's in a train-runs job, "
               "in fresh processes (digits)")

ROOT = Path(__file__).resolve().parent.parent
RUN_CONFIG = ROOT / "config" / "runs" / "digits.yaml"
PHASES = ("imports", "data", "model", "mlflow", "other")
GOAL_SECONDS = 3.0  # issue 26: at most 3 s of CPU before round 1
FLOORS = {
    "python": "pass",
    "python + import torch": "import torch",
    "python + torch's first optimizer": "import torch; torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)",
}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(marks_file: str, command: str, train_args: list[str]) -> int:
    """In the fresh process: run `fedfactor COMMAND train_args` (train, or train-runs: several runs in
    one process), writing the CPU clock's phase marks to marks_file as each run reaches round 1. Only
    functions the job calls anyway are wrapped."""
    import fedfactor.run.job as job  # exactly what `fedfactor train` imports before it trains
    from fedfactor import cli
    from fedfactor.run import clients, simulator

    marks: dict[str, Any] = {"runs": []}

    def spent(key: str, fn):
        def wrapper(*args, **kwargs):
            start = cpu_seconds()
            try:
                return fn(*args, **kwargs)
            finally:
                if len(marks["runs"]) == 1:  # the phases of the process's first run
                    marks[key] = marks.get(key, 0.0) + cpu_seconds() - start
        return wrapper

    train, run_round = job.train, simulator.Simulator.run_round

    def on_train(*args, **kwargs):
        marks["runs"].append({"train": cpu_seconds()})
        try:
            return train(*args, **kwargs)
        finally:
            marks["runs"][-1]["end"] = cpu_seconds()

    def on_round(self, rnd):
        if "round1" not in marks["runs"][-1]:
            marks["runs"][-1]["round1"] = cpu_seconds()
            marks["runs"][-1]["dynamo_before_round1"] = float("torch._dynamo" in sys.modules)
            Path(marks_file).write_text(json.dumps(marks))
        return run_round(self, rnd)

    job.train = on_train  # train-runs calls it through the module, once a run
    job.Tracker = spent("mlflow", job.Tracker)
    clients.load_dataset = spent("data", clients.load_dataset)
    simulator.Simulator.__init__ = spent("simulator", simulator.Simulator.__init__)
    simulator.Simulator.run_round = on_round
    status = cli.main([command, *train_args])
    marks["end"] = cpu_seconds()  # what follows is the interpreter's exit
    Path(marks_file).write_text(json.dumps(marks))
    return status


def spawn(args: list[str], env: dict[str, str], stdout: bool = False) -> tuple[float, str]:
    """(CPU seconds of the child alone, its stdout if asked); raises with the child's last line when it fails."""
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: only stdout is read while the child runs
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                                stderr=err, text=True)
        out = proc.stdout.read() if stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)  # reaps the child: Popen.wait would lose its rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            lines = err.read().strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit status {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, out


def job_cost(train_args: list[str], env: dict[str, str], tmp: Path) -> dict[str, float]:
    """One 1-round job in a fresh process: its phases, CPU to round 1 and CPU in all."""
    marks_file = tmp / "marks.json"
    marks_file.unlink(missing_ok=True)
    total, _ = spawn([sys.executable, "-m", "benchmarks.startup", "--child", str(marks_file), "train", *train_args],
                     env)
    m = json.loads(marks_file.read_text())
    (run,) = m["runs"]
    phases = {"imports": run["train"], "data": m.get("data", 0.0), "model": m["simulator"] - m.get("data", 0.0),
              "mlflow": m.get("mlflow", 0.0)}
    phases["other"] = run["round1"] - sum(phases.values())
    return {**phases, "to_round1": run["round1"], "round1_and_end": m["end"] - run["round1"], "exit": total - m["end"],
            "total": total, "dynamo_before_round1": run["dynamo_before_round1"]}


def batch_cost(train_args: list[str], runs: int, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    """One `fedfactor train-runs` job of `runs` 1-round runs in a fresh process: each run's CPU to its
    round 1, the first from the process start, every later one from the end of the run before it."""
    marks_file = tmp / "marks.json"
    marks_file.unlink(missing_ok=True)
    folders = [{"out": str(tmp / "batch" / f"run{i}"), "set": [f"seed={i}"]} for i in range(runs)]
    total, _ = spawn([sys.executable, "-m", "benchmarks.startup", "--child", str(marks_file), "train-runs",
                      *train_args, "--runs", json.dumps(folders)], env)
    shutil.rmtree(tmp / "batch")
    m = json.loads(marks_file.read_text())
    ends = [0.0] + [r["end"] for r in m["runs"]]
    return {"to_round1": [r["round1"] - ends[i] for i, r in enumerate(m["runs"])], "total": total}


def fedfactor_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedfactor", *args]


def run(quick: bool, device: str) -> list[dict]:
    from .common import row

    repeats = 2 if quick else 5
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the workflow's train rule runs a job
    rows = []
    for case, code in FLOORS.items():
        # the CPU clock read where the code ends, as the job's marks are: the exit comes on top
        clock = "; import resource; r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"
        runs = [spawn([sys.executable, "-c", code + clock], env, stdout=True) for _ in range(repeats)]
        seconds, whole = statistics.median(float(out) for _, out in runs), statistics.median(t for t, _ in runs)
        rows.append(row(f"floor: {case}", seconds, "s CPU", None, None,
                        f"python -c {code!r}; median of {repeats}; with the exit {whole:.2f} s"))
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        data, part, uri = tmp / "data", tmp / "partition.json", f"sqlite:///{tmp / 'mlflow.db'}"
        # the workflow's steps before a train job: prepare-data, partition, mlflow-init
        spawn(fedfactor_cmd("prepare-data", "--dataset", "digits", "--root", str(data)), env)
        sets = ["--set", f"data.root={data}", "--set", "seed=0"]
        spawn(fedfactor_cmd("partition", "--config", str(RUN_CONFIG), *sets, "--out", str(part)), env)
        spawn(fedfactor_cmd("mlflow-init", "--uri", uri, "--experiment", "startup", "--out", str(tmp / "exp")), env)
        exp_id = (tmp / "exp").read_text().strip()
        base = ["--config", str(RUN_CONFIG), *sets, "--set", f"partition.file={part}", "--set", "fl.rounds=1",
                "--set", f"fl.device={device}"]
        tracking = {"without MLflow": ["--set", "tracking.enabled=false"],
                    "with MLflow": ["--set", f"tracking.uri={uri}", "--set", f"tracking.experiment_id={exp_id}"]}
        for case, extra in tracking.items():
            runs = [job_cost([*base, *extra, "--out", str(tmp / "runs" / f"{case}{i}")], env, tmp)
                    for i in range(repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            shown = " ".join(["fedfactor train", *base, *extra]).replace(str(tmp), "<tmp>")
            inputs = f"OMP_NUM_THREADS=1 {shown}; median of {repeats}"
            rows.append(row(f"{case}: process start to round 1", med["to_round1"], "s CPU",
                            med["to_round1"] / GOAL_SECONDS, "<= 1", "ratio: of the 3 s goal; " + inputs))
            for phase in PHASES:
                if phase != "mlflow" or case == "with MLflow":
                    rows.append(row(f"{case}:   {phase}", med[phase], "s CPU", med[phase] / med["to_round1"], None,
                                    "ratio: of the time to round 1"))
            note = ("torch._dynamo imported before round 1" if med["dynamo_before_round1"]
                    else "round 1 includes torch._dynamo's import (first optimizer)")
            rows.append(row(f"{case}: whole 1-round job", med["total"], "s CPU", None, None, "with the exit"))
            rows.append(row(f"{case}:   round 1 and the job's end", med["round1_and_end"], "s CPU",
                            med["round1_and_end"] / med["total"], None, "ratio: of the whole job; " + note))
            rows.append(row(f"{case}:   exit (interpreter teardown)", med["exit"], "s CPU", med["exit"] / med["total"],
                            None, "ratio: of the whole job"))
        # The workflow's jobs: the default study's `runs_per_job` runs in one process, with MLflow
        import yaml

        per_job = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["runs_per_job"]
        jobs = [batch_cost([*base, *tracking["with MLflow"]], per_job, env, tmp) for _ in range(repeats)]
        first = statistics.median(j["to_round1"][0] for j in jobs)
        later = statistics.median(t for j in jobs for t in j["to_round1"][1:])
        inputs = (f"OMP_NUM_THREADS=1 fedfactor train-runs (the arguments above, with MLflow) --runs <{per_job} "
                  f"folders, seeds 0-{per_job - 1}>; median of {repeats} jobs")
        rows.append(row(f"train-runs, {per_job} runs a job: run 1, process start to round 1", first, "s CPU",
                        first / GOAL_SECONDS, "<= 1", "ratio: of the 3 s goal; " + inputs))
        rows.append(row(f"train-runs, {per_job} runs a job: runs 2-{per_job}, the previous run's end to round 1",
                        later, "s CPU", later / GOAL_SECONDS, "<= 1", f"ratio: of the 3 s goal; median of "
                        f"{(per_job - 1) * repeats} runs"))
        whole = statistics.median(j["total"] for j in jobs)
        amortised = (first + (per_job - 1) * later) / per_job
        rows.append(row(f"train-runs, {per_job} runs a job: fixed cost a run, amortised", amortised, "s CPU",
                        amortised / GOAL_SECONDS, "<= 1",
                        f"ratio: of the 3 s goal; the whole {per_job}-run job {whole:.2f} s CPU with the exit"))
        # MLflow afterwards instead of in every job: one process mirrors all the runs trained without it
        untracked = sorted(str(p) for p in (tmp / "runs").glob("without MLflow*"))
        seconds, _ = spawn(fedfactor_cmd("mlflow-import", *untracked, "--uri", uri, "--experiment", "startup"), env)
        rows.append(row(f"mlflow-import of the {len(untracked)} runs without MLflow, one process", seconds, "s CPU",
                        None, None, "fedfactor mlflow-import <runs> --uri sqlite:///<tmp>/mlflow.db"))
    return rows


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], sys.argv[3], sys.argv[4:]))
    print("usage: python -m benchmarks.startup --child MARKS_FILE train|train-runs ARGS... (the runner starts it; run "
          "python -m benchmarks startup)", file=sys.stderr)
    sys.exit(2)
