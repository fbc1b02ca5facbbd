import json

import numpy as np
import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.methods.fedfomo import PEER, WEIGHTS, fomo_weights, mixing_weights, select_peers

CNN_FLOATS = 188810  # every float entry of the tiny cnn (digits, 10 classes); it has no BatchNorm


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedfomo", *extra]))


def test_weights_are_loss_gain_per_distance_and_harmful_models_get_none():
    # own loss 1.0; models with losses 0.5, 1.5, 0.8 at distances 2, 1, 0.4
    raw = fomo_weights(1.0, torch.tensor([0.5, 1.5, 0.8]), torch.tensor([2.0, 1.0, 0.4]))
    assert torch.allclose(raw, torch.tensor([0.25, -0.5, 0.5], dtype=torch.float64))
    assert torch.allclose(mixing_weights(raw), torch.tensor([1 / 3, 0, 2 / 3], dtype=torch.float64))
    # an identical model (distance 0) brings nothing; none helpful: all weights 0
    assert fomo_weights(1.0, torch.tensor([1.0]), torch.tensor([0.0])).tolist() == [0.0]
    assert mixing_weights(torch.tensor([-0.1, 0.0])).tolist() == [0.0, 0.0]


class FakeLoss:
    """Client 0's validation loss, looked up from how far head.bias[:2] moved from `own`."""

    def __init__(self, own, losses):
        self.own, self.losses = own, losses

    def __call__(self, k, state, split):
        assert (k, split) == (0, "own_val")
        shift = tuple(round(float(v), 3) for v in state["head.bias"][:2] - self.own["head.bias"][:2])
        return 0, 10, 10 * self.losses[shift]


def _moved(state, keys, a, b):
    out = {key: state[key].clone() for key in keys}
    out["head.bias"][:2] += torch.tensor([a, b])
    return out


def _payload(sim, own, peers):
    payload = {key: own[key] for key in sim.method.shared}
    for j, model in peers.items():
        payload.update({f"{PEER}{j}.{key}": t for key, t in model.items()})
    return payload


def test_a_client_mixes_in_the_helpful_models_by_hand(tiny):
    sim = _sim(tiny)
    own = sim.states[0]
    shared = sim.method.shared
    # distances 2, 1, 0.4 (only head.bias moves); losses 0.5, 1.5, 0.8 against its own 1.0
    peers = {1: _moved(own, shared, 2, 0), 2: _moved(own, shared, 0, 1), 3: _moved(own, shared, 0.4, 0)}
    sim.method.ctx.evaluate = FakeLoss(own, {(0, 0): 1.0, (2, 0): 0.5, (0, 1): 1.5, (0.4, 0): 0.8})
    got = sim.method.receive(0, own, _payload(sim, own, peers))
    assert torch.allclose(got[WEIGHTS], torch.tensor([0.25, -0.5, 0.5]))
    # theta + 1/3 (2, 0) + 0 (0, 1) + 2/3 (0.4, 0) = theta + (0.9333, 0)
    assert torch.allclose(got["head.bias"][:2] - own["head.bias"][:2], torch.tensor([2 / 3 + 0.8 / 3, 0.0]), atol=1e-6)
    assert torch.equal(got["head.bias"][2:], own["head.bias"][2:])
    assert torch.equal(got["body.0.weight"], own["body.0.weight"])
    # no model helps: the client keeps its own
    sim.method.ctx.evaluate = FakeLoss(own, {(0, 0): 1.0, (2, 0): 1.5, (0, 1): 1.5, (0.4, 0): 1.0})
    got = sim.method.receive(0, own, _payload(sim, own, peers))
    assert all(torch.equal(got[key], own[key]) for key in own)
    assert torch.allclose(got[WEIGHTS], torch.tensor([-0.25, -0.5, 0.0]))


def test_local_heads_are_never_sent_and_others_bodies_are_scored_with_the_own_head(tiny):
    sim = _sim(tiny, "partition.permute_labels=true")
    head = sim.ctx.head_keys
    assert not set(head) & set(sim.method.shared)
    sim.run_round(1)
    payload = sim.method.download(sim.server, 0)
    assert payload and not any(key.split(".", 2)[-1] in head or key in head for key in payload)
    own, scored = sim.states[0], []

    def evaluate(k, state, split):
        scored.append(state)
        return 0, 10, 10.0

    sim.method.ctx.evaluate = evaluate
    got = sim.method.receive(0, own, payload)
    assert len(scored) == 4  # its own model and the 3 others
    assert all(torch.equal(s[key], own[key]) for s in scored for key in head)
    assert all(torch.equal(got[key], own[key]) for key in head)


def test_models_are_weighed_on_the_clients_own_validation_data_under_a_shared_test_pool(tiny):
    """The paper scores the downloaded models on the client's own validation data. Under a shared test
    pool the protocol's val is the pooled split, one set for every client: weighing on it would rank
    models by the federation's data, not the client's, at the cost of the whole pool per model."""
    sim = _sim(tiny, "eval.test_pool=shared", "partition.kind=dirichlet", "partition.alpha=0.1")
    sim.run_round(1)
    sim.ctx.round = 2  # the peers' trained models arrive, at distances > 0
    scored, evaluate = [], sim.trainer.evaluate

    def recording(state, split, *args, **kwargs):
        scored.append(split.idx.tolist())
        return evaluate(state, split, *args, **kwargs)

    sim.trainer.evaluate = recording
    weights = {}
    for k in (0, 1):
        scored.clear()
        weights[k] = sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k))[WEIGHTS]
        own = sim.partition.clients[k]["val"].tolist()
        assert 0 < len(own) < len(sim.clients[k]["val"])  # a client-sized cut of the pool
        assert scored == [own] * 4  # its own model and the 3 others, each on the client's own val
    # the labels are skewed (Dirichlet 0.1): scored on the pool, the same models weigh otherwise
    for k in (0, 1):
        sim.clients[k]["own_val"] = sim.clients[k]["val"]
        pooled = sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k))[WEIGHTS]
        assert not torch.allclose(pooled, weights[k])


def test_a_client_without_a_validation_cut_of_its_own_falls_back_on_the_protocols_and_the_run_says_so(tiny):
    """A tiny client of a skewed partition can have no own val cut while the shared pool has one: it
    is weighed on the pool rather than refusing a study (default_grid's digits under Dirichlet)."""
    sim = _sim(tiny, "eval.test_pool=shared")
    empty = sim.clients[0]["own_val"].idx[:0]
    sim.clients[0]["own_val"] = type(sim.clients[0]["own_val"])(empty, empty)
    sim.method.bind(sim.ctx)
    assert sim.method.val_split == ["val", "own_val", "own_val", "own_val"]
    (line,) = sim.method.run_warnings([])
    assert line.startswith("fedfomo: 1 of 4 clients have no validation cut of their own")
    assert _sim(tiny, "eval.test_pool=shared").method.run_warnings([]) == []


def test_selection_is_epsilon_greedy_on_the_affinity():
    affinity = np.array([0.5, -1.0, 2.0, 0.1, 0.0])
    # greedy: the two highest affinities, whatever the random stream
    for seed in range(20):
        assert select_peers(affinity, 2, 0.0, np.random.default_rng(seed)) == [2, 0]
    # always exploring: distinct clients in a random order, not always the greedy ones
    picks = [select_peers(affinity, 2, 1.0, np.random.default_rng(seed)) for seed in range(50)]
    assert all(len(set(p)) == 2 for p in picks) and {j for p in picks for j in p} == set(range(5))
    # more asked than there are: all of them, each once
    assert sorted(select_peers(affinity, 9, 0.5, np.random.default_rng(0))) == [0, 1, 2, 3, 4]
    # ties in affinity are broken at random
    assert len({tuple(select_peers(np.zeros(5), 1, 0.0, np.random.default_rng(s))) for s in range(30)}) > 1


def test_server_picks_by_affinity_once_epsilon_has_decayed_and_accumulates_the_weights(tiny):
    sim = _sim(tiny, "method.models_downloaded=2")
    m = sim.method
    for rnd, eps in ((1, 0.3), (3, 0.2), (7, 0.0), (12, 0.0)):
        sim.ctx.round = rnd
        assert m.epsilon() == pytest.approx(eps)
    server = sim.server
    server["affinity"][1] = torch.tensor([0.7, 9.0, -0.2, 0.3], dtype=torch.float64)
    sim.ctx.round = 7  # epsilon 0.3 - 6 * 0.05 = 0: greedy, its own column never counts
    assert m.peers(server, 1) == [0, 3]
    assert set(m.download(server, 1)) == set(m.shared) | {f"{PEER}{j}.{key}" for j in (0, 3) for key in m.shared}
    up = {**{key: sim.states[1][key] for key in m.shared}, WEIGHTS: torch.tensor([0.5, -0.25])}
    new = m.aggregate(server, {1: up}, {1: 1.0})
    assert new["affinity"][1].tolist() == pytest.approx([1.2, 9.0, -0.2, 0.05])
    assert set(new["models"]) == {"1"} and WEIGHTS not in new["models"]["1"]
    assert torch.equal(server["affinity"][1], torch.tensor([0.7, 9.0, -0.2, 0.3], dtype=torch.float64))
    # a pure function of (seed, round, client): the same pick again
    assert m.peers(server, 1) == m.peers(server, 1)


@pytest.mark.slow
def test_two_rounds_train_and_send_own_plus_three_models_down_and_one_up(tiny, capsys):
    sim = _sim(tiny)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # 10 classes: chance is 0.1
    # 4 clients: each gets its own model and the 3 others (H = 10 is capped at K - 1), and
    # returns its model plus 3 float32 weights
    W = CNN_FLOATS * 4
    assert sim.meter.down == 2 * 4 * 4 * W
    assert sim.meter.up == 2 * 4 * (W + 3 * 4)
    # round 1: every other model is the initial one, so each client keeps its own
    assert np.nansum(np.abs(records[0].arrays["fomo_weights"])) == 0
    assert records[1].arrays["affinity"].shape == (4, 4)
    sets = [a for s in tiny + ["method.name=fedfomo"] for a in ("--set", s)]
    assert main(["cost", *sets, "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert (cost["bytes_up"], cost["bytes_down"]) == (sim.meter.up, sim.meter.down)


@pytest.mark.slow
def test_ten_models_downloaded_cost_six_times_fedavg(tiny):
    """002 Table 5: S2C (H + 1) W, C2S W; for H = 10, (H + 2) / 2 = 6 times FedAvg's 2 W."""
    sets = [s for s in tiny if not s.startswith("fl.clients")] + ["fl.clients=12", "eval.model=trained"]
    # FedAvg's bytes through the same loop on shapes alone (`fedfactor cost`; tests/test_cli.py checks
    # that it equals a real run's); FedFOMO's from a real run
    fedavg = Simulator(load_config(None, sets), dry_run=True)
    fedavg.run()
    fomo = _sim(sets, "method.models_downloaded=10")
    fomo.run()
    assert fomo.meter.down == 11 * fedavg.meter.down
    # the model, plus the client's 10 weights (float32) so the server can update its affinities
    assert fomo.meter.up == fedavg.meter.up + 12 * 2 * 10 * 4
    ratio = (fomo.meter.up + fomo.meter.down) / (fedavg.meter.up + fedavg.meter.down)
    assert ratio == pytest.approx(6.0, rel=1e-4)
    keeping = Simulator(load_config(None, sets + ["method.name=fedfomo", "method.own_from_server=false"]),
                        dry_run=True)
    keeping.run()
    assert keeping.meter.down == 10 * fedavg.meter.down


def test_a_run_without_validation_data_is_refused_but_can_be_costed(tiny, capsys):
    no_val = ["data.split=[0.9, 0.0, 0.1]"]
    with pytest.raises(UsageError, match="validation") as err:
        _sim(tiny, *no_val)
    assert "data.split" in str(err.value) and "partition.samples_per_client.val" in str(err.value)
    assert "\n" not in str(err.value)
    sets = [a for s in tiny + no_val + ["method.name=fedfomo"] for a in ("--set", s)]
    assert main(["cost", *sets, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_down"] == 2 * 4 * 4 * CNN_FLOATS * 4


@pytest.mark.parametrize("setting, key", [("method.models_downloaded=0", "models_downloaded"),
                                          ("method.epsilon=1.5", "epsilon"),
                                          ("method.epsilon_decay=-0.1", "epsilon_decay"),
                                          ("method.own_from_server=maybe", "own_from_server")])
def test_bad_hyperparameters_are_refused_naming_the_key(tiny, setting, key):
    with pytest.raises(UsageError, match=key) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)
