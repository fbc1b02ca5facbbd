"""Layer numbering shared by FedFac's Lambda, the factor-analysis diagnostics and the papers.

`weight_layers(model)` numbers the Conv2d, Linear and LSTM layers 1..L in the order the model
registers them (its forward order for every model here), the classifier last. Shortcut projections of a
ResNet (the 1x1 downsample convs) are not counted: FedFac's paper numbers ResNet-18 that way, so
its Lambda = {16, 17} are the two convs of the last residual block here too (the official code's
`--partial_cnn_layer 19+20`, which counts the three projections and the BatchNorms with their
conv). A model lists such modules by name in an attribute `projections`. A layer that computes its
weight from factors (Factorized-FL's u v^T + mu, FedPara's Hadamard products: nn.Reparameterized)
keeps the number of the Conv2d/Linear it replaced; FedDecomp's low-rank layers are Conv2d/Linear.

`unit_entries(model, name)` are the state entries indexed by that layer's output units: its weight
and bias, and the BatchNorm that normalises its output (affine parameters and running statistics).

An LSTM layer (a single-layer, one-directional nn.LSTM: char_lstm has one per layer) has one unit
per hidden unit. Its entries weight_ih, weight_hh, bias_ih and bias_hh stack the four gates, so
hidden unit j owns their rows j, H + j, 2H + j and 3H + j: `unit_rows` turns a mask over the units
into a mask over such an entry's rows.

`effective_weight(model, name, state)` is the weight that layer computes from a client's state, in
the plain layer's shape (rows: output units), whatever its parameterisation; an LSTM's has one row per
hidden unit (its rows of weight_ih and weight_hh, gate by gate). `layer_entries` are the entries it reads.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..errors import UsageError
from ..reparam.factorized import Reparameterized
from ..reparam.lowrank import LowRankConv2d, LowRankLinear


def weight_layers(model: nn.Module) -> dict[int, str]:
    """{1-based index: module name} of the Conv2d/Linear/LSTM layers, projections excluded."""
    skip = set(getattr(model, "projections", ()))
    names = [n for n, m in model.named_modules() if _is_weight_layer(m) and n not in skip]
    return {i: n for i, n in enumerate(names, start=1)}


def _is_weight_layer(m: nn.Module) -> bool:
    return isinstance(m, (nn.Conv2d, nn.Linear, nn.LSTM, Reparameterized))


def recurrent_layer(model: nn.Module) -> str | None:
    """The name of the model's first recurrent layer (char_lstm's LSTMs), or None: such a model cannot
    be batched by vmap, nor taken by the methods that declare `recurrent_refused`."""
    return next((n for n, m in model.named_modules() if isinstance(m, nn.RNNBase)), None)


def _lstm(layer: nn.Module, name: str) -> nn.LSTM | None:
    """The layer if it is an LSTM with units of its own (one layer, one direction), else None."""
    if not isinstance(layer, nn.LSTM):
        return None
    if layer.num_layers != 1 or layer.bidirectional or layer.proj_size:
        raise UsageError(f"layer {name} is an LSTM of {layer.num_layers} layer(s), bidirectional={layer.bidirectional}"
                         f", proj_size={layer.proj_size}: only a one-layer, one-directional LSTM without projection "
                         "has units here (build one nn.LSTM per layer)")
    return layer


def layer_units(model: nn.Module, name: str) -> int:
    """The number of output units of layer `name`: channels, features or an LSTM's hidden units."""
    layer = model.get_submodule(name)
    lstm = _lstm(layer, name)
    # a weight layer's weight is a tensor: a parameter, or computed from the factors (Reparameterized)
    return lstm.hidden_size if lstm is not None else int(cast(torch.Tensor, layer.weight).shape[0])


def unit_rows(mask: torch.Tensor, rows: int) -> torch.Tensor:
    """A boolean mask over a layer's units as a mask over the `rows` rows of one of its unit entries:
    itself, or for an LSTM's gate-stacked entries (4H rows, row g H + j is unit j's) repeated per gate."""
    return mask if rows == len(mask) else mask.repeat(rows // len(mask))


def resolve_layers(model: nn.Module, indices: list[int]) -> dict[int, str]:
    """Indices as a config gives them (1..L, or negative: -1 is the last layer before the head)."""
    layers = weight_layers(model)
    L = len(layers)
    if not L:
        raise UsageError("the model has no Conv2d or Linear layer (or LSTM) to number")
    out: dict[int, str] = {}
    for i in indices:
        j = i if i > 0 else L + i if i < 0 else 0  # -1 -> L-1: the layer before the classifier; 0 is none
        if not 1 <= j <= L or isinstance(i, bool):
            raise UsageError(f"layer index {i} is out of range: this model has layers 1..{L} "
                             f"(1 = {layers[1]}, {L} = {layers[L]}; -1 = layer {L - 1}, the last before the head)")
        out[j] = layers[j]
    return dict(sorted(out.items()))


def unit_entries(model: nn.Module, name: str) -> list[str]:
    """State keys whose first dimension is the layer's output units (weight, bias, its BatchNorm); an
    LSTM's four entries, whose first dimension is its units gate by gate (`unit_rows`)."""
    modules = dict(model.named_modules())
    layer = modules[name]
    if isinstance(layer, Reparameterized):  # its u, v, mu (or x, y, t) are not indexed by output units
        raise UsageError(f"layer {name} computes its weight from factors: it has no entries per output unit")
    keys = [f"{name}.{k}" for k, _ in layer.named_parameters(recurse=False)]
    units = layer_units(model, name)
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
    (a plain layer: its weight alone; an LSTM: weight_ih and weight_hh, without its two biases)."""
    layer = model.get_submodule(name)
    if _lstm(layer, name) is not None:
        return [f"{name}.{k}" for k in layer.state_dict() if k.startswith("weight_")]
    return [f"{name}.{k}" for k in layer.state_dict() if k != "bias"]


class _Weight(nn.Module):
    """Returns its layer's effective weight: run through functional_call, it reads a given state's entries."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self) -> torch.Tensor:
        if isinstance(self.layer, nn.LSTM):
            # nn.LSTM registers its parameters by name at run time: torch does not type them
            return lstm_unit_weights(cast(torch.Tensor, self.layer.weight_ih_l0),
                                     cast(torch.Tensor, self.layer.weight_hh_l0))
        w = cast(torch.Tensor, self.layer.weight)  # plain; computed from the factors for a Reparameterized layer
        if isinstance(self.layer, (LowRankConv2d, LowRankLinear)):
            w = w + self.layer.tau()  # FedDecomp: sigma (the layer's weight) + tau
        return w


def lstm_unit_weights(weight_ih: torch.Tensor, weight_hh: torch.Tensor) -> torch.Tensor:
    """An LSTM layer's weights, H x 4 (I + H): row j holds hidden unit j's input and recurrent weights
    of the input, forget, cell and output gates in turn (PyTorch stacks the gates as row blocks)."""
    H = weight_hh.shape[1]
    return torch.cat([weight_ih, weight_hh], dim=1).view(4, H, -1).transpose(0, 1).reshape(H, -1)


def effective_weight(model: nn.Module, name: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weight layer `name` of `model` computes from `state`'s entries (`layer_entries`), in the
    plain layer's shape (O x I or O x I x k x k; an LSTM's H x 4 (I + H), `lstm_unit_weights`): the
    weight itself, sigma + tau (low-rank), W_1 o (W_2 + 1) (Hadamard), the LSTM's two weights side by
    side, or pi(u v^T + mu) with mu as trained, i.e. not pruned at the threshold that
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
