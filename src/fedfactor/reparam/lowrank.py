"""Additive low-rank layers: W = sigma + tau with tau = B A of low rank (FedDecomp, 004 eqs. 2-4).

sigma is the layer's own `weight` (full rank; its key stays `<layer>.weight`, so pretrained weights,
FedAvg's state and the layer numbering of models/layers.py are unchanged); tau's factors are
`<layer>.tau_b` and `<layer>.tau_a`. B starts at zero, so tau starts at zero and a decomposed model
computes exactly what the plain model did until tau trains.

Two styles, each a complete choice of shapes, rank, initialisation and scale:

    paper     fully connected (eq. 3): B in R^{I x r}, A in R^{r x O}, tau = (B A)^T in the layer's
              O x I layout, r = floor(R_l min(I, O)).
              convolution (eq. 4): B in R^{(I K) x (r K)}, A in R^{(r K) x (O K)},
              r = floor(R_c min(I, O)); B A is reshaped to the kernel by
              [i K + p, o K + q] -> tau[o, i, p, q], so its rank bounds every K x K slice's mixing.
              A ~ N(0, 1 / cols(A)) ("A Gaussian"; the paper gives no scale: with rows of unit
              expected norm, a step on B moves tau like a step on the full weight restricted to A's
              row space, whatever the rank), no extra scale.
    official  XinghaoWu/FedDecomp (its loralib): convolution A in R^{(r K) x (I K)},
              B in R^{(O K) x (r K)}, r = floor(R_c O) (a share of the *output* channels),
              tau = (B A).view(O, I, K, K) / r; fully connected A in R^{r x I}, B in R^{O x r},
              tau = B A / r with r an absolute rank (its `Linear_r`, 40 by default, which may exceed
              min(I, O): a 10-class head then gets a full-rank tau). A kaiming-uniform (a = sqrt 5),
              B zero.

Every rank is at least 1. The layers subclass nn.Conv2d / nn.Linear, so code that looks for those
(layer numbering, initialisation loops) still finds them; only `forward` adds tau.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
from torch import nn

from .factorized import to_weight

Style = Literal["paper", "official"]
STYLES = ("paper", "official")


def rank_for(ratio: float, n: int) -> int:
    """floor(ratio * n), at least 1 (the epsilon keeps 0.6 * 10 at 6 despite float rounding)."""
    return max(1, math.floor(ratio * n + 1e-9))


class _LowRank:
    """What both layer kinds share: the factors, their initialisation and tau itself."""

    weight: torch.Tensor  # sigma: the nn.Conv2d's or nn.Linear's own, which the layer classes add
    tau_style: Style
    tau_rank: int
    tau_scale: float
    tau_b: nn.Parameter
    tau_a: nn.Parameter

    def _add_tau(self, b_shape: tuple[int, int], a_shape: tuple[int, int], style: Style, rank: int,
                 generator: torch.Generator | None) -> None:
        w = self.weight
        self.tau_style, self.tau_rank = style, rank
        self.tau_scale = 1.0 / rank if style == "official" else 1.0
        # Drawn on the CPU from its own generator: the global random stream (and with it every
        # later draw, dropout included) stays what it would be without the decomposition.
        a = torch.empty(a_shape, dtype=w.dtype)
        if style == "official":
            nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        else:
            nn.init.normal_(a, 0.0, 1.0 / math.sqrt(a_shape[1]), generator=generator)
        self.tau_a = nn.Parameter(a.to(w.device))
        self.tau_b = nn.Parameter(torch.zeros(b_shape, dtype=w.dtype, device=w.device))
        self._tau_cache: tuple[tuple[int, ...], torch.Tensor] | None = None  # see _forward_tau

    def tau(self, b: torch.Tensor | None = None, a: torch.Tensor | None = None) -> torch.Tensor:
        """tau in the weight's layout, from this layer's factors or from given ones (a state's)."""
        b = self.tau_b if b is None else b
        a = self.tau_a if a is None else a
        m = b @ a
        if self.tau_scale != 1.0:
            m = m * self.tau_scale
        shape = tuple(self.weight.shape)
        if len(shape) == 2:
            return m.T if self.tau_style == "paper" else m
        # paper: [i K + p, o K + q] -> [o, i, p, q] is the "simfed" layout of Factorized layers;
        # official: the raw view of an (O K) x (I K) matrix
        return to_weight(m, shape, "simfed" if self.tau_style == "paper" else "official")

    def _forward_tau(self) -> torch.Tensor:
        """tau for the forward pass, computed once while its factors are frozen.

        FedDecomp's sigma phase freezes tau for E_global epochs; rebuilding B A at every step costs
        as much as the convolution itself on small late feature maps. The product is reused while
        both factors are this layer's own frozen parameters and unchanged: an in-place write (a loaded
        state, an optimizer step) bumps a tensor's version. Factors passed by `functional_call`
        (evaluation, the batched path) are not the parameters and are always multiplied afresh.
        """
        b, a = self.tau_b, self.tau_a
        if b.requires_grad or a.requires_grad or not (isinstance(b, nn.Parameter) and isinstance(a, nn.Parameter)):
            self._tau_cache = None
            return self.tau()
        key = (b._version, a._version, b.data_ptr(), a.data_ptr())
        cache = self._tau_cache
        if cache is None or cache[0] != key:
            with torch.no_grad():
                cache = self._tau_cache = (key, self.tau())
        return cache[1]

    def extra_repr(self) -> str:
        # super() is the layer class after this mixin in the layer classes' MRO (nn.Conv2d, nn.Linear)
        return f"{super().extra_repr()}, tau rank={self.tau_rank} ({self.tau_style})"  # type: ignore[misc]


class LowRankConv2d(_LowRank, nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight + self._forward_tau(), self.bias)


class LowRankLinear(_LowRank, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight + self._forward_tau(), self.bias)


def decompose(model: nn.Module, conv_ratio: float, linear_ratio: float, linear_rank: int = 0,
              style: Style = "paper", generator: torch.Generator | None = None) -> nn.Module:
    """Give every Conv2d and Linear of `model` a low-rank tau, in place; returns the model.

    conv_ratio is R_c, linear_ratio R_l (0 < R <= 1); linear_rank > 0 sets the rank of every fully
    connected tau directly (the official `Linear_r`) instead of R_l. A bare layer is decomposed too.
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    for what, ratio in (("conv_ratio", conv_ratio), ("linear_ratio", linear_ratio)):
        if not 0 < ratio <= 1:
            raise ValueError(f"{what} must be in (0, 1], got {ratio}")
    targets = [m for m in model.modules() if type(m) in (nn.Conv2d, nn.Linear)]
    for m in targets:
        if isinstance(m, nn.Conv2d):
            if m.groups != 1 or m.kernel_size[0] != m.kernel_size[1]:
                raise ValueError("only square, ungrouped convolutions can be decomposed")
            O, I, K = m.out_channels, m.in_channels, m.kernel_size[0]
            if style == "paper":
                r = rank_for(conv_ratio, min(I, O))
                b_shape, a_shape = (I * K, r * K), (r * K, O * K)
            else:
                r = rank_for(conv_ratio, O)
                b_shape, a_shape = (O * K, r * K), (r * K, I * K)
            # Swapping the class keeps the layer's parameters, hooks and place in the model; a new
            # module would re-draw (and then discard) a weight from the global random stream.
            m.__class__ = LowRankConv2d
        else:
            assert isinstance(m, nn.Linear)  # targets are Conv2d and Linear layers only
            O, I = m.out_features, m.in_features
            r = linear_rank if linear_rank > 0 else rank_for(linear_ratio, min(I, O))
            b_shape, a_shape = ((I, r), (r, O)) if style == "paper" else ((O, r), (r, I))
            m.__class__ = LowRankLinear
        cast(_LowRank, m)._add_tau(b_shape, a_shape, style, r, generator)  # its class swapped above
    return model


def lowrank_layers(model: nn.Module) -> dict[str, _LowRank]:
    """Name -> decomposed layer, in the order of the model's modules."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _LowRank)}
