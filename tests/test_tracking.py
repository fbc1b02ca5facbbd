"""The MLflow mirror: parallel writers on a fresh and an existing store, a store killed while it
was made, one run per run directory, a store that cannot be reached, and `mlflow-import` of the
files later (and of damaged ones)."""

import hashlib
import json
import logging
import multiprocessing as mp
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from fedfactor import tracking
from fedfactor.config import TrackingConfig
from fedfactor.errors import UsageError
from fedfactor.io import exclusive_lock
from fedfactor.tracking import Tracker, import_runs, init_store, run_identity

from .conftest import write_content

STEPS = 10


def _client(uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri, experiment):
    from mlflow.entities import ViewType

    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=100)


def _steps(uri, run_id, key="bytes_up"):
    return sorted(m.step for m in _client(uri).get_metric_history(run_id, key))


def _one_run(uri: str, run_dir: str, i: int) -> None:
    cfg = TrackingConfig(uri=uri, experiment="parallel")
    tracker = Tracker(cfg, run_dir, {"index": i, "nested.key": "x" * 10}, {"worker": str(i)}, f"run{i}")
    assert tracker.active
    for step in range(1, STEPS + 1):
        tracker.log_metrics({"accuracy_mean": i + step / 100, "bytes_up": step * 10}, step=step)
    tracker.finish({"accuracy_mean": i + STEPS / 100}, [])


def _check_parallel_runs(uri, run_dirs):
    runs = _runs(uri, "parallel")
    assert sorted(r.data.params["index"] for r in runs) == sorted(str(i) for i in range(len(run_dirs)))
    for r in runs:
        assert r.info.status == "FINISHED"
        i = int(r.data.params["index"])
        assert _steps(uri, r.info.run_id, "accuracy_mean") == list(range(1, STEPS + 1))
        assert r.data.metrics["final_accuracy_mean"] == i + STEPS / 100
        state = json.loads((run_dirs[i] / "mlflow.json").read_text())
        assert r.data.tags["fedfactor.run_key"] == state["run_key"]
        assert state["run_ids"] == {uri: r.info.run_id}


@pytest.mark.slow
def test_parallel_jobs_on_a_fresh_and_an_existing_store_keep_every_run_and_step(tmp_path):
    # The fresh store's jobs race to make it and the experiment; the existing store's jobs race to
    # create the experiment. Opening a complete store takes no lock: this test holds the existing
    # store's lock all along, and its jobs must not wait for it.
    fresh, existing = f"sqlite:///{tmp_path}/fresh/mlflow.db", f"sqlite:///{tmp_path}/existing/mlflow.db"
    init_store(existing, "other")
    dirs = {uri: [tmp_path / name / f"run{i}" for i in range(4)] for name, uri in (("fresh", fresh), ("existing", existing))}
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_one_run, args=(uri, str(d), i)) for uri, ds in dirs.items() for i, d in enumerate(ds)]
    with exclusive_lock(tmp_path / "existing" / "mlflow.db.lock"):
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
    assert [p.exitcode for p in procs] == [0] * len(procs)

    for uri, run_dirs in dirs.items():
        _check_parallel_runs(uri, run_dirs)
    exp_id = init_store(fresh, "parallel")
    assert init_store(fresh, "parallel") == exp_id  # idempotent: the workflow may run it again
    assert not _client(fresh).search_runs(["0"])  # nothing filed under "Default"
    assert not list(tmp_path.glob("*/mlflow.db.new-*"))


# -- a store killed while it was made, or damaged ---------------------------------------------------

# Runs `how` ("in place": MLflow's own first-connection migration, as fedfactor did before, or
# "init_store") and SIGKILLs itself at the n-th statement that writes (a migration has ~440).
_KILLED_AT = """
import os, signal, sys
import sqlalchemy
from sqlalchemy import event

uri, how, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
writes = 0

@event.listens_for(sqlalchemy.engine.Engine, "after_cursor_execute")
def _kill(conn, cursor, statement, *args):
    global writes
    if statement.lstrip().upper().startswith(("CREATE", "ALTER", "DROP", "INSERT", "UPDATE")):
        writes += 1
        if writes == n:
            os.kill(os.getpid(), signal.SIGKILL)

if how == "in place":
    from mlflow.store.db.utils import _initialize_tables
    _initialize_tables(sqlalchemy.create_engine(uri))
else:
    from fedfactor.tracking import init_store
    init_store(uri, "kill")
"""


def _killed_at(uri, how, n):
    proc = subprocess.run([sys.executable, "-c", _KILLED_AT, uri, how, str(n)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def _logs_every_step(uri, run_dir):
    tracker = Tracker(TrackingConfig(uri=uri, experiment="kill"), run_dir, {"a": 1}, {}, "r")
    assert tracker.active
    for step in range(1, 4):
        tracker.log_metrics({"bytes_up": step}, step=step)
    tracker.finish({"accuracy": 0.5}, [])
    (run,) = _runs(uri, "kill")
    assert run.info.status == "FINISHED" and _steps(uri, run.info.run_id) == [1, 2, 3]


# 3: a few tables, no alembic_version yet; 272: mid-way through a migration step, after which
# MLflow's own migration fails for good ("table _alembic_tmp_experiments already exists")
@pytest.mark.parametrize("n", [3, 272])
@pytest.mark.slow
def test_a_store_killed_while_migrated_in_place_is_set_aside_and_made_again(tmp_path, caplog, n):
    caplog.set_level(logging.WARNING, logger="fedfactor")
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    _killed_at(uri, "in place", n)
    assert db.exists()
    _logs_every_step(uri, tmp_path / "run")
    (aside,) = (p for p in tmp_path.glob("mlflow.db.broken-*") if not p.name.endswith("journal"))
    assert not list(tmp_path.glob("mlflow.db-journal"))  # moved with it: SQLite would replay it into the new one
    (warning,) = _warnings(caplog)
    assert str(db) in warning.getMessage() and str(aside) in warning.getMessage()
    assert "held no runs" in warning.getMessage()


@pytest.mark.parametrize("n", [200, 439])  # 439: creating the experiment, after the migration
@pytest.mark.slow
def test_a_kill_while_the_store_is_made_leaves_no_store_and_the_next_job_makes_it(tmp_path, caplog, n):
    caplog.set_level(logging.WARNING, logger="fedfactor")
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    _killed_at(uri, "init_store", n)
    assert not db.exists() and list(tmp_path.glob("mlflow.db.new-*"))  # only the temporary
    _logs_every_step(uri, tmp_path / "run")
    assert not list(tmp_path.glob("mlflow.db.new-*")) and not list(tmp_path.glob("*.broken-*"))
    assert not _warnings(caplog)


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_store_with_runs_is_never_moved_or_changed(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tracking, "RETRY_SECONDS", 0.3)
    caplog.set_level(logging.WARNING, logger="fedfactor")
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    _logs_every_step(uri, tmp_path / "run")
    with sqlite3.connect(db) as con:  # as an interrupted upgrade of MLflow leaves it
        con.execute("DROP TABLE secrets")
    digest = _sha256(db)
    caplog.clear()
    _no_ops(Tracker(TrackingConfig(uri=uri, experiment="kill"), tmp_path / "run2", {"a": 1}, {}, "r"))
    (warning,) = _warnings(caplog)
    assert "holds 1 run but its schema is incomplete or old" in warning.getMessage()
    assert f"mlflow db upgrade {uri}" in warning.getMessage()
    with pytest.raises(UsageError, match="holds 1 run but"):
        init_store(uri, "kill")
    assert _sha256(db) == digest and sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == \
        ["mlflow.db", "mlflow.db.lock"]

    db.write_bytes(b"not a database, but maybe someone's" * 100)
    digest = _sha256(db)
    with pytest.raises(UsageError, match="is not a SQLite database.*left as it is"):
        init_store(uri, "kill")
    assert _sha256(db) == digest


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


# a summary's "versions": the machine a run trained on, which is not the one that imports it
VERSIONS = {"torch": "2.0.0", "cpu": "Some CPU @ 1 GHz", "torch_threads": 4}
VERSION_TAGS = {"fedfactor.version.torch": "2.0.0", "fedfactor.version.cpu": "Some CPU @ 1 GHz",
                "fedfactor.version.torch_threads": "4"}


def _make_run_dir(path, rounds=3, method="fedavg", seed=0):
    from fedfactor.config import load_config

    cfg = load_config(None, [f"method.name={method}", f"seed={seed}", "scenario=imp", "tracking.enabled=false"])
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    rows = ["round,bytes_up,accuracy_mean"] + [f"{r},{r * 100},{r / 10}" for r in range(1, rounds + 1)]
    (path / "metrics.csv").write_text("\n".join(rows) + "\n")
    summary = {"scenario": "imp", "method": method, "seed": seed, "dataset": cfg.data.name,
               "accuracy": 0.3, "accuracy_mean": 0.3, "accuracy_std": 0.01, "accuracy_weighted": 0.31,
               "accuracy_best_mean": 0.3, "accuracy_best_weighted": 0.31, "accuracy_at_best_val": None,
               "bytes_up": rounds * 100, "bytes_down": 50, "wall_seconds": 1.5, "versions": VERSIONS}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "diagnostics" / "x").mkdir(parents=True)
    (path / "diagnostics" / "x" / "round_0001.npy").write_bytes(b"not really npy")
    return path


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


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "fedfactor" and r.levelno == logging.WARNING]


def _no_ops(tracker):
    assert not tracker.active and tracker.run_id is None
    tracker.log_metrics({"bytes_up": 1.0}, step=1)
    tracker.finish({"accuracy": 0.5}, [])
    tracker.end("KILLED")


@pytest.mark.slow
def test_unreachable_store_warns_once_then_import_loads_the_files(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tracking, "RETRY_SECONDS", 0.3)
    caplog.set_level(logging.WARNING, logger="fedfactor")
    run_dir = tmp_path / "runs" / "imp" / "fedavg" / "seed0"

    # A store path under a regular file: it can never be created.
    (tmp_path / "not_a_dir").write_text("")
    bad = f"sqlite:///{tmp_path}/not_a_dir/mlflow.db"
    start = time.monotonic()
    tracker = Tracker(TrackingConfig(uri=bad), run_dir, {"a": 1}, {}, "r")
    _no_ops(tracker)
    assert time.monotonic() - start < 10
    (warning,) = _warnings(caplog)
    assert bad in warning.getMessage() and f"fedfactor mlflow-import {run_dir}" in warning.getMessage()

    # A database another connection holds under an exclusive lock the whole time.
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    holder = sqlite3.connect(tmp_path / "store" / "mlflow.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    caplog.clear()
    tracker = Tracker(TrackingConfig(uri=uri, experiment="imp"), run_dir, {"a": 1}, {}, "r")
    _no_ops(tracker)
    (warning,) = _warnings(caplog)
    assert "unreachable" in warning.getMessage() and "locked" in warning.getMessage()
    holder.execute("ROLLBACK")
    holder.close()

    # The training's files, complete; the store reachable again.
    _make_run_dir(run_dir)
    with pytest.raises(UsageError, match="unreachable"):
        import_runs([tmp_path / "runs"], bad, "imp")
    assert import_runs([tmp_path / "runs"], uri, "imp") == [(run_dir, "imported")]
    (run,) = _runs(uri, "imp")
    assert run.info.status == "FINISHED" and run.info.run_name == "imp/fedavg/seed0"
    assert {k: run.data.tags[k] for k in ("method", "scenario", "seed", "out")} == \
        {"method": "fedavg", "scenario": "imp", "seed": "0", "out": str(run_dir.resolve())}
    assert {k: v for k, v in run.data.tags.items() if k.startswith("fedfactor.version.")} == VERSION_TAGS
    # params describe the result: where it is mirrored and checkpointed is no param
    assert run.data.params["fl.rounds"] == "50" and not any(k.startswith(("tracking.", "checkpoint.")) for k in run.data.params)
    assert _steps(uri, run.info.run_id) == [1, 2, 3]
    assert run.data.metrics["final_wall_seconds"] == 1.5 and "final_accuracy_at_best_val" not in run.data.metrics
    artifacts = {a.path for a in _client(uri).list_artifacts(run.info.run_id)}
    assert artifacts == {"summary.json", "metrics.csv", "config.yaml", "diagnostics"}

    assert import_runs([run_dir, tmp_path / "runs"], uri, "imp") == [(run_dir, "unchanged")]
    assert len(_runs(uri, "imp")) == 1
    assert _steps(uri, run.info.run_id) == [1, 2, 3]


@pytest.mark.slow
def test_import_completes_an_unfinished_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    from fedfactor.config import load_config
    from fedfactor.tracking import run_identity

    run_dir = _make_run_dir(tmp_path / "run", rounds=4)
    cfg = load_config(run_dir / "config.yaml")
    cfg.tracking = cfg.tracking.model_copy(update={"enabled": True, "uri": uri, "experiment": "imp"})
    tracker = Tracker(cfg.tracking, run_dir, *run_identity(cfg, run_dir))  # training killed at round 2
    for r in (1, 2):
        tracker.log_metrics({"bytes_up": r * 100, "accuracy_mean": r / 10}, step=r)
    tracker.end("KILLED")
    assert import_runs([run_dir], uri, "imp") == [(run_dir, "completed")]
    (run,) = _runs(uri, "imp")
    assert run.info.status == "FINISHED" and _steps(uri, run.info.run_id) == [1, 2, 3, 4]


@pytest.mark.slow
def test_import_rejects_bad_paths_and_partial_runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(UsageError, match="missing_dir.*does not exist"):
        import_runs([tmp_path / "missing_dir"], uri, "e")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="empty holds no run"):
        import_runs([tmp_path / "empty"], uri, "e")
    good = _make_run_dir(tmp_path / "runs" / "good")
    bad = _make_run_dir(tmp_path / "runs" / "bad")
    (bad / "summary.json").write_text('{"accuracy": 0.3,')
    with pytest.raises(UsageError, match="bad/summary.json"):
        import_runs([tmp_path / "runs"], uri, "e")
    (bad / "summary.json").write_text("{}")
    (bad / "config.yaml").unlink()
    with pytest.raises(UsageError, match="bad/config.yaml"):
        import_runs([good, bad], uri, "e")
    assert not (tmp_path / "mlflow.db").exists()  # every directory is checked before any write


JUNK = bytes(range(256)) * 4
DAMAGE = {  # file -> (what it holds, None: a folder; what the error says)
    "summary truncated": ("summary.json", '{"accuracy": 0.3,', "not readable JSON"),
    "summary empty": ("summary.json", "", "not readable JSON"),
    "summary junk": ("summary.json", JUNK, "not readable JSON"),
    "summary not an object": ("summary.json", "[0.3]", "must hold a JSON object"),
    "summary a folder": ("summary.json", None, "is not a file"),
    "summary text for a number": ("summary.json", '{"accuracy": "high"}', 'accuracy is "high", not a number'),
    "metrics empty": ("metrics.csv", "", "not a readable CSV"),
    "metrics junk": ("metrics.csv", JUNK, "not a readable CSV"),
    "metrics a folder": ("metrics.csv", None, "not a readable CSV"),
    "metrics header only": ("metrics.csv", "round,bytes_up\n", "holds no round"),
    "metrics without round": ("metrics.csv", "bytes_up\n1\n", "has no 'round' column"),
    "metrics round not a number": ("metrics.csv", "round,bytes_up\none,1\n", "round column holds something other"),
    "metrics round a fraction": ("metrics.csv", "round,bytes_up\n1.5,1\n", "round column holds something other"),
    "metrics round negative": ("metrics.csv", "round,bytes_up\n-1,1\n", "round column holds something other"),
    "metrics round past int64": ("metrics.csv", "round,bytes_up\n1e30,1\n", "round column holds something other"),
    "metrics round twice": ("metrics.csv", "round,bytes_up\n1,1\n1,2\n", "holds round 1 twice"),
    "metrics row too long": ("metrics.csv", "round,bytes_up\n1,1,5,6\n", "more fields than the header"),
    "metrics column twice": ("metrics.csv", "round,loss,loss\n1,1,2\n", "'loss' as a column name twice"),
    "metrics text for a number": ("metrics.csv", "round,bytes_up\n1,many\n", "'bytes_up' holds something other"),
    "metrics bad metric name": ("metrics.csv", "round,../up\n1,1\n", "no MLflow metric name"),
    "config empty": ("config.yaml", "", "is empty"),
    "config junk": ("config.yaml", JUNK, "config.yaml"),
    "config a folder": ("config.yaml", None, "is not a file"),
    "config not a mapping": ("config.yaml", "[1, 2]", "config.yaml"),
    "mlflow.json junk": ("mlflow.json", JUNK, "not readable JSON"),
    "mlflow.json empty": ("mlflow.json", "", "not readable JSON"),
    "mlflow.json without key": ("mlflow.json", '{"run_key": "x"}', "holds no run key"),
    "mlflow.json a folder": ("mlflow.json", None, "not readable JSON"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_import_of_a_damaged_run_names_the_file_and_imports_nothing(tmp_path, case):
    name, content, message = DAMAGE[case]
    _make_run_dir(tmp_path / "runs" / "a_good")
    bad = _make_run_dir(tmp_path / "runs" / "bad")
    target = bad / name
    if content is None:  # a folder where the file goes
        target.unlink(missing_ok=True)
        target.mkdir()
    else:
        write_content(target, content)
    with pytest.raises(UsageError) as e:
        import_runs([tmp_path / "runs"], f"sqlite:///{tmp_path}/mlflow.db", "e")
    assert str(target) in str(e.value) and message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "mlflow.db").exists()  # every folder is checked before anything is written
    assert name == "mlflow.json" or not (bad / "mlflow.json").exists()


def test_import_refuses_two_folders_of_one_run(tmp_path):
    a = _make_run_dir(tmp_path / "runs" / "a")
    (a / "mlflow.json").write_text(json.dumps({"run_key": "0" * 32, "run_ids": {}}))
    shutil.copytree(a, tmp_path / "runs" / "copy")
    with pytest.raises(UsageError, match="runs/a and .*runs/copy hold the same run key"):
        import_runs([tmp_path / "runs"], f"sqlite:///{tmp_path}/mlflow.db", "e")
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_experiments_are_filed_as_model_training_not_genai(tmp_path):
    # MLflow 3's UI opens an experiment by its kind tag; untagged ones may open in the GenAI (traces)
    # view, where training runs look absent.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    created = init_store(uri, "fresh")
    client = _client(uri)
    assert client.get_experiment(created).tags["mlflow.experimentKind"] == "custom_model_development"
    # a store made before the tag gets it on the next init; a kind a user picked in the UI stays
    old = client.create_experiment("old")
    picked = client.create_experiment("picked", tags={"mlflow.experimentKind": "genai_development"})
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    assert init_store(uri, "old") == old and init_store(uri, "picked") == picked
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_experiment(picked).tags["mlflow.experimentKind"] == "genai_development"
