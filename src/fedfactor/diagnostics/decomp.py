"""FedDecomp's figures: the sigma diagnostics per round (004 Figure 6, Table 6) and the E_lora sweep
(Figure 5).

`decomposition_figure` reads the per-round diagnostics FedDecomp runs log to metrics.csv;
`elora_figure` reads the reported accuracy and the method settings from each run's summary.json.
Both draw one panel per scenario with the mean over seeds and a +-std band, write it as PNG and
PDF, and return the numbers they drew as a table. `decomposition_data`/`draw_decomposition` and
`elora_data`/`draw_elora` are the two halves of each, for `study_figures`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from ..config import MAX_EPOCHS
from ..errors import UsageError
from ..report.figures import (DatasetKey, _read_metrics, decorate, holds_numbers, is_synthetic, legend_outside,
                              mean_band, method_styles, panel_grid, rounds_axis, save_figure)
from ..report.runs import find_summaries, read_summary

DIAGNOSTICS = {
    "feddecomp.sigma_distance": r"mean $\|\sigma_i - \bar\sigma\|_2$ (Fig. 6)",
    "feddecomp.delta_sigma": r"$\Delta\sigma = \|\bar\sigma^t - \sigma^0\|_2$",
    "feddecomp.delta_tau": r"$\Delta\tau$ = mean $\|\tau_i^t - \tau^0\|_2$",
}


class MethodSettings(BaseModel):
    """The method settings the E_lora sweep reads from a summary's config.method."""

    # strict: an e_lora "2", 2.5 or true is a damaged summary, not a point of the sweep; the other
    # settings are not needed here
    model_config = ConfigDict(strict=True, extra="ignore")

    e_lora: int | None = Field(None, ge=0, le=MAX_EPOCHS)  # epochs on tau, at most fl.epochs
    training: str | None = None


class RunSettings(BaseModel):
    """A summary's config, as far as the FedDecomp figures read it."""

    model_config = ConfigDict(strict=True, extra="ignore")

    method: MethodSettings = Field(default_factory=MethodSettings)


class SweepRun(DatasetKey):
    """What the E_lora sweep reads from a summary: the reported accuracy and the run's settings."""

    accuracy: float | None = Field(ge=0, le=1)
    config: RunSettings


def check_diagnostics(path: Path, metrics: pd.DataFrame) -> pd.DataFrame:
    """`metrics` (read from `path`) once its FedDecomp diagnostics are distances: numbers >= 0, or
    empty in a round that logged none; UsageError naming the file otherwise."""
    for c in (c for c in DIAGNOSTICS if c in metrics):
        logged = metrics[c].dropna()
        if not (holds_numbers(metrics[c]) and np.isfinite(logged).all() and (logged >= 0).all()):
            raise UsageError(f"{path}: {c} holds something other than distances (numbers >= 0); the run did "
                             "not finish or the file is damaged: re-run it")
    return metrics


def _finish(fig, axes, out: str | Path, title: str, smoke: bool) -> None:
    legend_outside(fig, axes.flat, title="method")
    decorate(fig, title, smoke)
    save_figure(fig, out)


def decomposition_data(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, bool]:
    """The metrics rows of the runs that logged FedDecomp's diagnostics, tagged with scenario,
    method and seed, and whether any of them trained on synthetic data; UsageError without any."""
    frames, synthetic = [], False
    for s in find_summaries(paths):
        run = read_summary(s, DatasetKey)
        m = check_diagnostics(s.parent / "metrics.csv", _read_metrics(s.parent / "metrics.csv"))
        if any(c in m and m[c].notna().any() for c in DIAGNOSTICS):
            frames.append(m.assign(scenario=run.scenario, method=run.method, seed=run.seed))
            synthetic = synthetic or is_synthetic(run.dataset)
    if not frames:
        raise UsageError(f"none of the runs in {', '.join(map(str, paths))} logged FedDecomp's diagnostics "
                         f"({', '.join(DIAGNOSTICS)}); pass runs of feddecomp methods")
    return pd.concat(frames, ignore_index=True), synthetic


def decomposition_figure(paths: Sequence[str | Path], out: str | Path, title: str = "",
                         smoke: bool = False) -> pd.DataFrame:
    """Rows: scenarios; columns: the three diagnostics per round; one line per method. Written to
    `out` (.png) and its .pdf twin; runs on synthetic data, or `smoke`, mark it a smoke run.

    Returns the last round's values, mean over seeds, per scenario and method (Table 6's columns).
    """
    data, synthetic = decomposition_data(paths)
    return draw_decomposition(data, out, title, smoke or synthetic)


def draw_decomposition(data: pd.DataFrame, out: str | Path, title: str = "", smoke: bool = False,
                       styles: dict | None = None) -> pd.DataFrame:
    """`decomposition_figure` of `decomposition_data`'s rows; `styles`: method -> line style."""
    columns = [c for c in DIAGNOSTICS if c in data]
    scenarios = list(dict.fromkeys(data["scenario"]))
    methods = list(dict.fromkeys(data["method"]))
    styles = styles or method_styles(methods)
    plt, fig, axes = panel_grid(len(scenarios) * len(columns), cols=len(columns))
    for row, scenario in zip(axes, scenarios):
        for ax, column in zip(row, columns):
            for method in methods:
                d = data[(data.scenario == scenario) & (data.method == method)].dropna(subset=[column])
                if not d.empty:
                    mean_band(ax, d, column, label=method, scale=1.0, **styles[method])
            ax.set_title(f"{scenario}: {DIAGNOSTICS[column]}", fontsize="small")
            rounds_axis(ax)
            ax.set_ylabel("L2 distance (parameter units)", fontsize="small")
            ax.grid(alpha=0.3)
    _finish(fig, axes, out, title, smoke)
    last = data.sort_values("round").groupby(["scenario", "method", "seed"]).last().reset_index()
    return last.groupby(["scenario", "method"], sort=False)[columns].mean().reset_index()


def is_sweep_run(config: RunSettings) -> bool:
    """Whether a run's config is an alternating FedDecomp run with an E_lora (a point of the sweep)."""
    return config.method.e_lora is not None and config.method.training == "alternating"


def elora_data(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, bool]:
    """One row per run: scenario, seed, reported accuracy [%], e_lora (sweep runs) or reference
    (the method of any other run), and whether any run trained on synthetic data; UsageError
    without a sweep run."""
    rows, synthetic = [], False
    for s in find_summaries(paths):
        run = read_summary(s, SweepRun)
        if run.accuracy is None:
            raise UsageError(f"{s} reports no accuracy (eval.report best_val without validation data); "
                             "re-run with a report the run can give")
        swept = is_sweep_run(run.config)
        rows.append({"scenario": run.scenario, "seed": run.seed, "accuracy": 100 * run.accuracy,
                     "e_lora": run.config.method.e_lora if swept else None,
                     "reference": None if swept else run.method})
        synthetic = synthetic or is_synthetic(run.dataset)
    data = pd.DataFrame(rows)
    if data["e_lora"].isna().all():
        raise UsageError(f"none of the runs in {', '.join(map(str, paths))} is an alternating FedDecomp run "
                         "(method.e_lora); pass the runs of an E_lora sweep")
    return data, synthetic


def elora_figure(paths: Sequence[str | Path], out: str | Path, title: str = "", smoke: bool = False) -> pd.DataFrame:
    """Reported accuracy against E_lora (alternating FedDecomp runs), other methods as dashed levels.
    Written to `out` (.png) and its .pdf twin; runs on synthetic data, or `smoke`, mark it a smoke run.

    Returns one row per scenario and E_lora value (or reference method): mean, std and seeds.
    """
    data, synthetic = elora_data(paths)
    return draw_elora(data, out, title, smoke or synthetic)


def draw_elora(data: pd.DataFrame, out: str | Path, title: str = "", smoke: bool = False) -> pd.DataFrame:
    """`elora_figure` of `elora_data`'s rows."""
    sweep = data.dropna(subset=["e_lora"])
    scenarios = list(dict.fromkeys(sweep["scenario"]))
    references = list(dict.fromkeys(data["reference"].dropna()))
    styles = method_styles(["FedDecomp (alternating)", *references])
    plt, fig, axes = panel_grid(len(scenarios))
    table = []
    for ax, scenario in zip(axes.flat, scenarios):
        d = sweep[sweep.scenario == scenario]
        g = d.groupby("e_lora")["accuracy"].agg(mean="mean", std=lambda a: a.std(ddof=0), count="count")
        ax.errorbar(g.index, g["mean"], yerr=g["std"], marker="o", capsize=3,
                    color=styles["FedDecomp (alternating)"]["color"], label="FedDecomp (alternating)")
        table += [{"scenario": scenario, "method": "feddecomp", "e_lora": int(e), **r} for e, r in g.iterrows()]
        refs = data[(data.scenario == scenario) & data.reference.notna()]
        for name, r in refs.groupby("reference", sort=False)["accuracy"]:
            ax.axhline(r.mean(), ls="--", color=styles[name]["color"], label=name)
            table.append({"scenario": scenario, "method": name, "mean": r.mean(), "std": r.std(ddof=0),
                          "count": len(r)})
        ax.set_title(scenario)
        ax.set_xlabel(r"$E_{lora}$ (epochs on $\tau$ of E per round)")
        ax.set_ylabel("reported accuracy [%]")
        ax.set_xticks(sorted(g.index))
        ax.grid(alpha=0.3)
    _finish(fig, axes, out, title, smoke)
    return pd.DataFrame(table).astype({"e_lora": "Int64", "count": int})
