import json
import math

import pytest
import torch
from torch import nn

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Batch, Diverged, Optim, derive_seed
from fedfactor.methods import METHODS, Context
from fedfactor.methods.per_fedavg import ADAPTATION_STREAM
from fedfactor.models import HeadedModel

from ..conftest import record_uploads

SIG1 = 1 / (1 + math.exp(-1))  # sigmoid(1)
# The constructed case: a 2-class linear classifier without bias, W (2x1) = 0, scalar inputs.
D = Batch(torch.tensor([[1.0]]), torch.tensor([0]))  # inner batch
D1 = Batch(torch.tensor([[2.0]]), torch.tensor([1]))  # outer batch D'
D2 = Batch(torch.tensor([[1.0]]), torch.tensor([1]))  # Hessian batch D''


def _bound(batches, **hp):
    """A Per-FedAvg bound to a hand-built Context whose batches service yields `batches`."""
    model = HeadedModel(nn.Flatten(), nn.Linear(1, 2, bias=False))
    ctx = Context(model=model, num_clients=1, train_sizes=[len(batches)], param_keys=["head.weight"],
                  buffer_keys=[], head_keys=["head.weight"], head_local=False, epochs=1, optim=Optim("sgd", lr=0.01),
                  fit=None, evaluate=None, split=None,
                  batches=lambda k, epochs=None, steps=None, split="train", seed=None: iter(batches),
                  log=lambda n, v: None)
    method = METHODS.get("per_fedavg")(**hp)
    method.bind(ctx)
    return method


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=per_fedavg", *extra]))


def _mlp(tiny, *extra):
    """The tiny run with the mlp: where the backbone plays no part, it keeps a test to a second."""
    return _sim(tiny, "model.name=mlp", *extra)


def test_fo_and_hf_meta_steps_match_the_hand_computed_update():
    # temp = 0 - 0.5 * grad f(0; D) = -0.5 * (softmax(0) - e0) * 1 = (0.25, -0.25)
    # on D' (x = 2, y = 1): z = (0.5, -0.5), p = (s, 1 - s) with s = sigmoid(1); grad = 2 (s, -s)
    # fo: W = -0.1 * 2 (s, -s); loss f(temp; D') = -log(1 - s) = log(1 + e)
    # hf: H(0; D'') = x^2 (diag(p) - p p^T), p = (.5, .5): [[.25, -.25], [-.25, .25]]; H grad = (s, -s)
    #     W = -0.1 * (2 (s, -s) - 0.5 (s, -s)) = -0.15 (s, -s)
    state = {"head.weight": torch.zeros(2, 1)}
    fo, loss = _bound([D, D1], alpha=0.5, beta=0.1).local_train(0, state, {})
    assert torch.allclose(fo["head.weight"], torch.tensor([[-0.2 * SIG1], [0.2 * SIG1]]), atol=1e-6)
    assert loss == pytest.approx(math.log(1 + math.e), rel=1e-6)
    hf, hf_loss = _bound([D, D1, D2], alpha=0.5, beta=0.1, variant="hf").local_train(0, state, {})
    assert torch.allclose(hf["head.weight"], torch.tensor([[-0.15 * SIG1], [0.15 * SIG1]]), atol=1e-6)
    # HF differs from FO by exactly beta * alpha * H grad f(temp; D')
    assert torch.allclose(hf["head.weight"] - fo["head.weight"], torch.tensor([[0.05 * SIG1], [-0.05 * SIG1]]),
                          atol=1e-6)
    assert hf_loss == loss
    assert torch.equal(state["head.weight"], torch.zeros(2, 1))  # the input state is not touched


def test_evaluation_state_is_one_alpha_step_on_one_batch():
    state = {"head.weight": torch.zeros(2, 1)}
    adapted = _bound([D, D1], alpha=0.5).evaluation_state(0, state)
    # -0.5 * (softmax(0) - e0) * x = -0.5 * (-0.5, 0.5)
    assert torch.allclose(adapted["head.weight"], torch.tensor([[0.25], [-0.25]]))
    assert torch.equal(state["head.weight"], torch.zeros(2, 1))


def test_evaluation_state_on_a_real_client_is_deterministic_and_leaves_training_alone(tiny):
    a, b, c = (_mlp(tiny, "method.alpha=0.1") for _ in range(3))
    stored = {key: v.clone() for key, v in a.states[2].items()}
    adapted = a.method.evaluation_state(2, a.states[2])
    assert all(torch.equal(a.states[2][key], stored[key]) for key in stored)  # the stored state is untouched
    assert all(torch.equal(adapted[key], t) for key, t in b.method.evaluation_state(2, b.states[2]).items())
    # the same batch however often the client is scored in a round
    assert all(torch.equal(adapted[key], t) for key, t in a.method.evaluation_state(2, a.states[2]).items())
    # what it is: one step of size alpha on the first batch of the client's adaptation stream,
    # computed here with the module's own forward and backward
    batch = next(c.ctx.batches(2, steps=1, seed=derive_seed(c.cfg.seed, c.ctx.round, 2, ADAPTATION_STREAM)))
    c.model.load_state_dict(c.states[2])
    c.model.zero_grad()
    nn.functional.cross_entropy(c.model(batch.x), batch.y).backward()
    for key, p in c.model.named_parameters():
        assert torch.allclose(adapted[key], stored[key] - 0.1 * p.grad, atol=1e-6)
    assert not torch.equal(adapted["head.weight"], stored["head.weight"])
    # scoring before a round does not change what the round trains
    fresh = _mlp(tiny, "method.alpha=0.1")
    trained = [record_uploads(sim) for sim in (a, fresh)]
    a.run_round(1)
    fresh.run_round(1)
    assert all(torch.equal(trained[0][k][key], trained[1][k][key]) for k in range(4) for key in a.ctx.param_keys)


@pytest.mark.parametrize("hp, per, expected", [([], 2, None), (["method.variant=hf"], 3, None),
                                               (["method.steps=3"], 2, 3)])
def test_a_round_takes_one_pass_per_epoch_in_groups_of_2_or_3_batches_or_tau_meta_steps(tiny, hp, per, expected):
    sim = _mlp(tiny, *hp)
    calls = []
    step = sim.method.meta_step
    sim.method.meta_step = lambda *a: calls.append(len(a[2])) or step(*a)
    sim.ctx.round = 1
    sim.method.local_train(0, sim.states[0], {})
    batches = math.ceil(sim.ctx.train_sizes[0] / 32)  # fl.batch_size=32, one epoch
    assert calls == [per] * (expected or math.ceil(batches / per))


@pytest.mark.slow
def test_two_rounds_train_and_send_what_fedavg_sends(tiny):
    sim = _sim(tiny)
    sent = record_uploads(sim)
    records = sim.run()
    assert records[-1].train_loss < records[0].train_loss
    assert records[-1].test.mean > 0.2  # ten classes: chance is 0.1
    floats = sum(v.numel() for k, v in sim.model.state_dict().items() if v.is_floating_point())
    assert set(sent[0]) == set(sim.ctx.float_keys)
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [4 * floats * 4] * 2


def test_the_hf_preset_and_fedfactor_cost(tiny, capsys):
    assert METHODS.get("per_fedavg_hf")().hp.variant == "hf"
    sets = [a for s in tiny for a in ("--set", s)]
    costs = []
    for name in ("fedavg", "per_fedavg", "per_fedavg_hf"):
        assert main(["cost", *sets, "--set", f"method.name={name}", "--json"]) == 0
        cost = json.loads(capsys.readouterr().out)
        costs.append((cost["bytes_up"], cost["bytes_down"]))
    assert costs[0] == costs[1] == costs[2]


def test_a_nan_loss_surfaces_as_divergence(tiny):
    sim = _mlp(tiny)
    sim.ctx.round = 1
    state = {**sim.states[0], "head.bias": torch.full_like(sim.states[0]["head.bias"], float("nan"))}
    with pytest.raises(Diverged, match="not finite"):
        sim.method.local_train(0, state, {})


@pytest.mark.parametrize("bad, key", [("method.alpha=0", "method.alpha"), ("method.beta=-1", "method.beta"),
                                      ("method.alpha=fast", "method.alpha"), ("method.variant=so", "method.variant"),
                                      ("method.steps=-1", "method.steps"), ("method.gamma=1", "gamma")])
def test_bad_hyperparameters_are_one_line_usage_errors(tiny, bad, key):
    with pytest.raises(UsageError) as e:
        _sim(tiny, bad)
    assert key in str(e.value) and "\n" not in str(e.value)
