"""pFedGate's gated model (Chen et al., ICML 2023): a small gate rescales a shared model block by block.

Blocks follow the authors' `GatingLayer` (yxdyc/pFedGate, models/gating_layers.py): every parameter
tensor of the backbone, flattened in storage order, is cut into `split` contiguous blocks of
ceil(n / split) entries, the last one shorter (a tensor of fewer than `split` entries is cut into
single entries). Blocks of nn.Linear parameters form one group, all others (convolutions,
normalisation) another: each group is held to the budget on its own, since fully connected layers
dwarf the rest.

The gate maps an input batch to one score in (0, 1) per block: switchable normalisation of the
input, flatten, a linear layer, batch normalisation over the block scores, sigmoid, the mean over
the batch. `GatedModel.forward` scales every kept block of the backbone's parameters by its score,
zeroes the others, and runs the backbone on those weights (torch.func.functional_call), so
training, scoring and checkpoints see one ordinary module: `backbone.*` entries and `gate.*` ones.

Scores are floored at min(max(1/split, 0.1), s). Two styles, where the authors' code and the
paper's budget differ:
- official (the default; yxdyc/pFedGate, pFedGate/gated_learner.py, as every script runs it): blocks
  are ranked by their floored score rounded to tenths (the code's integer knapsack values; ties go
  to the earlier block, as numpy 1.19's sort leaves them for groups of up to 16 blocks), and each
  group's blocks other than the always-kept ones get round((s - floor) x their entries). A kept
  block is scaled by its raw score (the floor only ranks), and the gate learns through the keep
  mask as well, which the code builds as 1 + floored - floored.detach() (value 1, gradient
  straight through): a kept block's score above the floor gets (1 + score) times the plain
  product's gradient. At s = 1 nothing is dropped and every block is scaled by its raw score.
- paper: at most s of each group's entries kept (the always-kept ones included), blocks ranked by
  the floored score itself, kept blocks scaled by the floored score, no straight-through term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


def block_sizes(numel: int, split: int) -> list[int]:
    """Entries per block of a tensor of `numel` entries cut into `split` blocks (fewer if it is small)."""
    size = math.ceil(numel / min(split, numel))
    count = math.ceil(numel / size)
    return [size] * (count - 1) + [numel - (count - 1) * size]


@dataclass(frozen=True)
class Blocks:
    """The blocks of a backbone's parameters, in parameter order."""

    spans: dict[str, tuple[int, int, int]]  # parameter name -> (first block, number of blocks, block size)
    size: np.ndarray  # [L] entries per block
    linear: np.ndarray  # [L] the block belongs to an nn.Linear (budgeted apart from the others)
    always: np.ndarray  # [L] kept whatever its score: a tensor's first block, when tensors are split

    def __len__(self) -> int:
        return len(self.size)

    def expand(self, weights: torch.Tensor, name: str, shape: torch.Size) -> torch.Tensor:
        """A parameter's entry-wise multiplier: each of its blocks' weights repeated over the block."""
        start, count, size = self.spans[name]
        return weights[start:start + count].repeat_interleave(size)[:math.prod(shape)].view(shape)


def split_blocks(backbone: nn.Module, split: int) -> Blocks:
    spans: dict[str, tuple[int, int, int]] = {}
    sizes: list[int] = []
    linear: list[bool] = []
    always: list[bool] = []
    owners = {f"{m}.{p}" if m else p: isinstance(mod, nn.Linear)
              for m, mod in backbone.named_modules() for p, _ in mod.named_parameters(recurse=False)}
    for name, param in backbone.named_parameters():
        cut = block_sizes(param.numel(), split)
        spans[name] = (len(sizes), len(cut), cut[0])
        sizes += cut
        linear += [owners[name]] * len(cut)
        # The authors keep every tensor's first block so that no layer is cut off entirely.
        always += [split > 1] + [False] * (len(cut) - 1)
    return Blocks(spans, np.array(sizes, dtype=np.int64), np.array(linear), np.array(always))


def select_blocks(scores: np.ndarray, size: np.ndarray, group: np.ndarray, always: np.ndarray,
                  sparsity: float, floor: float | None = None) -> np.ndarray:
    """The 0-1 knapsack of the kept blocks, solved greedily as the authors' code does.

    Per group, the blocks in `always` are kept and the others are taken by descending score (ties
    by position) whenever they still fit in the group's room. The room is the paper's without
    `floor` (the kept blocks hold at most `sparsity` of the group's entries, the always-kept ones
    included), the code's with it: round((sparsity - floor) x the other blocks' entries), rounded
    half to even as torch.round. Returns the kept blocks as a boolean mask.
    """
    keep = always.copy()
    for g in np.unique(group):
        idx = np.flatnonzero(group == g)
        candidates = idx[~always[idx]]
        if floor is None:
            room = sparsity * size[idx].sum() - size[idx][always[idx]].sum()
        else:
            room = np.round((sparsity - floor) * size[candidates].sum())
        for j in candidates[np.argsort(-scores[candidates], kind="stable")]:
            if size[j] <= room:
                keep[j] = True
                room -= size[j]
    return keep


class SwitchNorm2d(nn.Module):
    """Switchable normalisation (Luo et al., ICLR 2019): a learned softmax mix of instance, layer
    and batch statistics; the gate's input normalisation in the authors' code (their copy of the
    reference implementation: unbiased instance variance, batch statistics averaged from it)."""

    running_mean: torch.Tensor  # buffers
    running_var: torch.Tensor

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.bias = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.mean_weight = nn.Parameter(torch.ones(3))  # instance, layer, batch
        self.var_weight = nn.Parameter(torch.ones(3))
        self.register_buffer("running_mean", torch.zeros(1, channels, 1))
        self.register_buffer("running_var", torch.zeros(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(*x.shape[:2], -1)
        mean_in, var_in = flat.mean(-1, keepdim=True), flat.var(-1, keepdim=True)
        second = var_in + mean_in ** 2
        mean_ln = mean_in.mean(1, keepdim=True)
        var_ln = second.mean(1, keepdim=True) - mean_ln ** 2
        if self.training:
            mean_bn = mean_in.mean(0, keepdim=True)
            var_bn = second.mean(0, keepdim=True) - mean_bn ** 2
            with torch.no_grad():
                self.running_mean.lerp_(mean_bn, self.momentum)
                self.running_var.lerp_(var_bn, self.momentum)
        else:
            mean_bn, var_bn = self.running_mean, self.running_var
        mw, vw = self.mean_weight.softmax(0), self.var_weight.softmax(0)
        mean = mw[0] * mean_in + mw[1] * mean_ln + mw[2] * mean_bn
        var = vw[0] * var_in + vw[1] * var_ln + vw[2] * var_bn
        return ((flat - mean) / (var + self.eps).sqrt()).view_as(x) * self.weight + self.bias


class Gate(nn.Sequential):
    """Input batch [B, C, H, W] -> a score in (0, 1) per block and sample, [B, L]."""

    def __init__(self, input_shape: tuple[int, ...], blocks: int):
        super().__init__(SwitchNorm2d(input_shape[0]), nn.Flatten(), nn.Linear(math.prod(input_shape), blocks),
                         nn.BatchNorm1d(blocks), nn.Sigmoid())


class GatedModel(nn.Module):
    """A backbone whose parameters a gate scales block-wise under a sparsity budget."""

    def __init__(self, backbone: nn.Module, split: int, sparsity: float, input_shape: tuple[int, ...] = (1, 1, 1),
                 style: str = "official"):
        super().__init__()
        if style not in ("official", "paper"):
            raise ValueError(f"style must be 'official' or 'paper' (got {style!r})")
        self.backbone = backbone
        self.blocks = split_blocks(backbone, split)
        self.sparsity = sparsity
        self.style = style
        # The authors' floor on the scores, min(max(1/split, 0.1), s): it ranks the blocks (and, in
        # the paper style, scales them) so that no kept block counts as nothing.
        self.min_score = min(max(1 / split, 0.1), sparsity)
        self.gate = Gate(input_shape, len(self.blocks))
        self.head_name = f"backbone.{getattr(backbone, 'head_name', 'head')}"
        self.projections = tuple(f"backbone.{p}" for p in getattr(backbone, "projections", ()))

    def build_gate(self, input_shape: tuple[int, ...], seed: int) -> None:
        """A fresh gate for inputs of `input_shape`, initialised from `seed`, on the backbone's device."""
        device = next(self.backbone.parameters()).device
        if device.type == "meta":
            with device:
                self.gate = Gate(input_shape, len(self.blocks))
            return
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.gate = Gate(input_shape, len(self.blocks)).to(device)

    def block_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Each block's multiplier for batch x: its score where kept, 0 elsewhere."""
        raw = self.gate(x).mean(0)
        floored = raw.clamp_min(self.min_score)
        b = self.blocks
        if self.style == "paper":
            if self.sparsity == 1:
                return floored
            kept = select_blocks(floored.detach().cpu().numpy(), b.size, b.linear, b.always, self.sparsity)
            return floored * torch.as_tensor(kept, dtype=raw.dtype, device=raw.device)
        if self.sparsity == 1:
            return raw
        # The code's knapsack values: floored scores in tenths (float64, rounded half to even).
        tenths = np.round(floored.detach().cpu().double().numpy() * 10)
        keep = torch.as_tensor(select_blocks(tenths, b.size, b.linear, b.always, self.sparsity, self.min_score),
                               dtype=raw.dtype, device=raw.device)
        # value raw x keep; the keep mask (value 1) passes the floored score's gradient straight through
        return raw * keep * (1 + floored - floored.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.block_weights(x)
        gated = {name: p * self.blocks.expand(weights, name, p.shape) for name, p in self.backbone.named_parameters()}
        return torch.func.functional_call(self.backbone, gated, (x,))
