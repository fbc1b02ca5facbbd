"""MLflow mirror of a run. The only module that imports mlflow (lazily: the import costs ~1 s).

The run's own files (summary.json, metrics.csv, config.yaml) are the source of truth; MLflow mirrors
them so runs can be browsed and compared in its UI. Two rules follow from that:

Tracking never loses training. Every store call goes through one guard (`_retry`): any exception
is retried with jittered exponential backoff for up to RETRY_SECONDS; then the tracker logs one
warning, switches itself off and training goes on. `fedfactor mlflow-import` loads the files later.

One run directory is one MLflow run. The directory holds `mlflow.json` with a random run key; the
MLflow run carries it as the tag `fedfactor.run_key`. Opening a directory again (a resume, a re-run,
an import) continues that run instead of adding one, and skips the steps the store already has.
`log_to_run` adds later results (`fedfactor diagnose`) to that same run, creating nothing.

Parallel jobs and SQLite. MLflow migrates a SQLite store in place on a process's first connection
(SqlAlchemyStore.__init__ -> mlflow.store.db.utils._initialize_tables), with no lock of its own and
not in one transaction (pysqlite commits most DDL as it runs), so a kill mid-migration leaves tables
that every later migration trips over ("table _alembic_tmp_experiments already exists"). Hence:
- A fresh store is made in a temporary file beside the database (migrated, the experiment created),
  then renamed into place. Only that takes a lock: an exclusive `flock` on `<db>.lock`, held while
  the file is made and checked missing; the kernel drops it when its holder dies however it dies.
  `mlflow.db` is therefore either absent or complete, whenever a creator is killed.
- Every open first checks the schema without a lock (`_inspect`: tables and alembic revision, read
  with sqlite3). A complete store is opened by all jobs at once; SQLite's own locking and MLflow's
  busy timeout (20 s a statement, then `_retry`) serialise their writes. The journal stays
  SQLite's default: WAL measured no better (16 writers x 100 steps: no lock error either way, the
  same time) and needs write access for readers and a local file system.
- A half-made store that holds no runs (an older version's kill, an interrupted creation by MLflow
  itself) is set aside beside it, with a warning naming both files, and made again; one that holds
  runs is never moved or changed: tracking stops with the reason.
- Two jobs creating the same experiment: the loser gets RESOURCE_ALREADY_EXISTS (a unique name
  column) and takes the winner's. A file store checks names without such a constraint, so creating
  an experiment there happens under the lock.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import math
import os
import random
import re
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

from .config import TrackingConfig, sqlite_file
from .errors import UsageError
from .io import atomic_write_json, exclusive_lock

log = logging.getLogger("fedfactor")

T = TypeVar("T")

# Total seconds one store call may keep failing (retried with backoff) before the tracker gives up.
RETRY_SECONDS = 25.0
# Seconds a process waits for another one holding the store lock: making a store takes seconds,
# and over two minutes with 16 jobs starting on 2 busy cores.
LOCK_SECONDS = 600.0
# Seconds a sqlite3 connection here waits for another one's write (MLflow's own sessions: 20).
_BUSY_SECONDS = 20.0
_JOURNALS = ("-journal", "-wal", "-shm")
_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 4.0
# An unreachable tracking server must not stall a job for minutes (MLflow's defaults: 7 retries
# with backoff factor 2, 120 s timeout per request).
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

STATE_FILE = "mlflow.json"
RUN_KEY_TAG = "fedfactor.run_key"
VERSION_TAG = "fedfactor.version"  # + "." + a name of the summary's "versions": fedfactor.version.torch
STEP_METRIC = "bytes_up"  # logged by every round: its steps are the steps a run already holds
FINAL_KEYS = ("accuracy", "accuracy_mean", "accuracy_std", "accuracy_weighted", "accuracy_best_mean",
              "accuracy_best_weighted", "accuracy_at_best_val", "bytes_up", "bytes_down", "wall_seconds")
RUN_FILES = ("summary.json", "metrics.csv", "config.yaml", "diagnostics")
# MLflow 3 files an experiment under a kind, held by this tag (its UI's kind selector writes these
# values); an experiment without it may open in the GenAI view (traces), where training runs look
# absent. MLflow 3.17's UI follows its own GenAI / Model training switch instead (docs/mlflow.md).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
_PARAM_BATCH = 100  # MLflow caps a log_batch at 100 params ...
_METRIC_BATCH = 1000  # ... and 1000 metrics
_PARAM_CHARS = 6000


class _Unreachable(Exception):
    """A store call still failing after the retries; its message is the one-line reason."""


class _Fatal(Exception):
    """A store problem that no retry fixes (a deleted experiment): give up at once."""


def _mlflow():
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    return mlflow


def _one_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _retry(call: Callable[[], T]) -> T:
    """The guard around every store call: retry any exception with jittered exponential backoff
    until RETRY_SECONDS have passed, then raise _Unreachable with the last error as one line."""
    deadline = time.monotonic() + RETRY_SECONDS
    delay = _BACKOFF_FIRST
    while True:
        try:
            return call()
        except _Fatal as e:
            raise _Unreachable(str(e)) from e
        except Exception as e:  # a locked database, a refused connection, a half-migrated schema...
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Unreachable(_one_line(e)) from e
            time.sleep(min(remaining, delay * (0.5 + random.random())))
            delay = min(2 * delay, _BACKOFF_MAX)


def _local_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI, or the folder of a local file store; else None."""
    database = sqlite_file(uri)
    if database is not None:
        return Path(database) if database else None
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    return None


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Exclusive across processes for a local store (`<db>.lock` beside it), for the writes that
    must not race: making a store, creating an experiment in a file store. Nothing for others.
    TimeoutError after LOCK_SECONDS."""
    path = _local_path(uri)
    if path is None:
        yield
        return
    with exclusive_lock(Path(f"{path}.lock"), timeout=LOCK_SECONDS) as f:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")  # named to whoever waits
        f.flush()
        yield


@functools.cache
def _schema() -> tuple[str, frozenset[str], frozenset[str]]:
    """(head revision, every revision, the tables) of the installed MLflow's SQL schema."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db import utils

    revisions = ScriptDirectory.from_config(utils._get_alembic_config("")).walk_revisions()
    return (utils._get_latest_schema_revision(), frozenset(r.revision for r in revisions),
            frozenset(utils.Base.metadata.tables))


def _inspect(db: Path) -> tuple[str, int]:
    """("complete" | "missing" | what is incomplete, how many runs it holds) of a SQLite store.

    Raises _Fatal for a file that must be left alone: not a database, or a newer MLflow's store."""
    if not db.exists():
        return "missing", 0
    try:  # mode=rw: never creates the file; a hot journal a kill left is rolled back here
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=rw", uri=True, timeout=_BUSY_SECONDS)
        try:
            tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            row = con.execute("SELECT version_num FROM alembic_version").fetchone() \
                if "alembic_version" in tables else None
            runs = con.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
        finally:
            con.close()
    except sqlite3.OperationalError:  # locked, unreadable: retried
        raise
    except sqlite3.DatabaseError as e:
        raise _Fatal(f"{db} is not a SQLite database ({e}); it is left as it is: move it away or set "
                     "tracking.uri to another store") from None
    head, known, expected = _schema()
    revision = row[0] if row else None
    if revision is not None and revision not in known:
        raise _Fatal(f"{db} has schema revision {revision}, unknown to the installed MLflow "
                     f"{_mlflow().__version__}: a newer MLflow made it; install that version")
    missing = expected - tables
    if revision == head and not missing:
        return "complete", runs
    if not tables:
        return "it has no tables", runs
    return (f"its schema is incomplete or old (revision {revision or 'none'}, not {head}; {len(missing)} "
            f"of {len(expected)} tables missing)"), runs


def _set_aside(db: Path) -> Path:
    """Rename the database and its journal files (SQLite finds them by name: a journal left beside
    a new database would be replayed into it) to `<db>.broken-<time>`; return that path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = db.with_name(f"{db.name}.broken-{stamp}"), 1
    while any(Path(f"{aside}{s}").exists() for s in ("", *_JOURNALS)):
        aside, n = db.with_name(f"{db.name}.broken-{stamp}-{n}"), n + 1
    for s in (*_JOURNALS, ""):
        if Path(f"{db}{s}").exists():
            os.rename(f"{db}{s}", f"{aside}{s}")
    return aside


def _artifact_root(db: Path) -> str:
    """Artifacts beside the database, so results/ holds the whole store."""
    return (db.parent / "mlartifacts").resolve().as_uri()


def _create(db: Path, experiment: str) -> None:
    """Make a complete store with `experiment` in a temporary file and rename it to `db`. Called
    under the store lock with `db` missing; a kill leaves at most the temporary, removed next time."""
    from mlflow.entities import ExperimentTag
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for old in db.parent.glob(f"{glob.escape(db.name)}.new-*"):  # a killed creator's, under this lock
        old.unlink(missing_ok=True)
    if any(Path(f"{db}{s}").exists() for s in _JOURNALS):  # the journal of a database gone
        log.warning("%s-journal/-wal without %s set aside as %s", db, db, _set_aside(db))
    tmp = db.with_name(f"{db.name}.new-{uuid.uuid4().hex[:8]}")
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", _artifact_root(db))
        try:
            store.create_experiment(experiment, artifact_location=_artifact_root(db),
                                    tags=[ExperimentTag(EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)])
        finally:
            store.engine.dispose()  # no connection may stay open on the file once it is renamed
        os.rename(tmp, db)
    finally:
        for s in ("", *_JOURNALS):
            Path(f"{tmp}{s}").unlink(missing_ok=True)


def _ensure_sqlite(db: Path, uri: str, experiment: str) -> None:
    """Make `db` a complete store: as it is (no lock), made, or a half-made one without runs set
    aside and made again (under the store lock). _Fatal for a half-made store that holds runs."""
    if _inspect(db)[0] == "complete":
        return
    try:  # a folder that cannot be made or written to is no passing trouble: no retries
        db.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{db}.lock").touch()
    except OSError as e:
        raise _Fatal(_one_line(e)) from None
    # The slow imports (~1 s, a minute on a loaded machine) before the lock, not while holding it.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: F401
    _schema()
    with _store_lock(uri):
        state, runs = _inspect(db)  # another job may have made it while this one waited
        if state == "complete":
            return
        if state != "missing":
            if runs:
                raise _Fatal(f"{db} holds {runs} run{'s' * (runs != 1)} but {state}; it is left as it is: "
                             f"back it up and run `mlflow db upgrade {uri}`, or set tracking.uri to another store")
            aside = _set_aside(db)
            log.warning("MLflow store %s was half-made (%s) and held no runs, as a kill during its creation "
                        "leaves it: set aside as %s, a new store is made", db, state, aside)
        _create(db, experiment)


def _client(uri: str):
    """An MlflowClient on an existing store (`_ensure_sqlite` made a SQLite one complete)."""
    return _mlflow().MlflowClient(tracking_uri=uri)


def _named_experiment(client, uri: str, name: str):
    """The experiment `name`, created if missing; one that another job created meanwhile is found:
    SQLite's unique name column refuses the second creation (RESOURCE_ALREADY_EXISTS), and a file
    store, which checks names without a lock of its own, creates under the store lock."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp
    path, sqlite = _local_path(uri), uri.startswith("sqlite:")
    with nullcontext() if sqlite or path is None else _store_lock(uri):
        exp = client.get_experiment_by_name(name)
        if exp is None:
            try:
                return client.get_experiment(client.create_experiment(
                    name, artifact_location=_artifact_root(path) if sqlite and path else None,
                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}))
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp = client.get_experiment_by_name(name)
    if exp is None:
        raise RuntimeError(f"experiment {name!r} is neither found nor created")  # retried
    return exp


def _experiment_id(client, uri: str, name: str, exp_id: str | None) -> str:
    """The id of the experiment `exp_id` (checked), or of `name`, created if needed."""
    # str(): YAML may hand over an int
    exp = client.get_experiment(str(exp_id)) if exp_id is not None else _named_experiment(client, uri, name)
    if exp.lifecycle_stage != "active":
        raise _Fatal(f"experiment {exp.name!r} (id {exp.experiment_id}) is deleted")
    if EXPERIMENT_KIND_TAG not in exp.tags:  # created before the tag, or by hand; a kind chosen in the UI stays
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def _open_store(uri: str, experiment: str, exp_id: str | None = None):
    """(client, experiment id); a SQLite store is made or repaired first (`_ensure_sqlite`)."""
    if uri.startswith(("http://", "https://")):
        for k, v in _HTTP_DEFAULTS.items():
            os.environ.setdefault(k, v)
    path = _local_path(uri)
    if path is not None and uri.startswith("sqlite:"):
        _retry(lambda: _ensure_sqlite(path, uri, experiment))
    client = _retry(lambda: _client(uri))
    return client, _retry(lambda: _experiment_id(client, uri, experiment, exp_id))


def init_store(uri: str, experiment: str) -> str:
    """Create the store and the experiment if needed; return the experiment id.

    Raises UsageError when the store stays unreachable (creating it is the caller's only job)."""
    try:
        return _open_store(uri, experiment)[1]
    except _Unreachable as e:
        raise UsageError(f"MLflow store {uri} unreachable ({e})") from None


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
    from .config import flatten

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
        self._client = None
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
            _retry(lambda chunk=new[i : i + _PARAM_BATCH]: client.log_batch(run_id, params=chunk))
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
                _retry(lambda chunk=batch[i : i + _METRIC_BATCH]: self._client.log_batch(self.run_id, metrics=chunk))
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
            for f in map(Path, files):
                if f.is_dir():
                    _retry(lambda f=f: client.log_artifacts(run_id, str(f), artifact_path=f.name))
                elif f.exists():
                    _retry(lambda f=f: client.log_artifact(run_id, str(f)))
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



# -- results added to a finished run (fedfactor diagnose) -------------------------------------


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
    known = state.get("run_ids") if isinstance(state.get("run_ids"), dict) else {}
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
            state = _retry(lambda: _inspect(path)[0])
            if state != "complete":  # MLflow would migrate it in place: leave that to a training job
                return "unreachable", f"MLflow store {uri}: {state}"
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
            _retry(lambda chunk=batch[i : i + _METRIC_BATCH]: client.log_batch(rid, metrics=chunk))
        if tags:
            _retry(lambda: client.log_batch(rid, tags=[RunTag(k, str(v)) for k, v in tags.items()]))
        if artifacts is not None and Path(artifacts).is_dir() and any(Path(artifacts).iterdir()):
            _retry(lambda: client.log_artifacts(rid, str(artifacts), artifact_path=artifact_path))
    except _Unreachable as e:
        return "unreachable", f"MLflow store {uri} unreachable ({e})"
    return "logged", rid


# -- mlflow-import ------------------------------------------------------------------------------


class _Importer(Tracker):
    """A Tracker for `mlflow-import`: a store problem is an error (importing is the only job), and
    a run the store already holds as FINISHED is left alone."""

    def _give_up(self, problem: str) -> None:
        self.active = False
        raise UsageError(f"{problem}: nothing more imported")

    def _continue(self, run) -> bool:
        return run.info.status != "FINISHED"


def _run_dirs(paths: list[Path]) -> list[Path]:
    """The run directories (holding summary.json) under `paths`, each once, in order."""
    found: dict[Path, Path] = {}
    for path in map(Path, paths):
        if not path.exists():
            raise UsageError(f"{path} does not exist")
        if not path.is_dir():
            raise UsageError(f"{path} is not a directory (give a run directory or a folder of runs)")
        summaries = sorted(s for s in path.rglob("summary.json")
                           if not any(p.startswith(".") for p in s.relative_to(path).parts[:-1]))
        for s in summaries:
            if not s.is_file():
                raise UsageError(f"{s} is not a file: {s.parent} is not a finished run directory")
        if not summaries:
            raise UsageError(f"{path} holds no run (no summary.json under it)")
        for s in summaries:
            found.setdefault(s.parent.resolve(), s.parent)
    return list(found.values())


# A round in metrics.csv past this is damage, not a long run (MLflow steps are 64-bit integers).
_MAX_ROUND = 10**12
_DAMAGED = "the run did not finish or the file is damaged"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _load_metrics(path: Path):
    """A run's metrics.csv, checked: a row per round (whole numbers, each once), numbers (or
    nothing) in every other column, column names MLflow takes. UsageError naming what is wrong."""
    import csv
    import io

    import pandas as pd
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, _validate_metric_name

    try:
        text = path.read_text()
        metrics = pd.read_csv(io.StringIO(text))
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist, though its run has a summary.json; {_DAMAGED}") from None
    except (OSError, ValueError) as e:  # pandas' EmptyDataError and ParserError, bad UTF-8: ValueErrors
        raise UsageError(f"{path} is not a readable CSV ({_one_line(e)}); {_DAMAGED}") from None
    header = next(csv.reader(io.StringIO(text)))
    if not isinstance(metrics.index, pd.RangeIndex):  # pandas took the fields past the header as an index
        raise UsageError(f"{path}: a row has more fields than the header; {_DAMAGED}")
    if "round" not in header:
        raise UsageError(f"{path} has no 'round' column; {_DAMAGED}")
    if len(set(header)) != len(header) or "" in header:
        name = next(h for h in header if h == "" or header.count(h) > 1)
        raise UsageError(f"{path}: the header has {'an empty' if name == '' else repr(name) + ' as a'} "
                         f"column name {'' if name == '' else 'twice'}; {_DAMAGED}")
    if metrics.empty:
        raise UsageError(f"{path} holds no round; {_DAMAGED}")
    rounds = metrics["round"]
    if not (pd.api.types.is_integer_dtype(rounds) and rounds.between(0, _MAX_ROUND).all()):
        raise UsageError(f"{path}: the round column holds something other than whole numbers from 0 to "
                         f"{_MAX_ROUND:.0e}; {_DAMAGED}")
    if rounds.duplicated().any():
        raise UsageError(f"{path} holds round {rounds[rounds.duplicated()].iloc[0]} twice; {_DAMAGED}")
    for name in header:
        column = metrics[name]
        if column.notna().any() and not (pd.api.types.is_numeric_dtype(column)
                                         and not pd.api.types.is_bool_dtype(column)):
            raise UsageError(f"{path}: column {name!r} holds something other than numbers; {_DAMAGED}")
        try:
            _validate_metric_name(name)
            if len(name) > MAX_ENTITY_KEY_LENGTH:
                raise MlflowException(f"longer than {MAX_ENTITY_KEY_LENGTH} characters")
        except MlflowException as e:
            raise UsageError(f"{path}: column {name[:60]!r} is no MLflow metric name ({_one_line(e)})") from None
    return metrics


def _load_run(run_dir: Path):
    """(config, summary, metrics, run key or None) of a finished run directory; UsageError naming
    a bad file."""
    from .config import load_config
    from .methods import build

    summary_path, metrics_path, config_path = (run_dir / n for n in RUN_FILES[:3])
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{summary_path} is not readable JSON ({_one_line(e)}); {_DAMAGED}") from None
    if not isinstance(summary, dict):
        raise UsageError(f"{summary_path} must hold a JSON object; {_DAMAGED}")
    bad = next((k for k in FINAL_KEYS if summary.get(k) is not None and not _is_number(summary[k])), None)
    if bad:
        raise UsageError(f"{summary_path}: {bad} is {json.dumps(summary[bad])[:60]}, not a number; {_DAMAGED}")
    if not config_path.is_file():
        raise UsageError(f"{config_path} {'is not a file' if config_path.exists() else 'is missing'}: "
                         f"{run_dir} is not a complete run directory")
    try:
        empty = not config_path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{config_path} is unreadable ({_one_line(e)}); {_DAMAGED}") from None
    if empty:  # load_config would run on the defaults: params that were never trained
        raise UsageError(f"{config_path} is empty; {_DAMAGED}")
    try:
        cfg = load_config(config_path)
        cfg.method = build(cfg.method).spec
    except UsageError as e:
        raise UsageError(str(e) if str(config_path) in str(e) else f"{config_path}: {e}") from None
    metrics = _load_metrics(metrics_path)
    state_path = run_dir / STATE_FILE
    if not (state_path.exists() or state_path.is_symlink()):
        return cfg, summary, metrics, None
    try:
        state = json.loads(state_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        state = _one_line(e)
    key = state.get("run_key") if isinstance(state, dict) else None
    if not _is_key(key):  # importing it as a new run could duplicate the one it names
        why = f"is not readable JSON ({state})" if isinstance(state, str) else \
            'holds no run key ({"run_key": 32 hex digits})'
        raise UsageError(f"{state_path} {why}: delete it to import {run_dir} as a new MLflow run")
    return cfg, summary, metrics, key


def import_runs(paths: list[Path], uri: str, experiment: str) -> list[tuple[Path, str]]:
    """Mirror the finished run directories under `paths` into the store `uri`, experiment
    `experiment`, through the same Tracker as training. Per directory: "imported" (a new MLflow
    run), "completed" (an unfinished run of that directory finished), "unchanged" (its run is
    already FINISHED: nothing is logged). Every directory is read and checked before anything is
    written; UsageError for a missing path, a path without runs, an unreadable run file or an
    unreachable store."""
    runs = [(d, *_load_run(d)) for d in _run_dirs(paths)]
    keys: dict[str, Path] = {}
    for run_dir, *_, key in runs:
        if key is not None and keys.setdefault(key, run_dir) != run_dir:
            raise UsageError(f"{keys[key]} and {run_dir} hold the same run key in {STATE_FILE} (one is a copy "
                             f"of the other): delete the copy's {STATE_FILE} to import it as a run of its own")
    results = []
    for run_dir, cfg, summary, metrics, _ in runs:
        # params from the config as trained and version tags from the summary (the machine it trained on,
        # not this one), so they match what the training job logged
        params, tags, run_name = run_identity(cfg, run_dir, summary.get("versions"))
        target = cfg.tracking.model_copy(update={"enabled": True, "uri": uri, "experiment": experiment,
                                                 "experiment_id": None})
        tracker = _Importer(target, run_dir, params, tags, run_name)
        if not tracker.active:  # found FINISHED
            results.append((run_dir, "unchanged"))
            continue
        for row in metrics.to_dict("records"):
            step = row.pop("round")
            tracker.log_metrics(row, step=int(step))
        tracker.finish({k: summary[k] for k in FINAL_KEYS if summary.get(k) is not None},
                       [run_dir / n for n in RUN_FILES if (run_dir / n).exists()])
        results.append((run_dir, "imported" if tracker.previous_status is None else "completed"))
    return results
