"""The papers' qualitative claims checked on our runs: one verdict per claim of a study.

Claims are data (the `claims` section of a study YAML, see spec.py). A claim makes comparisons (a
scenario, a pair of methods). Each comparison has a quantity per seed: the difference a - b (order,
drop and close claims), the lead of the method over the best other method of that seed (best claims)
or the ratio a / b (ratio claims). Runs of the same seed share their partition, so on the seeds the
compared runs share (two or more) the test is paired: a one-sample t-test of the per-seed quantity
(the paired t-test for differences), with the 95 % Student t interval of its mean. Where fewer than
two seeds are shared, two cells fall back to Welch's t-test of their runs (a best claim: the method
against the next best on the means); a ratio has no unpaired interval.

Verdict of a comparison, from that interval and the claim's condition (`_Region`):
`reproduced` when the whole interval meets the condition, `not reproduced` when none of it does,
`within noise` otherwise. A quantity identical in every seed (bytes, as a rule) has no noise: it is
decided on its value. One seed gives no interval: the comparison is `within noise`, since one run says
nothing about how far the next seed would move it; bytes are the exception and are decided on the
value, because a run's communication is set by the model, the rounds and the clients that take part,
not by the training's randomness. Two accuracies at 100 % in every seed of both (an analogue too easy
for the claim) decide nothing either: that comparison is `within noise`, saying so. A claim is `reproduced` when every comparison is, `not reproduced`
when any is not, `within noise` otherwise, and `not run` when a needed run is missing or a method is
not implemented yet (the `missing` column says which). A ratio whose denominator is zero in a seed (a
method that sends nothing) has no quantity: that comparison, and the claim unless another comparison
is not reproduced, is `not applicable`, with the reason.

The report gives the means, the quantity with its interval, test and p-value (two-sided, against no
difference or a ratio of 1), the condition, the number of seeds and how many seeds agree on their own.

`evaluate_claims(study, summaries, out_dir)` writes claims.md, claims.csv and claims.html, and every
comparison's quantity, interval and condition as numbers in comparisons.csv.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence, cast

import numpy as np
import pandas as pd
from scipy import stats

from ..io import atomic_write_text
from .cells import CONFIDENCE, NoValue, Quantity, StudyRuns, Values, is_smoke, load_runs, read_values
from .paper import html_page
from .spec import (SMOKE_COLUMN, SMOKE_TITLE, BestClaim, CloseClaim, DropClaim, OrderClaim, RatioClaim, Side, StudySpec,
                   protocol_words, unit_of, with_text_variants)

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
WITHIN_NOISE = "within noise"
NOT_RUN = "not run"
# a ratio whose denominator is zero in some seed (a method that sends nothing): no number to decide on
NOT_APPLICABLE = "not applicable"
# a claim taken from another study (claims_from) that this scale cannot test (report/borrow.py)
NEEDS_PAPER_SCALE = "needs paper scale"
CHECKS = "comparisons"  # the key of a row's comparisons, which claims.csv leaves out
CHECK_COLUMNS = ["origin", "id", "mode", "comparison", "unit", "value", "low", "high", "verdict", "condition_low",
                 "condition_high"]
VERDICTS = (REPRODUCED, NOT_REPRODUCED, WITHIN_NOISE, NOT_APPLICABLE, NEEDS_PAPER_SCALE, NOT_RUN)
INTERVAL_HEAD = "quantity per seed: mean, 95 % CI, test"
COLUMNS = ["smoke_run", "origin", "id", "mode", "kind", "verdict", "claim", "observed", "interval", "condition",
           "seeds", "seeds_agree", "missing", "source", "note", "scale_note", "failed"]


@dataclass(frozen=True)
class _Estimate:
    """A comparison's quantity over seeds: its value, 95 % interval (NaN: none) and the test in words.
    `exact`: decided on the value (no spread over the seeds, or bytes of one seed). `p` (NaN: no test)
    and `kind` (paired, welch or none) are the test as data, for `fedfactor compare`'s csv."""

    value: float
    lo: float
    hi: float
    test: str
    exact: bool = False
    p: float = math.nan
    kind: str = "none"


@dataclass(frozen=True)
class _Region:
    """Where a comparison's quantity must lie for the claim to hold: from `low` (excluded when
    `open_low`) to `high`. Every claim's condition is such an interval, so an interval of the
    quantity meets it entirely when both its ends do."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False

    def holds(self, x: float) -> bool:
        return (x > self.low if self.open_low else x >= self.low) and x <= self.high

    def misses(self, lo: float, hi: float) -> bool:
        return (hi <= self.low if self.open_low else hi < self.low) or lo > self.high

    def verdict(self, e: _Estimate) -> str:
        if e.exact:
            return REPRODUCED if self.holds(e.value) else NOT_REPRODUCED
        if math.isnan(e.lo):
            return WITHIN_NOISE
        if self.holds(e.lo) and self.holds(e.hi):
            return REPRODUCED
        return NOT_REPRODUCED if self.misses(e.lo, e.hi) else WITHIN_NOISE


def _above(margin: float) -> _Region:
    """More than 0 and at least `margin`."""
    return _Region(margin, open_low=margin == 0)


def _p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


CEILING = 100.0  # accuracy in %: the most a run can score


def _at_ceiling(unit: str, *cells: Values) -> bool:
    """Every seed of every cell scores 100 %: no difference between them can show, whatever the
    methods do (an analogue too easy for its claim), so the comparison decides nothing."""
    return unit == "pp" and all(v == CEILING for cell in cells for v in cell.per_seed.values())


def _ceiling(e: _Estimate, n: int) -> _Estimate:
    return replace(e, lo=math.nan, hi=math.nan, exact=False,
                   test=f"both at 100 % in all {n} seeds: the ceiling separates nothing")


def _paired_test(x: np.ndarray, null: float) -> _Estimate:
    value = float(x.mean())
    if np.all(x == x[0]):  # scipy's interval would be degenerate or NaN: the value is exact
        return _Estimate(value, value, value, f"the same in all {len(x)} seeds", exact=True, kind="paired")
    t = stats.ttest_1samp(x, null)
    ci = t.confidence_interval(CONFIDENCE)
    return _Estimate(value, float(ci.low), float(ci.high), f"paired t-test {_p(t.pvalue)}, n={len(x)}",
                     p=float(t.pvalue), kind="paired")


def _welch_test(a: Values, b: Values) -> _Estimate:
    xa, xb = list(a.per_seed.values()), list(b.per_seed.values())
    value, n = a.mean - b.mean, f"n={a.n} vs {b.n}"
    # the values, not std == 0: the std of three seeds at 0.7 is 1e-16 in floating point
    if len(set(xa)) == 1 and len(set(xb)) == 1:
        return _Estimate(value, value, value, f"the same in all seeds of each side, seeds not paired, {n}", exact=True,
                         kind="welch")
    t = stats.ttest_ind(xa, xb, equal_var=False)
    ci = t.confidence_interval(CONFIDENCE)
    return _Estimate(value, float(ci.low), float(ci.high), f"Welch t-test (seeds not paired) {_p(t.pvalue)}, {n}",
                     p=float(t.pvalue), kind="welch")


def _estimate(values: Sequence[Values], quantity: Callable[..., float], null: float, exact: bool,
              welch: tuple[Values, Values] | None) -> _Estimate:
    """`quantity` of the cells `values` over seeds: paired on the seeds all of them have when there are
    two or more, else Welch's t-test of the two cells `welch` (None: no unpaired test). `exact`: the
    quantity does not vary with the seed (bytes), so one seed decides it."""
    shared = sorted(set.intersection(*(set(v.per_seed) for v in values)))
    if len(shared) >= 2:
        return _paired_test(np.array([quantity(*(v.per_seed[s] for v in values)) for s in shared]), null)
    if welch is not None and min(v.n for v in welch) >= 2:
        return _welch_test(*welch)
    n = "n=1" if shared and all(v.n == 1 for v in values) else \
        "seeds not paired, n=" + " vs ".join(str(v.n) for v in values)
    value = quantity(*(v.mean for v in values))
    return _Estimate(value, math.nan, math.nan, f"{n}, no interval" + (", bytes taken as exact" if exact else ""),
                     exact=exact)


def difference_estimate(a: Values, b: Values, exact: bool) -> _Estimate:
    """a - b over seeds, tested as an order claim's difference is: paired on the seeds both cells share
    (two or more), else Welch's t-test of the two cells, else no interval. `exact`: bytes, decided on
    the value. The claims and `fedfactor compare` share it, so one pair of cells gets one verdict."""
    return _estimate([a, b], lambda x, y: x - y, 0.0, exact, (a, b))


@dataclass
class _Check:
    """One comparison of a claim (a scenario, a pair of methods): the means, the test's interval and
    verdict, and the seeds that agree on their own."""

    text: str  # the means and their difference
    label: str  # the comparison, for the interval column
    estimate: _Estimate
    verdict: str
    agree: int
    paired: int
    unit: str  # pp, GB, or "" for a ratio
    region: _Region | None = None  # where the quantity must lie (None: no quantity)

    @property
    def interval(self) -> str:
        """`s1: a vs b: +10.00 pp, 95 % CI [+7.52, +12.48], paired t-test p=0.0033, n=3 (reproduced)`."""
        e, u = self.estimate, self.unit
        if math.isnan(e.value):  # no quantity (a ratio to zero): the reason alone
            return f"{self.label}: {e.test} ({self.verdict})"
        ci = "" if math.isnan(e.lo) or e.lo == e.hi else f", 95 % CI [{_num(e.lo, u)}, {_num(e.hi, u)}]"
        return f"{self.label}: {_num(e.value, u)}{' ' + u if u else ''}{ci}, {e.test} ({self.verdict})"


def _num(x: float, unit: str) -> str:
    """A difference signed, in pp or GB; a ratio (no unit) to 4 significant digits."""
    return f"{x:+.{4 if unit == 'GB' else 2}f}" if unit else f"{x:.4g}"


@dataclass
class _Reader:
    """Our numbers for one claim, recording what is missing."""

    study: StudySpec
    runs: StudyRuns
    missing: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # runs of the compared cells that failed, left out

    def get(self, side: Side, scenario: str, metric: str) -> Values | None:
        label = side.method
        problem = None
        for run in self.runs.failed.get((scenario, label), []):
            text = f"{label} in {scenario}, seed {run.seed}: {run.reason}"
            if text not in self.failed:
                self.failed.append(text)
        if not self.study.methods[label].implemented:
            problem = f"{label}: not implemented yet"
        elif not (found := self.runs.cells.get((scenario, label))):
            problem = f"{label} in {scenario}: no runs" + (" finished" if (scenario, label) in self.runs.failed else "")
        else:
            scale = 1e-9 if metric == "bytes" else 100.0
            try:
                values = read_values(found, Quantity(metric), scale)
                self.seeds.append(values.n)
                return values
            except NoValue as e:
                problem = f"{label} in {scenario}: {e}"
        if problem not in self.missing:
            self.missing.append(problem)
        return None


def _fmt(x: float, unit: str) -> str:
    return f"{x:.4f}" if unit == "GB" else f"{x:.2f}"


def _name(claim, side: Side) -> str:
    metric = claim.metric_of(side)
    return side.method if metric == claim.metric else f"{side.method} [{metric}]"


def _paired(values: Sequence[Values], test: Callable[..., bool]) -> tuple[int, int]:
    """Seeds every cell has, and how many of them pass `test` on their own."""
    seeds = set.intersection(*(set(v.per_seed) for v in values))
    agree = sum(bool(test(*(v.per_seed[s] for v in values))) for s in seeds)
    return agree, len(seeds)


def _difference(claim, reader: _Reader, pairs, region: _Region, unit: str, verb: str = "vs") -> list[_Check]:
    """Checks of a - b for each ((side, scenario), (side, scenario)) pair."""
    out = []
    for (sa, xa), (sb, xb) in pairs:
        va, vb = reader.get(sa, xa, claim.metric_of(sa)), reader.get(sb, xb, claim.metric_of(sb))
        if va is None or vb is None:
            continue
        d = va.mean - vb.mean
        if xa == xb:
            label = f"{xa}: {_name(claim, sa)} {verb} {_name(claim, sb)}"
            text = f"{xa}: {_name(claim, sa)} {_fmt(va.mean, unit)} {verb} {_name(claim, sb)} {_fmt(vb.mean, unit)}"
        else:
            label = f"{_name(claim, sa)}: {xa} -> {xb}"
            text = f"{_name(claim, sa)}: {xa} {_fmt(va.mean, unit)} -> {xb} {_fmt(vb.mean, unit)}"
        est = difference_estimate(va, vb, unit == "GB")
        if _at_ceiling(unit, va, vb):
            est = _ceiling(est, min(va.n, vb.n))
        agree, paired = _paired([va, vb], lambda a, b: region.holds(a - b))
        out.append(_Check(f"{text} ({d:+.{4 if unit == 'GB' else 2}f} {unit})", label, est, region.verdict(est),
                          agree, paired, unit, region))
    return out


def _checks(claim, reader: _Reader) -> tuple[list[_Check], str]:
    """The claim's comparisons and its condition in words."""
    unit = unit_of(claim.metric_of(claim.sides()[0]))
    if isinstance(claim, OrderClaim):
        pairs = [((a, s), (b, s)) for s in claim.scenarios for a in claim.a for b in claim.b]
        cond = "a > b" + (f" by >= {_fmt(claim.margin, unit)} {unit}" if claim.margin else "") + " in every scenario"
        return _difference(claim, reader, pairs, _above(claim.margin), unit), cond
    if isinstance(claim, DropClaim):
        pairs = [((claim.method, f), (claim.method, t)) for f, t in zip(claim.from_, claim.to)]
        cond = "falls from each `from` to its `to` scenario" + (
            f" by >= {_fmt(claim.margin, unit)} {unit}" if claim.margin else "")
        return _difference(claim, reader, pairs, _above(claim.margin), unit), cond
    if isinstance(claim, CloseClaim):
        # CloseClaim._one_form: either a, b and scenarios are all given, or method, from and to
        if claim.scenarios is not None:
            assert claim.a is not None and claim.b is not None
            pairs = [((claim.a, s), (claim.b, s)) for s in claim.scenarios]
        else:
            assert claim.method is not None and claim.from_ is not None and claim.to is not None
            pairs = [((claim.method, f), (claim.method, t)) for f, t in zip(claim.from_, claim.to)]
        region = _Region(-claim.tolerance, claim.tolerance)
        return _difference(claim, reader, pairs, region, unit), f"|difference| <= {_fmt(claim.tolerance, unit)} {unit}"
    if isinstance(claim, RatioClaim):
        return _ratio(claim, reader)
    if isinstance(claim, BestClaim):
        return _best(claim, reader, unit)
    raise TypeError(type(claim))


def _ratio(claim: RatioClaim, reader: _Reader) -> tuple[list[_Check], str]:
    def ratio(a: float, b: float) -> float:
        return a / b

    region = _Region(-math.inf if claim.min is None else claim.min, math.inf if claim.max is None else claim.max)
    out = []
    unit = unit_of(claim.metric_of(claim.a))
    for s in claim.scenarios:
        va, vb = reader.get(claim.a, s, claim.metric_of(claim.a)), reader.get(claim.b, s, claim.metric_of(claim.b))
        if va is None or vb is None:
            continue
        zero = [seed for seed, x in vb.per_seed.items() if x == 0]
        if zero:  # a / 0 is no quantity: say so instead of an infinite ratio that any minimum meets
            b = _name(claim, claim.b)
            why = f"{b} sends nothing" if unit == "GB" else f"{b} is 0"
            seeds = "every seed" if len(zero) == vb.n else f"seed{'s' if len(zero) > 1 else ''} " + \
                ", ".join(map(str, zero))
            out.append(_Check(f"{s}: {_name(claim, claim.a)} {_fmt(va.mean, unit)} / {b} {_fmt(vb.mean, unit)}: "
                              f"{NOT_APPLICABLE}, {why} ({seeds})", f"{s}: {_name(claim, claim.a)} / {b}",
                              _Estimate(math.nan, math.nan, math.nan, f"{why} in {seeds}"), NOT_APPLICABLE, 0, 0, ""))
            continue
        est = _estimate([va, vb], ratio, 1.0, unit == "GB", None)
        agree, paired = _paired([va, vb], lambda a, b: region.holds(ratio(a, b)))
        out.append(_Check(f"{s}: {_name(claim, claim.a)} {_fmt(va.mean, unit)} / {_name(claim, claim.b)} "
                          f"{_fmt(vb.mean, unit)} = {ratio(va.mean, vb.mean):.4g}",
                          f"{s}: {_name(claim, claim.a)} / {_name(claim, claim.b)}", est, region.verdict(est),
                          agree, paired, "", region))
    lo = "" if claim.min is None else f"{claim.min:g} <= "
    hi = "" if claim.max is None else f" <= {claim.max:g}"
    return out, f"{lo}a / b{hi} in every scenario"


def _best(claim: BestClaim, reader: _Reader, unit: str) -> tuple[list[_Check], str]:
    lowest = unit == "GB"  # fewer bytes is better
    region = _above(claim.margin)
    out = []
    for s in claim.scenarios:
        mine = reader.get(claim.method, s, claim.metric_of(claim.method))
        got = [reader.get(o, s, claim.metric_of(o)) for o in claim.among]
        if mine is None or any(o is None for o in got):
            continue
        others = cast("list[Values]", got)  # none is None: checked just above

        def lead(me: float, *rest: float) -> float:
            return min(rest) - me if lowest else me - max(rest)

        d = lead(mine.mean, *(o.mean for o in others))
        k = min(range(len(others)), key=lambda i: others[i].mean) if lowest else \
            max(range(len(others)), key=lambda i: others[i].mean)
        # unpaired, the lead can only be tested against one other method: the next best on the means
        est = _estimate([mine, *others], lead, 0.0, lowest, (others[k], mine) if lowest else (mine, others[k]))
        if _at_ceiling(unit, mine, others[k]):
            est = _ceiling(est, min(mine.n, others[k].n))
        agree, paired = _paired([mine, *others], lambda me, *rest: region.holds(lead(me, *rest)))
        out.append(_Check(f"{s}: {_name(claim, claim.method)} {_fmt(mine.mean, unit)}, next best "
                          f"{_name(claim, claim.among[k])} {_fmt(others[k].mean, unit)} ({d:+.{4 if lowest else 2}f} "
                          f"{unit})", f"{s}: {_name(claim, claim.method)}'s lead", est, region.verdict(est),
                          agree, paired, unit, region))
    word = "lowest" if lowest else "highest"
    cond = f"{word} of the set" + (f" by >= {_fmt(claim.margin, unit)} {unit}" if claim.margin else "") + \
        " in every scenario"
    return out, cond


def _verdict(checks: list[_Check]) -> str:
    verdicts = {c.verdict for c in checks}
    for verdict in (NOT_REPRODUCED, NOT_APPLICABLE):
        if verdict in verdicts:
            return verdict
    return WITHIN_NOISE if WITHIN_NOISE in verdicts else REPRODUCED


def evaluate_one(study: StudySpec, runs: StudyRuns, claim, smoke: bool = False, mode: str = "",
                 reader: _Reader | None = None) -> dict:
    """The claim's row; `reader` gives the numbers (default: the runs')."""
    reader = reader or _Reader(study, runs)
    checks, condition = _checks(claim, reader)
    agree, paired = sum(c.agree for c in checks), sum(c.paired for c in checks)
    return {
        "smoke_run": SMOKE_COLUMN if smoke else "", "origin": claim.origin or study.study,
        "id": claim.id, "mode": mode, "kind": claim.kind, "verdict": NOT_RUN if reader.missing else _verdict(checks),
        "claim": claim.claim, "observed": "; ".join(c.text for c in checks),
        "interval": "; ".join(c.interval for c in checks), "condition": condition,
        "seeds": min(reader.seeds) if reader.seeds else 0,
        "seeds_agree": f"{agree}/{paired}" if checks else "",
        "missing": "; ".join(reader.missing), "source": claim.source, "note": claim.note or "",
        "scale_note": claim.scale_note or "", "failed": "; ".join(reader.failed),
        CHECKS: [_check_row(claim, mode, study, c) for c in checks],
    }


def _check_row(claim, mode: str, study: StudySpec, c: _Check) -> dict:
    """One comparison as numbers, for comparisons.csv (the verdict page's figures)."""
    e, r = c.estimate, c.region
    return {"origin": claim.origin or study.study, "id": claim.id, "mode": mode, "comparison": c.label,
            "unit": c.unit or "ratio", "value": e.value, "low": e.lo, "high": e.hi, "verdict": c.verdict,
            "condition_low": r.low if r else math.nan, "condition_high": r.high if r else math.nan}


def _deferred_rows(study: StudySpec, smoke: bool) -> list[dict]:
    """A row per claim (and mode) this study takes from another but cannot test."""
    rows = []
    for d in study.paper_scale_only:
        for mode in ("as run", "text") if d.text else ("",):
            rows.append({"smoke_run": SMOKE_COLUMN if smoke else "", "origin": d.origin, "id": d.id, "mode": mode,
                         "kind": "", "verdict": NEEDS_PAPER_SCALE, "claim": d.claim, "observed": "", "interval": "",
                         "condition": "", "seeds": 0, "seeds_agree": "", "missing": d.reason, "source": d.source,
                         "note": d.note or "", "scale_note": "", "failed": ""})
    return rows


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _label(r, study: str) -> str:
    """A claim's id; one taken from another study (claims_from) prefixed with that study."""
    return r.id if r.origin == study else f"{r.origin}.{r.id}"


def _why(r) -> str:
    """What a row lacks: the runs it misses, or why it needs paper scale."""
    return f"{'paper scale only' if r.verdict == NEEDS_PAPER_SCALE else 'missing'}: {r.missing}"


def _notes(r) -> str:
    return " ".join(x for x in (r.note, r.scale_note and f"At this scale: {r.scale_note}.",
                                r.failed and f"{FAILED_WORDS}: {r.failed}.") if x)


# a failed run has no number: the claim is decided on the seeds every compared run finished
FAILED_WORDS = "Failed, left out (decided on the seeds whose runs all finished)"


def _markdown(title: str, intro: list[str], frame: pd.DataFrame, study: str) -> str:
    out = [f"# {title}", "", *(f"{line}  " for line in intro), ""]
    if frame.empty:
        return "\n".join(out + ["This study lists no claims."]) + "\n"
    head = ["id", "mode", "verdict", "claim", "observed (mean over seeds)", INTERVAL_HEAD, "condition", "seeds",
            "seeds agreeing", "source"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in frame.itertuples():
        observed = r.observed if not r.missing else "; ".join(x for x in (_why(r), r.observed) if x)
        out.append("| " + " | ".join(_md(x) for x in (_label(r, study), r.mode, f"**{r.verdict}**", r.claim, observed, r.interval,
                                                     r.condition, r.seeds, r.seeds_agree, r.source)) + " |")
    # a claim's two modes (as run, text) share their note: once
    notes = list(dict.fromkeys(f"- {_label(r, study)}: {_md(_notes(r))}" for r in frame.itertuples() if _notes(r)))
    if notes:
        out += ["", "Notes:", "", *notes]
    return "\n".join(out) + "\n"


def _lines(text: str) -> str:
    """A comparison per line."""
    return "<br>".join(html.escape(x) for x in text.split("; ") if x)


def _html(title: str, intro: list[str], frame: pd.DataFrame, smoke: bool, study: str) -> str:
    body = [f"<p>{html.escape(line)}</p>" for line in intro]
    if frame.empty:
        body.append("<p>This study lists no claims.</p>")
        return html_page(title, body, smoke)
    head = ["id", "mode", "verdict", "claim", "observed (mean over seeds)", INTERVAL_HEAD, "condition", "seeds",
            "seeds agreeing", "source", "note"]
    body.append("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>")
    for r in frame.itertuples():
        observed = _lines(r.observed)
        if r.missing:
            observed = (f'<span class="missing">{html.escape(_why(r))}</span>'
                        + ("<br>" + observed if observed else ""))
        cls = r.verdict.replace(" ", "-")
        cells = [html.escape(_label(r, study)), html.escape(r.mode), f'<span class="{cls}">{html.escape(r.verdict)}</span>',
                 html.escape(r.claim), observed, _lines(r.interval), html.escape(r.condition), str(r.seeds), html.escape(r.seeds_agree), html.escape(r.source),
                 html.escape(_notes(r))]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    body.append("</tbody></table>")
    return html_page(title, body, smoke)


def verdict_counts(frame: pd.DataFrame) -> str:
    """`N claims: a reproduced, b not reproduced, ...` of evaluate_claims' frame (the report's line and
    the command's)."""
    counts = frame["verdict"].value_counts()
    # "not applicable" (a ratio to a method that sends nothing) and "needs paper scale" (a claim taken
    # from a paper study) are rare: named only where they occur
    shown = [v for v in VERDICTS if v not in (NOT_APPLICABLE, NEEDS_PAPER_SCALE) or counts.get(v, 0)]
    return f"{len(frame)} claims: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in shown)


def evaluate_claims(study: StudySpec, summaries: Sequence[str | Path], out_dir: str | Path) -> pd.DataFrame:
    """Give every claim of `study` a verdict on the runs in `summaries` (summary.json files or folders;
    an empty list: no runs yet); write claims.md, claims.csv and claims.html into `out_dir`."""
    runs = load_runs(study, summaries)
    smoke = is_smoke(study, runs)
    rows = []
    for c in study.claims:
        text = with_text_variants(c, study.text_variants)
        rows.append(evaluate_one(study, runs, c, smoke, "as run" if text else ""))
        if text:  # the same claim with the text-as-written variants: which of the two reproduces
            rows.append(evaluate_one(study, runs, text, smoke, "text"))
    rows += _deferred_rows(study, smoke)
    checks = pd.DataFrame([c for r in rows for c in r.pop(CHECKS, [])], columns=CHECK_COLUMNS)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    title = f"{SMOKE_TITLE if smoke else ''}Claims: {study.title}"
    intro = [f"Study {study.study}; seeds {', '.join(map(str, study.seeds))}; our protocol: "
             f"{protocol_words(runs.protocol)}.",
             "Each comparison a claim makes (accuracy in %, differences in percentage points (pp); bytes in GB) is "
             "tested on its quantity per seed: the difference a - b, for a best claim the lead over the best other "
             "method of that seed, for a ratio claim a / b. Paired t-test over the seeds the compared runs share "
             "(Welch's t-test where they share fewer than two), with the 95 % confidence interval of the mean "
             "quantity and the two-sided p-value against no difference (a ratio of 1).",
             "reproduced: the whole interval meets the condition; not reproduced: none of it does; within noise: "
             "otherwise, or one seed (no interval). A quantity the same in every seed (bytes) is decided on its "
             "value, as are bytes of one seed. A claim is reproduced when all its comparisons are, not reproduced "
             "when any is not, else within noise. 'seeds agreeing' counts the seeds (paired across the compared "
             "runs) for which the condition holds on its own.",
             *(["A claim about a seed method is checked twice: 'as run' (the authors' code's behaviour, the "
                "default) and 'text' (the paper's text as written: " + ", ".join(
                    f"{t} for {a}" for a, t in study.text_variants.items()) + ")."] if study.text_variants else []),
             *(["Claims taken from other studies (claims_from) carry that study's name before their id; one this "
                "scale cannot test is 'needs paper scale', with the reason, and one tested on some of its "
                "scenarios says which are left to paper scale."] if (frame["origin"] != study.study).any() else []),
             verdict_counts(frame) + "."]
    out = Path(out_dir)
    atomic_write_text(out / "claims.csv", frame.to_csv(index=False))
    atomic_write_text(out / "comparisons.csv", checks.to_csv(index=False))
    atomic_write_text(out / "claims.md", _markdown(title, intro, frame, study.study))
    atomic_write_text(out / "claims.html", _html(title, intro, frame, smoke, study.study))
    return frame
