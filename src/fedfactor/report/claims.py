"""The papers' qualitative claims checked on our runs: one verdict per claim of a study.

Claims are data (the `claims` section of a study YAML, see spec.py). Each is evaluated on the means
over seeds; the report gives the observed numbers, the condition, the number of seeds and how many
seeds agree on their own. Verdicts: `reproduced`, `not reproduced`, or `not run` when a needed run is
missing or a method is not implemented yet (the `missing` column says which).

`evaluate_claims(study, summaries, out_dir)` writes claims.md, claims.csv and claims.html.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from ..io import atomic_write_text
from .cells import NoValue, Quantity, StudyRuns, Values, is_smoke, load_runs, read_values
from .paper import html_page
from .spec import (SMOKE_COLUMN, SMOKE_TITLE, BestClaim, CloseClaim, DropClaim, OrderClaim, RatioClaim, Side, StudySpec,
                   protocol_words, unit_of, with_text_variants)

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_RUN = "not run"
COLUMNS = ["smoke_run", "id", "mode", "kind", "verdict", "claim", "observed", "condition", "seeds", "seeds_agree",
           "missing", "source", "note"]


@dataclass
class _Check:
    """One comparison of a claim (a scenario, a pair of methods): the means' outcome and the seeds'."""

    text: str
    holds: bool
    agree: int
    paired: int


@dataclass
class _Reader:
    """Our numbers for one claim, recording what is missing."""

    study: StudySpec
    runs: StudyRuns
    missing: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)

    def get(self, side: Side, scenario: str, metric: str) -> Values | None:
        label = side.method
        problem = None
        if not self.study.methods[label].implemented:
            problem = f"{label}: not implemented yet"
        elif not (found := self.runs.cells.get((scenario, label))):
            problem = f"{label} in {scenario}: no runs"
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


def _above(margin: float) -> Callable[[float], bool]:
    return lambda d: d > 0 and d >= margin


def _difference(claim, reader: _Reader, pairs, test: Callable[[float], bool], unit: str,
                verb: str = "vs") -> list[_Check]:
    """Checks of a - b for each ((side, scenario), (side, scenario)) pair."""
    out = []
    for (sa, xa), (sb, xb) in pairs:
        va, vb = reader.get(sa, xa, claim.metric_of(sa)), reader.get(sb, xb, claim.metric_of(sb))
        if va is None or vb is None:
            continue
        d = va.mean - vb.mean
        if xa == xb:
            text = f"{xa}: {_name(claim, sa)} {_fmt(va.mean, unit)} {verb} {_name(claim, sb)} {_fmt(vb.mean, unit)}"
        else:
            text = f"{_name(claim, sa)}: {xa} {_fmt(va.mean, unit)} -> {xb} {_fmt(vb.mean, unit)}"
        agree, paired = _paired([va, vb], lambda a, b: test(a - b))
        out.append(_Check(f"{text} ({d:+.{4 if unit == 'GB' else 2}f} {unit})", test(d), agree, paired))
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
        if claim.scenarios is not None:
            pairs = [((claim.a, s), (claim.b, s)) for s in claim.scenarios]
        else:
            pairs = [((claim.method, f), (claim.method, t)) for f, t in zip(claim.from_, claim.to)]
        test = lambda d: abs(d) <= claim.tolerance  # noqa: E731
        return _difference(claim, reader, pairs, test, unit), f"|difference| <= {_fmt(claim.tolerance, unit)} {unit}"
    if isinstance(claim, RatioClaim):
        return _ratio(claim, reader)
    if isinstance(claim, BestClaim):
        return _best(claim, reader, unit)
    raise TypeError(type(claim))


def _ratio(claim: RatioClaim, reader: _Reader) -> tuple[list[_Check], str]:
    def ratio(a: float, b: float) -> float:
        return a / b if b else (math.inf if a else math.nan)

    def inside(r: float) -> bool:
        return not math.isnan(r) and (claim.min is None or r >= claim.min) and (claim.max is None or r <= claim.max)

    out = []
    unit = unit_of(claim.metric_of(claim.a))
    for s in claim.scenarios:
        va, vb = reader.get(claim.a, s, claim.metric_of(claim.a)), reader.get(claim.b, s, claim.metric_of(claim.b))
        if va is None or vb is None:
            continue
        r = ratio(va.mean, vb.mean)
        agree, paired = _paired([va, vb], lambda a, b: inside(ratio(a, b)))
        out.append(_Check(f"{s}: {_name(claim, claim.a)} {_fmt(va.mean, unit)} / {_name(claim, claim.b)} "
                          f"{_fmt(vb.mean, unit)} = {r:.4g}", inside(r), agree, paired))
    lo = "" if claim.min is None else f"{claim.min:g} <= "
    hi = "" if claim.max is None else f" <= {claim.max:g}"
    return out, f"{lo}a / b{hi} in every scenario"


def _best(claim: BestClaim, reader: _Reader, unit: str) -> tuple[list[_Check], str]:
    lowest = unit == "GB"  # fewer bytes is better
    out = []
    for s in claim.scenarios:
        mine = reader.get(claim.method, s, claim.metric_of(claim.method))
        others = [reader.get(o, s, claim.metric_of(o)) for o in claim.among]
        if mine is None or any(o is None for o in others):
            continue

        def lead(me: float, *rest: float) -> float:
            return min(rest) - me if lowest else me - max(rest)

        d = lead(mine.mean, *(o.mean for o in others))
        k = min(range(len(others)), key=lambda i: others[i].mean) if lowest else \
            max(range(len(others)), key=lambda i: others[i].mean)
        agree, paired = _paired([mine, *others], lambda me, *rest: _above(claim.margin)(lead(me, *rest)))
        out.append(_Check(f"{s}: {_name(claim, claim.method)} {_fmt(mine.mean, unit)}, next best "
                          f"{_name(claim, claim.among[k])} {_fmt(others[k].mean, unit)} ({d:+.{4 if lowest else 2}f} "
                          f"{unit})", _above(claim.margin)(d), agree, paired))
    word = "lowest" if lowest else "highest"
    cond = f"{word} of the set" + (f" by >= {_fmt(claim.margin, unit)} {unit}" if claim.margin else "") + \
        " in every scenario"
    return out, cond


def evaluate_one(study: StudySpec, runs: StudyRuns, claim, smoke: bool = False, mode: str = "") -> dict:
    reader = _Reader(study, runs)
    checks, condition = _checks(claim, reader)
    if reader.missing:
        verdict = NOT_RUN
    else:
        verdict = REPRODUCED if all(c.holds for c in checks) else NOT_REPRODUCED
    agree, paired = sum(c.agree for c in checks), sum(c.paired for c in checks)
    return {
        "smoke_run": SMOKE_COLUMN if smoke else "",
        "id": claim.id, "mode": mode, "kind": claim.kind, "verdict": verdict, "claim": claim.claim,
        "observed": "; ".join(c.text for c in checks), "condition": condition,
        "seeds": min(reader.seeds) if reader.seeds else 0,
        "seeds_agree": f"{agree}/{paired}" if checks else "",
        "missing": "; ".join(reader.missing), "source": claim.source, "note": claim.note or "",
    }


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _markdown(title: str, intro: list[str], frame: pd.DataFrame) -> str:
    out = [f"# {title}", "", *(f"{line}  " for line in intro), ""]
    if frame.empty:
        return "\n".join(out + ["This study lists no claims."]) + "\n"
    head = ["id", "mode", "verdict", "claim", "observed (mean over seeds)", "condition", "seeds", "seeds agreeing",
            "source"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in frame.itertuples():
        observed = r.observed if not r.missing else "; ".join(x for x in (f"missing: {r.missing}", r.observed) if x)
        out.append("| " + " | ".join(_md(x) for x in (r.id, r.mode, f"**{r.verdict}**", r.claim, observed,
                                                     r.condition, r.seeds, r.seeds_agree, r.source)) + " |")
    notes = [f"- {r.id}: {_md(r.note)}" for r in frame.itertuples() if r.note]
    if notes:
        out += ["", "Notes:", "", *notes]
    return "\n".join(out) + "\n"


def _html(title: str, intro: list[str], frame: pd.DataFrame, smoke: bool) -> str:
    body = [f"<p>{html.escape(line)}</p>" for line in intro]
    if frame.empty:
        body.append("<p>This study lists no claims.</p>")
        return html_page(title, body, smoke)
    head = ["id", "mode", "verdict", "claim", "observed (mean over seeds)", "condition", "seeds", "seeds agreeing",
            "source", "note"]
    body.append("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>")
    for r in frame.itertuples():
        observed = "<br>".join(html.escape(x) for x in r.observed.split("; ") if x)
        if r.missing:
            observed = (f'<span class="missing">missing: {html.escape(r.missing)}</span>'
                        + ("<br>" + observed if observed else ""))
        cls = r.verdict.replace(" ", "-")
        cells = [html.escape(r.id), html.escape(r.mode), f'<span class="{cls}">{html.escape(r.verdict)}</span>',
                 html.escape(r.claim),
                 observed, html.escape(r.condition), str(r.seeds), html.escape(r.seeds_agree), html.escape(r.source),
                 html.escape(r.note)]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    body.append("</tbody></table>")
    return html_page(title, body, smoke)


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
    frame = pd.DataFrame(rows, columns=COLUMNS)
    title = f"{SMOKE_TITLE if smoke else ''}Claims: {study.title}"
    counts = frame["verdict"].value_counts()
    intro = [f"Study {study.study}; seeds {', '.join(map(str, study.seeds))}; our protocol: "
             f"{protocol_words(runs.protocol)}.",
             "Each claim is checked on the means over seeds (accuracy in %, differences in percentage points (pp); "
             "bytes in GB); 'seeds agreeing' counts the seeds (paired across the compared runs) for which the "
             "condition holds on its own.",
             *(["A claim about a seed method is checked twice: 'as run' (the authors' code's behaviour, the "
                "default) and 'text' (the paper's text as written: " + ", ".join(
                    f"{t} for {a}" for a, t in study.text_variants.items()) + ")."] if study.text_variants else []),
             f"{len(frame)} claims: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in (REPRODUCED, NOT_REPRODUCED,
                                                                                      NOT_RUN)) + "."]
    out = Path(out_dir)
    atomic_write_text(out / "claims.csv", frame.to_csv(index=False))
    atomic_write_text(out / "claims.md", _markdown(title, intro, frame))
    atomic_write_text(out / "claims.html", _html(title, intro, frame, smoke))
    return frame
