import json

import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator

# cnn on digits: body.0 (conv 1->32, 5x5), body.3 (conv 32->64, 5x5), body.7 (fc 256->512), head (fc 512->10)
BODY_FLOATS = (32 * 25 + 32) + (64 * 32 * 25 + 64) + (512 * 256 + 512)
HEAD = {"head.weight", "head.bias"}


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedrep", "method.head_epochs=2", *extra]))


def test_the_body_is_sent_and_the_head_never_is(tiny):
    sim = _sim(tiny)
    assert set(sim.method.upload(0, sim.states[0])) == set(sim.ctx.float_keys) - HEAD
    bn = _sim(tiny, "model.name=resnet8")  # BatchNorm: affine parameters and running statistics go with the body
    sent = set(bn.method.upload(0, bn.states[0]))
    assert sent == set(bn.ctx.float_keys) - HEAD
    assert {"body.bn1.weight", "body.bn1.running_mean", "body.layer3.0.downsample.1.running_var"} <= sent


def test_the_plan_trains_the_head_with_the_body_frozen_then_the_body_with_the_head_frozen(tiny):
    sim = _sim(tiny, "fl.epochs=3")
    head, body = sim.method.plan(0, sim.states[0], {})
    assert (set(head.params), head.epochs) == (HEAD, 2)  # head_epochs
    assert set(body.params) == set(sim.ctx.param_keys) - HEAD and body.epochs == 3  # the run's fl.epochs
    # a constructed client state: the initial body and a zero head
    state = {**sim.states[0], "head.weight": torch.zeros(10, 512), "head.bias": torch.zeros(10)}
    sim.ctx.round = 1
    after_head, _ = sim.ctx.fit(0, state, [head])
    assert all(torch.equal(after_head[k], state[k]) for k in sim.ctx.param_keys if k not in HEAD)
    assert not torch.equal(after_head["head.weight"], state["head.weight"])
    after_body, _ = sim.ctx.fit(0, after_head, [body])
    assert all(torch.equal(after_body[k], after_head[k]) for k in HEAD)
    assert all(not torch.equal(after_body[k], after_head[k]) for k in sim.ctx.param_keys if k not in HEAD)


def test_server_averages_the_body_by_size_and_clients_keep_their_heads(tiny):
    sim = _sim(tiny)
    m = sim.method
    # client 0 holds 0.5 everywhere, client 1 holds 2.0; weights 2 and 1: the mean is (1 + 2) / 3 = 1
    states = {k: {key: torch.full_like(v, value) for key, v in sim.states[k].items()}
              for k, value in ((0, 0.5), (1, 2.0))}
    uploads = {k: m.upload(k, s) for k, s in states.items()}
    server = m.aggregate(m.init_server(sim.init), uploads, {0: 2.0, 1: 1.0})
    assert set(server["global"]) == set(sim.ctx.float_keys) - HEAD
    assert all(torch.equal(t, torch.full_like(t, 1.0)) for t in server["global"].values())
    mine = m.receive(1, states[1], m.download(server, 1))
    assert torch.equal(mine["body.3.weight"], torch.full_like(mine["body.3.weight"], 1.0))
    assert torch.equal(mine["head.weight"], states[1]["head.weight"])


@pytest.mark.slow
def test_two_rounds_train_and_send_only_the_body(tiny):
    sim = _sim(tiny)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    assert records[-1].train_loss < records[0].train_loss
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [4 * BODY_FLOATS * 4] * 2
    received = sim.method.receive(0, sim.states[0], sim.method.download(sim.server, 0))
    assert torch.equal(received["head.weight"], sim.states[0]["head.weight"])
    assert torch.equal(received["body.7.weight"], sim.server["global"]["body.7.weight"])


def test_cost_projects_what_a_run_measures(tiny, capsys):
    assert main(["cost", *[a for s in tiny + ["method.name=fedrep"] for a in ("--set", s)], "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["bytes_up"] == cost["bytes_down"] == 2 * 4 * BODY_FLOATS * 4


@pytest.mark.slow
def test_a_new_client_trains_a_head_on_the_received_body(tiny):
    sim = _sim(tiny, "fl.clients=5", "eval.new_clients=0.2", "fl.rounds=1")
    sim.run()
    k = sim.newcomers[0]
    fresh = sim.method.init_client(k, sim.init)
    models = sim.method.new_client_models(sim.server, k, fresh, lambda: [])
    assert {"received", "localtrain"} <= set(models)
    trained = models["localtrain"]
    assert all(torch.equal(trained[key], sim.server["global"][key]) for key in sim.server["global"])
    assert not torch.equal(trained["head.weight"], fresh["head.weight"])
    assert torch.equal(models["received"]["head.weight"], fresh["head.weight"])  # a new client's head: the initial one
    assert "localtrain" in sim.evaluate_new_clients()


@pytest.mark.parametrize("setting, message", [
    ("method.head_epochs=0", r"method.head_epochs must be >= 1 \(got 0\)"),
    ("method.head_epochs=1.5", "method.head_epochs"),
])
def test_bad_settings_are_one_clear_error(tiny, setting, message):
    with pytest.raises(UsageError, match=message) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)
