import json
import math

import pytest
import torch
from torch import nn

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.fl.state import clone
from fedfactor.fl.train import Batch, Optim
from fedfactor.methods import METHODS, Context
from fedfactor.models import HeadedModel

MLP_FLOATS = 64 * 200 + 200 + 200 * 10 + 10  # mlp on 8x8 digits: Linear(64, 200), head Linear(200, 10)


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=pfedgate", *extra]))


def _mlp(tiny, *extra):
    """The tiny run with the mlp: the cnn's four gated layers at half scale learn too slowly for two rounds."""
    return _sim(tiny, "model.name=mlp", *extra)


def _softplus(v):
    return math.log1p(math.exp(v))


def _bound(momentum=0.0, **hp):
    """pFedGate on the Linear(4, 2) below, one batch of two samples labelled 1, SGD lr 1, and a client
    whose gate scores are fixed at 0.9, 0.95, 0.6, 0.3 for the blocks W row 0, W row 1, b_0, b_1
    (split 2): (method, state)."""
    method = METHODS.get("pfedgate")(split=2, gate_lr=0.5, **hp)
    backbone = HeadedModel(nn.Flatten(), nn.Linear(4, 2))
    with torch.no_grad():
        backbone.head.weight.copy_(torch.arange(1.0, 9.0).view(2, 4))
        backbone.head.bias.copy_(torch.tensor([1.0, -1.0]))
    model = method.prepare_model(backbone)
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]).view(2, 1, 2, 2)
    batch = Batch(x, torch.tensor([1, 1]))
    params = [k for k, _ in model.named_parameters()]
    ctx = Context(model=model, num_clients=1, train_sizes=[2], param_keys=params,
                  buffer_keys=[k for k, b in model.named_buffers() if b.is_floating_point()],
                  head_keys=["backbone.head.weight", "backbone.head.bias"], head_local=False, epochs=1,
                  optim=Optim("sgd", lr=1.0, momentum=momentum), fit=None, evaluate=None, split=None,
                  batches=lambda k, epochs=None, steps=None, split="train", seed=None: iter([batch]),
                  log=lambda n, v: None, input_shape=(1, 2, 2))
    method.bind(ctx)
    # as the simulator gives it: a copy of the model's initial entries, shared by every client
    state = method.init_client(0, clone(model.state_dict()))
    logits = [0.9, 0.95, 0.6, 0.3]
    state["gate.3.weight"] = torch.zeros(4)  # the gate says these scores whatever the input
    state["gate.3.bias"] = torch.tensor([math.log(p / (1 - p)) for p in logits])
    return method, state


def _one_step(**hp):
    """One local step of `_bound`'s client: (state, new, loss)."""
    method, state = _bound(**hp)
    new, loss = method.local_train(0, state, {})
    return state, new, loss


def test_one_step_trains_the_kept_blocks_and_the_gate_with_one_loss():
    # Linear(4, 2) on 1x2x2 inputs, W = [[1, 2, 3, 4], [5, 6, 7, 8]], b = [1, -1]; split 2, s = 0.8,
    # the paper's style: weights 0.9, 0 (does not fit the budget), 0.6, 0.5 (floored): reparam/test_gate.py
    # works these out.
    state, new, loss = _one_step(sparsity=0.8, style="paper")
    # gated logits (5.1, -0.5) and (9.6, -0.5), both labelled 1: dL/dz_n = (s_n, -s_n) / 2, s_n = sigmoid(gap)
    s1, s2 = 1 / (1 + math.exp(-5.6)), 1 / (1 + math.exp(-10.1))
    assert loss == pytest.approx((_softplus(5.6) + _softplus(10.1)) / 2, rel=1e-6)
    g = (s1 * torch.tensor([1.0, 0.0, 0.0, 1.0]) + s2 * torch.ones(4)) / 2  # dL/d(gated row 0)
    # SGD lr 1 on the shared weights: gradients scaled by the block's weight; the dropped row stays
    assert torch.allclose(new["backbone.head.weight"][0], torch.tensor([1.0, 2, 3, 4]) - 0.9 * g, atol=1e-6)
    assert torch.equal(new["backbone.head.weight"][1], torch.tensor([5.0, 6, 7, 8]))
    assert torch.allclose(new["backbone.head.bias"], torch.tensor([1 - 0.3 * (s1 + s2), -1 + 0.25 * (s1 + s2)]),
                          atol=1e-6)
    # the gate, lr 0.5, in the same step: d/d(logit_j) = sigmoid' x sum over block j of W * dL/d(gated W);
    # nothing reaches the dropped block, nor the floored one (its score is below the floor)
    shift = new["gate.3.bias"] - state["gate.3.bias"]
    expected = torch.tensor([-0.5 * 0.9 * 0.1 * (5 * s1 + 10 * s2) / 2, 0.0, -0.5 * 0.6 * 0.4 * (s1 + s2) / 2, 0.0])
    assert torch.allclose(shift, expected, atol=1e-6)
    assert torch.equal(state["backbone.head.weight"], torch.arange(1.0, 9.0).view(2, 4))  # input untouched


def test_one_official_step_scales_by_raw_scores_and_adds_the_codes_straight_through_gradient():
    # s = 0.9 in the code's way (reparam/test_gate.py): weights 0.9, 0 (W row 1 dropped), 0.6, 0.3 (raw).
    # Gated logits (5.1, -0.3) and (9.6, -0.3), both labelled 1: gaps 5.4 and 9.9.
    state, new, loss = _one_step(sparsity=0.9)
    s1, s2 = 1 / (1 + math.exp(-5.4)), 1 / (1 + math.exp(-9.9))
    assert loss == pytest.approx((_softplus(5.4) + _softplus(9.9)) / 2, rel=1e-6)
    g = (s1 * torch.tensor([1.0, 0.0, 0.0, 1.0]) + s2 * torch.ones(4)) / 2
    assert torch.allclose(new["backbone.head.weight"][0], torch.tensor([1.0, 2, 3, 4]) - 0.9 * g, atol=1e-6)
    assert torch.equal(new["backbone.head.weight"][1], torch.tensor([5.0, 6, 7, 8]))
    assert torch.allclose(new["backbone.head.bias"], torch.tensor([1 - 0.3 * (s1 + s2), -1 + 0.15 * (s1 + s2)]),
                          atol=1e-6)
    # the gate, lr 0.5: p(1 - p) x sum over the block of W * dL/d(gated W), times 1 + p for the kept
    # blocks above the floor 0.5 (W row 0: 1.9, b_0: 1.6); b_1 (0.3, below the floor) learns through its
    # raw score only; the dropped block gets nothing
    shift = new["gate.3.bias"] - state["gate.3.bias"]
    expected = -0.5 * torch.tensor([0.9 * 0.1 * 1.9 * (5 * s1 + 10 * s2) / 2, 0.0,
                                     0.6 * 0.4 * 1.6 * (s1 + s2) / 2, 0.3 * 0.7 * (s1 + s2) / 2])
    assert torch.allclose(shift, expected, atol=1e-6)


def test_each_client_keeps_its_optimizer_state_between_rounds_and_never_sends_it():
    # SGD lr 1, momentum 0.9: a round's first step leaves its gradient as the momentum buffer, which
    # the client's next round adds, times 0.9, to its first step (the code keeps each client's
    # optimizers); with keep_optimizer off the next round starts without it.
    runs = {}
    for keep in (True, False):
        method, state = _bound(momentum=0.9, sparsity=0.9, keep_optimizer=keep)
        first, _ = method.local_train(0, state, {})
        runs[keep] = first, method.local_train(0, first, {})[0]
    (first, kept), (_, restarted) = runs[True], runs[False]
    params = ["backbone.head.weight", "backbone.head.bias", "gate.0.weight", "gate.0.bias", "gate.0.mean_weight",
              "gate.0.var_weight", "gate.2.weight", "gate.2.bias", "gate.3.weight", "gate.3.bias"]
    assert sorted(k for k in first if k.startswith("optim.")) == sorted(
        f"optim.pfedgate.{n}.momentum_buffer" for n in params)
    assert not any(k.startswith("optim.") for k in runs[False][0])
    buf = first["optim.pfedgate.backbone.head.weight.momentum_buffer"]
    assert torch.allclose(buf, torch.arange(1.0, 9.0).view(2, 4) - first["backbone.head.weight"], atol=1e-6)
    assert buf[0].abs().sum() > 0 and torch.equal(buf[1], torch.zeros(4))  # W row 1 is dropped
    for name, lr in (("backbone.head.weight", 1.0), ("gate.3.bias", 0.5)):  # the gate's own lr
        assert torch.allclose(restarted[name] - kept[name],
                              lr * 0.9 * first[f"optim.pfedgate.{name}.momentum_buffer"], atol=1e-6)
    assert not any(k.startswith("optim.") for k in method.upload(0, kept))


def test_the_gate_is_never_sent_and_the_shared_model_is_averaged_as_fedavg(tiny):
    sim = _mlp(tiny)
    m = sim.method
    gate = {k for k in sim.ctx.float_keys if k.startswith("gate.")}
    assert gate and {"gate.2.weight", "gate.3.running_mean", "gate.0.mean_weight"} <= gate
    assert set(m.upload(0, sim.states[0])) == set(sim.ctx.float_keys) - gate == {
        "backbone.body.1.weight", "backbone.body.1.bias", "backbone.head.weight", "backbone.head.bias"}
    assert set(m.download(sim.server, 0)) == set(sim.ctx.float_keys) - gate
    # client k holds k + 1 everywhere; sample weights 1, 1, 2, 4: (1 + 2 + 6 + 16) / 8
    uploads = {k: {key: torch.full_like(v, k + 1.0) for key, v in m.upload(k, s).items()}
               for k, s in enumerate(sim.states)}
    server = m.aggregate(m.init_server(sim.init), uploads, {0: 1.0, 1: 1.0, 2: 2.0, 3: 4.0})
    assert all(torch.allclose(v, torch.full_like(v, 25 / 8)) for v in server["global"].values())
    own = {**sim.states[2], "gate.2.bias": torch.full_like(sim.states[2]["gate.2.bias"], 7.0)}
    mine = m.receive(2, own, m.download(server, 2))
    assert torch.equal(mine["gate.2.bias"], own["gate.2.bias"])
    assert torch.equal(mine["backbone.head.bias"], torch.full((10,), 25 / 8))
    permuted = _mlp(tiny, "partition.permute_labels=true")  # heads local: the gated head stays home too
    assert set(permuted.method.upload(0, permuted.states[0])) == {"backbone.body.1.weight", "backbone.body.1.bias"}


def test_two_rounds_train_send_the_shared_model_and_personalise_the_gates(tiny):
    sim = _mlp(tiny)
    records = sim.run()
    assert records[-1].train_loss < records[0].train_loss and records[-1].test.mean > 0.2  # chance: 0.1
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [
        4 * MLP_FLOATS * 4] * 2  # clients x shared floats x 4 B: what FedAvg sends
    start = sim.method.gate_init["gate.3.bias"]
    trained = [s["gate.3.bias"] for s in sim.states]
    assert not torch.equal(trained[0], start) and not torch.equal(trained[0], trained[1])


def test_every_client_starts_from_the_same_gate_sized_by_the_input(tiny):
    sim = _sim(tiny)
    blocks = 8 * 5  # the cnn's 8 tensors, 5 blocks each (all hold at least 5 entries)
    assert sim.states[0]["gate.2.weight"].shape == (blocks, 1 * 8 * 8)
    assert all(torch.equal(s["gate.2.weight"], sim.states[0]["gate.2.weight"]) for s in sim.states)
    other = _sim(tiny, "seed=1")
    assert not torch.equal(other.states[0]["gate.2.weight"], sim.states[0]["gate.2.weight"])
    assert sim.method.analysed_layers() == {3: "backbone.body.7"}  # the gate's own Linear is not counted


def test_fedfactor_cost_is_fedavgs(tiny, capsys):
    sets = [a for s in tiny for a in ("--set", s)]
    costs = []
    for name in ("fedavg", "pfedgate"):
        assert main(["cost", *sets, "--set", f"method.name={name}", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        costs.append((out["bytes_up"], out["bytes_down"]))
    cnn_floats = (32 * 25 + 32) + (64 * 32 * 25 + 64) + (512 * 256 + 512) + (10 * 512 + 10)
    assert costs[1] == costs[0] == (2 * 4 * cnn_floats * 4,) * 2


def test_a_new_client_gets_the_initial_gate_and_the_global_model(tiny):
    sim = _mlp(tiny, "eval.new_clients=0.25", "fl.rounds=1")
    sim.run()
    (k,) = sim.newcomers
    sim.ctx.round, sim._generators = sim.round, {}
    models = sim.method.new_client_models(sim.server, k, sim.method.init_client(k, sim.init), lambda: [])
    received = models["received"]
    assert all(torch.equal(received[key], v) for key, v in sim.method.gate_init.items())
    assert all(torch.equal(received[key], v) for key, v in sim.server["global"].items())
    assert not torch.equal(models["finetune"]["gate.3.bias"], received["gate.3.bias"])


@pytest.mark.parametrize("bad, key", [
    ("method.sparsity=0", "method.sparsity"), ("method.sparsity=1.5", "method.sparsity"),
    ("method.split=0", "method.split"), ("method.gate_lr=0", "method.gate_lr"),
    ("method.gate_lr=fast", "method.gate_lr"), ("method.clip=-1", "method.clip"), ("method.mask=1", "mask"),
    ("method.style=text", "method.style"),
    ("method.split=1", "method.split"),  # the code's budget (s - floor) x entries is 0: every block dropped
])
def test_bad_hyperparameters_are_one_line_usage_errors(tiny, bad, key):
    with pytest.raises(UsageError) as e:
        _sim(tiny, bad)
    assert key in str(e.value) and "\n" not in str(e.value)
