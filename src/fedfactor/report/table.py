"""Results tables: mean, spread and 95 % interval over seeds, one row per method, one column per scenario."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import yaml

from ..errors import UsageError
from ..io import atomic_write_text
from .cells import seeds_note, shown_interval, t_interval
from .runs import FailedRun, TableRun, find_failed, find_summaries, read_summary
from .paper import tex_escape
from .spec import PROTOCOL_WORDS, SMOKE_TITLE


def collect(paths: list[str | Path]) -> pd.DataFrame:
    """One row per run from summary.json files (directories are searched recursively).

    Runs scored under different evaluation protocols are refused: one table, one protocol.
    """
    rows = []
    for f in find_summaries(paths):
        run = read_summary(f, TableRun)
        p = run.protocol
        rows.append({**run.model_dump(exclude={"protocol"}), "test_pool": p.test_pool, "eval_model": p.model,
                     "report": p.report, "folder": str(Path(f).parent)})
    runs = pd.DataFrame(rows).astype({"accuracy": float})  # a null accuracy becomes NaN, not None
    protocols = runs[["test_pool", "eval_model", "report"]].drop_duplicates()
    if len(protocols) > 1:
        raise UsageError("these runs were scored under different evaluation protocols ("
                         + "; ".join("/".join(p) for p in protocols.itertuples(index=False))
                         + "); make one table per protocol")
    return runs


def failed_note(paths: list[str | Path]) -> list[str]:
    """A note naming each run among `paths` that failed (a failed.json in place of its summary): its
    cell's numbers are over the seeds that finished, and its n says how many."""
    failed = [read_summary(f, FailedRun) for f in find_failed(paths)]
    if not failed:
        return []
    return ["Failed, not in the numbers (each cell is over the seeds that finished): " + "; ".join(
        f"{r.scenario}/{r.method} seed {r.seed}: {r.reason}" for r in failed) + "."]


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (scenario, method): seeds, and of each metric the mean and the sample std over seeds (ddof 1,
    NaN for one seed); of the reported accuracy also the 95 % t interval of the mean (NaN for one seed)."""
    g = runs.groupby(["scenario", "method", "test_pool", "eval_model", "report"], sort=False)
    out = g.agg(
        accuracy=("accuracy", "mean"),
        accuracy_sd=("accuracy", "std"),
        accuracy_ci_low=("accuracy", lambda s: t_interval(s.dropna())[0]),
        accuracy_ci_high=("accuracy", lambda s: t_interval(s.dropna())[1]),
        seeds=("seed", "nunique"),
        accuracy_mean=("accuracy_mean", "mean"),
        accuracy_std=("accuracy_mean", "std"),
        accuracy_best_mean=("accuracy_best_mean", "mean"),
        accuracy_best_std=("accuracy_best_mean", "std"),
        bytes_total=("bytes_total", "mean"),
    )
    return out.reset_index()


def _cell(r) -> str:
    """`95.56 +- 1.83 [93.9, 97.2] (n=5)` in %; one seed has neither spread nor interval."""
    if pd.isna(r.accuracy_sd):
        return f"{100 * r.accuracy:.2f} (n={r.seeds}, no interval)"
    ci = shown_interval(100 * r.accuracy_ci_low, 100 * r.accuracy_ci_high, 0.0, 100.0, ".1f")
    return f"{100 * r.accuracy:.2f} +- {100 * r.accuracy_sd:.2f} {ci} ({seeds_note(r.seeds)})"


def _value(config: Mapping[str, Any], key: str) -> Any:
    """A dotted run-config key's value; a key without a section is the method's (`tau`)."""
    value: Any = config if "." in key else config.get("method", {})
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def used_values(runs: pd.DataFrame, grid: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(scenario, method) -> `lr 0.1, tau 0.5`: the values of the keys tuned for the method (`grid`, the
    chosen-values file's) that its runs used, read from each run's config.yaml; seeds that differ are all
    listed. The values a table shows beside its numbers, wherever they came from."""
    out: dict[tuple[str, str], str] = {}
    for (scenario, method), group in runs.groupby(["scenario", "method"], sort=False):
        keys = list(grid.get(method) or {})
        if not keys:
            continue
        seen: list[str] = []
        for folder in group["folder"]:
            config = yaml.safe_load((Path(folder) / "config.yaml").read_text(encoding="utf-8"))
            shown = ", ".join(f"{k.removeprefix('fl.')} {_value(config, k)}" for k in keys)
            if shown not in seen:
                seen.append(shown)
        out[(scenario, method)] = " / ".join(seen)
    return out


def cells(agg: pd.DataFrame, chosen: Mapping[tuple[str, str], str] | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows: reported accuracy (%) per scenario as `_cell` shows it, cost in GB (1e9 bytes),
    and the values chosen on validation (`chosen`, used_values) where the study was tuned."""
    scenarios = list(dict.fromkeys(agg["scenario"]))
    cell = {(r.scenario, r.method): r for r in agg.itertuples()}
    rows = []
    for m in dict.fromkeys(agg["method"]):
        row = [m]
        for s in scenarios:
            r = cell.get((s, m))
            row.append("-" if r is None else _cell(r))
        # One number when every scenario costs the same; a range when, e.g., local heads send less.
        gb = agg.loc[agg["method"] == m, "bytes_total"] / 1e9
        low, high = f"{gb.min():.4f}", f"{gb.max():.4f}"  # equal as shown: one number, not "x - x"
        row.append(low if low == high else f"{low} - {high}")
        if chosen:
            row.append("; ".join(chosen.get((s, m), "-") for s in scenarios))
        rows.append(row)
    tuned = [f"chosen on validation ({'; '.join(scenarios)})"] if chosen else []
    return ["method", *scenarios, "cost [GB]", *tuned], rows


def caption(agg: pd.DataFrame) -> str:
    return (f"Accuracy [%]: mean over clients, each client's {_words(agg, 'eval_model')} scored "
            f"{_words(agg, 'test_pool')}, {_words(agg, 'report')}; mean over seeds +- their sample standard "
            "deviation (ddof 1) [95 % confidence interval of the mean, Student t with n - 1 degrees of freedom] "
            "(n = seeds); one seed has neither, and fewer than 3 are marked (their interval says little); an "
            "interval's end beyond 0-100 % is shown at the bound, marked *. Cost = bytes sent up and down, summed "
            "over the run.")


def to_markdown(agg: pd.DataFrame, title: str, notes: Sequence[str] = (),
                chosen: Mapping[tuple[str, str], str] | None = None) -> str:
    head, rows = cells(agg, chosen)
    lines = [f"# {title}", "", caption(agg), *(f"\n{n}" for n in notes), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_html(agg: pd.DataFrame, title: str, notes: Sequence[str] = (),
            chosen: Mapping[tuple[str, str], str] | None = None) -> str:
    head, rows = cells(agg, chosen)
    table = pd.DataFrame(rows, columns=head).to_html(index=False, border=0, classes="results")
    paras = "".join(f"<p>{html.escape(t)}</p>" for t in (caption(agg), *notes))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{HTML_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{paras}{table}</body></html>\n")


def to_latex(agg: pd.DataFrame, title: str, notes: Sequence[str] = (),
             chosen: Mapping[tuple[str, str], str] | None = None) -> str:
    """The table as a plain LaTeX tabular (no packages needed), for \\input{} into a paper."""
    head, rows = cells(agg, chosen)
    lines = ["% fedfactor table: \\input{} into a document (plain tabular; no packages needed)",
             "\\begin{table}[htbp]", "\\centering\\scriptsize",
             f"\\caption{{{tex_escape(' '.join([title + '.', caption(agg), *notes]))}}}",
             "\\begin{tabular}{l|" + "l" * (len(head) - 1) + "}", "\\hline",
             " & ".join(tex_escape(h) for h in head) + " \\\\", "\\hline"]
    lines += [" & ".join(tex_escape(c) for c in row) + " \\\\" for row in rows]
    return "\n".join([*lines, "\\hline", "\\end{tabular}", "\\end{table}", ""])


HTML_STYLE = ("body{font-family:sans-serif;margin:1em} table{border-collapse:collapse} "
              "th,td{padding:.25em .6em;border-bottom:1px solid #ccc;text-align:right} "
              "td:first-child,th:first-child{text-align:left}")


def _words(agg: pd.DataFrame, column: str) -> str:
    return PROTOCOL_WORDS[agg[column].iloc[0]]


def write_tables(runs: pd.DataFrame, out_md: str | Path, out_csv: str | Path, title: str = "Results",
                 out_html: str | Path | None = None, out_tex: str | Path | None = None, skipped: dict[str, str] | None = None,
                 tuned: str | Path | None = None, failed: Sequence[str] = ()) -> str:
    """Markdown, csv (and html, LaTeX); `skipped` (label -> method name) lists methods the study names but
    fedfactor does not implement yet; `tuned`, the chosen-values file of a tuned study, adds the values
    each cell's runs used for the keys it tuned (the csv's `chosen` column); `failed`: notes on runs that
    failed (failed_note). Runs on synthetic data are flagged in the title and the csv."""
    agg = aggregate(runs)
    notes = [f"Not implemented yet, skipped: {', '.join(f'{k} ({v})' for k, v in skipped.items())}."] if skipped else []
    notes += list(failed)
    chosen = None
    if tuned is not None:
        try:
            grid = yaml.safe_load(Path(tuned).read_text(encoding="utf-8"))["grid"]
        except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
            raise UsageError(f"cannot read the chosen values {tuned} ({e})") from None
        chosen = used_values(runs, grid)
        notes = [*notes, f"Chosen on validation: each method's values of the keys tuned for it, as its runs used "
                         f"them (from {tuned}, docs/tuning.md)."]
    smoke = runs["dataset"].str.startswith("synthetic:").any()
    if smoke and not title.startswith(SMOKE_TITLE):
        title = SMOKE_TITLE + title
    md = to_markdown(agg, title, notes, chosen)
    if chosen is not None:
        agg = agg.assign(chosen=[chosen.get((r.scenario, r.method), "") for r in agg.itertuples()])
    atomic_write_text(out_csv, agg.assign(smoke_run_synthetic_data=smoke).to_csv(index=False))
    atomic_write_text(out_md, md)
    if out_html is not None:
        atomic_write_text(out_html, to_html(agg, title, notes, chosen))
    if out_tex is not None:
        atomic_write_text(out_tex, to_latex(agg, title, notes, chosen))
    return md
