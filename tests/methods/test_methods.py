import pytest
import torch

from fedfactor.config import load_config
from fedfactor.run.simulator import Simulator
from fedfactor.fl.state import weighted_average

from ..conftest import record_uploads


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + list(extra)))


def _moved(sim, init):
    """The server's model is no longer the initial one: an aggregation happened."""
    return any(not torch.equal(sim.server["global"][k], init[k]) for k in init)


def test_fedavg_server_is_size_weighted_mean_of_uploads(tiny):
    sim = _sim(tiny, "partition.kind=dirichlet")
    sent = record_uploads(sim)
    sim.run_round(1)
    sizes = sim.ctx.train_sizes
    assert len(set(sizes)) > 1  # unequal sizes, so an unweighted mean would not pass
    expected = weighted_average([sent[k] for k in range(4)], sizes)
    assert set(sim.server["global"]) == set(sim.ctx.float_keys)
    for key, value in expected.items():
        assert torch.allclose(sim.server["global"][key], value, atol=1e-6)
    unweighted = weighted_average([sent[k] for k in range(4)], [1] * 4)
    assert not torch.allclose(sim.server["global"]["head.weight"], unweighted["head.weight"], atol=1e-6)


def test_fedavg_shares_all_float_state_but_never_a_local_head(tiny):
    sim = _sim(tiny)
    assert sim.method.upload(0, sim.states[0]).keys() == set(sim.ctx.float_keys)
    sim = _sim(tiny, "partition.permute_labels=true")
    sent = sim.method.upload(0, sim.states[0]).keys()
    assert sim.ctx.head_keys and not set(sim.ctx.head_keys) & set(sent)
    init = {k: v.clone() for k, v in sim.server["global"].items()}
    sim.run_round(1)
    assert _moved(sim, init)
    received = [sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k)) for k in range(4)]
    body = sim.ctx.float_keys[0]
    # every client receives the same aggregated body but keeps its own trained head
    assert all(torch.equal(r[body], sim.server["global"][body]) for r in received)
    assert not torch.equal(received[0]["head.weight"], received[1]["head.weight"])
    assert torch.equal(received[0]["head.weight"], sim.states[0]["head.weight"])


def test_local_sends_nothing_and_clients_diverge(tiny):
    sim = _sim(tiny, "method.name=local")
    sim.run_round(1)
    assert sim.meter.total == 0
    key = sim.ctx.float_keys[0]
    assert not torch.equal(sim.states[0][key], sim.states[1][key])


@pytest.mark.slow
def test_fedprox_mu_zero_is_fedavg_and_mu_pulls_towards_global(tiny):
    runs = {}
    for name, extra in {"fedavg": [], "prox0": ["method.name=fedprox", "method.mu=0"],
                        "prox": ["method.name=fedprox", "method.mu=1.0"]}.items():
        sim = _sim(tiny, *extra)
        init = {k: v.clone() for k, v in sim.server["global"].items()}
        sent = record_uploads(sim)
        sim.run_round(1)
        assert _moved(sim, init)
        runs[name] = (sim, init, sent)
    fedavg, prox0, prox = runs["fedavg"][0], runs["prox0"][0], runs["prox"][0]
    for key in fedavg.server["global"]:
        assert torch.allclose(fedavg.server["global"][key], prox0.server["global"][key], atol=1e-6)
    assert not all(torch.allclose(fedavg.server["global"][k], prox.server["global"][k], atol=1e-6)
                   for k in fedavg.server["global"])

    def drift(sim, init, sent):  # of what each client trained and sent
        return sum(((sent[k][n] - init[n]) ** 2).sum().item() for k in range(4) for n in init)

    assert drift(*runs["prox"]) < drift(*runs["fedavg"])


def test_every_method_is_named_by_its_registration_alone():
    from fedfactor.methods import METHODS
    from fedfactor.methods.base import Method, variant

    assert all(METHODS.get(n).name == n for n in METHODS.names())
    with METHODS.scope():
        @METHODS.register("toy_named", "a method registered here")
        class Toy(Method):
            pass

        assert Toy.name == "toy_named" and variant(Toy, "toy_variant", "its preset").name == "toy_variant"
        assert Toy.name == "toy_named"  # a variant names itself, not its base
