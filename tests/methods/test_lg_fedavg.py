import json

import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator

# cnn on digits: layers 1 body.0 (conv 1->32, 5x5), 2 body.3 (conv 32->64, 5x5), 3 body.7 (fc 256->512), 4 head
HEAD_FLOATS = 10 * 512 + 10
FC_FLOATS = 512 * 256 + 512


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=lg_fedavg", *extra]))


def test_only_the_top_layers_are_sent_and_one_more_layer_adds_exactly_its_entries(tiny):
    one, two = _sim(tiny), _sim(tiny, "method.global_layers=2")
    sent_one = set(one.method.upload(0, one.states[0]))
    sent_two = set(two.method.upload(0, two.states[0]))
    assert sent_one == {"head.weight", "head.bias"}
    assert sent_two - sent_one == {"body.7.weight", "body.7.bias"} and sent_one < sent_two


def test_a_global_conv_takes_its_batchnorm_along_and_the_rest_stays_local(tiny):
    sim = _sim(tiny, "model.name=resnet8", "method.global_layers=2")  # resnet8: layer 7 is layer3.0.conv2
    assert set(sim.method.upload(0, sim.states[0])) == {
        "body.layer3.0.conv2.weight", "body.layer3.0.bn2.weight", "body.layer3.0.bn2.bias",
        "body.layer3.0.bn2.running_mean", "body.layer3.0.bn2.running_var", "head.weight", "head.bias"}


def test_server_averages_the_global_layers_by_size_and_clients_keep_their_representations(tiny):
    sim = _sim(tiny, "method.global_layers=2")
    m = sim.method
    # client 0 holds 2.0 everywhere, client 1 holds -1.0; weights 3 and 1: the mean is (6 - 1) / 4 = 1.25
    states = {k: {key: torch.full_like(v, value) for key, v in sim.states[k].items()}
              for k, value in ((0, 2.0), (1, -1.0))}
    uploads = {k: m.upload(k, s) for k, s in states.items()}
    server = m.aggregate(m.init_server(sim.init), uploads, {0: 3.0, 1: 1.0})
    assert set(server["global"]) == {"body.7.weight", "body.7.bias", "head.weight", "head.bias"}
    assert all(torch.equal(t, torch.full_like(t, 1.25)) for t in server["global"].values())
    mine = m.receive(1, states[1], m.download(server, 1))
    assert torch.equal(mine["head.bias"], torch.full((10,), 1.25))
    assert torch.equal(mine["body.0.weight"], states[1]["body.0.weight"])  # its own, not the mean


def test_two_rounds_train_and_send_only_the_classifier(tiny):
    sim = _sim(tiny)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [4 * HEAD_FLOATS * 4] * 2
    assert not torch.equal(sim.states[0]["body.0.weight"], sim.states[1]["body.0.weight"])  # local representations
    received = sim.method.receive(0, sim.states[0], sim.method.download(sim.server, 0))
    assert torch.equal(received["head.weight"], sim.server["global"]["head.weight"])
    assert torch.equal(received["body.0.weight"], sim.states[0]["body.0.weight"])


def test_cost_projects_what_a_run_measures(tiny, capsys):
    sets = tiny + ["method.name=lg_fedavg", "method.global_layers=2"]
    assert main(["cost", *[a for s in sets for a in ("--set", s)], "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["bytes_up"] == cost["bytes_down"] == 2 * 4 * (FC_FLOATS + HEAD_FLOATS) * 4


def test_new_clients_are_scored_by_an_ensemble_of_the_trained_clients(tiny):
    sim = _sim(tiny, "fl.clients=5", "eval.new_clients=0.2", "fl.rounds=1")
    sim.run()
    k = sim.newcomers[0]
    models = sim.method.new_client_models(sim.server, k, sim.method.init_client(k, sim.init),
                                          lambda: [sim.scored_state(j) for j in sim.members])
    assert {"received", "ensemble"} <= set(models)
    assert isinstance(models["ensemble"], list) and len(models["ensemble"]) == len(sim.members) == 4
    assert torch.equal(models["ensemble"][2]["body.0.weight"], sim.states[sim.members[2]]["body.0.weight"])
    scores = sim.evaluate_new_clients()
    assert {"received", "ensemble"} <= set(scores) and 0 <= scores["ensemble"].mean <= 1


@pytest.mark.parametrize("setting, message", [
    ("method.global_layers=0", r"method.global_layers must be in 1\.\.L-1"),
    ("method.global_layers=4", r"method.global_layers must be in 1\.\.3 \(this model has 4 layers\)"),
    ("method.global_layers=-1", r"method.global_layers must be in 1\.\."),
    ("partition.permute_labels=true", r"method.global_layers=1 shares only the classifier"),
])
def test_bad_settings_are_one_clear_error(tiny, setting, message):
    with pytest.raises(UsageError, match=message) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)


def test_under_permuted_labels_the_classifier_leaves_the_global_layers(tiny):
    sim = _sim(tiny, "partition.permute_labels=true", "method.global_layers=2")
    assert set(sim.method.upload(0, sim.states[0])) == {"body.7.weight", "body.7.bias"}
