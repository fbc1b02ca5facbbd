"""Factor-analysis diagnostics of finished runs: `fedfactor diagnose`, for every method.

FedFac (paper 001, section 4.1) shares the output units of chosen layers whose communality nu (the
share of a unit's variance the G common factors explain) reaches a threshold tau. This step runs
the same factor analysis (`analysis.factor`) on the clients' final weights of every analysed layer
of every run, FedFac or not, so the methods can be compared on what the analysis would decide:

- G (from kappa) and the cumulative eigenvalue share curve;
- the distribution of nu (min, quartiles, mean, max);
- the share of units that would be shared at tau = the 25/50/75/90/95% quantiles of nu (about
  1 - q by construction), at its mean (the informative one) and at nu >= 0.5, 0.7, 0.9.

A FedFac run also logs its own split per analysed round (diagnostics/fedfac.shared.<index>/): its
split history (rounds x units, units sorted by how often they were shared) and the share of units
whose state did not change since the previous analysed round (001 Figure 7) are drawn too.

A run folder contributes when its summary.json lists `analysed_layers` ({"<index>": "<module>"})
and it holds client_weights.npz ("<module>.weight": K x d x ... weights of the K clients). A layer
that computes its weight from factors (Factorized-FL, FedDecomp, pFedPara) is analysed through its
effective weight, kept in the plain layer's shape (job.save_client_weights): u v^T + mu with mu as
trained (not pruned), sigma + tau, W_1 o (W_2 + 1). Runs without them (FedEM, whose mixture has no
single layer; such methods' runs by an older fedfactor) are listed with the reason and skipped; a
layer the analysis fails on (NaN weights; a damaged, pickled or mismatched client_weights.npz, which
is never unpickled) gets a row with the error text naming the file. Outputs (in `out_dir`,
every one written atomically): diagnostics.csv (one row per run x layer), eigenvalues.csv (the
eigenvalue curves), diagnostics.md (means over seeds per scenario x method x layer),
communalities.png, eigenvalues.png and, when a FedFac run is among them, split_history.png and
stability.png, each figure with a .pdf twin. Each run with an MLflow run gets its numbers as metrics
`fa.<index>.<name>` and its own rows and figures as artifacts under diagnostics/ (warnings only when
that fails).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import UsageError
from ..io import atomic_write_text
from .figures import legend_outside, method_styles, pyplot, save_figure
from .runs import RunKey, find_summaries, read_summary

log = logging.getLogger("fedfactor")

WEIGHTS_FILE = "client_weights.npz"
QUANTILES = (25, 50, 75, 90, 95)  # tau = these quantiles of nu: about 1 - q shared by construction
ABSOLUTE = (0.5, 0.7, 0.9)  # tau = these values of nu
SHARED_PREFIX, COMMUNALITY_PREFIX = "fedfac.shared.", "fedfac.communality."
_ROUND_FILE = re.compile(r"round_(\d+)\.npy")
_FA_METHODS = ("principal", "eigen")
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)  # what numpy and zipfile raise
_REWRITE = "the file is damaged or was not written by fedfactor: re-run the run to write it again"


def share_columns() -> list[str]:
    """The csv columns of the share of units shared at each threshold."""
    return [f"shared_q{q}" for q in QUANTILES] + ["shared_mean"] + [f"shared_ge{v}" for v in ABSOLUTE]


COLUMNS = ["scenario", "method", "seed", "layer", "module", "K", "d", "fan_in", "G", "eig_share_G", "constant",
           "converged", "nu_min", "nu_q25", "nu_median", "nu_q75", "nu_mean", "nu_max", "tau_mean",
           *share_columns(), "fedfac_rounds", "fedfac_shared_last", "fedfac_stable_last", "fedfac_stable_mean",
           "error", "run"]


# -- reading the runs ---------------------------------------------------------------------------


class _Tracking(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uri: str | None = None


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tracking: _Tracking = Field(default_factory=_Tracking)


class DiagnoseRun(RunKey):
    """The fields `fedfactor diagnose` reads from a summary.json."""

    analysed_layers: dict[str, str] | None = None  # {"<paper index>": "<module name>"}
    mlflow_run_id: str | None = None
    config: _Config = Field(default_factory=_Config)

    @field_validator("analysed_layers")
    @classmethod
    def _indices(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for k in v or {}:
            if not (k.isdigit() and int(k) >= 1):
                raise ValueError(f"analysed_layers key {k!r} is not a layer index (1, 2, ...)")
        return v


@dataclass
class RunInfo:
    path: Path  # the run folder
    run: DiagnoseRun
    layers: dict[int, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.run.scenario}/{self.run.method}/seed{self.run.seed}"


def read_runs(paths: Sequence[str | Path]) -> list[RunInfo]:
    """The runs under `paths` (run folders, their summary.json files, or folders searched for them)."""
    runs = []
    for f in find_summaries(paths):
        run = read_summary(f, DiagnoseRun)
        layers = {int(k): v for k, v in sorted((run.analysed_layers or {}).items(), key=lambda kv: int(kv[0]))}
        runs.append(RunInfo(f.parent, run, layers))
    return runs


def skip_reason(info: RunInfo) -> str | None:
    """Why a run has nothing to analyse, or None."""
    if not info.layers:
        return "no analysed layer (summary.json's analysed_layers is absent or empty)"
    if not (info.path / WEIGHTS_FILE).exists():  # something else by that name is a damaged file: an error row
        return f"no {WEIGHTS_FILE} (the run wrote no client weights; re-run it with a current fedfactor)"
    return None


# -- the analysis of one layer ------------------------------------------------------------------


@dataclass
class LayerResult:
    row: dict
    nu: np.ndarray | None = None  # communalities, length d
    curve: np.ndarray | None = None  # cumulative eigenvalue share, m = 1..
    history: tuple[list[int], np.ndarray] | None = None  # FedFac: (rounds, rounds x d 0/1)


def analyse_weights(weights: np.ndarray, kappa: float = 0.85, method: str = "principal") -> tuple[dict, np.ndarray,
                                                                                                 np.ndarray]:
    """Factor analysis of one layer's K x d x ... client weights: (numbers, nu, eigenvalue curve).

    Raises ValueError when the analysis cannot run (NaN weights, too few rows).
    """
    import torch

    from ..analysis.factor import factor_analysis, split, unit_matrix

    if weights.ndim < 2 or 0 in weights.shape:
        raise ValueError(f"weights of shape {weights.shape} are not K clients x d units x ...")
    if weights.dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"weights of type {weights.dtype} are not floating-point numbers")
    # a run saves float16 weights; beyond float32's range they are not a model's, and the analysis in
    # float64 would overflow into a plausible-looking result
    if weights.dtype == np.float64 and (np.abs(weights[np.isfinite(weights)]) > np.finfo(np.float32).max).any():
        raise ValueError("the weights hold values beyond float32's range; they are not a model's weights")
    w = torch.from_numpy(np.ascontiguousarray(weights))
    result = factor_analysis(unit_matrix(w), kappa=kappa, method=method)
    nu = result.communalities.cpu()
    ev = result.eigenvalues.clamp_min(0).cpu()
    curve = (ev.cumsum(0) / ev.sum()).numpy() if float(ev.sum()) > 0 else np.zeros(0)
    q = torch.quantile(nu, torch.tensor([0.25, 0.5, 0.75], dtype=nu.dtype))
    numbers = {
        "K": int(w.shape[0]), "d": int(w.shape[1]), "fan_in": int(np.prod(w.shape[2:], dtype=np.int64)),
        "G": result.n_factors,
        "eig_share_G": float(curve[result.n_factors - 1]) if len(curve) >= result.n_factors >= 1 else math.nan,
        "constant": int(result.constant.sum()), "converged": bool(result.converged),
        "nu_min": float(nu.min()), "nu_q25": float(q[0]), "nu_median": float(q[1]), "nu_q75": float(q[2]),
        "nu_mean": float(nu.mean()), "nu_max": float(nu.max()), "tau_mean": float(nu.mean()),
    }
    for tau, column in zip([f"q{p}" for p in QUANTILES] + ["mean"] + list(ABSOLUTE), share_columns()):
        numbers[column] = float(split(nu, tau).double().mean())
    return numbers, nu.numpy(), curve


def split_history(run_dir: Path, index: int) -> tuple[list[int], np.ndarray] | None:
    """A FedFac run's split of layer `index` per analysed round: (rounds, rounds x d 0/1 array), or
    None when the run logged none. ValueError for files that are not such vectors."""
    folder = run_dir / "diagnostics" / f"{SHARED_PREFIX}{index}"
    if not folder.is_dir():
        return None
    files = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _ROUND_FILE.fullmatch(p.name)))
    if not files:
        return None
    rows = []
    for _, p in files:
        try:
            a = np.load(p, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise ValueError(f"cannot read {p} ({' '.join(str(e).split())})") from None
        if a.ndim != 1 or (rows and a.shape != rows[0].shape):
            raise ValueError(f"{p} holds an array of shape {a.shape}, not a vector of "
                             f"{rows[0].shape[0] if rows else 'd'} units")
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool) or not np.isin(a, (0, 1)).all():
            raise ValueError(f"{p} holds values other than 0 and 1")
        rows.append(a.astype(np.uint8))
    return [r for r, _ in files], np.stack(rows)


def stability(states: np.ndarray) -> np.ndarray:
    """Share of units whose state did not change since the previous analysed round (rounds 2..)."""
    states = np.asarray(states)
    if len(states) < 2:
        return np.zeros(0)
    return (states[1:] == states[:-1]).mean(axis=1)


def unit_order(states: np.ndarray) -> np.ndarray:
    """The units most often shared first (ties: by index), for the split-history heatmap."""
    states = np.asarray(states)
    return np.lexsort((np.arange(states.shape[1]), -states.sum(axis=0, dtype=np.int64)))


def _empty_row(info: RunInfo, index: int, module: str) -> dict:
    row = dict.fromkeys(COLUMNS, math.nan)
    row.update(scenario=info.run.scenario, method=info.run.method, seed=info.run.seed, layer=index, module=module,
               fedfac_rounds=0, error="", run=str(info.path))
    return row


def analyse_run(info: RunInfo, kappa: float, method: str) -> list[LayerResult]:
    """One LayerResult per analysed layer of a run with weights (an error row where it fails)."""
    # A damaged archive costs its run's rows an error, as NaN weights do, not the other runs' diagnostics.
    results = []
    path = info.path / WEIGHTS_FILE
    archive, reason = None, ""
    if not zipfile.is_zipfile(path):  # np.load would take anything else for a pickle and refuse it as one
        reason = f"{path} is not an .npz archive (a zip of one .npy array per layer); {_REWRITE}"
    else:
        try:
            archive = np.load(path, allow_pickle=False)
        except _UNREADABLE as e:
            reason = f"cannot read {path} ({' '.join(str(e).split())}); {_REWRITE}"
    with archive if archive is not None else contextlib.nullcontext():
        for index, module in info.layers.items():
            res = LayerResult(_empty_row(info, index, module))
            key = f"{module}.weight"
            try:
                if archive is None:
                    raise ValueError(reason)
                if key not in archive.files:
                    have = ", ".join(archive.files) or "none"
                    raise ValueError(f"{path} has no entry {key!r} for layer {index} of summary.json's "
                                     f"analysed_layers (it has {have}); {_REWRITE}")
                try:
                    weights = archive[key]  # allow_pickle=False: an object array is refused, never unpickled
                except _UNREADABLE as e:
                    raise ValueError(f"cannot read {key!r} from {path} ({' '.join(str(e).split())}); "
                                     f"{_REWRITE}") from None
                if not isinstance(weights, np.ndarray):  # numpy hands out a member it cannot parse as bytes
                    raise ValueError(f"{key!r} in {path} is not an .npy array; {_REWRITE}")
                numbers, res.nu, res.curve = analyse_weights(weights, kappa, method)
                res.row.update(numbers)
            except (ValueError, RuntimeError, MemoryError) as e:  # RuntimeError: torch's linear algebra
                res.row["error"] = " ".join(str(e).split())
                log.warning("%s layer %d (%s): %s", info.name, index, module, res.row["error"])
            try:
                res.history = split_history(info.path, index)
            except ValueError as e:
                note = f"split history: {' '.join(str(e).split())}"
                res.row["error"] = f"{res.row['error']}; {note}" if res.row["error"] else note
                log.warning("%s layer %d: %s", info.name, index, note)
            if res.history is not None:
                rounds, states = res.history
                stable = stability(states)
                res.row.update(fedfac_rounds=len(rounds), fedfac_shared_last=float(states[-1].mean()),
                               fedfac_stable_last=float(stable[-1]) if len(stable) else math.nan,
                               fedfac_stable_mean=float(stable.mean()) if len(stable) else math.nan)
            results.append(res)
    return results


# -- the command --------------------------------------------------------------------------------


def diagnose(run_dirs: Sequence[str | Path], out_dir: str | Path, kappa: float = 0.85, method: str = "principal",
             mlflow: bool = True, uri: str | None = None, figures_dir: str | Path | None = None) -> dict:
    """Analyse the runs under `run_dirs`, write the outputs into `out_dir` (see the module
    docstring) and, unless `mlflow` is False, log each run's numbers onto its MLflow run in the
    store `uri` (default: the run's own tracking.uri). Returns {"rows": DataFrame, "skipped":
    [(run, reason)], "files": [written paths], "mlflow": {run folder: outcome}}."""
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not 0 < kappa <= 1:
        raise UsageError(f"kappa must be in (0, 1] (got {kappa!r}); FedFac's default is 0.85")
    if method not in _FA_METHODS:
        raise UsageError(f"factor-analysis method must be {' or '.join(_FA_METHODS)} (got {method!r})")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the diagnostics")
    runs = read_runs(run_dirs)

    results: dict[Path, list[LayerResult]] = {}
    skipped: list[tuple[RunInfo, str]] = []
    for info in runs:
        reason = skip_reason(info)
        if reason is not None:
            skipped.append((info, reason))
            log.info("%s (%s): skipped, %s", info.name, info.path, reason)
            continue
        results[info.path] = analyse_run(info, kappa, method)
    layer_results = [r for rs in results.values() for r in rs]
    rows = pd.DataFrame([r.row for r in layer_results], columns=COLUMNS)

    written = []

    def write_text(name: str, text: str) -> None:
        atomic_write_text(out / name, text)
        written.append(out / name)

    write_text("diagnostics.csv", rows.to_csv(index=False))
    write_text("eigenvalues.csv", _curves_frame(layer_results).to_csv(index=False))
    figures = out if figures_dir is None else Path(figures_dir)  # the workflow reports a folder of them
    for name, draw in (("communalities.png", _communalities_fig), ("eigenvalues.png", _eigenvalues_fig)):
        written += save_figure(draw(layer_results, kappa), figures / name)
    fedfac = [r for r in layer_results if r.history is not None]
    if fedfac:
        for name, draw in (("split_history.png", _split_history_fig), ("stability.png", _stability_fig)):
            written += save_figure(draw(fedfac), figures / name)
    write_text("diagnostics.md", to_markdown(rows, skipped, kappa, method, len(runs)))

    outcomes = {}
    if mlflow:
        outcomes = _log_to_mlflow(runs, results, kappa, method, uri)
    return {"rows": rows, "skipped": [(i.path, r) for i, r in skipped], "files": written, "mlflow": outcomes}


# -- tables -------------------------------------------------------------------------------------


def _curves_frame(results: list[LayerResult]) -> pd.DataFrame:
    frames = [pd.DataFrame({"scenario": r.row["scenario"], "method": r.row["method"], "seed": r.row["seed"],
                            "layer": r.row["layer"], "module": r.row["module"],
                            "factors": np.arange(1, len(r.curve) + 1), "cumulative_share": r.curve, "run": r.row["run"]})
              for r in results if r.curve is not None and len(r.curve)]
    columns = ["scenario", "method", "seed", "layer", "module", "factors", "cumulative_share", "run"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}"


def _num(x: float, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def to_markdown(rows: pd.DataFrame, skipped: list[tuple[RunInfo, str]], kappa: float, method: str,
                n_runs: int) -> str:
    ok = rows[rows["G"].notna()] if len(rows) else rows  # the analysis ran (a bad split history aside)
    lines = ["# Factor-analysis diagnostics", "",
             f"{n_runs} runs: {rows['run'].nunique() if len(rows) else 0} analysed, {len(skipped)} skipped. "
             f"Factor analysis of the clients' final weights of each analysed layer (kappa {kappa:g}, "
             f"{method} factors): G factors; nu = communality of a unit; shares [%] of the layer's units that "
             "would be shared at tau = the mean of nu and at nu >= 0.5 / 0.7 / 0.9 (at a quantile q of nu about "
             "1 - q are shared by construction: see diagnostics.csv). FedFac runs: the share of units their "
             "own last split shared, and the share whose state did not change since the previous analysed "
             "round, at the last one and on average. Mean over seeds (seeds in brackets).", ""]
    head = ["scenario", "method", "layer", "K x d", "G", "nu mean", "nu median", "shared@mean", "nu>=0.5",
            "nu>=0.7", "nu>=0.9", "FedFac shared", "stable last", "stable mean"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    if len(ok):
        g = ok.groupby(["scenario", "method", "layer", "module"], sort=False)
        for (scenario, method_name, layer, module), d in g:
            kd = " / ".join(dict.fromkeys(f"{int(k)} x {int(u)}" for k, u in zip(d["K"], d["d"])))
            G = d["G"].astype(float)
            g_text = f"{G.mean():.1f}" + (f" +- {G.std(ddof=0):.1f}" if len(G) > 1 else "")
            fed = d["fedfac_rounds"].fillna(0) > 0
            cells = [scenario, method_name, f"{layer} ({module})", kd, f"{g_text} ({d['seed'].nunique()})",
                     _num(d["nu_mean"].mean()), _num(d["nu_median"].mean()), _pct(d["shared_mean"].mean()),
                     *(_pct(d[f"shared_ge{v}"].mean()) for v in ABSOLUTE),
                     _pct(d.loc[fed, "fedfac_shared_last"].mean()) if fed.any() else "-",
                     _pct(d.loc[fed, "fedfac_stable_last"].mean()) if fed.any() else "-",
                     _pct(d.loc[fed, "fedfac_stable_mean"].mean()) if fed.any() else "-"]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    else:
        lines.append("| " + " | ".join(["(no layer analysed)", *["-"] * (len(head) - 1)]) + " |")
    errors = rows[rows["error"].fillna("") != ""] if len(rows) else rows
    if len(errors):
        lines += ["", "## Errors", ""]
        lines += [f"- {r.scenario}/{r.method}/seed{r.seed} layer {r.layer} ({r.module}), {r.run}: {r.error}"
                  for r in errors.itertuples()]
    if skipped:
        lines += ["", "## Skipped runs", ""]
        lines += [f"- {info.name}, {info.path}: {reason}" for info, reason in skipped]
    return "\n".join(lines) + "\n"


# -- figures ------------------------------------------------------------------------------------


def _grid(n: int, width: float = 4.0, height: float = 3.2, max_cols: int = 4):
    plt = pyplot()
    cols = max(1, min(n, max_cols))
    rows = max(1, -(-n // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat)


def _finish(plt, fig, title: str):
    """The figure, titled; `save_figure` writes it as PNG and PDF."""
    fig.suptitle(title, wrap=True)
    return fig


def _panels(results: list[LayerResult]) -> dict[tuple, list[LayerResult]]:
    panels: dict[tuple, list[LayerResult]] = {}
    for r in results:
        panels.setdefault((r.row["scenario"], r.row["layer"], r.row["module"]), []).append(r)
    return panels


def _nothing_fig(title: str, text: str):
    plt, fig, (ax,) = _grid(1, 5, 2.5)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return _finish(plt, fig, title)


def _method_lines(ax, runs: list[LayerResult], xy, colors: dict[str, str], step: bool = True) -> None:
    """One line per run, coloured by method, each method labelled once."""
    labelled = set()
    for r in runs:
        m = r.row["method"]
        x, y = xy(r)
        style = dict(**colors[m], alpha=0.8, linewidth=1.2, label=None if m in labelled else m)
        if step:
            ax.step(x, y, where="post", **style)
        else:
            ax.plot(x, y, marker="." if len(x) <= 40 else None, **style)
        labelled.add(m)


def _layer_figure(results: list[LayerResult], title: str, draw):
    """One panel per scenario x layer; `draw(ax, runs, styles)` adds the lines of its runs; one
    legend of the methods beside the panels."""
    if not results:
        return _nothing_fig(title, "no layer analysed")
    panels = _panels(results)
    colors = method_styles(list(dict.fromkeys(r.row["method"] for r in results)))
    plt, fig, axes = _grid(len(panels))
    for ax, ((scenario, layer, module), runs) in zip(axes, panels.items()):
        draw(ax, runs, colors)
        ax.set_title(f"{scenario}, layer {layer} ({module})", fontsize="medium")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    legend_outside(fig, axes, title="method (one line per run)")
    return _finish(plt, fig, title)


def _communalities_fig(results: list[LayerResult], kappa: float):
    """ECDF of nu, one panel per scenario x layer, one line per run coloured by method."""
    def ecdf(r):
        x = np.sort(r.nu)
        return np.concatenate([[0.0], x]), np.concatenate([[0.0], np.arange(1, len(x) + 1) / len(x)])

    def draw(ax, runs, colors):
        _method_lines(ax, runs, ecdf, colors)
        ax.set_xlabel("communality nu")
        ax.set_ylabel("share of units with nu <= x")
        ax.set_xlim(0, max(1.0, max(float(r.nu.max()) for r in runs)))

    return _layer_figure([r for r in results if r.nu is not None],
                         "Communalities nu of the clients' final weights (ECDF)", draw)


def _eigenvalues_fig(results: list[LayerResult], kappa: float):
    """Cumulative eigenvalue share against the number of factors, kappa marked."""
    from matplotlib.ticker import MaxNLocator

    def draw(ax, runs, colors):
        _method_lines(ax, runs, lambda r: (np.arange(0, len(r.curve) + 1), np.concatenate([[0.0], r.curve])),
                      colors, step=False)
        ax.axhline(kappa, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("factors m")
        ax.set_ylabel("cumulative eigenvalue share")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    return _layer_figure([r for r in results if r.curve is not None and len(r.curve)],
                         f"Cumulative eigenvalue share of R (G = first m reaching kappa = {kappa:g})", draw)


def _split_history_fig(results: list[LayerResult]):
    """One heatmap per FedFac run x layer: analysed rounds x units, shared dark, units sorted by how
    often they were shared."""
    from matplotlib.colors import ListedColormap
    from matplotlib.ticker import MaxNLocator

    plt, fig, axes = _grid(len(results), 4.2, 3.0)
    cmap = ListedColormap(["#f0f0f0", "#2b6cb0"])
    for ax, r in zip(axes, results):
        rounds, states = r.history
        ax.imshow(states[:, unit_order(states)], cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest",
                  extent=(0.5, states.shape[1] + 0.5, len(rounds) - 0.5, -0.5))
        ticks = np.unique(np.linspace(0, len(rounds) - 1, min(len(rounds), 6)).round().astype(int))
        ax.set_yticks(ticks, [str(rounds[t]) for t in ticks])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{r.row['scenario']}/{r.row['method']}/seed{r.row['seed']}, layer {r.row['layer']}",
                     fontsize="medium")
        ax.set_xlabel("unit (most often shared first)")
        ax.set_ylabel("round")
    return _finish(plt, fig, "FedFac split per analysed round (blue: shared, grey: personal)")


def _stability_fig(results: list[LayerResult]):
    """Share of units whose state did not change since the previous analysed round (001 Figure 7),
    one panel per scenario x layer, one line per run."""
    from matplotlib.ticker import MaxNLocator

    panels = _panels(results)
    plt, fig, axes = _grid(len(panels))
    for ax, ((scenario, layer, module), runs) in zip(axes, panels.items()):
        drawn = False
        for i, r in enumerate(runs):
            rounds, states = r.history
            s = stability(states)
            if len(s):
                ax.plot(rounds[1:], s, marker="." if len(s) < 30 else None, color=f"C{i % 10}",
                        label=f"{r.row['method']}/seed{r.row['seed']}")
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "one analysed round only\n(static FedFac): nothing can change", ha="center",
                    va="center", transform=ax.transAxes, fontsize="small")
        else:
            ax.legend(fontsize="x-small", loc="lower left", ncols=1 + len(runs) // 8)
        ax.set_title(f"{scenario}, layer {layer} ({module})", fontsize="medium")
        ax.set_xlabel("round")
        ax.set_ylabel("share of units unchanged")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    return _finish(plt, fig, "Units whose shared/personal state did not change since the previous analysed round")


# -- MLflow -------------------------------------------------------------------------------------


def mlflow_metrics(results: list[LayerResult]) -> dict[str, float]:
    """`fa.<index>.<name>` metrics of one run's layers (error rows contribute nothing)."""
    metrics: dict[str, float] = {}
    names = {"G": "factors", "eig_share_G": "eigenvalue_share", "nu_mean": "nu_mean", "nu_median": "nu_median",
             "nu_min": "nu_min", "nu_max": "nu_max", "fedfac_shared_last": "fedfac_shared_share_last",
             "fedfac_stable_last": "stable_share_last", "fedfac_stable_mean": "stable_share_mean"}
    names.update({c: c.replace("shared_", "shared_share_") for c in share_columns()})
    for r in results:
        for column, name in names.items():
            v = r.row.get(column)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
                metrics[f"fa.{r.row['layer']}.{name}"] = float(v)
    return metrics


def _log_to_mlflow(runs: list[RunInfo], results: dict[Path, list[LayerResult]], kappa: float, method: str,
                   uri: str | None) -> dict[Path, tuple[str, str]]:
    from ..tracking import log_to_run

    outcomes: dict[Path, tuple[str, str]] = {}
    dead: set[str] = set()  # stores found unreachable: not tried again for every run
    for info in runs:
        layer_results = results.get(info.path)
        if not layer_results:
            continue
        target = uri or info.run.config.tracking.uri
        if not target:
            outcomes[info.path] = ("no run", "the run's config names no tracking.uri; pass --uri")
            continue
        if target in dead:
            outcomes[info.path] = ("unreachable", f"MLflow store {target} unreachable")
            continue
        with tempfile.TemporaryDirectory(prefix="fedfactor-diagnose-") as tmp:
            folder = Path(tmp)
            _run_artifacts(info, layer_results, kappa, folder)
            outcome = log_to_run(info.path, target, mlflow_metrics(layer_results),
                                 tags={"fa.kappa": f"{kappa:g}", "fa.method": method},
                                 artifacts=folder, run_id=info.run.mlflow_run_id)
        outcomes[info.path] = outcome
        if outcome[0] == "unreachable":
            dead.add(target)
            log.warning("%s: diagnostics not logged to MLflow: %s; the files in --out hold them", info.name,
                        outcome[1])
        elif outcome[0] == "no run":
            log.info("%s: diagnostics not logged to MLflow: %s", info.name, outcome[1])
    return outcomes


def _run_artifacts(info: RunInfo, results: list[LayerResult], kappa: float, folder: Path) -> None:
    """One run's rows and figures, for its MLflow run: PNGs to look at in the UI (a PDF's embedded
    font took 0.5 s a figure, most of the default study's diagnostics; the study's figures have them)."""
    rows = pd.DataFrame([r.row for r in results], columns=COLUMNS)
    atomic_write_text(folder / "factor_analysis.csv", rows.to_csv(index=False))
    if any(r.nu is not None for r in results):
        save_figure(_communalities_fig(results, kappa), folder / "communalities.png", pdf=False)
        save_figure(_eigenvalues_fig(results, kappa), folder / "eigenvalues.png", pdf=False)
    fedfac = [r for r in results if r.history is not None]
    if fedfac:
        save_figure(_split_history_fig(fedfac), folder / "split_history.png", pdf=False)
        save_figure(_stability_fig(fedfac), folder / "stability.png", pdf=False)
