import json
import math

import pytest
import torch
from torch import nn

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Optim, Split, Trainer
from fedfactor.methods import METHODS, Context
from fedfactor.methods.pfedsd import TEACHER, distillation
from fedfactor.models import HeadedModel

from ..conftest import record_uploads

# cnn on digits: the whole model, as FedAvg sends it
CNN_FLOATS = (32 * 25 + 32) + (64 * 32 * 25 + 64) + (512 * 256 + 512) + (512 * 10 + 10)


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=pfedsd", *extra]))


def _linear_client(**hp):
    """pFedSD bound to a 2-class linear classifier of a scalar input and one sample x = 1, y = 0,
    trained by the real Trainer (SGD, lr 1, one epoch of one batch)."""
    method = METHODS.get("pfedsd")(**hp)
    model = HeadedModel(nn.Flatten(), nn.Linear(1, 2))
    x = torch.ones(1, 1)
    split = Split(torch.tensor([0]), torch.tensor([0]))
    trainer = Trainer(model, x, batch_size=1, augment="none", optim=Optim("sgd", lr=1.0))
    params = [k for k, _ in model.named_parameters()]
    ctx = Context(model=model, num_clients=1, train_sizes=[1], param_keys=params, buffer_keys=[], head_keys=params,
                  head_local=False, epochs=1, optim=Optim("sgd", lr=1.0),
                  fit=lambda k, state, phases: trainer.fit(state, split, phases, torch.Generator().manual_seed(0)),
                  evaluate=None, split=lambda k, name: split, batches=None, log=lambda n, v: None)
    method.bind(ctx)
    zero = {key: torch.zeros_like(v) for key, v in model.state_dict().items()}
    return method, zero


def test_the_distillation_term_by_hand():
    # T = 2, lambda = 0.5. Sample 1: student (2 log 3, 0) / T -> q = (3/4, 1/4), teacher (0, 0) -> (1/2, 1/2):
    # KL(teacher || student) = 1/2 log(2/3) + 1/2 log 2 = 1/2 log(4/3). Sample 2: equal logits, KL 0.
    # Batch mean, times lambda T^2 = 2: 2 * (1/2 log(4/3)) / 2 = log(4/3) / 2
    student = torch.tensor([[2 * math.log(3), 0.0], [1.0, -1.0]])
    teacher = torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    assert distillation(student, teacher, 2.0, 0.5).item() == pytest.approx(math.log(4 / 3) / 2, rel=1e-6)
    # the direction matters: KL(student || teacher) would be 3/4 log(3/2) + 1/4 log(1/2) per sample
    assert distillation(student, teacher, 2.0, 0.5).item() != pytest.approx(
        (0.75 * math.log(1.5) + 0.25 * math.log(0.5)) / 2, rel=1e-3)


def test_the_first_round_is_plain_cross_entropy_and_its_model_becomes_the_teacher():
    method, zero = _linear_client(temperature=1.0, lam=1.0)
    assert method.plan(0, zero, {})[0].loss is None  # no previous model: no distillation
    new, loss = method.local_train(0, zero, {})
    # CE at logits (0, 0), label 0: gradient (p - e_0) x = (-1/2, 1/2); SGD lr 1
    assert torch.allclose(new["head.bias"], torch.tensor([0.5, -0.5]))
    assert loss == pytest.approx(math.log(2), rel=1e-6)
    assert {key for key in new if key.startswith(TEACHER)} == {TEACHER + "head.weight", TEACHER + "head.bias"}
    assert torch.equal(new[TEACHER + "head.bias"], new["head.bias"])


def test_the_teacher_is_the_previous_personalised_model_not_the_received_one():
    method, zero = _linear_client(temperature=1.0, lam=1.0)
    # received: zeros (p = (1/2, 1/2)); kept from the last round: bias (log 3, 0), so p_teacher = (3/4, 1/4)
    state = {**zero, TEACHER + "head.weight": torch.zeros(2, 1),
             TEACHER + "head.bias": torch.tensor([math.log(3), 0.0])}
    assert method.plan(0, state, {})[0].loss is not None
    new, loss = method.local_train(0, state, {})
    # gradient at the student's logits: CE (1/2 - 1, 1/2) + lambda T (q - p_teacher) = (-1/2, 1/2) + (-1/4, 1/4)
    assert torch.allclose(new["head.bias"], torch.tensor([0.75, -0.75]))
    assert torch.allclose(new["head.weight"], torch.tensor([[0.75], [-0.75]]))
    # reported apart: the cross-entropy ln 2 as the loss, KL(p_teacher || q) as the term train_distill
    assert loss == pytest.approx(math.log(2), rel=1e-6)
    assert loss.terms == {"distill": pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel=1e-6)}
    # this round's model is the next round's teacher
    assert torch.equal(new[TEACHER + "head.bias"], new["head.bias"])
    assert torch.equal(state[TEACHER + "head.bias"], torch.tensor([math.log(3), 0.0]))  # input untouched


@pytest.mark.slow
def test_a_training_mode_teacher_leaves_its_batchnorm_statistics_alone(tiny):
    sim = _sim(tiny, "model.name=resnet8")
    m = sim.method
    sim.ctx.round = 1
    first, _ = m.local_train(0, sim.states[0], {})
    kept = {key: value.clone() for key, value in first.items() if key.startswith(TEACHER)}
    sim.ctx.round, sim._generators = 2, {}
    second, _ = m.local_train(0, m.receive(0, first, m.download(sim.server, 0)), {})
    assert all(torch.equal(first[key], value) for key, value in kept.items())
    assert not torch.equal(second[TEACHER + "body.bn1.running_mean"], kept[TEACHER + "body.bn1.running_mean"])


def test_teacher_mode_decides_how_batchnorm_normalises_the_teacher(tiny):
    train, evaluate = _sim(tiny, "model.name=resnet8"), _sim(tiny, "model.name=resnet8", "method.teacher_mode=eval")
    teacher = {key: value.clone() for key, value in train.states[0].items()}
    teacher["body.bn1.running_mean"] = torch.full_like(teacher["body.bn1.running_mean"], 5.0)
    x = train.x[train.clients[0]["train"].idx[:8]]
    train.model.train()
    evaluate.model.train()
    by_batch = train.method.teacher_logits(teacher, x)
    by_running = evaluate.method.teacher_logits(teacher, x)
    train.model.load_state_dict(teacher)
    assert torch.allclose(by_batch, train.model(x), atol=1e-5)  # batch statistics: running ones play no part
    train.model.load_state_dict(teacher)  # the training-mode pass above moved the model's own statistics
    train.model.eval()
    assert torch.allclose(by_running, train.model(x), atol=1e-5)
    assert not torch.allclose(by_batch, by_running, atol=1e-3)
    assert evaluate.model.training  # the student's mode is restored


@pytest.mark.slow
def test_two_rounds_train_send_fedavgs_bytes_and_score_the_personalised_model(tiny):
    sim = _sim(tiny)
    sent = record_uploads(sim)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    assert records[-1].train_loss < records[0].train_loss
    # the distillation term is reported apart (train_distill), from the second round, the first with a teacher
    assert [set(r.loss_terms) for r in records] == [set(), {"distill"}] and records[1].loss_terms["distill"] > 0
    assert [r.bytes_up_round for r in records] == [r.bytes_down_round for r in records] == [4 * CNN_FLOATS * 4] * 2
    assert not any(key.startswith(TEACHER) for key in sent[0])
    # under eval.model received, a client is scored with its own last trained model, not the global one
    scored = sim.scored_state(0)
    assert torch.equal(scored["head.weight"], sim.states[0][TEACHER + "head.weight"])
    assert not torch.equal(scored["head.weight"], sim.server["global"]["head.weight"])


def test_cost_is_fedavgs(tiny, capsys):
    sets = [a for s in tiny for a in ("--set", s)]
    costs = []
    for name in ("fedavg", "pfedsd"):
        assert main(["cost", *sets, "--set", f"method.name={name}", "--json"]) == 0
        costs.append(json.loads(capsys.readouterr().out))
    assert costs[0]["bytes_up"] == costs[1]["bytes_up"] == 2 * 4 * CNN_FLOATS * 4
    assert costs[0]["bytes_down"] == costs[1]["bytes_down"]


@pytest.mark.parametrize("bad, key", [("method.temperature=0", "method.temperature"),
                                      ("method.lam=-1", "method.lam"),
                                      ("method.teacher_mode=test", "method.teacher_mode"),
                                      ("method.lambda=1", "lambda")])
def test_bad_hyperparameters_are_one_line_usage_errors(tiny, bad, key):
    with pytest.raises(UsageError) as e:
        _sim(tiny, bad)
    assert key in str(e.value) and "\n" not in str(e.value)
