"""SimFed's readings of the criteria embedding (docs/methods/simfed.md) and the spread of the
similarities it logs every round."""

import numpy as np
import pytest
import torch

from fedfactor.config import load_config
from fedfactor.methods.simfed import CRITERIA
from fedfactor.run.simulator import Simulator

BN = ["model.name=cnn_bn"]  # the readings differ only where the body has BatchNorm


def _sim(tiny, *extra):
    # SimFed's protocol: a client is scored with, and keeps, its whole trained model
    return Simulator(load_config(None, tiny + ["method.name=simfed", "eval.model=trained", *extra]))


def _trained(sim):
    sim.run_round(1)
    return sim.states[0]


def test_the_default_embeds_one_gaussian_input_with_the_running_statistics(tiny):
    sim = _sim(tiny, *BN)
    state = _trained(sim)
    body = {k[len("body."):]: v for k, v in state.items() if k.startswith("body.")}
    sim.ctx.model.body.load_state_dict(body, strict=False)
    sim.ctx.model.body.eval()
    with torch.no_grad():
        expected = sim.ctx.model.body(state[CRITERIA]).reshape(-1)
    assert state[CRITERIA].shape == (1, 1, 8, 8)
    assert torch.allclose(sim.method.match_key(0, state), expected)


def test_train_mode_normalises_x_n_by_itself_and_leaves_the_clients_statistics_alone(tiny):
    eval_sim, train_sim = _sim(tiny, *BN), _sim(tiny, *BN, "method.criteria_mode=train")
    state = _trained(train_sim)
    stats = {k: v.clone() for k, v in state.items() if "running_" in k or "num_batches" in k}
    in_train = train_sim.method.match_key(0, state)
    assert all(torch.equal(state[k], v) for k, v in stats.items())
    assert not torch.allclose(in_train, eval_sim.method.match_key(0, state))


def test_several_inputs_are_concatenated_or_averaged(tiny):
    concat = _sim(tiny, *BN, "method.criteria_inputs=3")
    state = _trained(concat)
    mean = _sim(tiny, *BN, "method.criteria_inputs=3", "method.criteria_pool=mean")
    z_concat, z_mean = concat.method.match_key(0, state), mean.method.match_key(0, state)
    assert z_concat.shape == (3 * 64,) and z_mean.shape == (64,)
    assert torch.allclose(z_mean, z_concat.reshape(3, 64).mean(0), atol=1e-6)


@pytest.mark.slow
def test_every_round_logs_the_full_similarity_matrix_and_its_spread(tiny):
    sim = _sim(tiny, *BN, "fl.clients=5")
    for record in sim.run():
        d, z = record.diagnostics, record.arrays["similarity_z"]
        others = z[~np.eye(5, dtype=bool)]
        assert z.shape == (5, 5) and np.isfinite(others).all()
        assert d["similarity_max_other"] == pytest.approx(others.max())
        assert d["similarity_mean_other"] == pytest.approx(others.mean())
        for q in (10, 50, 90):
            assert d[f"similarity_q{q}_other"] == pytest.approx(np.quantile(others, q / 100))
        assert others.min() < d["similarity_q50_other"] < others.max()  # 20 distinct pairs' values

