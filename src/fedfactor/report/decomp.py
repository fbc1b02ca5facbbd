"""FedDecomp's figures: the sigma diagnostics per round (004 Figure 6, Table 6) and the E_lora sweep
(Figure 5).

`decomposition_figure` reads the per-round diagnostics FedDecomp runs log to metrics.csv;
`elora_figure` reads the reported accuracy and the method settings from each run's summary.json.
Both draw one panel per scenario with the mean over seeds and a +-std band, and return the numbers
they drew as a table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from pydantic import Field

from ..errors import UsageError
from ..io import atomic_write_bytes
from .figures import _png, _read_metrics, mean_band
from .runs import RunKey, find_summaries, read_summary

DIAGNOSTICS = {
    "feddecomp.sigma_distance": r"mean $\|\sigma_i - \bar\sigma\|_2$ (Fig. 6)",
    "feddecomp.delta_sigma": r"$\Delta\sigma = \|\bar\sigma^t - \sigma^0\|_2$",
    "feddecomp.delta_tau": r"$\Delta\tau$ = mean $\|\tau_i^t - \tau^0\|_2$",
}


class SweepRun(RunKey):
    """What the E_lora sweep reads from a summary: the reported accuracy and the run's settings."""

    accuracy: float | None = Field(ge=0, le=1)
    config: dict[str, Any]


def _axes(n: int, width: float = 4.2, height: float = 3.2, cols: int = 3):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(n, cols)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    return plt, fig, axes


def _finish(plt, fig, axes, out: str | Path, title: str) -> None:
    axes.flat[0].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write_bytes(out, _png(fig))
    plt.close(fig)


def decomposition_figure(paths: Sequence[str | Path], out: str | Path, title: str = "") -> pd.DataFrame:
    """Rows: scenarios; columns: the three diagnostics per round; one line per method.

    Returns the last round's values, mean over seeds, per scenario and method (Table 6's columns).
    """
    frames = []
    for s in find_summaries(paths):
        run = read_summary(s, RunKey)
        m = _read_metrics(s.parent / "metrics.csv")
        if any(c in m for c in DIAGNOSTICS):
            frames.append(m.assign(scenario=run.scenario, method=run.method, seed=run.seed))
    if not frames:
        raise UsageError(f"none of the runs in {', '.join(map(str, paths))} logged FedDecomp's diagnostics "
                         f"({', '.join(DIAGNOSTICS)}); pass runs of feddecomp methods")
    data = pd.concat(frames, ignore_index=True)
    columns = [c for c in DIAGNOSTICS if c in data]
    scenarios = list(dict.fromkeys(data["scenario"]))
    methods = list(dict.fromkeys(data["method"]))
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    from matplotlib.ticker import MaxNLocator

    plt, fig, axes = _axes(len(scenarios) * len(columns), cols=len(columns))
    for row, scenario in zip(axes, scenarios):
        for ax, column in zip(row, columns):
            for method in methods:
                d = data[(data.scenario == scenario) & (data.method == method)].dropna(subset=[column])
                if not d.empty:
                    mean_band(ax, d, column, colors[method], method, scale=1.0)
            ax.set_title(f"{scenario}: {DIAGNOSTICS[column]}", fontsize="small")
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
    _finish(plt, fig, axes, out, title)
    last = data.sort_values("round").groupby(["scenario", "method", "seed"]).last().reset_index()
    return last.groupby(["scenario", "method"], sort=False)[columns].mean().reset_index()


def elora_figure(paths: Sequence[str | Path], out: str | Path, title: str = "") -> pd.DataFrame:
    """Reported accuracy against E_lora (alternating FedDecomp runs), other methods as dashed levels.

    Returns one row per scenario and E_lora value (or reference method): mean, std and seeds.
    """
    rows = []
    for s in find_summaries(paths):
        run = read_summary(s, SweepRun)
        if run.accuracy is None:
            raise UsageError(f"{s} reports no accuracy (eval.report best_val without validation data); "
                             "re-run with a report the run can give")
        method = run.config.get("method", {})
        swept = "e_lora" in method and method.get("training") == "alternating"
        rows.append({"scenario": run.scenario, "seed": run.seed, "accuracy": 100 * run.accuracy,
                     "e_lora": method["e_lora"] if swept else None, "reference": None if swept else run.method})
    data = pd.DataFrame(rows)
    sweep = data.dropna(subset=["e_lora"])
    if sweep.empty:
        raise UsageError(f"none of the runs in {', '.join(map(str, paths))} is an alternating FedDecomp run "
                         "(method.e_lora); pass the runs of an E_lora sweep")
    scenarios = list(dict.fromkeys(sweep["scenario"]))
    plt, fig, axes = _axes(len(scenarios))
    table = []
    for ax, scenario in zip(axes.flat, scenarios):
        d = sweep[sweep.scenario == scenario]
        g = d.groupby("e_lora")["accuracy"].agg(mean="mean", std=lambda a: a.std(ddof=0), count="count")
        ax.errorbar(g.index, g["mean"], yerr=g["std"], marker="o", capsize=3, color="C0", label="FedDecomp")
        table += [{"scenario": scenario, "method": "feddecomp", "e_lora": int(e), **r} for e, r in g.iterrows()]
        refs = data[(data.scenario == scenario) & data.reference.notna()]
        for i, (name, r) in enumerate(refs.groupby("reference", sort=False)["accuracy"]):
            ax.axhline(r.mean(), ls="--", color=f"C{i + 1}", label=name)
            table.append({"scenario": scenario, "method": name, "mean": r.mean(), "std": r.std(ddof=0),
                          "count": len(r)})
        ax.set_title(scenario)
        ax.set_xlabel(r"$E_{lora}$ (epochs on $\tau$ of E per round)")
        ax.set_ylabel("reported accuracy [%]")
        ax.set_xticks(sorted(g.index))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(scenarios):]:
        ax.set_visible(False)
    _finish(plt, fig, axes, out, title)
    return pd.DataFrame(table).astype({"e_lora": "Int64", "count": int})
