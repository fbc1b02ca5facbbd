"""Many clients' local training as one computation: the same plan, stacked parameters, `vmap`.

`Trainer.fit` trains one client at a time on the shared model. When several clients follow equal
plans (the same phases, optimizer and extra loss), `BatchedTrainer.fit_many` stacks their states
along a new first dimension and runs every training step for all of them at once:
`torch.func.vmap` over `functional_call`, one backward pass, one optimizer update of the stacked
tensors. Each client still draws its batches from its own random stream in the order `Trainer`
draws them, so the result is the one-by-one result up to float rounding.

Clients of unequal size take unequal numbers of steps and end epochs with unequal last batches. At
every step the clients that still have a batch are grouped by that batch's size, each group is one
vmapped call (no padding: BatchNorm's batch statistics stay those of the client's real samples),
and the update is masked so that a client without a batch in this step does not move (its momentum
and Adam moments included). That mask is why the update is written here rather than taken from
torch.optim, whose optimizers hold one step count per tensor: the arithmetic mirrors torch's SGD
(momentum, dampening 0, L2 weight decay) and Adam (bias correction per client's own step count),
and tests hold it to torch.optim's result.
"""

from __future__ import annotations

from typing import Callable, Sequence, cast

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from ..errors import UsageError
from ..models.layers import recurrent_layer
from .state import State
from .train import Batch, ClientLoss, Diverged, Optim, Phase, Split, Trainer, train_loss

ADAM_EPS = 1e-8  # torch.optim.Adam's default, which Trainer uses

Job = tuple[State, Split, torch.Generator, Sequence[Phase]]  # a client's (state, split, generator, phases)
# One client's step: (trained, others, x, y, weight or None, extra-loss inputs) -> (objective, cross-entropy[, extra])
StepLoss = Callable[[State, State, torch.Tensor, torch.Tensor, torch.Tensor | None, State], tuple[torch.Tensor, ...]]
# Per parameter: its optimizer state entries stacked over the clients, and which clients have them
Moments = dict[str, tuple[dict[str, torch.Tensor], torch.Tensor]]


class BatchedTrainer:
    """Runs one plan for many clients at once on the shared model's structure."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.model = trainer.model
        self.buffers = {k for k, _ in trainer.model.named_buffers()}

    def fit_many(self, jobs: Sequence[Job]) -> list[tuple[State, float] | Diverged]:
        """Train each (state, split, generator, phases); per client (new state, mean loss: a TrainLoss
        as Trainer.fit's), or the Diverged that Trainer.fit would have raised for it. The clients'
        phases must compare equal (they may differ only in the inputs of a ClientLoss)."""
        phases = jobs[0][3]
        if any(list(p) != list(phases) for *_, p in jobs):
            raise ValueError("fit_many needs clients with equal plans")
        tr = self.trainer
        keys = list(self.model.state_dict())
        params = [n for n, _ in self.model.named_parameters()]
        stacked = {key: torch.stack([job[0][key] for job in jobs]) for key in keys}
        outs = [dict(job[0]) for job in jobs]
        device = tr.x.device
        total = torch.zeros(len(jobs), device=device)
        task = torch.zeros(len(jobs), device=device)  # the cross-entropy
        terms: dict[str, torch.Tensor] = {}  # each extra loss by name
        steps = torch.zeros(len(jobs), dtype=torch.long)
        for j, phase in enumerate(phases):
            names = params if phase.params is None else list(phase.params)
            unknown = [p for p in names if p not in params]
            if unknown:
                raise KeyError(f"phase trains unknown parameters {unknown[:3]}; parameters are {params[:5]}...")
            if names:
                # a ClientLoss's inputs, one entry per client, stacked like the parameters (every client's
                # loss is a ClientLoss when the first's is: only a ClientLoss compares equal to one)
                inputs = ({key: torch.stack([cast(ClientLoss, job[3][j].loss).inputs[key] for job in jobs])
                           for key in phase.loss.inputs}
                          if isinstance(phase.loss, ClientLoss) else {})
                term = None if phase.loss is None else terms.setdefault(phase.loss_name, torch.zeros_like(total))
                self._run(phase, names, stacked, inputs, jobs, outs, (total, task, term), steps)
        results: list[tuple[State, float] | Diverged] = []
        for i, out in enumerate(outs):
            if not steps[i]:
                results.append((out, float("nan")))
                continue
            try:
                loss = train_loss(total[i], task[i], {name: t[i] for name, t in terms.items()}, int(steps[i]),
                                  tr.max_loss)
            except Diverged as e:
                results.append(e)
                continue
            out.update({key: t[i].clone() for key, t in stacked.items()})
            results.append((out, loss))
        return results

    def _run(self, phase: Phase, names: list[str], stacked: State, inputs: State, jobs: Sequence[Job],
             outs: list[State], sums: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None], steps: torch.Tensor
             ) -> None:
        """One phase for every client; adds each client's step losses to `sums` (the objective's,
        the cross-entropy's, and the extra loss's, or None without one) and counts its steps."""
        tr = self.trainer
        optim = phase.optim or tr.optim
        lrs = {n: float(phase.lr.get(n, optim.lr)) for n in names}
        moments = self._restore(phase, optim, names, stacked, outs)
        batches = [tr.batches(split, gen, phase.epochs, phase.steps) for _, split, gen, _ in jobs]
        frozen = {k: v for k, v in stacked.items() if k not in lrs}
        # Without BatchNorm (whose batch statistics padding would change) and without an extra loss
        # (which may read the batch), the last batches of unequal size are padded and the padding is
        # weighted out of the loss: one call per step instead of one per batch size.
        pad = not tr.skip_single and phase.loss is None
        loss_fn = self._loss(phase)
        self.model.train()
        active = list(range(len(jobs)))
        while active:
            tr.check_interrupt()
            drawn = {}
            for i in active:
                batch = next((b for b in batches[i] if not (tr.skip_single and len(b.y) == 1)), None)
                if batch is not None:
                    drawn[i] = batch
            active = list(drawn)
            if not active:
                break
            groups: dict[int, list[int]] = {}
            for i in active:
                groups.setdefault(0 if pad else len(drawn[i].y), []).append(i)
            grads: State = {}
            for group in groups.values():
                whole = len(group) == len(jobs)
                index = None if whole else torch.tensor(group, device=tr.x.device)
                pick: Callable[[torch.Tensor], torch.Tensor]
                pick = (lambda t: t) if index is None else (lambda t: t.index_select(0, index))
                trained = {n: pick(stacked[n]).detach().requires_grad_() for n in names}
                others = {k: pick(v) for k, v in frozen.items()}
                extra = {k: pick(v) for k, v in inputs.items()}
                x, y, weight = _stack([drawn[i] for i in group])
                with tr.autocast():
                    losses, *parts = vmap(loss_fn, in_dims=(0, 0, 0, 0, None if weight is None else 0, 0),
                                          randomness="different")(trained, others, x, y, weight, extra)
                g = torch.autograd.grad(losses.sum(), list(trained.values()))
                with torch.no_grad():
                    for acc, values in zip(sums, (losses, *parts)):
                        if acc is None:
                            continue
                        if whole:
                            acc += values.detach().float()
                        else:
                            assert index is not None  # set where not whole
                            acc.index_add_(0, index.to(acc.device), values.detach().float())
                    if whole:
                        grads = dict(zip(names, g))
                    else:
                        assert index is not None  # set where not whole
                        for k, v in others.items():  # BatchNorm statistics updated in the picked copy
                            if k in self.buffers:
                                stacked[k].index_copy_(0, index, v)
                        # clients without a batch in this step keep a zero gradient (and are masked)
                        for n, gn in zip(names, g):
                            grads.setdefault(n, torch.zeros_like(stacked[n])).index_copy_(0, index, gn)
                steps[group] += 1
            mask = None
            if len(active) < len(jobs):
                mask = torch.zeros(len(jobs), dtype=torch.bool, device=tr.x.device)
                mask[active] = True
            with torch.no_grad():
                self._step(optim, names, lrs, stacked, grads, moments, mask)
        if phase.keep_optimizer:
            self._save(phase.keep_optimizer, optim, names, moments, outs)

    def _loss(self, phase: Phase) -> StepLoss:
        model = self.model

        def loss(trained: State, others: State, x: torch.Tensor, y: torch.Tensor,
                 weight: torch.Tensor | None, inputs: State) -> tuple[torch.Tensor, ...]:
            """(objective, cross-entropy), and the extra loss when the phase has one."""
            logits = functional_call(model, {**trained, **others}, (x,))
            if weight is None:
                value = F.cross_entropy(logits, y)
            else:  # the mean over the client's real samples; padding has weight 0
                value = (F.cross_entropy(logits, y, reduction="none") * weight).sum() / weight.sum()
            params = {**others, **trained}  # an extra loss sees every parameter, as under Trainer
            if isinstance(phase.loss, ClientLoss):
                extra = phase.loss.fn(params, Batch(x, y), logits, inputs)
            elif phase.loss is not None:
                extra = phase.loss(params, Batch(x, y), logits)
            else:
                return value, value
            return value + extra, value, extra

        return loss

    # -- the optimizers, per client, masked --------------------------------------------------------
    def _restore(self, phase: Phase, optim: Optim, names: list[str], stacked: State, outs: list[State]) -> Moments:
        """Per parameter: SGD's momentum buffer or Adam's moments and step count, stacked, with a
        per-client flag of whether the client has them yet (a kept phase state, or an earlier step)."""
        C = len(outs)
        device = next(iter(stacked.values())).device
        entries = ("exp_avg", "exp_avg_sq", "step") if optim.kind == "adam" else ("momentum_buffer",)
        moments: Moments = {}
        for n in names:
            state: dict[str, torch.Tensor] = {}
            has = torch.zeros(C, dtype=torch.bool, device=device)
            for e in entries:
                shape = (C,) if e == "step" else stacked[n].shape
                state[e] = torch.zeros(shape, dtype=torch.float32 if e == "step" else stacked[n].dtype, device=device)
            if phase.keep_optimizer:
                for i, out in enumerate(outs):
                    prefix = f"optim.{phase.keep_optimizer}.{n}."
                    if all(prefix + e in out for e in entries):
                        for e in entries:
                            state[e][i] = out[prefix + e]
                        has[i] = True
            moments[n] = (state, has)
        return moments

    @staticmethod
    def _save(tag: str, optim: Optim, names: list[str], moments: Moments, outs: list[State]) -> None:
        for n in names:
            state, has = moments[n]
            if optim.kind == "sgd" and optim.momentum == 0:
                continue  # torch's SGD keeps no buffer without momentum
            for i, out in enumerate(outs):
                if has[i]:
                    for e, t in state.items():
                        out[f"optim.{tag}.{n}.{e}"] = t[i].clone()

    @staticmethod
    def _step(optim: Optim, names: list[str], lrs: dict[str, float], stacked: State, grads: State, moments: Moments,
              mask: torch.Tensor | None) -> None:
        for n in names:
            p, g = stacked[n], grads[n]
            state, has = moments[n]
            view = (-1,) + (1,) * (p.dim() - 1)
            if optim.weight_decay:
                g = g.add(p, alpha=optim.weight_decay)
            if optim.kind == "adam":
                b1, b2 = optim.betas
                step = state["step"] + (1 if mask is None else mask.float())
                m = state["exp_avg"].lerp(g, 1 - b1)
                v = state["exp_avg_sq"].mul(b2).addcmul_(g, g.conj(), value=1 - b2)
                bc1 = (1 - b1 ** step.clamp_min(1)).view(view)
                bc2 = (1 - b2 ** step.clamp_min(1)).sqrt().view(view)
                new = p - (lrs[n] / bc1) * m / ((v.sqrt() / bc2) + ADAM_EPS)
                updates = {"exp_avg": m, "exp_avg_sq": v}
                state["step"] = step
            elif optim.momentum:
                buf = torch.where(has.view(view), state["momentum_buffer"].mul(optim.momentum).add_(g), g)
                new = p.add(buf, alpha=-lrs[n])
                updates = {"momentum_buffer": buf}
            else:
                new = p.add(g, alpha=-lrs[n])
                updates = {}
            if mask is None:
                p.copy_(new)
                for e, t in updates.items():
                    state[e] = t
                has.fill_(True)
            else:
                keep = mask.view(view)
                p.copy_(torch.where(keep, new, p))
                for e, t in updates.items():
                    state[e] = torch.where(keep, t, state[e])
                has |= mask


def _stack(batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The clients' batches as (x, y, weight) with a leading client dimension; batches shorter than
    the longest are padded, with weight 1 on real samples and 0 on padding (None: no padding)."""
    size = max(len(b.y) for b in batches)
    if all(len(b.y) == size for b in batches):
        return torch.stack([b.x for b in batches]), torch.stack([b.y for b in batches]), None
    x = batches[0].x.new_zeros((len(batches), size, *batches[0].x.shape[1:]))
    y = batches[0].y.new_zeros((len(batches), size))
    weight = torch.zeros((len(batches), size), device=x.device)
    for i, b in enumerate(batches):
        x[i, : len(b.y)] = b.x
        y[i, : len(b.y)] = b.y
        weight[i, : len(b.y)] = 1
    return x, y, weight


def batchable(model: torch.nn.Module, device: torch.device, mode: str | bool) -> bool:
    """Whether `fl.batch_clients` = mode ("auto", true or false) batches this model's clients on `device`."""
    recurrent = recurrent_layer(model)
    if recurrent is not None:  # vmap has no batching rule for aten::lstm: such a model trains client by client
        if mode is True:
            raise UsageError(f"fl.batch_clients: true cannot batch this model's clients: torch.func.vmap has no rule "
                             f"for its recurrent layer {recurrent}; use auto or false")
        return False
    if mode != "auto":
        return bool(mode)
    if device.type == "cuda":
        return True
    # On CPU vmap turns convolutions into grouped convolutions, which lose to a loop of plain ones
    # (BENCHMARKS.md); Linear layers become batched matmuls, which win.
    weights = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.modules.conv._ConvNd))]
    return bool(weights) and all(isinstance(m, torch.nn.Linear) for m in weights)
