"""Factor-analysis diagnostics of finished runs: `fedfactor diagnose`, for every method.

FedFac (paper 001, section 4.1) shares the output units of chosen layers whose communality nu reaches
a threshold tau. This command runs the same factor analysis on the clients' final weights of every
analysed layer of every run, FedFac or not, so the methods can be compared on what the analysis would
decide (`layer_analysis` lists the numbers: G, the eigenvalue curve, the distribution of nu, the share
of units shared at several tau, and a FedFac run's own split history and its stability, 001 Figure 7).

A run folder contributes when its summary.json lists `analysed_layers` ({"<index>": "<module>"})
and it holds client_weights.npz ("<module>.weight": K x d x ... weights of the K clients). A layer
that computes its weight from factors (Factorized-FL, FedDecomp, pFedPara) is analysed through its
effective weight, kept in the plain layer's shape (`weights.save_client_weights`): u v^T + mu with mu as
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

import logging
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_text
from ..report.figures import decorate, is_synthetic, save_figure
from .figures import communalities_fig, eigenvalues_fig, split_history_fig, stability_fig
from .layer_analysis import COLUMNS, LayerResult, analyse_run, share_columns
from .runs import RunInfo, read_runs, skip_reason
from .tables import curves_frame, to_markdown

if TYPE_CHECKING:  # analysis.factor imports torch, which the diagnostics import only where they analyse
    from ..analysis.factor import FAMethod

log = logging.getLogger("fedfactor")

_FA_METHODS = ("principal", "eigen")


def diagnose(run_dirs: Sequence[str | Path], out_dir: str | Path, kappa: float = 0.85, method: FAMethod = "principal",
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
    write_text("eigenvalues.csv", curves_frame(layer_results).to_csv(index=False))
    figures = out if figures_dir is None else Path(figures_dir)  # the workflow reports a folder of them
    smoke = any(is_synthetic(info.run.dataset) for info in runs)

    def write_figure(fig, name: str) -> None:
        if smoke:  # its title led by SMOKE_TITLE, and the watermark
            decorate(fig, fig.get_suptitle(), smoke)
        written.extend(save_figure(fig, figures / name))

    for name, draw in (("communalities.png", communalities_fig), ("eigenvalues.png", eigenvalues_fig)):
        write_figure(draw(layer_results, kappa), name)
    fedfac = [r for r in layer_results if r.history is not None]
    if fedfac:
        for name, draw_fedfac in (("split_history.png", split_history_fig), ("stability.png", stability_fig)):
            write_figure(draw_fedfac(fedfac), name)
    write_text("diagnostics.md", to_markdown(rows, skipped, kappa, method, len(runs)))

    outcomes = {}
    if mlflow:
        outcomes = _log_to_mlflow(runs, results, kappa, method, uri)
    return {"rows": rows, "skipped": [(i.path, r) for i, r in skipped], "files": written, "mlflow": outcomes}



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
        save_figure(communalities_fig(results, kappa), folder / "communalities.png", pdf=False)
        save_figure(eigenvalues_fig(results, kappa), folder / "eigenvalues.png", pdf=False)
    fedfac = [r for r in results if r.history is not None]
    if fedfac:
        save_figure(split_history_fig(fedfac), folder / "split_history.png", pdf=False)
        save_figure(stability_fig(fedfac), folder / "stability.png", pdf=False)
