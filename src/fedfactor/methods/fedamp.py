"""FedAMP (Huang et al., AAAI 2021; a baseline of 004 Table 1): federated attentive message passing.

Each client trains its own model w_k with a proximal pull towards its cloud model u_k = sum_j xi_kj w_j,
an attention-weighted mix of all clients' latest models. Choices the paper leaves open: docs/methods/fedamp.md
"""

from __future__ import annotations

from typing import Mapping

import torch
from pydantic import Field

from ..analysis.similarity import attention, decayed, mix, squared_distances
from ..fl.state import State, clone, latest, select
from ..fl.train import Phase
from .base import METHODS, Context, Count, Float, Method, Params as BaseParams
from .fedprox import proximal_phase


@METHODS.register("fedamp", "FedAMP (Huang et al., AAAI 2021): each client trains its own model with a proximal "
                  "pull towards a personalised cloud model, an attention-weighted mix of all clients' models")
class FedAMP(Method):
    class Params(BaseParams):
        lam: Float = Field(1.0, ge=0)  # lambda: weight of the attention regulariser (Fling lamda)
        alpha: Float = Field(1e4, gt=0)  # alpha_k of round 1 (Fling alphaK)
        sigma: Float = Field(100.0, gt=0)  # scale of A(x) = 1 - exp(-x / sigma) (Fling sigma)
        alpha_decay: Float = Field(0.1, gt=0, le=1)  # alpha's factor at each decay (Fling decay_rate)
        alpha_decay_every: Count = Field(30, ge=0)  # rounds between decays; 0: never (Fling decay_frequency)

    hp: FedAMP.Params

    def bind(self, ctx: Context) -> None:
        super().bind(ctx)
        self.keys = [k for k in self.shared if k in ctx.param_keys]

    def alpha_k(self, rnd: int) -> float:
        """Round rnd's alpha: the same for its attention step and its proximal weight."""
        return decayed(self.hp.alpha, self.hp.alpha_decay, self.hp.alpha_decay_every, rnd)

    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        init, K = clone(select(init_state, self.keys)), self.ctx.num_clients
        device = next(iter(init.values())).device
        return {"init": init, "models": {}, "distances": torch.zeros(K, K, dtype=torch.float64, device=device)}

    def latest(self, server: dict) -> list[State]:
        return [latest(server["models"], server["init"], j) for j in range(self.ctx.num_clients)]

    def download(self, server: dict, k: int) -> State:
        """Client k's cloud model u_k, with this round's alpha."""
        xi = attention(server["distances"], self.alpha_k(self.ctx.round), self.hp.sigma)[k]
        return mix(self.latest(server), xi)

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        server = {**server, "models": {**server["models"], **{str(k): dict(u) for k, u in uploads.items() if u}}}
        server["distances"] = squared_distances(self.latest(server), self.keys)
        if server["distances"].device.type != "meta":  # the attention the next round's downloads use
            xi = attention(server["distances"], self.alpha_k(self.ctx.round + 1), self.hp.sigma)
            self.ctx.log("amp_attention", xi)
            self.ctx.log("amp_self_weight_min", float(xi.diagonal().min()))
        return server

    def receive(self, k: int, state: State, payload: State) -> State:
        return state  # u_k is only the proximal anchor: the client keeps training its own model

    def plan(self, k: int, state: State, received: State) -> list[Phase]:
        return [proximal_phase(received, self.hp.lam / (2 * self.alpha_k(self.ctx.round)), self.ctx.epochs)]

    def upload(self, k: int, state: State) -> State:
        return select(state, self.keys)
