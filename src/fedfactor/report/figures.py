"""Figures from run outputs: accuracy against rounds and against bytes sent."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_bytes
from .runs import RunKey, find_summaries, read_summary


def load_curves(paths: list[str | Path]) -> pd.DataFrame:
    """Every run's metrics.csv, tagged with the scenario, method and seed of its summary.json."""
    frames = []
    for s in find_summaries(paths):
        run = read_summary(s, RunKey)
        frames.append(_read_metrics(s.parent / "metrics.csv").assign(
            scenario=run.scenario, method=run.method, seed=run.seed))
    return pd.concat(frames, ignore_index=True)


def _read_metrics(path: Path) -> pd.DataFrame:
    """The evaluated rounds of one metrics.csv: round and accuracy_mean, checked."""
    fix = "the run did not finish or the file is damaged: re-run it"
    try:
        m = pd.read_csv(path)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist, though its run has a summary.json; {fix}") from None
    except (OSError, ValueError) as e:  # ValueError: pandas' parser and empty-data errors, bad UTF-8
        raise UsageError(f"cannot read {path} ({' '.join(str(e).split())}); {fix}") from None
    missing = [c for c in ("round", "accuracy_mean") if c not in m.columns]
    if missing:
        raise UsageError(f"{path} has no column {' or '.join(map(repr, missing))}; {fix}")
    # Rounds that were not evaluated (fl.eval_every > 1) have training metrics but no accuracy.
    m = m.dropna(subset=["accuracy_mean"])
    if m.empty:
        raise UsageError(f"{path} has no evaluated round (no accuracy_mean value); {fix}")
    if not pd.api.types.is_integer_dtype(m["round"]):
        raise UsageError(f"{path}: the round column holds something other than whole numbers; {fix}")
    if not pd.api.types.is_numeric_dtype(m["accuracy_mean"]):
        raise UsageError(f"{path}: accuracy_mean holds something other than numbers; {fix}")
    if not m["accuracy_mean"].between(0, 1).all():
        raise UsageError(f"{path}: accuracy_mean holds values outside 0..1; {fix}")
    return m


def mean_band(ax, frame, column: str, color: str, label: str, scale: float = 100.0) -> None:
    """The mean over seeds of `column` per round, times `scale` (accuracies in %), with a +-std band."""
    g = frame.groupby("round")[column]
    mean, std = scale * g.mean(), scale * g.std(ddof=0)
    ax.plot(mean.index, mean, color=color, label=label)
    ax.fill_between(mean.index, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)


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
            mean_band(ax, d, "accuracy_mean", colors[method], method)
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
