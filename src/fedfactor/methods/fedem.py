"""FedEM (Marfoq, Neglia, Bellet, Kameni and Vidal, NeurIPS 2021): federated EM of a mixture.

Every client's data are a mixture of M shared components (`components`): client k predicts with
p_k(y|x) = sum_m pi_km p_m(y|x), its mixture weights pi_k personal. A round is an E-step (the
responsibilities q under the received components) and an M-step (pi_k the mean of q, each component
trained on its q-weighted loss); the server averages the components as FedAvg.

Choices the paper leaves open: docs/methods/fedem.md
"""

from __future__ import annotations

import copy
import math
from typing import Annotated, Callable, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..errors import UsageError
from ..fl.state import State, clone, select
from ..fl.train import make_optimizer, mean_loss
from ..models import HeadedModel
from .base import METHODS, Count, Method, Params as BaseParams, one_of

LOG_PI = "log_pi"  # the client's log mixture weights, a buffer of the Mixture
EM_TOL = 1e-6  # a new client's EM stops when no weight changes by more than this ...
EM_MAX_ITER = 1000  # ... or after this many iterations


class Mixture(nn.Module):
    """M component classifiers and the log weights of their mixture."""

    head_name = "head"
    log_pi: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, components: list[HeadedModel]):
        super().__init__()
        self.body = nn.ModuleList(c.body for c in components)
        self.head = nn.ModuleList(getattr(c, c.head_name) for c in components)
        m = len(components)
        self.register_buffer(LOG_PI, torch.full((m,), -math.log(m)))

    def forward(self, x: torch.Tensor, per_component: bool = False) -> torch.Tensor:
        """log of the mixture's class probabilities; per_component: every component's logits [M, B, C]."""
        logits = torch.stack([head(body(x)) for body, head in zip(self.body, self.head)])
        if per_component:
            return logits
        return torch.logsumexp(self.log_pi.view(-1, 1, 1) + logits.log_softmax(-1), dim=0)


def component_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy of every component, [B, M], from logits [M, B, C]."""
    m, b = logits.shape[:2]
    return F.cross_entropy(logits.flatten(0, 1), y.repeat(m), reduction="none").view(m, b).T


def responsibilities(log_pi: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """The E-step: q[i, m] = pi_m p_m(y_i|x_i) / sum_l pi_l p_l(y_i|x_i), from losses = -log p."""
    return torch.softmax(log_pi - losses, dim=1)


def fit_mixture_weights(losses: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """EM for the mixture weights alone, the components (their losses [N, M]) held fixed."""
    for _ in range(EM_MAX_ITER):
        new = responsibilities(pi.log(), losses).mean(0)
        if (new - pi).abs().max() <= EM_TOL:
            return new
        pi = new
    return pi


def _log(pi: torch.Tensor) -> torch.Tensor:
    # A weight can reach 0 by underflow; a floor keeps log_pi finite (and that component inert).
    return pi.clamp_min(torch.finfo(pi.dtype).tiny).log()


@METHODS.register("fedem", "FedEM (Marfoq et al., NeurIPS 2021): M shared components, personal mixture weights "
                  "learned by EM (001 Tables 2-3)")
class FedEM(Method):
    class Params(BaseParams):
        components: Count = Field(3, ge=1)  # M (001 5.1: "as suggested by the authors")
        # all | head: what of components 2..M is initialised afresh
        reinit: Annotated[str, one_of("all", "head")] = "all"

    hp: Params

    def prepare_model(self, model: nn.Module) -> nn.Module:
        if not isinstance(model, HeadedModel):
            raise UsageError(f"method fedem needs a model with a body and a head (got {type(model).__name__})")
        copies = [model]
        for _ in range(self.hp.components - 1):
            other = copy.deepcopy(model)
            fresh = other if self.hp.reinit == "all" else getattr(other, other.head_name)
            for module in fresh.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()  # type: ignore[operator]  # a method; mypy types it by Module.__getattr__
            copies.append(other)
        return Mixture(copies)

    def shared_keys(self) -> list[str]:
        return [key for key in super().shared_keys() if key != LOG_PI]

    def analysed_layers(self) -> dict[int, str]:
        return {}

    # -- client side ------------------------------------------------------------------------------
    def _losses(self, state: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Every component's per-sample loss under `state`, in eval mode, without gradients."""
        model = self.ctx.model
        model.eval()
        with torch.no_grad():
            logits = torch.func.functional_call(model, select(state, self.model_keys), (x,), {"per_component": True})
        return component_losses(logits, y)

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        model = self.ctx.model
        model.load_state_dict(select(state, self.model_keys))
        opt = make_optimizer(self.ctx.optim, model.parameters())
        log_pi = state[LOG_PI]
        q_sum, seen = torch.zeros_like(log_pi), 0

        def objective(batch):
            nonlocal seen
            q = responsibilities(log_pi, self._losses(state, batch.x, batch.y))  # E-step: round-start model
            q_sum.add_(q.sum(0))
            seen += len(batch.y)
            model.train()
            return (q * component_losses(model(batch.x, per_component=True), batch.y)).sum() / len(batch.y)

        total, steps = self.descend(k, opt, objective)
        if not steps:
            return dict(state), float("nan")
        mean = mean_loss(total, steps, self.ctx.max_loss)
        return {**state, **clone(model.state_dict()), LOG_PI: _log(q_sum / seen)}, mean

    # -- new clients (001 section 5.2: FedEM's LocalTrain-like rule) ---------------------------------
    def new_client_models(self, server: dict, k: int, fresh: State,
                          members: Callable[[], list[State]]) -> dict[str, State | list[State]]:
        models = super().new_client_models(server, k, fresh, members)
        received = cast(State, models["received"])  # the base's received model is one state
        batches = list(self.ctx.batches(k, epochs=1))
        if not batches:
            return {**models, "localtrain": received}
        losses = torch.cat([self._losses(received, b.x, b.y) for b in batches])
        pi = fit_mixture_weights(losses, received[LOG_PI].exp())
        return {**models, "localtrain": {**received, LOG_PI: _log(pi)}}
