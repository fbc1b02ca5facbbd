"""Two methods written here, against the method API alone, to prove it can carry the coming ones."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Optim, Phase
from fedfactor.methods import METHODS, Method
from fedfactor.methods.base import Params

from ..conftest import record_uploads

# The toy methods are registered for this file's tests only (toy_methods): registered at import time
# they would stay in the global registry for the rest of the session, and the tests parametrized over
# every method (tests/run/test_job.py) would collect them or not depending on which files came first.
TOYS = {}


def toy(name, description):
    """Keep a method class to register as `name` while this file's tests run."""
    def keep(cls):
        TOYS[name] = (cls, description)
        return cls
    return keep


@pytest.fixture(autouse=True)
def toy_methods():
    with METHODS.scope():
        for name, (cls, description) in TOYS.items():
            METHODS.register(name, description)(cls)
        yield


@toy("toy_rep", "test only: FedRep-like, head then body, only the body shared")
class ToyRep(Method):
    name = "toy_rep"

    class Params(Params):
        head_epochs: int = 1

    def bind(self, ctx):
        super().bind(ctx)
        self.rounds_seen = []

    def shared_keys(self):
        return [k for k in self.ctx.float_keys if k not in self.ctx.head_keys]

    def plan(self, k, state, received):
        self.rounds_seen.append(self.ctx.round)
        head = [p for p in self.ctx.param_keys if p in self.ctx.head_keys]
        body = [p for p in self.ctx.param_keys if p not in self.ctx.head_keys]
        return [Phase(params=head, epochs=self.hp.head_epochs, optim=Optim("sgd", lr=0.1)),
                Phase(params=body, steps=2)]


@toy("toy_extra", "test only: keeps a visit counter and a val score per client, sends the counter")
class ToyExtra(Method):
    name = "toy_extra"

    def init_client(self, k, init_state):
        return {**super().init_client(k, init_state), "extra.visits": torch.zeros(()),
                "extra.val_acc": torch.zeros(())}

    def local_train(self, k, state, received):
        state, loss = super().local_train(k, state, received)
        correct, count, _ = self.ctx.evaluate(k, state, "val")  # score the trained state on its val split
        return {**state, "extra.visits": state["extra.visits"] + 1,
                "extra.val_acc": torch.tensor(correct / max(count, 1))}, loss

    def upload(self, k, state):
        return {**super().upload(k, state), "extra.visits": state["extra.visits"]}

    def aggregate(self, server, uploads, weights):
        visits = {k: u.pop("extra.visits") for k, u in uploads.items()}
        server = super().aggregate(server, uploads, weights)
        self.ctx.log("visits_sum", sum(v.item() for v in visits.values()))
        self.ctx.log("visits", torch.stack([visits.get(k, torch.zeros(())) for k in range(self.ctx.num_clients)]))
        return server


def test_two_phase_method_trains_head_then_body_and_shares_only_the_body(tiny):
    sim = Simulator(load_config(None, tiny + ["method.name=toy_rep", "method.head_epochs=2"]))
    assert sim.method.hp.head_epochs == 2
    head = sim.ctx.head_keys
    assert head == ["head.weight", "head.bias"]
    assert "body.0.weight" in sim.ctx.param_keys and not sim.ctx.buffer_keys  # the cnn has no BatchNorm
    init = {k: v.clone() for k, v in sim.states[0].items()}
    sim.run_round(1)
    sim.run_round(2)
    assert sim.method.rounds_seen == [1] * 4 + [2] * 4
    assert set(sim.server["global"]) == set(sim.ctx.float_keys) - set(head)
    # bytes: 4 clients x 2 rounds x (body entries) x 4 bytes, each way
    body = sum(v.numel() for k, v in init.items() if k not in head)
    assert sim.meter.up == sim.meter.down == 4 * 2 * body * 4
    # heads are personal and trained; the body each client received is the server's average
    assert not torch.equal(sim.states[0]["head.weight"], sim.states[1]["head.weight"])
    assert not torch.equal(sim.states[0]["head.weight"], init["head.weight"])
    received = sim.method.receive(0, sim.states[0], sim.method.download(sim.server, 0))
    assert torch.equal(received["body.0.weight"], sim.server["global"]["body.0.weight"])


@pytest.mark.slow
def test_extra_client_state_is_kept_sent_counted_and_logged(tmp_path, tiny):
    out = tmp_path / "run"
    sets = [s for s in tiny if not s.startswith("fl.rounds")] + ["fl.rounds=3", "fl.fraction=0.5",
                                                                  "method.name=toy_extra"]
    assert main(["train", *[a for s in sets for a in ("--set", s)], "--out", str(out)]) == 0
    sim = Simulator(load_config(None, sets))
    sim.run()
    picked = [sim.sample(r) for r in (1, 2, 3)]
    visits = [sum(k in p for p in picked) for k in range(4)]
    assert [sim.states[k]["extra.visits"].item() for k in range(4)] == visits
    assert all(0 <= sim.states[k]["extra.val_acc"].item() <= 1 for k in range(4))
    model_floats = sum(v.numel() for k, v in sim.model.state_dict().items() if v.is_floating_point())
    # 2 clients a round send the model plus one float32 counter; the server sends the model back
    assert sim.meter.up == 3 * 2 * (model_floats + 1) * 4
    assert sim.meter.down == 3 * 2 * model_floats * 4

    summary = json.loads((out / "summary.json").read_text())
    assert summary["bytes_up"] == sim.meter.up
    metrics = pd.read_csv(out / "metrics.csv")
    # each round, the sampled clients send their counters, which count that round's visit too
    expected = [sum(sum(k in p for p in picked[: r + 1]) for k in picked[r]) for r in range(3)]
    assert metrics["visits_sum"].tolist() == expected
    arrays = sorted((out / "diagnostics" / "visits").glob("round_*.npy"))
    assert [a.name for a in arrays] == ["round_0001.npy", "round_0002.npy", "round_0003.npy"]
    first = np.load(arrays[0])
    assert first.shape == (4,) and first.sum() == 2 and set(np.flatnonzero(first)) == set(picked[0])


@toy("toy_sparse", "test only: FedAvg that uploads its head weight as a sparse tensor")
class ToySparse(Method):
    name = "toy_sparse"

    def upload(self, k, state):
        sent = super().upload(k, state)
        return {**sent, "head.weight": (state["head.weight"] * (state["head.weight"].abs() > 0.05)).to_sparse()}

    def aggregate(self, server, uploads, weights):
        return super().aggregate(server, {k: {n: t.to_dense() for n, t in u.items()} for k, u in uploads.items()},
                                 weights)


class ToySparseDeclared(ToySparse):
    name = "toy_sparse_declared"
    payload_depends_on_values = True


toy("toy_sparse_declared", "test only: toy_sparse that says its payload depends on values")(
    ToySparseDeclared)


def test_sparse_uploads_are_counted_as_sent_and_cost_refuses_them(tiny, capsys):
    sim = Simulator(load_config(None, tiny + ["method.name=toy_sparse"]))
    sent = record_uploads(sim)
    sim.run_round(1)
    dense = {k: v for k, v in sim.model.state_dict().items() if v.is_floating_point()}
    nnz = [int((sent[k]["head.weight"].to_dense().abs() > 0.05).sum()) for k in range(4)]
    others = sum(v.numel() for k, v in dense.items() if k != "head.weight")
    # each client: the dense entries, then its head's non-zeros as float32 values + 2 int64 indices
    assert sim.meter.up == sum(4 * others + 4 * n + 2 * 8 * n for n in nnz)
    assert 0 < sum(nnz) < 4 * dense["head.weight"].numel()
    sets = [a for s in tiny for a in ("--set", s)]
    for name in ("toy_sparse", "toy_sparse_declared"):
        assert main(["cost", *sets, "--set", f"method.name={name}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "fedfactor train" in err and name in err


@toy("toy_lowrank_head", "test only: replaces the classifier by a rank-2 product before the run")
class ToyLowRankHead(Method):
    name = "toy_lowrank_head"

    def prepare_model(self, model):
        old = model.head
        model.head = torch.nn.Sequential(torch.nn.Linear(old.in_features, 2, bias=False),
                                         torch.nn.Linear(2, old.out_features))
        return model


def test_a_swapped_layer_is_trained_sent_and_costed_on_the_meta_device(tiny, capsys):
    sets = ["model.name=mlp", "fl.clients=4", "fl.rounds=3", "method.name=toy_lowrank_head"]
    assert main(["cost", *[a for s in sets for a in ("--set", s)], "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    # mlp body Linear(64, 200) + the rank-2 head: Linear(200, 2, no bias) and Linear(2, 10)
    floats = 64 * 200 + 200 + 200 * 2 + 2 * 10 + 10
    assert cost["bytes_up"] == 4 * 3 * floats * 4
    sim = Simulator(load_config(None, tiny + sets[:1] + ["method.name=toy_lowrank_head"]))
    assert sim.ctx.head_keys == ["head.0.weight", "head.1.weight", "head.1.bias"]
    before = sim.states[0]["head.0.weight"].clone()
    sim.run_round(1)
    assert not torch.equal(sim.server["global"]["head.0.weight"], before)
