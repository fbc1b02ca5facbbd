"""`fedfactor mlflow-import`: finished run directories checked file by file, then mirrored into a
store through the same Tracker as training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .retry import _one_line
from .tracker import FINAL_KEYS, RUN_FILES, STATE_FILE, Tracker, _is_key, run_identity


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
    from ..config import load_config
    from ..methods import build

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
