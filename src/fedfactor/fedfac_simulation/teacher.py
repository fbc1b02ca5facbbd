"""The simulation's data (paper 001, section 4.3.1): C clients drawn from a two-layer ReLU teacher.

The teacher's hidden units are partly shared by all clients (eq. 8), the rest client-specific; the
package docstring gives the distributions and the one departure (`data.label_threshold`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SimData:
    """One setting's clients: train/test tensors and the teacher."""

    x_train: torch.Tensor  # C x n_train x d
    y_train: torch.Tensor  # C x n_train, float 0/1
    x_test: torch.Tensor  # C x n_test x d
    y_test: torch.Tensor  # C x n_test
    weights: torch.Tensor  # C x m x d: W_c = (W_c^p, W^s), one row per hidden unit (fan-in d)
    a: torch.Tensor  # m, the teacher's output weights
    mu: torch.Tensor  # C x d1, the clients' means of x_p (and of w^pp)
    shared: torch.Tensor  # m, bool: the true mask (units m1..m-1)
    d1: int
    m1: int


def ar1_cholesky(d1: int) -> torch.Tensor:
    """Lower Cholesky factor of Sigma = (0.5^|i-j|), d1 x d1."""
    i = torch.arange(d1, dtype=torch.float64)
    return torch.linalg.cholesky(0.5 ** (i[:, None] - i[None, :]).abs())


def teacher_output(weights: torch.Tensor, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """h*_c(x) of eq. (8) for every client: C x n from weights C x m x d and x C x n x d."""
    return torch.relu(torch.bmm(x, weights.transpose(1, 2))) @ a


def generate(clients: int, d: int, m: int, p: float, alpha: float, n_train: int, n_test: int,
             noise: float = 1.0, label_threshold: str = "client_median",
             generator: torch.Generator | None = None) -> SimData:
    """Section 4.3.1's data: see the module docstring."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    d2, m2 = round(alpha * d), round(p * m)
    d1, m1 = d - d2, m - m2
    if not (1 <= d2 < d and 1 <= m2 < m):
        raise ValueError(f"p = {p}, alpha = {alpha} leave no shared or no personal covariates or units")
    C = clients
    mu = torch.randn(C, d1, generator=g, dtype=torch.float64)
    # shared teacher units (fixed for all clients) and output weights
    w_sp = torch.empty(m2, d1, dtype=torch.float64).uniform_(-0.1, 0.1, generator=g)
    w_ss = torch.empty(m2, d2, dtype=torch.float64).uniform_(-1, 1, generator=g)
    a = torch.randn(m, generator=g, dtype=torch.float64)
    # personal teacher units
    w_pp = mu[:, None, :] + torch.randn(C, m1, d1, generator=g, dtype=torch.float64)
    w_ps = torch.empty(C, m1, d2, dtype=torch.float64).uniform_(-0.1, 0.1, generator=g)
    weights = torch.cat([torch.cat([w_pp, w_ps], 2),
                         torch.cat([w_sp, w_ss], 1).expand(C, m2, d)], 1)
    n = n_train + n_test
    chol = ar1_cholesky(d1)
    x_p = mu[:, None, :] + torch.randn(C, n, d1, generator=g, dtype=torch.float64) @ chol.T
    x_s = torch.randn(C, n, d2, generator=g, dtype=torch.float64)
    x = torch.cat([x_p, x_s], 2)
    h = teacher_output(weights, a, x)
    y_star = h + noise * torch.randn(C, n, generator=g, dtype=torch.float64)
    if label_threshold == "client_median":
        t = h.median(1, keepdim=True).values
    elif label_threshold == "zero":
        t = torch.zeros(C, 1, dtype=torch.float64)
    else:
        raise ValueError(f"label_threshold must be 'client_median' or 'zero' (got {label_threshold!r})")
    y = (torch.sigmoid(y_star - t) > 0.5).float()
    shared = torch.arange(m) >= m1
    x = x.float()
    return SimData(x[:, :n_train], y[:, :n_train], x[:, n_train:], y[:, n_train:], weights.float(),
                   a.float(), mu.float(), shared, d1, m1)
