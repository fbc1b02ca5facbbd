"""Local training and evaluation on tensors that already live on the training device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from ..data.augment import augment_batch


@dataclass
class Split:
    """One client's split: indices into the pooled device tensor x, and the client's own labels."""

    idx: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.idx)


@dataclass
class SGDConfig:
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int


def fit(
    model: torch.nn.Module,
    params: Iterable[torch.nn.Parameter],
    x: torch.Tensor,
    split: Split,
    epochs: int,
    sgd: SGDConfig,
    augment: str,
    generator: torch.Generator,
    loss_term: Callable[[torch.nn.Module], torch.Tensor | None] | None = None,
) -> float:
    """E epochs of minibatch SGD; returns the mean training loss over all steps.

    A fresh optimizer per call: FedAvg-style methods (and FedDecomp's official code) restart SGD
    every round, and it keeps per-client state to the model alone.
    """
    params = [p for p in params if p.requires_grad]
    if not params or len(split) == 0 or epochs == 0:
        return float("nan")
    opt = torch.optim.SGD(params, lr=sgd.lr, momentum=sgd.momentum, weight_decay=sgd.weight_decay)
    model.train()
    total, steps = torch.zeros((), device=x.device), 0
    n = len(split)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator, device=x.device)
        for start in range(0, n, sgd.batch_size):
            b = order[start : start + sgd.batch_size]
            xb = augment_batch(x[split.idx[b]], augment, generator)
            loss = F.cross_entropy(model(xb), split.y[b])
            if loss_term is not None:
                extra = loss_term(model)
                if extra is not None:
                    loss = loss + extra
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            # Summed on the device: a .item() per step would synchronise a GPU every batch.
            total += loss.detach()
            steps += 1
    return (total / steps).item()


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, split: Split, batch_size: int = 1024) -> tuple[int, int, float]:
    """(correct, count, summed loss) of the model on one client's split."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    loss = torch.zeros((), device=x.device)
    for start in range(0, len(split), batch_size):
        sl = slice(start, start + batch_size)
        logits = model(x[split.idx[sl]])
        y = split.y[sl]
        correct += (logits.argmax(1) == y).sum()
        loss += F.cross_entropy(logits, y, reduction="sum")
    return int(correct), len(split), float(loss)
