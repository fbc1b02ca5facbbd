"""`fedfactor compare`: two sets of finished runs (or two methods of one set), cell by cell.

A cell is a (scenario, method label) as in the tables. Where both sides have a cell, the difference
A - B of its metric (the reported accuracy in %, or the bytes sent in GB) is tested exactly as a
claim's difference is (claims.difference_estimate): runs of one seed share their partition, so on the
seeds both sides have (two or more) the test is paired, a one-sample t-test of the per-seed
differences with its 95 % t interval; with fewer shared seeds, Welch's t-test of the two cells; one
run on a side gives no interval.

Verdict of a cell, for A against B: `better` when the whole interval lies on A's good side of 0
(higher accuracy, fewer bytes), `worse` when the whole of it lies on the other, `within noise`
otherwise or without an interval. A difference the same in every seed (bytes, as a rule) has no noise
and is decided on its value, `same` when it is 0. A cell one side lacks is listed as `only in A` or
`only in B`, so that a run missing on one side is seen rather than silently left out.

`compare_runs` writes compare.md, compare.csv (the same as numbers) and compare.png (a forest plot).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..config import EvalConfig
from ..errors import UsageError
from ..io import atomic_write_text
from .cells import NoValue, Quantity, StudyRun, Values, read_values
from .claims import _fmt, _num, difference_estimate
from .figures import decorate, pyplot, save_figure
from .runs import find_summaries, read_summary
from .spec import SMOKE_TITLE, SYNTHETIC_PREFIX, protocol_words

BETTER, WORSE, WITHIN_NOISE, SAME = "better", "worse", "within noise", "same"
ONLY_A, ONLY_B = "only in A", "only in B"
VERDICTS = (BETTER, WORSE, WITHIN_NOISE, SAME, ONLY_A, ONLY_B)
METRICS = ("accuracy", "bytes")
COLUMNS = ["scenario", "method", "a_mean", "b_mean", "diff", "low", "high", "p", "n_paired", "test", "verdict"]
COLOURS = {BETTER: "#1a7f37", WORSE: "#cf222e", WITHIN_NOISE: "#9a6700", SAME: "#6e7781"}


@dataclass
class RunSet:
    """One side's runs by (scenario, method label), each cell's runs by seed."""

    cells: dict[tuple[str, str], dict[int, StudyRun]] = field(default_factory=dict)
    protocol: EvalConfig | None = None
    synthetic: bool = False

    @property
    def scoring(self) -> str:
        """The keys that decide how clients are scored, `test_pool/model/report`."""
        return _scoring(self.protocol) if self.protocol else "none"


def _scoring(p: EvalConfig) -> str:
    return f"{p.test_pool}/{p.model}/{p.report}"


def _label(path: Path, run: StudyRun) -> str:
    """The folder `<scenario>/<label>/seed<N>/` the workflow files a run under, else the summary's
    method: several labels may share one registered method (rc20_rl20 ... are all feddecomp), and
    they are different cells."""
    if path.parent.name == f"seed{run.seed}" and path.parent.parent.parent.name == run.scenario:
        return path.parent.parent.name
    return run.method


def load_set(paths: Sequence[str | Path], side: str) -> RunSet:
    """The runs among `paths` (summary.json files or folders searched for them). Two runs of one
    cell and seed, or runs of two evaluation protocols, are refused, as `fedfactor table` does."""
    out = RunSet()
    seen: dict[tuple[str, str, int], Path] = {}
    for f in dict.fromkeys(p.resolve() for p in find_summaries(paths)):
        run = read_summary(f, StudyRun)
        label = _label(f, run)
        key = (run.scenario, label, run.seed)
        if key in seen:
            raise UsageError(f"{side}: two runs of scenario {run.scenario}, method {label}, seed {run.seed}: "
                             f"{seen[key]} and {f}")
        seen[key] = f
        if out.protocol is not None and _scoring(run.protocol) != out.scoring:
            raise UsageError(f"{side}: these runs were scored under different evaluation protocols "
                             f"({out.scoring}; {_scoring(run.protocol)}); compare runs of one protocol")
        out.protocol = out.protocol or run.protocol
        out.synthetic |= run.dataset.startswith(SYNTHETIC_PREFIX)
        out.cells.setdefault((run.scenario, label), {})[run.seed] = run
    return out


def _values(runs: dict[int, StudyRun], metric: str, where: str) -> Values:
    """The cell's metric per seed: accuracy in %, bytes in GB."""
    try:
        return read_values(list(runs.values()), Quantity(metric), 1e-9 if metric == "bytes" else 100.0)
    except NoValue as e:
        raise UsageError(f"{where}: {e}") from None


def _verdict(value: float, lo: float, hi: float, exact: bool, lower_is_better: bool) -> str:
    """better / worse / within noise of A against B from the difference A - B and its interval."""
    sign = -1.0 if lower_is_better else 1.0  # fewer bytes is better
    if exact:
        return SAME if value == 0 else BETTER if sign * value > 0 else WORSE
    if math.isnan(lo):  # one run on a side: nothing says how far the next seed would move it
        return WITHIN_NOISE
    low, high = sorted((sign * lo, sign * hi))
    return BETTER if low > 0 else WORSE if high < 0 else WITHIN_NOISE


def _row(scenario: str, method: str, a: Values | None, b: Values | None, metric: str) -> dict:
    nan = math.nan
    if a is None or b is None:
        return {"scenario": scenario, "method": method, "a_mean": a.mean if a else nan, "b_mean": b.mean if b else nan,
                "diff": nan, "low": nan, "high": nan, "p": nan, "n_paired": 0, "test": "",
                "verdict": ONLY_A if b is None else ONLY_B, "n_a": a.n if a else 0, "n_b": b.n if b else 0,
                "words": ""}
    e = difference_estimate(a, b, exact=metric == "bytes")
    return {"scenario": scenario, "method": method, "a_mean": a.mean, "b_mean": b.mean, "diff": e.value,
            "low": e.lo, "high": e.hi, "p": e.p, "n_paired": len(set(a.per_seed) & set(b.per_seed)),
            "test": "exact" if e.exact else e.kind, "verdict": _verdict(e.value, e.lo, e.hi, e.exact, metric == "bytes"),
            "n_a": a.n, "n_b": b.n, "words": e.test}


def _pairs(a: RunSet, b: RunSet, methods: tuple[str, str] | None) -> dict:
    """(scenario, method column) -> (A's runs or None, B's runs or None). With `methods`, A is the
    first method's cell and B the second's in each scenario."""
    if methods is None:
        keys = sorted(set(a.cells) | set(b.cells))
        return {k: (a.cells.get(k), b.cells.get(k)) for k in keys}
    m1, m2 = methods
    scenarios = sorted({s for s, m in a.cells if m in methods})
    return {(s, f"{m1} vs {m2}"): (a.cells.get((s, m1)), a.cells.get((s, m2))) for s in scenarios}


def _check_methods(runs: RunSet, methods: tuple[str, str]) -> None:
    if methods[0] == methods[1]:
        raise UsageError(f"--methods names {methods[0]} twice; name two different methods")
    have = sorted({m for _, m in runs.cells})
    for m in methods:
        if m not in have:
            raise UsageError(f"--methods: no run of method {m} (the runs have: {', '.join(have)})")


def _cells_words(cells, limit: int = 6) -> str:
    shown = [f"{s}/{m}" for s, m in sorted(cells)[:limit]]
    return ", ".join(shown) + (f" and {len(cells) - limit} more" if len(cells) > limit else "")


def compare_runs(a_paths: Sequence[str | Path], out_dir: str | Path, *, against: Sequence[str | Path] | None = None,
                 methods: Sequence[str] | None = None, names: Sequence[str] | None = None,
                 metric: str = "accuracy") -> pd.DataFrame:
    """Compare the runs `a_paths` with the runs `against`, or, with `methods` (two labels), the first
    method with the second within `a_paths`; write compare.md, compare.csv and compare.png into
    `out_dir`. Every check comes before the first file is written."""
    if (against is None) == (methods is None):
        raise UsageError("give --against B_RUNS... (two sets of runs) or --methods M1 M2 (two methods of one set), "
                         "one of the two")
    if metric not in METRICS:
        raise UsageError(f"--metric {metric!r}: choose {' or '.join(METRICS)}")
    pair = (methods[0], methods[1]) if methods is not None else None
    if names is not None and (len(set(names)) != 2 or not all(n.strip() for n in names)):
        raise UsageError(f"--names {' '.join(map(repr, names))}: give two different, non-empty names")
    name_a, name_b = names if names is not None else (pair if pair is not None else ("A", "B"))
    a = load_set(a_paths, "A")
    if pair is not None:
        _check_methods(a, pair)
        b = a
    else:
        b = load_set(against or (), "B")
        if metric == "accuracy" and a.scoring != b.scoring:
            raise UsageError(f"A's runs were scored under {a.scoring}, B's under {b.scoring} (test_pool/model/"
                             "report): their accuracies do not compare (their bytes do: --metric bytes)")
    pairs = _pairs(a, b, pair)
    if not any(ra is not None and rb is not None for ra, rb in pairs.values()):
        if pair is not None:
            raise UsageError(f"no scenario has runs of both {pair[0]} and {pair[1]}: nothing to compare")
        raise UsageError(f"no (scenario, method) cell is in both sets: A has {_cells_words(a.cells)}; "
                         f"B has {_cells_words(b.cells)}")
    rows = []
    for (s, m), (ra, rb) in pairs.items():
        va = None if ra is None else _values(ra, metric, f"{name_a}: {s}/{m}")
        vb = None if rb is None else _values(rb, metric, f"{name_b}: {s}/{m}")
        rows.append(_row(s, m, va, vb, metric))
    full = pd.DataFrame(rows)
    smoke = a.synthetic or b.synthetic
    unit = "GB" if metric == "bytes" else "pp"
    title = (SMOKE_TITLE if smoke else "") + \
        f"{'Accuracy' if metric == 'accuracy' else 'Bytes sent'}: {name_a} vs {name_b}"
    if pair is not None:
        named = [m if m == n else f"{m} ({n})" for m, n in zip(pair, (name_a, name_b))]
        sides = f"A: {named[0]}; B: {named[1]}; each scenario of the runs in {_where(a_paths)}."
    else:
        sides = (f"A{'' if name_a == 'A' else ' = ' + name_a}: {_where(a_paths)}; "
                 f"B{'' if name_b == 'B' else ' = ' + name_b}: {_where(against or ())}.")
    protocol = f" Accuracy as reported: {protocol_words(a.protocol)}." if metric == "accuracy" else ""
    intro = [sides + protocol, _test_line(metric)]
    out = Path(out_dir)
    # the figure first: drawing is the step that could still fail, and then nothing is written
    _forest(full, out / "compare.png", title, unit, smoke, name_a, name_b, metric)
    frame = full[COLUMNS]
    atomic_write_text(out / "compare.csv", frame.to_csv(index=False))
    atomic_write_text(out / "compare.md", _markdown(full, title, intro, unit, name_a, name_b))
    return frame


def _test_line(metric: str) -> str:
    good = "fewer bytes" if metric == "bytes" else "higher accuracy"
    what = "bytes sent (GB)" if metric == "bytes" else "the reported accuracy (%, differences in points, pp)"
    return (f"Per scenario and method, the difference A - B of {what}: a paired t-test over the seeds both sides "
            "share (two or more) with the 95 % t interval of the mean difference, Welch's t-test of the two cells "
            f"where they share fewer, no interval with one run on a side. better: the whole interval on A's side "
            f"({good}); worse: the whole interval on B's; within noise: otherwise, or no interval; a difference the "
            "same in every seed is decided on its value (same: 0).")


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _difference(r, unit: str) -> str:
    """`+10.00 [+7.52, +12.48]`; `+0.0000 (exact)`; `+3.00 (no interval)`; `-` for a cell one side lacks."""
    if r.verdict in (ONLY_A, ONLY_B):
        return "-"
    if r.test == "exact":
        return f"{_num(r.diff, unit)} (exact)"
    if math.isnan(r.low):
        return f"{_num(r.diff, unit)} (no interval)"
    return f"{_num(r.diff, unit)} [{_num(r.low, unit)}, {_num(r.high, unit)}]"


def _seeds(r) -> str:
    if r.verdict in (ONLY_A, ONLY_B):
        return f"{r.n_a} vs {r.n_b}"
    if r.n_paired >= 2:
        return f"{r.n_paired} paired" + ("" if r.n_a == r.n_b == r.n_paired else f" ({r.n_a} vs {r.n_b} runs)")
    return f"{r.n_a} vs {r.n_b}, {r.n_paired} shared"  # too few to pair


def _where(paths: Sequence[str | Path]) -> str:
    """The runs as given, or, for more than three (the workflow passes every summary.json), how many
    and the folder that holds them all."""
    if len(paths) <= 3:
        return ", ".join(map(str, paths))
    try:
        folder = os.path.commonpath([str(p) for p in paths])
    except ValueError:  # relative and absolute paths mixed: their common folder, absolute
        folder = os.path.commonpath([os.path.abspath(p) for p in paths])
    return f"{len(paths)} runs under {folder}"


def _markdown(full: pd.DataFrame, title: str, intro: list[str], unit: str, name_a: str, name_b: str) -> str:
    mean_unit = "GB" if unit == "GB" else "%"
    head = ["scenario", "method", f"{name_a} mean [{mean_unit}]", f"{name_b} mean [{mean_unit}]",
            f"difference [{unit}] [95 % CI]", "test", "seeds", "verdict"]
    lines = [f"# {_md(title)}", "", *(f"{_md(line)}  " for line in intro), "",
             "| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head)]
    for r in full.itertuples():
        means = ["-" if math.isnan(x) else _fmt(x, unit) for x in (r.a_mean, r.b_mean)]
        cells = [r.scenario, r.method, *means, _difference(r, unit), r.words or "-", _seeds(r), f"**{r.verdict}**"]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines += ["", counts_line(full) + "."]
    return "\n".join(lines) + "\n"


def counts_line(frame: pd.DataFrame) -> str:
    """`N cells: x better, y worse, z within noise`, then the rarer verdicts where they occur."""
    counts = frame["verdict"].value_counts()
    shown = [v for v in VERDICTS if v in (BETTER, WORSE, WITHIN_NOISE) or counts.get(v, 0)]
    return f"{len(frame)} cells: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in shown)


def _forest(full: pd.DataFrame, path: Path, title: str, unit: str, smoke: bool, name_a: str, name_b: str,
            metric: str) -> None:
    """One row per compared cell, top to bottom as in the table: the difference, its interval, 0."""
    plt = pyplot()
    drawn = full[~full["verdict"].isin((ONLY_A, ONLY_B))]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(drawn) + 1.6), layout="constrained")
    for y, r in enumerate(drawn.itertuples()):
        colour = COLOURS[r.verdict]
        if not math.isnan(r.low) and r.low != r.high:
            ax.plot([r.low, r.high], [y, y], color=colour, linewidth=1.6)
        hollow = math.isnan(r.low)  # one run on a side: a point with nothing around it
        ax.plot([r.diff], [y], "o", color=colour, markersize=5, label=r.verdict,
                markerfacecolor="white" if hollow else colour)
    ax.axvline(0, color="black", linewidth=0.7)
    ax.set_yticks(range(len(drawn)), [f"{r.scenario}: {r.method}" for r in drawn.itertuples()], fontsize=7)
    ax.set_ylim(len(drawn) - 0.5, -0.5)  # the table's order, top down
    good = "fewer bytes is better" if metric == "bytes" else "higher is better"
    left_out = len(full) - len(drawn)
    ax.set_xlabel(f"{name_a} - {name_b} [{unit}] ({good}): mean over seeds and 95 % CI"
                  + ("; hollow: no interval" if drawn["low"].isna().any() else "")
                  + (f"; {left_out} cell{'s' * (left_out > 1)} only in one side, not drawn" if left_out else ""),
                  fontsize=8)
    handles: dict = {}
    for h, label in zip(*ax.get_legend_handles_labels()):
        handles.setdefault(label, h)
    shown = [v for v in VERDICTS if v in handles]
    ax.legend([handles[v] for v in shown], shown, fontsize=7, loc="best")
    decorate(fig, title, smoke)
    save_figure(fig, path, pdf=False)
