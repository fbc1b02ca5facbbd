"""The live MLflow run of a training job (`Tracker`) and what identifies it (`run_identity`).

One run directory is one MLflow run. The directory holds `mlflow.json` with a random run key; the
MLflow run carries it as the tag `fedfactor.run_key`. Opening a directory again (a resume, a re-run,
an import) continues that run instead of adding one, and skips the steps the store already has.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..config import TrackingConfig
from ..io import atomic_write_json
from .retry import _one_line, _retry, _Unreachable
from .store import _mlflow, _open_store

log = logging.getLogger("fedfactor")

STATE_FILE = "mlflow.json"
RUN_KEY_TAG = "fedfactor.run_key"
VERSION_TAG = "fedfactor.version"  # + "." + a name of the summary's "versions": fedfactor.version.torch
STEP_METRIC = "bytes_up"  # logged by every round: its steps are the steps a run already holds
FINAL_KEYS = ("accuracy", "accuracy_mean", "accuracy_std", "accuracy_weighted", "accuracy_best_mean",
              "accuracy_best_weighted", "accuracy_at_best_val", "bytes_up", "bytes_down", "wall_seconds")
RUN_FILES = ("summary.json", "metrics.csv", "config.yaml", "diagnostics")
_PARAM_BATCH = 100  # MLflow caps a log_batch at 100 params ...
_METRIC_BATCH = 1000  # ... and 1000 metrics
_PARAM_CHARS = 6000


def _param_value(v: Any) -> str:
    s = str(v)
    return s if len(s) <= _PARAM_CHARS else s[: _PARAM_CHARS - 3] + "..."


def _number(v: Any) -> float | None:
    """v as a float for a metric; None for NaN and for what is not a number."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _is_key(key: Any) -> bool:
    return isinstance(key, str) and len(key) == 32 and all(c in "0123456789abcdef" for c in key)


def _run_key(run_dir: Path) -> dict:
    """The directory's mlflow.json ({"run_key", "run_ids"}), created atomically the first time."""
    path = run_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        state = None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        log.warning("%s is unreadable (%s): a new MLflow run starts for %s", path, _one_line(e), run_dir)
        state = None
    if not (isinstance(state, dict) and _is_key(state.get("run_key"))):
        state = {"run_key": uuid.uuid4().hex, "run_ids": {}}
        atomic_write_json(path, state)
    if not isinstance(state.get("run_ids"), dict):
        state["run_ids"] = {}
    return state


def _version_tags(versions: Any) -> dict[str, str]:
    """`fedfactor.version.<name>` tags of a summary's "versions". Tags, not params: a run resumed on
    another machine continues its MLflow run, and params cannot change. An imported summary is
    whatever the file holds: only names MLflow takes are kept, and nothing from what is no mapping."""
    if not isinstance(versions, dict):
        return {}
    return {f"{VERSION_TAG}.{k}": _param_value(v) for k, v in versions.items()
            if isinstance(k, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", k)}


def run_identity(cfg, run_dir: Path, versions: Any = None) -> tuple[dict[str, Any], dict[str, str], str]:
    """(params, tags, run_name) of the MLflow run mirroring `run_dir`, trained with config `cfg`
    (a fedfactor.config.Config) on the software and machine `versions` describes (the summary's
    "versions"). The training job and `mlflow-import` both use this."""
    name = cfg.label or cfg.method["name"]
    tags = {"method": name, "method_name": cfg.method["name"], "dataset": cfg.data.name, "scenario": cfg.scenario,
            "seed": str(cfg.seed), "out": str(Path(run_dir).resolve()), **_version_tags(versions)}
    # Params describe the result; where it is mirrored and checkpointed is not part of it.
    from ..config import flatten

    return flatten(cfg.result_dict()), tags, f"{cfg.scenario}/{name}/seed{cfg.seed}"


class Tracker:
    """The MLflow run of one run directory: params at start, metrics per round, summary and files
    at the end. Store problems never raise: the tracker warns once and turns into a no-op.

    `active` is True while the run is open for logging; `run_id` is None when tracking is off.
    `previous_status` is the status the run had when it was found (None: created here).
    """

    def __init__(self, cfg: TrackingConfig, run_dir: Path, params: dict[str, Any], tags: dict[str, str],
                 run_name: str):
        self.uri = cfg.uri
        self.run_dir = Path(run_dir)
        self.run_id: str | None = None
        self.active = False
        self.previous_status: str | None = None
        self._client: Any = None  # an MlflowClient while the run is open (mlflow is untyped)
        self._steps: set[int] = set()  # steps the run holds: never logged twice
        if not cfg.enabled:
            return
        try:
            state = _run_key(self.run_dir)
        except OSError as e:
            self._give_up(f"MLflow run of {self.run_dir} not opened ({self.run_dir / STATE_FILE} cannot be "
                          f"written: {_one_line(e)})")
            return
        with self._guard():
            self._open(cfg, state, params, tags, cfg.run_name or run_name)

    # -- the guard ---------------------------------------------------------------------------

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except _Unreachable as e:
            self._give_up(f"MLflow store {self.uri} unreachable ({e})")

    def _give_up(self, problem: str) -> None:
        """Switch tracking off for good, with one warning."""
        self.active = False
        self.run_id = None
        log.warning("%s: training goes on without it; the run's files are complete: load them later with "
                    "`fedfactor mlflow-import %s`", problem, self.run_dir)

    def _continue(self, run) -> bool:
        """Whether to reopen a run found for this directory (the importer leaves finished ones)."""
        return True

    # -- opening -----------------------------------------------------------------------------

    def _open(self, cfg: TrackingConfig, state: dict, params: dict[str, Any], tags: dict[str, str],
              run_name: str) -> None:
        client, exp_id = _open_store(self.uri, cfg.experiment, cfg.experiment_id)
        mlflow = _mlflow()
        Param, RunTag = mlflow.entities.Param, mlflow.entities.RunTag
        key = state["run_key"]
        tags = {**{k: str(v) for k, v in tags.items()}, RUN_KEY_TAG: key}

        def find_or_create():
            # One unit, so a retry after a create whose answer was lost finds that run.
            found = client.search_runs([exp_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                                       run_view_type=mlflow.entities.ViewType.ACTIVE_ONLY,
                                       max_results=10, order_by=["attributes.start_time ASC"])
            if found:
                return found[0], False
            return client.create_run(exp_id, run_name=run_name, tags=tags), True

        run, created = _retry(find_or_create)
        run_id = run.info.run_id
        existing: dict[str, str] = {}
        if not created:
            self.previous_status = run.info.status
            if not self._continue(run):
                self.run_id = run_id
                return
            if run.info.status != "RUNNING":
                _retry(lambda: client.update_run(run_id, status="RUNNING"))
            existing = dict(run.data.params)
            history = _retry(lambda: client.get_metric_history(run_id, STEP_METRIC))
            self._steps = {m.step for m in history}
            _retry(lambda: client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()]))
        values = {k: _param_value(v) for k, v in params.items()}
        changed = sorted(k for k, v in values.items() if k in existing and existing[k] != v)
        if changed:
            log.warning("MLflow run %s keeps its first values of %s (MLflow params cannot change); "
                        "the run's config.yaml has the new ones", run_id, ", ".join(changed[:5]) +
                        (f" and {len(changed) - 5} more" if len(changed) > 5 else ""))
        new = [Param(k, v) for k, v in sorted(values.items()) if k not in existing]
        for i in range(0, len(new), _PARAM_BATCH):
            # mypy cannot infer a lambda with default arguments (python/mypy#12557)
            _retry(lambda chunk=new[i : i + _PARAM_BATCH]: client.log_batch(run_id, params=chunk))  # type: ignore[misc]
        self._client, self.run_id, self.active = client, run_id, True
        if state["run_ids"].get(self.uri) != run_id:  # informational only: the tag is what counts
            state["run_ids"][self.uri] = run_id
            try:
                atomic_write_json(self.run_dir / STATE_FILE, state)
            except OSError:
                pass

    # -- logging -----------------------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log one step's metrics (NaN dropped); a step the run already holds is skipped."""
        if not self.active or step in self._steps:
            return
        Metric = _mlflow().entities.Metric
        now = int(time.time() * 1000)
        batch = [Metric(k, x, now, int(step)) for k, v in metrics.items() if (x := _number(v)) is not None]
        with self._guard():
            for i in range(0, len(batch), _METRIC_BATCH):
                # mypy cannot infer a lambda with default arguments (python/mypy#12557)
                _retry(lambda chunk=batch[i : i + _METRIC_BATCH]:  # type: ignore[misc]
                       self._client.log_batch(self.run_id, metrics=chunk))
            self._steps.add(step)

    def finish(self, summary_metrics: dict[str, float], files: list[Path], status: str = "FINISHED") -> None:
        """Log `final_<k>` metrics (unless the run already holds the same values), the files and
        folders as artifacts, and terminate the run with `status`."""
        if not self.active:
            return
        Metric = _mlflow().entities.Metric
        client, run_id = self._client, self.run_id
        now = int(time.time() * 1000)
        finals = {f"final_{k}": x for k, v in summary_metrics.items() if (x := _number(v)) is not None}
        with self._guard():
            latest = _retry(lambda: client.get_run(run_id)).data.metrics if finals else {}
            batch = [Metric(k, x, now, 0) for k, x in finals.items() if latest.get(k) != x]
            if batch:
                _retry(lambda: client.log_batch(run_id, metrics=batch))
            # mypy cannot infer a lambda with default arguments (python/mypy#12557)
            for f in map(Path, files):
                if f.is_dir():
                    _retry(lambda f=f: client.log_artifacts(run_id, str(f), artifact_path=f.name))  # type: ignore[misc]
                elif f.exists():
                    _retry(lambda f=f: client.log_artifact(run_id, str(f)))  # type: ignore[misc]
            _retry(lambda: client.set_terminated(run_id, status))
            self.active = False

    def end(self, status: str = "FAILED") -> None:
        """Terminate the run as "KILLED" or "FAILED" (training stopped early); never raises."""
        if not self.active:
            return
        self.active = False
        try:
            with self._guard():
                _retry(lambda: self._client.set_terminated(self.run_id, status))
        except Exception:  # _give_up only logs; anything else must not mask the job's own error
            pass
