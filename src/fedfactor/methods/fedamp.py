"""FedAMP (Huang, Chu, Zhou, Wang, Liu, Pei & Zhang, AAAI 2021; a baseline of 004 Table 1).

Federated attentive message passing: every client trains its own model w_k with a proximal pull
towards its cloud model u_k = sum_j xi_kj w_j, an attention-weighted mix of all clients' latest
models (xi_kj = alpha_r A'(||w_k - w_j||^2) for j != k, xi_kk = 1 - sum of the others).

Choices the paper leaves open: docs/methods/fedamp.md
"""

from __future__ import annotations

import torch
from pydantic import Field

from ..fl.state import State, clone, select
from ..fl.train import Phase
from .base import METHODS, Count, Float, Method, Params
from .fedprox import proximal


def squared_distances(models: list[State], keys: list[str]) -> torch.Tensor:
    """D[i, j] = ||w_i - w_j||^2 over `keys`, in float64, summed key by key (no flattened copies)."""
    device = models[0][keys[0]].device
    d = torch.zeros(len(models), len(models), dtype=torch.float64, device=device)
    for key in keys:
        x = torch.stack([m[key].reshape(-1) for m in models]).to(torch.float64)
        d += torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist") ** 2
    return d


def attention(distances: torch.Tensor, alpha: float, sigma: float) -> torch.Tensor:
    """xi_kj = alpha exp(-D_kj / sigma) / sigma off the diagonal; each row sums to 1 through xi_kk."""
    xi = alpha * torch.exp(-distances / sigma) / sigma
    xi.fill_diagonal_(0)
    return xi + torch.diag(1 - xi.sum(1))


def mix(models: list[State], weights: torch.Tensor) -> State:
    """sum_j weights_j models_j key by key, in float64 (self weights far below 0 cancel large terms)."""
    out = {}
    for key, ref in models[0].items():
        stacked = torch.stack([m[key] for m in models]).to(torch.float64)
        out[key] = torch.tensordot(weights.to(stacked), stacked, dims=1).to(ref.dtype)
    return out


@METHODS.register("fedamp", "FedAMP (Huang et al., AAAI 2021): each client trains its own model with a proximal "
                  "pull towards a personalised cloud model, an attention-weighted mix of all clients' models")
class FedAMP(Method):
    name = "fedamp"

    class Params(Params):
        lam: Float = Field(1.0, ge=0)  # lambda: weight of the attention regulariser (Fling lamda)
        alpha: Float = Field(1e4, gt=0)  # alpha_k of round 1 (Fling alphaK)
        sigma: Float = Field(100.0, gt=0)  # scale of A(x) = 1 - exp(-x / sigma) (Fling sigma)
        alpha_decay: Float = Field(0.1, gt=0, le=1)  # alpha's factor at each decay (Fling decay_rate)
        alpha_decay_every: Count = Field(30, ge=0)  # rounds between decays; 0: never (Fling decay_frequency)

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.keys = [k for k in self.shared if k in ctx.param_keys]

    def alpha_k(self, rnd: int) -> float:
        """Round rnd's alpha: the same for its attention step and its proximal weight."""
        every = self.hp.alpha_decay_every
        decays = (max(rnd, 1) - 1) // every if every else 0
        return self.hp.alpha * self.hp.alpha_decay ** decays

    # -- server side -----------------------------------------------------------------------------
    def init_server(self, init_state):
        init = clone(select(init_state, self.keys))
        K = self.ctx.num_clients
        device = next(iter(init.values())).device
        return {"init": init, "models": {}, "distances": torch.zeros(K, K, dtype=torch.float64, device=device)}

    def latest(self, server: dict) -> list[State]:
        """Every client's latest upload; the initial model for one that never uploaded."""
        return [server["models"].get(str(j), server["init"]) for j in range(self.ctx.num_clients)]

    def download(self, server: dict, k: int) -> State:
        """Client k's cloud model u_k, with this round's alpha."""
        xi = attention(server["distances"], self.alpha_k(self.ctx.round), self.hp.sigma)[k]
        return mix(self.latest(server), xi)

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        models = {**server["models"], **{str(k): dict(u) for k, u in uploads.items() if u}}
        server = {**server, "models": models}
        server["distances"] = squared_distances(self.latest(server), self.keys)
        if server["distances"].device.type != "meta":
            # the attention the next round's downloads use
            xi = attention(server["distances"], self.alpha_k(self.ctx.round + 1), self.hp.sigma)
            self.ctx.log("amp_attention", xi)
            self.ctx.log("amp_self_weight_min", float(xi.diagonal().min()))
        return server

    # -- client side -----------------------------------------------------------------------------
    def receive(self, k: int, state: State, payload: State) -> State:
        return state  # u_k is only the proximal anchor: the client keeps training its own model

    def plan(self, k: int, state: State, received: State) -> list[Phase]:
        anchor = {key: t.detach() for key, t in received.items()}
        weight = self.hp.lam / (2 * self.alpha_k(self.ctx.round))
        return [Phase(epochs=self.ctx.epochs, loss=proximal(anchor, weight) if anchor and weight else None,
                      loss_name="proximal")]

    def upload(self, k: int, state: State) -> State:
        return select(state, self.keys)
