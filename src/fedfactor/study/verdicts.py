"""Every claim of the seed papers with its verdict at each scale, on one page (`fedfactor verdicts`).

The claims are the paper studies' (config/studies/*.yaml). A CPU-scale study (config/studies/cpu/)
tests them on embedded real images through `claims_from` (borrow.py); the paper studies test them at
paper scale. Both write the verdicts to `<results>/<study>/claims/claims.csv` from the same claim
definition; a study without results there (or with a smoke run's) shows "not run", but for the claims it
cannot test, which need paper scale whether it has run or not. One row per claim:
its paper and source, the paper's own numbers for the claim's comparisons (the claim evaluated on the
transcribed tables, where they print the values), ours at CPU scale with the 95 % intervals, the verdict
as run and as the text describes it, the scale it was tested at, and the paper-scale verdict. One figure
per paper: each CPU-scale comparison in percentage points with its interval, beside the claim's
condition.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ..io import atomic_write_text
from ..report.borrow import read_study_file
from ..report.cells import Values
from ..report.claims import NEEDS_PAPER_SCALE, NOT_RUN, VERDICTS, _deferred_rows, _Reader, evaluate_one
from ..report.figures import pyplot, save_figure
from ..report.paper import resolve_tables
from ..report.spec import Side, StudySpec, check_spec, with_text_variants
from .workflow import implemented, study_spec


@dataclass
class _PaperReader(_Reader):
    """The paper's own number for (method, scenario, metric), from its transcribed tables: a claim
    evaluated on it gives the paper's side of the comparison."""

    values: Mapping[tuple[str, str, str], float] = field(default_factory=dict)

    def get(self, side: Side, scenario: str, metric: str) -> Values | None:
        value = self.values.get((scenario, side.method, metric))
        if value is None:
            problem = f"{side.method} in {scenario}"
            if problem not in self.missing:
                self.missing.append(problem)
            return None
        return Values({0: value})


def paper_values(study: StudySpec) -> dict[tuple[str, str, str], float]:
    """(scenario, method label, claim metric) -> the paper's value, accuracies in %, bytes in GB."""
    out: dict[tuple[str, str, str], float] = {}
    if study.paper is None:
        return out
    for section in resolve_tables(study.paper):
        for (label, i), m in section.mapped.items():
            value = section.values[i].value
            if value is None or m.quantity.clients is not None:  # lost, or one domain's column
                continue
            out[(m.scenario, label, m.quantity.metric)] = value * (100.0 if section.metric == "accuracy_frac" else 1.0)
    return out


def spec_of(doc: Mapping[str, Any]) -> StudySpec:
    """A study YAML's StudySpec, as the workflow writes it (without its runs)."""
    return check_spec(study_spec(dict(doc), list(doc["scenarios"]), implemented(dict(doc), list(doc["methods"]))))


def read_verdicts(results: Path, study: str) -> pd.DataFrame | None:
    """A study's claims.csv, or None where it has no results yet or only a smoke run's."""
    path = results / study / "claims" / "claims.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path, keep_default_na=False)
    if "origin" not in frame or frame["smoke_run"].astype(str).str.len().gt(0).any():
        return None
    return frame


@dataclass
class Row:
    paper: str
    origin: str
    id: str
    claim: str
    source: str
    paper_numbers: str
    modes: list[str]
    cpu_study: str | None = None
    cpu: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # mode -> its claims.csv row
    paper_scale: dict[str, str] = field(default_factory=dict)  # mode -> verdict

    def cpu_verdict(self, mode: str) -> str:
        return str(self.cpu[mode]["verdict"]) if mode in self.cpu else NOT_RUN


def collect(studies: Path, cpu: Path, results: Path) -> tuple[list[Row], dict[str, dict[str, Any]]]:
    """Every claim of the paper studies in `studies`, with the verdicts found under `results`; and the
    CPU-scale studies in `cpu` by name."""
    cpu_docs = {d["study"]: d for d in (read_study_file(p) for p in sorted(cpu.glob("*.yaml")))}
    takes = {read_study_file(e["study"])["study"]: name for name, d in cpu_docs.items()
             for e in d.get("claims_from") or []}
    # (origin, id) -> mode -> its claims.csv row; "" and "as run" are one mode, since a CPU study may
    # check a text variant its paper study lacks
    cpu_rows: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for name, doc in cpu_docs.items():
        frame = read_verdicts(results, name)
        # a claim the study cannot test needs paper scale whether or not the study has run
        records = _deferred_rows(spec_of(doc), smoke=False) if frame is None else frame.to_dict("records")
        for r in records:
            cpu_rows.setdefault((r["origin"], r["id"]), {})[r["mode"] or "as run"] = r
    docs = [d for d in (read_study_file(p) for p in sorted(studies.glob("*.yaml"))) if d.get("claims")]
    papers = _papers(docs)
    rows = []
    for doc in docs:
        spec = spec_of(doc)
        own = read_verdicts(results, spec.study)
        at_scale = {} if own is None else {(r["id"], r["mode"]): r["verdict"] for r in own.to_dict("records")}
        values = paper_values(spec)
        for claim in spec.claims:
            text = with_text_variants(claim, spec.text_variants)
            # no runs (None): a _PaperReader gives the paper's own numbers and never reads them
            shown = evaluate_one(spec, None, claim, reader=_PaperReader(spec, None, values=values))  # type: ignore[arg-type]
            cpu_modes = cpu_rows.get((spec.study, claim.id), {})
            modes = ["as run", "text"] if text or "text" in cpu_modes else ["as run"]
            row = Row(papers[spec.study], spec.study, claim.id, claim.claim, claim.source,
                      shown["observed"] or "not printed", modes, takes.get(spec.study), cpu_modes)
            for mode in modes:
                row.paper_scale[mode] = at_scale.get((claim.id, mode), at_scale.get((claim.id, ""), NOT_RUN)
                                                     if mode == "as run" else NOT_RUN)
            rows.append(row)
    return rows, cpu_docs


def _papers(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Each study's paper: its `paper.name`, or for a study without paper tables (a figure's ablation)
    that of the study whose name shares the longest start with its own."""
    named = {d["study"]: d["paper"]["name"] for d in docs if d.get("paper")}

    def shared(a: str, b: str) -> int:
        return len(os.path.commonprefix([a, b]))

    return {d["study"]: named.get(d["study"]) or named[max(named, key=lambda s: shared(s, d["study"]))]
            for d in docs}


def _mapping(entry: Mapping[str, Any]) -> str:
    """`factorized_fl_label: cifar10_standard_iid, svhn_standard_iid -> standard_iid`: the paper study's
    scenarios by the CPU scenario that stands for them, and those left to paper scale."""
    onto: dict[str, list[str]] = {}
    for theirs, ours in (entry.get("scenarios") or {}).items():
        onto.setdefault(ours, []).append(theirs)
    parts = [f"{', '.join(theirs)} -> {ours}" for ours, theirs in onto.items()]
    far = list((entry.get("needs_paper_scale") or {}).get("scenarios") or {})
    parts += [f"{', '.join(far)}: paper scale only"] if far else []
    name = Path(entry["study"]).stem
    return f"{name}: " + ", ".join(f"`{p}`" for p in parts)


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _modes(row: Row, verdict) -> str:
    if row.modes == ["as run"]:
        return f"**{verdict('as run')}**"
    return "<br>".join(f"{m}: **{verdict(m)}**" for m in row.modes)


def _ours(row: Row) -> str:
    r = row.cpu.get("as run")
    if r is None:
        return ""
    if r["verdict"] == NEEDS_PAPER_SCALE:
        return f"paper scale only: {r['missing']}"
    parts = [str(r["interval"] or r["observed"])]
    if r["missing"]:
        parts.insert(0, f"missing: {r['missing']}")
    if r["scale_note"]:
        parts.append(f"({r['scale_note']})")
    if r.get("failed"):  # claims.csv files written before failed runs were recorded lack the column
        parts.append(f"failed runs left out: {r['failed']}")
    return "; ".join(p for p in parts if p)


def cpu_counts(rows: list[Row]) -> dict[str, int]:
    """Claims per CPU-scale verdict, each claim counted once, by its as-run verdict."""
    out = {v: 0 for v in VERDICTS}
    for r in rows:
        out[r.cpu_verdict("as run")] += 1
    return out


def _slug(paper: str) -> str:
    """`factorized_fl` of "Factorized-FL (000, ...)"; of "FedFac / FedSplit (001)", its first name."""
    name = paper.split(" (")[0].split(" / ")[0]
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def figure(rows: list[Row], paper: str, path: Path) -> bool:
    """Each CPU-scale comparison (pp) of the paper's claims with its 95 % interval, beside the band the
    claim's condition asks for; False (nothing written) when none has been run."""
    checks = [c for r in rows if r.paper == paper and "as run" in r.cpu for c in r.cpu["as run"].get("comparisons", [])]
    checks = [c for c in checks if c["unit"] == "pp" and math.isfinite(c["value"])]
    if not checks:
        return False
    colours = {"reproduced": "#1a7f37", "not reproduced": "#cf222e", "within noise": "#9a6700"}
    height = 0.22 * len(checks) + 1.2
    fig, ax = pyplot().subplots(figsize=(10, height), layout="constrained")  # room for the long labels
    span = max(max(abs(c["value"]), abs(c["low"]) if math.isfinite(c["low"]) else 0,
                   abs(c["high"]) if math.isfinite(c["high"]) else 0) for c in checks) * 1.1 + 1
    for y, c in enumerate(reversed(checks)):
        lo = max(c["condition_low"], -span) if math.isfinite(c["condition_low"]) else -span
        hi = min(c["condition_high"], span) if math.isfinite(c["condition_high"]) else span
        ax.plot([lo, hi], [y, y], color="#d0d7de", linewidth=6, solid_capstyle="butt", zorder=1)
        colour = colours.get(c["verdict"], "#777777")
        if math.isfinite(c["low"]):
            ax.plot([c["low"], c["high"]], [y, y], color=colour, linewidth=1.5, zorder=2)
        ax.plot([c["value"]], [y], "o", color=colour, markersize=4, zorder=3)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_yticks(range(len(checks)))
    ax.set_yticklabels([f"{c['id']}: {c['comparison']}" for c in reversed(checks)], fontsize=6)
    ax.set_xlim(-span, span)
    ax.set_xlabel("ours at CPU scale: the claim's difference or lead (pp), mean over seeds, 95 % CI\n"
                  "grey: where the claim needs it", fontsize=7)
    ax.set_title(f"{paper}: claims at CPU scale\ngreen reproduced, red not reproduced, amber within noise",
                 fontsize=8)
    save_figure(fig, path, pdf=False)  # atomically, as every figure of the project
    return True


def _comparisons(results: Path, cpu_docs: Mapping[str, Any], rows: list[Row]) -> None:
    """Attach each CPU study's comparisons.csv rows to the claims they belong to."""
    by_key: dict[tuple[str, str, str], list[dict]] = {}
    for name in cpu_docs:
        path = results / name / "claims" / "comparisons.csv"
        if path.is_file() and read_verdicts(results, name) is not None:
            for c in pd.read_csv(path, keep_default_na=False,
                                 converters={"mode": str}).to_dict("records"):
                for k in ("value", "low", "high", "condition_low", "condition_high"):
                    c[k] = float(c[k]) if c[k] != "" else math.nan
                by_key.setdefault((c["origin"], c["id"], c["mode"]), []).append(c)
    for r in rows:
        for mode, found in r.cpu.items():
            r.cpu[mode] = {**found, "comparisons": by_key.get((r.origin, r.id, found["mode"]), [])}


def write_page(studies: Path, cpu: Path, results: Path, out: Path) -> list[Row]:
    """docs/verdicts.md (at `out`) and a figure per paper beside it."""
    rows, cpu_docs = collect(studies, cpu, results)
    _comparisons(results, cpu_docs, rows)
    papers = list(dict.fromkeys(r.paper for r in rows))
    head = ["paper", "claims", *(f"CPU: {v}" for v in VERDICTS), "paper scale: run"]
    lines = [
        "# Verdicts: every claim of the seed papers, at each scale",
        "",
        "Generated by `fedfactor verdicts` from the studies' results (`bash workflow/scripts/cpu_scale.sh` runs "
        "the CPU-scale studies and writes this page); do not edit. How the CPU-scale studies are built, what they "
        "change and why: [CPU scale](cpu_scale.md).",
        "",
        "A claim is defined once, in its paper study (config/studies/); the CPU-scale studies "
        "(config/studies/cpu/) test the same definition on embedded real images, each of the paper's scenarios "
        "on its analogue. Verdicts: reproduced (the whole 95 % interval meets the claim's condition), not "
        "reproduced (none of it does), within noise (otherwise), needs paper scale (the CPU scale has no "
        "analogue; the reason is given), not run (no results yet). A claim about a seed method has two verdicts: "
        "as run (the authors' code, the default) and text (the paper's text as written). \"Paper's numbers\" is "
        "the claim evaluated on the paper's own transcribed tables, where they print the values.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for paper in papers:
        mine = [r for r in rows if r.paper == paper]
        counts = cpu_counts(mine)
        ran = sum(any(v != NOT_RUN for v in r.paper_scale.values()) for r in mine)
        lines.append("| " + " | ".join(_md(x) for x in (paper, len(mine), *(counts[v] for v in VERDICTS),
                                                          ran)) + " |")
    for paper in papers:
        mine = [r for r in rows if r.paper == paper]
        lines += ["", f"## {paper}", ""]
        used = list(dict.fromkeys(r.cpu_study for r in mine if r.cpu_study))
        for name in used:
            d = cpu_docs[name]
            lines.append(f"- CPU scale: `{name}` ({_md(d.get('title', name))}; {len(d['seeds'])} seeds; "
                         f"config/studies/cpu/: `snakemake --cores all --configfile <its file>`), "
                         + "; ".join(_mapping(e) for e in d.get("claims_from") or []))
        slug = _slug(paper)
        if figure(rows, paper, out.parent / f"verdicts_{slug}.png"):
            lines += ["", f"![{paper}: claims at CPU scale](verdicts_{slug}.png)"]
        lines += ["", "| claim | source | paper's numbers | ours at CPU scale (mean, 95 % CI) | CPU-scale verdict | "
                      "tested at | paper-scale verdict |", "|---|---|---|---|---|---|---|"]
        for r in mine:
            scale = "no CPU-scale study takes it" if r.cpu_study is None else f"`{r.cpu_study}`"
            lines.append("| " + " | ".join([
                f"**{_md(r.origin)}.{_md(r.id)}**: {_md(r.claim)}", _md(r.source), _md(r.paper_numbers),
                _md(_ours(r)), _modes(r, r.cpu_verdict), scale,
                _modes(r, lambda m: r.paper_scale.get(m, NOT_RUN))]) + " |")
    atomic_write_text(out, "\n".join(lines) + "\n")
    return rows
