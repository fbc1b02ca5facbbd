"""Finished runs read back for the reports: which summary.json files, and the fields a report needs.

A run folder may hold a summary a killed job, a hand edit or an older fedfactor left behind; each
such file ends as one UsageError naming it, before any report is written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Sequence, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ..config import MAX_CLIENTS, MAX_ROUNDS, MAX_SEED, EvalConfig, validation_message
from ..errors import UsageError

_RERUN = "the run did not finish, the file is damaged or an older fedfactor wrote it: re-run it"


class RunKey(BaseModel):
    """What names a run: all `fedfactor curves` needs from its summary."""

    # strict: a seed "1" or an accuracy true means a damaged file, not a value to coerce; the
    # summary's other keys are simply not needed here
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    scenario: str
    method: str
    seed: int = Field(ge=0, le=MAX_SEED)


def _nan_is_null(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _all_protocol_keys(value: Any) -> Any:
    # EvalConfig would fill a missing key with its default, but a summary records every one that
    # decides how clients are scored (keys added later, such as new_clients, may be absent)
    if isinstance(value, dict):
        missing = [k for k in ("test_pool", "model", "report") if k not in value]
        if missing:
            raise ValueError(f"lacks {', '.join(missing)}")
    return value


Accuracy = Annotated[float, Field(ge=0, le=1)]


class TableRun(RunKey):
    """The fields `fedfactor table` reads."""

    dataset: str  # synthetic:NAME in a smoke run

    # null (or NaN) when eval.report is best_val and the run had no validation data
    accuracy: Annotated[Accuracy | None, BeforeValidator(_nan_is_null)]
    accuracy_mean: Accuracy
    accuracy_best_mean: Accuracy
    accuracy_weighted: Accuracy
    bytes_total: float = Field(ge=0)
    rounds: int = Field(ge=1, le=MAX_ROUNDS)
    clients: int = Field(ge=1, le=MAX_CLIENTS)
    protocol: Annotated[EvalConfig, BeforeValidator(_all_protocol_keys)]


FAILED = "failed.json"  # in a run's folder: the run failed, and why (`train-runs` writes it)


class FailedRun(RunKey):
    """A run that failed (diverged, say): what names it and why, from its folder's failed.json. A study
    that records failed runs (`failed_runs: record`) shows them beside its numbers, not in them."""

    reason: str


Run = TypeVar("Run", bound=RunKey)


def _failed_instead(path: Path) -> bool:
    """`path`, a run's summary.json, is absent because the run failed."""
    return path.name == "summary.json" and not path.exists() and (path.parent / FAILED).is_file()


def find_summaries(paths: Sequence[str | Path]) -> list[Path]:
    """The summary.json files among `paths`; folders are searched recursively. A listed summary.json of
    a run that failed (its folder holds failed.json instead) is left out: find_failed lists it."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("summary.json"))
        elif p.exists():
            files.append(p)
        elif not _failed_instead(p):
            raise UsageError(f"{p} does not exist; pass run folders or their summary.json files")
    if not files:
        failed = len(find_failed(paths))
        raise UsageError(
            f"no summary.json found in {', '.join(map(str, paths))}; pass folders of finished runs"
            + (f" ({failed} run(s) there failed: their failed.json says why)" if failed else "")
        )
    return files


def find_failed(paths: Sequence[str | Path]) -> list[Path]:
    """The failed.json of each run among `paths` (as find_summaries takes them) that failed: a folder
    with failed.json and no summary.json."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob(FAILED) if not (f.parent / "summary.json").exists())
        elif _failed_instead(p):
            files.append(p.parent / FAILED)
    return files


def read_summary(path: Path, schema: type[Run]) -> Run:
    """The fields `schema` declares, read from the summary.json (or failed.json) at `path` and checked."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    # ValueError: bad JSON or UTF-8; RecursionError: arrays nested 10**5 deep
    except (OSError, ValueError, RecursionError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise UsageError(f"cannot read run summary {path} ({reason}); {_RERUN}") from None
    if not isinstance(doc, dict):
        kind = {list: "an array", str: "a string", bool: "true/false", type(None): "null"}.get(type(doc), "a number")
        raise UsageError(f"run summary {path} holds {kind}, not a JSON object; {_RERUN}")
    try:
        return schema.model_validate(doc)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "missing":
            key = ".".join(map(str, first["loc"]))
            raise UsageError(f"run summary {path} lacks {key!r}; {_RERUN}") from None
        raise UsageError(f"run summary {path}: {validation_message(err)}; {_RERUN}") from None
