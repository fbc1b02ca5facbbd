"""Local training as data, and evaluation, on tensors that already live on the training device.

A method describes a client's local training as a list of `Phase`s: which parameters train, for how
many epochs or steps, with which optimizer and learning rates, and an optional extra loss written
as a function of the parameters, the batch and the logits (never of a module's side effects).
`Trainer.fit` executes such a plan for one client on the one shared model object; a later
performance pass can execute the same plans for many clients at once. Evaluation goes through
`torch.func.functional_call`, so scoring any state never disturbs the model a method is training.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..data.augment import augment_batch
from .state import State, clone, select


def derive_seed(*parts: int) -> int:
    """An independent seed per (run seed, round, client): results do not depend on client order."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


@dataclass
class Split:
    """One client's split: indices into the pooled device tensor x, and the client's own labels."""

    idx: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.idx)


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class Optim:
    kind: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.01
    momentum: float = 0.0  # SGD
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # Adam


# extra_loss(params, batch, logits) -> scalar, added to the cross-entropy; `params` are the model's
# named parameters as trained (FedProx: mu/2 ||params - anchor||^2).
ExtraLoss = Callable[[Mapping[str, torch.Tensor], Batch, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, eq=False)
class ClientLoss:
    """An extra loss that reads tensors of the client's own (FedProx's anchor): fn(params, batch,
    logits, inputs). Two compare equal when their fn and their inputs' names do, so clients whose
    plans differ only in such inputs still train batched (their inputs stacked per client)."""

    fn: Callable[[Mapping[str, torch.Tensor], Batch, torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor]
    inputs: Mapping[str, torch.Tensor]

    def __call__(self, params: Mapping[str, torch.Tensor], batch: Batch, logits: torch.Tensor) -> torch.Tensor:
        return self.fn(params, batch, logits, self.inputs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientLoss) and self.fn == other.fn and list(self.inputs) == list(other.inputs)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Phase:
    """One stretch of local training. Give epochs or steps (minibatches), not both."""

    params: Sequence[str] | None = None  # names of the parameters that train; None: all of them
    epochs: int | None = None
    steps: int | None = None
    optim: Optim | None = None  # None: the run's optimizer (the config's fl section)
    lr: Mapping[str, float] = field(default_factory=dict)  # per-parameter learning rates
    loss: ExtraLoss | None = None
    # What the extra loss is reported as: its mean is the column train_<loss_name> of metrics.csv,
    # beside train_loss, which is the cross-entropy alone (it trains on their sum).
    loss_name: str = "reg"
    # Keep this phase's optimizer state (momentum, Adam moments) in the client's state between
    # rounds, under "optim.<phase name>.<parameter>.<entry>"; None restarts it every round.
    keep_optimizer: str | None = None

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("a Phase needs exactly one of epochs and steps")
        if (self.epochs or 0) < 0 or (self.steps or 0) < 0:
            raise ValueError("a Phase's epochs and steps must be >= 0")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.loss_name) or self.loss_name == "loss":
            raise ValueError(f"a Phase's loss_name must be [A-Za-z0-9_.-]+ and not 'loss' (got {self.loss_name!r})")


class Diverged(Exception):
    """A client's mean training loss was NaN, infinite or above the run's max_loss."""

    def __init__(self, loss: float, max_loss: float):
        self.loss = loss
        reason = "not finite" if not math.isfinite(loss) else f"above fl.max_loss={max_loss:g}"
        super().__init__(f"mean training loss {loss:.4g} is {reason}")


def mean_loss(total: torch.Tensor, steps: int, max_loss: float = math.inf) -> float:
    """A client's mean training loss from the sum of its step losses; raises Diverged when it is
    NaN, infinite or above max_loss (the sum carries any NaN or inf of any step, so one check per
    client catches them all). NaN when there were no steps."""
    if not steps:
        return float("nan")
    return _checked((total / steps).item(), max_loss)


def _checked(mean: float, max_loss: float) -> float:
    if not math.isfinite(mean) or mean > max_loss:
        raise Diverged(mean, max_loss)
    return mean


class TrainLoss(float):
    """A client's (or a round's) mean training loss as reported: the float is the task loss alone
    (the cross-entropy), `terms` the mean of each extra loss by name ({"l1": 3.1}: train_l1 in
    metrics.csv). A float, so whoever reads a loss, and every method that passes its parent's loss
    on, keeps working; the training objective is the float plus the terms."""

    terms: dict[str, float]

    def __new__(cls, task: float, terms: Mapping[str, float] | None = None) -> TrainLoss:
        self = super().__new__(cls, task)
        self.terms = dict(terms or {})
        return self


def train_loss(objective: torch.Tensor, task: torch.Tensor, terms: Mapping[str, torch.Tensor], steps: int,
               max_loss: float = math.inf) -> TrainLoss | float:
    """A client's TrainLoss from the sums of its step losses: the full objective (task plus terms),
    the task loss and each extra term. Divergence is judged on the objective, as mean_loss does;
    NaN when there were no steps. One transfer from the device for all of them."""
    if not steps:
        return float("nan")
    objective_mean, task_mean, *term_means = (torch.stack([objective, task, *terms.values()]) / steps).tolist()
    _checked(objective_mean, max_loss)
    return TrainLoss(task_mean, dict(zip(terms, term_means)))


def make_optimizer(optim: Optim, params: Iterable[torch.Tensor] | list[dict[str, Any]], lr: float | None = None) -> torch.optim.Optimizer:
    """The optimizer `optim` describes over `params` (tensors or parameter groups), at `lr` if given."""
    lr = optim.lr if lr is None else lr
    if optim.kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=optim.betas, weight_decay=optim.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=optim.momentum, weight_decay=optim.weight_decay)


def run_with(module: torch.nn.Module, weights: Mapping[str, torch.Tensor], x: torch.Tensor,
             training: bool = False) -> torch.Tensor:
    """module(x) on `weights` instead of its own, in training or eval mode, without gradients; the
    module's mode is put back. BatchNorm in training mode updates the running statistics in `weights`."""
    was_training = module.training
    module.train(training)
    try:
        with torch.no_grad():
            out: torch.Tensor = torch.func.functional_call(module, dict(weights), (x,))
            return out
    finally:
        module.train(was_training)


class Trainer:
    """Runs phases and evaluations for any client on the shared model; holds no client state."""

    def __init__(self, model: torch.nn.Module, x: torch.Tensor, batch_size: int, augment: str, optim: Optim,
                 max_loss: float = math.inf, precision: str = "float32", channels_last: bool = False):
        self.model = model
        self.x = x
        self.batch_size = batch_size
        self.augment = augment
        self.optim = optim
        self.max_loss = max_loss
        self.precision = precision
        self.channels_last = channels_last
        if channels_last:
            model.to(memory_format=torch.channels_last)
        self.model_keys = list(model.state_dict())
        # BatchNorm cannot train on one sample where it normalises one value per channel (after global
        # pooling): a client whose data leaves a last batch of one skips that batch, as a DataLoader
        # with drop_last would, instead of failing the run.
        self.skip_single = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        # Called before every training step; the simulator sets it to raise Interrupted when a stop
        # signal arrived, so a long local epoch does not outlast a cluster's grace period.
        self.check_interrupt: Callable[[], None] = lambda: None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward pass and loss of a training step: bf16 autocast under fl.precision=bf16."""
        if self.precision == "bf16":
            return torch.autocast(self.x.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def load(self, state: State) -> dict[str, torch.Tensor]:
        """Copy a client's entries into the shared model in place (cheaper than load_state_dict,
        which re-checks every key, and it keeps each tensor's memory format); returns the model's
        live entries, whose values after training are the client's new state."""
        entries = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for key, t in entries.items():
                t.copy_(state[key])
        return entries

    def batches(self, split: Split, generator: torch.Generator, epochs: int | None = None,
                steps: int | None = None) -> Iterator[Batch]:
        """Shuffled, augmented minibatches: `epochs` passes, or `steps` batches across passes."""
        n = len(split)
        if n == 0:
            return
        total = steps if steps is not None else (epochs or 0) * math.ceil(n / self.batch_size)
        done = 0
        while done < total:
            order = torch.randperm(n, generator=generator, device=self.x.device)
            for start in range(0, n, self.batch_size):
                if done == total:
                    return
                b = order[start : start + self.batch_size]
                x = augment_batch(self.x[split.idx[b]], self.augment, generator)
                if self.channels_last and x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                yield Batch(x, split.y[b])
                done += 1

    def fit(self, state: State, split: Split, phases: Sequence[Phase], generator: torch.Generator) -> tuple[State, float]:
        """Train `state` on `split` phase by phase; returns the new state and the mean training loss
        (a TrainLoss: the cross-entropy, with each phase's extra loss in `terms`).

        Entries of `state` that are not the model's (a method's per-client extras) pass through,
        updated with any optimizer state a phase keeps.
        """
        entries = self.load(state)
        self.model.train()
        out = dict(state)
        total, steps = torch.zeros((), device=self.x.device), 0
        task = torch.zeros((), device=self.x.device)
        terms: dict[str, torch.Tensor] = {}
        for phase in phases:
            loss_sum, task_sum, term_sum, n = self._run(phase, split, generator, out)
            total += loss_sum
            task += task_sum
            if term_sum is not None:  # phases with the same loss_name add up to one column
                terms[phase.loss_name] = terms.get(phase.loss_name, 0) + term_sum
            steps += n
        if not steps:
            return out, float("nan")
        mean = train_loss(total, task, terms, steps, self.max_loss)
        out.update(clone(entries))
        return out, mean

    def _run(self, phase: Phase, split: Split, generator: torch.Generator,
             state: State) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
        """(sum of the step losses, of their cross-entropy, of their extra loss or None, steps)."""
        named = dict(self.model.named_parameters())
        names = list(named) if phase.params is None else list(phase.params)
        unknown = [p for p in names if p not in named]
        if unknown:
            raise KeyError(f"phase trains unknown parameters {unknown[:3]}; parameters are {list(named)[:5]}...")
        total = torch.zeros((), device=self.x.device)
        task = torch.zeros_like(total)
        if not names:
            return total, task, None, 0
        term = None if phase.loss is None else torch.zeros_like(total)
        opt = self._optimizer(phase, [(n, named[n]) for n in names])
        if phase.keep_optimizer:
            self.restore_optimizer(opt, phase.keep_optimizer, named, state)
        frozen = {n: p.requires_grad for n, p in named.items()}
        steps = 0
        try:
            for n, p in named.items():  # no gradients for what this phase does not train
                p.requires_grad_(n in names)
            for batch in self.batches(split, generator, phase.epochs, phase.steps):
                self.check_interrupt()
                if self.skip_single and len(batch.y) == 1:
                    continue
                with self.autocast():
                    logits = self.model(batch.x)
                    loss = cross_entropy = F.cross_entropy(logits, batch.y)
                    if phase.loss is not None:
                        extra = phase.loss(named, batch, logits)
                        loss = loss + extra
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                # Summed on the device: a .item() per step would synchronise a GPU every batch.
                total += loss.detach()
                task += cross_entropy.detach()
                if term is not None:
                    term += extra.detach()
                steps += 1
        finally:
            for n, p in named.items():
                p.requires_grad_(frozen[n])
        if phase.keep_optimizer:
            self.save_optimizer(opt, phase.keep_optimizer, named, state)
        return total, task, term, steps

    def _optimizer(self, phase: Phase, params: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer:
        o = phase.optim or self.optim
        by_lr: dict[float, list[torch.nn.Parameter]] = {}
        for name, p in params:
            by_lr.setdefault(float(phase.lr.get(name, o.lr)), []).append(p)
        return make_optimizer(o, [{"params": ps, "lr": lr} for lr, ps in by_lr.items()])

    @staticmethod
    def restore_optimizer(opt: torch.optim.Optimizer, tag: str, named: dict[str, Any], state: State) -> None:
        """Put back the optimizer state a client keeps under "optim.<tag>.<parameter>.<entry>"."""
        for name, p in named.items():
            prefix = f"optim.{tag}.{name}."
            kept = {k[len(prefix):]: v.clone() for k, v in state.items() if k.startswith(prefix)}
            if kept:
                opt.state[p] = kept

    @staticmethod
    def save_optimizer(opt: torch.optim.Optimizer, tag: str, named: dict[str, Any], state: State) -> None:
        """Keep the optimizer's state in the client's `state` (restore_optimizer's entries)."""
        for name, p in named.items():
            for entry, value in opt.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    state[f"optim.{tag}.{name}.{entry}"] = value.detach().clone()

    @torch.no_grad()
    def evaluate_ensemble(self, states: Sequence[State], split: Split, batch_size: int = 1024) -> tuple[int, int, float]:
        """(correct, count, summed loss) of the mean predicted class probabilities of several states."""
        self.model.eval()
        correct = torch.zeros((), dtype=torch.long, device=self.x.device)
        loss = torch.zeros((), device=self.x.device)
        for start in range(0, len(split), batch_size):
            sl = slice(start, start + batch_size)
            x = self.x[split.idx[sl]]
            probs = sum(torch.func.functional_call(self.model, select(s, self.model_keys), (x,)).softmax(1)
                        for s in states) / len(states)
            y = split.y[sl]
            correct += (probs.argmax(1) == y).sum()
            loss += F.nll_loss(probs.clamp_min(1e-12).log(), y, reduction="sum")
        return int(correct), len(split), float(loss)

    @torch.no_grad()
    def evaluate(self, state: State, split: Split, batch_size: int = 1024) -> tuple[int, int, float]:
        """(correct, count, summed loss) of `state` on a split; the model object is left untouched."""
        weights = select(state, self.model_keys)
        self.model.eval()
        correct = torch.zeros((), dtype=torch.long, device=self.x.device)
        loss = torch.zeros((), device=self.x.device)
        for start in range(0, len(split), batch_size):
            sl = slice(start, start + batch_size)
            logits = torch.func.functional_call(self.model, weights, (self.x[split.idx[sl]],))
            y = split.y[sl]
            correct += (logits.argmax(1) == y).sum()
            loss += F.cross_entropy(logits, y, reduction="sum")
        return int(correct), len(split), float(loss)
