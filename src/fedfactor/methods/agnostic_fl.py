"""Agnostic-FL (Mohri, Sivek & Suresh, ICML 2019; a baseline of 003): one model for the worst mixture.

Clients upload the model and their loss L_k of it; the server averages the uploads weighted by lambda
and raises lambda by projected ascent on the losses. Choices the paper leaves open: docs/methods/agnostic_fl.md
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from pydantic import Field

from ..analysis.mixture import ascend, entropy
from ..errors import UsageError
from ..fl.state import State, select
from .base import METHODS, Context, Float, Method, Params as BaseParams

LOSS = "agnostic.loss"  # the client's L_k: its train loss under the model it received this round


@METHODS.register("agnostic_fl", "Agnostic-FL (Mohri, Sivek & Suresh, ICML 2019): one model for the worst mixture "
                  "of clients, uploads weighted by lambda, lambda raised by projected ascent on client losses")
class AgnosticFL(Method):
    class Params(BaseParams):
        gamma_lambda: Float = Field(0.01, ge=0)  # ascent step on lambda (fair_flearn run.sh, FLGo)
        lambda_min: Float = Field(0.0, ge=0, le=1)  # floor on every lambda_k; 0: the whole simplex

    hp: AgnosticFL.Params

    def bind(self, ctx: Context) -> None:
        super().bind(ctx)
        if self.hp.lambda_min * ctx.num_clients > 1 + 1e-12:
            raise UsageError(f"method.lambda_min={self.hp.lambda_min:g} leaves no weights summing to 1 over "
                             f"{ctx.num_clients} clients; it must be at most 1/{ctx.num_clients}")

    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        K = self.ctx.num_clients  # lambda never travels: a plain CPU tensor, also in `fedfactor cost` (meta) runs
        return {**super().init_server(init_state), "lambda": torch.full((K,), 1.0 / K, dtype=torch.float64)}

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        sent = {k: u for k, u in uploads.items() if u}
        if not sent:
            return server
        lam = server["lambda"]  # the global model is the uploads' mean under lambda, not under sample counts
        shared = {k: select(u, self.shared) for k, u in sent.items()}
        new = super().aggregate(dict(server), shared, {k: float(lam[k]) for k in sent})
        losses = torch.stack([u[LOSS] for u in sent.values()])
        if losses.device.type != "meta":  # `fedfactor cost` has no losses to step on; sizes do not change
            reported = dict(zip(sent, losses.detach().cpu().to(torch.float64).tolist()))
            new["lambda"] = ascend(lam, reported, self.hp.gamma_lambda, self.hp.lambda_min)
            self.ctx.log("agnostic_lambda", new["lambda"])
            self.ctx.log("agnostic_lambda_entropy", entropy(new["lambda"]))
            self.ctx.log("agnostic_lambda_max", float(new["lambda"].max()))
            self.ctx.log("agnostic_losses", np.array([reported.get(k, np.nan) for k in range(len(lam))]))
        return new

    def init_client(self, k: int, init_state: Mapping[str, torch.Tensor]) -> State:
        nan = torch.full((), float("nan"), dtype=torch.float32, device=next(iter(init_state.values())).device)
        return {**super().init_client(k, init_state), LOSS: nan}

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        _, count, total = self.ctx.evaluate(k, state, "train")  # L_k of the received model, before training
        loss = torch.tensor(total / count if count else float("nan"), dtype=torch.float32, device=state[LOSS].device)
        trained, mean = super().local_train(k, state, received)
        return {**trained, LOSS: loss}, mean

    def upload(self, k: int, state: State) -> State:
        return {**select(state, self.shared), LOSS: state[LOSS]}
