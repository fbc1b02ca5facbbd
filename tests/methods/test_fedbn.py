import json
import logging
from collections import OrderedDict

import pytest
import torch
from torch import nn

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.methods import METHODS
from fedfactor.models import HeadedModel

# resnet8's BatchNorm layers: the stem's (64), two per block (64, 128, 256) and the two shortcuts' (128, 256),
# each with weight, bias, running mean and running variance per channel
RESNET8_BN_FLOATS = 4 * (64 + 2 * 64 + 3 * 128 + 3 * 256)


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedbn", *extra]))


def _tiny_bn_method(tiny):
    """FedBN bound to a hand-made model whose names do not say which modules are BatchNorm."""
    body = nn.Sequential(OrderedDict(conv=nn.Conv2d(1, 2, 3), norm=nn.BatchNorm2d(2), act=nn.ReLU(),
                                     pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), bn_proj=nn.Linear(2, 3),
                                     stats=nn.BatchNorm1d(3, affine=False)))
    model = HeadedModel(body, nn.Linear(3, 4))
    ctx = _sim(tiny).ctx  # a real context with the hand-made model's keys swapped in
    ctx.model = model
    ctx.param_keys = [k for k, _ in model.named_parameters()]
    ctx.buffer_keys = [k for k, b in model.named_buffers() if b.is_floating_point()]
    ctx.float_keys = [*ctx.param_keys, *ctx.buffer_keys]
    ctx.head_keys = ["head.weight", "head.bias"]
    method = METHODS.get("fedbn")()
    method.bind(ctx)
    return method, model


def test_batchnorm_is_found_by_type_and_stays_local(tiny):
    method, model = _tiny_bn_method(tiny)
    assert set(method.upload(0, model.state_dict())) == {
        "body.conv.weight", "body.conv.bias", "body.bn_proj.weight", "body.bn_proj.bias", "head.weight", "head.bias"}
    assert "body.norm.num_batches_tracked" in model.state_dict()  # an integer counter: never sent by any method


def test_every_batchnorm_of_a_resnet_stays_local_shortcuts_included(tiny):
    sim = _sim(tiny, "model.name=resnet8")
    sent = set(sim.method.upload(0, sim.states[0]))
    norms = ["bn1", "layer1.0.bn1", "layer1.0.bn2", "layer2.0.bn1", "layer2.0.bn2", "layer2.0.downsample.1",
             "layer3.0.bn1", "layer3.0.bn2", "layer3.0.downsample.1"]
    local = {f"body.{n}.{e}" for n in norms for e in ("weight", "bias", "running_mean", "running_var")}
    assert sent == set(sim.ctx.float_keys) - local


def test_server_averages_all_but_batchnorm_and_clients_keep_their_own(tiny):
    method, model = _tiny_bn_method(tiny)
    # client 0 holds 3.0 everywhere, client 1 holds 7.0; weights 1 and 1: the mean is 5; weights 3 and 1: 4
    states = {k: {key: torch.full_like(v, value) for key, v in model.state_dict().items() if v.is_floating_point()}
              for k, value in ((0, 3.0), (1, 7.0))}
    uploads = {k: method.upload(k, s) for k, s in states.items()}
    server = method.aggregate(method.init_server(model.state_dict()), uploads, {0: 3.0, 1: 1.0})
    assert all(torch.equal(t, torch.full_like(t, 4.0)) for t in server["global"].values())
    mine = method.receive(1, states[1], method.download(server, 1))
    assert torch.equal(mine["body.conv.weight"], torch.full((2, 1, 3, 3), 4.0))
    for key in ("body.norm.weight", "body.norm.running_var", "body.stats.running_mean"):
        assert torch.equal(mine[key], states[1][key])  # the client's own, not the mean


@pytest.mark.slow
def test_two_rounds_on_a_batchnorm_model_train_and_send_all_but_batchnorm(tiny, capsys):
    sim = _sim(tiny, "model.name=resnet8")
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    floats = sum(sim.init[k].numel() for k in sim.ctx.float_keys)
    per_round = 4 * (floats - RESNET8_BN_FLOATS) * 4  # 4 clients x floats x 4 bytes
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [per_round] * 2
    # BatchNorm statistics are each client's own after the round; the convs are the server's mean
    received = [sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k)) for k in range(2)]
    assert torch.equal(received[0]["body.bn1.running_mean"], sim.states[0]["body.bn1.running_mean"])
    assert not torch.equal(received[0]["body.bn1.running_mean"], received[1]["body.bn1.running_mean"])
    assert torch.equal(received[1]["body.conv1.weight"], sim.server["global"]["body.conv1.weight"])
    sets = tiny + ["method.name=fedbn", "model.name=resnet8"]
    assert main(["cost", *[a for s in sets for a in ("--set", s)], "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert (cost["bytes_up"], cost["bytes_down"]) == (sim.meter.up, sim.meter.down)


@pytest.mark.slow
def test_without_batchnorm_fedbn_is_fedavg_and_says_so(tiny, caplog):
    with caplog.at_level(logging.WARNING, logger="fedfactor"):
        fedbn = _sim(tiny, "fl.rounds=1")
    assert [r.getMessage() for r in caplog.records] == [
        "fedbn: the model has no BatchNorm layer, so FedBN shares what FedAvg shares"]
    fedavg = Simulator(load_config(None, tiny + ["method.name=fedavg", "fl.rounds=1"]))
    a, b = fedbn.run()[0], fedavg.run()[0]
    assert (a.test.correct.tolist(), a.train_loss, a.bytes_up, a.bytes_down) == (
        b.test.correct.tolist(), b.train_loss, b.bytes_up, b.bytes_down)
    assert all(torch.equal(fedbn.server["global"][k], v) for k, v in fedavg.server["global"].items())


def test_an_unknown_setting_is_one_clear_error(tiny):
    with pytest.raises(UsageError, match="method 'fedbn' has no parameter 'momentum'; valid: none"):
        _sim(tiny, "method.momentum=0.9")
