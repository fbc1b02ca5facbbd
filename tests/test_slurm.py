"""SLURM end to end: a one-node cluster on this machine (workflow/scripts/slurm_local.sh), a tiny
study run through profiles/slurm, and what each training job asked sbatch for, checked against the
profile with `scontrol show job`.

Without SLURM (not root, not installed) the end-to-end test is skipped with the command that sets
it up; in CI (CI set) it fails instead, and the fixture installs the packages itself.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # a real single-node SLURM cluster

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "workflow" / "scripts" / "slurm_local.sh"
PROFILE = REPO / "profiles" / "slurm"
SETUP = "workflow/scripts/slurm_local.sh start --install"
PARTITION = "local"  # the local cluster's partition; the profile's is a placeholder
TRAIN_RUNS = 2  # the tiny study's training jobs, all submitted at once


def _profile() -> dict:
    return yaml.safe_load((PROFILE / "config.yaml").read_text())


def _script(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def _minutes(limit: str) -> int:
    """scontrol's TimeLimit ([D-]HH:MM:SS) in minutes."""
    days, _, hms = limit.rpartition("-")
    h, m, s = map(int, hms.split(":"))
    return int(days or 0) * 1440 + h * 60 + m + (s > 0)


def _mb(size: str) -> int:
    """scontrol's memory (16000M, 16G) in MB."""
    return int(float(size[:-1]) * {"M": 1, "G": 1024, "T": 1024**2}[size[-1]])


def _job(job_id: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    return dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)


# ------------------------------------------------------------------ no cluster needed

def test_profile_is_a_slurm_workflow_profile():
    p = _profile()
    assert p["executor"] == "slurm"
    # --workflow-profile replaces profiles/default, so what it holds must be repeated here
    default = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert {k: p.get(k) for k in default} == default
    train = p["set-resources"]["train"]
    assert train["gpu"] == 1 and "gres" not in train and "gpu_model" not in train  # GPUs asked once
    assert train["cpus_per_task"] == p["set-threads"]["train"]
    # tuning runs (`snakemake tune`) are training runs: the same resources and threads
    assert p["set-resources"]["tune_train"] == train and p["set-threads"]["tune_train"] == p["set-threads"]["train"]
    for key in ("slurm_partition", "runtime", "mem_mb"):
        assert key in p["default-resources"]
    # a run stopped at its time limit has checkpointed: Snakemake submits it again, and it resumes
    assert p["retries"] >= 1


def test_the_profile_stops_a_run_in_time_to_write_the_largest_planned_checkpoint():
    """The lead of the train rule's stop signal covers the write of the largest checkpoint any paper
    study plans (Stand-Alone's 100 VGG-16 models, 50.17 GiB, docs/plan.md) at the plan's write rate."""
    from fedfactor.study import plan

    node = plan.profile_node(PROFILE, 1)
    assert node.lead == 900 and node.runtime == 360 and node.attempts == 4
    largest = 50.17 * 2**30
    assert largest / plan.WRITE_BYTES_PER_SECOND <= node.lead + plan.KILL_WAIT_SECONDS


def test_script_checks_its_arguments():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert "start" in _script("--help").stdout
    for args in ([], ["start", "stop"], ["start", "--gpus", "x"], ["start", "--bogus"], ["start", "--cpus"]):
        r = _script(*args)
        assert r.returncode == 1 and r.stderr.startswith("slurm_local.sh: error: "), (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_status_of_a_cluster_that_was_never_started(tmp_path):
    r = _script("status", "--dir", str(tmp_path / "none"))
    assert r.returncode == 3 and "not running" in r.stdout


# ------------------------------------------------------------------ the real thing

def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"SLURM is required in CI but could not be started: {reason}", pytrace=False)
    pytest.skip(f"no local SLURM ({reason}); to run this test, as root: {SETUP}")


@pytest.fixture(scope="module")
def slurm():
    """A running one-node cluster big enough for the profile's training jobs, TRAIN_RUNS at once.

    Started here and stopped at the end, unless it was already running (then left running)."""
    if os.geteuid() != 0:
        _unavailable("the script must run as root")
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        _unavailable("pip install snakemake-executor-plugin-slurm")
    installed = shutil.which("sbatch") and Path("/usr/sbin/slurmctld").exists()
    if not installed and not (os.environ.get("CI") and shutil.which("apt-get")):
        _unavailable("SLURM is not installed")
    p = _profile()
    train = {**p["default-resources"], **p["set-resources"]["train"]}
    cpus = max(os.cpu_count() or 1, TRAIN_RUNS * train["cpus_per_task"] + 1)
    mem_mb = TRAIN_RUNS * train["mem_mb"] + p["default-resources"]["mem_mb"]
    was_running = _script("status").returncode == 0
    args = ["start", "--partition", PARTITION, "--cpus", str(cpus), "--mem-mb", str(mem_mb),
            "--gpus", str(TRAIN_RUNS * train["gpu"])]
    r = _script(*args, *(["--install"] if os.environ.get("CI") else []))
    if r.returncode != 0:
        _unavailable((r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1])
    node = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True).stdout
    yield {"gpus": bool(re.search(r"\bGres=gpu:[1-9]", node))}
    if not was_running:
        _script("stop")


def _snakemake(study: Path, tmp_path: Path, *options: str) -> list[str]:
    """Snakemake with the profile on the local cluster: its partition (--default-resources replaces
    the whole list), squeue instead of sacct (no slurmdbd here) and quick polling for a toy study."""
    p = _profile()
    defaults = {**p["default-resources"], "slurm_partition": PARTITION}
    return [sys.executable, "-m", "snakemake", "--workflow-profile", str(PROFILE.relative_to(REPO)),
            # --local-cores, not --cores: --cores also caps the threads of every SLURM job (4 -> 2 here)
            "--configfile", str(study), "--local-cores", "2",
            "--default-resources", *(f"{k}={v}" for k, v in defaults.items()),
            "--slurm-status-command", "squeue",
            "--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2",
            "--slurm-logdir", str(tmp_path / "slurm_logs"), *options]


def _tiny_study(tmp_path: Path, name: str, rounds: int, methods: list[str]) -> Path:
    """A study of an MLP on digits, 2 clients, one seed, one scenario: `rounds` rounds of each method."""
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "study": name, "run_config": "config/runs/digits.yaml",
        "results": str(tmp_path / "results"), "data_root": str(tmp_path / "data"), "seeds": [0],
        "scenarios": {"iid": {"partition": {"kind": "iid"}, "model": {"name": "mlp"},
                              "fl": {"rounds": rounds, "clients": 2, "epochs": 1}}},
        "methods": {m: {"name": m} for m in methods},
    }))
    return study


def _env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_a_run_signalled_before_its_time_limit_checkpoints_and_its_retry_resumes(slurm, tmp_path):
    """The profile's way to stop a run (a SIGTERM `--signal=TERM@lead` seconds before the limit, through
    the executor plugin's batch script and job step) reaches the training process: it checkpoints and
    exits well before SLURM's kill, and Snakemake's retry resumes from the checkpoint. Catches: the
    signal sent to the batch shell alone (`B:`), or lost on the way, leaving the run to SLURM's kill."""
    # a run of about half an hour (the dry run checks it fits 40 attempts of 4 minutes), stopped in the
    # first minute and a half: SLURM sends the signal up to a minute early, and only to a job step that
    # exists (Snakemake's starts some seconds into the job)
    study = _tiny_study(tmp_path, "slurm_stop", 20000, ["fedavg"])
    train = {"gpu": 0, "runtime": 4, "mem_mb": 4000, "cpus_per_task": 1, "slurm_extra": "'--signal=TERM@150'"}
    cmd = _snakemake(study, tmp_path, "--set-resources", *(f"train:{k}={v}" for k, v in train.items()),
                     "--set-threads", "train=1", "--retries", "40", "table")  # a list option must not precede it
    log = tmp_path / "results" / "slurm_stop" / "logs" / "train" / "iid" / "fedavg" / "seed0.log"
    with open(tmp_path / "snakemake.log", "w") as out:  # a file: a full pipe would stop Snakemake
        # SIGINT as Snakemake's default: an xdist worker ignores it, and its children would inherit that
        smk = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=_env(),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 420
            while not (log.exists() and "resuming" in log.read_text()):
                assert smk.poll() is None and time.monotonic() < deadline, (tmp_path / "snakemake.log").read_text()
                time.sleep(2)
        finally:
            smk.send_signal(signal.SIGINT)  # as Ctrl-C: Snakemake cancels its jobs (SIGTERM would wait for them)
            try:
                smk.wait(timeout=120)
            except subprocess.TimeoutExpired:
                smk.kill()
                raise
    output = (tmp_path / "snakemake.log").read_text()
    text = log.read_text()
    stopped = re.search(r"stopped by SIGTERM after round (\d+) of 20000; checkpoint written", text)
    assert stopped, text[-3000:]
    assert re.search(rf"resuming .* after round {stopped[1]} of 20000", text), text[-3000:]
    first = re.findall(r"has been submitted with SLURM jobid (\d+)", output)[0]
    job = _job(first)
    # the job ended by the run itself, before the limit: not TIMEOUT, and within 3 of its 4 minutes
    assert job["JobState"] == "FAILED" and job["Reason"] != "TimeLimit", job
    assert _minutes(job["RunTime"]) <= 3, job["RunTime"]


def test_a_tiny_study_runs_through_slurm_as_the_profile_says(slurm, tmp_path):
    # as small as a run gets: each SLURM job also starts Snakemake twice (batch script, job step)
    study = _tiny_study(tmp_path, "slurm_smoke", 1, ["fedavg", "local"])
    out = tmp_path / "results" / "slurm_smoke"
    summaries = [out / "runs" / "iid" / m / "seed0" / "summary.json" for m in ("fedavg", "local")]
    p = _profile()
    defaults = {**p["default-resources"], "slurm_partition": PARTITION}
    cmd = _snakemake(study, tmp_path,
                     "--slurm-keep-successful-logs",  # a flag: options taking lists must not precede the target
                     # the runs and their table (the rule, wherever it writes), not `all`: figures and
                     # diagnostics add minutes, not SLURM coverage
                     "table")
    if not slurm["gpus"]:  # no fake GPUs here (mknod refused): the train jobs ask for none
        train = {**p["set-resources"]["train"], "gpu": 0}  # the option replaces the whole list
        cmd[-2:-2] = ["--set-resources", *(f"train:{k}={v}" for k, v in train.items())]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=_env())
    log = r.stdout + r.stderr
    if r.returncode != 0:
        slurm_logs = "".join(f"\n--- {f}\n{f.read_text()[-2000:]}" for f in (tmp_path / "slurm_logs").rglob("*.log"))
        pytest.fail(f"snakemake failed ({r.returncode}):\n{log[-6000:]}{slurm_logs}", pytrace=False)
    assert "Using workflow specific profile profiles/slurm" in log  # not profiles/default

    job_ids = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    jobs = {i: _job(i) for i in job_ids}
    train_jobs = [j for j in jobs.values() if j["Comment"].startswith("rule_train_")]
    assert len(train_jobs) == TRAIN_RUNS, log
    want = {**p["default-resources"], **p["set-resources"]["train"]}
    # the rule's threads (OMP_NUM_THREADS) follow set-threads, as many as the CPUs SLURM gives
    threads = re.findall(r"^rule train:\n(?:    .*\n)*?    threads: (\d+)$", log, re.M)
    assert threads == [str(p["set-threads"]["train"])] * TRAIN_RUNS, log
    for j in train_jobs:
        assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", j
        assert j["Partition"] == PARTITION
        assert int(j["NumCPUs"]) == int(j["CPUs/Task"]) == want["cpus_per_task"]
        assert _mb(j["MinMemoryNode"]) == want["mem_mb"]
        assert _minutes(j["TimeLimit"]) == want["runtime"]
        if slurm["gpus"]:
            assert re.search(r"gpu:1$", j["TresPerJob"]), j["TresPerJob"]
    # every other rule sent to SLURM gets the defaults (the small rules should be localrules); with
    # no cpus_per_task default, the plugin asks for the rule's threads: 1 for those here
    for j in jobs.values():
        if j not in train_jobs:
            assert j["Partition"] == PARTITION and j["JobState"] == "COMPLETED", j
            assert int(j["NumCPUs"]) == defaults.get("cpus_per_task", 1)
            assert _mb(j["MinMemoryNode"]) == defaults["mem_mb"]
            assert _minutes(j["TimeLimit"]) == defaults["runtime"]

    for s in summaries:
        assert json.loads(s.read_text())["scenario"] == "iid"
    tables = list(out.rglob("table.md"))
    assert len(tables) == 1 and "fedavg" in tables[0].read_text(), tables
