"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020): FedAvg of a MAML objective.

The shared model w is trained to be a good starting point for one step of local gradient descent:
local meta-steps temp = w - alpha grad f(w; D), w <- w - beta grad f(temp; D') (first order; `hf`
adds the Hessian-vector term). A client is scored after one adaptation step on its own data.

Choices the paper leaves open: docs/methods/per_fedavg.md
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from ..fl.state import State
from ..fl.train import Batch, derive_seed, make_optimizer, mean_loss
from ..models.layers import recurrent_layer
from .base import METHODS, Count, Method, Params as BaseParams, one_of, positive_or_none, variant

ADAPTATION_STREAM = 2**31 + 4  # derive_seed tag of the adaptation batch's stream


@METHODS.register("per_fedavg", "Per-FedAvg (Fallah et al., NeurIPS 2020): MAML meta-steps locally, FedAvg "
                  "aggregation, scored after one adaptation step; first-order by default")
class PerFedAvg(Method):
    class Params(BaseParams):
        alpha: int | float | None = None  # inner (adaptation) step size; null: the run's fl.lr
        beta: int | float | None = None  # meta step size; null: the run's fl.lr
        # fo (first order) | hf (Hessian-free: exact Hessian-vector product)
        variant: Annotated[str, one_of("fo", "hf")] = "fo"
        steps: Count = Field(0, ge=0)  # meta-steps per round; 0: fl.epochs passes over the data

        @field_validator("alpha", "beta", mode="before")
        @classmethod
        def _step(cls, value, info):
            return positive_or_none(info.field_name, value, "the run's fl.lr")

    hp: Params

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.buffer_names = [key for key, _ in ctx.model.named_buffers()]
        # cuDNN's LSTM has no second derivative: the HF term runs a recurrent model on PyTorch's own kernels
        self.recurrent = recurrent_layer(ctx.model) is not None

    @property
    def alpha(self) -> float:
        return float(self.ctx.optim.lr if self.hp.alpha is None else self.hp.alpha)

    @property
    def beta(self) -> float:
        return float(self.ctx.optim.lr if self.hp.beta is None else self.hp.beta)

    # -- the objective, on the shared model through functional_call -------------------------------
    def _split(self, state: State) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Fresh leaf copies of the state's parameters (to differentiate) and of its buffers."""
        params = {key: state[key].detach().clone().requires_grad_() for key in self.ctx.param_keys}
        buffers = {key: state[key].detach().clone() for key in self.buffer_names}
        return params, buffers

    def _loss(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        logits = torch.func.functional_call(self.ctx.model, {**params, **buffers}, (batch.x,))
        return F.cross_entropy(logits, batch.y)

    def meta_step(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                  batches: Sequence[Batch], opt: torch.optim.Optimizer) -> torch.Tensor:
        """One meta-step on (D, D'[, D'']); sets the meta-gradient, steps `opt`, returns f(temp; D')."""
        weights = list(params.values())
        grads = torch.autograd.grad(self._loss(params, buffers, batches[0]), weights)
        temp = {key: (w - self.alpha * g).detach().requires_grad_() for (key, w), g in zip(params.items(), grads)}
        outer = self._loss(temp, buffers, batches[1])
        direction = torch.autograd.grad(outer, list(temp.values()))
        if self.hp.variant == "hf":
            with torch.backends.cudnn.flags(enabled=False) if self.recurrent else contextlib.nullcontext():
                inner = torch.autograd.grad(self._loss(params, buffers, batches[2]), weights, create_graph=True)
                hessian_v = torch.autograd.grad(inner, weights, grad_outputs=direction)
            direction = tuple(d - self.alpha * hv for d, hv in zip(direction, hessian_v))
        for w, d in zip(weights, direction):
            w.grad = d
        opt.step()
        return outer.detach()

    # -- client side ------------------------------------------------------------------------------
    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        per = 3 if self.hp.variant == "hf" else 2
        stream = (self.ctx.batches(k, steps=self.hp.steps * per) if self.hp.steps
                  else self.ctx.batches(k, epochs=self.ctx.epochs))
        params, buffers = self._split(state)
        opt = make_optimizer(self.ctx.optim, params.values(), lr=self.beta)
        self.ctx.model.train()
        device = next(iter(params.values())).device
        total, steps = torch.zeros((), device=device), 0
        group: list[Batch] = []
        for batch in stream:
            group.append(batch)
            if len(group) == per:
                total += self.meta_step(params, buffers, group, opt)
                steps += 1
                group = []
        if group:  # the last group, completed from a new pass so no sample of the round goes unused
            group += list(self.ctx.batches(k, steps=per - len(group)))
            if len(group) == per:
                total += self.meta_step(params, buffers, group, opt)
                steps += 1
        out = {**state, **{key: w.detach() for key, w in params.items()}, **buffers}
        return out, mean_loss(total, steps, self.ctx.max_loss)

    def _adaptation_batch(self, k: int) -> Batch | None:
        # A stream of its own per (seed, round, client): the same batch however often, and after
        # whatever else, the client is scored in a round (test and validation, new-client strategies).
        seed = derive_seed(self.ctx.seed, self.ctx.round, k, ADAPTATION_STREAM)
        # A train-mode step: with BatchNorm a batch of one cannot be used (ctx.batches skips it
        # only inside local_train), and the state is then scored unadapted.
        batch = next(self.ctx.batches(k, steps=1, seed=seed), None)
        return None if batch is None or (self.ctx.skip_single and len(batch.y) == 1) else batch

    def evaluation_state(self, k: int, state: State) -> State:
        """The state after one step of size alpha on one minibatch of client k's training data."""
        batch = self._adaptation_batch(k)
        if batch is None:
            return state
        params, buffers = self._split(state)
        self.ctx.model.train()
        with torch.enable_grad():
            grads = torch.autograd.grad(self._loss(params, buffers, batch), list(params.values()))
        adapted = {key: (w - self.alpha * g).detach() for (key, w), g in zip(params.items(), grads)}
        return {**state, **adapted, **buffers}


variant(PerFedAvg, "per_fedavg_hf",
        "Per-FedAvg (HF) (Fallah et al., NeurIPS 2020): meta-steps with the Hessian-vector product term",
        variant="hf")
