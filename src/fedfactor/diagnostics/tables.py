"""The tables of `fedfactor diagnose`: the eigenvalue curves as rows, and diagnostics.md.

diagnostics.md holds the means over seeds per scenario x method x layer (seeds in brackets), then the
layers whose analysis failed and the runs skipped, each with its reason.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .layer_analysis import ABSOLUTE, LayerResult
from .runs import RunInfo


def curves_frame(results: list[LayerResult]) -> pd.DataFrame:
    frames = [pd.DataFrame({"scenario": r.row["scenario"], "method": r.row["method"], "seed": r.row["seed"],
                            "layer": r.row["layer"], "module": r.row["module"],
                            "factors": np.arange(1, len(r.curve) + 1), "cumulative_share": r.curve,
                            "run": r.row["run"]})
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

