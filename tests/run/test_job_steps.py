"""The training job's steps, each alone and fast (tests/run/test_job.py runs them together as jobs): when a
checkpoint falls due, what a round leaves behind, the warnings a degenerate run ends with, and the
checkpoint file read back and checked against its run before a resume."""

import json
import pickle
import re
import signal
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import fedfactor.run.job as job
from fedfactor.config import load_config
from fedfactor.errors import Interrupted, UsageError
from fedfactor.methods.fedamp import FedAMP
from fedfactor.run.records import RoundRecord, Scores
from fedfactor.run.setup import read_run
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Split, Trainer
from fedfactor.run.summary import summarize

from ..conftest import TINY


def _checkpoints(monkeypatch, tmp_path, *sets):
    clock = {"now": 0.0}
    monkeypatch.setattr(job, "_clock", lambda: clock["now"])
    cfg = load_config(None, [*TINY, *sets])
    return job._Checkpoints(cfg.checkpoint, tmp_path, None, {}, [], None, "run"), clock


def test_a_checkpoint_falls_due_every_few_rounds(monkeypatch, tmp_path):
    ck, _ = _checkpoints(monkeypatch, tmp_path, "checkpoint.every=2", "checkpoint.minutes=0")
    assert [r for r in range(1, 7) if ck.due(r)] == [2, 4, 6]
    ck, _ = _checkpoints(monkeypatch, tmp_path, "checkpoint.every=0", "checkpoint.minutes=0")
    assert not any(ck.due(r) for r in range(1, 7))  # only on a stop signal


def test_a_checkpoint_falls_due_after_its_minutes_whatever_the_round(monkeypatch, tmp_path):
    ck, clock = _checkpoints(monkeypatch, tmp_path, "checkpoint.every=0", "checkpoint.minutes=30")
    clock["now"] = 30 * 60 - 1
    assert not ck.due(3)
    clock["now"] = 30 * 60
    assert ck.due(3)


def test_a_checkpoint_is_put_off_while_writing_the_last_took_more_than_its_share(monkeypatch, tmp_path):
    ck, clock = _checkpoints(monkeypatch, tmp_path, "checkpoint.every=1", "checkpoint.minutes=0",
                             "checkpoint.max_share=0.05")
    ck.took = 100.0  # the last write took 100 s: the next waits until that is 5 % of the time since
    clock["now"] = 1999.0
    assert not ck.due(1)
    clock["now"] = 2000.0
    assert ck.due(1)
    ck.took = 1.0  # a write of a second or less never holds a checkpoint back
    clock["now"] = 2001.0
    assert ck.due(2)


class _Recorder:
    def __init__(self, due=()):
        self.logged, self.saved, self.due_rounds = [], [], set(due)

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))

    def due(self, rnd):
        return rnd in self.due_rounds

    def save(self):
        self.saved.append(True)


def _record(rnd, skipped=()):
    scores = Scores(np.array([3, 4]), np.array([4, 4]), 2.0)
    return RoundRecord(rnd, 0.5, 10 * rnd, 20 * rnd, 10, 20, 1.0, scores, None, {"matched": 2.0},
                       {"similarity": np.eye(2)}, list(skipped), {})


@pytest.mark.parametrize("keep", [False, True])
def test_a_round_leaves_its_row_its_arrays_its_metrics_and_a_checkpoint_when_due(tmp_path, keep):
    cfg = load_config(None, [*TINY, "fl.rounds=3", f"checkpoint.keep={str(keep).lower()}"])
    tracker, checkpoints = _Recorder(), _Recorder(due={2})
    outputs = job._RoundOutputs(cfg.fl.rounds, cfg.checkpoint.keep, tmp_path, [], tracker, checkpoints, "run")
    for rnd in (1, 2, 3):
        outputs(_record(rnd))
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert list(metrics["round"]) == [1, 2, 3] and list(metrics["bytes_up"]) == [10, 20, 30]
    assert (metrics["accuracy_mean"] == 0.875).all() and (metrics["matched"] == 2.0).all()
    assert np.array_equal(np.load(tmp_path / "diagnostics" / "similarity" / "round_0002.npy"), np.eye(2))
    assert [step for step, _ in tracker.logged] == [1, 2, 3]
    assert set(tracker.logged[0][1]) == set(metrics.columns) - {"round"}  # every column but the step
    # due in round 2; the last round's only when the run keeps its checkpoint
    assert len(checkpoints.saved) == (2 if keep else 1)


def _sim(run_warnings=(), skipped=()):
    method = SimpleNamespace(run_warnings=lambda diagnostics: list(run_warnings))
    return SimpleNamespace(method=method, records=[_record(1), _record(2, skipped)])


def test_a_run_that_learned_ends_without_warnings():
    assert job._run_warnings(_sim(), accuracy=0.9, chance=0.1) == []


def test_the_methods_warnings_come_first_then_dropped_updates_then_chance():
    lines = job._run_warnings(_sim(["matched nobody"], skipped=[3]), accuracy=0.11, chance=0.1)
    assert lines[0] == "matched nobody"
    assert lines[1].startswith("1 client update(s) diverged and were dropped") and "round 2 client 3" in lines[1]
    assert lines[2] == job.chance_warning(0.11, 0.1) and "at or below chance" in lines[2]


# One large client with a skewed test split (850 of class 0, 150 of class 1) and one small balanced
# one (10 and 10): answering class 0 everywhere scores 67.5 % as a mean over the clients and 84.3 %
# over all samples, which is what eval.report=best_weighted reports.
SKEWED = [np.repeat([0, 1], [850, 150]), np.repeat([0, 1], [10, 10])]


def _reported(report, correct):
    """What summary.json reports for one evaluated round whose clients got `correct` right."""
    counts = np.array([len(y) for y in SKEWED])
    scores = Scores(np.asarray(correct), counts, 0.0)
    record = RoundRecord(1, 0.5, 0, 0, 0, 0, 1.0, scores, scores)
    return summarize([record], report)["accuracy"]


@pytest.mark.parametrize("report", ["last", "best", "best_val", "best_weighted"])
def test_the_chance_warning_fires_for_a_constant_predictor_under_every_report_rule(report):
    sim = SimpleNamespace(members=[0, 1], clients=[
        {"test": Split(torch.arange(len(y)), torch.as_tensor(y))} for y in SKEWED])
    chance = job.chance_accuracy(sim, report)
    constant = _reported(report, [(y == 0).sum() for y in SKEWED])
    assert chance == pytest.approx(constant) and job.chance_warning(constant, chance) is not None
    assert chance == pytest.approx(860 / 1020 if report == "best_weighted" else 0.675)
    # a trained model (97 % and 90 % right) beats chance under the same rule
    assert job.chance_warning(_reported(report, [970, 18]), chance) is None


# -- the checkpoint file: written, read back, and checked against the run before it is resumed

def _saved(tmp_path, *sets):
    """A tiny run's simulator after its one round, its fingerprint, and its checkpoint written."""
    cfg = load_config(None, [*TINY, "fl.rounds=1", *sets])
    sim = Simulator(cfg)
    sim.run()
    fp = job.fingerprint(cfg)
    ck = job._Checkpoints(cfg.checkpoint, tmp_path, sim, fp, [1], SimpleNamespace(run_id="mlflow-run"), "run")
    ck.save()
    return sim, fp, ck.path


def test_a_checkpoint_reads_back_what_the_run_holds_once_checked_against_it(tmp_path):
    sim, fp, path = _saved(tmp_path)
    assert job._checked_checkpoint(tmp_path / "absent.pt", fp, sim) is None  # nothing to resume
    ckpt = job._checked_checkpoint(path, fp, sim)
    assert ckpt["version"] == job.CHECKPOINT_VERSION and ckpt["fingerprint"] == fp
    assert ckpt["resumed"] == [1] and ckpt["mlflow_run_id"] == "mlflow-run"
    state = ckpt["simulator"]
    assert state["round"] == sim.round == 1 and len(state["states"]) == len(sim.states)
    for client, saved in zip(sim.states, state["states"], strict=True):
        assert client.keys() == saved.keys() and all(torch.equal(t, saved[key]) for key, t in client.items())
    assert all(torch.equal(t, state["server"][key]) for key, t in sim.server.items() if torch.is_tensor(t))


def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(tmp_path):
    sim, fp, path = _saved(tmp_path)
    other = job.fingerprint(load_config(None, [*TINY, "fl.rounds=1", "fl.lr=0.5"]))
    with pytest.raises(UsageError, match=r"belongs to a different run \(fl\.lr 0\.05 -> 0\.5\); use another --out"):
        job._checked_checkpoint(path, other, sim)
    moved = {**fp, "partition_sha256": "0" * 64}
    with pytest.raises(UsageError, match=r"\(the partition file's content\)"):
        job._checked_checkpoint(path, moved, sim)
    many = job.fingerprint(load_config(None, [*TINY, "fl.rounds=3", "fl.lr=0.5", "seed=7", "fl.epochs=2"]))
    assert job._differences(fp, many).count(" -> ") == 3 and job._differences(fp, many).endswith(" and 1 more")


def test_a_non_finite_weight_is_refused_and_a_non_finite_entry_that_is_no_weight_is_not(tmp_path):
    sim, fp, path = _saved(tmp_path)
    ckpt = torch.load(path, weights_only=True)
    client = ckpt["simulator"]["states"][0]
    weight = next(k for k in client if k.endswith("weight"))
    client["not.a.parameter"] = torch.tensor([float("nan")])  # AgnosticFL's "no loss yet" is one
    torch.save(ckpt, path)
    assert job._checked_checkpoint(path, fp, sim) is not None
    client[weight] = client[weight].clone().fill_(float("inf"))
    torch.save(ckpt, path)
    with pytest.raises(UsageError, match=r"holds non-finite model weights \(NaN or inf\): it is damaged; delete it"):
        job._checked_checkpoint(path, fp, sim)


@pytest.mark.parametrize("damage, says", [
    (lambda c: c.update(version=job.CHECKPOINT_VERSION + 1), rf"version {job.CHECKPOINT_VERSION + 1}, this fedfactor "
                                                             rf"reads {job.CHECKPOINT_VERSION}"),
    (lambda c: c.pop("resumed"), r"no resumed"),
    (lambda c: (c["simulator"].pop("round"), c["simulator"].pop("server")), r"no simulator\.round, simulator\.server"),
], ids=["another version", "no resumed", "no round and no server"])
def test_a_checkpoint_of_another_version_or_missing_a_part_is_refused_in_one_line(tmp_path, damage, says):
    sim, fp, path = _saved(tmp_path)
    ckpt = torch.load(path, weights_only=True)
    damage(ckpt)
    torch.save(ckpt, path)
    with pytest.raises(UsageError, match=rf"^checkpoint {re.escape(str(path))} cannot be resumed \({says}\); "
                                         r"delete it to start the run over$"):
        job.load_checkpoint(path, torch.device("cpu"))


def test_a_file_that_is_no_checkpoint_is_refused_without_torchs_advice_to_run_it(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"")
    with pytest.raises(UsageError, match=r"cannot be resumed \(EOFError\)"):  # an empty file says nothing else
        job.load_checkpoint(path, torch.device("cpu"))
    torch.save({"version": 1, "code": SimpleNamespace(x=1)}, path)  # a pickled object, not plain data
    with pytest.raises(UsageError) as refused:
        job.load_checkpoint(path, torch.device("cpu"))
    message = str(refused.value)
    # what torch says of the object it refused, without its advice (its wording varies with the version)
    assert "(not a checkpoint of tensors and plain data: " in message and "types.SimpleNamespace" in message
    assert "weights_only" not in message and "safe_globals" not in message


def test_a_plain_pickle_is_refused_in_one_line_and_torchs_warnings_stay_unshown(tmp_path, recwarn):
    path = tmp_path / "checkpoint.pt"
    with path.open("wb") as f:  # protocol 4, which torch does not write and warns about before refusing
        pickle.dump({"version": 1, "fingerprint": {}}, f, protocol=4)
    with pytest.raises(UsageError, match=r"cannot be resumed \(not a checkpoint of tensors and plain data"):
        job.load_checkpoint(path, torch.device("cpu"))
    assert [str(w.message) for w in recwarn] == []


# A stop signal in each phase of a run: training stops at its next step (tests/run/test_job.py), and the
# phases in between stop at once, from the signal's handler, not after the phase. Scoring a round
# leaves no checkpoint (its training is committed, its scores are not), so the run goes back to the
# last one; aggregation and the new clients' scoring leave the checkpoint of the last completed round.
STOP_PHASES = {
    # phase: (extra settings, the call the signal arrives in, its n-th call, the round the rerun resumes after)
    "scoring": (["checkpoint.every=1"], (Trainer, "evaluate"), "round 2", 1),
    "aggregation": (["method.name=fedamp", "checkpoint.every=0"], (FedAMP, "aggregate"), "round 2", 1),
    "new clients": (["eval.new_clients=0.25", "checkpoint.every=0"], (Trainer, "evaluate"), "after the rounds", 3),
}
TIMED = {"wall_seconds", "resumed_after_rounds"}  # what a stop may change
# few samples and a narrow CNN: each case trains three times
SMALL = ["partition.kind=dirichlet_fixed", "partition.alpha=100", "partition.samples_per_client.train=32",
         "partition.samples_per_client.val=8", "partition.samples_per_client.test=16", "model.width_multiplier=0.25"]


def _summary_and_metrics(out):
    summary = json.loads((out / "summary.json").read_text())
    metrics = pd.read_csv(out / "metrics.csv")
    return ({k: v for k, v in summary.items() if k not in TIMED},
            metrics.drop(columns=[c for c in metrics if c.endswith("seconds")]))


@pytest.mark.parametrize("phase", STOP_PHASES)
def test_a_stop_signal_ends_each_phase_at_once_and_a_rerun_resumes_to_the_uninterrupted_result(
        tmp_path, monkeypatch, phase):
    sets, (owner, name), when, resumes_after = STOP_PHASES[phase]
    cfg = lambda: load_config(None, [*TINY, *SMALL, "fl.rounds=3", "checkpoint.minutes=0", *sets])  # noqa: E731
    calls = {"n": 0, "rounds": [], "after_signal": 0}
    original = getattr(owner, name)

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == calls.get("stop_at"):
            signal.raise_signal(signal.SIGTERM)
            calls["after_signal"] += 1  # the handler raised: never reached
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    monkeypatch.setattr(job, "_RoundOutputs", _counting_rounds(calls))
    job.train(cfg(), tmp_path / "whole")
    per_round = calls["rounds"]  # the calls made by the end of each round
    calls.update(n=0, rounds=[], stop_at=per_round[1] if when == "round 2" else per_round[-1] + 1)
    with pytest.raises(Interrupted):
        job.train(cfg(), tmp_path / "stopped")
    assert calls["after_signal"] == 0 and calls["n"] == calls["stop_at"]  # nothing ran on after the signal
    assert not (tmp_path / "stopped" / "summary.json").exists()
    saved = torch.load(tmp_path / "stopped" / job.CHECKPOINT, weights_only=True)
    assert saved["simulator"]["round"] == resumes_after
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    calls["stop_at"] = None
    summary = job.train(cfg(), tmp_path / "stopped")
    assert summary["resumed_after_rounds"] == [resumes_after]
    expected, resumed = _summary_and_metrics(tmp_path / "whole"), _summary_and_metrics(tmp_path / "stopped")
    assert resumed[0] == expected[0]
    pd.testing.assert_frame_equal(resumed[1], expected[1])


def _counting_rounds(calls):
    """job._RoundOutputs that also notes how many calls were made by the end of each round."""
    class Counting(job._RoundOutputs):
        def __call__(self, rec):
            calls["rounds"].append(calls["n"])
            super().__call__(rec)
    return Counting


def test_no_checkpoint_is_taken_of_a_round_trained_and_not_yet_scored():
    sim = Simulator(load_config(None, TINY))
    sim.scoring_round = 1
    with pytest.raises(RuntimeError, match="round 1 is trained and not yet scored"):
        sim.state_dict()


def test_a_signal_during_a_runs_last_writes_stops_the_jobs_next_run(tmp_path, monkeypatch):
    """The first run's summary is written when SIGTERM comes (no phase left to stop): that run stays
    finished, and the job stops instead of training its next run as if nothing had come."""
    finish = job._finish_tracking
    calls = {"n": 0}

    def finish_then_signal(*args, **kwargs):
        finish(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(job, "_finish_tracking", finish_then_signal)
    runs = [(read_run(None, [*TINY, *SMALL, "fl.rounds=1", f"seed={s}"]), tmp_path / f"run{s}", None) for s in (0, 1)]
    with pytest.raises(Interrupted):
        job.train_runs(runs, hold_signals=True)
    assert (tmp_path / "run0" / "summary.json").exists() and not (tmp_path / "run1" / "summary.json").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
