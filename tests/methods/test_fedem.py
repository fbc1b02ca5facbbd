import json
import math

import pytest
import torch
from torch import nn

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Batch, Diverged, Optim
from fedfactor.methods import METHODS, Context
from fedfactor.methods.fedem import LOG_PI, Mixture, fit_mixture_weights, responsibilities
from fedfactor.models import HeadedModel


def _two_components(**hp):
    """FedEM's mixture of two 2-class linear classifiers of a scalar input, bound to a hand-built Context.

    Component 0 says p = (1/2, 1/2) for every x, component 1 p = (3/4, 1/4) (bias log 3); weights zero.
    """
    method = METHODS.get("fedem")(components=2, **hp)
    model = method.prepare_model(HeadedModel(nn.Flatten(), nn.Linear(1, 2)))
    state = {key: torch.zeros_like(v) for key, v in model.state_dict().items()}
    state["head.1.bias"] = torch.tensor([math.log(3), 0.0])
    state[LOG_PI] = torch.full((2,), math.log(0.5))
    return method, model, state


def _bind(method, model, batches):
    params = [k for k, _ in model.named_parameters()]
    ctx = Context(model=model, num_clients=1, train_sizes=[len(batches)], param_keys=params, buffer_keys=[LOG_PI],
                  head_keys=params, head_local=False, epochs=1, optim=Optim("sgd", lr=1.0), fit=None, evaluate=None,
                  split=None, batches=lambda k, epochs=None, steps=None, split="train": iter(batches),
                  log=lambda n, v: None)
    method.bind(ctx)


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedem", *extra]))


def _mlp(tiny, *extra):
    """The tiny run with the mlp: where the backbone plays no part, it keeps a test to seconds."""
    return _sim(tiny, "model.name=mlp", *extra)


def test_the_mixture_predicts_the_log_of_pi_weighted_class_probabilities():
    _, model, state = _two_components()
    state[LOG_PI] = torch.tensor([0.4, 0.6]).log()
    x = torch.tensor([[1.0], [-3.0]])
    out = torch.func.functional_call(model, state, (x,))
    # 0.4 (1/2, 1/2) + 0.6 (3/4, 1/4) = (0.65, 0.35), whatever x (the weights are zero)
    assert torch.allclose(out, torch.tensor([[0.65, 0.35]] * 2).log(), atol=1e-6)
    # so the standard scoring reads the mixture: cross-entropy is -log p(y), softmax gives p back
    assert nn.functional.cross_entropy(out, torch.tensor([1, 0])).item() == pytest.approx(
        -(math.log(0.35) + math.log(0.65)) / 2, rel=1e-6)
    assert torch.allclose(out.softmax(1), torch.tensor([[0.65, 0.35]] * 2), atol=1e-6)
    assert isinstance(model, Mixture) and model.head_name == "head"


def test_e_step_responsibilities_and_the_mixture_weights_by_hand():
    # pi = (1/2, 1/4, 1/4); sample 1 losses (0, log 2, 0): q ~ (1/2, 1/8, 1/4) = (4/7, 1/7, 2/7);
    # sample 2 losses (log 4, 0, 0): q ~ (1/8, 1/4, 1/4) = (1/5, 2/5, 2/5)
    q = responsibilities(torch.tensor([0.5, 0.25, 0.25]).log(),
                         torch.tensor([[0.0, math.log(2), 0.0], [math.log(4), 0.0, 0.0]]))
    assert torch.allclose(q, torch.tensor([[4 / 7, 1 / 7, 2 / 7], [0.2, 0.4, 0.4]]), atol=1e-6)
    # a new client's weights, components fixed: two samples (0.8, 0.2), one (0.2, 0.8) as p_m(y|x);
    # the likelihood's stationary point 2 * 0.6 / (0.2 + 0.6 pi) = 0.6 / (0.8 - 0.6 pi) is pi = 7/9
    losses = -torch.tensor([[0.8, 0.2], [0.8, 0.2], [0.2, 0.8]]).log()
    assert torch.allclose(fit_mixture_weights(losses, torch.tensor([0.5, 0.5])), torch.tensor([7 / 9, 2 / 9]),
                          atol=1e-4)


def test_a_round_weighs_each_component_by_the_round_start_responsibilities():
    method, model, state = _two_components()
    first = Batch(torch.tensor([[1.0]]), torch.tensor([0]))
    second = Batch(torch.tensor([[1.0]]), torch.tensor([1]))
    _bind(method, model, [first, second])
    new, loss = method.local_train(0, state, {})
    # E-step with the received components and pi = (1/2, 1/2):
    #   first (y = 0):  q ~ (1/2 * 1/2, 1/2 * 3/4) = (0.4, 0.6);  second (y = 1): q ~ (1/4, 1/8) = (2/3, 1/3)
    assert torch.allclose(new[LOG_PI].exp(), torch.tensor([(0.4 + 2 / 3) / 2, (0.6 + 1 / 3) / 2]), atol=1e-6)
    # M-step, SGD lr 1, x = 1: grad of q_m * CE_m w.r.t. weight and bias = q_m (p_m - e_y)
    #   first:  component 0 moves by -0.4 (-1/2, 1/2), component 1 by -0.6 (-1/4, 1/4)
    #   second: component 0 at z = (0.4, -0.4) moves by -(2/3) (s, -s), s = sigmoid(0.8);
    #           component 1 at z = (log 3 + 0.3, -0.3) by -(1/3) (t, -t), t = 1 / (1 + exp(-0.6) / 3)
    #   (the second step keeps the round-start q: responsibilities of the trained components would differ)
    s, t = 1 / (1 + math.exp(-0.8)), 1 / (1 + math.exp(-0.6) / 3)
    w0 = torch.tensor([0.2 - 2 / 3 * s, -0.2 + 2 / 3 * s])
    w1 = torch.tensor([0.15 - t / 3, -0.15 + t / 3])
    assert torch.allclose(new["head.0.weight"].view(-1), w0, atol=1e-6)
    assert torch.allclose(new["head.0.bias"], w0, atol=1e-6)
    assert torch.allclose(new["head.1.weight"].view(-1), w1, atol=1e-6)
    assert torch.allclose(new["head.1.bias"], w1 + torch.tensor([math.log(3), 0.0]), atol=1e-6)
    first_loss = 0.4 * math.log(2) + 0.6 * math.log(4 / 3)
    second_loss = -2 / 3 * math.log(1 - s) - 1 / 3 * math.log(1 - t)
    assert loss == pytest.approx((first_loss + second_loss) / 2, rel=1e-6)
    assert torch.equal(state["head.0.weight"], torch.zeros(2, 1))  # the input state is not touched


def test_components_are_sent_and_averaged_one_by_one_and_pi_never_leaves(tiny):
    sim = _mlp(tiny, "method.components=3")
    m = sim.method
    sent = set(m.upload(0, sim.states[0]))
    assert sent == set(sim.ctx.float_keys) - {LOG_PI} and LOG_PI not in m.download(sim.server, 0)
    assert {f"{part}.{c}." for key in sent for part, c in [key.split(".")[:2]]} == {
        f"{part}.{c}." for part in ("body", "head") for c in range(3)}
    # components 2 and 3 start elsewhere than component 1 (identical ones would stay identical)
    assert not torch.equal(sim.init["body.0.1.weight"], sim.init["body.1.1.weight"])
    # client k holds k + 10 m in every entry of component m; sizes 1, 1, 2, 4: mean (0 + 1 + 4 + 12) / 8 + 10 m
    uploads = {k: {key: torch.full_like(v, k + 10 * int(key.split(".")[1])) for key, v in m.upload(k, s).items()}
               for k, s in enumerate(sim.states)}
    server = m.aggregate(m.init_server(sim.init), uploads, {0: 1.0, 1: 1.0, 2: 2.0, 3: 4.0})
    for key, value in server["global"].items():
        assert torch.allclose(value, torch.full_like(value, 17 / 8 + 10 * int(key.split(".")[1])))
    # a client takes the averaged components and keeps its own mixture weights
    mine = m.receive(1, {**sim.states[1], LOG_PI: torch.tensor([0.1, 0.2, 0.7]).log()}, m.download(server, 1))
    assert torch.allclose(mine[LOG_PI].exp(), torch.tensor([0.1, 0.2, 0.7]))
    assert torch.allclose(mine["head.2.bias"], torch.full((10,), 17 / 8 + 20))


def test_under_permuted_labels_every_component_keeps_its_head(tiny):
    sim = _mlp(tiny, "partition.permute_labels=true")
    heads = {f"head.{c}.{p}" for c in range(3) for p in ("weight", "bias")}
    assert set(sim.ctx.head_keys) == heads
    assert set(sim.method.upload(0, sim.states[0])) == set(sim.ctx.float_keys) - heads - {LOG_PI}


def test_one_component_is_fedavg(tiny):
    fedem, fedavg = _mlp(tiny, "method.components=1"), _mlp(tiny, "method.name=fedavg")
    fedem.run()
    fedavg.run()
    for key, value in fedavg.server["global"].items():
        part, rest = key.split(".", 1)
        assert torch.allclose(fedem.server["global"][f"{part}.0.{rest}"], value, atol=1e-5)


def test_two_rounds_train_and_send_m_times_what_fedavg_sends(tiny):
    sim = _mlp(tiny)  # 3 components; the cnn's bytes: test_fedfactor_cost_is_m_times_fedavg
    records = sim.run()
    assert records[-1].train_loss < records[0].train_loss and records[-1].test.mean > 0.2  # chance: 0.1
    fedavg_floats = 64 * 200 + 200 + 200 * 10 + 10  # mlp on 8x8 digits: Linear(64, 200) + head Linear(200, 10)
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [
        3 * 4 * fedavg_floats * 4] * 2  # components x clients x floats x 4 B
    pis = torch.stack([s[LOG_PI].exp() for s in sim.states])
    assert torch.allclose(pis.sum(1), torch.ones(4)) and not torch.allclose(pis, torch.full((4, 3), 1 / 3))


def test_fedfactor_cost_is_m_times_fedavg(tiny, capsys):
    sets = [a for s in tiny for a in ("--set", s)]
    costs = []
    for extra in (["method.name=fedavg"], ["method.name=fedem"], ["method.name=fedem", "method.components=5"]):
        assert main(["cost", *sets, *[a for s in extra for a in ("--set", s)], "--json"]) == 0
        costs.append(json.loads(capsys.readouterr().out)["bytes_up"])
    assert costs[1] == 3 * costs[0] and costs[2] == 5 * costs[0]


def test_a_new_client_fits_its_mixture_weights_to_the_received_components(tiny):
    sim = _mlp(tiny, "eval.new_clients=0.25", "fl.rounds=1")
    sim.run()
    (k,) = sim.newcomers
    sim.ctx.round, sim._generators = sim.round, {}
    models = sim.method.new_client_models(sim.server, k, sim.method.init_client(k, sim.init), lambda: [])
    assert {"received", "finetune", "localtrain"} <= set(models)
    local, received = models["localtrain"], models["received"]
    assert all(torch.equal(local[key], received[key]) for key in sim.method.shared)  # components fixed
    # the weights EM reaches on the client's data, its losses computed here by the module's own forward
    split = sim.clients[k]["train"]
    sim.model.load_state_dict(received)
    sim.model.eval()
    with torch.no_grad():
        logits = sim.model(sim.x[split.idx], per_component=True)
    losses = torch.stack([nn.functional.cross_entropy(z, split.y, reduction="none") for z in logits], 1)
    expected = fit_mixture_weights(losses, torch.full((3,), 1 / 3))
    assert torch.allclose(local[LOG_PI].exp(), expected, atol=1e-5)
    assert not torch.allclose(expected, torch.full((3,), 1 / 3), atol=1e-3)


def test_reinit_head_keeps_the_body_in_every_component(tiny):
    sim = _mlp(tiny, "method.reinit=head")
    assert torch.equal(sim.init["body.0.1.weight"], sim.init["body.2.1.weight"])
    assert not torch.equal(sim.init["head.0.weight"], sim.init["head.2.weight"])


def test_a_non_finite_loss_surfaces_as_divergence(tiny):
    sim = _mlp(tiny)
    sim.ctx.round = 1
    state = {**sim.states[0], "head.1.bias": torch.full_like(sim.states[0]["head.1.bias"], float("nan"))}
    with pytest.raises(Diverged, match="not finite"):
        sim.method.local_train(0, state, {})


@pytest.mark.parametrize("bad, key", [("method.components=0", "method.components"),
                                      ("method.components=two", "method.components"),
                                      ("method.reinit=body", "method.reinit"), ("method.pi=1", "pi")])
def test_bad_hyperparameters_are_one_line_usage_errors(tiny, bad, key):
    with pytest.raises(UsageError) as e:
        _sim(tiny, bad)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_a_model_without_body_and_head_is_refused():
    with pytest.raises(UsageError, match="body and a head"):
        METHODS.get("fedem")().prepare_model(nn.Linear(2, 2))
