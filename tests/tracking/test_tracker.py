"""The Tracker: one run directory is one MLflow run (a resume and a re-run continue it), the
version tags of the machine that trains it, and what a run sends to MLflow each round.

What a run sends each round is what it writes to metrics.csv: one channel (job.on_round) for the
loop's metrics, the extra training losses and a method's diagnostics. Those tests use no MLflow
store: the job's Tracker is replaced by a stand-in that records its calls, and the real Tracker's
log_metrics is given a client stand-in that records its batches.
"""

import logging
import math

import pandas as pd
import pytest

from fedfactor.run import job
from fedfactor.config import TrackingConfig, load_config
from fedfactor.tracking import Tracker, run_identity

from ..conftest import TINY
from .conftest import STEPS, VERSION_TAGS, VERSIONS, _client, _runs, _steps, _warnings


@pytest.mark.slow
def test_one_run_directory_is_one_mlflow_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = TrackingConfig(uri=uri, experiment="resume")
    run_dir = tmp_path / "run"
    params = {"seed": 3, "long": "y" * 7000}
    summary = {"accuracy": 0.5, "bytes_up": 100.0}

    first = Tracker(cfg, run_dir, params, {"method": "fedavg"}, "a/fedavg/seed3")
    for step in range(1, 6):
        first.log_metrics({"bytes_up": step * 10, "loss": float("nan"), "acc": step / 10}, step=step)
    first.end("KILLED")
    (run,) = _runs(uri, "resume")
    assert run.info.status == "KILLED" and run.info.run_id == first.run_id

    second = Tracker(cfg, run_dir, params, {"method": "fedavg"}, "a/fedavg/seed3")  # the resume
    assert second.active and second.run_id == first.run_id and second.previous_status == "KILLED"
    for step in range(1, STEPS + 1):
        second.log_metrics({"bytes_up": step * 10, "loss": float("nan"), "acc": step / 10}, step=step)
    second.finish(summary, [])

    third = Tracker(cfg, run_dir, params, {"method": "fedavg"}, "a/fedavg/seed3")  # a re-run
    assert third.run_id == first.run_id and third.previous_status == "FINISHED"
    third.finish(summary, [])  # identical final values are not logged again

    (run,) = _runs(uri, "resume")
    assert run.info.status == "FINISHED"
    assert _steps(uri, run.info.run_id) == list(range(1, STEPS + 1))
    assert _steps(uri, run.info.run_id, "acc") == list(range(1, STEPS + 1))
    assert _steps(uri, run.info.run_id, "loss") == []  # NaN dropped
    assert len(_client(uri).get_metric_history(run.info.run_id, "final_accuracy")) == 1
    assert run.data.params["seed"] == "3" and len(run.data.params["long"]) == 6000


def test_versions_are_tags_named_fedfactor_version_and_a_damaged_summarys_are_left_out(tmp_path):
    from fedfactor.config import load_config

    cfg = load_config(None, ["tracking.enabled=false"])
    _, tags, _ = run_identity(cfg, tmp_path, {**VERSIONS, "bad name!": "x", "": "y"})
    assert {k: v for k, v in tags.items() if k.startswith("fedfactor.version.")} == VERSION_TAGS
    for junk in (None, "2.0.0", ["torch"]):  # an older summary has none; a damaged one anything
        _, tags, _ = run_identity(cfg, tmp_path, junk)
        assert not any(k.startswith("fedfactor.version.") for k in tags)


@pytest.mark.slow
def test_a_run_resumed_on_another_machine_takes_its_version_tags(tmp_path, caplog):
    # MLflow params cannot change; tags can: the versions of the machine that finishes the run win.
    from fedfactor.config import load_config

    cfg = load_config(None, ["tracking.enabled=true", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                             "tracking.experiment=moved"])
    caplog.set_level(logging.WARNING, logger="fedfactor")
    first = Tracker(cfg.tracking, tmp_path / "run", *run_identity(cfg, tmp_path / "run", VERSIONS))
    first.end("KILLED")
    moved = {**VERSIONS, "torch": "2.14.1", "gpu": "NVIDIA H200"}
    second = Tracker(cfg.tracking, tmp_path / "run", *run_identity(cfg, tmp_path / "run", moved))
    assert second.active and second.run_id == first.run_id and not _warnings(caplog)
    second.finish({"accuracy": 0.5}, [])
    (run,) = _runs(cfg.tracking.uri, "moved")
    assert run.info.status == "FINISHED"
    assert run.data.tags["fedfactor.version.torch"] == "2.14.1"
    assert run.data.tags["fedfactor.version.gpu"] == "NVIDIA H200"


class RecordingTracker:
    """Stands in for tracking.Tracker in job.py: keeps every log_metrics call."""

    calls: list[tuple[dict, int]] = []

    def __init__(self, cfg, run_dir, params, tags, run_name):
        self.run_id, self.active = None, False
        RecordingTracker.calls = []

    def log_metrics(self, metrics, step):
        RecordingTracker.calls.append((dict(metrics), step))

    def finish(self, summary_metrics, files, status="FINISHED"):
        pass

    def end(self, status="FAILED"):
        pass


@pytest.mark.parametrize("method, extra", [
    ("fedavg", []),  # the loop's columns, test and validation scores
    ("fedprox", ["method.mu=0.01"]),  # an extra training loss: train_proximal
    ("factorized_fl_alpha", []),  # a method's diagnostics (similarities, matching)
])
def test_every_metrics_csv_column_goes_to_mlflow_at_its_round(tmp_path, monkeypatch, method, extra):
    """Catches: a metric no longer sent to MLflow (or one sent that metrics.csv lacks): the keys job.py
    logs per round, at step = round, are the columns of metrics.csv less `round`, with its values."""
    monkeypatch.setattr(job, "Tracker", RecordingTracker)
    cfg = load_config(None, [*TINY, "model.name=mlp", "fl.rounds=2", f"method.name={method}", *extra])
    job.train(cfg, tmp_path / "run")
    table = pd.read_csv(tmp_path / "run" / "metrics.csv")
    calls = RecordingTracker.calls
    assert [step for _, step in calls] == table["round"].tolist() == [1, 2]
    columns = set(table.columns) - {"round"}
    assert {"train_loss", "bytes_up", "accuracy_mean", "val_accuracy_mean", "skipped_clients"} <= columns
    for (logged, step), (_, row) in zip(calls, table.iterrows(), strict=True):
        assert set(logged) == columns, step
        for key, value in logged.items():
            assert (math.isnan(value) and math.isnan(row[key])) or value == pytest.approx(row[key], rel=1e-9), key
    if method == "fedprox":
        assert "train_proximal" in columns
    if method == "factorized_fl_alpha":
        assert {"matched_clients_mean", "similarity_max_other"} <= columns


class RecordingClient:
    def __init__(self):
        self.batches = []

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.batches.append((run_id, list(metrics)))


def test_the_tracker_logs_every_finite_metric_of_a_round_at_its_step(tmp_path):
    """Catches: Tracker.log_metrics dropping or renaming metrics (only NaN may be left out) or logging
    them at another step than the round."""
    tracker = Tracker(TrackingConfig(enabled=False), tmp_path, {}, {}, "run")
    client = tracker._client = RecordingClient()
    tracker.run_id, tracker.active = "0" * 32, True
    row = {f"metric_{i}": float(i) for i in range(1500)}  # more than one batch (1000 metrics)
    row.update(train_loss=0.5, val_loss=float("nan"), skipped_clients=0)
    tracker.log_metrics(row, step=3)
    sent = [m for run_id, metrics in client.batches for m in metrics if run_id == "0" * 32]
    assert {m.key: m.value for m in sent} == {k: v for k, v in row.items() if not math.isnan(v)}
    assert {m.step for m in sent} == {3}
    tracker.log_metrics(row, step=3)  # a step the run holds is not logged twice
    assert sum(len(metrics) for _, metrics in client.batches) == len(sent)
