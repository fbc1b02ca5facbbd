"""MLflow mirror of a run. The only module that imports mlflow (lazily: the import costs ~1 s).

The run's own files (summary.json, metrics.csv) are the source of truth; MLflow mirrors them so
runs can be browsed and compared in its UI.

Parallel jobs and SQLite: many processes creating a fresh SQLite store at once race in its schema
migration, and concurrent `set_experiment` on a new name can file runs under "Default". So the
store and the experiment are created once (`init_store`, the workflow's `mlflow_init` rule) and
jobs pass `experiment_id` explicitly. Writes that still hit a locked database are retried.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, Callable

from .config import TrackingConfig

_RETRIES = 8


def _mlflow():
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    return mlflow


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def _retry(call: Callable[[], Any]) -> Any:
    """Retry on SQLite lock contention, with jittered backoff; other errors propagate."""
    for attempt in range(_RETRIES):
        try:
            return call()
        except Exception as e:  # mlflow wraps sqlalchemy's OperationalError in its own types
            if "locked" not in str(e).lower() or attempt == _RETRIES - 1:
                raise
            time.sleep(0.05 * 2**attempt * (1 + random.random()))


def _client(uri: str):
    path = _sqlite_path(uri)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return _mlflow().MlflowClient(tracking_uri=uri)


def init_store(uri: str, experiment: str) -> str:
    """Create the store and the experiment if needed; return the experiment id."""
    client = _client(uri)
    exp = _retry(lambda: client.get_experiment_by_name(experiment))
    if exp is not None:
        return exp.experiment_id
    path = _sqlite_path(uri)
    # Artifacts beside the database, so results/ holds the whole store.
    location = (path.parent / "mlartifacts").resolve().as_uri() if path is not None else None
    return _retry(lambda: client.create_experiment(experiment, artifact_location=location))


def _param_value(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 6000 else s[:5997] + "..."


class Tracker:
    """One MLflow run: params at start, metrics per evaluated round, summary and files at the end."""

    def __init__(self, cfg: TrackingConfig, params: dict[str, Any], tags: dict[str, str], run_name: str):
        self.enabled = cfg.enabled
        if not self.enabled:
            return
        self.client = _client(cfg.uri)
        # str(): `--set tracking.experiment_id=1` arrives as an int from the YAML reader
        exp_id = str(cfg.experiment_id) if cfg.experiment_id is not None else init_store(cfg.uri, cfg.experiment)
        self.run_id = _retry(lambda: self.client.create_run(exp_id, run_name=cfg.run_name or run_name, tags=tags)).info.run_id
        Param = _mlflow().entities.Param
        items = [Param(k, _param_value(v)) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            _retry(lambda chunk=items[i : i + 100]: self.client.log_batch(self.run_id, params=chunk))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not self.enabled:
            return
        Metric = _mlflow().entities.Metric
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items() if v == v]  # drop NaN
        _retry(lambda: self.client.log_batch(self.run_id, metrics=batch))

    def finish(self, summary_metrics: dict[str, float], files: list[Path], status: str = "FINISHED") -> None:
        if not self.enabled:
            return
        if summary_metrics:
            self.log_metrics({f"final_{k}": v for k, v in summary_metrics.items()})
        for f in files:
            if f.is_dir():
                _retry(lambda f=f: self.client.log_artifacts(self.run_id, str(f), artifact_path=f.name))
            else:
                _retry(lambda f=f: self.client.log_artifact(self.run_id, str(f)))
        _retry(lambda: self.client.set_terminated(self.run_id, status))

    def fail(self) -> None:
        if self.enabled:
            try:
                _retry(lambda: self.client.set_terminated(self.run_id, "FAILED"))
            except Exception:
                pass
