"""Methods' local-training plans, read without training: which phases a client runs, in which order,
for how many epochs, which parameters each trains and which extra loss it adds.

Built on the tiny digits cnn (no data is trained on; building a simulator takes hundredths of a second).
"""

import pytest
import torch

from fedfactor.config import load_config
from fedfactor.run.simulator import Simulator

from ..conftest import TINY


def _sim(*extra):
    return Simulator(load_config(None, [*TINY, *extra]))


def _plan(sim, k=0):
    return sim.method.plan(k, sim.states[k], {})


# -- Factorized-FL: the L1 term on mu (docs/methods/factorized_fl.md, "l1_mode") -------------------


@pytest.mark.parametrize("name", ["factorized_fl_alpha", "factorized_fl_beta"])
def test_as_run_factorized_fl_trains_without_an_l1_term(name):
    """Catches: the L1 term acting in the as-run (official) mode, whose code applies it to detached
    tensors, so it has no effect; lambda itself is not 0, so the mode alone must keep it out."""
    sim = _sim(f"method.name={name}")
    assert sim.method.hp.l1_mode == "official" and sim.method.hp.l1 > 0
    (phase,) = _plan(sim)
    assert phase.loss is None
    assert phase.params is None and phase.epochs == sim.ctx.epochs  # every parameter, the run's epochs


@pytest.mark.parametrize("name", ["factorized_fl_alpha_text", "factorized_fl_beta_text"])
def test_text_factorized_fl_adds_lambda_times_the_l1_norm_of_mu(name):
    """Catches: the L1 term not acting in the text (paper) mode, or acting on something else than mu."""
    sim = _sim(f"method.name={name}", "fl.epochs=3")
    m = sim.method
    assert m.hp.l1_mode == "paper" and m.hp.l1 == pytest.approx(5e-4)
    (phase,) = _plan(sim)
    assert phase.loss is not None and phase.loss_name == "l1"
    assert phase.params is None and phase.epochs == 3
    assert m.mu_keys and all(key.endswith(".mu") for key in m.mu_keys)
    params = {k: torch.randn_like(p).requires_grad_() for k, p in sim.model.named_parameters()}
    value = phase.loss(params, None, None)
    expected = m.hp.l1 * sum(params[key].detach().abs().sum() for key in m.mu_keys)
    assert value.item() == pytest.approx(expected.item(), rel=1e-5)
    value.backward()
    for key, p in params.items():  # lambda sign(mu) on mu, nothing on u, v, biases or the head
        if key in m.mu_keys:
            assert torch.allclose(p.grad, m.hp.l1 * torch.sign(p.detach()))
        else:
            assert p.grad is None, key


# -- FedDecomp: tau first, then sigma (004 eqs. 5-6; docs/methods/feddecomp.md) ---------------------


@pytest.mark.parametrize("name", ["feddecomp", "feddecomp_text", "feddecomp_reverse"])
def test_feddecomp_trains_tau_for_e_lora_epochs_then_sigma_for_the_rest(name):
    """Catches: the two phases swapped (sigma first), their parameter groups or their epochs mixed up
    (E_lora = 2 on tau, E - E_lora = 3 on sigma of E = 5, the official default)."""
    sim = _sim(f"method.name={name}", "fl.epochs=5")
    m = sim.method
    tau = {f"{layer}.{p}" for layer in ("body.0", "body.3", "body.7", "head") for p in ("tau_a", "tau_b")}
    assert set(m.tau_keys) == tau  # every decomposed layer of the cnn, the head included
    tau_phase, sigma_phase = _plan(sim)
    assert set(tau_phase.params) == tau and tau_phase.epochs == 2
    sigma = set(sim.ctx.param_keys) - tau
    assert set(sigma_phase.params) == sigma and sigma_phase.epochs == 3
    assert {"body.0.weight", "head.weight", "head.bias"} <= sigma
    assert tau_phase.loss is None and sigma_phase.loss is None


@pytest.mark.parametrize("e_lora, expected", [(0, [("sigma", 5)]), (5, [("tau", 5)]), (1, [("tau", 1), ("sigma", 4)])])
def test_feddecomp_drops_a_phase_without_epochs(e_lora, expected):
    """Catches: E_lora = 0 (FedAvg, section 3.4) or E_global = 0 (local low-rank) still running an
    empty phase, or the epochs split the other way round."""
    sim = _sim("method.name=feddecomp", "fl.epochs=5", f"method.e_lora={e_lora}")
    tau = set(sim.method.tau_keys)
    got = [("tau" if set(p.params) == tau else "sigma", p.epochs) for p in _plan(sim)]
    assert got == expected


# -- FedProx: mu/2 ||w - w_global||^2 (Li et al. 2020, eq. 2) ------------------------------------------


def test_fedprox_pulls_towards_the_received_global_model_with_mu_over_two():
    """Catches: the proximal term weighted mu instead of mu/2, or anchored anywhere but the global
    model the client received this round."""
    sim = _sim("method.name=fedprox", "method.mu=0.3", "fl.epochs=2")
    received = {k: torch.randn_like(v) for k, v in sim.states[0].items()}
    (phase,) = sim.method.plan(0, sim.states[0], received)
    assert phase.params is None and phase.epochs == 2 and phase.loss_name == "proximal"
    params = {k: torch.randn_like(p) for k, p in sim.model.named_parameters()}
    expected = 0.3 / 2 * sum(((params[k] - received[k]) ** 2).sum() for k in params)
    assert phase.loss(params, None, None).item() == pytest.approx(expected.item(), rel=1e-6)
    (plain,) = _sim("method.name=fedprox", "method.mu=0").method.plan(0, sim.states[0], received)
    assert plain.loss is None  # mu = 0 is FedAvg
