"""The guard around store calls: a store that cannot be reached warns once and tracking goes off
in seconds, training goes on, and `mlflow-import` loads the run's files once the store is back."""

import logging
import sqlite3
import time

import pytest

from fedfactor.config import TrackingConfig
from fedfactor.errors import UsageError
from fedfactor.tracking import Tracker, import_runs, retry

from .conftest import VERSION_TAGS, _client, _make_run_dir, _no_ops, _runs, _steps, _warnings


@pytest.mark.slow
def test_unreachable_store_warns_once_then_import_loads_the_files(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(retry, "RETRY_SECONDS", 0.3)
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
