"""Layer numbering shared by FedFac's Lambda, the factor-analysis diagnostics and the papers.

`weight_layers(model)` numbers the Conv2d and Linear layers 1..L in the order the model registers
them (its forward order for every model here), the classifier last. Shortcut projections of a
ResNet (the 1x1 downsample convs) are not counted: FedFac's paper numbers ResNet-18 that way, so
its Lambda = {16, 17} are the two convs of the last residual block here too (the official code's
`--partial_cnn_layer 19+20`, which counts the three projections and the BatchNorms with their
conv). A model lists such modules by name in an attribute `projections`. A layer that computes its
weight from factors (Factorized-FL's u v^T + mu, FedPara's Hadamard products: nn.Reparameterized)
keeps the number of the Conv2d/Linear it replaced; FedDecomp's low-rank layers are Conv2d/Linear.

`unit_entries(model, name)` are the state entries indexed by that layer's output units: its weight
and bias, and the BatchNorm that normalises its output (affine parameters and running statistics).

`effective_weight(model, name, state)` is the weight that layer computes from a client's state, in
the plain layer's shape (rows: output units), whatever its parameterisation; `layer_entries` are the
entries it reads.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UsageError
from ..nn.factorized import Reparameterized
from ..nn.lowrank import LowRankConv2d, LowRankLinear


def weight_layers(model: nn.Module) -> dict[int, str]:
    """{1-based index: module name} of the Conv2d/Linear layers, projections excluded."""
    skip = set(getattr(model, "projections", ()))
    names = [n for n, m in model.named_modules() if _is_weight_layer(m) and n not in skip]
    return {i: n for i, n in enumerate(names, start=1)}


def _is_weight_layer(m: nn.Module) -> bool:
    return isinstance(m, (nn.Conv2d, nn.Linear, Reparameterized))


def resolve_layers(model: nn.Module, indices: list[int]) -> dict[int, str]:
    """Indices as a config gives them (1..L, or negative: -1 is the last layer before the head)."""
    layers = weight_layers(model)
    L = len(layers)
    if not L:
        raise UsageError("the model has no Conv2d or Linear layer to number")
    out: dict[int, str] = {}
    for i in indices:
        j = i if i > 0 else L + i if i < 0 else 0  # -1 -> L-1: the layer before the classifier; 0 is none
        if not 1 <= j <= L or isinstance(i, bool):
            raise UsageError(f"layer index {i} is out of range: this model has layers 1..{L} "
                             f"(1 = {layers[1]}, {L} = {layers[L]}; -1 = layer {L - 1}, the last before the head)")
        out[j] = layers[j]
    return dict(sorted(out.items()))


def unit_entries(model: nn.Module, name: str) -> list[str]:
    """State keys whose first dimension is the layer's output units (weight, bias, its BatchNorm)."""
    modules = dict(model.named_modules())
    layer = modules[name]
    if isinstance(layer, Reparameterized):  # its u, v, mu (or x, y, t) are not indexed by output units
        raise UsageError(f"layer {name} computes its weight from factors: it has no entries per output unit")
    keys = [f"{name}.{k}" for k, _ in layer.named_parameters(recurse=False)]
    units = layer.weight.shape[0]
    order = list(modules)
    for other in order[order.index(name) + 1:]:
        m = modules[other]
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.num_features == units:
            keys += [f"{other}.{k}" for k, t in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]
                     if t.dim() == 1]
            break
        if _is_weight_layer(m):  # the next layer comes first: this one has no BatchNorm of its own
            break
    return keys


def layer_entries(model: nn.Module, name: str) -> list[str]:
    """State keys of the layer's own tensors its effective weight is computed from: all but its bias
    (a plain layer: its weight alone)."""
    return [f"{name}.{k}" for k in model.get_submodule(name).state_dict() if k != "bias"]


class _Weight(nn.Module):
    """Returns its layer's effective weight: run through functional_call, it reads a given state's entries."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self) -> torch.Tensor:
        w = self.layer.weight  # plain; computed from the factors for a Reparameterized layer
        if isinstance(self.layer, (LowRankConv2d, LowRankLinear)):
            w = w + self.layer.tau()  # FedDecomp: sigma (the layer's weight) + tau
        return w


def effective_weight(model: nn.Module, name: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weight layer `name` of `model` computes from `state`'s entries (`layer_entries`), in the
    plain layer's shape (O x I or O x I x k x k): the weight itself, sigma + tau (low-rank), W_1 o
    (W_2 + 1) (Hadamard), or pi(u v^T + mu) with mu as trained, i.e. not pruned at the threshold that
    a Factorized layer applies when evaluated. The layer is asked itself (functional_call): no formula
    is repeated here. KeyError for an entry `state` lacks.
    """
    layer = model.get_submodule(name)
    prefix = len(name) + 1
    entries = {f"layer.{key[prefix:]}": state[key] for key in layer_entries(model, name)}
    was_training = layer.training
    layer.train()  # a Factorized layer prunes mu only in eval mode
    try:
        with torch.no_grad():
            return torch.func.functional_call(_Weight(layer), entries, ())
    finally:
        layer.train(was_training)
