"""A study's finished runs and the numbers read from them, for the paper tables and the claims."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import stats

from ..config import EvalConfig
from ..errors import UsageError
from .runs import Accuracy, FailedRun, RunKey, TableRun, find_failed, find_summaries, read_summary
from .spec import SYNTHETIC_PREFIX, StudySpec


class NewClientScores(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")
    accuracy_mean: Accuracy
    accuracy_weighted: Accuracy


class NewClients(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")
    strategies: dict[str, NewClientScores]


class StudyRun(TableRun):
    """The fields the paper tables and claims read from a summary.json."""

    dataset: str
    per_client_accuracy: list[Accuracy] | None = None
    new_clients: NewClients | None = None


@dataclass
class StudyRuns:
    """A study's finished runs, by (scenario, method label), each list sorted by seed."""

    cells: dict[tuple[str, str], list[StudyRun]] = field(default_factory=dict)
    protocol: EvalConfig | None = None
    synthetic: bool = False  # some run trained on synthetic data
    ignored: int = 0  # runs of scenarios or methods the study does not list
    # runs that failed (failed_runs: record), by (scenario, method label): shown beside the numbers
    failed: dict[tuple[str, str], list[FailedRun]] = field(default_factory=dict)


def _label(path: Path, run: RunKey, study: StudySpec) -> str | None:
    """The run's method label: the folder `<scenario>/<label>/seed<N>/` the workflow files it under,
    else the summary's `method`. summary.json's `method` may be the registered name, which several
    labels share (rc20_rl20 ... are all feddecomp). None: not one of the study's methods."""
    folder = path.parent.parent.name
    if path.parent.name == f"seed{run.seed}" and path.parent.parent.parent.name == run.scenario:
        if folder not in study.methods:
            return None
        if run.method not in (folder, study.methods[folder].name):
            raise UsageError(f"run {path} is filed under method {folder!r} but its summary says {run.method!r}")
        return folder
    return run.method if run.method in study.methods else None


def load_runs(study: StudySpec, summaries: Sequence[str | Path]) -> StudyRuns:
    """The study's runs among `summaries` (summary.json files or folders searched for them).

    An empty `summaries` means no runs yet; runs that failed (a failed.json in place of the summary)
    go to `failed`. Runs of one study share one evaluation protocol; a mix is refused, as in
    `fedfactor table`.
    """
    out = StudyRuns()
    seen: dict[tuple[str, str, int], Path] = {}
    protocols: dict[tuple[str, str, str], Path] = {}
    files = find_summaries(summaries) if summaries else []
    for f in dict.fromkeys(p.resolve() for p in files):
        run = read_summary(f, StudyRun)
        label = _label(f, run, study)
        if label is None or run.scenario not in study.scenarios:
            out.ignored += 1
            continue
        key = (run.scenario, label, run.seed)
        if key in seen:
            raise UsageError(f"two runs of scenario {run.scenario}, method {label}, seed {run.seed}: "
                             f"{seen[key]} and {f}")
        seen[key] = f
        protocols.setdefault((run.protocol.test_pool, run.protocol.model, run.protocol.report), f)
        out.protocol = out.protocol or run.protocol
        out.synthetic |= run.dataset.startswith(SYNTHETIC_PREFIX)
        out.cells.setdefault((run.scenario, label), []).append(run)
    for f in dict.fromkeys(p.resolve() for p in find_failed(summaries)):
        failed = read_summary(f, FailedRun)
        label = _label(f, failed, study)
        if label is not None and failed.scenario in study.scenarios:
            out.failed.setdefault((failed.scenario, label), []).append(failed)
    if len(protocols) > 1:
        raise UsageError("these runs were scored under different evaluation protocols ("
                         + "; ".join("/".join(p) for p in protocols) + "); one study, one protocol")
    for runs in out.cells.values():
        runs.sort(key=lambda r: r.seed)
    return out


class NoValue(Exception):
    """A run that exists but cannot give the number asked for (the message says why)."""


@dataclass(frozen=True)
class Quantity:
    """What to read from a run: `accuracy` (the reported one), `bytes` (bytes_total), a client
    subset's mean accuracy, or a new-client strategy's accuracy. Accuracies as fractions."""

    metric: str = "accuracy"
    clients: tuple[int, ...] | None = None

    def read(self, run: StudyRun) -> float:
        if self.metric == "bytes":
            return float(run.bytes_total)
        if self.metric.startswith("new_clients."):
            name = self.metric.removeprefix("new_clients.")
            strategies = run.new_clients.strategies if run.new_clients else {}
            if name not in strategies:
                have = ", ".join(strategies) or "none"
                raise NoValue(f"no new-client strategy {name!r} in the runs (they have: {have})")
            scores = strategies[name]
            return scores.accuracy_weighted if run.protocol.report == "best_weighted" else scores.accuracy_mean
        if self.clients is not None:
            if run.protocol.report != "last":
                raise NoValue("per-client accuracies are the last round's; this protocol reports "
                              f"{run.protocol.report}")
            acc = run.per_client_accuracy
            if acc is None or max(self.clients) >= len(acc):
                raise NoValue(f"the runs have no accuracy of client {max(self.clients)}")
            return sum(acc[k] for k in self.clients) / len(self.clients)
        if run.accuracy is None:
            raise NoValue("the reported accuracy is null (no validation data for eval.report best_val)")
        return float(run.accuracy)


CONFIDENCE = 0.95  # of every interval the tables and claims give
# a t interval of two seeds is 12.7 standard errors either side of the mean: a cell of fewer seeds
# says so beside its n
FEW_SEEDS = 3
CLIPPED = "*"  # marks an interval's end shown at the metric's bound instead of beyond it


def shown_interval(lo: float, hi: float, low: float, high: float, fmt: str) -> str:
    """`[35.2, 84.8]`: an end beyond [low, high] (an accuracy's 0-100 %) is shown at the bound and
    marked, since a mean of accuracies cannot lie outside them."""
    ends = [f"{min(max(x, low), high):{fmt}}" + (CLIPPED if x < low or x > high else "") for x in (lo, hi)]
    return f"[{ends[0]}, {ends[1]}]"


def seeds_note(n: int, of: str = "") -> str:
    """`n=5`, `n=2 of 3` (`of`), and `, few seeds` after it where the interval says little."""
    return f"n={n}{of}" + (", few seeds" if 1 < n < FEW_SEEDS else "")


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95 % Student t confidence interval of the mean of `values` (sample std, n - 1 degrees of
    freedom). NaNs for fewer than two values: one seed says nothing about the spread. Values that are
    all equal give the mean itself (scipy would give NaN for a zero scale)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    lo, hi = stats.t.interval(CONFIDENCE, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    return float(lo), float(hi)


@dataclass
class Values:
    """One cell's numbers, per seed, with mean, sample std and t interval, as `fedfactor table`."""

    per_seed: dict[int, float]

    @property
    def n(self) -> int:
        return len(self.per_seed)

    @property
    def mean(self) -> float:
        return sum(self.per_seed.values()) / self.n

    @property
    def std(self) -> float:
        """Sample standard deviation (ddof 1); NaN for one seed."""
        return float(np.std(list(self.per_seed.values()), ddof=1)) if self.n > 1 else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        return t_interval(list(self.per_seed.values()))


def read_values(runs: Sequence[StudyRun], quantity: Quantity, scale: float = 1.0) -> Values:
    """`quantity` of every run, times `scale`; NoValue if a run cannot give it."""
    return Values({r.seed: quantity.read(r) * scale for r in runs})


def is_smoke(study: StudySpec, runs: StudyRuns) -> bool:
    return study.smoke or runs.synthetic
