"""Paper vs ours: each of a study's paper tables in the paper's own layout, every cell holding our
number (mean +- sample std over seeds [95 % t interval of the mean], n seeds), the paper's (value +- std)
and the difference ours - paper, in the paper's unit.

`paper_tables(study, summaries, out_dir)` writes paper.md, paper.csv (one row per cell), paper.tex and
paper.html (self-contained, for the Snakemake report). The mapping from our scenarios and method labels
to the paper's columns and rows is the study's `paper` section (see spec.py); the paper's numbers are
the CSVs in config/paper_numbers/ (format in its README).
"""

from __future__ import annotations

import csv
import functools
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_text
from .cells import NoValue, Quantity, StudyRuns, Values, is_smoke, load_runs, read_values, seeds_note, shown_interval
from .spec import (SMOKE_COLUMN, SMOKE_TITLE, PaperSpec, PaperTable, StudySpec, _parts, numbers_folder,
                   protocol_words)

CSV_COLUMNS = ["paper", "table", "dataset", "setting", "method", "metric", "value", "std", "note"]
UNITS = {"accuracy_pct": "accuracy [%]", "accuracy_frac": "accuracy [fraction]", "cost_gb": "communication [GB]"}
DECIMALS = {"accuracy_pct": 2, "accuracy_frac": 4, "cost_gb": 2}
MAX_COLUMNS = 7  # per block of a wide table, as the papers print theirs

NOT_RUN = "not run"
NOT_IMPLEMENTED = "not implemented yet"
LOST = "lost in extraction"
NOT_PRINTED = "not printed"


# ------------------------------------------------------------------------------ paper numbers

@dataclass(frozen=True)
class PaperValue:
    """One number of a paper table (a row of a paper_numbers CSV)."""

    paper: str
    table: str
    dataset: str
    setting: str
    method: str
    metric: str
    value: float | None
    std: float | None
    note: str

    @property
    def status(self) -> str:
        if self.value is not None:
            return "ok"
        # the paper prints '-' (Stand-Alone's cost); every other empty value was lost in the extraction
        return NOT_PRINTED if self.note.lower().startswith("printed '-'") else LOST


def _number(text: str, where: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"{where}: {text!r} is not a finite number")
    return value


@functools.lru_cache(maxsize=64)
def read_numbers(path: Path) -> tuple[PaperValue, ...]:
    """The rows of a paper_numbers CSV (format: config/paper_numbers/README.md)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or list(reader.fieldnames)[:len(CSV_COLUMNS)] != CSV_COLUMNS:
                raise UsageError(f"{path} is not a paper result table (its header must start with "
                                 f"{','.join(CSV_COLUMNS)})")
            rows = list(reader)
    except OSError as e:
        raise UsageError(f"cannot read paper numbers {path} ({e.strerror or e})") from None
    out, seen = [], set()
    for i, r in enumerate(rows, start=2):
        where = f"{path} line {i}"
        v = PaperValue(r["paper"], r["table"], r["dataset"], r["setting"], r["method"], r["metric"],
                       _number(r["value"] or "", where), _number(r["std"] or "", where), (r["note"] or "").strip())
        key = (v.table, v.dataset, v.setting, v.method, v.metric)
        if key in seen:
            raise UsageError(f"{where} repeats table {v.table!r}, dataset {v.dataset!r}, setting {v.setting!r}, "
                             f"method {v.method!r}, metric {v.metric}")
        seen.add(key)
        out.append(v)
    return tuple(out)


# ------------------------------------------------------------------------- resolved mapping

@dataclass(frozen=True)
class Mapped:
    """One of our cells mapped onto a paper value."""

    scenario: str
    label: str
    quantity: Quantity


@dataclass
class Section:
    """One paper table for one metric, resolved against its CSV."""

    spec: PaperTable
    metric: str
    csv: Path
    values: list[PaperValue]  # those shown, in the CSV's order
    row_of: dict[int, tuple[str, str]]  # index in values -> (row key, row label)
    col_of: dict[int, tuple[str, str]]  # index in values -> (column key, column label)
    mapped: dict[tuple[str, int], Mapped]  # (our label, index in values) -> our cell
    setting_note: str | None = None  # setting parts every value shares (grids)

    @property
    def source(self) -> str:
        v = self.values[0]
        return f"{v.paper}, {v.table}"


def _fail(table: PaperTable, metric: str, message: str) -> UsageError:
    return UsageError(f"paper table {table.csv} ({metric}): {message}")


def _hits(values: Sequence[PaperValue], dataset: str, parts: list[str], method: str) -> list[int]:
    return [i for i, v in enumerate(values)
            if v.dataset == dataset and v.method == method and set(parts) <= set(_parts(v.setting))]


def _match(table: PaperTable, metric: str, values: list[PaperValue], dataset: str, parts: list[str],
           method: str, what: str, every: Sequence[PaperValue] = ()) -> int | None:
    """The index of the one value of `method` on `dataset` whose setting holds every part; None when
    the paper reports that row or column only for another of the table's metrics."""
    hits = _hits(values, dataset, parts, method)
    if len(hits) == 1:
        return hits[0]
    if not hits and any(v.metric in table.metric for v in (every[i] for i in _hits(every, dataset, parts, method))):
        return None
    looked = f"dataset {dataset!r}, method {method!r}, setting with {'; '.join(parts)!r}"
    if hits:
        settings = "; ".join(repr(values[i].setting) for i in hits[:4])
        raise _fail(table, metric, f"{what}: {len(hits)} values match {looked} ({settings}); name more of the setting")
    datasets = list(dict.fromkeys(v.dataset for v in values))
    methods = list(dict.fromkeys(v.method for v in values if v.dataset == dataset))
    if dataset not in datasets:
        hint = f"its datasets: {', '.join(map(repr, datasets))}"
    elif method not in methods:
        hint = f"its methods on {dataset!r}: {', '.join(map(repr, methods))}"
    else:
        hint = "its settings there: " + ", ".join(
            repr(s) for s in dict.fromkeys(v.setting for v in values if v.dataset == dataset and v.method == method))
    raise _fail(table, metric, f"{what}: no value of {looked}; {hint}")


def _quantity(metric: str, clients: list[int] | None, strategy: str | None) -> Quantity:
    if metric == "cost_gb":
        return Quantity("bytes")
    if strategy is not None:
        return Quantity(f"new_clients.{strategy}")
    return Quantity("accuracy", tuple(clients) if clients is not None else None)


def _part(value: PaperValue, key: str, table: PaperTable, metric: str) -> str:
    for p in _parts(value.setting):
        if p.split("=", 1)[0].strip() == key:
            return p
    raise _fail(table, metric, f"layout: setting {value.setting!r} has no {key!r} part")


def resolve_table(table: PaperTable, metric: str, folder: Path) -> Section:
    path = folder / table.csv
    if not path.is_file():
        raise UsageError(f"paper table {table.csv}: no such file in {folder}")
    every = [v for v in read_numbers(path) if table.table is None or v.table == table.table]
    if not every:
        raise _fail(table, metric, f"no rows of table {table.table!r} in {path}")
    values = [v for v in every if v.metric == metric]
    if not values:
        have = ", ".join(dict.fromkeys(v.metric for v in every))
        raise _fail(table, metric, f"no values of metric {metric} (the file has: {have})")

    mapped: dict[tuple[str, int], Mapped] = {}

    def put(label: str, index: int, m: Mapped, what: str) -> None:
        if (label, index) in mapped:
            other = mapped[(label, index)].scenario
            raise _fail(table, metric, f"{what}: method {label!r} already fills this paper value from scenario "
                                       f"{other!r}; map one of them")
        mapped[(label, index)] = m

    for scenario, columns in table.scenarios.items():
        for col in columns:
            dataset = col.dataset or table.dataset
            assert dataset is not None  # PaperTable._consistent requires one
            for label, rows in table.methods.items():
                for row in rows:
                    parts = _parts(col.setting) + _parts(row.setting or "")
                    what = f"scenario {scenario!r} x method {label!r}"
                    i = _match(table, metric, values, dataset, parts, row.method, what, every)
                    if i is not None:
                        put(label, i, Mapped(scenario, label, _quantity(metric, col.clients, row.new_clients)), what)
    for n, c in enumerate(table.cells):
        what = f"cells[{n}]"
        dataset = c.dataset or table.dataset
        assert dataset is not None  # PaperTable._consistent requires one
        i = _match(table, metric, values, dataset, _parts(c.setting), c.paper_method, what, every)
        if i is not None:
            put(c.method, i, Mapped(c.scenario, c.method, _quantity(metric, c.clients, c.new_clients)), what)

    # the paper's datasets shown: those asked for, else those mapped
    datasets = list(dict.fromkeys(v.dataset for v in values))
    if table.datasets is not None:
        for d in table.datasets:
            if d not in datasets:
                have = ", ".join(map(repr, datasets))
                raise _fail(table, metric, f"datasets: no {d!r} in the file (its datasets: {have})")
        shown = [d for d in datasets if d in table.datasets]
        for (label, i), m in mapped.items():
            if values[i].dataset not in shown:
                raise _fail(table, metric, f"scenario {m.scenario!r} x method {label!r} maps to dataset "
                                           f"{values[i].dataset!r}, which `datasets` leaves out")
    else:
        used = {values[i].dataset for _, i in mapped}
        shown = [d for d in datasets if d in used]
    keep = [i for i, v in enumerate(values) if v.dataset in shown]
    index = {old: new for new, old in enumerate(keep)}
    values = [values[i] for i in keep]
    mapped = {(label, index[i]): m for (label, i), m in mapped.items()}

    row_of, col_of, setting_note = _layout(table, metric, values, len(shown) > 1)
    return Section(table, metric, path, values, row_of, col_of, mapped, setting_note)


def _layout(table: PaperTable, metric: str, values: list[PaperValue], many_datasets: bool):
    row_of, col_of = {}, {}
    if table.layout is None:
        for i, v in enumerate(values):
            row_of[i] = (v.method, v.method)
            col_of[i] = (f"{v.dataset}\x00{v.setting}", f"{v.dataset}: {v.setting}" if many_datasets else v.setting)
        return row_of, col_of, None
    many_methods = len({v.method for v in values}) > 1
    rest = set()
    taken: dict[tuple[str, str], int] = {}
    for i, v in enumerate(values):
        r, c = _part(v, table.layout.rows, table, metric), _part(v, table.layout.columns, table, metric)
        row_of[i] = (f"{v.method}\x00{r}", f"{v.method}, {r}" if many_methods else r)
        col_of[i] = (f"{v.dataset}\x00{c}", f"{v.dataset}: {c}" if many_datasets else c)
        if (row_of[i][0], col_of[i][0]) in taken:
            raise _fail(table, metric, f"layout: {values[taken[(row_of[i][0], col_of[i][0])]].setting!r} and "
                                       f"{v.setting!r} fall on the same cell")
        taken[(row_of[i][0], col_of[i][0])] = i
        rest.add("; ".join(p for p in _parts(v.setting) if p not in (r, c)))
    rest.discard("")
    return row_of, col_of, " | ".join(sorted(rest)) or None


def resolve_tables(paper: PaperSpec, numbers_dir: str | Path | None = None) -> list[Section]:
    """Every table x metric of `paper`, each mapping checked against its CSV (UsageError otherwise)."""
    folder = numbers_folder(paper, numbers_dir)
    return [resolve_table(t, m, folder) for t in paper.tables for m in t.metric]


# ---------------------------------------------------------------------------------- cells

@dataclass
class CellOut:
    """One displayed cell: the paper's value and ours."""

    value: PaperValue | None  # None: the paper has no value here (a hole in a grid)
    label: str | None
    scenario: str | None
    ours: Values | None = None
    ours_status: str = NOT_RUN  # ok | not run | not implemented yet | no value: ...
    footnote: int | None = None
    show_label: bool = False

    @property
    def diff(self) -> float | None:
        if self.ours is None or self.value is None or self.value.value is None:
            return None
        return self.ours.mean - self.value.value


@dataclass
class RowOut:
    label: str
    cells: dict[str, CellOut] = field(default_factory=dict)  # column key -> cell


def _scale(metric: str) -> float:
    return 1e-9 if metric == "cost_gb" else 100.0 if metric == "accuracy_pct" else 1.0


def _our_cell(study: StudySpec, runs: StudyRuns, section: Section, cell: CellOut, m: Mapped | None) -> None:
    if cell.label is None:
        return
    if not study.methods[cell.label].implemented:
        cell.ours_status = NOT_IMPLEMENTED
        return
    if m is None:
        return
    cell.scenario = m.scenario
    found = runs.cells.get((m.scenario, cell.label), [])
    if not found:
        return
    try:
        cell.ours = read_values(found, m.quantity, _scale(section.metric))
        cell.ours_status = "ok"
    except NoValue as e:
        cell.ours_status = f"no value: {e}"
        if m.quantity.metric.startswith("new_clients."):
            # a strategy the method does not have yet (FedAvg+ = fine-tuning) is work still to do
            cell.ours_status = f"{NOT_IMPLEMENTED} ({e})"


def _rows(study: StudySpec, runs: StudyRuns, section: Section) -> tuple[list[RowOut], list[tuple[str, str]]]:
    columns = list(dict.fromkeys(section.col_of[i] for i in range(len(section.values))))
    row_keys = list(dict.fromkeys(section.row_of[i] for i in range(len(section.values))))
    at = {(section.row_of[i][0], section.col_of[i][0]): i for i in range(len(section.values))}
    order = {label: n for n, label in enumerate(study.methods)}
    out = []
    for key, text in row_keys:
        # our labels filling this paper row, in the study's order; in a grid, labels that fill
        # different columns share a display row
        fills: dict[str, dict[str, int]] = {}
        for (label, i) in section.mapped:
            if section.row_of[i][0] == key:
                fills.setdefault(label, {})[section.col_of[i][0]] = i
        lanes: list[dict[str, str]] = []  # column key -> label
        for label in sorted(fills, key=lambda lb: order.get(lb, len(order))):
            lane = None
            if section.spec.layout is not None:
                lane = next((ln for ln in lanes if not set(ln) & set(fills[label])), None)
            if lane is None:
                lanes.append(lane := {})
            lane.update({c: label for c in fills[label]})
        for lane in lanes or [{}]:
            labels = list(dict.fromkeys(lane.values()))
            name = text if len(labels) != 1 else f"{text} — ours: {labels[0]}"
            row = RowOut(name)
            for ckey, _ in columns:
                index = at.get((key, ckey))
                cell_label = (lane.get(ckey)
                              or (labels[0] if len(labels) == 1 and section.spec.layout is None else None))
                cell = CellOut(section.values[index] if index is not None else None, cell_label, None,
                               show_label=len(labels) > 1 and cell_label is not None)
                m = (section.mapped.get((cell_label, index)) if cell_label is not None and index is not None
                     else None)
                if cell.value is not None or m is not None:
                    _our_cell(study, runs, section, cell, m)
                row.cells[ckey] = cell
            out.append(row)
    return out, columns


# ------------------------------------------------------------------------------- rendering

def _fmt(x: float | None, metric: str, signed: bool = False) -> str:
    if x is None:
        return ""
    return f"{x:+.{DECIMALS[metric]}f}" if signed else f"{x:.{DECIMALS[metric]}f}"


def _ours(values: Values, metric: str, seeds: int) -> str:
    """`60.00 +- 10.00 [35.16, 84.84] (n=3)`; one seed has neither spread nor interval."""
    n = seeds_note(values.n, f" of {seeds}" if values.n < seeds else "")
    if values.n < 2:
        return f"{_fmt(values.mean, metric)} ({n}, no interval)"
    lo, hi = values.interval
    top = {"accuracy_pct": 100.0, "accuracy_frac": 1.0}.get(metric, math.inf)  # bytes: no upper bound
    ci = shown_interval(lo, hi, 0.0, top, f".{DECIMALS[metric]}f")
    return f"{_fmt(values.mean, metric)} +- {_fmt(values.std, metric)} {ci} ({n})"


def _parts_of(cell: CellOut, metric: str, seeds: int) -> list[tuple[str, str]]:
    """(css class, text) pieces of one cell: ours, the paper's, the difference."""
    if cell.value is None and cell.label is None:
        return [("none", "—")]
    who = f"ours ({cell.label})" if cell.show_label else "ours"
    if cell.ours is not None:
        ours = ("ours", f"{who} {_ours(cell.ours, metric, seeds)}")
    else:
        ours = ("missing", f"{who}: {cell.ours_status}")
    mark = f" [{cell.footnote}]" if cell.footnote else ""
    v = cell.value
    if v is None:
        paper = ("missing", "paper: no value in this cell")
    elif v.value is None:
        paper = ("missing", f"paper: {v.status}{mark}")
    else:
        std = f" +- {_fmt(v.std, metric)}" if v.std is not None else ""
        paper = ("paper", f"paper {_fmt(v.value, metric)}{std}{mark}")
    out = [ours, paper]
    if cell.diff is not None:
        out.append(("diff", f"diff {_fmt(cell.diff, metric, signed=True)}"))
    return out


def _chunks(items: list, size: int = MAX_COLUMNS) -> list[list]:
    if not items:
        return [[]]
    blocks = math.ceil(len(items) / size)
    per = math.ceil(len(items) / blocks)
    return [items[i:i + per] for i in range(0, len(items), per)]


@dataclass
class Rendered:
    heading: str
    lines: list[str]  # source, protocol, notes
    columns: list[tuple[str, str]]
    rows: list[RowOut]
    footnotes: list[str]
    metric: str
    corner: str = "method"  # the header of the row labels


def _section_out(study: StudySpec, runs: StudyRuns, section: Section, prefix: str) -> Rendered:
    rows, columns = _rows(study, runs, section)
    notes: dict[str, int] = {}  # numbered in reading order: block by block, row by row
    for block in _chunks(columns):
        for row in rows:
            for key, _ in block:
                cell = row.cells[key]
                if cell.value is not None and cell.value.note:
                    cell.footnote = notes.setdefault(cell.value.note, len(notes) + 1)
    spec = section.spec
    title = spec.title or section.values[0].table
    heading = f"{prefix}{section.values[0].paper}: {title} — {UNITS[section.metric]}"
    lines = [f"Source: {section.source} (config/paper_numbers/{section.csv.name}; the paper's numbers as printed).",
             "Ours: mean +- sample std over seeds (ddof 1) [95 % confidence interval of the mean, Student t "
             "with n - 1 degrees of freedom; an end beyond the metric's range shown at its bound, marked *] "
             "(n = seeds; one seed has neither; fewer than 3 are marked few) of "
             + ("bytes sent up and down over the run, in GB (1e9 bytes)" if section.metric == "cost_gb" else
                "the reported accuracy" + (" in %" if section.metric == "accuracy_pct" else " as a fraction"))
             + f"; our protocol: {protocol_words(runs.protocol)}. diff = ours - paper."]
    if any(m.quantity.clients for m in section.mapped.values()):
        lines.append("Per-domain columns: the mean accuracy of that domain's clients in the last round.")
    if any(m.quantity.metric.startswith("new_clients.") for m in section.mapped.values()):
        lines.append("New clients: held-out clients' accuracy under the row's strategy (weighted by test size "
                     "when the protocol reports best_weighted).")
    if section.setting_note:
        lines.append(f"Setting: {section.setting_note}.")
    if spec.note:
        lines.append(spec.note)
    corner = spec.layout.rows if spec.layout is not None else "method"
    return Rendered(heading, lines, columns, rows, list(notes), section.metric, corner)


def _records(study: StudySpec, runs: StudyRuns, smoke: bool, rendered: list[tuple[Section, Rendered]]) -> pd.DataFrame:
    out = []
    for section, r in rendered:
        for row in r.rows:
            for ckey, ctext in r.columns:
                cell = row.cells[ckey]
                v = cell.value
                out.append({
                    "smoke_run": SMOKE_COLUMN if smoke else "",
                    "study": study.study, "source": section.source, "csv": section.csv.name,
                    "metric": section.metric, "row": row.label, "column": ctext,
                    "dataset": v.dataset if v else "", "setting": v.setting if v else "",
                    "paper_method": v.method if v else "",
                    "our_method": cell.label or "", "our_scenario": cell.scenario or "",
                    "ours_status": cell.ours_status if (v is not None or cell.label) else "",
                    "seeds": cell.ours.n if cell.ours else 0,
                    "ours_mean": cell.ours.mean if cell.ours else None,
                    "ours_std": cell.ours.std if cell.ours else None,
                    "ours_ci_low": cell.ours.interval[0] if cell.ours else None,
                    "ours_ci_high": cell.ours.interval[1] if cell.ours else None,
                    "paper_status": v.status if v else "no value in this cell",
                    "paper_value": v.value if v else None, "paper_std": v.std if v else None,
                    "diff": cell.diff, "paper_note": v.note if v else "",
                    "protocol": protocol_words(runs.protocol),
                })
    return pd.DataFrame(out, columns=["smoke_run", "study", "source", "csv", "metric", "row", "column", "dataset",
                                      "setting", "paper_method", "our_method", "our_scenario", "ours_status", "seeds",
                                      "ours_mean", "ours_std", "ours_ci_low", "ours_ci_high", "paper_status",
                                      "paper_value", "paper_std", "diff", "paper_note", "protocol"])


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown(title: str, intro: list[str], rendered: list[Rendered], seeds: int) -> str:
    out = [f"# {title}", "", *intro, ""]
    for r in rendered:
        out += [f"## {r.heading}", "", *[f"{line}  " for line in r.lines], ""]
        for block in _chunks(r.columns):
            head = [r.corner, *(_md_escape(c) for _, c in block)]
            out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for row in r.rows:
                cells = ["; ".join(t for _, t in _parts_of(row.cells[k], r.metric, seeds)) for k, _ in block]
                out.append("| " + " | ".join(_md_escape(x) for x in [row.label, *cells]) + " |")
            out.append("")
        out += [f"[{n}] {_md_escape(note)}  " for n, note in enumerate(r.footnotes, 1)]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: 12.5px; }
th, td { border: 1px solid #bbb; padding: 3px 6px; vertical-align: top; text-align: left; }
th { background: #eee; }
.ours { font-weight: 600; } .paper { color: #555; } .diff { color: #0550ae; }
.missing { color: #a40000; } .none { color: #999; }
.smoke { background: #b00; color: #fff; padding: .6em 1em; font-weight: 700; }
.reproduced { color: #116329; font-weight: 600; } .not-reproduced { color: #a40000; font-weight: 600; }
.within-noise { color: #9a6700; font-weight: 600; } .not-run, .not-applicable, .needs-paper-scale { color: #777; font-weight: 600; }
p.note, ol.notes { color: #555; font-size: 12px; }
""".strip()


def html_page(title: str, body: list[str], smoke: bool) -> str:
    banner = [f'<p class="smoke">{html.escape(SMOKE_COLUMN)}</p>'] if smoke else []
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>{html.escape(title)}</title>", f"<style>\n{_CSS}\n</style></head><body>",
                      *banner, f"<h1>{html.escape(title)}</h1>", *body, "</body></html>"]) + "\n"


def _html(title: str, intro: list[str], rendered: list[Rendered], seeds: int, smoke: bool) -> str:
    body = [f"<p>{html.escape(line)}</p>" for line in intro]
    for n, r in enumerate(rendered):
        body += [f'<h2 id="t{n}">{html.escape(r.heading)}</h2>',
                 *(f'<p class="note">{html.escape(line)}</p>' for line in r.lines)]
        for block in _chunks(r.columns):
            body.append(f"<table><thead><tr><th>{html.escape(r.corner)}</th>"
                        + "".join(f"<th>{html.escape(c)}</th>" for _, c in block) + "</tr></thead><tbody>")
            for row in r.rows:
                tds = []
                for k, _ in block:
                    parts = _parts_of(row.cells[k], r.metric, seeds)
                    tds.append("<td>" + "<br>".join(f'<span class="{c}">{html.escape(t)}</span>' for c, t in parts)
                               + "</td>")
                body.append(f"<tr><th>{html.escape(row.label)}</th>{''.join(tds)}</tr>")
            body.append("</tbody></table>")
        if r.footnotes:
            body.append('<ol class="notes">' + "".join(f"<li>{html.escape(x)}</li>" for x in r.footnotes) + "</ol>")
    return html_page(title, body, smoke)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "—": "---", "±": r"$\pm$"}


def tex_escape(text: str) -> str:
    out = "".join(_TEX.get(ch, ch) for ch in text)
    return out.replace("+-", r"$\pm$")


def _tex(title: str, intro: list[str], rendered: list[Rendered], seeds: int) -> str:
    out = ["% fedfactor paper-tables: \\input{} into a document (plain tabular; no packages needed)",
           f"\\section*{{{tex_escape(title)}}}", *(f"{tex_escape(line)}\\par" for line in intro), ""]
    for r in rendered:
        caption = tex_escape(r.heading + ". " + " ".join(r.lines))
        for b, block in enumerate(_chunks(r.columns)):
            out += ["\\begin{table}[htbp]", "\\centering\\scriptsize",
                    f"\\caption{{{caption}{' (continued)' if b else ''}}}",
                    "\\begin{tabular}{l|" + "l" * len(block) + "}", "\\hline",
                    " & ".join([tex_escape(r.corner), *(tex_escape(c) for _, c in block)]) + " \\\\", "\\hline"]
            for row in r.rows:
                cells = []
                for k, _ in block:
                    parts = [tex_escape(t) for _, t in _parts_of(row.cells[k], r.metric, seeds)]
                    cells.append("\\shortstack[l]{" + " \\\\ ".join(parts) + "}")
                out.append(" & ".join([tex_escape(row.label), *cells]) + " \\\\")
            out += ["\\hline", "\\end{tabular}", "\\end{table}", ""]
        if r.footnotes:
            out += ["\\begin{enumerate}\\scriptsize", *(f"\\item {tex_escape(x)}" for x in r.footnotes),
                    "\\end{enumerate}", ""]
    return "\n".join(out)


def paper_tables(study: StudySpec, summaries: Sequence[str | Path], out_dir: str | Path,
                 numbers_dir: str | Path | None = None) -> pd.DataFrame:
    """Write paper.md, paper.csv, paper.tex and paper.html into `out_dir`; return the CSV's rows.

    `summaries`: summary.json files or folders holding them (an empty list: no runs yet). The paper's
    numbers are read from `numbers_dir` (default: the study's `paper.numbers`).
    """
    runs = load_runs(study, summaries)
    smoke = is_smoke(study, runs)
    prefix = SMOKE_TITLE if smoke else ""
    title = f"{prefix}Paper vs ours: {study.title}"
    intro = [f"Study {study.study}; seeds {', '.join(map(str, study.seeds))}."]
    if runs.ignored:
        intro.append(f"{runs.ignored} run(s) of scenarios or methods this study does not list were left out.")
    sections = resolve_tables(study.paper, numbers_dir) if study.paper else []
    if study.paper is None:
        intro.append("This study has no paper table (its paper result is a figure, or no numbers were transcribed); "
                     "see claims.md.")
    else:
        intro.insert(0, f"Paper: {study.paper.name}.")
    rendered = [(s, _section_out(study, runs, s, prefix)) for s in sections]
    frame = _records(study, runs, smoke, rendered)
    seeds = len(study.seeds)
    out = Path(out_dir)
    parts = [r for _, r in rendered]
    atomic_write_text(out / "paper.csv", frame.to_csv(index=False))
    atomic_write_text(out / "paper.md", _markdown(title, intro, parts, seeds))
    atomic_write_text(out / "paper.tex", _tex(title, intro, parts, seeds))
    atomic_write_text(out / "paper.html", _html(title, intro, parts, seeds, smoke))
    return frame

