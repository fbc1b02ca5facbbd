"""Low-rank Hadamard-product layers: FedPara and pFedPara (Hyeon-Woo, Ye-Bin and Oh, ICLR 2022).

Two sets of low-rank factors j = 1, 2 each build a weight-shaped tensor W_j:
    fully connected (Proposition 1)  W_j = x_j y_j^T,  x_j in R^{O x r}, y_j in R^{I x r}
    convolution (Proposition 3)      W_j[o, i, p, q] = sum_{a, b} t_j[a, b, p, q] x_j[o, a] y_j[i, b],
                                     t_j in R^{r x r x k x k} (a Tucker core), x_j, y_j as above
and the layer's weight is their element-wise (Hadamard) product:
    FedPara   W = W_1 o W_2
    pFedPara  W = W_1 o (W_2 + 1) = W_1 o W_2 + W_1   (W_1 global, W_2 personal)
State-dict keys: <layer>.x1, .y1, .t1 (convolutions only), .x2, .y2, .t2, and .bias where the
replaced layer had one.

Rank, the rule of FedPara's section 3 as its code computes it (Flower's baselines/fedpara):
    r_min = ceil(sqrt(min(O, I)))  the smallest r with r^2 >= min(O, I): W_1 o W_2 can be full rank
    r_max = the largest r whose two factor sets hold no more weights than the layer,
            2 (r (O + I) + r^2 k^2) <= O I k^2 (no r^2 k^2 term for a fully connected layer)
    r(gamma) = ceil((1 - gamma) r_min + gamma r_max), at least 1, with gamma in [0, 1]
A thin layer (a 2-class head) can have r_max < r_min; the rule then interpolates downwards.
`gamma_for_share` picks the one gamma (for every layer) at which a model holds a target share of
its original parameter count, since Factorized-FL sizes pFedPara that way (002 C.2: 90-99 %).

Initialisation, from the authors' notebook (South-hw/FedPara_ICLR22; Flower's baseline draws the
same variances): He-normal with each factor's own fan, x ~ N(0, 2/O), y ~ N(0, 2/I),
t ~ N(0, 2/(r k^2)), for both sets (`init: fedpara`). Draws come from the global random stream, as
the layer replaces the original weight entirely. `init: scaled` then multiplies W_1's factors by one
common factor so that the layer's weight starts with the standard deviation of the replaced layer's
own initial weight: without BatchNorm (the cnn) the He-normal product starts up to ~3x larger per
layer than PyTorch's initialisation, and these errors multiply through the network.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .factorized import Reparameterized, replace_layers

INITS = ("fedpara", "scaled")


class Hadamard(Reparameterized):
    """A Conv2d or Linear whose weight is W_1 o W_2 (FedPara) or W_1 o (W_2 + 1) (pFedPara)."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, rank: int, personal: bool = True, init: str = "fedpara"):
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        super().__init__(layer)
        self.rank, self.personal = rank, personal
        O, I = self.shape[:2]
        like = dict(device=layer.weight.device, dtype=layer.weight.dtype)
        for j in (1, 2):
            self.register_parameter(f"x{j}", _normal((O, rank), 2 / O, like))
            self.register_parameter(f"y{j}", _normal((I, rank), 2 / I, like))
            core = None
            if self.conv:
                k = self.shape[2]
                core = _normal((rank, rank, k, k), 2 / (rank * k * k), like)
            self.register_parameter(f"t{j}", core)
        if init == "scaled" and layer.weight.device.type != "meta":
            with torch.no_grad():
                names = self.factor_names(1)
                c = (layer.weight.std() / self.weight.std()) ** (1 / len(names))  # W is linear in each factor
                for name in names:
                    getattr(self, name).mul_(c)
        self._keep_bias(layer)

    def factor_names(self, j: int) -> list[str]:
        """The parameter names of factor set j (1: global in pFedPara, 2: personal)."""
        return [f"{p}{j}" for p in ("x", "y", "t") if getattr(self, f"{p}{j}") is not None]

    def part(self, j: int) -> torch.Tensor:
        """W_j, in the weight's shape."""
        x, y, t = getattr(self, f"x{j}"), getattr(self, f"y{j}"), getattr(self, f"t{j}")
        if t is None:
            return x @ y.T
        return torch.einsum("abpq,oa,ib->oipq", t, x, y)

    @property
    def weight(self) -> torch.Tensor:
        w1, w2 = self.part(1), self.part(2)
        return w1 * (w2 + 1) if self.personal else w1 * w2

    def extra_repr(self) -> str:
        kind = "conv" if self.conv else "linear"
        form = "W1 o (W2 + 1)" if self.personal else "W1 o W2"
        return f"{kind} {tuple(self.shape)}, rank={self.rank}, {form}"


def _normal(shape: tuple[int, ...], variance: float, like: dict) -> nn.Parameter:
    p = nn.Parameter(torch.empty(shape, **like))
    nn.init.normal_(p, 0.0, math.sqrt(variance))
    return p


def set_size(shape: tuple[int, ...], rank):
    """Weights in one factor set of rank `rank` for a layer of weight shape `shape` (numpy-friendly)."""
    O, I = shape[:2]
    core = shape[2] * shape[3] if len(shape) == 4 else 0
    return rank * (O + I) + rank * rank * core


def rank_bounds(shape: tuple[int, ...]) -> tuple[int, int]:
    """(r_min, r_max) of a layer with weight shape (O, I) or (O, I, k, k)."""
    O, I = shape[:2]
    r_min = math.isqrt(min(O, I) - 1) + 1  # ceil(sqrt(n)) in integers
    n = math.prod(shape)
    core, side = (shape[2] * shape[3] if len(shape) == 4 else 0), O + I
    # the positive root of 2 (core r^2 + side r) = n, then exact integer steps around it
    r = int(n / (2 * side)) if core == 0 else int((-side + math.sqrt(side * side + 2 * core * n)) / (2 * core))
    while 2 * set_size(shape, r + 1) <= n:
        r += 1
    while r > 0 and 2 * set_size(shape, r) > n:
        r -= 1
    return r_min, r


def rank_for(shape: tuple[int, ...], gamma):
    """r(gamma) = ceil((1 - gamma) r_min + gamma r_max), at least 1; gamma may be a numpy array."""
    r_min, r_max = rank_bounds(shape)
    # the epsilon keeps an exact integer (gamma = 0 or 1) from rounding up through float error
    r = np.ceil((1 - np.asarray(gamma)) * r_min + np.asarray(gamma) * r_max - 1e-9)
    r = np.maximum(r, 1).astype(np.int64)
    return int(r) if r.ndim == 0 else r


def dense_layers(model: nn.Module) -> list[nn.Conv2d | nn.Linear]:
    return [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


def gamma_for_share(model: nn.Module, share: float, steps: int = 10_000) -> tuple[float, float]:
    """(gamma, the share it gives): the gamma whose model holds closest to `share` of the parameters
    of `model` (a plain model, before `hadamardize`), the smallest such gamma on a grid of `steps`.

    The share counts every parameter: the factors that replace each Conv2d/Linear weight and what
    is kept as it was (biases, BatchNorm). A share above the largest reachable one gets gamma = 1
    (every layer at r_max); one below the smallest reachable (gamma = 0) is an error.
    """
    layers = dense_layers(model)
    total = sum(p.numel() for p in model.parameters())
    kept = total - sum(m.weight.numel() for m in layers)
    gammas = np.linspace(0.0, 1.0, steps + 1)
    held = kept + sum(2 * set_size(tuple(m.weight.shape), rank_for(tuple(m.weight.shape), gammas)) for m in layers)
    shares = held / total
    if share < shares.min() - 1e-12:
        raise ValueError(f"a share of {share:g} is below the smallest this model can hold "
                         f"({shares.min():.4f})")
    best = int(np.argmin(np.abs(shares - share)))
    return float(gammas[best]), float(shares[best])


def hadamardize(model: nn.Module, gamma: float, personal: bool = True, init: str = "fedpara") -> nn.Module:
    """Replace every Conv2d and Linear of `model` by a Hadamard layer of rank r(gamma), in place.

    Returns the model; a bare Conv2d or Linear is returned as its Hadamard layer.
    """
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    return replace_layers(model, lambda m: Hadamard(m, rank_for(tuple(m.weight.shape), gamma), personal, init))


def hadamard_layers(model: nn.Module) -> dict[str, Hadamard]:
    """Name -> Hadamard layer, in the order of the model's modules."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Hadamard)}
