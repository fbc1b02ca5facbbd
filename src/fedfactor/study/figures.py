"""A study's figures: every method against every other, one panel per scenario, as PNG and PDF.

`study_figures(summaries, out_dir, title)` reads the runs under `summaries` (run folders, their
summary.json files, or folders above them) and writes into `out_dir`:

always
  accuracy_rounds   mean client accuracy per round, mean +- std over seeds, a line per method
                    (Factorized-FL 000 Fig. 6, FedFac 001 Fig. 9)
  accuracy_bytes    the same against the cumulative bytes sent up and down (log x); a method that
                    sends nothing (local training) is a dotted level at its last-round accuracy
  accuracy_time     the same against the wall-clock seconds since the run's start (metrics.csv's
                    elapsed_seconds, mean over seeds per round); local training is a line like any.
                    The seconds are those of the machine that ran each run, under the load it had then
  per_client        each client's accuracy at the last round, a box with the clients as points per
                    method, methods ordered by median (001 Fig. 8, 002 Fig. 11)
when the runs hold their data
  similarity        client similarity heatmaps (first, middle, last round) of one representative
                    Factorized-FL/SimFed run per scenario (000 Fig. 7)
  matching          how often each client mixed in each other client over the run, same runs
  similarity_spread per scenario and round, the spread of the similarities between distinct clients
                    that each Factorized-FL/SimFed method matches on (SimFed's z, else v), seeds
                    pooled, against the method's tau: whether matching can happen at all
  decomp            FedDecomp's sigma/tau diagnostics per round (004 Fig. 6)
  elora             accuracy against E_lora, when alternating FedDecomp runs try two or more
                    E_lora values in a scenario (004 Fig. 5)

each as NAME.png and NAME.pdf. An optional figure whose data is absent is not written, and a copy
an earlier call left in `out_dir` is removed, so the folder shows exactly what the runs hold.
Figures of runs on synthetic data (dataset "synthetic:...") or with `smoke` carry the title
SMOKE_TITLE and a diagonal watermark, and come as NAME.png only. Every problem with the runs is one UsageError, raised
before any figure is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import numpy as np
import pandas as pd
from pydantic import BeforeValidator, Field

from ..errors import UsageError
from ..diagnostics import heatmaps
from ..diagnostics.decomp import (DIAGNOSTICS, MethodSettings, RunSettings, check_diagnostics, draw_decomposition,
                                 draw_elora, elora_data, is_sweep_run)
from ..report.figures import (DatasetKey, _read_metrics, decorate, holds_numbers, is_synthetic, legend_outside,
                             mean_band, method_styles, panel_grid, pyplot, rounds_axis, save_figure)
from ..report.runs import Accuracy, _nan_is_null, find_summaries, read_summary

ALWAYS = ("accuracy_rounds", "accuracy_bytes", "accuracy_time", "per_client")
OPTIONAL = ("similarity", "matching", "similarity_spread", "decomp", "elora")
SPREAD = (0.1, 0.5, 0.9)  # the quantiles drawn: a band between the outer two, a line at the middle
MB = 1e6
_FIX = "the run did not finish or the file is damaged: re-run it"
XAxis = Literal["rounds", "bytes", "time"]  # what the accuracy figures draw accuracy against

ClientAccuracy = Annotated[Accuracy | None, BeforeValidator(_nan_is_null)]


class _Method(MethodSettings):
    # the similarity threshold of Factorized-FL and SimFed (FedFac's tau is a threshold name: "95%", "mean")
    tau: float | str | None = None


class _Settings(RunSettings):
    method: _Method = Field(default_factory=_Method)


class StudyRun(DatasetKey):
    """What the study figures read from a summary beside the run's name."""

    # null (NaN) for a client without test data
    per_client_accuracy: list[ClientAccuracy]
    config: _Settings = Field(default_factory=_Settings)


@dataclass
class Study:
    """The runs of a study, read and checked."""

    runs: pd.DataFrame  # one row per run: scenario, method, seed, dataset, dir, per_client, config
    curves: pd.DataFrame  # metrics.csv's evaluated rounds of every run, tagged, with bytes_mb and elapsed_seconds
    scenarios: list[str]  # in the order they first appear
    methods: list[str]
    synthetic: bool  # some run trained on synthetic data


def load_study(summaries: Sequence[str | Path]) -> Study:
    """Every run's summary and metrics.csv, checked; UsageError naming the file otherwise."""
    files = list(dict.fromkeys(p.resolve() for p in find_summaries(summaries)))
    rows: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    seen: dict[tuple[str, str, int], Path] = {}
    for s in files:
        run = read_summary(s, StudyRun)
        key = (run.scenario, run.method, run.seed)
        if key in seen:
            raise UsageError(f"{seen[key]} and {s} are both scenario {run.scenario}, method {run.method}, seed "
                             f"{run.seed}; pass the runs of one study (their labels must differ)")
        seen[key] = s
        path = s.parent / "metrics.csv"
        metrics = check_diagnostics(path, _read_costs(path, _read_metrics(path)))
        frames.append(metrics.assign(scenario=run.scenario, method=run.method, seed=run.seed))
        rows.append({"scenario": run.scenario, "method": run.method, "seed": run.seed, "dataset": run.dataset,
                     "dir": s.parent, "per_client": [a for a in run.per_client_accuracy if a is not None],
                     "config": run.config})
    runs = pd.DataFrame(rows)
    return Study(runs=runs, curves=pd.concat(frames, ignore_index=True),
                 scenarios=list(dict.fromkeys(runs["scenario"])), methods=list(dict.fromkeys(runs["method"])),
                 synthetic=bool(runs["dataset"].map(is_synthetic).any()))


def _read_costs(path: Path, m: pd.DataFrame) -> pd.DataFrame:
    """`m`, its cumulative bytes and seconds checked, with bytes_mb: the bytes sent up and down until
    each round, in MB."""
    _check_amounts(path, m, ("bytes_up", "bytes_down"), "byte counts")
    _check_amounts(path, m, ("elapsed_seconds",), "seconds since the run's start")
    return m.assign(bytes_mb=(m["bytes_up"] + m["bytes_down"]) / MB)


def _check_amounts(path: Path, m: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """UsageError naming `path` unless each of `columns` is in `m` and holds finite numbers >= 0."""
    for c in columns:
        if c not in m:
            raise UsageError(f"{path} has no column {c!r}; {_FIX}")
        if not holds_numbers(m[c]) or not np.isfinite(m[c]).all() or (m[c] < 0).any():
            raise UsageError(f"{path}: {c} holds something other than {what} (numbers >= 0); {_FIX}")


# -- the command ----------------------------------------------------------------------------------


def study_figures(summaries: Sequence[str | Path], out_dir: str | Path, title: str, smoke: bool = False) -> list[Path]:
    """Write the study's figures into `out_dir` (see the module docstring); returns the written
    paths, PNG then PDF of each figure, in the order of ALWAYS then OPTIONAL."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the figures")
    study = load_study(summaries)
    smoke = bool(smoke or study.synthetic)
    styles = method_styles(study.methods)

    # everything that can fail on bad input is read before the first figure is written
    reps = _representatives(study)
    sims = {scenario: heatmaps.load_similarity(run["dir"]) for scenario, run in reps.items()}
    spread = _spread_rows(study)
    decomp = _decomp_rows(study)
    elora = elora_data([d / "summary.json" for d in study.runs["dir"]])[0] if _has_sweep(study) else None

    figures = {
        "accuracy_rounds": lambda: _accuracy_figure(study, styles, "rounds"),
        "accuracy_bytes": lambda: _accuracy_figure(study, styles, "bytes"),
        "accuracy_time": lambda: _accuracy_figure(study, styles, "time"),
        "per_client": lambda: _per_client_figure(study, styles),
    }
    if sims:
        figures["similarity"] = lambda: _similarity_figure(reps, sims)
    if any(sim.counts is not None for sim in sims.values()):
        figures["matching"] = lambda: _matching_figure(reps, sims)
    if not spread.empty:
        figures["similarity_spread"] = lambda: _spread_figure(study, spread, styles)
    titles = {
        "accuracy_rounds": "mean client accuracy per round (mean ± std over seeds)",
        "accuracy_bytes": "mean client accuracy against bytes sent (mean ± std over seeds)",
        "accuracy_time": "mean client accuracy against wall-clock time (mean ± std over seeds)",
        "per_client": "each client's accuracy at the last round",
        "similarity": "cosine similarity between clients (one run per scenario)",
        "matching": "how often each client mixed in each other client (one run per scenario)",
        "similarity_spread": "similarity between distinct clients per round against tau (seeds pooled; line: "
                             "median, band: 10-90 %, dotted: max, dashed: tau)",
        "decomp": "FedDecomp's sigma and tau diagnostics per round (mean ± std over seeds)",
        "elora": "reported accuracy against E_lora (mean ± std over seeds)",
    }

    written: list[Path] = []
    for name, draw in figures.items():
        fig = draw()
        decorate(fig, _join(title, titles[name]), smoke)
        written += save_figure(fig, out / f"{name}.png")
    if decomp is not None:
        draw_decomposition(decomp, out / "decomp.png", _join(title, titles["decomp"]), smoke, styles)
        written += _twins(out / "decomp.png")
    if elora is not None:
        draw_elora(elora, out / "elora.png", _join(title, titles["elora"]), smoke)
        written += _twins(out / "elora.png")
    for name in OPTIONAL:  # a figure an earlier call drew from runs that had its data
        for stale in (out / f"{name}.png", out / f"{name}.pdf"):
            if stale not in written:
                stale.unlink(missing_ok=True)
    return written


def _twins(png: Path) -> list[Path]:
    """The PNG save_figure wrote and its PDF twin where it wrote one (not for a smoke run)."""
    return [p for p in (png, png.with_suffix(".pdf")) if p.exists()]


def _join(title: str, what: str) -> str:
    return f"{title}: {what}" if title else what[0].upper() + what[1:]


# -- what is there --------------------------------------------------------------------------------


def _representatives(study: Study) -> dict[str, pd.Series]:
    """Per scenario, the run whose similarities are drawn: of the runs that logged client
    similarities, one that also counted matches if any, then the first method, then the lowest seed."""
    order = {m: i for i, m in enumerate(study.methods)}
    reps = {}
    for scenario in study.scenarios:
        runs = study.runs[study.runs.scenario == scenario]
        candidates = [run for _, run in runs.iterrows() if heatmaps.has_similarity(run["dir"])]
        if candidates:
            reps[scenario] = min(candidates, key=lambda r: (not heatmaps.logged(r["dir"], heatmaps.COUNTS),
                                                            order[r["method"]], r["seed"]))
    return reps


def _matched_on(run_dir: Path) -> str | None:
    """The similarity a run's clients were matched on: SimFed's embeddings z, else Factorized-FL's v."""
    return next((name for name in ("similarity_z", "similarity_v") if heatmaps.logged(run_dir, name)), None)


def _spread_rows(study: Study) -> pd.DataFrame:
    """Per scenario, method and round: the quantiles SPREAD and the max of the similarities between
    distinct clients (seeds pooled) the method matched on, its tau and the similarity's name."""
    rows: list[dict[str | float, Any]] = []  # the quantile columns are named by their quantile
    for (scenario, method), runs in study.runs.groupby(["scenario", "method"], sort=False):
        named = [(run["dir"], name) for _, run in runs.iterrows() if (name := _matched_on(run["dir"]))]
        if not named:
            continue
        pooled: dict[int, list[np.ndarray]] = {}
        for run_dir, name in named:
            for r in heatmaps.available_rounds(run_dir)[name]:  # every round, each file checked
                m = heatmaps.load_matrix(run_dir, name, r)
                pooled.setdefault(r, []).append(m[~np.eye(len(m), dtype=bool)])
        taus = {tau for _, run in runs.iterrows() if isinstance(tau := run["config"].method.tau, float)}
        for r, parts in sorted(pooled.items()):
            others = np.concatenate(parts)
            others = others[np.isfinite(others)]  # NaN: a client without an upload yet
            if len(others):
                rows.append({"scenario": scenario, "method": method, "round": r, "name": named[0][1],
                             "taus": sorted(taus), "max": others.max(),
                             **{q: np.quantile(others, q) for q in SPREAD}})
    return pd.DataFrame(rows)


def _decomp_rows(study: Study) -> pd.DataFrame | None:
    """The metrics rows of the runs that logged FedDecomp's diagnostics, or None."""
    columns = [c for c in DIAGNOSTICS if c in study.curves]
    if not columns:
        return None
    keys = ["scenario", "method", "seed"]
    with_values = study.curves[study.curves[columns].notna().any(axis=1)][keys].drop_duplicates()
    data = study.curves.merge(with_values, on=keys)  # every row of the runs that logged them
    return None if data.empty else data


def _has_sweep(study: Study) -> bool:
    """Whether some scenario holds alternating FedDecomp runs of two or more E_lora values."""
    values: dict[str, set] = {}
    for _, run in study.runs.iterrows():
        if is_sweep_run(run["config"]):
            values.setdefault(run["scenario"], set()).add(run["config"].method.e_lora)
    return any(len(v) >= 2 for v in values.values())


# -- the figures ----------------------------------------------------------------------------------


def _seeds(runs: pd.DataFrame) -> str:
    counts = runs.groupby("method").size()
    low, high = counts.min(), counts.max()
    n = f"{low}" if low == high else f"{low}-{high}"
    return f"{n} seed{'s' if high > 1 else ''}"


def _accuracy_figure(study: Study, styles: dict, x: XAxis):
    """A panel per scenario, a line per method: accuracy against rounds, cumulative bytes or the
    run's wall-clock seconds (each mean over seeds per round)."""
    plt, fig, axes = panel_grid(len(study.scenarios), 4.4, 3.3)
    for ax, scenario in zip(axes.flat, study.scenarios):
        curves = study.curves[study.curves.scenario == scenario]
        sent = False
        for method in study.methods:
            d = curves[curves.method == method]
            if d.empty:
                continue
            if x != "bytes":
                mean_band(ax, d, "accuracy_mean", label=method, x="elapsed_seconds" if x == "time" else None,
                          **styles[method])
                continue
            positive = d[d.bytes_mb > 0]
            if positive.empty:  # nothing sent (local training): no place on a log axis
                last = d[d["round"] == d.groupby("seed")["round"].transform("max")]
                ax.axhline(100 * last["accuracy_mean"].mean(), color=styles[method]["color"], linestyle=":",
                           linewidth=1.2, label=f"{method} (sends nothing: last round)")
            else:
                mean_band(ax, positive, "accuracy_mean", label=method, x="bytes_mb", **styles[method])
                sent = True
        ax.set_title(f"{scenario} ({_seeds(study.runs[study.runs.scenario == scenario])})", fontsize="medium")
        if x == "bytes":
            if sent:
                ax.set_xscale("log")
            ax.set_xlabel("bytes sent up + down, cumulative [MB]" + (" (log)" if sent else ""))
        elif x == "time":  # seconds of this machine under its load then: not comparable across machines
            ax.set_xlabel("wall-clock time since the run's start [s]\n(on the machine that ran it, under its load)")
        else:
            rounds_axis(ax)
        ax.set_ylabel("mean client accuracy [%]")
        ax.grid(alpha=0.3, which="both" if x == "bytes" else "major")
    legend_outside(fig, axes.flat, title="method")
    return fig


def _boxplot_orientation() -> dict:
    import matplotlib

    major, minor = (int(x) for x in matplotlib.__version__.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def _per_client_figure(study: Study, styles: dict):
    """A panel per scenario: per method a box of its clients' last-round accuracies (clients of
    every seed), the clients as points, methods ordered by median (best on top)."""
    rng = np.random.default_rng(0)  # the points' jitter: the same figure for the same runs
    per_panel = study.runs.groupby("scenario")["method"].nunique().max()
    plt, fig, axes = panel_grid(len(study.scenarios), 4.6, 0.32 * per_panel + 1.4)
    for ax, scenario in zip(axes.flat, study.scenarios):
        runs = study.runs[study.runs.scenario == scenario]
        values = {m: 100 * np.asarray([a for pcs in runs[runs.method == m]["per_client"] for a in pcs], dtype=float)
                  for m in study.methods if (runs.method == m).any()}
        empty = [m for m, v in values.items() if not len(v)]
        ranked = sorted((m for m in values if len(values[m])), key=lambda m: -np.median(values[m]))
        positions = np.arange(len(ranked), 0, -1)  # the best on top
        if ranked:
            boxes = ax.boxplot([values[m] for m in ranked], positions=positions, widths=0.6, patch_artist=True,
                               showfliers=False, showmeans=True, whis=(0, 100), **_boxplot_orientation(),
                               medianprops={"color": "black"},
                               meanprops={"marker": "D", "markersize": 3.5, "markerfacecolor": "white",
                                          "markeredgecolor": "black"})
            for patch, m in zip(boxes["boxes"], ranked):
                patch.set_facecolor(styles[m]["color"])
                patch.set_alpha(0.35)
            for pos, m in zip(positions, ranked):
                v = values[m]
                ax.scatter(v, pos + rng.uniform(-0.18, 0.18, len(v)), s=7, color=styles[m]["color"], alpha=0.7,
                           linewidths=0, zorder=3)
        ax.set_yticks(positions, ranked, fontsize="small" if len(ranked) <= 12 else "x-small")
        ax.set_ylim(0.4, len(ranked) + 0.6)
        ax.set_xlim(-2, 102)
        ax.set_xlabel("client accuracy at the last round [%]")
        note = f"; no client scored: {', '.join(empty)}" if empty else ""
        ax.set_title(f"{scenario} ({_seeds(runs)}; a point per client and seed{note})", fontsize="small", wrap=True)
        ax.grid(alpha=0.3, axis="x")
    return fig


def _run_label(run: pd.Series) -> str:
    return f"{run['scenario']}: {run['method']}, seed {run['seed']}"


def _similarity_figure(reps: dict[str, pd.Series], sims: dict[str, heatmaps.Similarity]):
    """A block per representative run, titled with the run: a row per similarity it logs, a column for
    its first, middle and last round. The run's name heads its block rather than sitting in an axis
    label, where a long one overlapped the label beside it."""
    plt = pyplot()
    cols = max(len(sim.rounds) for sim in sims.values())
    heights = [len(sim.rows) for sim in sims.values()]
    fig = plt.figure(figsize=(3.0 * cols + 1.4, 2.9 * sum(heights) + 0.4 * len(sims) + 0.6), layout="constrained")
    blocks = fig.subfigures(len(sims), 1, height_ratios=heights, squeeze=False)[:, 0]
    for (scenario, sim), block in zip(sims.items(), blocks):
        block.suptitle(_run_label(reps[scenario]), fontsize="medium")
        axes = block.subplots(len(sim.rows), cols, squeeze=False)
        im = None
        for name, row in zip(sim.rows, axes):
            for j, ax in enumerate(row):
                if j >= len(sim.rounds):
                    ax.set_visible(False)
                    continue
                r = sim.rounds[j]
                im = heatmaps.heatmap(ax, sim.matrices[name, r], heatmaps.similarity_cmap(), -1, 1)
                ax.set_title(f"{heatmaps.SIMILARITIES[name]}, round {r}", fontsize="medium")
                ax.set_xlabel("client")
                ax.set_ylabel("client")
        block.colorbar(im, ax=axes.ravel().tolist(), label="cosine similarity\n(grey: not uploaded yet)", shrink=0.8)
    return fig


def _spread_figure(study: Study, spread: pd.DataFrame, styles: dict):
    """A panel per scenario, per method the spread of its matched-on similarity per round: median
    line, 10-90 % band, dotted max, and its tau as a dashed level (a client matches another only
    where the similarity reaches it)."""
    scenarios = [s for s in study.scenarios if (spread.scenario == s).any()]
    plt, fig, axes = panel_grid(len(scenarios), 4.4, 3.3)
    low, mid, high = SPREAD
    for ax, scenario in zip(axes.flat, scenarios):
        for method, d in spread[spread.scenario == scenario].groupby("method", sort=False):
            style = styles[method]
            name = heatmaps.SIMILARITIES[d["name"].iloc[0]]
            ax.plot(d["round"], d[mid], label=f"{method} ({name})", **style)
            ax.fill_between(d["round"], d[low], d[high], color=style["color"], alpha=0.2, linewidth=0)
            ax.plot(d["round"], d["max"], color=style["color"], linestyle=":", linewidth=1)
            for tau in d["taus"].iloc[0]:
                ax.axhline(tau, color=style["color"], linestyle="--", linewidth=1.2, label=f"{method}: tau {tau:g}")
        ax.set_title(f"{scenario} ({_seeds(study.runs[study.runs.scenario == scenario])})", fontsize="medium")
        rounds_axis(ax)
        ax.set_ylabel("cosine similarity, client pairs")
        ax.grid(alpha=0.3)
    legend_outside(fig, axes.flat, title="method (matched on)")
    return fig


def _matching_figure(reps: dict[str, pd.Series], sims: dict[str, heatmaps.Similarity]):
    """A panel per scenario with matching counts: the share of rounds in which client i (row)
    mixed in client j (column), the client itself left grey."""
    plt = pyplot()
    counted = [s for s, sim in sims.items() if sim.counts is not None]
    _, fig, axes = panel_grid(len(counted), 3.6, 3.3)
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    im = None
    for ax, scenario in zip(axes.flat, counted):
        sim = sims[scenario]
        assert sim.counts is not None and sim.counts_round is not None  # `counted` holds only those with counts
        share = sim.counts / max(sim.counts_round, 1)
        np.fill_diagonal(share, np.nan)
        im = heatmaps.heatmap(ax, share, cmap, 0, 1)
        ax.set_title(f"{_run_label(reps[scenario])}\nrounds 1-{sim.counts_round}", fontsize="small")
        ax.set_xlabel("client mixed in")
        ax.set_ylabel("client")
    fig.colorbar(im, ax=[ax for ax in axes.flat if ax.get_visible()], label="share of rounds matched", shrink=0.8)
    return fig
