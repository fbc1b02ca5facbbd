"""The store: parallel writers on a fresh and an existing store, a store killed while it was made,
one that holds runs never moved, and experiments filed as model training."""

import hashlib
import json
import logging
import multiprocessing as mp
import signal
import sqlite3
import subprocess
import sys

import pytest

from fedfactor.config import TrackingConfig
from fedfactor.errors import UsageError
from fedfactor.io import exclusive_lock
from fedfactor.tracking import Tracker, init_store, retry

from .conftest import STEPS, _client, _no_ops, _runs, _steps, _warnings


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
    monkeypatch.setattr(retry, "RETRY_SECONDS", 0.3)
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
