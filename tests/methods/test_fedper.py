import json

import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator

# cnn on digits: layers 1 body.0 (conv 1->32, 5x5), 2 body.3 (conv 32->64, 5x5), 3 body.7 (fc 256->512), 4 head
CNN_FLOATS = (32 * 25 + 32) + (64 * 32 * 25 + 64) + (512 * 256 + 512) + (10 * 512 + 10)
HEAD_FLOATS = 10 * 512 + 10


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedper", *extra]))


def test_the_top_layers_stay_home_and_everything_else_is_sent(tiny):
    sim = _sim(tiny)
    assert set(sim.method.upload(0, sim.states[0])) == set(sim.ctx.float_keys) - {"head.weight", "head.bias"}
    two = _sim(tiny, "method.personal_layers=2")
    assert set(two.method.upload(0, two.states[0])) == {"body.0.weight", "body.0.bias", "body.3.weight", "body.3.bias"}


def test_a_personal_conv_keeps_its_batchnorm_and_the_base_shares_its_own(tiny):
    sim = _sim(tiny, "model.name=resnet8", "method.personal_layers=2")  # resnet8: layer 7 is layer3.0.conv2
    sent = set(sim.method.upload(0, sim.states[0]))
    kept = {"body.layer3.0.conv2.weight", "body.layer3.0.bn2.weight", "body.layer3.0.bn2.bias",
            "body.layer3.0.bn2.running_mean", "body.layer3.0.bn2.running_var", "head.weight", "head.bias"}
    assert sent == set(sim.ctx.float_keys) - kept
    assert {"body.bn1.running_mean", "body.layer3.0.downsample.1.running_var", "body.layer3.0.bn1.weight"} <= sent


def test_server_averages_the_base_by_size_and_clients_keep_their_heads(tiny):
    sim = _sim(tiny)
    m = sim.method
    # client 0 holds 1.0 everywhere, client 1 holds 5.0; weights 1 and 3: the mean is (1 + 15) / 4 = 4
    states = {k: {key: torch.full_like(v, value) for key, v in sim.states[k].items()}
              for k, value in ((0, 1.0), (1, 5.0))}
    uploads = {k: m.upload(k, s) for k, s in states.items()}
    server = m.aggregate(m.init_server(sim.init), uploads, {0: 1.0, 1: 3.0})
    assert set(server["global"]) == set(sim.ctx.float_keys) - {"head.weight", "head.bias"}
    assert all(torch.equal(t, torch.full_like(t, 4.0)) for t in server["global"].values())
    mine = m.receive(0, states[0], m.download(server, 0))
    assert torch.equal(mine["body.7.weight"], torch.full_like(mine["body.7.weight"], 4.0))
    assert torch.equal(mine["head.weight"], states[0]["head.weight"])  # the client's own, not the mean


@pytest.mark.slow
def test_two_rounds_train_and_send_everything_but_the_head(tiny):
    sim = _sim(tiny)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    assert records[-1].train_loss < records[0].train_loss
    per_round = 4 * (CNN_FLOATS - HEAD_FLOATS) * 4  # 4 clients x floats x 4 bytes
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [per_round] * 2
    # heads are each client's own: trained, different, and what the client holds after the round
    received = sim.method.receive(0, sim.states[0], sim.method.download(sim.server, 0))
    assert torch.equal(received["head.weight"], sim.states[0]["head.weight"])
    assert not torch.equal(sim.states[0]["head.weight"], sim.states[1]["head.weight"])
    assert torch.equal(received["body.0.weight"], sim.server["global"]["body.0.weight"])


def test_cost_projects_what_a_run_measures(tiny, capsys):
    assert main(["cost", *[a for s in tiny + ["method.name=fedper"] for a in ("--set", s)], "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["bytes_up"] == cost["bytes_down"] == 2 * 4 * (CNN_FLOATS - HEAD_FLOATS) * 4


@pytest.mark.parametrize("setting, message", [
    ("method.personal_layers=0", r"method.personal_layers must be in 1\.\.L-1"),
    ("method.personal_layers=4", r"method.personal_layers must be in 1\.\.3 \(this model has 4 layers\)"),
    ("method.personal_layers=two", "personal_layers"),
])
def test_bad_settings_are_one_clear_error(tiny, setting, message):
    with pytest.raises(UsageError, match=message) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)
