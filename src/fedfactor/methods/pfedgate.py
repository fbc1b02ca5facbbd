"""pFedGate (Chen, Yao, Gao, Ding and Li, ICML 2023): sparse personal adaptation of a shared model.

Every client holds a small personal gate (`fedfactor.nn.gate`) that maps its input batch to a score
per block of the shared model's parameters; under a sparsity budget s only the best-scored blocks
are kept, scaled by their scores, the rest zeroed, and the client predicts with that gated model.
The shared model is aggregated as FedAvg (sample-weighted); the gate never leaves the client. A
baseline of FedDecomp's Table 1 (004), which gives no setting of its own.

Facts from the authors' code (yxdyc/pFedGate) the paper leaves open, and how they are settled:
- Blocks: each parameter tensor cut into `split` contiguous blocks; `split: 5`, the value of all
  the authors' published scripts (the argparse default 1 makes a block a whole tensor).
- The gate: switchable normalisation of the raw input (the gate's own; the model's input is not
  normalised, `person_input_norm=0`), flatten, Linear(C*H*W -> blocks), BatchNorm1d, sigmoid, mean
  over the batch: one set of block scores per batch (the code's sample-level adaptation). Scores
  are floored at min(max(1/split, 0.1), s), and the first block of every tensor is always kept,
  so that no layer is cut off entirely.
- Selection (`block_wise_prune=1`, all scripts): a 0-1 knapsack solved greedily, blocks taken by
  score while they fit, nn.Linear blocks and the others budgeted separately. `style: official`
  (the default) does what the code does (nn/gate.py has the details): the blocks other than the
  always-kept first ones get round((s - floor) x their entries), 0.42 of the cnn's entries kept
  in all at s = 0.5, split = 5, and are ranked by their floored scores rounded to tenths (a
  remnant of its dynamic-programming solver), which ties most blocks and favours early ones.
  `style: paper` keeps the paper's budget, kept entries <= s of the group's, the always-kept
  blocks included, and ranks by the floored score itself.
- Kept blocks are multiplied by their scores, so the gate learns through them: in the official
  style by the raw score, with the code's straight-through keep mask adding score x the gradient
  of a kept block's multiplier to its score's (the code's separate-transform branch, which its
  `id()` test takes even with `seperate_trans=0`); in the paper style by the floored score
  alone. The code's loss carries no regulariser (`alpha=0`, all scripts): one loss, the
  gated model's cross-entropy, updates the gate and the shared model in the same step
  (`bi_level_opt 0`, all scripts), both with the run's optimizer (the code: SGD momentum 0.9,
  weight decay 5e-4 for each), the gate at its own learning rate `gate_lr` (null: fl.lr, as most
  scripts set lr_gating = lr_model), gradient norms clipped at `clip` (10 in the code) for each.
  The straight-through variant with a separate scaling head (`seperate_trans=1`) is not built.
- Optimizer state: each client keeps its two optimizers' state (momentum) from round to round, as
  the code keeps each client's optimizers (`keep_optimizer: true`), in its state under
  `optim.pfedgate.<parameter>.<entry>`, never sent; the shared model's momentum thus carries into
  the next round's global model. `keep_optimizer: false` restarts it every round; on the
  BatchNorm-free digits cnn that slows pFedGate's start in the code as in ours.
- Simplifications: no learning-rate or sparsity schedules (the scripts decay the learning rates;
  sparsity is constant); batches of one sample are skipped, as the code does for BatchNorm.
- What is sent: the whole shared model, dense, both ways (the code averages every float entry of
  each client's model, BatchNorm statistics included, weighted by training samples). The paper's
  communication saving is not realised by its code, and masks change from batch to batch, so a
  round's updates reach nearly every block. The gate (and its norms' statistics) stays local.
- Scoring: a client's model is the gate on each evaluation chunk (the simulator's 1024 samples)
  masking the shared model with that chunk's mean scores; the code does the same on test batches
  of its training batch size. All clients' gates start identical (the code seeds every learner
  alike), drawn from the run's seed.
- The gate's input layer needs the input shape, which `prepare_model` is not given: the model is
  built with a placeholder gate and `bind` rebuilds it from the context's `input_shape` (same
  entry names); `init_client` hands out the rebuilt gate.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..errors import UsageError
from ..fl.state import State, clone, select
from ..fl.train import derive_seed, make_optimizer, mean_loss
from ..models import resolve_layers
from ..nn.gate import GatedModel
from .base import Method
from . import METHODS

GATE = "gate."  # the personal gate's entries
OPTIM = "optim.pfedgate."  # a client's optimizer state between rounds: OPTIM + "<parameter>.<entry>"
GATE_STREAM = 2**31 + 7  # derive_seed tag of the gate's initialisation


@METHODS.register("pfedgate", "pFedGate (Chen et al., ICML 2023): a personal gate scales and sparsifies the shared "
                  "model block-wise under a sparsity budget; FedAvg on the shared model (004 Table 1)")
class PFedGate(Method):
    name = "pfedgate"
    defaults: dict[str, Any] = {
        "sparsity": Field(0.5, gt=0, le=1),  # s, share kept (paper: 1, 0.5, 0.3; 0.5 the scripts' most common)
        "split": Field(5, ge=1),  # blocks per parameter tensor (the authors' scripts)
        "gate_lr": None,  # the gate's learning rate; null: the run's fl.lr
        "clip": Field(10.0, ge=0),  # max gradient norm of gate and model, each; 0: none (the code: 10)
        "style": "official",  # official (the authors' code) | paper: budget, ranking, scaling (nn/gate.py)
        "keep_optimizer": True,  # each client's optimizer state carries over to its next round (the code)
    }
    CHOICES = {"style": ("official", "paper")}

    @classmethod
    def validate_params(cls, params):
        value = params.get("gate_lr")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < math.inf):
            raise UsageError(f"method.gate_lr must be a number > 0, or null for the run's fl.lr (got {value!r})")
        hp = super().validate_params(params)
        if hp["style"] == "official" and hp["split"] == 1 and hp["sparsity"] < 1:
            # the floor is then s itself: the code's room round((s - floor) x entries) is 0 and, with
            # no always-kept first blocks, it drops every block
            raise UsageError(f"method.split 1 with method.sparsity {hp['sparsity']} < 1 drops every block in "
                             "style official (the code's budget); use split >= 2 or style paper")
        return hp

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return GatedModel(model, self.hp.split, self.hp.sparsity, style=self.hp.style)

    def bind(self, ctx) -> None:
        # The gate's input layer is sized by the input, which only the context knows: entry names
        # stay those of the placeholder `prepare_model` built, so the trainer's keys still hold.
        ctx.model.build_gate(ctx.input_shape, derive_seed(ctx.seed, GATE_STREAM))
        super().bind(ctx)
        self.model_keys = list(ctx.model.state_dict())
        self.gate_init = clone({GATE + k: v for k, v in ctx.model.gate.state_dict().items()})

    def shared_keys(self) -> list[str]:
        return [k for k in super().shared_keys() if not k.startswith(GATE)]

    def analysed_layers(self) -> dict[int, str]:
        try:
            return {i: f"backbone.{n}" for i, n in resolve_layers(self.ctx.model.backbone, [-1]).items()}
        except UsageError:
            return {}

    @property
    def gate_lr(self) -> float:
        return float(self.ctx.optim.lr if self.hp.gate_lr is None else self.hp.gate_lr)

    # -- client side ------------------------------------------------------------------------------
    def init_client(self, k: int, init_state) -> State:
        # The run's initial state was taken before `bind`: its gate entries are the placeholder's.
        return {**clone(init_state), **clone(self.gate_init)}

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        model = self.ctx.model
        model.load_state_dict(select(state, self.model_keys))
        shared, gate = list(model.backbone.parameters()), list(model.gate.parameters())
        opt = make_optimizer(self.ctx.optim, [{"params": shared}, {"params": gate, "lr": self.gate_lr}])
        named = dict(model.named_parameters())
        if self.hp.keep_optimizer:
            for name, p in named.items():
                prefix = f"{OPTIM}{name}."
                kept = {key[len(prefix):]: v.clone() for key, v in state.items() if key.startswith(prefix)}
                if kept:
                    opt.state[p] = kept
        model.train()
        total, steps = torch.zeros((), device=shared[0].device), 0
        for batch in self.ctx.batches(k, epochs=self.ctx.epochs):  # the gate's BatchNorm: no batch of one
            loss = F.cross_entropy(model(batch.x), batch.y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.hp.clip:
                nn.utils.clip_grad_norm_(gate, self.hp.clip)
                nn.utils.clip_grad_norm_(shared, self.hp.clip)
            opt.step()
            total += loss.detach()
            steps += 1
        if not steps:
            return dict(state), float("nan")
        mean = mean_loss(total, steps, self.ctx.max_loss)
        new = {**state, **clone(model.state_dict())}
        if self.hp.keep_optimizer:
            for name, p in named.items():
                for entry, value in opt.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        new[f"{OPTIM}{name}.{entry}"] = value.detach().clone()
        return new, mean
