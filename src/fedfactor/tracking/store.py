"""The MLflow store: opened, or made and repaired first when it is a SQLite file, and its experiment.

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
import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from ..config import sqlite_file
from ..errors import UsageError
from ..io import exclusive_lock
from .retry import _Fatal, _one_line, _retry, _Unreachable

log = logging.getLogger("fedfactor")

# Seconds a process waits for another one holding the store lock: making a store takes seconds,
# and over two minutes with 16 jobs starting on 2 busy cores.
LOCK_SECONDS = 600.0
# Seconds a sqlite3 connection here waits for another one's write (MLflow's own sessions: 20).
_BUSY_SECONDS = 20.0
_JOURNALS = ("-journal", "-wal", "-shm")
# An unreachable tracking server must not stall a job for minutes (MLflow's defaults: 7 retries
# with backoff factor 2, 120 s timeout per request).
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# MLflow 3 files an experiment under a kind, held by this tag (its UI's kind selector writes these
# values); an experiment without it may open in the GenAI view (traces), where training runs look
# absent. MLflow 3.17's UI follows its own GenAI / Model training switch instead (docs/mlflow.md).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def _mlflow():
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    return mlflow


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
