"""FedRoD (Chen and Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for
Image Classification"), the linear variant: one body, two heads.

The generic head `head` and the body are shared and averaged as in FedAvg; they train on the
balanced risk, the "balanced softmax" cross-entropy of the logits shifted by the log of the
client's class prior, CE(g + log pi_k, y), so that every client pursues the same class-balanced
objective whatever its label mix. The personal head `phead` never leaves the client; it learns the
client's own (empirical) risk on top of the generic prediction: CE(g.detach() + p, y). A client
predicts with g + p. Both losses are summed and taken in one step of the run's optimizer per
minibatch; their gradients do not mix (the personal loss sees the generic logits detached, and by
default the features detached too), so one optimizer takes exactly the two updates PFLlib takes
with two.

Choices the paper leaves open, and how they are settled:
- Which gradients the personal loss sends (`body_loss`). `generic` (default): the body and the
  generic head learn from the balanced loss only, the personal head from the personal loss only
  (features and generic logits detached), as TsingZ0/PFLlib's clientrod does. `both`: the personal
  loss also trains the body (features not detached; the generic logits still are), as Fling
  (FLAIR-Community/Fling, fedrod_resnet: `p = p_head(x) + g.detach()`, loss g_loss + p_loss in one
  optimizer), the framework of FedDecomp's authors, runs it for FedDecomp's comparison (004 Table 1).
  FL-bench's variant (personal logits alone, no generic term) is not offered.
- The class prior pi_k is the client's train-split label frequency (`ctx.split(k, "train").y`),
  BSM's sample_per_class up to a constant that the softmax cancels; a class the client lacks gets
  log 0 = -inf, so the balanced loss neither pushes nor pulls its generic logit (PFLlib and Fling
  do the same). FL-bench's exponent gamma on the counts is 1 here.
- The personal head starts as a copy of the generic head's initial weights (PFLlib and FL-bench
  deepcopy the classifier), so every client's starting model predicts with 2 g.
- One run optimizer (fl.optimizer, lr, momentum, weight decay) for every parameter, restarted each
  round; PFLlib gives the personal head a separate plain SGD at the same lr, which differs only when
  the run uses momentum or weight decay. Both losses are reported: train_loss is the personal one
  (the cross-entropy of the prediction g + p), train_balanced the balanced one.
- Why an own training loop rather than a Phase: a Phase's extra loss sees only the model's output
  (the two heads' sum), from which the generic logits cannot be recovered; recomputing them would
  run the body twice per step and move BatchNorm statistics twice.
- Under permuted labels (`ctx.head_local`: clients map classes to outputs differently) a shared
  generic head would mix unrelated classes, so it stays local like every method's classifier here;
  only the body is averaged, and the balanced head then serves as the client's class-balanced
  local head, no longer as a generic model.
- New clients (`eval.new_clients`): besides the strategies every method has, `generic` scores the
  received body and generic head alone (personal head zero): the paper's generic (G-FL) model.
- Factor diagnostics analyse the backbone's layer before the classifier: the personal head is kept
  out of the layer numbering.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from ..fl.state import State, clone, select
from ..fl.train import make_optimizer, train_loss
from ..models import HeadedModel
from .base import Method
from . import METHODS

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
    name = "fedrod"
    defaults: dict[str, Any] = {
        "body_loss": "generic",  # generic: the body learns from the balanced loss only (PFLlib) | both (Fling)
    }
    CHOICES = {"body_loss": ("generic", "both")}

    def prepare_model(self, model: nn.Module) -> nn.Module:
        if not isinstance(model, HeadedModel):
            raise UsageError(f"method fedrod needs a model with a body and a head (got {type(model).__name__})")
        return TwoHeads(model)

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.model_keys = list(ctx.model.state_dict())
        self.personal = [key for key in self.model_keys if key.startswith(PERSONAL + ".")]

    def shared_keys(self) -> list[str]:
        return [key for key in super().shared_keys() if not key.startswith(PERSONAL + ".")]

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        model = self.ctx.model
        model.load_state_dict(select(state, self.model_keys))
        opt = make_optimizer(self.ctx.optim, model.parameters())
        log_prior = class_log_prior(self.ctx.split(k, "train").y, model.head.out_features)
        detach = self.hp.body_loss == "generic"
        model.train()
        total, steps = torch.zeros((), device=log_prior.device), 0
        # reported apart (module docstring); divergence is judged on their sum, which trains
        personal, generic = torch.zeros_like(total), torch.zeros_like(total)
        for batch in self.ctx.batches(k, epochs=self.ctx.epochs):
            g, p = model.heads(batch.x, detach_features=detach)
            balanced = balanced_cross_entropy(g, batch.y, log_prior)
            prediction = F.cross_entropy(g.detach() + p, batch.y)
            loss = balanced + prediction
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
            personal += prediction.detach()
            generic += balanced.detach()
            steps += 1
        if not steps:
            return dict(state), float("nan")
        mean = train_loss(total, personal, {"balanced": generic}, steps, self.ctx.max_loss)
        return {**state, **clone(model.state_dict())}, mean

    def new_client_models(self, server: dict, k: int, fresh: State,
                          members: Callable[[], list[State]]) -> dict[str, State | list[State]]:
        models = super().new_client_models(server, k, fresh, members)
        received = models["received"]
        generic = {**received, **{key: torch.zeros_like(received[key]) for key in self.personal}}
        return {**models, "generic": generic}
