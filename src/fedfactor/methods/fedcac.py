"""FedCAC (Wu, Liu, Niu, Zhu & Tang, ICCV 2023, "Bold but Cautious"; a baseline of 004 Table 1).

Cautiously aggressive collaboration: after local training a client marks its critical parameters
(the top `tau` fraction by sensitivity) and uploads its model and mask. It starts its next round
from the global (FedAvg) model for its other entries and, for its critical ones, from the mean of
the clients whose critical sets overlap its own above a bar that rises every round.

Choices the paper leaves open: docs/methods/fedcac.md
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
from pydantic import Field

from ..fl.state import State, clone, select, weighted_average
from .base import METHODS, Context, Count, Float, Method, Params as BaseParams

MASK = "cac.mask."  # client state and upload: a parameter's critical mask, bit-packed
SMALL = 1e-10  # a top-tau threshold at or below this means fewer than tau of the entries moved
TINY = 1e-20  # ... and the smallest sensitivity above this becomes the threshold


def critical_mask(before: torch.Tensor, after: torch.Tensor, tau: float) -> torch.Tensor:
    """The critical entries of one parameter tensor: the top tau by |(after - before) * after|."""
    c = ((after - before) * after).abs()
    flat = c.reshape(-1)
    top = int(tau * flat.numel())
    if top == 0:
        return torch.zeros_like(c, dtype=torch.bool)
    threshold = torch.topk(flat, top).values[-1]
    if threshold <= SMALL:
        moved = flat[flat > TINY]
        if moved.numel():
            threshold = moved.min()
    return c >= threshold


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A boolean tensor as sent: one bit per entry, as uint8 (numpy.packbits, little bit order)."""
    if mask.device.type == "meta":  # `fedfactor cost`: the size is all there is
        return torch.empty(math.ceil(mask.numel() / 8), dtype=torch.uint8, device="meta")
    bits = np.packbits(mask.reshape(-1).cpu().numpy(), bitorder="little")
    return torch.from_numpy(bits).to(mask.device)


def unpack_mask(bits: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    n = math.prod(shape)
    flat = np.unpackbits(bits.cpu().numpy(), count=n, bitorder="little").astype(bool)
    return torch.from_numpy(flat).reshape(shape).to(bits.device)


def overlaps(masks: list[dict[str, torch.Tensor]], keys: list[str]) -> torch.Tensor:
    """o_ij = 1 - ||m_i - m_j||_1 / (2 ||m_i||_1) over the concatenated masks; 0 where m_i is empty.

    From co-occurrence counts (||m_i - m_j||_1 = n_i + n_j - 2 <m_i, m_j>), key by key; sums of 0/1
    products are exact in float32 up to 2^24 entries per tensor.
    """
    shared = torch.zeros(len(masks), len(masks), dtype=torch.float64)
    for key in keys:
        m = torch.stack([mk[key].reshape(-1) for mk in masks])
        m = m.to(torch.float32 if m.shape[1] < 2**24 else torch.float64)
        shared += (m @ m.T).cpu().to(torch.float64)
    n = shared.diagonal()
    differ = n.unsqueeze(1) + n.unsqueeze(0) - 2 * shared
    return torch.where(n.unsqueeze(1) > 0, 1 - differ / (2 * n.unsqueeze(1)).clamp_min(1), torch.zeros_like(shared))


def collaborators(overlap: torch.Tensor, factor: float) -> tuple[torch.Tensor, float]:
    """(j collaborates with i: o_ij >= bar, i != j; the bar o_avg + factor (o_max - o_avg) over i != j)."""
    off = ~torch.eye(len(overlap), dtype=torch.bool)
    if not off.any():
        return torch.zeros_like(off), float("nan")
    avg, top = overlap[off].mean(), overlap[off].max()
    bar = avg + factor * (top - avg)
    return (overlap >= bar) & off, float(bar)


@METHODS.register("fedcac", "FedCAC (Wu et al., ICCV 2023): each client's sensitive (critical) parameters are "
                  "averaged only with clients whose critical sets overlap enough, the rest with all")
class FedCAC(Method):
    class Params(BaseParams):
        tau: Float = Field(0.5, ge=0, le=1)  # fraction of each tensor's entries that are critical
        beta: Count = Field(100, ge=1)  # rounds until critical parameters are shared only at the top overlap

    hp: FedCAC.Params

    def bind(self, ctx: Context) -> None:
        super().bind(ctx)
        self.keys = [k for k in self.shared if k in ctx.param_keys]
        self.shapes = {k: ctx.model.state_dict()[k].shape for k in self.keys}

    # -- server side -----------------------------------------------------------------------------
    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        return {"global": clone(select(init_state, self.keys)), "models": {}, "masks": {},
                "collaborators": torch.zeros(self.ctx.num_clients, self.ctx.num_clients, dtype=torch.bool)}

    def replaced_on_receive(self) -> set[str]:
        # every shared parameter, its critical entries from the client's customised model on the server
        return set(self.keys)

    def download(self, server: dict, k: int) -> State:
        """The global model, with client k's critical entries from its customised model."""
        glob = server["global"]
        if str(k) not in server["masks"] or next(iter(glob.values())).device.type == "meta":
            return dict(glob)
        group = [k, *torch.nonzero(server["collaborators"][k]).reshape(-1).tolist()]
        custom = weighted_average([server["models"][str(j)] for j in group], [1.0] * len(group))
        masks = server["masks"][str(k)]
        return {key: torch.where(unpack_mask(masks[key], self.shapes[key]), custom[key], glob[key])
                for key in self.keys}

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        sent = {k: u for k, u in uploads.items() if u}
        if not sent:
            return server
        models = {str(k): select(u, self.keys) for k, u in sent.items()}
        masks = {str(k): {key: u[MASK + key] for key in self.keys} for k, u in sent.items()}
        server = {**server, "models": {**server["models"], **models}, "masks": {**server["masks"], **masks},
                  "global": weighted_average(list(models.values()), [weights[k] for k in sent])}
        if next(iter(server["global"].values())).device.type == "meta":
            return server  # `fedfactor cost`: who collaborates never changes the size of what is sent
        # Every client with a mask, in a fixed order; the others collaborate with no one.
        known = sorted(int(j) for j in server["masks"])
        unpacked = [{key: unpack_mask(server["masks"][str(j)][key], self.shapes[key]) for key in self.keys}
                    for j in known]
        overlap = overlaps(unpacked, self.keys)
        among, bar = collaborators(overlap, self.ctx.round / self.hp.beta)
        K = self.ctx.num_clients
        full = torch.zeros(K, K, dtype=torch.bool)
        full[np.ix_(known, known)] = among
        server["collaborators"] = full
        matrix = torch.full((K, K), float("nan"), dtype=torch.float64)
        matrix[np.ix_(known, known)] = overlap
        self.ctx.log("cac_overlap", matrix)
        self.ctx.log("cac_bar", bar)
        self.ctx.log("cac_collaborators", float(among.sum(1).double().mean()))
        critical = sum(int(m[key].sum()) for m in unpacked for key in self.keys)
        entries = sum(math.prod(s) for s in self.shapes.values())
        self.ctx.log("cac_critical_fraction", critical / (len(known) * entries))
        return server

    # -- client side -----------------------------------------------------------------------------
    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        trained, loss = super().local_train(k, state, received)
        for key in self.keys:
            trained[MASK + key] = pack_mask(critical_mask(state[key], trained[key], self.hp.tau))
        return trained, loss

    def upload(self, k: int, state: State) -> State:
        masks = {}
        for key in self.keys:
            if MASK + key in state:
                masks[MASK + key] = state[MASK + key]
            else:  # a dry run (`fedfactor cost`) never trains: an empty mask of the same size
                masks[MASK + key] = pack_mask(torch.zeros_like(state[key], dtype=torch.bool))
        return {**select(state, self.keys), **masks}
