"""Results tables: mean +- std over seeds, one row per method, one column per scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_text


def collect(paths: list[str | Path]) -> pd.DataFrame:
    """One row per run from summary.json files (directories are searched recursively)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.rglob("summary.json")) if p.is_dir() else [p]
    if not files:
        raise UsageError(f"no summary.json found in {', '.join(map(str, paths))}")
    rows = []
    for f in files:
        try:
            s = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read run summary {f}: {e}") from None
        rows.append({k: s[k] for k in ("scenario", "method", "seed", "accuracy_mean", "accuracy_best_mean",
                                       "accuracy_weighted", "bytes_total", "rounds", "clients")})
    return pd.DataFrame(rows)


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (scenario, method): seeds, mean and std (ddof=0 so one seed gives 0) of each metric."""
    g = runs.groupby(["scenario", "method"], sort=False)
    out = g.agg(
        seeds=("seed", "nunique"),
        accuracy_mean=("accuracy_mean", "mean"),
        accuracy_std=("accuracy_mean", lambda s: s.std(ddof=0)),
        accuracy_best_mean=("accuracy_best_mean", "mean"),
        accuracy_best_std=("accuracy_best_mean", lambda s: s.std(ddof=0)),
        bytes_total=("bytes_total", "mean"),
    )
    return out.reset_index()


def to_markdown(agg: pd.DataFrame, title: str) -> str:
    """Accuracy (%) at the last round, mean +- std over seeds; communication in GB (1e9 bytes)."""
    scenarios = list(dict.fromkeys(agg["scenario"]))
    methods = list(dict.fromkeys(agg["method"]))
    cell = {(r.scenario, r.method): r for r in agg.itertuples()}
    head = ["method", *scenarios, "cost [GB]"]
    lines = [f"# {title}", "",
             "Accuracy [%] of each client's personalised model on its own test split, last round, "
             "mean +- std over seeds (seeds per cell in brackets); cost = bytes sent up and down, summed over the run.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in methods:
        cells = []
        for s in scenarios:
            r = cell.get((s, m))
            cells.append("-" if r is None else f"{100 * r.accuracy_mean:.2f} +- {100 * r.accuracy_std:.2f} ({r.seeds})")
        # One number when every scenario costs the same; a range when, e.g., local heads send less.
        gb = agg.loc[agg["method"] == m, "bytes_total"] / 1e9
        cells.append(f"{gb.min():.4f}" if gb.min() == gb.max() else f"{gb.min():.4f} - {gb.max():.4f}")
        lines.append("| " + " | ".join([m, *cells]) + " |")
    return "\n".join(lines) + "\n"


def write_tables(runs: pd.DataFrame, out_md: str | Path, out_csv: str | Path, title: str = "Results") -> str:
    agg = aggregate(runs)
    md = to_markdown(agg, title)
    atomic_write_text(out_csv, agg.to_csv(index=False))
    atomic_write_text(out_md, md)
    return md
