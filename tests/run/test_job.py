"""A training job survives any kill: resume gives the uninterrupted result, for every method."""

import contextlib
import errno
import json
import logging
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from fedfactor.config import load_config
from fedfactor.data import load_dataset
from fedfactor.environment import versions
from fedfactor.errors import Interrupted, RunFailed, UsageError
from fedfactor.fl.batched import BatchedTrainer
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Diverged, Trainer
from fedfactor.io import check_output
from fedfactor.run.setup import set_up
from fedfactor.run.job import CHECKPOINT, chance_accuracy, finished_summary, run_log, train, train_runs
from fedfactor.methods import METHODS
from fedfactor.methods.base import Method

from ..conftest import TINY

pytestmark = pytest.mark.slow  # every test runs training jobs

ROUNDS = 4
# What legitimately differs between an interrupted and an uninterrupted run: time and the record
# of the interruption itself.
TIMING = {"wall_seconds", "resumed_after_rounds"}


class Killed(BaseException):
    """Stands in for SIGKILL: nothing of the job's own cleanup runs except what `finally` does."""


# Two batches a client a round: what a resume must restore does not grow with the data, and the whole
# digits set made each case of the matrix below seconds of training (2.4 s a run against 0.5 s).
FEW = ["partition.kind=dirichlet_fixed", "partition.alpha=100", "partition.samples_per_client.train=64",
       "partition.samples_per_client.val=16", "partition.samples_per_client.test=32"]


def _cfg(method, *extra):
    # FedFac: splitting the 64-channel conv instead of the 512-unit fc keeps the factor analyses fast;
    # N(0, 1) filters there (the masking ablations) make some clients diverge, which is skipped.
    fast = ["method.layers=[2]", "fl.on_divergence=skip"] if method.startswith("fedfac") else []
    if method.startswith("feddecomp"):  # two epochs, so both of FedDecomp's phases run
        fast = ["fl.epochs=2", "method.e_lora=1"]
    if method == "fedrep":  # its paper's 10 head epochs a round would make this the slowest case
        fast = ["method.head_epochs=2"]
    sets = [*TINY, *FEW, f"fl.rounds={ROUNDS}", "checkpoint.every=2", f"method.name={method}", *fast, *extra]
    return load_config(None, sets)


def _fit_calls(monkeypatch, on_call, target=(Trainer, "fit")):
    """Count calls of Trainer.fit (or another `target`) and let `on_call(n)` act before the n-th one."""
    calls = {"n": 0}
    owner, name = target
    original = getattr(owner, name)

    def fit(self, *args, **kwargs):
        calls["n"] += 1
        on_call(calls["n"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, fit)
    return calls


def _result(out):
    summary = json.loads((out / "summary.json").read_text())
    metrics = pd.read_csv(out / "metrics.csv")
    metrics = metrics.drop(columns=[c for c in metrics if c.endswith("seconds")])  # timings (fedfac.fa_seconds too)
    return {k: v for k, v in summary.items() if k not in TIMING}, metrics


@pytest.mark.parametrize("method", METHODS.names())
def test_no_method_changes_the_clients_shared_initial_tensors(method):
    # Every client starts from the same initial tensors, shared rather than copied (Method.init_client):
    # a hook that changed a state's tensors in place would change every other client's start.
    sim = Simulator(_cfg(method))
    before = {k: v.clone() for k, v in sim.init.items()}
    sim.run_round(1)
    sim.evaluate()
    for key, value in before.items():
        assert torch.equal(sim.init[key], value), key


@pytest.mark.parametrize("sets, written", [
    # every 2 rounds of 6 (not after the last): rounds 2 and 4
    (["checkpoint.every=2", "checkpoint.minutes=0"], [2, 4]),
    # by time alone: a clock that moves 1 ms a reading passes a 0.6 ms budget at every round's end
    (["checkpoint.every=0", "checkpoint.minutes=0.00001"], [1, 2, 3, 4, 5]),
    # a write that takes 100 s is not repeated every round: the next waits until it is 5 % of the time since
    (["checkpoint.every=1", "checkpoint.minutes=0", "slow"], [1]),
])
def test_checkpoints_fall_due_by_rounds_by_time_and_not_while_the_last_write_dominates(tmp_path, monkeypatch,
                                                                                       sets, written):
    import fedfactor.run.job as job

    clock = {"now": 0.0}

    def tick():
        clock["now"] += 0.001
        return clock["now"]

    rounds = []
    save = torch.save

    def saving(obj, f):
        rounds.append(obj["simulator"]["round"])
        clock["now"] += 100.0 if "slow" in sets else 0.0
        save(obj, f)

    monkeypatch.setattr(job, "_clock", tick)
    monkeypatch.setattr(job.torch, "save", saving)
    train(_cfg("fedavg", "fl.rounds=6", *[s for s in sets if s != "slow"]), tmp_path / "run")
    assert rounds == written


def test_a_checkpoint_without_room_beside_the_last_one_is_announced_before_it_is_written(tmp_path, monkeypatch,
                                                                                         caplog):
    import fedfactor.run.job as job

    monkeypatch.setattr(job.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**9, used=10**9, free=1000))
    with caplog.at_level("WARNING"):
        train(_cfg("fedavg", "checkpoint.every=1", "checkpoint.keep=true"), tmp_path / "run")
    announced = [r.message for r in caplog.records if "free beside the last checkpoint" in r.message]
    assert len(announced) == ROUNDS - 1  # every write but the first, which has no checkpoint beside it


def test_a_batched_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    cfg = _cfg("fedavg", "model.name=mlp", "fl.batch_clients=true", "fl.epochs=2")
    target = (BatchedTrainer, "fit_many")
    calls = _fit_calls(monkeypatch, lambda n: None, target)
    train(cfg, tmp_path / "whole")
    assert calls["n"] == ROUNDS  # one batched call a round: every client trained in it

    def strike(n):
        if n == 3:
            raise Killed

    _fit_calls(monkeypatch, strike, target)
    with pytest.raises(Killed):
        train(cfg, tmp_path / "killed")
    _fit_calls(monkeypatch, lambda n: None, target)
    train(cfg, tmp_path / "killed")
    assert _result(tmp_path / "killed")[0] == _result(tmp_path / "whole")[0]
    pd.testing.assert_frame_equal(_result(tmp_path / "killed")[1], _result(tmp_path / "whole")[1])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """method -> (its uninterrupted run's result, the calls it made, what they were): run once a module,
    shared by the SIGKILL and the SIGTERM case."""
    runs = {}

    def run(method):
        if method not in runs:
            cfg, out = _cfg(method), tmp_path_factory.mktemp(method) / "whole"
            fit, own = (Trainer, "fit"), (METHODS.get(method), "local_train")
            with pytest.MonkeyPatch.context() as mp:
                calls = {target: _fit_calls(mp, lambda n: None, target) for target in (fit, own)}
                train(cfg, out)
            # a method with its own training loop (Per-FedAvg, FedEM) is killed as a client starts it
            target = fit if calls[fit]["n"] else own
            runs[method] = _result(out), calls[target]["n"], target
        return runs[method]

    return run


# SIGKILL leaves whatever the last checkpoint holds, so every method's own state (server, client
# extras, optimizer state) is put through it. SIGTERM adds the job's handler, which stops at the next
# training step and checkpoints the last completed round: the same for every method that trains through
# one path, so one method a path (Trainer.fit; a method's own loop, FedEM's and Per-FedAvg's).
SIGTERM_METHODS = ["fedavg", "fedem", "per_fedavg"]


@pytest.mark.parametrize("method, kill", [*((m, "sigkill") for m in METHODS.names()),
                                          *((m, "sigterm") for m in SIGTERM_METHODS)])
def test_every_method_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, method, kill, uninterrupted):
    cfg = _cfg(method)
    expected, total, target = uninterrupted(method)

    # Kill at a random training step of a random round (seeded per case, so a failure reproduces).
    at = random.Random(f"{method}-{kill}").randint(1, total)

    def strike(n):
        if n != at:
            return
        if kill == "sigkill":
            raise Killed
        signal.raise_signal(signal.SIGTERM)  # the job's handler turns it into a checkpoint and a stop

    out = tmp_path / "killed"
    _fit_calls(monkeypatch, strike, target)
    with pytest.raises(Killed if kill == "sigkill" else Interrupted):
        train(cfg, out)
    assert not (out / "summary.json").exists()
    (out / ".metrics.csv.x1y2.tmp").write_text("half a file")  # what a real SIGKILL mid-write leaves
    _fit_calls(monkeypatch, lambda n: None, target)
    summary = train(cfg, out)
    assert _result(out)[0] == expected[0]
    pd.testing.assert_frame_equal(_result(out)[1], expected[1])
    assert not list(out.rglob("*.tmp")) and not (out / CHECKPOINT).exists()
    if kill == "sigterm":  # SIGTERM checkpoints the last completed round, so no round is lost
        assert summary["resumed_after_rounds"] == [(at - 1) // (total // ROUNDS)]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the job put the handlers back


def test_checkpoint_loads_weights_only_and_is_kept_on_request(tmp_path):
    cfg = _cfg("fedprox", "checkpoint.keep=true", "fl.momentum=0.9")
    train(cfg, tmp_path)
    ckpt = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert ckpt["simulator"]["round"] == ROUNDS and len(ckpt["simulator"]["states"]) == 4
    # A finished run's checkpoint resumes to the same summary without training again.
    first = _result(tmp_path)
    calls = {"n": 0}
    with pytest.MonkeyPatch.context() as mp:
        _fit_calls(mp, lambda n: calls.update(n=n))
        train(cfg, tmp_path)
    assert calls["n"] == 0 and _result(tmp_path)[0] == first[0]


def test_another_config_in_the_folder_starts_a_new_run_and_a_damaged_checkpoint_is_refused(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracked = ["tracking.enabled=true", f"tracking.uri={uri}"]
    out = tmp_path / "run"
    _fit_calls(monkeypatch, lambda n: (_ for _ in ()).throw(Killed) if n == 12 else None)
    with pytest.raises(Killed):
        train(_cfg("fedavg", *tracked), out)
    assert (out / CHECKPOINT).exists()
    monkeypatch.undo()
    # Where results are mirrored and how often they are checkpointed do not change the run.
    first = train(_cfg("fedavg", *tracked, "checkpoint.every=3"), out)
    assert first["resumed_after_rounds"] == [2]
    # A changed config (a changed study re-running its jobs) is a new run, from round 1.
    second = train(_cfg("fedavg", *tracked, "fl.lr=0.1"), out)
    train(_cfg("fedavg", "fl.lr=0.1"), tmp_path / "fresh")
    mirror = ("mlflow_run_id", "config")
    assert {k: v for k, v in _result(out)[0].items() if k not in mirror} == \
        {k: v for k, v in _result(tmp_path / "fresh")[0].items() if k not in mirror}
    assert second["resumed_after_rounds"] == [] and second["mlflow_run_id"] != first["mlflow_run_id"]
    (out / CHECKPOINT).write_bytes(b"not a checkpoint")
    with pytest.raises(UsageError, match="cannot be resumed"):
        train(_cfg("fedavg", "fl.lr=0.1"), out)


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        train(load_config(None, [*TINY, f"seed={seed}"]), tmp_path / name)
    a, b, c = (_result(tmp_path / n) for n in "abc")
    assert a[0] == b[0]
    assert a[0]["warnings"] == []  # a run that did not degenerate
    pd.testing.assert_frame_equal(a[1], b[1])
    assert a[1]["accuracy_mean"].tolist() != c[1]["accuracy_mean"].tolist()


def test_runs_in_one_process_equal_separate_runs_skip_finished_ones_and_outlive_a_failure(tmp_path, caplog):
    # The workflow's jobs train several runs in one process: nothing of one run (random streams,
    # a method's state) may reach the next, a failed run must not cost the others, and a job run
    # again must skip what finished and retry what did not.
    caplog.set_level(logging.INFO, logger="fedfactor")  # what the CLI logs
    cfgs = {"alpha": load_config(None, [*TINY, "method.name=factorized_fl_alpha"]),
            "diverges": load_config(None, [*TINY, "fl.lr=1e6", "fl.momentum=0"]),
            "fedavg": load_config(None, [*TINY, "seed=1"])}
    runs = [(set_up(cfg), tmp_path / name, tmp_path / "logs" / f"{name}.log") for name, cfg in cfgs.items()]
    finished = []
    failures = train_runs(runs, lambda out, seconds: finished.append((out.name, seconds)))
    assert [name for name, _ in finished] == ["alpha", "fedavg"] and all(s > 0 for _, s in finished)
    assert len(failures) == 1 and failures[0][0] == tmp_path / "diverges"
    assert failures[0][1].startswith("round 1, client 0")
    assert not (tmp_path / "diverges" / "summary.json").exists()
    # the failure is kept in the run's folder, for a study that records failed runs as results
    assert json.loads((tmp_path / "diverges" / "failed.json").read_text()) == {
        "scenario": "custom", "method": "fedavg", "seed": 0, "reason": failures[0][1]}
    assert not (tmp_path / "alpha" / "failed.json").exists()
    assert "round 1, client 0" in (tmp_path / "logs" / "diverges.log").read_text()
    assert "fedavg/seed1 round 2/2" in (tmp_path / "logs" / "fedavg.log").read_text()
    assert "factorized_fl_alpha" not in (tmp_path / "logs" / "fedavg.log").read_text()  # each run its own log
    for name in ("alpha", "fedavg"):
        train(cfgs[name], tmp_path / f"{name}-alone")
        alone, together = _result(tmp_path / f"{name}-alone"), _result(tmp_path / name)
        assert {k: v for k, v in alone[0].items() if k != "config"} == \
            {k: v for k, v in together[0].items() if k != "config"}
        pd.testing.assert_frame_equal(alone[1], together[1])
        assert finished_summary(set_up(cfgs[name]).cfg, tmp_path / name) is not None

    stamp = (tmp_path / "alpha" / "summary.json").stat().st_mtime_ns
    finished.clear()
    runs = [(set_up(setup.cfg), out, log) for setup, out, log in runs]  # a set-up run trains once
    assert len(train_runs(runs, lambda out, seconds: finished.append(out.name))) == 1  # it fails again
    assert finished == [] and (tmp_path / "alpha" / "summary.json").stat().st_mtime_ns == stamp
    assert "holds this run, finished: skipped" in (tmp_path / "logs" / "alpha.log").read_text()
    # a finished folder of another config is no finished run of this one
    assert finished_summary(load_config(None, [*TINY, "seed=2"]), tmp_path / "fedavg") is None
    # an attempt that finishes takes the earlier failure away
    train(load_config(None, [*TINY, "fl.lr=0.01"]), tmp_path / "diverges")
    assert not (tmp_path / "diverges" / "failed.json").exists()


def test_a_diverging_loss_stops_the_run_naming_round_and_client(tmp_path):
    with pytest.raises(RunFailed, match=r"round 1, client 0: mean training loss \S+ is (not finite|above)"):
        train(load_config(None, [*TINY, "fl.lr=1e6", "fl.momentum=0"]), tmp_path / "stop")
    assert not (tmp_path / "stop" / "summary.json").exists()


def test_a_loss_past_max_loss_is_divergence_and_a_round_of_only_such_clients_fails(tmp_path):
    # The real check, not a stand-in: a tiny max_loss makes every client "diverge", so round 1 keeps
    # nothing and the run stops rather than finishing with the untrained model.
    with pytest.raises(RunFailed, match=r"round 1 kept no update: .* \(0, 1, 2, 3\) diverged"):
        train(load_config(None, [*TINY, "fl.max_loss=1e-9", "fl.on_divergence=skip"]), tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_outputs_are_group_readable(tmp_path):
    train(load_config(None, TINY), tmp_path)
    for name in ("summary.json", "metrics.csv", "config.yaml"):
        assert (tmp_path / name).stat().st_mode & 0o044 == 0o044 & ~_umask(), name


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_output_folder_checks(tmp_path):
    (tmp_path / "file").write_text("")
    for out, pattern in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "run", "lies under")):
        with pytest.raises(UsageError, match=pattern):
            check_output(out)
    check_output(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()


def test_read_only_output_folder_is_refused():
    # Root may write anywhere, so check as an unprivileged user where the tests run as root; the
    # folder sits in a fresh folder under /tmp that such a user can reach.
    top = Path(tempfile.mkdtemp())
    os.chmod(top, 0o755)
    base = top / "ro"
    base.mkdir(mode=0o555)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 3
        try:
            if os.geteuid() == 0:
                os.setuid(65534)
            check_output(base / "run")
        except UsageError as e:
            code = 0 if "is not writable" in str(e) else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    shutil.rmtree(top)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_client_without_test_data_is_refused(tmp_path):
    cfg = load_config(None, [*TINY, "data.split=[0.9, 0.1, 0.0]"])
    with pytest.raises(UsageError, match="has no test samples"):
        Simulator(cfg)


# -- the real thing: `fedfactor train` processes, signals and a shared MLflow store ----------------

# Rounds of the jobs killed for real: enough that the signal, sent once round 3 is written, lands with
# rounds still to go on a fast machine.
KILLED_ROUNDS = 12


def _train_process(out, uri, *extra):
    sets = [*TINY, f"fl.rounds={KILLED_ROUNDS}", "checkpoint.every=2", f"tracking.uri={uri}", "tracking.enabled=true", *extra]
    argv = [sys.executable, "-m", "fedfactor.cli", "-q", "train", *(a for s in sets for a in ("--set", s)),
            "--out", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rounds(proc, out, n):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if len(pd.read_csv(out / "metrics.csv")) >= n:
                return
        except (FileNotFoundError, pd.errors.EmptyDataError):
            pass
        time.sleep(0.01)
    raise AssertionError(f"the job ended or stalled before round {n}: {proc.communicate()}")


def _mlflow_runs(uri):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return client, client.search_runs(exps, max_results=1000)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The uninterrupted run both killed jobs must match."""
    reference = tmp_path_factory.mktemp("reference") / "run"
    train(load_config(None, [*TINY, f"fl.rounds={KILLED_ROUNDS}", "checkpoint.every=2"]), reference)
    return reference


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_job_resumes_and_matches_the_uninterrupted_run(tmp_path, sig, reference_run):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    reference = reference_run
    out = tmp_path / "run"
    proc = _train_process(out, uri)
    _wait_for_rounds(proc, out, 3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (-9 if sig == signal.SIGKILL else 143), err
    assert not (out / "summary.json").exists() and (out / CHECKPOINT).exists()
    client, runs = _mlflow_runs(uri)
    if sig == signal.SIGTERM:
        assert err.strip().splitlines()[-1] == "fedfactor: stopped by SIGTERM"
        assert [r.info.status for r in runs] == ["KILLED"]

    rerun = _train_process(out, uri)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    summary, metrics = _result(out)
    expected = _result(reference)
    assert {k: v for k, v in summary.items() if k not in ("mlflow_run_id", "config")} == \
        {k: v for k, v in expected[0].items() if k not in ("mlflow_run_id", "config")}
    pd.testing.assert_frame_equal(metrics, expected[1])
    client, runs = _mlflow_runs(uri)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].info.run_id == summary["mlflow_run_id"]
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "bytes_up")]
    assert sorted(steps) == list(range(1, KILLED_ROUNDS + 1))


def test_four_jobs_at_once_on_a_fresh_store_all_finish_in_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db"  # nothing created beforehand, no mlflow-init
    procs = [_train_process(tmp_path / f"run{i}", uri, f"seed={i}", "fl.rounds=3") for i in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    client, runs = _mlflow_runs(uri)
    assert sorted(r.data.tags["fedfactor.run_key"] for r in runs) == sorted(
        json.loads((tmp_path / f"run{i}" / "mlflow.json").read_text())["run_key"] for i in range(4))
    assert all(r.info.status == "FINISHED" for r in runs) and len(runs) == 4
    for r in runs:
        assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "bytes_up")) == [1, 2, 3]


class ToyWarns(Method):
    """FedAvg that logs its round and reports one line built from what it logged (test only, not registered)."""

    name = "toy_warns"

    def aggregate(self, server, uploads, weights):
        self.ctx.log("toy_round", self.ctx.round)
        return super().aggregate(server, uploads, weights)

    def run_warnings(self, diagnostics):
        return [f"toy_warns logged rounds {[d['toy_round'] for d in diagnostics]}"]


def test_a_methods_run_warnings_reach_the_log_the_summary_and_mlflow(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(METHODS._entries, "toy_warns", (ToyWarns, "test only"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(None, [*TINY, "method.name=toy_warns", "checkpoint.every=1", "tracking.enabled=true",
                             f"tracking.uri={uri}"])
    # killed in round 2 (4 clients a round): the resumed job reads round 1's scalars from the checkpoint
    kill = [True]
    _fit_calls(monkeypatch, lambda n: (_ for _ in ()).throw(Killed) if kill[0] and n == 5 else None)
    with pytest.raises(Killed):
        train(cfg, tmp_path / "run")
    kill[0] = False
    with caplog.at_level("WARNING", logger="fedfactor"):
        summary = train(cfg, tmp_path / "run")
    line = "toy_warns logged rounds [1.0, 2.0]"
    assert summary["resumed_after_rounds"] == [1]
    assert summary["warnings"] == [line]  # and none of the loop's own: no round dropped every update
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"] == [line]
    assert line in caplog.text
    _, runs = _mlflow_runs(uri)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["fedfactor.warnings"] == line and runs[0].data.metrics["final_warnings"] == 1


@pytest.fixture(scope="module")
def at_chance(tmp_path_factory):
    """A tracked run that cannot learn (fl.lr=1e-9): (its summary.json, its log's text, its MLflow run)."""
    tmp = tmp_path_factory.mktemp("chance")
    uri = f"sqlite:///{tmp}/mlflow.db"
    with run_log(tmp / "run.log"):
        train(load_config(None, [*TINY, "fl.lr=1e-9", "tracking.enabled=true", f"tracking.uri={uri}"]), tmp / "run")
    _, runs = _mlflow_runs(uri)
    (run,) = runs
    return json.loads((tmp / "run" / "summary.json").read_text()), (tmp / "run.log").read_text(), run


def test_a_run_at_chance_warns_in_the_log_the_summary_and_mlflow_and_a_trained_one_does_not(tmp_path, at_chance):
    summary, log_text, run = at_chance
    line = (f"accuracy {100 * summary['accuracy']:.1f} % is at or below chance (majority-class baseline "
            f"{100 * summary['chance_accuracy']:.1f} %, margin 2 pp): the run learned nothing; check fl.lr and the "
            "method's settings")
    assert summary["warnings"] == [line] and line in log_text
    assert run.data.tags["fedfactor.warnings"] == line and run.data.metrics["final_warnings"] == 1
    # The same clients and test splits trained at the usual lr: the same chance, well beaten.
    trained = train(load_config(None, TINY), tmp_path / "trained")
    assert trained["chance_accuracy"] == summary["chance_accuracy"]
    assert trained["accuracy"] > trained["chance_accuracy"] + 0.3 and trained["warnings"] == []


def test_chance_is_the_majority_share_of_the_test_split_each_client_is_scored_on():
    # Under eval.test_pool=shared a client is scored on the pooled test split inside its task, two
    # digits here: chance is near a half, where the whole pool's majority class is near a tenth.
    # Exact, since the clients' own test splits (eval.test_pool=client) come close: 0.58973 against
    # this pool's 0.58956.
    cfg = load_config(None, [*TINY, "partition.kind=class_groups", "partition.groups=[[0, 4], [2, 3]]",
                             "partition.clients_per_group=2", "eval.test_pool=shared"])
    sim = Simulator(cfg)
    y = load_dataset(cfg.data.name, cfg.data.root).y.numpy()[sim.partition.pools["test"]]
    shares = []
    for k in sim.members:
        scored = np.bincount(y[np.isin(y, np.flatnonzero(sim.partition.label_maps[k] >= 0))])
        shares.append(scored.max() / scored.sum())
    assert chance_accuracy(sim, "last") == pytest.approx(np.mean(shares), abs=1e-9) and 0.45 < chance_accuracy(sim, "last") < 0.7


def test_a_run_records_the_software_and_machine_in_its_summary_and_mlflow(at_chance):
    summary, _, run = at_chance
    assert summary["versions"] == versions(torch.device("cpu"))  # this process: the machine and threads it ran on
    tags = {k.removeprefix("fedfactor.version."): v for k, v in run.data.tags.items()
            if k.startswith("fedfactor.version.")}
    assert tags == {k: str(v) for k, v in summary["versions"].items()}


def test_a_round_that_kept_no_update_fails_the_run(tmp_path, monkeypatch):
    def diverge(n):  # round 1: its second client (dropped); round 2: all four clients
        if n == 2 or n > 4:
            raise Diverged(float("inf"), 1e4)

    _fit_calls(monkeypatch, diverge)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(None, [*TINY, "fl.on_divergence=skip", "checkpoint.every=1", "tracking.enabled=true",
                             f"tracking.uri={uri}"])
    with pytest.raises(RunFailed, match="round 2 kept no update"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert metrics["round"].tolist() == [1] and metrics["skipped_clients"].tolist() == [1]
    _, runs = _mlflow_runs(uri)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"


def test_a_dropped_update_is_a_warning(tmp_path, monkeypatch, caplog):
    _fit_calls(monkeypatch, lambda n: (_ for _ in ()).throw(Diverged(float("inf"), 1e4)) if n == 6 else None)
    with caplog.at_level("WARNING", logger="fedfactor"):
        summary = train(load_config(None, [*TINY, "fl.on_divergence=skip"]), tmp_path / "other")
    assert summary["skipped_updates"] == [[2, 1]]
    assert pd.read_csv(tmp_path / "other" / "metrics.csv")["skipped_clients"].tolist() == [0, 1]
    full = train(load_config(None, TINY), tmp_path / "full")
    assert summary["bytes_up"] == full["bytes_up"] * 7 // 8  # 1 of 8 equal uploads dropped: none of it sent
    [partly] = summary["warnings"]
    assert partly.startswith("1 client update(s) diverged and were dropped") and ": round 2 client 1;" in partly
    assert partly in caplog.text


# -- the run folder's safety: nothing finished is lost ------------------------------------------

KEPT = ("fedavg", "checkpoint.keep=true")


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    """A finished run that kept its checkpoint, for the reruns below to copy."""
    out = tmp_path_factory.mktemp("kept") / "run"
    train(_cfg(*KEPT), out)
    return out


def _copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


class _Hostile:
    """Unpickled, it would create the marker file named in its argument."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _nan_weights(path):
    ckpt = torch.load(path, weights_only=True)

    def nan(obj):
        if torch.is_tensor(obj):
            return torch.full_like(obj, float("nan")) if obj.is_floating_point() else obj
        if isinstance(obj, dict):
            return {k: nan(v) for k, v in obj.items()}
        return [nan(v) for v in obj] if isinstance(obj, list) else obj

    ckpt["simulator"]["states"] = nan(ckpt["simulator"]["states"])
    ckpt["simulator"]["server"] = nan(ckpt["simulator"]["server"])
    torch.save(ckpt, path)


CHECKPOINT_DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "random bytes": lambda p: p.write_bytes(np.random.default_rng(0).bytes(4096)),
    "zeros": lambda p: p.write_bytes(bytes(4096)),  # torch takes it for its legacy format
    "a folder": lambda p: (p.unlink(), p.mkdir()),
    "a plain pickle": lambda p: p.write_bytes(pickle.dumps({"version": 1})),
    "a hostile pickle": lambda p: torch.save(_Hostile(p.parent / "pwned"), p),
    "NaN weights": _nan_weights,
}


@pytest.mark.parametrize("damage", CHECKPOINT_DAMAGE)
def test_a_damaged_kept_checkpoint_is_refused_and_the_finished_run_is_kept(tmp_path, kept_run, damage):
    out = _copy(kept_run, tmp_path)
    CHECKPOINT_DAMAGE[damage](out / CHECKPOINT)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"}
    with pytest.raises(UsageError) as refused:
        train(_cfg(*KEPT), out)
    message = str(refused.value)
    assert str(out / CHECKPOINT) in message and "\n" not in message
    # torch's advice to run what the file holds (weights_only=False, allowing its globals): never for a damaged file
    assert "weights_only" not in message and "safe_globals" not in message
    assert not (out / "pwned").exists()  # nothing was unpickled
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == before  # summary.json included


def test_a_nan_checkpoint_is_refused_naming_what_to_do(tmp_path, kept_run):
    out = _copy(kept_run, tmp_path)
    _nan_weights(out / CHECKPOINT)
    with pytest.raises(UsageError, match=r"non-finite model weights .*delete it to start the run over"):
        train(_cfg(*KEPT), out)


def test_a_run_file_that_is_a_folder_is_refused_before_anything_is_written(tmp_path, kept_run):
    out = _copy(kept_run, tmp_path)
    (out / "summary.json").unlink()
    (out / "summary.json").mkdir()
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(UsageError, match=r"summary.json is a folder; move it away"):
        train(_cfg(*KEPT), out)
    with pytest.raises(UsageError, match=r"summary.json is a folder; move it away"):
        train_runs([(set_up(_cfg(*KEPT)), out, None)])
    assert sorted(p.name for p in out.iterdir()) == before


def _full_disk(monkeypatch, site):
    """ENOSPC at one write site of a run: `site` names the file whose write fails."""
    import fedfactor.io as fio

    def enospc():
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if site == ".lock":  # the folder lock's pid line
        real = fio.exclusive_lock

        @contextlib.contextmanager
        def lock(path, timeout=None):
            with real(path, timeout) as f:
                monkeypatch.setattr(f, "write", lambda text: (_ for _ in ()).throw(enospc()), raising=False)
                yield f

        monkeypatch.setattr(fio, "exclusive_lock", lock)
    elif site == CHECKPOINT:  # inside torch.save, which reports it as a RuntimeError ("unexpected pos")
        real_save = torch.save

        class Full:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                raise enospc()

            def __getattr__(self, name):
                return getattr(self.f, name)

        monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real_save(obj, Full(f), *a, **k))
    else:  # the fsync of the file's temporary
        real_fsync = os.fsync

        def fsync(fd):
            if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(f".{site}."):
                raise enospc()
            real_fsync(fd)

        monkeypatch.setattr(fio.os, "fsync", fsync)


@pytest.mark.parametrize("site", [".lock", "metrics.csv", CHECKPOINT, "summary.json"])
def test_a_full_disk_is_one_line_and_a_rerun_finds_what_it_needs(tmp_path, kept_run, monkeypatch, site):
    # A finished run re-summarised from its kept checkpoint writes the lock, metrics.csv and
    # summary.json; a run from scratch writes the checkpoint.
    out = _copy(kept_run, tmp_path) if site != CHECKPOINT else tmp_path / "run"
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"} \
        if out.exists() else {}
    with monkeypatch.context() as mp:
        _full_disk(mp, site)
        with pytest.raises(RunFailed, match=rf"^no space left to write {out / site} \([\d.]+ \w?i?B free on the "
                                            rf"file system of {out}\); free some space and run the same command "
                                            r"again$"):
            train(_cfg(*KEPT), out)
    assert not list(out.rglob("*.tmp"))
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name in before}
    assert after == before  # summary.json and the checkpoint as they were
    rerun = train(_cfg(*KEPT), out)
    expected = json.loads((kept_run / "summary.json").read_text())
    drop = TIMING | {"mlflow_run_id"}
    assert {k: v for k, v in rerun.items() if k not in drop} == {k: v for k, v in expected.items() if k not in drop}
