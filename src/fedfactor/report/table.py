"""Results tables: mean +- std over seeds, one row per method, one column per scenario."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_text
from .runs import TableRun, find_summaries, read_summary


PROTOCOL_WORDS = {
    "client": "on its own test split", "shared": "on the pooled test split through its own label map",
    "received": "model as received from the server", "trained": "model after its local training",
    "last": "last round", "best": "best round of the mean", "best_weighted": "best round of the test-size-weighted mean",
    "best_val": "round best on validation",
}


def collect(paths: list[str | Path]) -> pd.DataFrame:
    """One row per run from summary.json files (directories are searched recursively).

    Runs scored under different evaluation protocols are refused: one table, one protocol.
    """
    rows = []
    for f in find_summaries(paths):
        run = read_summary(f, TableRun)
        p = run.protocol
        rows.append({**run.model_dump(exclude={"protocol"}), "test_pool": p.test_pool, "eval_model": p.model,
                     "report": p.report})
    runs = pd.DataFrame(rows).astype({"accuracy": float})  # a null accuracy becomes NaN, not None
    protocols = runs[["test_pool", "eval_model", "report"]].drop_duplicates()
    if len(protocols) > 1:
        raise UsageError("these runs were scored under different evaluation protocols ("
                         + "; ".join("/".join(p) for p in protocols.itertuples(index=False))
                         + "); make one table per protocol")
    return runs


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (scenario, method): seeds, mean and std (ddof=0 so one seed gives 0) of each metric."""
    g = runs.groupby(["scenario", "method", "test_pool", "eval_model", "report"], sort=False)
    out = g.agg(
        seeds=("seed", "nunique"),
        accuracy=("accuracy", "mean"),
        accuracy_sd=("accuracy", lambda s: s.std(ddof=0)),
        accuracy_mean=("accuracy_mean", "mean"),
        accuracy_std=("accuracy_mean", lambda s: s.std(ddof=0)),
        accuracy_best_mean=("accuracy_best_mean", "mean"),
        accuracy_best_std=("accuracy_best_mean", lambda s: s.std(ddof=0)),
        bytes_total=("bytes_total", "mean"),
    )
    return out.reset_index()


def to_markdown(agg: pd.DataFrame, title: str) -> str:
    """The reported accuracy (%), mean +- std over seeds; communication in GB (1e9 bytes)."""
    scenarios = list(dict.fromkeys(agg["scenario"]))
    methods = list(dict.fromkeys(agg["method"]))
    cell = {(r.scenario, r.method): r for r in agg.itertuples()}
    head = ["method", *scenarios, "cost [GB]"]
    lines = [f"# {title}", "",
             f"Accuracy [%]: mean over clients, each client's {_words(agg, 'eval_model')} scored "
             f"{_words(agg, 'test_pool')}, {_words(agg, 'report')}; mean +- std over seeds (seeds per cell in "
             "brackets). Cost = bytes sent up and down, summed over the run.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in methods:
        cells = []
        for s in scenarios:
            r = cell.get((s, m))
            cells.append("-" if r is None else f"{100 * r.accuracy:.2f} +- {100 * r.accuracy_sd:.2f} ({r.seeds})")
        # One number when every scenario costs the same; a range when, e.g., local heads send less.
        gb = agg.loc[agg["method"] == m, "bytes_total"] / 1e9
        cells.append(f"{gb.min():.4f}" if gb.min() == gb.max() else f"{gb.min():.4f} - {gb.max():.4f}")
        lines.append("| " + " | ".join([m, *cells]) + " |")
    return "\n".join(lines) + "\n"


def _words(agg: pd.DataFrame, column: str) -> str:
    return PROTOCOL_WORDS[agg[column].iloc[0]]


def write_tables(runs: pd.DataFrame, out_md: str | Path, out_csv: str | Path, title: str = "Results") -> str:
    agg = aggregate(runs)
    md = to_markdown(agg, title)
    atomic_write_text(out_csv, agg.to_csv(index=False))
    atomic_write_text(out_md, md)
    return md
