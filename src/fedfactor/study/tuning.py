"""Hyperparameter tuning on validation data: the grid each method searches, the selection, the file
of chosen values a study reads (docs/tuning.md).

A study's `tuning` section names a budget, `points` grid points per method, and each method's grid:
`common` keys every method searches (the learning rate), then the method's own (`methods.<label>`),
expanded by scikit-learn's ParameterGrid. Every method must come to exactly `points` points, so every
method gets the same budget (points x rounds x seeds). A key with a dot is a run-config key
(`fl.lr`), one without is a method hyperparameter (`tau`).

`snakemake tune` trains every point on the tuning seeds (rules/tune.smk); `select` scores each point
by its validation accuracy alone (`val_score`), averaged over the tuning seeds, and keeps the best per
scenario and method. The chosen values go to `tuning.file` in the repository with their provenance
(the grid, every point's score, the commit, the command); the study's final runs read them from there
(`tuned_entry`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import subprocess
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from ..config import Config, FLConfig
from ..errors import UsageError
from ..io import atomic_write_text

FILE_VERSION = 1
# The validation number a run is scored by, as summary.json holds it (summary.summarize): under
# eval.report=last the last round's mean validation accuracy, under best/best_weighted/best_val its
# best round's. The test split is never read.
SCORE = "val_score"
# Run-config sections a point may not change: every method of a scenario shares its data and partition,
# and the workflow sets the rest for each run (workflow.SET_BY_WORKFLOW).
FIXED_SECTIONS = ("data", "partition", "tracking", "eval", "method")
# The run-config keys that set a method's training budget: rounds, local epochs and batch size (the
# steps a client takes), the clients and the share of them sampled each round. Every point of every
# method trains under the same values, so none of them may be a grid key.
BUDGET_KEYS = ("fl.rounds", "fl.epochs", "fl.batch_size", "fl.clients", "fl.fraction")
# The environment variable the workflow names its command line in (tune_select's provenance).
COMMAND_VARIABLE = "FEDFACTOR_TUNE_COMMAND"


def space(tuning: dict[str, Any], label: str) -> dict[str, list]:
    """The keys and values `label` searches: `common`, the method's own keys on top."""
    return {**(tuning.get("common") or {}), **((tuning.get("methods") or {}).get(label) or {})}


def points(tuning: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """The grid points of `label`, in ParameterGrid's order (keys sorted, the last varying fastest)."""
    from sklearn.model_selection import ParameterGrid

    grid = space(tuning, label)
    return list(ParameterGrid(grid)) if grid else []


def check(tuning: dict[str, Any], labels: Iterable[str], listed: Iterable[str]) -> None:
    """Every method the study runs (`labels`) searches exactly `points` points, over keys it can take;
    `tuning.methods` names only methods the study lists."""
    budget = tuning["points"]
    for key in ("points", "seeds"):  # the schema takes 2.0 for an integer
        values = tuning[key] if key == "seeds" else [tuning[key]]
        if not all(type(v) is int for v in values):
            raise UsageError(f"tuning.{key} must be {'whole numbers' if key == 'seeds' else 'a whole number'} "
                             f"(got {tuning[key]!r})")
    unknown = sorted(set(tuning.get("methods") or {}) - set(listed))
    if unknown:
        raise UsageError(f"tuning.methods names {', '.join(map(repr, unknown))}, which the study does not list")
    for label in labels:
        grid = space(tuning, label)
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise UsageError(f"tuning: {label}'s {key!r} must be a non-empty list of values (got {values!r})")
            if key.count(".") > 1 or key.startswith(".") or key.endswith("."):
                raise UsageError(f"tuning: {label}'s key {key!r}: give a method hyperparameter (tau) or a run-config "
                                 "key as section.key (fl.lr)")
            if key.split(".")[0] in FIXED_SECTIONS and "." in key:
                raise UsageError(f"tuning: {label}'s key {key!r}: the scenario's data, partition and the workflow's "
                                 "own settings are the same for every point; tune training or method settings")
            if key in BUDGET_KEYS:
                raise UsageError(f"tuning: {label}'s key {key!r} sets the training budget, which every point of every "
                                 f"method shares ({', '.join(BUDGET_KEYS)}); set it in the scenario, not the grid")
        n = len(points(tuning, label))
        if n != budget:
            sizes = " x ".join(f"{len(v)} {k}" for k, v in grid.items()) or "no key"
            raise UsageError(f"tuning: {label} searches {n} points ({sizes}), but every method gets the same budget, "
                             f"tuning.points = {budget}; give it a grid of {budget} points")


def check_runs_alike(configs: dict[str, Config]) -> None:
    """The same budget also in training: every tuning run (a name such as "fedavg@p3" -> its loaded
    Config, every point of every method) has the same BUDGET_KEYS values."""
    def budget(fl: FLConfig) -> dict[str, Any]:  # the BUDGET_KEYS, all in the fl section
        return {key: getattr(fl, key.split(".")[1]) for key in BUDGET_KEYS}

    (first, base), *rest = configs.items()
    for name, cfg in rest:
        ours, theirs = budget(cfg.fl), budget(base.fl)
        differ = [key for key, value in ours.items() if value != theirs[key]]
        if differ:
            shown = ", ".join(f"{key}={ours[key]} against {theirs[key]}" for key in differ)
            raise UsageError(f"tuning: {name} trains with {shown} for {first}: every point of every method gets the "
                             "same budget; drop the method's own fl settings")


def with_values(entry: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A study's method entry with a point's values in it: `fl.lr` into `run`, `tau` into the method."""
    out = {**entry, "run": {**(entry.get("run") or {})}}
    for key, value in values.items():
        if "." in key:
            section, name = key.split(".")
            out["run"][section] = {**(out["run"].get(section) or {}), name: value}
        else:
            out[key] = value
    if not out["run"]:
        del out["run"]
    return out


def point_name(i: int) -> str:
    return f"p{i}"


# ------------------------------------------------------------------------ selection

def failure_reasons(job_files: Iterable[str | Path]) -> dict[Path, str]:
    """Run folder (resolved) -> why it failed, from the tuning jobs' --done files (`train-runs
    --allow-failed` lists each failed run with its reason)."""
    reasons: dict[Path, str] = {}
    for path in job_files:
        try:
            failed = json.loads(Path(path).read_text()).get("failed") or []
        except (OSError, ValueError, AttributeError) as e:
            raise UsageError(f"tuning job file {path} cannot be read ({e})") from None
        for entry in failed:
            reasons[Path(entry["run"]).resolve()] = entry["reason"]
    return reasons


def _score(summary_path: Path, reasons: dict[Path, str]) -> tuple[float | None, str | None]:
    """A tuning run's validation score, or None and why there is none."""
    try:
        summary = json.loads(summary_path.read_text())
    except FileNotFoundError:
        why = reasons.get(summary_path.parent.resolve())
        return None, f"failed: {why}" if why else "no summary: the run failed (its log says why)"
    except (OSError, ValueError) as e:
        return None, f"unreadable summary ({e})"
    score = summary.get(SCORE)
    if score is None or not math.isfinite(score):
        return None, "no validation score: the run has no validation data"
    return float(score), None


def select(tuning: dict[str, Any], scenarios: list[str], labels: list[str], run_dir: Path,
           provenance: dict[str, Any], reasons: dict[Path, str] | None = None) -> dict[str, Any]:
    """The chosen values per scenario and method from the tuning runs under `run_dir`
    (<scenario>/<label>/p<i>/seed<s>/summary.json), with every point's validation score.

    A point's score is the mean over the tuning seeds; a point with a failed run (diverged, say) is
    never chosen, and is recorded with the reason `reasons` (failure_reasons) gives for its run.
    Ties go to the earlier point of the grid.
    """
    reasons = reasons or {}
    seeds = [int(s) for s in tuning["seeds"]]
    chosen: dict[str, Any] = {}
    for scenario in scenarios:
        chosen[scenario] = {}
        for label in labels:
            tried: list[dict[str, Any]] = []
            for i, values in enumerate(points(tuning, label)):
                scores, failed = [], []
                for seed in seeds:
                    score, why = _score(run_dir / scenario / label / point_name(i) / f"seed{seed}" / "summary.json",
                                        reasons)
                    if score is None:
                        failed.append(f"seed {seed}: {why}")
                    else:
                        scores.append(score)
                tried.append({"values": values, "val_score": sum(scores) / len(scores) if not failed else None,
                              "per_seed": scores, **({"failed": failed} if failed else {})})
            ok = [t for t in tried if t["val_score"] is not None]
            if not ok:
                raise UsageError(f"tuning: every point of {label} in {scenario} failed; see its runs' logs under "
                                 f"{run_dir / scenario / label}")
            best = max(ok, key=lambda t: t["val_score"])  # the first of equal scores
            chosen[scenario][label] = {"values": best["values"], "val_score": best["val_score"], "tried": tried}
    made = {key: value for key, value in provenance.items() if key != "rounds"}
    return {"version": FILE_VERSION, **made,
            "budget": {"points": tuning["points"], "rounds": provenance.get("rounds"), "seeds": seeds},
            "score": "validation accuracy (mean over clients) at the round the study reports, mean over the "
                     "tuning seeds; the test split is never read",
            "grid": {label: space(tuning, label) for label in labels},
            "chosen": chosen}


def provenance(study: str, command: str, rounds: dict[str, int] | None,
               written: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Who made the chosen values: the study, the commit (and whether the tree had changes other than
    the files being `written`), the command, the time."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{w}" for w in written))
    return {"study": study, "commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(status) if status is not None else None,
            "command": command, "rounds": rounds,
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


HEADER = ("# Hyperparameters chosen on validation data by `{command}` (docs/tuning.md).\n"
          "# Written by fedfactor's tune_select step: do not edit by hand; tune again instead (its checksum\n"
          "# refuses an edit unless the study sets tuning.allow_edited: true).\n")


def checksum(doc: dict[str, Any]) -> str:
    """sha256 of the file's content but its checksum, as canonical JSON: what `read_chosen` checks to
    tell a file tune_select wrote from one edited by hand."""
    content = {key: value for key, value in doc.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


class _Plain(yaml.SafeDumper):
    """Every value written where it stands: an object met twice (a point's values, a shared grid list)
    would otherwise be an anchor and an alias, and an edit of one would change the other."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write(doc: dict[str, Any], path: str | Path) -> None:
    doc = {**doc, "checksum": checksum(doc)}
    text = HEADER.format(command=doc.get("command") or "snakemake tune") + yaml.dump(doc, Dumper=_Plain,
                                                                                      sort_keys=False)
    atomic_write_text(path, text)


# ------------------------------------------------------------------------ reading them back

def read_chosen(tuning: dict[str, Any], scenarios: list[str], labels: list[str],
                rounds: dict[str, int] | None = None) -> dict[str, dict[str, dict]]:
    """scenario -> label -> the chosen values, from `tuning.file`, checked against the study: written by
    tune_select and not edited (its checksum; `tuning.allow_edited: true` accepts an edit), tuned under
    the study's budget (points, seeds, and `rounds` per scenario when given) and grid, every scenario
    and method the study runs present, and each method's values exactly its tuned keys, at a point of
    its grid that was tried and did not fail. Anything else: one UsageError line naming the file, the
    method and the key (tune again)."""
    from ..config import load_yaml

    path = Path(tuning["file"])
    again = "run `snakemake tune` (with the study's --configfile) to tune again, or set tuning.use: false"
    try:
        doc = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        raise UsageError(f"tuning.file {path} does not exist: {again}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"tuning.file {path} cannot be read ({e})") from None
    if not isinstance(doc, dict) or doc.get("version") != FILE_VERSION or not isinstance(doc.get("chosen"), dict):
        raise UsageError(f"tuning.file {path} is not a file of chosen values (version {FILE_VERSION}); {again}")
    if doc.get("checksum") != checksum(doc) and not tuning.get("allow_edited", False):
        state = "has no checksum" if "checksum" not in doc else "does not match its checksum"
        raise UsageError(f"tuning.file {path} {state}: it was edited after `snakemake tune` wrote it; {again}, or set "
                         "tuning.allow_edited: true to use it as edited")
    _check_budget(doc, tuning, path, rounds, again)
    out: dict[str, dict[str, dict]] = {}
    for scenario in scenarios:
        out[scenario] = {}
        for label in labels:
            entry = (doc["chosen"].get(scenario) or {}).get(label)
            if not isinstance(entry, dict) or not isinstance(entry.get("values"), dict):
                raise UsageError(f"tuning.file {path} holds no chosen values for {label} in {scenario}; {again}")
            if (doc.get("grid") or {}).get(label) != space(tuning, label):
                raise UsageError(f"tuning.file {path}: {label} was tuned on another grid than the study's tuning "
                                 f"section now gives; {again}")
            _check_values(entry, tuning, label, f"tuning.file {path}: {label} in {scenario}", again)
            out[scenario][label] = entry["values"]
    return out


def _check_budget(doc: dict[str, Any], tuning: dict[str, Any], path: Path, rounds: dict[str, int] | None,
                  again: str) -> None:
    """The file was tuned with the study's points, seeds and, per scenario, rounds."""
    given = doc.get("budget")
    budget = given if isinstance(given, dict) else {}
    study = {"points": tuning["points"], "seeds": [int(s) for s in tuning["seeds"]]}
    for key, wanted in study.items():
        if budget.get(key) != wanted:
            raise UsageError(f"tuning.file {path} was tuned with budget.{key} {budget.get(key)!r}, but the study's "
                             f"tuning section gives {wanted!r}; {again}")
    for scenario, n in (rounds or {}).items():
        tuned = (budget.get("rounds") or {}).get(scenario)
        if tuned != n:
            raise UsageError(f"tuning.file {path} tuned {scenario} at {tuned!r} rounds, but the study trains it "
                             f"{n} rounds; {again}")


def _check_values(entry: dict[str, Any], tuning: dict[str, Any], label: str, where: str, again: str) -> None:
    """A method's chosen values: its tuned keys and no other, at a grid point that was tried and did not fail."""
    values, keys = entry["values"], list(space(tuning, label))
    missing, extra = [k for k in keys if k not in values], [k for k in values if k not in keys]
    if missing:
        raise UsageError(f"{where}: the chosen values lack {missing[0]!r}, which the grid tunes; {again}")
    if extra:
        raise UsageError(f"{where}: the chosen values hold {extra[0]!r}, which the grid does not tune (set it in the "
                         f"study's method entry instead); {again}")
    if values not in points(tuning, label):
        key = next((k for k in keys if values[k] not in space(tuning, label)[k]), keys[0])
        raise UsageError(f"{where}: {key}={values[key]!r} is no point of its grid ({space(tuning, label)[key]}); "
                         f"{again}")
    tried = [t for t in entry.get("tried") or [] if isinstance(t, dict) and t.get("values") == values]
    if not any(t.get("val_score") is not None for t in tried):
        raise UsageError(f"{where}: {', '.join(f'{k}={v!r}' for k, v in values.items())} was never tried, or failed, "
                         f"on the tuning seeds; {again}")
