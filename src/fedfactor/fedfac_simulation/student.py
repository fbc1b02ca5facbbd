"""The simulation's student: C clients' one-hidden-layer MLPs, trained and aggregated as one batch.

FedSplit (paper 001, section 3.2, with a logistic loss): each client runs full-batch gradient steps
on its own mean loss; the server averages the shared hidden units and the output layer over the
round's participants, and the personal units keep each participant's own update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class MLP:
    """C clients' one-hidden-layer MLPs: logit = a . relu(W x + b) + b0."""

    W: torch.Tensor  # C x m x d
    b: torch.Tensor  # C x m
    a: torch.Tensor  # C x m
    b0: torch.Tensor  # C

    def clone(self) -> "MLP":
        return MLP(self.W.clone(), self.b.clone(), self.a.clone(), self.b0.clone())


def init_mlp(clients: int, m: int, d: int, generator: torch.Generator) -> MLP:
    """One common initialisation (nn.Linear's uniform +-1/sqrt(fan_in)), copied to every client."""
    def u(shape, fan_in):
        bound = 1 / math.sqrt(fan_in)
        return torch.empty(shape).uniform_(-bound, bound, generator=generator)

    W, b, a, b0 = u((m, d), d), u((m,), d), u((m,), m), u((1,), m)
    return MLP(W.expand(clients, m, d).clone(), b.expand(clients, m).clone(), a.expand(clients, m).clone(),
               b0.expand(clients).clone())


def logits(model: MLP, x: torch.Tensor) -> torch.Tensor:
    """C x n logits."""
    h = torch.baddbmm(model.b[:, None, :], x, model.W.transpose(1, 2)).relu_()
    return torch.bmm(h, model.a[:, :, None]).squeeze(2) + model.b0[:, None]


def loss_and_grads(model: MLP, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, MLP]:
    """Each client's mean logistic loss (C) and its gradients; clients are independent, so the
    gradient of the summed losses is every client's own."""
    with torch.enable_grad():
        leaves = MLP(*(t.detach().requires_grad_(True) for t in (model.W, model.b, model.a, model.b0)))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(leaves, x), y, reduction="none").mean(1)
        grads = torch.autograd.grad(loss.sum(), [leaves.W, leaves.b, leaves.a, leaves.b0])
    return loss.detach(), MLP(*grads)


def local_train(model: MLP, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int,
                participants: torch.Tensor | None = None) -> torch.Tensor:
    """`steps` full-batch gradient steps in place for the participants (C bool); returns their last loss."""
    loss = torch.zeros(x.shape[0])
    for _ in range(steps):
        loss, grad = loss_and_grads(model, x, y)
        keep = 1.0 if participants is None else participants.float()
        for name in ("W", "b", "a", "b0"):
            g = getattr(grad, name)
            scale = keep if isinstance(keep, float) else keep.view(-1, *([1] * (g.dim() - 1)))
            getattr(model, name).sub_(lr * scale * g)
    return loss


def aggregate(model: MLP, shared: torch.Tensor, participants: torch.Tensor, n_samples: torch.Tensor) -> None:
    """FedSplit's server step, in place: shared hidden units (rows of W, entries of b) and the output
    layer (a, b0) become the participants' sample-weighted mean for every client; personal units keep
    each client's own values."""
    w = n_samples.to(model.W.dtype) * participants.to(model.W.dtype)
    w = w / w.sum()
    mean_W = torch.einsum("c,cmd->md", w, model.W)
    mean_b = w @ model.b
    model.W[:, shared] = mean_W[shared]
    model.b[:, shared] = mean_b[shared]
    model.a[:] = w @ model.a
    model.b0[:] = w @ model.b0


def accuracy(model: MLP, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-client test accuracy (C)."""
    return ((logits(model, x) > 0).float() == y).float().mean(1)
