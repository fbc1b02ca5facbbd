"""Results added to the MLflow run of a finished run directory (`fedfactor diagnose`): `log_to_run`
finds that run and adds metrics, tags and files to it, creating nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .retry import _retry, _Unreachable
from .store import _HTTP_DEFAULTS, _client, _inspect, _local_path, _mlflow
from .tracker import _METRIC_BATCH, RUN_KEY_TAG, STATE_FILE, _number



def _read_state(run_dir: Path) -> dict:
    """The directory's mlflow.json as it is ({} when missing or unreadable); never written here."""
    try:
        state = json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _get_run(client, run_id: str):
    """The run `run_id`, or None when the store has no such run (no retry for that answer)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def log_to_run(run_dir: Path, uri: str, metrics: dict[str, float], tags: dict[str, str] | None = None,
               artifacts: Path | None = None, artifact_path: str = "diagnostics",
               run_id: str | None = None) -> tuple[str, str]:
    """Add metrics (step 0), tags and the files of the folder `artifacts` (under `artifact_path`)
    to the existing MLflow run of the finished run directory `run_dir` in the store `uri`.

    The run is the one whose id summary.json (`run_id`) or mlflow.json names, checked against the
    directory's run key; failing those, the run carrying that key in any active experiment. Nothing
    is created: not a store, not a run. Metrics the run already holds with the same value are not
    logged again. Never raises for a store problem; returns (outcome, detail): ("logged", run id),
    ("no run", why) or ("unreachable", why), the caller warns.
    """
    state = _read_state(run_dir)
    key = state.get("run_key") if isinstance(state.get("run_key"), str) else None
    run_ids = state.get("run_ids")
    known = run_ids if isinstance(run_ids, dict) else {}
    candidates = list(dict.fromkeys(r for r in (known.get(uri), run_id, *known.values()) if isinstance(r, str) and r))
    if not candidates and key is None:
        return "no run", "trained without MLflow tracking (no run id in summary.json or mlflow.json)"
    path = _local_path(uri)
    if path is not None and not path.exists():
        return "no run", f"there is no MLflow store at {path}"
    if uri.startswith(("http://", "https://")):
        for k, v in _HTTP_DEFAULTS.items():
            os.environ.setdefault(k, v)
    mlflow = _mlflow()
    Metric, RunTag = mlflow.entities.Metric, mlflow.entities.RunTag

    def ours(run) -> bool:
        return run is not None and run.info.lifecycle_stage == "active" and (
            key is None or run.data.tags.get(RUN_KEY_TAG) == key)

    def find():
        for rid in candidates:
            run = _get_run(client, rid)
            if ours(run):
                return run
        if key is None:
            return None
        experiments = client.search_experiments(view_type=mlflow.entities.ViewType.ACTIVE_ONLY)
        if not experiments:
            return None
        found = client.search_runs([e.experiment_id for e in experiments],
                                   filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                                   run_view_type=mlflow.entities.ViewType.ACTIVE_ONLY, max_results=1,
                                   order_by=["attributes.start_time ASC"])
        return found[0] if found else None

    try:
        if path is not None and uri.startswith("sqlite:"):
            health = _retry(lambda: _inspect(path)[0])
            if health != "complete":  # MLflow would migrate it in place: leave that to a training job
                return "unreachable", f"MLflow store {uri}: {health}"
        client = _retry(lambda: _client(uri))
        run = _retry(find)
        if run is None:
            return "no run", f"the MLflow store {uri} holds no run of {run_dir}"
        rid = run.info.run_id
        now = int(time.time() * 1000)
        latest = run.data.metrics
        batch = [Metric(k, x, now, 0) for k, v in metrics.items()
                 if (x := _number(v)) is not None and latest.get(k) != x]
        for i in range(0, len(batch), _METRIC_BATCH):
            # mypy cannot infer a lambda with default arguments (python/mypy#12557)
            _retry(lambda chunk=batch[i : i + _METRIC_BATCH]:  # type: ignore[misc]
                   client.log_batch(rid, metrics=chunk))
        if tags:
            _retry(lambda: client.log_batch(rid, tags=[RunTag(k, str(v)) for k, v in tags.items()]))
        if artifacts is not None and Path(artifacts).is_dir() and any(Path(artifacts).iterdir()):
            _retry(lambda: client.log_artifacts(rid, str(artifacts), artifact_path=artifact_path))
    except _Unreachable as e:
        return "unreachable", f"MLflow store {uri} unreachable ({e})"
    return "logged", rid
