import json
import math

import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator

CNN_FLOATS = 188810  # every float entry of the tiny cnn (digits, 10 classes); it has no BatchNorm


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=clustered_fl", *extra]))


def _uploads(base, shifts):
    """Uploads equal to `base` except head.bias, moved by each client's 2-vector in its first entries."""
    out = {}
    for k, (a, b) in shifts.items():
        u = {key: t.clone() for key, t in base.items()}
        u["head.bias"][:2] += torch.tensor([a, b])
        out[k] = u
    return out


def _bias(model):
    return model["head.bias"][:2]


def test_opposite_updates_split_the_cluster_in_two_and_each_half_averages_its_own(tiny):
    sim = _sim(tiny, "method.warmup_rounds=0")
    sim.ctx.round = 1
    base = sim.server["models"][0]
    # mean update 0 < eps1 = 0.4, largest update norm sqrt(4.04) = 2.01 > eps2 = 1.6: split
    ups = _uploads(base, {0: (2, 0), 1: (2, 0.2), 2: (-2, 0), 3: (-2, -0.2)})
    server = sim.method.aggregate(sim.server, ups, {k: 1.0 for k in ups})
    assert server["clusters"] == [[0, 1], [2, 3]]
    # each half's model: the old model plus the mean of its two updates
    assert torch.allclose(_bias(server["models"][0]) - _bias(base), torch.tensor([2.0, 0.1]), atol=1e-6)
    assert torch.allclose(_bias(server["models"][1]) - _bias(base), torch.tensor([-2.0, -0.1]), atol=1e-6)
    assert torch.equal(server["models"][0]["body.0.weight"], base["body.0.weight"])
    assert sim._scalars["clusters"] == 2 and sim._scalars["cluster_splits"] == 1
    assert sim._scalars["update_norm_mean"] == pytest.approx(0.0, abs=1e-6)
    assert sim._scalars["update_norm_max"] == pytest.approx(math.sqrt(4.04), rel=1e-6)
    sim_matrix = sim._arrays["update_similarity"]
    assert sim_matrix.shape == (4, 4)
    assert sim_matrix[0, 2] == pytest.approx(-1.0) and sim_matrix[0, 1] == pytest.approx(2 / math.sqrt(4.04))
    assert list(sim._arrays["cluster_of_client"]) == [0, 0, 1, 1]
    # the next download is the client's own half
    assert torch.equal(sim.method.download(server, 1)["head.bias"], server["models"][0]["head.bias"])
    assert torch.equal(sim.method.download(server, 2)["head.bias"], server["models"][1]["head.bias"])


@pytest.mark.parametrize("case, shifts, round_, extra", [
    ("small updates: max norm 0.201 < eps2", {0: (0.2, 0), 1: (0.2, 0.02), 2: (-0.2, 0), 3: (-0.2, -0.02)}, 1, []),
    ("not stalled: mean norm 2 > eps1", {0: (2, 0), 1: (2, 0), 2: (2, 0), 3: (2, 0)}, 1, []),
    ("still warming up", {0: (2, 0), 1: (2, 0.2), 2: (-2, 0), 3: (-2, -0.2)}, 5, ["method.warmup_rounds=5"]),
    ("too few uploaders", {0: (2, 0), 2: (-2, 0)}, 1, []),
])
def test_no_split_unless_every_condition_holds(tiny, case, shifts, round_, extra):
    sim = _sim(tiny, "method.warmup_rounds=0", *extra)
    sim.ctx.round = round_
    base = sim.server["models"][0]
    server = sim.method.aggregate(sim.server, _uploads(base, shifts), {k: 1.0 for k in shifts})
    assert server["clusters"] == [[0, 1, 2, 3]], case
    mean = torch.tensor([sum(s[0] for s in shifts.values()), sum(s[1] for s in shifts.values())]) / len(shifts)
    assert torch.allclose(_bias(server["models"][0]) - _bias(base), mean, atol=1e-6)


def test_with_partial_participation_only_uploaders_are_split_and_the_rest_keep_the_old_model(tiny):
    sim = _sim(tiny, "method.warmup_rounds=0", "method.eps1=1.0")
    sim.ctx.round = 1
    base = sim.server["models"][0]
    # client 3 sat the round out; mean update (-2/3, 0), norm 0.667 < eps1 = 1
    ups = _uploads(base, {0: (2, 0), 1: (-2, 0.1), 2: (-2, -0.1)})
    server = sim.method.aggregate(sim.server, ups, {k: 1.0 for k in ups})
    assert server["clusters"] == [[0], [1, 2], [3]]
    assert torch.allclose(_bias(server["models"][0]) - _bias(base), torch.tensor([2.0, 0.0]), atol=1e-6)
    assert torch.allclose(_bias(server["models"][1]) - _bias(base), torch.tensor([-2.0, 0.0]), atol=1e-6)
    assert server["models"][2] is base


def test_within_cluster_average_is_uniform_or_size_weighted(tiny):
    for weighting, expected in (("uniform", [(1.0, 0.0), (2.5, 1.0)]), ("size", [(0.5, 0.0), (2.75, 1.5)])):
        sim = _sim(tiny, f"method.weighting={weighting}")
        sim.ctx.round = 1
        base = sim.server["models"][0]
        server = {"clusters": [[0, 2], [1, 3]], "models": [base, {k: t + 1 for k, t in base.items()}]}
        # cluster [0, 2] starts from base, [1, 3] from base + 1; sizes 3:1 and 1:3
        ups = _uploads(base, {0: (0, 0), 2: (2, 0), 1: (2, 0), 3: (3, 2)})
        server = sim.method.aggregate(server, ups, {0: 3.0, 2: 1.0, 1: 1.0, 3: 3.0})
        assert server["clusters"] == [[0, 2], [1, 3]]
        for model, (a, b) in zip(server["models"], expected):
            assert torch.allclose(_bias(model) - _bias(base), torch.tensor([a, b]), atol=1e-6), weighting


def test_a_client_receives_its_own_clusters_model_and_sends_what_fedavg_sends(tiny):
    # scored with the trained model, a client keeps its trained body, which the check below reads
    sim = _sim(tiny, "partition.permute_labels=true", "eval.model=trained")
    base = sim.server["models"][0]
    assert "head.weight" not in base  # permuted labels: heads are local, never sent
    sim.server = {"clusters": [[0, 2], [1, 3]], "models": [base, {k: t + 0.01 for k, t in base.items()}]}
    got = [sim.method.download(sim.server, k) for k in range(4)]
    assert torch.equal(got[2]["body.0.weight"], base["body.0.weight"])
    assert torch.equal(got[3]["body.0.weight"], base["body.0.weight"] + 0.01)
    sim.run_round(1)
    up, down = sim.meter.history[-1]
    body = sum(t.numel() for t in base.values())
    assert up == down == 4 * body * 4
    assert set(sim.method.upload(0, sim.states[0])) == set(base)
    # each cluster's new model: the mean of its members' trained bodies
    for c, members in enumerate([[0, 2], [1, 3]]):
        mean = (sim.states[members[0]]["body.0.weight"] + sim.states[members[1]]["body.0.weight"]) / 2
        assert torch.allclose(sim.server["models"][c]["body.0.weight"], mean, atol=1e-6)


def test_two_rounds_train_and_cost_what_fedavg_costs(tiny, capsys):
    sim = _sim(tiny, "method.warmup_rounds=0")
    records = sim.run()
    assert records[-1].test.mean > 0.3  # 10 classes: chance is 0.1
    assert sim.meter.up == sim.meter.down == 4 * 2 * CNN_FLOATS * 4
    assert records[-1].arrays["update_similarity"].shape == (4, 4)
    assert records[-1].diagnostics["clusters"] >= 1
    sets = [a for s in tiny + ["method.name=clustered_fl"] for a in ("--set", s)]
    assert main(["cost", *sets, "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert (cost["bytes_up"], cost["bytes_down"]) == (sim.meter.up, sim.meter.down)


@pytest.mark.parametrize("setting, key", [("method.eps1=-1", "eps1"), ("method.eps2=0", "eps2"),
                                          ("method.min_split_size=1", "min_split_size"),
                                          ("method.warmup_rounds=-2", "warmup_rounds"),
                                          ("method.weighting=median", "weighting")])
def test_bad_hyperparameters_are_refused_naming_the_key(tiny, setting, key):
    with pytest.raises(UsageError, match=key) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)
