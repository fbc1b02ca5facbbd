"""pFedSD (Jin et al., IEEE TPDS 2023): personalized edge intelligence via federated self-knowledge distillation.

FedAvg's rounds; a client trains the received global model on cross-entropy plus
lambda T^2 KL(softmax(t / T) || softmax(s / T)) towards its own previous personalised model (the
teacher t), and is scored with the model it trained. Choices the paper leaves open: docs/methods/pfedsd.md
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field

from ..fl.state import State
from ..fl.train import Phase, run_with
from .base import METHODS, Float, Method, Params as BaseParams, one_of

TEACHER = "pfedsd.teacher."  # prefix of the kept personalised model's entries in a client's state


def distillation(student: torch.Tensor, teacher: torch.Tensor, temperature: float, lam: float) -> torch.Tensor:
    """lam T^2 KL(softmax(teacher / T) || softmax(student / T)), averaged over the batch."""
    kl = F.kl_div(F.log_softmax(student / temperature, dim=1), F.log_softmax(teacher / temperature, dim=1),
                  reduction="batchmean", log_target=True)
    return lam * temperature**2 * kl


@METHODS.register("pfedsd", "pFedSD (Jin et al., IEEE TPDS 2023): FedAvg whose clients distil from their own "
                  "previous personalised model; each client is scored with the model it trained")
class PFedSD(Method):
    class Params(BaseParams):
        temperature: Float = Field(3.0, gt=0)  # T (Fling's tau under FedDecomp's protocol)
        lam: Float = Field(0.5, ge=0)  # lambda, the distillation weight (Fling's lamda)
        teacher_mode: Annotated[str, one_of("train", "eval")] = "train"  # train: the authors' code (Fling)

    hp: Params

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.buffer_names = [key for key, _ in ctx.model.named_buffers()]

    def teacher(self, state: State) -> State | None:
        """The client's kept personalised model, as model entries; None before its first round."""
        kept = TEACHER + self.model_keys[0] in state
        return {key: state[TEACHER + key] for key in self.model_keys} if kept else None

    def teacher_logits(self, teacher: State, x: torch.Tensor) -> torch.Tensor:
        # BatchNorm in training mode updates running statistics in place: let it update copies.
        weights = {**teacher, **{key: teacher[key].clone() for key in self.buffer_names}}
        return run_with(self.ctx.model, weights, x, training=self.hp.teacher_mode == "train")

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
