"""FedRoD (Chen and Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for
Image Classification"), the linear variant: one body, two heads.

The body and the generic head are shared and train on the balanced softmax loss; the personal head
never leaves the client and learns CE(g.detach() + p, y) on top; a client predicts with g + p.

Choices the paper leaves open: docs/methods/fedrod.md
"""

from __future__ import annotations

import copy
from typing import Annotated, Callable, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from ..fl.state import State, clone, select
from ..fl.train import make_optimizer, train_loss
from ..models import HeadedModel
from .base import METHODS, Method, Params as BaseParams, one_of

PERSONAL = "phead"  # the personal head's module name: its state entries are phead.*


class TwoHeads(nn.Module):
    """The backbone's body with its classifier as the generic head and a personal head beside it."""

    head_name = "head"

    def __init__(self, model: HeadedModel):
        super().__init__()
        self.body = model.body
        self.head = getattr(model, model.head_name)
        self.phead = copy.deepcopy(self.head)
        # Layer numbers (weight_layers) are the backbone's: the personal head is not one of them.
        self.projections = (*getattr(model, "projections", ()), PERSONAL)

    def heads(self, x: torch.Tensor, detach_features: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(generic logits, personal logits); the personal head on detached features by default."""
        z = self.body(x)
        return self.head(z), self.phead(z.detach() if detach_features else z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, p = self.heads(x)
        return g + p


def class_log_prior(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """log of the label frequencies in y; -inf for a class y lacks."""
    counts = torch.bincount(y, minlength=num_classes).float()
    return (counts / counts.sum()).log()


def balanced_cross_entropy(logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """The balanced softmax loss: cross-entropy of the logits shifted by the log class prior."""
    return F.cross_entropy(logits + log_prior, y)


@METHODS.register("fedrod", "FedRoD (Chen and Chao, ICLR 2022): shared body and generic head trained on the "
                  "balanced softmax loss, a personal head on top; prediction adds both heads")
class FedRoD(Method):
    class Params(BaseParams):
        # generic: the body learns from the balanced loss only (PFLlib) | both (Fling)
        body_loss: Annotated[str, one_of("generic", "both")] = "generic"

    hp: Params

    def prepare_model(self, model: nn.Module) -> nn.Module:
        if not isinstance(model, HeadedModel):
            raise UsageError(f"method fedrod needs a model with a body and a head (got {type(model).__name__})")
        return TwoHeads(model)

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.personal = [key for key in self.model_keys if key.startswith(PERSONAL + ".")]

    def shared_keys(self) -> list[str]:
        return [key for key in super().shared_keys() if not key.startswith(PERSONAL + ".")]

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        model = cast(TwoHeads, self.ctx.model)  # prepare_model made it
        model.load_state_dict(select(state, self.model_keys))
        opt = make_optimizer(self.ctx.optim, model.parameters())
        log_prior = class_log_prior(self.ctx.split(k, "train").y, model.head.out_features)
        detach = self.hp.body_loss == "generic"
        model.train()
        # reported apart (docs/methods/fedrod.md); divergence is judged on their sum, which trains
        personal, generic = torch.zeros((), device=log_prior.device), torch.zeros((), device=log_prior.device)

        def objective(batch):
            g, p = model.heads(batch.x, detach_features=detach)
            balanced = balanced_cross_entropy(g, batch.y, log_prior)
            prediction = F.cross_entropy(g.detach() + p, batch.y)
            personal.add_(prediction.detach())
            generic.add_(balanced.detach())
            return balanced + prediction

        total, steps = self.descend(k, opt, objective)
        if not steps:
            return dict(state), float("nan")
        mean = train_loss(total, personal, {"balanced": generic}, steps, self.ctx.max_loss)
        return {**state, **clone(model.state_dict())}, mean

    def new_client_models(self, server: dict, k: int, fresh: State,
                          members: Callable[[], list[State]]) -> dict[str, State | list[State]]:
        models = super().new_client_models(server, k, fresh, members)
        received = cast(State, models["received"])  # the base's received model is one state
        generic = {**received, **{key: torch.zeros_like(received[key]) for key in self.personal}}
        return {**models, "generic": generic}
