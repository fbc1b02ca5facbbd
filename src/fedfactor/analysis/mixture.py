"""Weights over clients that form a mixture: their projection onto the simplex and their entropy.

Agnostic-FL (Mohri, Sivek & Suresh, ICML 2019) raises the mixture lambda by projected ascent.
"""

from __future__ import annotations

import math

import torch


def project_simplex(v: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """The Euclidean projection of v onto {x : sum x = 1, x_k >= floor} (floor <= 1 / len(v)).

    Sort-based: with u = v - floor sorted in decreasing order and mass = 1 - K floor, the largest rho
    with u_rho > (sum_{i <= rho} u_i - mass) / rho fixes the shift theta; x = max(v - floor - theta, 0)
    + floor. In float64.
    """
    v = v.to(torch.float64)
    K = len(v)
    mass = 1.0 - K * floor
    if mass <= 1e-12:  # the floor leaves a single point
        return torch.full_like(v, 1.0 / K)
    u = torch.sort(v - floor, descending=True).values
    excess = torch.cumsum(u, 0) - mass
    rank = torch.arange(1, K + 1, dtype=torch.float64)
    rho = int(torch.nonzero(u - excess / rank > 0).max())  # the largest element always qualifies
    theta = excess[rho] / (rho + 1)
    return (v - floor - theta).clamp_min(0) + floor


def ascend(lam: torch.Tensor, losses: dict[int, float], step: float, floor: float = 0.0) -> torch.Tensor:
    """lambda raised by `step` times the reporting clients' losses, projected back onto the simplex.

    A client that did not report (or reported NaN: it has no train data) adds nothing.
    """
    gradient = torch.zeros_like(lam, dtype=torch.float64)
    for k, loss in losses.items():
        gradient[k] = 0.0 if math.isnan(loss) else loss
    return project_simplex(lam + step * gradient, floor)


def entropy(p: torch.Tensor) -> float:
    """Shannon entropy (nats); log K for uniform weights, 0 when one client holds all of it."""
    p = p[p > 0].to(torch.float64)
    return float(-(p * p.log()).sum())
