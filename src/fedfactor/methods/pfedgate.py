"""pFedGate (Chen, Yao, Gao, Ding and Li, ICML 2023): sparse personal adaptation of a shared model.

Every client holds a small personal gate (`fedfactor.reparam.gate`) that maps its input batch to a score
per block of the shared model's parameters; under a sparsity budget s only the best-scored blocks
are kept, scaled by their scores, the rest zeroed, and the client predicts with that gated model.
The shared model is aggregated as FedAvg (sample-weighted); the gate never leaves the client. A
baseline of FedDecomp's Table 1 (004), which gives no setting of its own.

More on how it is settled here: docs/methods/pfedgate.md
"""

from __future__ import annotations

from typing import Annotated, Any, cast

import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch import nn

from ..errors import UsageError
from ..fl.state import State, clone, select
from ..fl.train import Trainer, derive_seed, make_optimizer, mean_loss
from ..models import resolve_layers
from ..reparam.gate import GatedModel
from .base import METHODS, Count, Float, Method, Params as BaseParams, one_of, positive_or_none

GATE = "gate."  # the personal gate's entries
OPTIM_TAG = "pfedgate"  # a client's optimizer state between rounds: "optim.pfedgate.<parameter>.<entry>"
GATE_STREAM = 2**31 + 7  # derive_seed tag of the gate's initialisation


@METHODS.register("pfedgate", "pFedGate (Chen et al., ICML 2023): a personal gate scales and sparsifies the shared "
                  "model block-wise under a sparsity budget; FedAvg on the shared model (004 Table 1)")
class PFedGate(Method):
    recurrent_refused = ("its gate reads the raw input as image intensities (switchable normalisation, a Linear "
                         "over them), and token ids are category numbers")

    class Params(BaseParams):
        sparsity: Float = Field(0.5, gt=0, le=1)  # s, share kept (paper: 1, 0.5, 0.3; 0.5 the scripts' most common)
        split: Count = Field(5, ge=1)  # blocks per parameter tensor (the authors' scripts)
        gate_lr: int | float | None = None  # the gate's learning rate; null: the run's fl.lr
        clip: Float = Field(10.0, ge=0)  # max gradient norm of gate and model, each; 0: none (the code: 10)
        # official (the authors' code) | paper: budget, ranking, scaling (reparam/gate.py)
        style: Annotated[str, one_of("official", "paper")] = "official"
        keep_optimizer: bool = True  # each client's optimizer state carries over to its next round (the code)

        @field_validator("gate_lr", mode="before")
        @classmethod
        def _gate_lr(cls, value):
            return positive_or_none("gate_lr", value, "the run's fl.lr")

        @model_validator(mode="after")
        def _check(self):
            if self.style == "official" and self.split == 1 and self.sparsity < 1:
                # the floor is then s itself: the code's room round((s - floor) x entries) is 0 and, with
                # no always-kept first blocks, it drops every block
                raise UsageError(f"method.split 1 with method.sparsity {self.sparsity} < 1 drops every block in "
                                 "style official (the code's budget); use split >= 2 or style paper")
            return self

    hp: Params

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return GatedModel(model, self.hp.split, self.hp.sparsity, style=self.hp.style)

    def bind(self, ctx) -> None:
        # The gate's input layer is sized by the input, which only the context knows: entry names
        # stay those of the placeholder `prepare_model` built, so the trainer's keys still hold.
        ctx.model.build_gate(ctx.input_shape, derive_seed(ctx.seed, GATE_STREAM))
        super().bind(ctx)
        self.gate_init = clone({GATE + k: v for k, v in ctx.model.gate.state_dict().items()})

    def shared_keys(self) -> list[str]:
        return [k for k in super().shared_keys() if not k.startswith(GATE)]

    def analysed_layers(self) -> dict[int, str]:
        try:
            backbone = cast(GatedModel, self.ctx.model).backbone
            return {i: f"backbone.{n}" for i, n in resolve_layers(backbone, [-1]).items()}
        except UsageError:
            return {}

    @property
    def gate_lr(self) -> float:
        return float(self.ctx.optim.lr if self.hp.gate_lr is None else self.hp.gate_lr)

    # -- client side ------------------------------------------------------------------------------
    def init_client(self, k: int, init_state) -> State:
        # The run's initial state was taken before `bind`: its gate entries are the placeholder's.
        # Shared by every client, like the base's initial state, not copied K times.
        return {**super().init_client(k, init_state), **self.gate_init}

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        model = cast(GatedModel, self.ctx.model)  # prepare_model made it
        model.load_state_dict(select(state, self.model_keys))
        shared, gate = list(model.backbone.parameters()), list(model.gate.parameters())
        groups: list[dict[str, Any]] = [{"params": shared}, {"params": gate, "lr": self.gate_lr}]
        opt = make_optimizer(self.ctx.optim, groups)
        named = dict(model.named_parameters())
        if self.hp.keep_optimizer:
            Trainer.restore_optimizer(opt, OPTIM_TAG, named, state)
        model.train()

        def clip() -> None:
            nn.utils.clip_grad_norm_(gate, self.hp.clip)
            nn.utils.clip_grad_norm_(shared, self.hp.clip)

        # the gate's BatchNorm: ctx.batches leaves out a batch of one
        total, steps = self.descend(k, opt, lambda batch: F.cross_entropy(model(batch.x), batch.y),
                                    clip if self.hp.clip else None)
        if not steps:
            return dict(state), float("nan")
        mean = mean_loss(total, steps, self.ctx.max_loss)
        new = {**state, **clone(model.state_dict())}
        if self.hp.keep_optimizer:
            Trainer.save_optimizer(opt, OPTIM_TAG, named, new)
        return new, mean
