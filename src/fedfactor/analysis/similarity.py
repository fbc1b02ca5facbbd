"""Client-to-client similarity and the personalised mixing weights built from it.

Factorized-FL (000, eqs. 4-5) and SimFed (003, eqs. 3 and 8) give every client its own mixture of
the clients whose key vector (v^{L-1}, or an embedding of a shared random input) is most similar;
FedAMP (Huang et al., AAAI 2021) mixes all clients' models by an attention on their squared distances.
"""

from __future__ import annotations

from typing import Literal

import torch

Matching = Literal["similarity", "fedavg", "random", "worst"]
Weighting = Literal["paper", "official"]


def cosine_matrix(keys: torch.Tensor) -> torch.Tensor:
    """K x K cosine similarity of the rows of `keys` (K x d), in float64."""
    k = keys.reshape(len(keys), -1).to(torch.float64)
    k = k / k.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return k @ k.T


def mixing_weights(sim: torch.Tensor, matching: Matching = "similarity", weighting: Weighting = "paper",
                   tau: float = 0.0, epsilon: float = 1.0, minimum_aggr: int = 1, num_matched: int = 3,
                   sizes: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Row k: the weights client k's mixture gives every client (non-negative, summing to 1).

    `sim` is the similarity among the clients that can be mixed (n x n); a client's own score is
    taken as 1 (000, after eq. 5).
      similarity + paper:    clients scoring below tau are left out; the rest get
                             softmax(epsilon * sigma) (eqs. 4-5). Eq. 4 defines the matched set
                             as the scores >= tau; a left-out client's score "set to zero" would
                             still earn exp(0) under the softmax, so it is left out instead.
      similarity + official: the top max(#{sigma >= tau}, minimum_aggr) clients (self first)
                             with softmax(epsilon * sigma): the official code.
      random / worst:        self plus `num_matched` random / least similar others, softmax-weighted
                             (the matching baselines of 000 Figure 7 (g) and 003 Table 3).
      fedavg:                every client, weighted by `sizes` (Factorized-FedAvg: no matching).
    """
    n = len(sim)
    sigma = sim.clone().to(torch.float64)
    sigma.fill_diagonal_(1.0)
    if matching == "fedavg":
        w = torch.ones(n, dtype=torch.float64) if sizes is None else sizes.to(torch.float64)
        return (w / w.sum()).expand(n, n).clone()
    chosen = torch.zeros(n, n, dtype=torch.bool)
    for k in range(n):
        others = torch.tensor([j for j in range(n) if j != k], dtype=torch.long)
        if matching == "similarity" and weighting == "paper":
            chosen[k] = sigma[k] >= tau
        elif matching == "similarity":
            top = max(int((sigma[k] >= tau).sum()), minimum_aggr)
            order = torch.argsort(-sigma[k], stable=True)
            order = torch.cat([torch.tensor([k]), order[order != k]])  # self first among ties at 1
            chosen[k, order[:top]] = True
        elif matching in ("random", "worst"):
            m = min(num_matched, len(others))
            if matching == "random":
                picked = others[torch.randperm(len(others), generator=generator)[:m]]
            else:
                picked = others[torch.argsort(sigma[k, others], stable=True)[:m]]
            chosen[k, picked] = True
        else:
            raise ValueError(f"unknown matching {matching!r}")
        chosen[k, k] = True
    logits = torch.where(chosen, epsilon * sigma, torch.tensor(float("-inf"), dtype=torch.float64))
    return torch.softmax(logits, dim=1)


# FedAMP (Huang et al., AAAI 2021): attention over the clients' models by their squared distance

def squared_distances(models: list[dict[str, torch.Tensor]], keys: list[str]) -> torch.Tensor:
    """D[i, j] = ||w_i - w_j||^2 over `keys`, in float64, summed key by key (no flattened copies)."""
    device = models[0][keys[0]].device
    d = torch.zeros(len(models), len(models), dtype=torch.float64, device=device)
    for key in keys:
        x = torch.stack([m[key].reshape(-1) for m in models]).to(torch.float64)
        d += torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist") ** 2
    return d


def decayed(alpha: float, factor: float, every: int, rnd: int) -> float:
    """FedAMP's alpha_k of round rnd (from 1): alpha times `factor` once per `every` rounds (0: never)."""
    return alpha * factor ** ((max(rnd, 1) - 1) // every if every else 0)


def attention(distances: torch.Tensor, alpha: float, sigma: float) -> torch.Tensor:
    """xi_kj = alpha exp(-D_kj / sigma) / sigma off the diagonal; each row sums to 1 through xi_kk."""
    xi = alpha * torch.exp(-distances / sigma) / sigma
    xi.fill_diagonal_(0)
    return xi + torch.diag(1 - xi.sum(1))


def mix(models: list[dict[str, torch.Tensor]], weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """sum_j weights_j models_j key by key, in float64 (self weights far below 0 cancel large terms)."""
    out = {}
    for key, ref in models[0].items():
        stacked = torch.stack([m[key] for m in models]).to(torch.float64)
        out[key] = torch.tensordot(weights.to(stacked), stacked, dims=1).to(ref.dtype)
    return out
