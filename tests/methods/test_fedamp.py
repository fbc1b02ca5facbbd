import json

import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Batch
from fedfactor.analysis.similarity import attention, mix, squared_distances

CNN_FLOATS = 188810  # every float entry of the tiny cnn (digits, 10 classes); it has no BatchNorm

# Three clients' 2-vectors: squared distances d01 = 1, d02 = 4, d12 = 5. With alpha = 0.5, sigma = 1:
# xi_kj = 0.5 exp(-d_kj), xi_kk = 1 - the others; exp(-1) = 0.36787944, exp(-4) = 0.01831564, exp(-5) = 0.00673795.
W = [[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]
XI = [[0.80690246, 0.18393972, 0.00915782],
      [0.18393972, 0.81269131, 0.00336897],
      [0.00915782, 0.00336897, 0.98747321]]
# u_k = sum_j xi_kj w_j: u_0 = (xi_01, 2 xi_02), u_1 = (xi_11, 2 xi_12), u_2 = (xi_21, 2 xi_22)
U = [[0.18393972, 0.01831564], [0.81269131, 0.00673795], [0.00336897, 1.97494642]]


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedamp", *extra]))


def test_attention_weights_and_cloud_models_by_hand():
    models = [{"w": torch.tensor(w)} for w in W]
    d = squared_distances(models, ["w"])
    assert torch.allclose(d, torch.tensor([[0, 1, 4], [1, 0, 5], [4, 5, 0]], dtype=torch.float64))
    xi = attention(d, alpha=0.5, sigma=1.0)
    assert torch.allclose(xi, torch.tensor(XI, dtype=torch.float64), atol=1e-8)
    for k in range(3):
        assert torch.allclose(mix(models, xi[k])["w"], torch.tensor(U[k]), atol=1e-6)
    # sigma stretches the distances: sigma = 2 gives xi_01 = 0.5 exp(-1/2) / 2 = 0.15163266
    assert attention(d, alpha=0.5, sigma=2.0)[0, 1].item() == pytest.approx(0.15163266, rel=1e-7)


def test_server_builds_each_clients_cloud_model_from_every_latest_upload(tiny):
    sim = _sim(tiny, "fl.clients=3", "method.alpha=0.5", "method.sigma=1", "method.alpha_decay_every=0")
    m = sim.method
    init = sim.server["init"]
    # before any upload every client's cloud model is the initial model
    assert all(torch.equal(m.download(sim.server, 1)[key], init[key]) for key in init)
    uploads = {}
    for k, w in enumerate(W):  # the clients differ only in head.bias[:2]
        uploads[k] = {key: t.clone() for key, t in init.items()}
        uploads[k]["head.bias"][:2] += torch.tensor(w)
    sim.ctx.round = 1
    server = m.aggregate(sim.server, uploads, {k: 1.0 for k in uploads})
    for k in range(3):
        u = m.download(server, k)
        assert torch.allclose(u["head.bias"][:2] - init["head.bias"][:2], torch.tensor(U[k]), atol=1e-6)
        assert torch.allclose(u["body.3.weight"], init["body.3.weight"], atol=1e-6)  # equal everywhere else
    assert torch.allclose(torch.as_tensor(sim._arrays["amp_attention"]), torch.tensor(XI, dtype=torch.float64))
    assert sim._scalars["amp_self_weight_min"] == pytest.approx(0.80690246)
    # a client that sits a round out keeps its last upload on the server
    later = m.aggregate(server, {0: uploads[1]}, {0: 1.0})
    assert torch.equal(later["models"]["2"]["head.bias"], uploads[2]["head.bias"])
    assert later["distances"][0, 1].item() == pytest.approx(0.0)


def test_alpha_decays_tenfold_every_30_rounds_and_sets_the_proximal_weight(tiny):
    m = _sim(tiny).method
    assert [m.alpha_k(r) for r in (1, 30, 31, 60, 61)] == pytest.approx([1e4, 1e4, 1e3, 1e3, 1e2])
    assert _sim(tiny, "method.alpha_decay_every=0").method.alpha_k(300) == 1e4
    # lam / (2 alpha) ||w - u||^2 with lam = 2, alpha = 4: 0.25 x (three entries off by 1) = 0.75
    sim = _sim(tiny, "method.lam=2", "method.alpha=4")
    sim.ctx.round = 1
    u = {key: sim.states[0][key] for key in sim.method.keys}
    params = dict(u)
    params["head.bias"] = u["head.bias"] + torch.tensor([1.0, -1.0, 1.0] + [0.0] * 7)
    loss = sim.method.plan(0, sim.states[0], u)[0].loss
    assert loss(params, Batch(torch.zeros(1), torch.zeros(1)), None).item() == pytest.approx(0.75)


def test_a_large_lambda_keeps_the_client_at_its_cloud_model(tiny):
    def distance_after_training(*extra):
        sim = _sim(tiny, "fl.momentum=0", "method.alpha=1", "method.alpha_decay_every=0", *extra)
        sim.ctx.round = 1
        state = sim.states[0]
        u = {key: 0.5 * state[key] for key in sim.method.keys}  # an anchor away from the start
        trained, _ = sim.method.local_train(0, sim.method.receive(0, state, u), u)
        return sum(float(((trained[key] - u[key]) ** 2).sum()) for key in u) ** 0.5, state, u

    free, state, u = distance_after_training("method.lam=0")
    # lam / (2 alpha) = 10 and lr 0.05: each step lands on u up to its cross-entropy step
    pulled, _, _ = distance_after_training("method.lam=20")
    start = sum(float(((state[key] - u[key]) ** 2).sum()) for key in u) ** 0.5
    assert free > 0.9 * start
    assert pulled < 0.05 * start


@pytest.mark.slow
def test_two_rounds_train_the_own_model_and_cost_what_fedavg_costs(tiny, capsys):
    sim = _sim(tiny)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    assert [set(r.loss_terms) for r in records] == [{"proximal"}] * 2  # metrics.csv: train_proximal
    per_round = 4 * CNN_FLOATS * 4  # 4 clients x one model x 4 bytes, each way
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [per_round] * 2
    # the client is scored with its own model: receiving the cloud model does not replace it
    received = sim.method.receive(0, sim.states[0], sim.method.download(sim.server, 0))
    assert all(torch.equal(received[key], sim.states[0][key]) for key in sim.states[0])
    assert records[-1].arrays["amp_attention"].shape == (4, 4)
    sets = [a for s in tiny + ["method.name=fedamp"] for a in ("--set", s)]
    assert main(["cost", *sets, "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert (cost["bytes_up"], cost["bytes_down"]) == (sim.meter.up, sim.meter.down)


def test_batchnorm_statistics_and_local_heads_stay_home(tiny):
    sim = _sim(tiny, "model.name=resnet8", "partition.permute_labels=true")
    sent = set(sim.method.upload(0, sim.states[0]))
    assert sent == set(sim.ctx.param_keys) - set(sim.ctx.head_keys)
    assert not any("running" in key for key in sent)


@pytest.mark.parametrize("setting, key", [("method.sigma=0", "sigma"), ("method.alpha=-1", "alpha"),
                                          ("method.lam=-0.5", "lam"), ("method.alpha_decay=1.5", "alpha_decay"),
                                          ("method.alpha_decay_every=-1", "alpha_decay_every"),
                                          ("method.gamma=1", "gamma")])
def test_bad_hyperparameters_are_refused_naming_the_key(tiny, setting, key):
    with pytest.raises(UsageError, match=key) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)
