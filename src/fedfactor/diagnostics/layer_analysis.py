"""The factor analysis of a run's analysed layers: what FedFac's analysis would decide on their client weights.

FedFac (paper 001, section 4.1) shares the output units of chosen layers whose communality nu (the
share of a unit's variance the G common factors explain) reaches a threshold tau. Each analysed
layer's clients' final weights get the same factor analysis (`analysis.factor`), FedFac run or not:

- G (from kappa) and the cumulative eigenvalue share curve;
- the distribution of nu (min, quartiles, mean, max);
- the share of units that would be shared at tau = the 25/50/75/90/95% quantiles of nu (about
  1 - q by construction), at its mean (the informative one) and at nu >= 0.5, 0.7, 0.9;
- for a FedFac run, its own split history and the share of units whose state did not change since
  the previous analysed round (001 Figure 7).

A layer the analysis fails on (NaN weights, a damaged client_weights.npz) gets a row with the error
text instead of numbers.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .runs import RunInfo, split_history
from ..run.weights import WEIGHTS_FILE, layer_weights, open_weights

if TYPE_CHECKING:  # analysis.factor imports torch: analyse_weights imports it when it runs
    from ..analysis.factor import FAMethod

log = logging.getLogger("fedfactor")

QUANTILES = (25, 50, 75, 90, 95)  # tau = these quantiles of nu: about 1 - q shared by construction
ABSOLUTE = (0.5, 0.7, 0.9)  # tau = these values of nu


def share_columns() -> list[str]:
    """The csv columns of the share of units shared at each threshold."""
    return [f"shared_q{q}" for q in QUANTILES] + ["shared_mean"] + [f"shared_ge{v}" for v in ABSOLUTE]


COLUMNS = ["scenario", "method", "seed", "layer", "module", "K", "d", "fan_in", "G", "eig_share_G", "constant",
           "converged", "nu_min", "nu_q25", "nu_median", "nu_q75", "nu_mean", "nu_max", "tau_mean",
           *share_columns(), "fedfac_rounds", "fedfac_shared_last", "fedfac_stable_last", "fedfac_stable_mean",
           "error", "run"]


@dataclass
class LayerResult:
    row: dict
    nu: np.ndarray | None = None  # communalities, length d
    curve: np.ndarray | None = None  # cumulative eigenvalue share, m = 1..
    history: tuple[list[int], np.ndarray] | None = None  # FedFac: (rounds, rounds x d 0/1)


def analyse_weights(weights: np.ndarray, kappa: float = 0.85, method: FAMethod = "principal"
                    ) -> tuple[dict, np.ndarray, np.ndarray]:
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


def stability(states: np.ndarray) -> np.ndarray:
    """Share of units whose state did not change since the previous analysed round (rounds 2..)."""
    states = np.asarray(states)
    if len(states) < 2:
        return np.zeros(0)
    return (states[1:] == states[:-1]).mean(axis=1)


def _empty_row(info: RunInfo, index: int, module: str) -> dict:
    row: dict[str, object] = dict.fromkeys(COLUMNS, math.nan)
    row.update(scenario=info.run.scenario, method=info.run.method, seed=info.run.seed, layer=index, module=module,
               fedfac_rounds=0, error="", run=str(info.path))
    return row


def analyse_run(info: RunInfo, kappa: float, method: FAMethod) -> list[LayerResult]:
    """One LayerResult per analysed layer of a run with weights (an error row where it fails)."""
    # A damaged archive costs its run's rows an error, as NaN weights do, not the other runs' diagnostics.
    results = []
    path = info.path / WEIGHTS_FILE
    archive, reason = open_weights(path)
    with archive if archive is not None else contextlib.nullcontext():
        for index, module in info.layers.items():
            res = LayerResult(_empty_row(info, index, module))
            try:
                numbers, res.nu, res.curve = analyse_weights(layer_weights(archive, reason, path, index, module),
                                                             kappa, method)
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
