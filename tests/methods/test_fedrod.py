import json
import math

import pytest
import torch
from torch import nn

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Batch, Optim, Split
from fedfactor.methods import METHODS, Context
from fedfactor.methods.fedrod import TwoHeads, balanced_cross_entropy, class_log_prior
from fedfactor.models import HeadedModel, resolve_layers

# cnn on digits: body.0 (conv 1->32, 5x5), body.3 (conv 32->64, 5x5), body.7 (fc 256->512), head (fc 512->10)
BODY_FLOATS = (32 * 25 + 32) + (64 * 32 * 25 + 64) + (512 * 256 + 512)
HEAD_FLOATS = 512 * 10 + 10
HEAD = {"head.weight", "head.bias"}
PHEAD = {"phead.weight", "phead.bias"}


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedrod", *extra]))


def _scalar_model():
    """z = w x with w = 1; generic head g = (z, -z); personal head p = (2 z, 0); all biases zero."""
    model = TwoHeads(HeadedModel(nn.Linear(1, 1, bias=False), nn.Linear(1, 2)))
    state = {"body.weight": torch.ones(1, 1), "head.weight": torch.tensor([[1.0], [-1.0]]), "head.bias": torch.zeros(2),
             "phead.weight": torch.tensor([[2.0], [0.0]]), "phead.bias": torch.zeros(2)}
    return model, state


def _bind(method, model, batches, train_labels):
    params = [k for k, _ in model.named_parameters()]
    split = Split(torch.arange(len(train_labels)), torch.tensor(train_labels))
    ctx = Context(model=model, num_clients=1, train_sizes=[len(train_labels)], param_keys=params, buffer_keys=[],
                  head_keys=["head.weight", "head.bias"], head_local=False, epochs=1, optim=Optim("sgd", lr=1.0),
                  fit=None, evaluate=None, split=lambda k, name: split,
                  batches=lambda k, epochs=None, steps=None, split="train": iter(batches), log=lambda n, v: None)
    method.bind(ctx)


def test_the_balanced_loss_shifts_logits_by_the_log_class_prior():
    # train labels 0, 0, 1, 1, 1, 2: prior (1/3, 1/2, 1/6)
    log_prior = class_log_prior(torch.tensor([0, 0, 1, 1, 1, 2]), 3)
    assert torch.allclose(log_prior.exp(), torch.tensor([1 / 3, 1 / 2, 1 / 6]))
    # logits (0, 0, 0), label 2: shifted softmax is the prior itself, the loss -log(1/6)
    y = torch.tensor([2])
    assert balanced_cross_entropy(torch.zeros(1, 3), y, log_prior).item() == pytest.approx(math.log(6), rel=1e-6)
    # logits (log 3, 0, log 6): shifted (0, log 1/2, 0) -> softmax (2/5, 1/5, 2/5); label 2: log(5/2)
    z = torch.tensor([[math.log(3), 0.0, math.log(6)]], requires_grad=True)
    loss = balanced_cross_entropy(z, y, log_prior)
    assert loss.item() == pytest.approx(math.log(5 / 2), rel=1e-6)
    loss.backward()
    assert torch.allclose(z.grad, torch.tensor([[0.4, 0.2, -0.6]]), atol=1e-6)


def test_a_class_the_client_lacks_gets_no_gradient_and_no_nan():
    # labels 0, 0, 0, 1: prior (3/4, 1/4, 0); logits (0, log 3, 5), label 1: shifted (log 3/4, log 3/4, -inf)
    log_prior = class_log_prior(torch.tensor([0, 0, 0, 1]), 3)
    z = torch.tensor([[0.0, math.log(3), 5.0]], requires_grad=True)
    loss = balanced_cross_entropy(z, torch.tensor([1]), log_prior)
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert torch.allclose(z.grad, torch.tensor([[0.5, -0.5, 0.0]]), atol=1e-6)


def test_a_client_predicts_with_the_sum_of_both_heads():
    model, state = _scalar_model()
    out = torch.func.functional_call(model, state, (torch.tensor([[1.0], [-2.0]]),))
    # g = (z, -z), p = (2 z, 0): g + p = (3 z, -z)
    assert torch.allclose(out, torch.tensor([[3.0, -1.0], [-6.0, 2.0]]))
    assert set(model.state_dict()) == {"body.weight", *HEAD, *PHEAD}


@pytest.mark.parametrize("body_loss", ["generic", "both"])
def test_one_step_trains_body_and_generic_head_on_the_balanced_loss_and_the_personal_head_on_top(body_loss):
    method = METHODS.get("fedrod")(body_loss=body_loss)
    model, state = _scalar_model()
    _bind(method, model, [Batch(torch.ones(1, 1), torch.tensor([0]))], train_labels=[0, 0, 0, 1])
    new, loss = method.local_train(0, state, {})
    # Balanced loss: g = (1, -1), log prior (log 3/4, log 1/4): softmax q0 = 3e^2 / (3e^2 + 1);
    # dL/dg = (-a, a), a = 1 / (3e^2 + 1); head rows move by +-a; dL/dz = (1, -1) . (-a, a) = -2a.
    # Personal loss on g.detach() + p = (3, -1): dL/dp = (-b, b), b = 1 / (e^4 + 1); dL/dz via phead = 2 (-b).
    # SGD, lr 1, x = z = 1:
    a, b = 1 / (3 * math.e**2 + 1), 1 / (math.e**4 + 1)
    assert torch.allclose(new["head.weight"], torch.tensor([[1 + a], [-1 - a]]), atol=1e-6)
    assert torch.allclose(new["head.bias"], torch.tensor([a, -a]), atol=1e-6)  # not moved by the personal loss
    assert torch.allclose(new["phead.weight"], torch.tensor([[2 + b], [-b]]), atol=1e-6)
    assert torch.allclose(new["phead.bias"], torch.tensor([b, -b]), atol=1e-6)
    body = 1 + 2 * a + (2 * b if body_loss == "both" else 0.0)  # generic: features detached for the personal head
    assert new["body.weight"].item() == pytest.approx(body, rel=1e-6)
    # reported apart: the personal loss (of the prediction g + p) as the loss, the balanced one as a term
    assert loss == pytest.approx(math.log(1 + math.exp(-4)), abs=1e-7)
    assert loss.terms == {"balanced": pytest.approx(math.log(1 + 1 / (3 * math.e**2)), abs=1e-7)}
    assert torch.equal(state["head.bias"], torch.zeros(2))  # the input state is not touched


def test_body_and_generic_head_are_sent_the_personal_head_never_is(tiny):
    sim = _sim(tiny)
    m = sim.method
    assert set(sim.ctx.head_keys) == HEAD  # the personal head is not the model's classifier
    assert set(m.upload(0, sim.states[0])) == set(sim.ctx.float_keys) - PHEAD
    assert torch.equal(sim.init["phead.weight"], sim.init["head.weight"])  # starts as a copy of the generic head
    # client 0 holds 0.5 everywhere, client 1 holds 2.0; weights 2 and 1: the mean is 1
    states = {k: {key: torch.full_like(v, value) for key, v in sim.states[k].items()}
              for k, value in ((0, 0.5), (1, 2.0))}
    server = m.aggregate(m.init_server(sim.init), {k: m.upload(k, s) for k, s in states.items()}, {0: 2.0, 1: 1.0})
    mine = m.receive(1, states[1], m.download(server, 1))
    assert torch.equal(mine["head.weight"], torch.ones_like(mine["head.weight"]))
    assert torch.equal(mine["body.7.weight"], torch.ones_like(mine["body.7.weight"]))
    assert torch.equal(mine["phead.weight"], states[1]["phead.weight"])
    # permuted labels: a shared generic head would mix classes, so both heads stay
    permuted = _sim(tiny, "partition.permute_labels=true")
    assert set(permuted.method.upload(0, permuted.states[0])) == set(permuted.ctx.float_keys) - PHEAD - HEAD


@pytest.mark.slow
def test_two_rounds_train_and_send_what_fedavg_sends(tiny):
    sim = _sim(tiny)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    assert records[-1].train_loss < records[0].train_loss
    assert [set(r.loss_terms) for r in records] == [{"balanced"}] * 2  # metrics.csv: train_balanced
    fedavg_bytes = 4 * (BODY_FLOATS + HEAD_FLOATS) * 4  # clients x floats x 4 B
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [fedavg_bytes] * 2
    assert sim.meter.up == sim.meter.down == 2 * fedavg_bytes
    # each client kept a personal head of its own
    assert not torch.equal(sim.states[0]["phead.weight"], sim.states[1]["phead.weight"])
    assert not torch.equal(sim.states[0]["phead.weight"], sim.init["phead.weight"])


def test_cost_is_fedavgs(tiny, capsys):
    sets = [a for s in tiny for a in ("--set", s)]
    costs = []
    for name in ("fedavg", "fedrod"):
        assert main(["cost", *sets, "--set", f"method.name={name}", "--json"]) == 0
        costs.append(json.loads(capsys.readouterr().out))
    assert costs[0]["bytes_up"] == costs[1]["bytes_up"] == 2 * 4 * (BODY_FLOATS + HEAD_FLOATS) * 4
    assert costs[0]["bytes_down"] == costs[1]["bytes_down"]


def test_a_new_client_has_the_generic_model_as_a_strategy(tiny):
    sim = _sim(tiny, "fl.clients=5", "eval.new_clients=0.2", "fl.rounds=1")
    sim.run()
    k = sim.newcomers[0]
    models = sim.method.new_client_models(sim.server, k, sim.method.init_client(k, sim.init), lambda: [])
    assert {"received", "finetune", "generic"} <= set(models)
    generic = models["generic"]
    assert all(torch.equal(generic[key], sim.server["global"][key]) for key in sim.server["global"])
    assert not generic["phead.weight"].any() and not generic["phead.bias"].any()
    assert "generic" in sim.evaluate_new_clients()


def test_the_analysed_layer_is_the_backbones_last_before_the_classifier(tiny):
    sim = _sim(tiny)
    assert sim.method.analysed_layers() == resolve_layers(Simulator(load_config(None, tiny)).model, [-1])


@pytest.mark.parametrize("bad, key", [("method.body_loss=personal", "method.body_loss"),
                                      ("method.gamma=1", "gamma")])
def test_bad_hyperparameters_are_one_line_usage_errors(tiny, bad, key):
    with pytest.raises(UsageError) as e:
        _sim(tiny, bad)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_a_model_without_body_and_head_is_refused():
    with pytest.raises(UsageError, match="body and a head"):
        METHODS.get("fedrod")().prepare_model(nn.Linear(2, 2))
