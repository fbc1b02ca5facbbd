"""The terminal of a real workflow run: one line per finished training run, one seed of every cell
first, a live table, and after Ctrl-C the runs done and checkpointed and the command that resumes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a workflow run in a terminal

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] perm/(\w+)/seed(\d): accuracy \d+\.\d\d% in .+ \| (\d)/4 runs done, (\d) left")


def _study(tmp_path):
    # 6 short rounds, 3 s or more of training: long enough to stop a run in its middle; a checkpoint
    # every round, so a run stopped while scoring (which writes none) still has the last one
    run = tmp_path / "run.yaml"
    run.write_text("data: {name: digits}\nmodel: {name: mlp}\n"
                   "fl: {clients: 4, rounds: 6, epochs: 1, batch_size: 32}\ncheckpoint: {every: 1}\n")
    study = tmp_path / "study.yaml"
    study.write_text(json.dumps({
        "study": "tiny", "run_config": str(run), "results": str(tmp_path / "results"), "seeds": [0, 1],
        "data_root": str(tmp_path / "data"),
        "scenarios": {"perm": {"partition": {"kind": "iid", "permute_labels": True}}},
        "methods": {"local": {"name": "local"}, "fedavg": {"name": "fedavg"}},
    }))
    return study


def _interrupt_mid_run(cmd, cwd, runs):
    """Start `cmd` as a terminal would (its own process group) and press Ctrl-C once one run has
    finished and another has checkpointed a round and goes on: stopped while training it writes
    another checkpoint, stopped while scoring it keeps that one, checkpointed either way."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 500
    while time.monotonic() < deadline and proc.poll() is None:
        done = list(runs.glob("*/*/summary.json"))
        training = [c for c in runs.glob("*/*/checkpoint.pt") if not (c.parent / "summary.json").exists()]
        if len(done) == 1 and training:
            os.killpg(proc.pid, signal.SIGINT)
            break
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def test_one_line_per_run_seed_zero_first_and_ctrl_c_says_what_resumes(tmp_path):
    study = _study(tmp_path)
    cmd = [*SNAKEMAKE, "--cores", "1", "--configfile", str(study)]
    runs = tmp_path / "results" / "tiny" / "runs" / "perm"
    status, out = _interrupt_mid_run(cmd, tmp_path, runs)
    print(out)
    assert status != 0, out
    lines = out.strip().splitlines()
    # no Snakemake job blocks, and no errors of the interrupted job: each finished run is one line
    assert "rule train" not in out and "Error in rule" not in out and "Execute" not in out, out
    finished = [m for m in map(LINE.match, lines) if m]
    assert len(finished) == 1 and finished[0].group(2) == "0", out  # a seed-0 run came first
    # the very last lines: what is done, what is checkpointed, and the command that resumes
    assert lines[-3] == ("fedfactor: stopped with 1 of 4 runs done, 1 checkpointed (they continue where they "
                         "stopped), 2 still to run."), out
    assert lines[-2].startswith("Run the same command to resume: snakemake --snakefile ")
    assert lines[-2].endswith(f"--cores 1 --configfile {study}")
    live = (tmp_path / "results" / "tiny" / "live.md").read_text()
    assert "1 of 4 runs finished; missing: 3 runs" in live
    stopped = next(c.parent for c in runs.glob("*/*/checkpoint.pt"))
    assert stopped.name == "seed0"  # the other seed-0 run: one seed of every cell first

    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    print(again.stdout + again.stderr)
    assert again.returncode == 0, again.stdout + again.stderr
    finished = [m.groups() for m in map(LINE.match, again.stdout.splitlines()) if m]
    assert [(seed, done) for _, seed, done, _ in finished] == [("0", "2"), ("1", "3"), ("1", "4")], again.stdout
    # after the last run, each later step says it started: the terminal is never silent for long
    for step in ("factor analysis of every run's client weights", "figures...", "the results table..."):
        assert f"fedfactor: {step}" in again.stderr, again.stderr  # where Snakemake's own lines go
    block = again.stdout[again.stdout.index("fedfactor: 4 of 4 training runs done"):].splitlines()
    # the closing block: what to open next, the report's command and the MLflow UI, a line each
    assert [line.split(":")[0].strip() for line in block[1:6]] == ["table", "figures", "diagnostics", "report",
                                                                     "MLflow"], block
    assert "4 of 4 runs finished; complete" in (tmp_path / "results" / "tiny" / "live.md").read_text()
    assert (tmp_path / "results" / "tiny" / "live_rounds.png").read_bytes()[:4] == b"\x89PNG"  # and its curves
    # the run's log keeps the interrupted attempt's lines before the resumed one's
    log = (tmp_path / "results" / "tiny" / "logs" / "train" / "perm" / stopped.parent.name / "seed0.log").read_text()
    assert log.index("checkpoint written: run the same command again") < log.index("resuming")
