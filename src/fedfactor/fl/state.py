"""Model and server state as plain dicts of tensors.

Keeping every piece of run state in dicts (not in module objects) lets one model object serve all
clients and lets a run be checkpointed by saving dicts.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import torch

State = dict[str, torch.Tensor]


def clone(state: Mapping[str, torch.Tensor]) -> State:
    return {k: v.detach().clone() for k, v in state.items()}


def select(state: Mapping[str, torch.Tensor], keys: Iterable[str]) -> State:
    return {k: state[k] for k in keys}


def latest(models: Mapping[str, State], init: State, k: int) -> State:
    """Client k's latest model on a server that keeps every client's (FedAMP, FedFomo); the initial
    model while k has never uploaded."""
    return models.get(str(k), init)


class WeightedSum:
    """sum_i w_i * state_i, key by key, built one state at a time; `mean()` divides by sum_i w_i.

    Accumulates in float64 so the mean of identical tensors is that tensor exactly and the result
    does not depend on the order of the states beyond float64 rounding. The sum is built in place
    (add_ promotes each float32 tensor as it goes) rather than by stacking: with many clients a
    stacked float64 copy of every state was the round's largest cost in time and memory, and a round
    that adds each upload as it arrives need not keep the uploads (BENCHMARKS.md, memory).
    """

    def __init__(self) -> None:
        self.totals: State = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.weight = 0.0
        self.count = 0

    def add(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        if weight < 0 or not math.isfinite(weight):
            raise ValueError(f"weights must be finite and non-negative (got {weight})")
        if self.count and state.keys() != self.totals.keys():
            raise ValueError("every state of a weighted sum needs the same entries")
        for key, t in state.items():
            if key not in self.totals:
                self.totals[key] = torch.zeros(t.shape, dtype=torch.float64, device=t.device)
                self.dtypes[key] = t.dtype
            if not t.is_meta:  # a dry run (`fedfactor cost`) needs shapes only; meta arithmetic is 0.3 ms a tensor
                self.totals[key].add_(t, alpha=weight)
        self.weight += weight
        self.count += 1

    def mean(self) -> State:
        if self.count == 0 or self.weight <= 0:
            raise ValueError("a weighted mean needs at least one state and a positive sum of weights")
        return {key: t.to(self.dtypes[key]) if t.is_meta else (t / self.weight).to(self.dtypes[key])
                for key, t in self.totals.items()}


def weighted_average(states: list[Mapping[str, torch.Tensor]], weights: Iterable[float]) -> State:
    """sum_i w_i * state_i / sum_i w_i, key by key (WeightedSum)."""
    weights = list(weights)
    if len(states) == 0 or len(weights) != len(states):
        raise ValueError("weighted_average needs one weight per state and at least one state")
    total = WeightedSum()
    for state, weight in zip(states, weights):
        total.add(state, float(weight))
    return total.mean()


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes on the wire for one tensor: element count x element size.

    A sparse tensor is sent as what it holds: its non-zero values plus their indices, in the dtypes
    torch keeps them in (COO: an int64 index per dimension per value; CSR/CSC: compressed and plain
    index arrays).
    """
    parts: tuple[torch.Tensor, ...]
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        parts = (t.values(), t.indices())
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (t.values(), t.crow_indices(), t.col_indices())
    elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = (t.values(), t.ccol_indices(), t.row_indices())
    else:
        parts = (t,)
    return sum(p.numel() * p.element_size() for p in parts)


def nbytes(payload: Mapping[str, torch.Tensor]) -> int:
    """Bytes on the wire, summed over every tensor sent."""
    return sum(tensor_bytes(t) for t in payload.values())


_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def pack_sparse(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A tensor as sent sparse: (bitmap of its non-zero entries, one bit each, as uint8; their values).

    Costs numel/8 bytes plus the values, so a sparse matrix costs little and a dense one at most
    1/32 more than sending it dense (torch's COO would add 8 bytes of index per dimension per value).
    """
    flat = t.reshape(-1)
    nonzero = flat != 0
    pad = (-flat.numel()) % 8
    bits = torch.cat([nonzero, nonzero.new_zeros(pad)]).view(-1, 8).to(torch.uint8)
    return (bits * _BITS.to(t.device)).sum(1, dtype=torch.uint8), flat[nonzero]


def unpack_sparse(bits: torch.Tensor, values: torch.Tensor, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """The dense tensor of `shape` that `pack_sparse` encoded; the entries not sent are zero."""
    n = 1
    for s in shape:
        n *= int(s)
    nonzero = ((bits.unsqueeze(1) & _BITS.to(bits.device)) != 0).reshape(-1)[:n]
    out = values.new_zeros(n)
    out[nonzero] = values
    return out.reshape(shape)
