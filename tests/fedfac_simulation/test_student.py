"""Tests for fedfactor.fedfac_simulation.student: the batched student and FedSplit's server step."""

from __future__ import annotations

import torch

from fedfactor.fedfac_simulation.student import aggregate, init_mlp, local_train, loss_and_grads
from fedfactor.fedfac_simulation.teacher import generate


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_batched_gradients_are_each_clients_own():
    data = generate(3, 8, 10, p=0.5, alpha=0.5, n_train=20, n_test=1, generator=_gen(3))
    model = init_mlp(3, 10, 8, _gen(4))
    local_train(model, data.x_train, data.y_train, lr=0.1, steps=2)  # clients differ now
    loss, grad = loss_and_grads(model, data.x_train, data.y_train)
    for c in range(3):  # one client alone, as a plain MLP
        W, b, a, b0 = (t[c].clone().requires_grad_(True) for t in (model.W, model.b, model.a, model.b0))
        f = torch.relu(data.x_train[c] @ W.T + b) @ a + b0
        ref = torch.nn.functional.binary_cross_entropy_with_logits(f, data.y_train[c])
        ref.backward()
        assert torch.allclose(loss[c], ref.detach(), atol=1e-6)
        for name, leaf in zip(("W", "b", "a", "b0"), (W, b, a, b0)):
            assert torch.allclose(getattr(grad, name)[c], leaf.grad, atol=1e-6), name


def test_a_round_averages_only_shared_units_and_the_output_layer():
    C, m, d = 4, 6, 5
    data = generate(C, d, m, p=0.5, alpha=0.4, n_train=12, n_test=1, generator=_gen(5))
    model = init_mlp(C, m, d, _gen(6))
    local_train(model, data.x_train, data.y_train, lr=0.2, steps=3)
    before = model.clone()
    participants = torch.tensor([True, True, True, False])
    local_train(model, data.x_train, data.y_train, lr=0.2, steps=2, participants=participants)
    local = model.clone()
    assert torch.equal(local.W[3], before.W[3])  # a client outside the round does not train
    shared = torch.tensor([False, True, False, True, True, False])
    n = torch.tensor([1.0, 2.0, 3.0, 100.0])
    aggregate(model, shared, participants, n)
    w = torch.tensor([1.0, 2.0, 3.0, 0.0]) / 6
    # personal units: each client's own local update (a non-participant keeps its old ones)
    assert torch.equal(model.W[:, ~shared], local.W[:, ~shared])
    assert torch.equal(model.b[:, ~shared], local.b[:, ~shared])
    # shared units: equal across all clients, the participants' sample-weighted mean
    assert torch.allclose(model.W[:, shared], torch.einsum("c,cmd->md", w, local.W[:, shared]).expand(C, -1, -1))
    assert torch.allclose(model.b[:, shared], (w @ local.b[:, shared]).expand(C, -1))
    # the output layer is outside Lambda: shared as in FedAvg
    assert torch.allclose(model.a, (w @ local.a).expand(C, -1)) and torch.allclose(model.b0, (w @ local.b0).expand(C))
