"""pFedSD (Jin, Bai, Yao, Dai, Gu, Yu and Sun, IEEE TPDS 2023, "Personalized Edge Intelligence via
Federated Self-Knowledge Distillation").

FedAvg's rounds, with one change on the client: it trains the received global model on
cross-entropy plus a distillation term towards its own previous personalised model, the model it
trained in the last round it took part in:

    loss = CE(s, y) + lambda T^2 KL(softmax(t / T) || softmax(s / T))      (mean over the batch)

with s the student's logits (the model being trained) and t the teacher's (that previous model);
the KL is the usual distillation direction, teacher distribution first (F.kl_div of the student's
log-probabilities against the teacher's probabilities, as the authors' code computes it). A client
without a previous model (its first round) trains on cross-entropy alone. The teacher is kept in
the client's state under `pfedsd.teacher.<state key>`, never sent: uploads and downloads are
FedAvg's. What the client trained is its personalised model and the next round's teacher.

Choices, and how they are settled:
- T = 3 and lambda = 0.5: the values the framework of FedDecomp's authors (FLAIR-Community/Fling,
  flzoo/cifar10/cifar10_pfedsd_resnet_config.py and the CIFAR-100 config: `tau=3`, `lamda=0.5`) runs
  under FedDecomp's protocol, which states it uses each method's own hyperparameters (004 4.1). The
  authors' code (CGCL-codes/pFedSD, parameters.py) has argparse defaults KL_T = 1 and lamda = 1,
  which its README does not override.
- The teacher runs in training mode (`teacher_mode: train`), as in the authors' code and Fling,
  whose teacher is a copy of a model in training mode: BatchNorm normalises with the batch's own
  statistics and dropout is active; no gradient flows into it, and its kept running statistics are
  not moved (the forward pass updates copies). `teacher_mode: eval` scores it as at test time.
- The server averages as FedAvg (weighted by train size, BatchNorm statistics included). The
  authors' master averages the parameters uniformly over the round's clients and leaves buffers
  at their initial values; Fling averages all.
- What a client is scored with: its personalised model, the one it last trained, whatever
  `eval.model` picks (`evaluation_state`): the authors' code scores each client's last local model
  on its test set, and Fling scores pFedSD `before_aggregation`; scoring the received global model
  under FedDecomp's `eval.model: received` would score FedAvg's model instead. A client that never
  trained (no personalised model yet) is scored with what the protocol picked; new clients
  (`eval.new_clients`) have the strategies every method has.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from ..fl.state import State
from ..fl.train import Phase
from .base import Method
from . import METHODS

TEACHER = "pfedsd.teacher."  # prefix of the kept personalised model's entries in a client's state


def distillation(student: torch.Tensor, teacher: torch.Tensor, temperature: float, lam: float) -> torch.Tensor:
    """lam T^2 KL(softmax(teacher / T) || softmax(student / T)), averaged over the batch."""
    kl = F.kl_div(F.log_softmax(student / temperature, dim=1), F.log_softmax(teacher / temperature, dim=1),
                  reduction="batchmean", log_target=True)
    return lam * temperature**2 * kl


@METHODS.register("pfedsd", "pFedSD (Jin et al., IEEE TPDS 2023): FedAvg whose clients distil from their own "
                  "previous personalised model; each client is scored with the model it trained")
class PFedSD(Method):
    name = "pfedsd"
    defaults: dict[str, Any] = {
        "temperature": Field(3.0, gt=0),  # T (Fling's tau under FedDecomp's protocol)
        "lam": Field(0.5, ge=0),  # lambda, the distillation weight (Fling's lamda)
        "teacher_mode": "train",  # train (authors' code, Fling) | eval
    }
    CHOICES = {"teacher_mode": ("train", "eval")}

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.model_keys = list(ctx.model.state_dict())
        self.buffer_names = [key for key, _ in ctx.model.named_buffers()]

    def teacher(self, state: State) -> State | None:
        """The client's kept personalised model, as model entries; None before its first round."""
        if TEACHER + self.model_keys[0] not in state:
            return None
        return {key: state[TEACHER + key] for key in self.model_keys}

    def teacher_logits(self, teacher: State, x: torch.Tensor) -> torch.Tensor:
        model = self.ctx.model
        # BatchNorm in training mode updates running statistics in place: let it update copies.
        weights = {**teacher, **{key: teacher[key].clone() for key in self.buffer_names}}
        training = model.training
        model.train(self.hp.teacher_mode == "train")
        try:
            with torch.no_grad():
                return torch.func.functional_call(model, weights, (x,))
        finally:
            model.train(training)

    def plan(self, k: int, state: State, received: State) -> list[Phase]:
        teacher = self.teacher(state)
        if teacher is None:
            return [Phase(epochs=self.ctx.epochs)]
        T, lam = self.hp.temperature, self.hp.lam
        return [Phase(epochs=self.ctx.epochs,
                      loss=lambda params, batch, logits: distillation(logits, self.teacher_logits(teacher, batch.x),
                                                                      T, lam),
                      loss_name="distill")]

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        trained, loss = super().local_train(k, state, received)
        return {**trained, **{TEACHER + key: trained[key].clone() for key in self.model_keys}}, loss

    def evaluation_state(self, k: int, state: State) -> State:
        teacher = self.teacher(state)
        return state if teacher is None else {**state, **teacher}
