"""pFedPara: Hadamard layers W1 o (W2 + 1); W1's factors are averaged, W2's stay with their client."""

import json

import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.reparam import hadamard_layers

from ..conftest import record_uploads

# The cnn on 8x8 digits with gamma = 0.5, r(0.5) = ceil((r_min + r_max) / 2):
#   body.0 conv 1 -> 32, 5x5:  r_min 1, r_max 3  -> r 2:  W1 = 2 * (32 + 1) + 2^2 * 25   =    166
#   body.3 conv 32 -> 64, 5x5: r_min 6, r_max 30 -> r 18: W1 = 18 * (64 + 32) + 18^2 * 25 =  9,828
#   body.7 fc 256 -> 512:      r_min 16, r_max 85 -> r 51 (50.5 up): W1 = 51 * 768       = 39,168
#   head fc 512 -> 10:         r_min 4, r_max 4  -> r 4:  W1 = 4 * 522                   =  2,088
W1_FLOATS = 166 + 9_828 + 39_168 + 2_088  # 51,250
FEDAVG_FLOATS = 32 * 25 + 32 + 64 * 32 * 25 + 64 + 256 * 512 + 512 + 512 * 10 + 10  # 188,810
LAYERS = ["body.0", "body.3", "body.7", "head"]
GLOBAL = {f"{n}.{p}" for n in LAYERS for p in ("x1", "y1")} | {"body.0.t1", "body.3.t1"}
PERSONAL = {k.replace("1", "2") for k in GLOBAL}


def _sim(tiny, *extra, dry_run=False):
    return Simulator(load_config(None, tiny + ["method.name=pfedpara", "method.gamma=0.5", *extra]), dry_run=dry_run)


@pytest.mark.slow
def test_upload_is_exactly_the_global_factors_and_bytes_are_what_it_sends(tiny):
    sim = _sim(tiny)
    assert [f.rank for f in hadamard_layers(sim.model).values()] == [2, 18, 51, 4]
    m = sim.method
    assert set(m.shared) == GLOBAL
    upload = m.upload(0, sim.states[0])
    assert set(upload) == GLOBAL and not set(upload) & PERSONAL
    assert not [k for k in upload if k.endswith("bias")]  # biases stay local (Flower's pFedPara client)
    assert sum(t.numel() for t in upload.values()) == W1_FLOATS
    assert set(m.download(sim.server, 2)) == GLOBAL

    records = sim.run()  # the smoke run: 2 rounds, 4 clients
    per_round = 4 * W1_FLOATS * 4  # clients x floats x 4 bytes, each way
    assert [(r.bytes_up_round, r.bytes_down_round) for r in records] == [(per_round, per_round)] * 2
    assert sim.meter.up == sim.meter.down == 2 * per_round
    assert W1_FLOATS / FEDAVG_FLOATS == pytest.approx(0.2714, abs=1e-4)  # this gamma sends 27 % of FedAvg
    assert records[-1].test.mean > 0.3 and records[-1].train_loss < records[0].train_loss  # chance: 0.1


@pytest.mark.slow
def test_after_a_round_w1_is_the_weighted_mean_and_w2_the_clients_own(tiny):
    sim = _sim(tiny, "fl.rounds=1")
    init = {k: sim.init[k] for k in PERSONAL}
    sent = record_uploads(sim)
    sim.run()
    m = sim.method
    sizes = torch.tensor(sim.ctx.train_sizes, dtype=torch.float64)
    received = [m.receive(k, sim.states[k], m.download(sim.server, k)) for k in range(4)]
    for key in GLOBAL:
        trained = torch.stack([sent[k][key].double() for k in range(4)])
        mean = (trained * (sizes / sizes.sum()).view(-1, *[1] * (trained.dim() - 1))).sum(0)
        assert not torch.equal(trained[0], trained[1])  # the clients did train it
        for k in range(4):
            torch.testing.assert_close(received[k][key].double(), mean, rtol=1e-6, atol=1e-7)
    for key in PERSONAL:
        for k in range(4):
            assert torch.equal(received[k][key], sim.states[k][key])
            assert not torch.equal(sim.states[k][key], init[key])  # trained, not the initial W2
        assert not torch.equal(received[0][key], received[1][key])
    assert torch.equal(received[0]["body.7.bias"], sim.states[0]["body.7.bias"])


def test_server_mean_is_sample_weighted_on_a_constructed_case(tiny):
    sim = _sim(tiny)
    m = sim.method
    uploads = {k: {key: torch.full_like(sim.init[key], float(k)) for key in m.shared} for k in range(4)}
    server = m.aggregate(m.init_server(sim.init), uploads, {0: 1.0, 1: 1.0, 2: 2.0, 3: 4.0})
    assert set(server["global"]) == GLOBAL
    # (0 * 1 + 1 * 1 + 2 * 2 + 3 * 4) / 8 = 17 / 8
    assert torch.equal(server["global"]["body.3.t1"], torch.full_like(sim.init["body.3.t1"], 2.125))


def test_a_local_head_keeps_its_w1_and_share_other_adds_biases_and_batchnorm(tiny):
    permuted = _sim(tiny, "partition.permute_labels=true").method
    assert set(permuted.shared) == GLOBAL - {"head.x1", "head.y1"}
    other = _sim(tiny, "model.name=resnet8", "method.share_other=true").method
    shared = set(other.shared)
    assert not shared & set(other.personal_keys) and set(other.global_keys) <= shared
    assert {"body.bn1.weight", "body.bn1.bias", "body.bn1.running_mean", "head.bias"} <= shared
    plain = _sim(tiny, "model.name=resnet8").method
    assert set(plain.shared) == set(plain.global_keys)  # by default BatchNorm stays local


def test_capacity_sets_the_parameter_share(tiny):
    sim = Simulator(load_config(None, tiny + ["method.name=pfedpara"]))  # capacity 0.95, gamma solved
    assert sim.params_total / FEDAVG_FLOATS == pytest.approx(0.95, abs=0.005)
    assert [f.rank for f in hadamard_layers(sim.model).values()] == [3, 29, 82, 4]


def test_the_cost_command_projects_the_measured_bytes(tiny, capsys):
    sets = [a for s in tiny + ["method.name=pfedpara", "method.gamma=0.5"] for a in ("--set", s)]
    assert main(["cost", *sets, "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["bytes_up"] == cost["bytes_down"] == 2 * 4 * W1_FLOATS * 4


@pytest.mark.parametrize("bad", ["method.capacity=0", "method.capacity=1.5", "method.gamma=2", "method.gamma=abc",
                                 "method.share_other=maybe", "method.capacity=0.01",
                                 "method.init=zeros"])
def test_bad_hyperparameters_are_usage_errors_naming_the_key(tiny, bad):
    key = bad.split("=")[0]
    with pytest.raises(UsageError, match=f"^{key}") as err:
        Simulator(load_config(None, tiny + ["method.name=pfedpara", bad]), dry_run=True)
    assert "\n" not in str(err.value)
