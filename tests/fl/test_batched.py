"""Batched clients: many clients' plans as one vmapped computation, held to the one-by-one path."""

import math

import pytest
import torch
from torch import nn

from fedfactor.config import load_config
from fedfactor.errors import Interrupted
from fedfactor.fl.batched import BatchedTrainer, batchable
from fedfactor.run.simulator import Simulator
from fedfactor.fl.state import clone
from fedfactor.fl.train import Diverged, Optim, Phase, Split, Trainer


class Small(nn.Module):
    """A conv, a BatchNorm and a head: every kind of entry the batched path must carry."""

    def __init__(self, bn: bool = True):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3) if bn else nn.Identity(),
                                  nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 5), nn.ReLU())
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.body(x))


def _setup(bn=True, sizes=(9, 13, 4, 17), optim=Optim("sgd", lr=0.1, momentum=0.9, weight_decay=0.01), seed=0):
    torch.manual_seed(seed)
    model = Small(bn)
    n = sum(sizes)
    x = torch.randn(n, 1, 4, 4)
    y = torch.randint(0, 3, (n,))
    trainer = Trainer(model, x, 4, "none", optim)
    splits, start = [], 0
    for size in sizes:
        idx = torch.arange(start, start + size)
        splits.append(Split(idx, y[idx]))
        start += size
    # clients start from different states, as after rounds of personal training
    states = []
    for k in range(len(sizes)):
        torch.manual_seed(100 + k)
        states.append(clone(Small(bn).state_dict()))
    return trainer, splits, states


def _gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + k) for k in range(n)]


def _jobs(states, splits, phases):
    return [(state, split, gen, phases) for state, split, gen in zip(states, splits, _gens(len(splits)))]


def _one_by_one(trainer, splits, states, phases):
    out = []
    for state, split, gen in zip(states, splits, _gens(len(splits))):
        try:
            out.append(trainer.fit(state, split, phases, gen))
        except Diverged as e:
            out.append(e)
    return out


def _assert_close(a, b, atol=1e-5):
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=1e-4, msg=key)


@pytest.mark.parametrize("bn", [True, False])
def test_unequal_clients_train_as_one_by_one(bn):
    # Sizes 9, 13, 4, 17 at batch 4: unequal step counts, last batches of 1, 1, 4 and 1 samples
    # (BatchNorm skips a batch of one; without BatchNorm they are padded).
    trainer, splits, states = _setup(bn)
    phases = [Phase(epochs=2)]
    expected = _one_by_one(trainer, splits, states, phases)
    got = BatchedTrainer(trainer).fit_many(_jobs(states, splits, phases))
    for (s1, l1), (s2, l2) in zip(expected, got):
        _assert_close(s1, s2)
        assert l2 == pytest.approx(l1, rel=1e-5)
    if bn:  # the running statistics moved, per client, as one by one
        assert not torch.equal(got[0][0]["body.1.running_mean"], states[0]["body.1.running_mean"])
        assert int(got[3][0]["body.1.num_batches_tracked"]) == int(expected[3][0]["body.1.num_batches_tracked"])


def test_phases_subsets_lrs_and_kept_optimizer_state():
    trainer, splits, states = _setup(bn=True, sizes=(8, 12, 5))
    head = ["head.weight", "head.bias"]
    body = [n for n, _ in trainer.model.named_parameters() if n not in head]
    phases = [Phase(params=head, epochs=1, lr={"head.bias": 0.5}, keep_optimizer="h"),
              Phase(params=body, steps=5, optim=Optim("adam", lr=0.01, weight_decay=0.1))]
    # the second client carries momentum kept from an earlier round, the others have none yet
    states[1] = {**states[1], **{f"optim.h.{n}.momentum_buffer": torch.full_like(states[1][n], 0.3) for n in head}}
    expected = _one_by_one(trainer, splits, states, phases)
    got = BatchedTrainer(trainer).fit_many(_jobs(states, splits, phases))
    for (s1, l1), (s2, l2) in zip(expected, got):
        _assert_close(s1, s2, atol=1e-4)  # Adam divides by small second moments: looser
        assert l2 == pytest.approx(l1, rel=1e-4)
    assert "optim.h.head.weight.momentum_buffer" in got[0][0]
    assert not any(k.startswith("optim.") and ".body." in k for k in got[0][0])  # Adam's phase keeps nothing


def _head_l2(params, batch, logits):
    return 0.05 * (params["head.weight"] ** 2).sum()


def test_extra_losses_are_reported_apart_as_one_by_one():
    trainer, splits, states = _setup(bn=True)
    phases = [Phase(epochs=1, loss=_head_l2, loss_name="l2"), Phase(steps=3)]
    expected = _one_by_one(trainer, splits, states, phases)
    got = BatchedTrainer(trainer).fit_many(_jobs(states, splits, phases))
    for (s1, l1), (s2, l2) in zip(expected, got):
        _assert_close(s1, s2)
        assert l2 == pytest.approx(l1, rel=1e-5)  # the cross-entropy
        assert set(l2.terms) == set(l1.terms) == {"l2"} and l2.terms["l2"] == pytest.approx(l1.terms["l2"], rel=1e-5)
        assert l2.terms["l2"] > 0.01  # a real term, apart from the cross-entropy


def test_masked_adam_and_sgd_match_torch_optim():
    # Client 1 sits out the middle step: its parameters, moments and step count must not move then.
    torch.manual_seed(0)
    p0 = torch.randn(3, 4)
    grads = [torch.randn(3, 4) for _ in range(3)]
    masks = [None, torch.tensor([True, False, True]), None]
    for optim, entries in [(Optim("adam", lr=0.01, weight_decay=0.1), ("exp_avg", "exp_avg_sq", "step")),
                           (Optim("sgd", lr=0.1, momentum=0.9, weight_decay=0.1), ("momentum_buffer",))]:
        params = [p0[i].clone().requires_grad_() for i in range(3)]
        opts = [torch.optim.Adam([p], lr=0.01, weight_decay=0.1) if optim.kind == "adam"
                else torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.1) for p in params]
        stacked = {"w": p0.clone()}
        state = {e: torch.zeros(3) if e == "step" else torch.zeros(3, 4) for e in entries}
        moments = {"w": (state, torch.zeros(3, dtype=torch.bool))}
        for g, mask in zip(grads, masks):
            for i in range(3):
                if mask is None or mask[i]:
                    params[i].grad = g[i].clone()
                    opts[i].step()
            BatchedTrainer._step(optim, ["w"], {"w": optim.lr}, stacked, {"w": g}, moments, mask)
        torch.testing.assert_close(stacked["w"], torch.stack([p.detach() for p in params]))
        if optim.kind == "adam":
            assert moments["w"][0]["step"].tolist() == [3.0, 2.0, 3.0]


def test_a_diverged_client_is_reported_alone():
    trainer, splits, states = _setup(bn=False, sizes=(8, 8, 8))
    states[1] = {**states[1], "head.bias": torch.full_like(states[1]["head.bias"], math.nan)}
    got = BatchedTrainer(trainer).fit_many(_jobs(states, splits, [Phase(epochs=1)]))
    assert isinstance(got[1], Diverged)
    assert all(isinstance(r, tuple) and math.isfinite(r[1]) for r in (got[0], got[2]))


def _sim(tiny, *sets):
    return Simulator(load_config(None, [*tiny, "fl.rounds=2", "fl.epochs=3", "partition.kind=dirichlet", "partition.alpha=0.5", *sets]))


@pytest.mark.parametrize("method", ["fedavg", "fedrep", "feddecomp", "factorized_fl_alpha", "fedprox"])
@pytest.mark.slow
def test_rounds_batched_equal_rounds_one_by_one(tiny, method):
    runs = {}
    for mode in ("false", "true"):
        sim = _sim(tiny, f"method.name={method}", f"fl.batch_clients={mode}", "model.name=mlp")
        assert (sim.batched is not None) == (mode == "true")
        batch_sizes = []
        if sim.batched is not None:
            fit_many = sim.batched.fit_many
            sim.batched.fit_many = lambda jobs: batch_sizes.append(len(jobs)) or fit_many(jobs)
        losses = [sim.run_round(r)[0] for r in (1, 2)]
        runs[mode] = (sim, losses)
    # FedProx's extra loss reads each client's anchor (a ClientLoss): its plans still batch
    assert batch_sizes == [4, 4]
    (a, la), (b, lb) = runs["false"], runs["true"]
    assert lb == pytest.approx(la, rel=1e-4)
    # the extra losses' columns: FedProx's proximal term (FedAvg and FedRep have none)
    expected = {"proximal"} if method == "fedprox" else set()
    assert [set(x.terms) for x in lb] == [set(x.terms) for x in la] == [expected] * 2
    for x, y in zip(la, lb):
        assert y.terms == pytest.approx(x.terms, rel=1e-4)
    assert a.meter.history == b.meter.history  # the same bytes, counted the same way
    for k in range(len(a.states)):
        _assert_close(a.states[k], b.states[k], atol=1e-4)
    _assert_same_tree(a.server, b.server)


def _assert_same_tree(a, b):
    """Servers are dicts of tensors, numbers and nested dicts/lists of them."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for key in a:
            _assert_same_tree(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_tree(x, y)
    else:
        assert a == pytest.approx(b, rel=1e-4)


def test_batched_rounds_stop_on_a_signal(tiny):
    sim = _sim(tiny, "fl.batch_clients=true")
    sim.stop_signal = 15
    with pytest.raises(Interrupted):
        sim.run_round(1)
    assert sim.meter.up == 0 and sim.round == 0


def test_auto_batches_linear_models_on_cpu_only_and_never_own_loops(tiny):
    cpu = torch.device("cpu")
    assert batchable(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), cpu, "auto")
    assert not batchable(Small(), cpu, "auto")
    assert batchable(Small(), torch.device("cuda"), "auto")
    assert batchable(Small(), cpu, True) and not batchable(nn.Linear(2, 2), cpu, False)
    assert _sim(tiny, "model.name=mlp").batched is not None
    assert _sim(tiny).batched is None  # the tiny fixture's cnn on CPU
    # a method with its own training loop trains one by one even when told to batch
    assert _sim(tiny, "fl.batch_clients=true", "method.name=fedrod").batched is None


@pytest.mark.parametrize("name, shape", [("resnet9", (3, 16, 16)), ("resnet8", (3, 32, 32)),
                                         ("resnet10_cifar", (3, 16, 16)), ("mlp", (1, 8, 8))])
def test_the_papers_models_train_batched_as_one_by_one(name, shape):
    # Residual additions, in-place ReLUs, max-pools and BatchNorm under vmap; two clients, a few steps.
    # (At 16x16 ResNet-8 ends in 1x1 maps: BatchNorm over 3 values there amplifies rounding, in both paths.)
    from fedfactor.models import build_model

    torch.manual_seed(0)
    model = build_model(name, *shape, 4)
    x = torch.randn(14, *shape)
    trainer = Trainer(model, x, 3, "none", Optim("sgd", lr=0.05, momentum=0.9))
    y = torch.randint(0, 4, (14,))
    splits = [Split(torch.arange(0, 8), y[:8]), Split(torch.arange(8, 14), y[8:])]
    states = [clone(model.state_dict()), {k: v + 0.01 if v.is_floating_point() else v.clone()
                                          for k, v in model.state_dict().items()}]
    phases = [Phase(steps=3)]
    expected = _one_by_one(trainer, splits, states, phases)
    got = BatchedTrainer(trainer).fit_many(_jobs(states, splits, phases))
    for (s1, l1), (s2, l2) in zip(expected, got):
        _assert_close(s1, s2, atol=1e-4)
        assert l2 == pytest.approx(l1, rel=1e-4)


@pytest.mark.parametrize("partition, batched", [("iid", True), ("dirichlet", False)])
def test_auto_on_cpu_batches_clients_of_near_equal_size_only(tiny, partition, batched):
    sim = Simulator(load_config(None, [*tiny, "model.name=mlp", f"partition.kind={partition}", "partition.alpha=0.5"]))
    sizes = [len(c["train"]) for c in sim.clients]
    assert (max(sizes) <= 1.25 * min(sizes)) == batched  # the case is what its name says
    calls = []
    fit_many = sim.batched.fit_many
    sim.batched.fit_many = lambda jobs: calls.append(len(jobs)) or fit_many(jobs)
    sim.run_round(1)
    assert calls == ([4] if batched else [])


def test_batches_hold_at_most_batch_clients_max_clients(tiny):
    runs = {}
    for cap in (2, 3):
        sim = _sim(tiny, "model.name=mlp", "fl.batch_clients=true", f"fl.batch_clients_max={cap}")
        calls = []
        fit_many = sim.batched.fit_many
        sim.batched.fit_many = lambda jobs: calls.append(len(jobs)) or fit_many(jobs)
        sim.run_round(1)
        runs[cap] = (calls, sim)
    assert runs[2][0] == [2, 2] and runs[3][0] == [3, 1]
    for k in range(4):  # how clients are chunked does not change what they train
        _assert_close(runs[2][1].states[k], runs[3][1].states[k])
