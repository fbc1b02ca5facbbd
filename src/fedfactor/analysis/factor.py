"""Factor analysis of a layer's units across clients: which units are shared, which stay personal.

FedFac (paper 001, section 4.1) treats the d output units of a layer (conv channels, neurons) as d
variables observed over the clients' weights: Z stacks, for every unit j, the flattened weights of
unit j of the K clients one after another, so Z is (K * fan_in) x d (001 Figure 4). Then:

1. standardise the columns of Z; R = Z^T Z / n is their correlation matrix;
2. G = the smallest m whose cumulative eigenvalue share sum_{i<=m} gamma_i / sum gamma reaches kappa;
3. loadings A (d x G) by iterated principal-factor estimation (eq. 7 and the text after it): start
   from A = (sqrt(gamma_1) u_1, ..., sqrt(gamma_G) u_G) of R, then repeatedly put the communalities
   diag(A A^T) on the diagonal of R (R* = R - Sigma_eps) and take A from the top G eigenpairs of R*,
   until Sigma_eps changes by less than `tol`;
4. communality nu_j = sum_m A_jm^2, the share of unit j's variance the G common factors explain;
5. unit j is shared iff nu_j >= tau (`split`), tau being a quantile of nu, its mean, a value, or
   +-inf.

`method="eigen"` is the official code's cheaper variant (its `--direct_eigDecom`, used in every
script of ffair/FedFac): nu_j is the sum of squares of the first G unit-length eigenvectors of R at
row j, with no eigenvalue scaling and no iteration.

Everything runs in float64 torch on the device the weights are on, since dynamic FedFac runs it
every round on the training device. Edge cases, all documented and tested:
- non-finite weights (NaN, inf): ValueError; a split is never computed from them;
- fewer than 2 rows (K * fan_in < 2): ValueError, correlations are undefined;
- a constant column (a unit whose weights are identical everywhere) has no variance to explain: it
  is left out of the correlation matrix and gets communality 0 (reported in `constant`);
- fewer rows than columns, K = 1, a single unit: computed as above (R is then rank-deficient, which
  eigh handles); Heywood cases (a communality above 1) are clipped to [0, 1], during the
  iteration and in the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

FAMethod = Literal["principal", "eigen"]


@dataclass
class FactorResult:
    """One factor analysis of d units."""

    eigenvalues: torch.Tensor  # of R, descending (d - #constant values)
    n_factors: int  # G
    loadings: torch.Tensor  # d x G (rows of constant units are zero)
    communalities: torch.Tensor  # nu, length d
    constant: torch.Tensor  # bool, length d: units left out for having no variance
    iterations: int  # principal-factor iterations run (0 for method "eigen")
    converged: bool


def unit_matrix(weights: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Z, (K * fan_in) x d, from K clients' weights of one layer, each of shape (d, ...).

    Row block c holds client c's flattened weights of every unit (001 Figure 4: chi_j is the
    concatenation z_1j, ..., z_Kj).
    """
    w = weights if isinstance(weights, torch.Tensor) else torch.stack(list(weights))
    if w.dim() < 2:
        raise ValueError(f"weights must be K x d x ... (one client's layer per entry); got shape {tuple(w.shape)}")
    K, d = w.shape[0], w.shape[1]
    return w.reshape(K, d, -1).permute(0, 2, 1).reshape(-1, d)


def n_factors_for(eigenvalues: torch.Tensor, kappa: float) -> int:
    """G = min{m : sum_{i<=m} gamma_i / sum_i gamma_i >= kappa}, eigenvalues descending."""
    if not 0 < kappa <= 1:
        raise ValueError(f"kappa must be in (0, 1] (got {kappa})")
    share = eigenvalues.clamp_min(0).cumsum(0) / eigenvalues.clamp_min(0).sum()
    # A tiny tolerance: kappa = 1 must not need more factors than floating-point rounding allows.
    return int(torch.searchsorted(share, torch.tensor(kappa - 1e-12, dtype=share.dtype, device=share.device))) + 1


def _top(matrix: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The g largest eigenvalues (descending) and their eigenvectors of a symmetric matrix."""
    values, vectors = torch.linalg.eigh(matrix)
    return values.flip(0)[:g], vectors.flip(1)[:, :g]


def factor_analysis(z: torch.Tensor, kappa: float = 0.85, method: FAMethod = "principal",
                    n_factors: int | None = None, max_iter: int = 100, tol: float = 1e-4,
                    count: str = "paper") -> FactorResult:
    """Factor analysis of the columns of z (n rows, d columns): see the module docstring.

    kappa picks G from the eigenvalues of R unless n_factors is given: `count="paper"` is the
    definition above; "official" is FedFac's code (ffair/FedFac), whose loop stops counting at the
    eigenvalue that reaches kappa, one factor fewer, and may give G = 0 (no factor: every
    communality 0). max_iter=0 returns the starting loadings (principal components scaled by
    sqrt(eigenvalue)).
    """
    if count not in ("paper", "official"):
        raise ValueError(f"count must be 'paper' or 'official' (got {count!r})")
    if method not in ("principal", "eigen"):
        raise ValueError(f"method must be 'principal' or 'eigen' (got {method!r})")
    if z.dim() != 2:
        raise ValueError(f"z must be a matrix (rows x units); got shape {tuple(z.shape)}")
    n, d = z.shape
    if n < 2 or d < 1:
        raise ValueError(f"factor analysis needs at least 2 rows and 1 unit (got {n} x {d})")
    z = z.to(torch.float64)
    if not torch.isfinite(z).all():
        raise ValueError("the weights hold NaN or infinite values; no split can be computed from them")
    z = z - z.mean(0)
    std = z.pow(2).mean(0).sqrt()  # population std, as sklearn's preprocessing.scale
    constant = std <= 1e-12 * z.abs().amax(0).clamp_min(1.0)
    keep = ~constant
    loadings = z.new_zeros(d, 0)
    communalities = z.new_zeros(d)
    eigenvalues = z.new_zeros(0)
    if not keep.any():
        return FactorResult(eigenvalues, 0, loadings, communalities, constant, 0, True)
    zs = z[:, keep] / std[keep]
    r = zs.T @ zs / n
    r = (r + r.T) / 2
    eigenvalues = torch.linalg.eigvalsh(r).flip(0)
    g = n_factors if n_factors is not None else n_factors_for(eigenvalues, kappa) - (count == "official")
    if g == 0 and n_factors is None:  # the official count found no factor
        return FactorResult(eigenvalues, 0, loadings.new_zeros(d, 0), communalities, constant, 0, True)
    g = max(1, min(int(g), int(keep.sum())))
    values, vectors = _top(r, g)
    iterations, converged = 0, True
    if method == "eigen":
        a = vectors
    else:
        a = vectors * values.clamp_min(0).sqrt()
        h = a.pow(2).sum(1)
        converged = max_iter == 0
        for iterations in range(1, max_iter + 1):
            reduced = r.clone()
            reduced.diagonal().copy_(h.clamp(0, 1))
            values, vectors = _top(reduced, g)
            a = vectors * values.clamp_min(0).sqrt()
            h_new = a.pow(2).sum(1)
            # Sigma_eps = 1 - h on the diagonal: its change is the communalities' change.
            change = float((h_new - h).abs().max())
            h = h_new
            if change < tol:
                converged = True
                break
    full = z.new_zeros(d, g)
    full[keep] = a
    # A Heywood case (a loading row longer than 1) would claim more than all of a unit's variance.
    communalities = full.pow(2).sum(1).clamp(0, 1)
    if not torch.isfinite(communalities).all():
        raise ValueError("factor analysis produced non-finite communalities")
    return FactorResult(eigenvalues, g, full, communalities, constant, iterations, converged)


Threshold = str | float


def parse_tau(tau: Threshold) -> Threshold:
    """A threshold as given in a config: "mean", "q<p>" or "<p>%" (a quantile), "inf", "-inf", a number.

    Returns "mean", ("q", p) as "q<p>", or a float; raises ValueError naming the forms otherwise.
    """
    if isinstance(tau, bool):
        raise ValueError("tau must be mean, a quantile such as 50% or q50, inf, -inf or a number (got a boolean)")
    if isinstance(tau, (int, float)):
        if math.isnan(float(tau)):
            raise ValueError("tau must not be NaN")
        return float(tau)
    text = str(tau).strip().lower()
    if text == "mean":
        return "mean"
    if text in ("inf", "+inf", "-inf"):
        return float(text)
    quantile = text[1:] if text.startswith("q") else text[:-1] if text.endswith("%") else None
    try:
        if quantile is not None:
            p = float(quantile)
            if not 0 <= p <= 100:
                raise ValueError
            return f"q{p:g}"
        return parse_tau(float(text))
    except ValueError:
        raise ValueError(f"tau must be mean, a quantile such as 50% or q50 (0-100), inf, -inf or a number "
                         f"(got {tau!r})") from None


def threshold_value(nu: torch.Tensor, tau: Threshold) -> float:
    """The number tau stands for, given the communalities nu."""
    t = parse_tau(tau)
    if isinstance(t, float):
        return t
    nu = nu.to(torch.float64)
    if t == "mean":
        return float(nu.mean())
    # Linear interpolation between order statistics, as numpy.percentile (the official code).
    return float(torch.quantile(nu, float(t[1:]) / 100))


def split(nu: torch.Tensor, tau: Threshold = "mean") -> torch.Tensor:
    """Shared mask of the units: nu_j >= tau (a quantile, the mean, a value, +inf = all personal)."""
    return nu >= threshold_value(nu, tau)
