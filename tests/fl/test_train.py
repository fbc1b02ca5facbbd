"""The local-training executor: phases, optimizers, extra losses, kept optimizer state, evaluation."""

import pytest
import torch
from torch import nn

from fedfactor.fl.state import clone
from fedfactor.fl.train import Batch, Diverged, Optim, Phase, Split, Trainer, TrainLoss


class Tiny(nn.Module):
    """2 inputs -> 2 hidden -> 2 classes, with named body and head like the package's models."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(2, 2)
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(torch.relu(self.body(x.flatten(1))))


def _trainer(n=10, batch_size=4, optim=Optim("sgd", lr=0.1)):
    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(n, 1, 1, 2)
    split = Split(torch.arange(n), (x.flatten(1)[:, 0] > 0).long())
    return Trainer(model, x, batch_size, "none", optim), split


def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_phase_needs_exactly_one_of_epochs_and_steps():
    with pytest.raises(ValueError):
        Phase()
    with pytest.raises(ValueError):
        Phase(epochs=1, steps=3)
    with pytest.raises(ValueError):
        Phase(steps=-1)


def test_batches_count_steps_across_epochs_and_cover_each_epoch():
    trainer, split = _trainer(n=10, batch_size=4)
    sizes = [len(b.y) for b in trainer.batches(split, _gen(), steps=7)]
    assert sizes == [4, 4, 2, 4, 4, 2, 4]  # 3 batches per pass of 10 samples, 7 in all
    epochs = list(trainer.batches(split, _gen(), epochs=2))
    assert len(epochs) == 6
    first = torch.cat([b.x for b in epochs[:3]]).flatten(1)
    # one pass is a permutation of all ten samples
    assert sorted(first[:, 0].tolist()) == sorted(trainer.x.flatten(1)[:, 0].tolist())


def test_fit_trains_only_the_named_parameters_and_restores_requires_grad():
    trainer, split = _trainer()
    state = clone(trainer.model.state_dict())
    new, loss = trainer.fit(state, split, [Phase(params=["head.weight", "head.bias"], epochs=2)], _gen())
    assert loss == loss  # a number, not NaN
    assert torch.equal(new["body.weight"], state["body.weight"]) and torch.equal(new["body.bias"], state["body.bias"])
    assert not torch.equal(new["head.weight"], state["head.weight"])
    assert all(p.requires_grad for p in trainer.model.parameters())
    assert trainer.model.body.weight.grad is None  # no gradient was computed for what did not train


def test_phases_run_in_sequence_on_one_random_stream():
    trainer, split = _trainer()
    state = clone(trainer.model.state_dict())
    two, _ = trainer.fit(state, split, [Phase(params=["head.weight", "head.bias"], epochs=1),
                                        Phase(params=["body.weight", "body.bias"], epochs=1)], _gen())
    # the body phase starts from the head phase's result, so the head is the head-only result
    head_only, _ = trainer.fit(state, split, [Phase(params=["head.weight", "head.bias"], epochs=1)], _gen())
    assert torch.equal(two["head.weight"], head_only["head.weight"])
    assert not torch.equal(two["body.weight"], state["body.weight"])


def test_sgd_step_and_per_parameter_learning_rate_by_hand():
    trainer, split = _trainer(n=4, batch_size=4, optim=Optim("sgd", lr=0.5))
    state = clone(trainer.model.state_dict())
    # the gradient of the one full batch, computed independently
    model = Tiny()
    model.load_state_dict(state)
    loss = nn.functional.cross_entropy(model(trainer.x), split.y)
    grads = dict(zip([n for n, _ in model.named_parameters()], torch.autograd.grad(loss, list(model.parameters()))))
    new, _ = trainer.fit(state, split, [Phase(steps=1, lr={"head.bias": 0.0, "body.bias": 2.0})], _gen())
    assert torch.allclose(new["head.weight"], state["head.weight"] - 0.5 * grads["head.weight"], atol=1e-6)
    assert torch.equal(new["head.bias"], state["head.bias"])  # lr 0
    assert torch.allclose(new["body.bias"], state["body.bias"] - 2.0 * grads["body.bias"], atol=1e-6)


def test_adam_first_step_moves_each_weight_by_the_learning_rate():
    trainer, split = _trainer(n=4, batch_size=4)
    state = clone(trainer.model.state_dict())
    new, _ = trainer.fit(state, split, [Phase(steps=1, optim=Optim("adam", lr=0.01))], _gen())
    step = (new["head.weight"] - state["head.weight"]).abs()
    # Adam's first update is lr * g / (|g| + eps): lr wherever the gradient is not tiny
    assert torch.allclose(step, torch.full_like(step, 0.01), atol=1e-5)


def test_extra_loss_sees_parameters_batch_and_logits():
    trainer, split = _trainer(n=4, batch_size=4, optim=Optim("sgd", lr=0.1))
    seen = {}

    def pull(params, batch, logits):
        seen.update(keys=set(params), batch=batch, shape=tuple(logits.shape))
        return 10.0 * params["head.bias"].sum()  # gradient 10 on every bias entry

    state = clone(trainer.model.state_dict())
    with_term, _ = trainer.fit(state, split, [Phase(steps=1, loss=pull)], _gen())
    plain, _ = trainer.fit(state, split, [Phase(steps=1)], _gen())
    assert seen["keys"] == {"body.weight", "body.bias", "head.weight", "head.bias"}
    assert isinstance(seen["batch"], Batch) and seen["shape"] == (4, 2)
    assert torch.equal(torch.sort(seen["batch"].y).values, torch.sort(split.y).values)
    assert torch.allclose(with_term["head.bias"], plain["head.bias"] - 0.1 * 10.0, atol=1e-6)


def test_kept_optimizer_state_lives_in_the_client_state_and_is_restored():
    trainer, split = _trainer(n=4, batch_size=4, optim=Optim("sgd", lr=0.1, momentum=0.9))
    state = clone(trainer.model.state_dict())
    kept, _ = trainer.fit(state, split, [Phase(steps=1, keep_optimizer="main")], _gen())
    assert "optim.main.head.weight.momentum_buffer" in kept
    again, _ = trainer.fit(kept, split, [Phase(steps=1, keep_optimizer="main")], _gen())
    fresh, _ = trainer.fit({k: v for k, v in kept.items() if not k.startswith("optim.")}, split,
                           [Phase(steps=1, keep_optimizer="main")], _gen())
    # momentum carried over from the first round changes the second step
    assert not torch.allclose(again["head.weight"], fresh["head.weight"])
    buf = kept["optim.main.head.weight.momentum_buffer"]
    assert torch.allclose(again["head.weight"] - kept["head.weight"],
                          fresh["head.weight"] - kept["head.weight"] - 0.1 * 0.9 * buf, atol=1e-6)


def test_evaluate_hand_computed_and_leaves_the_model_alone():
    trainer, _ = _trainer()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]).view(4, 1, 1, 2)
    trainer.x = x
    state = {"body.weight": torch.eye(2), "body.bias": torch.zeros(2), "head.weight": torch.eye(2),
             "head.bias": torch.zeros(2), "extra.kept": torch.ones(3)}  # a method's extra entry is ignored
    before = clone(trainer.model.state_dict())
    correct, count, loss = trainer.evaluate(state, Split(torch.arange(4), torch.tensor([0, 1, 1, 1])))
    assert (correct, count) == (3, 4)  # predicts 0, 1, 0, 1
    expected = nn.functional.cross_entropy(torch.eye(2)[[0, 1, 0, 1]], torch.tensor([0, 1, 1, 1]), reduction="sum")
    assert loss == pytest.approx(expected.item())
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())


def test_a_batch_of_one_is_skipped_where_batchnorm_cannot_train_on_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    x = torch.randn(5, 1, 1, 2)
    split = Split(torch.arange(5), torch.tensor([0, 1, 0, 1, 1]))
    trainer = Trainer(model, x, 2, "none", Optim("sgd", lr=0.1))
    state = clone(model.state_dict())
    steps = []
    trainer.check_interrupt = lambda: steps.append(1)
    new, loss = trainer.fit(state, split, [Phase(epochs=2)], _gen())
    # 3 batches per epoch (2, 2, 1), the batch of one skipped: 4 steps trained, a finite loss
    assert len(steps) == 6 and loss == loss and not torch.equal(new["1.weight"], state["1.weight"])
    assert int(new["2.num_batches_tracked"]) == 4
    # a client holding a single sample trains nothing rather than failing
    one = Split(torch.arange(1), torch.tensor([0]))
    same, nan = trainer.fit(state, one, [Phase(epochs=1)], _gen())
    assert nan != nan and torch.equal(same["1.weight"], state["1.weight"])


def test_client_losses_compare_by_function_and_input_names_not_values():
    from fedfactor.fl.train import ClientLoss

    def fn(params, batch, logits, inputs):
        return inputs["w"] * params["head.weight"].sum()

    a = ClientLoss(fn, {"w": torch.tensor(1.0)})
    b = ClientLoss(fn, {"w": torch.tensor(2.0)})
    assert a == b and Phase(epochs=1, loss=a) == Phase(epochs=1, loss=b)  # such plans train batched
    assert a != ClientLoss(lambda *args: fn(*args), {"w": torch.tensor(1.0)})
    assert a != ClientLoss(fn, {"v": torch.tensor(1.0)})
    params = {"head.weight": torch.ones(2, 2)}
    assert float(b(params, None, None)) == 8.0  # called as a plain extra loss: fn with its own inputs


def _constant(value):
    """An extra loss of a known value that adds no gradient: training is that of its phase without it."""
    return lambda params, batch, logits: logits.detach().sum() * 0 + value


def test_the_reported_loss_is_the_cross_entropy_and_each_extra_loss_has_its_own_term():
    trainer, split = _trainer(n=10, batch_size=4)  # 3 steps an epoch
    state = clone(trainer.model.state_dict())
    plain, plain_loss = trainer.fit(state, split, [Phase(steps=3), Phase(steps=3)], _gen())
    phases = [Phase(steps=3, loss=_constant(3.0), loss_name="a"), Phase(steps=3, loss=_constant(1.0), loss_name="b")]
    new, loss = trainer.fit(state, split, phases, _gen())
    assert all(torch.equal(new[k], plain[k]) for k in plain)  # the same training
    assert isinstance(loss, TrainLoss) and float(loss) == plain_loss  # the cross-entropy alone
    # each term's mean over all six steps of the client's round: 3 * 3 / 6 and 1 * 3 / 6
    assert loss.terms == pytest.approx({"a": 1.5, "b": 0.5})
    # phases with the same loss_name add up to one term; the default name is "reg"
    _, same = trainer.fit(state, split, [Phase(steps=3, loss=_constant(3.0)), Phase(steps=3, loss=_constant(1.0))],
                          _gen())
    assert same.terms == pytest.approx({"reg": 2.0}) and float(same) == plain_loss
    assert plain_loss.terms == {}
    with pytest.raises(ValueError, match="loss_name"):
        Phase(steps=1, loss_name="loss")  # would be the column train_loss


def test_divergence_is_judged_on_the_whole_objective():
    trainer, split = _trainer(n=10, batch_size=4)
    state = clone(trainer.model.state_dict())
    _, loss = trainer.fit(state, split, [Phase(steps=3)], _gen())
    trainer.max_loss = float(loss) + 1  # the cross-entropy alone stays below it, with the extra loss it is above
    with pytest.raises(Diverged):
        trainer.fit(state, split, [Phase(steps=3, loss=_constant(2.0))], _gen())
    assert float(trainer.fit(state, split, [Phase(steps=3, loss=_constant(0.5))], _gen())[1]) == float(loss)
