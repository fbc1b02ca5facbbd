"""MLflow mirror of a run. The only package that imports mlflow (lazily: the import costs ~1 s).

The run's own files (summary.json, metrics.csv, config.yaml) are the source of truth; MLflow mirrors
them so runs can be browsed and compared in its UI. Two rules follow from that:

Tracking never loses training: every store call goes through one guard (retry.py), and a store that
stays unreachable switches the tracker off with one warning; `fedfactor mlflow-import` loads the
files later (mlflow_import.py).

One run directory is one MLflow run (tracker.py): a resume, a re-run or an import continues it.
`log_to_run` adds later results (`fedfactor diagnose`) to that same run, creating nothing (posthoc.py).

Many jobs open one store at once, and a kill may strike while a SQLite store is made: store.py.
"""

from .mlflow_import import import_runs
from .posthoc import log_to_run
from .store import init_store
from .tracker import FINAL_KEYS, RUN_FILES, STATE_FILE, Tracker, run_identity

__all__ = ["FINAL_KEYS", "RUN_FILES", "STATE_FILE", "Tracker", "import_runs", "init_store", "log_to_run",
           "run_identity"]
