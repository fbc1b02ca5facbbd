"""Rank-1 (or rank-gamma) factorized layers with a sparse bias: W = pi(u v^T + mu).

Factorized-FL (000, eqs. 2-3) and SimFed (003, eqs. 5-6) train every layer as factors u, v and a
bias matrix mu that starts at zero. The layer computes its `.weight` from them, so everything else
(BatchNorm, evaluation, `functional_call` with a state dict of u/v/mu) needs no special case.

Layouts of a convolution W in R^{O x I x F x F}:
    paper    u in R^{F*F}, v in R^{I*O}: u[p] scales kernel position p of every filter (000, eq. 3)
    official the official code's raw `(u @ v).view(O, I, F, F)` of the same (F*F) x (O*I) matrix,
             which does not tie u to kernel positions
    simfed   u in R^{I*F}, v in R^{O*F}: SimFed's axes (003, eq. 6), the ablation of 000 Figure 7 (k)
A fully connected W in R^{O x I} is (u v^T + mu)^T with u in R^I, v in R^O in every layout (eq. 2).

`Reparameterized` (a layer computing its weight from parameters) and `replace_layers` (the
in-place swap of every Conv2d/Linear) are the mechanism these layers share with the low-rank
Hadamard layers of FedPara (reparam/hadamard.py).
"""

from __future__ import annotations

from typing import Callable, Literal, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

Layout = Literal["paper", "official", "simfed"]
LAYOUTS = ("paper", "official", "simfed")
MU_INITS = ("zero", "official")
BIAS_INITS = ("layer", "official")


class ConvArgs(TypedDict):
    """The replaced convolution's arguments to F.conv2d besides its weight and bias."""

    stride: tuple[int, ...]
    padding: str | tuple[int, ...]
    dilation: tuple[int, ...]


class Reparameterized(nn.Module):
    """A Conv2d or Linear whose `.weight` a subclass computes from other parameters.

    Keeps what the replaced layer's forward needs (its convolution arguments, weight shape and
    bias) and runs F.conv2d / F.linear with the computed weight, so BatchNorm, evaluation and
    `functional_call` with a state dict of the factors need no special case.
    """

    conv: bool
    shape: tuple[int, ...]  # the replaced layer's weight shape: (O, I, k, k) or (O, I)
    bias: nn.Parameter | None
    conv_args: ConvArgs  # a convolution's only

    def __init__(self, layer: nn.Conv2d | nn.Linear):
        super().__init__()
        self.conv = isinstance(layer, nn.Conv2d)
        if isinstance(layer, nn.Conv2d):
            if layer.groups != 1 or layer.padding_mode != "zeros" or layer.kernel_size[0] != layer.kernel_size[1]:
                raise ValueError(f"only square, ungrouped, zero-padded convolutions can become {type(self).__name__} "
                                 "layers")
            self.conv_args = ConvArgs(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
            self.shape = (layer.out_channels, layer.in_channels, *layer.kernel_size)
        else:
            self.shape = (layer.out_features, layer.in_features)

    def _keep_bias(self, layer: nn.Conv2d | nn.Linear) -> None:
        """The replaced layer's bias, copied (called after the factors, which keeps their state-dict order)."""
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach().clone())

    @property
    def weight(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv:
            # F.conv2d takes a padding tuple and a padding mode in two overloads; one union matches neither
            return F.conv2d(x, self.weight, self.bias, **self.conv_args)  # type: ignore[arg-type]
        return F.linear(x, self.weight, self.bias)


def replace_layers(model: nn.Module, make: Callable[[nn.Conv2d | nn.Linear], nn.Module]) -> nn.Module:
    """Replace every Conv2d and Linear of `model` by make(layer), in place; returns the model.

    A bare Conv2d or Linear cannot be replaced in place: make(model) is returned instead.
    """
    if isinstance(model, (nn.Conv2d, nn.Linear)):
        return make(model)
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for name, m in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(m))
    return model


class Factorized(Reparameterized):
    """A Conv2d or Linear whose weight is rebuilt from u (rows x rank), v (cols x rank) and mu.

    `init`: "official" draws u and v Xavier-uniform (the official code); "scaled" then rescales both
    so that u v^T starts with the standard deviation of the replaced layer's own initial weight.
    `mu_init`: "zero" starts mu at zero (000, after eq. 2); "official" as the official code's layers:
    a fully connected layer's mu Xavier-uniform (so it starts full rank), a convolution's at zero.
    `bias_init`: "layer" keeps the replaced layer's bias; "official" redraws it Xavier-uniform as a
    1 x O matrix, as the official code's layers do (bound sqrt(6 / (1 + O))).
    `threshold`: entries of mu with |mu| < threshold count as zero when the layer is evaluated
    (the official code's pruning at evaluation; 0 keeps them). It is a plain attribute, not state.
    """

    def __init__(self, layer: nn.Conv2d | nn.Linear, layout: Layout = "paper", rank: int = 1,
                 use_mu: bool = True, threshold: float = 0.0, init: str = "official", mu_init: str = "zero",
                 bias_init: str = "layer"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        super().__init__(layer)
        self.layout, self.rank, self.threshold = layout, rank, threshold
        if self.conv:
            O, I, k, _ = self.shape
            rows, cols = (I * k, O * k) if layout == "simfed" else (k * k, O * I)
        else:
            O, I = self.shape
            rows, cols = I, O
        device, dtype = layer.weight.device, layer.weight.dtype
        self.u = nn.Parameter(torch.empty(rows, rank, device=device, dtype=dtype))
        self.v = nn.Parameter(torch.empty(cols, rank, device=device, dtype=dtype))
        # Xavier-uniform factors as in the official code; mu starts at zero (000, after eq. 2).
        nn.init.xavier_uniform_(self.u)
        nn.init.xavier_uniform_(self.v)
        if init == "scaled" and device.type != "meta":
            # Start at the weight scale of the layer replaced: without BatchNorm after it (cnn, mlp)
            # Xavier factors give a product ~10x smaller than PyTorch's init and the signal vanishes.
            with torch.no_grad():
                c = (layer.weight.std() / (self.u @ self.v.T).std()).sqrt()
                self.u.mul_(c)
                self.v.mul_(c)
        elif init != "official" and init != "scaled":
            raise ValueError(f"init must be official or scaled, got {init!r}")
        if mu_init not in MU_INITS or bias_init not in BIAS_INITS:
            raise ValueError(f"mu_init must be one of {MU_INITS} and bias_init one of {BIAS_INITS}, got "
                             f"{mu_init!r}, {bias_init!r}")
        self.mu = nn.Parameter(torch.zeros(rows, cols, device=device, dtype=dtype)) if use_mu else None
        if self.mu is not None and mu_init == "official" and not self.conv:
            nn.init.xavier_uniform_(self.mu)
        self._keep_bias(layer)
        if self.bias is not None and bias_init == "official":
            nn.init.xavier_uniform_(self.bias.data.unsqueeze(0))

    def matrix(self) -> torch.Tensor:
        """u v^T + mu, with mu pruned below the threshold when the layer is evaluated."""
        m = self.u @ self.v.T
        if self.mu is not None:
            mu: torch.Tensor = self.mu
            if not self.training and self.threshold > 0:
                mu = mu * (mu.abs() >= self.threshold)
            m = m + mu
        return m

    @property
    def weight(self) -> torch.Tensor:
        return to_weight(self.matrix(), self.shape, self.layout)

    def extra_repr(self) -> str:
        kind = "conv" if self.conv else "linear"
        return f"{kind} {tuple(self.shape)}, layout={self.layout}, rank={self.rank}, mu={self.mu is not None}"


def to_weight(m: torch.Tensor, shape: tuple[int, ...], layout: Layout) -> torch.Tensor:
    """The layer weight pi(m) for the factor matrix m (rows x cols) of a layout."""
    if len(shape) == 2:  # linear: m is I x O
        return m.T
    O, I, k, _ = shape
    if layout == "official":
        return m.reshape(O, I, k, k)
    if layout == "paper":  # m[p, o*I + i] -> W[o, i, p // k, p % k]
        return m.T.reshape(O, I, k, k)
    # simfed: m[i*k + p, o*k + q] -> W[o, i, p, q]
    return m.reshape(I, k, O, k).permute(2, 0, 1, 3)


def factorize(model: nn.Module, layout: Layout = "paper", rank: int = 1, use_mu: bool = True,
              threshold: float = 0.0, init: str = "official", mu_init: str = "zero",
              bias_init: str = "layer") -> nn.Module:
    """Replace every Conv2d and Linear of `model` by a Factorized layer, in place; returns the model.

    A transform, not a copy of each architecture: it applies to resnet9, cnn, mlp and later models.
    State-dict keys become <layer>.u, <layer>.v, <layer>.mu (and <layer>.bias where there was one).
    A bare Conv2d or Linear cannot be replaced in place: its Factorized layer is returned instead.
    """
    return replace_layers(model, lambda m: Factorized(m, layout, rank, use_mu, threshold, init, mu_init, bias_init))


def factorized_layers(model: nn.Module) -> dict[str, Factorized]:
    """Name -> Factorized layer, in the order of the model's modules (the forward order for the
    sequential backbones here)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Factorized)}
