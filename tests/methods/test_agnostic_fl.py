import json
import math

import numpy as np
import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.analysis.mixture import entropy, project_simplex
from fedfactor.methods.agnostic_fl import LOSS

from ..conftest import record_uploads

CNN_FLOATS = 188810  # every float entry of the tiny cnn (digits, 10 classes); it has no BatchNorm


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=agnostic_fl", *extra]))


def _upload(sim, value, loss):
    """What a client sends: every shared entry filled with `value`, and its loss."""
    return {**{key: torch.full_like(sim.server["global"][key], value) for key in sim.method.shared},
            LOSS: torch.tensor(loss)}


def _close(t, expected):
    return torch.allclose(t, torch.tensor(expected, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("v, floor, expected", [
    ([0.2, 0.3, 0.5], 0.0, [0.2, 0.3, 0.5]),  # already on the simplex: unchanged
    ([0.5, -0.5, 1.0], 0.0, [0.25, 0.0, 0.75]),  # rho = 2, theta = (1.5 - 1) / 2 = 0.25
    ([3.0, 3.0, 3.0, 3.0], 0.0, [0.25, 0.25, 0.25, 0.25]),  # all equal: uniform
    ([0.4, 0.4, 0.4], 0.0, [1 / 3, 1 / 3, 1 / 3]),  # the excess 0.2 taken evenly
    ([2.0, 0.0, 0.0], 0.0, [1.0, 0.0, 0.0]),  # theta = 1: the others clipped to 0
    ([-1.0, -2.0], 0.0, [1.0, 0.0]),  # all negative: theta = -2
    ([1.0, 0.0, 0.0], 0.1, [0.8, 0.1, 0.1]),  # floor 0.1: mass 0.7, theta = 0.2, then + 0.1
    ([5.0, 0.0, 1.0, 0.0], 0.25, [0.25, 0.25, 0.25, 0.25]),  # floor 1/K: a single point
])
def test_simplex_projection_by_hand(v, floor, expected):
    assert _close(project_simplex(torch.tensor(v), floor), expected)


def test_simplex_projection_is_the_nearest_point_on_random_vectors():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        v = torch.randn(7, generator=gen, dtype=torch.float64) * 3
        x = project_simplex(v)
        assert (x >= 0).all() and x.sum().item() == pytest.approx(1.0, abs=1e-12)
        # KKT: v - x is one constant t on the support and at most t off it
        gap = v - x
        t = gap[x > 0]
        assert torch.allclose(t, t[0].expand_as(t), atol=1e-12)
        assert (gap[x == 0] <= t[0] + 1e-12).all()


@pytest.mark.slow
def test_one_lambda_update_by_hand_and_it_moves_towards_the_largest_loss(tiny):
    sim = _sim(tiny, "method.gamma_lambda=0.1")
    sim.ctx.round = 1
    assert _close(sim.server["lambda"], [0.25] * 4)
    ups = {k: _upload(sim, 1.0, loss) for k, loss in enumerate([1.0, 2.0, 0.5, 0.5])}
    server = sim.method.aggregate(sim.server, ups, {k: 1.0 for k in ups})
    # 0.25 + 0.1 L = (0.35, 0.45, 0.30, 0.30), sum 1.4: each less 0.4 / 4
    assert _close(server["lambda"], [0.25, 0.35, 0.2, 0.2])
    assert int(server["lambda"].argmax()) == 1
    # -(0.25 ln 0.25 + 0.35 ln 0.35 + 2 * 0.2 ln 0.2)
    assert sim._scalars["agnostic_lambda_entropy"] == pytest.approx(0.3465736 + 0.3674377 + 2 * 0.3218876, abs=1e-6)
    assert sim._scalars["agnostic_lambda_entropy"] < math.log(4)
    assert sim._arrays["agnostic_lambda"].tolist() == pytest.approx([0.25, 0.35, 0.2, 0.2])
    assert sim._arrays["agnostic_losses"].tolist() == pytest.approx([1.0, 2.0, 0.5, 0.5])
    # the server's lambda of the round's start is left as it was (the round commits at its end)
    assert _close(sim.server["lambda"], [0.25] * 4)


def test_a_large_step_puts_all_weight_on_the_worst_client_or_down_to_the_floor(tiny):
    losses = [3.0, 0.1, 0.1, 0.1]
    for setting, expected in (([], [1.0, 0.0, 0.0, 0.0]), (["method.lambda_min=0.1"], [0.7, 0.1, 0.1, 0.1])):
        sim = _sim(tiny, "method.gamma_lambda=1", *setting)
        ups = {k: _upload(sim, float(k), loss) for k, loss in enumerate(losses)}
        # 0.25 + L = (3.25, 0.35, 0.35, 0.35): theta 2.25; with the floor, mass 0.6 and theta 2.55
        server = sim.method.aggregate(sim.server, ups, {k: 1.0 for k in ups})
        assert _close(server["lambda"], expected), setting
        assert entropy(torch.tensor([1.0, 0.0, 0.0, 0.0])) == 0.0
        # the next round's average follows lambda: with everything on client 0, its model
        again = sim.method.aggregate(server, ups, {k: 1.0 for k in ups})
        mean = sum(w * k for k, w in enumerate(expected))
        assert all(torch.allclose(t, torch.full_like(t, mean)) for t in again["global"].values())


def test_aggregation_is_weighted_by_lambda_not_by_size(tiny):
    sim = _sim(tiny)
    server = {**sim.server, "lambda": torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)}
    ups = {k: _upload(sim, float(k + 1), 1.0) for k in range(4)}
    new = sim.method.aggregate(server, ups, {0: 1000.0, 1: 1.0, 2: 1.0, 3: 1.0})
    # 0.1 * 1 + 0.2 * 2 + 0.3 * 3 + 0.4 * 4 = 3.0, whatever the train sizes
    assert set(new["global"]) == set(sim.method.shared)
    assert all(torch.allclose(t, torch.full_like(t, 3.0)) for t in new["global"].values())
    # two of four upload: lambda renormalised over them, 0.2 / 0.6 and 0.4 / 0.6 of 2 and 4
    part = sim.method.aggregate(server, {1: ups[1], 3: ups[3]}, {1: 1.0, 3: 1.0})
    assert all(torch.allclose(t, torch.full_like(t, 2 / 3 + 8 / 3)) for t in part["global"].values())
    # only the two reporters step: (0.1, 0.2 + 0.01, 0.3, 0.4 + 0.01), less 0.02 / 4 each
    assert _close(part["lambda"], [0.095, 0.205, 0.295, 0.405])
    assert np.isnan(sim._arrays["agnostic_losses"][[0, 2]]).all()


def test_uploaders_without_weight_leave_the_model_and_still_raise_their_lambda(tiny):
    sim = _sim(tiny, "method.gamma_lambda=0.1")
    server = {**sim.server, "lambda": torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)}
    new = sim.method.aggregate(server, {2: _upload(sim, 7.0, 1.0), 3: _upload(sim, 9.0, 1.0)}, {2: 1.0, 3: 1.0})
    assert all(torch.equal(new["global"][key], sim.server["global"][key]) for key in sim.method.shared)
    # (0.5, 0.5, 0.1, 0.1), sum 1.2: each less 0.05
    assert _close(new["lambda"], [0.45, 0.45, 0.05, 0.05])


@pytest.mark.slow
def test_a_client_reports_the_received_models_train_loss_before_training_and_lambda_follows(tiny):
    sim = _sim(tiny)
    received = {k: sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k)) for k in range(4)}
    before = []
    for k in range(4):
        _, count, total = sim.trainer.evaluate(received[k], sim.clients[k]["train"])
        before.append(total / count)
    train_loss, _ = sim.run_round(1)
    reported = [float(sim.states[k][LOSS]) for k in range(4)]
    assert reported == pytest.approx(before, rel=1e-6)
    assert train_loss != pytest.approx(np.mean(before), rel=1e-3)  # not the local training loss
    # no entry clipped: lambda_k = 1/4 + gamma (L_k - mean L), gamma = 0.01
    L = np.array(before)
    assert sim.server["lambda"].numpy() == pytest.approx(0.25 + 0.01 * (L - L.mean()), abs=1e-7)
    assert int(sim.server["lambda"].argmax()) == int(np.argmax(L))


@pytest.mark.slow
def test_two_rounds_train_and_send_fedavgs_bytes_plus_one_float_up(tiny, capsys):
    sim = _sim(tiny)
    sent = record_uploads(sim)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # 10 classes: chance is 0.1
    assert records[-1].train_loss < records[0].train_loss
    W = CNN_FLOATS * 4
    assert [r.bytes_down_round for r in records] == [4 * W] * 2  # FedAvg's download
    assert [r.bytes_up_round for r in records] == [4 * (W + 4)] * 2  # FedAvg's upload + 4 bytes a client
    assert set(sent[0]) == set(sim.ctx.float_keys) | {LOSS}
    lam = records[-1].arrays["agnostic_lambda"]
    assert lam.shape == (4,) and lam.sum() == pytest.approx(1.0) and (lam >= 0).all()
    assert 0 < records[-1].diagnostics["agnostic_lambda_entropy"] <= math.log(4)
    sets = [a for s in tiny + ["method.name=agnostic_fl"] for a in ("--set", s)]
    assert main(["cost", *sets, "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert (cost["bytes_up"], cost["bytes_down"]) == (sim.meter.up, sim.meter.down)


def test_local_heads_are_kept_and_the_loss_still_travels(tiny):
    sim = _sim(tiny, "partition.permute_labels=true")
    assert set(sim.method.upload(0, sim.states[0])) == set(sim.ctx.float_keys) - set(sim.ctx.head_keys) | {LOSS}
    sim.run_round(1)
    assert not torch.equal(sim.states[0]["head.weight"], sim.states[1]["head.weight"])
    assert "head.weight" not in sim.server["global"]


@pytest.mark.parametrize("setting, key", [("method.gamma_lambda=-0.1", "gamma_lambda"),
                                          ("method.lambda_min=-0.1", "lambda_min"),
                                          ("method.lambda_min=0.3", "lambda_min"),  # 4 clients: at most 0.25
                                          ("method.gamma=1", "gamma")])
def test_bad_hyperparameters_are_refused_naming_the_key(tiny, setting, key):
    with pytest.raises(UsageError, match=key) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)
