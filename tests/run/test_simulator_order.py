"""The round loop's order and its checkpoints, fast: a round's score is of the state after that round's
local training, and a checkpoint restores everything the next round depends on, so a resumed run goes
on from the round after the last completed one with the global random streams where they were.

All on the tiny digits config with the mlp, whose round takes a few hundredths of a second.
"""

import io
import random

import numpy as np
import pytest
import torch

from fedfactor.config import load_config
from fedfactor.errors import Interrupted
from fedfactor.run.simulator import Simulator

from ..conftest import TINY


def _sim(*extra):
    return Simulator(load_config(None, [*TINY, "model.name=mlp", *extra]))


def _same_scores(a, b):
    return a.correct.tolist() == b.correct.tolist() and a.count.tolist() == b.count.tolist() and a.loss == b.loss


def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("model", ["received", "trained"])
def test_a_rounds_score_is_of_the_state_after_its_local_training(model):
    """Catches: `run` scoring the model before the round's local training (evaluate before run_round)."""
    sim = _sim("fl.rounds=1", f"eval.model={model}")
    before = sim.evaluate(("test",))["test"]  # the initial model, as every client holds it
    (rec,) = sim.run()
    after = sim.evaluate(("test",))["test"]  # the state the round left
    assert rec.round == 1
    assert _same_scores(rec.test, after)
    assert not _same_scores(rec.test, before)  # the round trained: its score moved


def test_run_trains_each_round_before_it_scores_it():
    """Catches: evaluate called before run_round in `run` (or a round scored with the next round's state)."""
    sim = _sim("fl.rounds=3", "fl.eval_every=1")
    calls = []
    run_round, evaluate = sim.run_round, sim.evaluate
    sim.run_round = lambda rnd: calls.append(("train", rnd)) or run_round(rnd)
    sim.evaluate = lambda splits=("test",): calls.append(("score", len(sim.meter.history))) or evaluate(splits)
    records = sim.run()
    # each round trains, then is scored with the meter already holding that round
    assert calls == [("train", 1), ("score", 1), ("train", 2), ("score", 2), ("train", 3), ("score", 3)]
    assert [r.round for r in records] == [1, 2, 3]


def _draws():
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), [random.random() for _ in range(4)]


def _scramble(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def test_a_checkpoint_round_trip_restores_round_states_records_meter_and_random_streams():
    """Catches: load_state_dict not restoring the torch / numpy / python random state, the round number,
    records, clients' states, the server or the meter; and a resumed run going on one round off (a round
    repeated or skipped, or not the uninterrupted run's round 2)."""
    sim = _sim("fl.rounds=2")

    def stop_after_first(rec):
        sim.stop_signal = 15  # as the job's signal handler: round 2 stops at its first training step

    with pytest.raises(Interrupted):
        sim.run(stop_after_first)
    assert sim.round == 1 and len(sim.records) == 1
    _scramble(7)
    _draws()  # the global streams somewhere no seed puts them
    buf = io.BytesIO()
    torch.save(sim.state_dict(), buf)  # as the job writes it, loaded weights_only
    expected = _draws()

    resumed = _sim("fl.rounds=2")
    _scramble(12345)
    buf.seek(0)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert _draws() == expected  # torch, numpy and python streams all restored
    assert resumed.round == 1
    assert [r.to_dict() for r in resumed.records] == [r.to_dict() for r in sim.records]
    assert all(_same_state(a, b) for a, b in zip(resumed.states, sim.states, strict=True))
    assert _same_state(resumed.server["global"], sim.server["global"])
    assert resumed.meter.state_dict() == sim.meter.state_dict() and resumed.meter.up > 0

    records = resumed.run()
    assert [r.round for r in records] == [1, 2]  # goes on from round 2, once
    reference = _sim("fl.rounds=2").run()  # the uninterrupted run
    assert records[1].train_loss == reference[1].train_loss
    assert _same_scores(records[1].test, reference[1].test)
    assert (records[1].bytes_up, records[1].bytes_down) == (reference[1].bytes_up, reference[1].bytes_down)


def test_each_round_samples_its_own_clients_fixed_by_the_seed_and_the_round():
    """Catches: the same clients drawn every round (the round left out of the draw's seed), or a draw
    that depends on anything but the run's seed and the round (a resumed run would sample others)."""
    rounds = range(1, 21)
    drawn = [_sim("fl.clients=10", "fl.fraction=0.3").sample(r) for r in rounds]
    assert all(len(set(s)) == 3 for s in drawn)
    assert len({tuple(s) for s in drawn}) > 5 and set().union(*drawn) == set(range(10))
    again = _sim("fl.clients=10", "fl.fraction=0.3")
    assert [again.sample(r) for r in reversed(rounds)][::-1] == drawn  # no state carried between draws
    assert [_sim("fl.clients=10", "fl.fraction=0.3", "seed=1").sample(r) for r in rounds] != drawn
