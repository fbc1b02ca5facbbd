"""Figures from run outputs: accuracy against rounds and against bytes sent."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_bytes


def load_curves(paths: list[str | Path]) -> pd.DataFrame:
    """Every run's metrics.csv, tagged with the scenario, method and seed of its summary.json."""
    frames = []
    for p in map(Path, paths):
        summaries = sorted(p.rglob("summary.json")) if p.is_dir() else [p]
        for s in summaries:
            meta = json.loads(s.read_text())
            m = pd.read_csv(s.parent / "metrics.csv")
            frames.append(m.assign(scenario=meta["scenario"], method=meta["method"], seed=meta["seed"]))
    if not frames:
        raise UsageError(f"no runs (summary.json + metrics.csv) found in {', '.join(map(str, paths))}")
    # Rounds that were not evaluated (fl.eval_every > 1) have training metrics but no accuracy.
    return pd.concat(frames, ignore_index=True).dropna(subset=["accuracy_mean"])


def accuracy_curves(curves: pd.DataFrame, out: str | Path, title: str = "") -> list[str]:
    """One panel per scenario: mean client accuracy per round, mean over seeds with a +-std band.

    Returns the panel titles, in the order the scenarios first appear in `curves`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    scenarios = list(dict.fromkeys(curves["scenario"]))
    methods = list(dict.fromkeys(curves["method"]))
    cols = min(len(scenarios), 3)
    rows = -(-len(scenarios) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for ax, scenario in zip(axes.flat, scenarios):
        for method in methods:
            d = curves[(curves.scenario == scenario) & (curves.method == method)]
            if d.empty:
                continue
            g = d.groupby("round")["accuracy_mean"]
            mean, std = 100 * g.mean(), 100 * g.std(ddof=0)
            ax.plot(mean.index, mean, color=colors[method], label=method)
            ax.fill_between(mean.index, mean - std, mean + std, color=colors[method], alpha=0.2, linewidth=0)
        ax.set_title(scenario)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("mean client accuracy [%]")
    for ax in list(axes.flat)[len(scenarios):]:
        ax.set_visible(False)
    axes.flat[0].legend(loc="lower right", fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write_bytes(out, _png(fig))
    plt.close(fig)
    return scenarios


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return buf.getvalue()
