"""Tests for fedfactor.report.simulation: FedFac's simulation study (paper 001, section 4.3)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedfactor.report.simulation import (aggregate, fa_mask, generate, init_mlp, load_simulation_config,
                                           local_train, loss_and_grads, run_setting, settings_of)
from fedfactor.cli import main
from fedfactor.errors import UsageError

CONFIG = str(Path(__file__).resolve().parents[2] / "config" / "simulation" / "fedfac.yaml")
# A tiny study: 6 clients, d = 10, m = 12, 3 rounds, one seed; well under a second.
TINY = ["data.clients=6", "data.d=10", "data.m=12", "data.train_samples=30", "data.test_samples=30",
        "train.rounds=3", "train.warmup_steps=2", "seeds=[0]"]


def _sets(items):
    return [a for s in items for a in ("--set", s)]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------- generator


def test_generator_shapes_masks_and_labels():
    data = generate(8, 20, 30, p=0.3, alpha=0.4, n_train=50, n_test=40, generator=_gen())
    assert data.x_train.shape == (8, 50, 20) and data.x_test.shape == (8, 40, 20)
    assert data.y_train.shape == (8, 50) and data.y_test.shape == (8, 40)
    assert data.weights.shape == (8, 30, 20) and data.a.shape == (30,) and data.mu.shape == (8, 12)
    # d2 = 8 shared covariates (the last ones), m2 = 9 shared units (the last ones, eq. 8)
    assert data.d1 == 12 and data.m1 == 21
    assert data.shared.tolist() == [False] * 21 + [True] * 9
    y = torch.cat([data.y_train, data.y_test], 1)
    assert set(y.unique().tolist()) == {0.0, 1.0}
    # the default threshold (each client's median of h*) balances every client's classes
    assert torch.allclose(y.mean(1), torch.full((8,), 0.5), atol=0.05)


def test_shared_parameters_are_identical_across_clients_and_personal_ones_differ():
    data = generate(5, 20, 30, p=0.5, alpha=0.4, n_train=10, n_test=10, generator=_gen(1))
    shared, personal = data.weights[:, data.shared], data.weights[:, ~data.shared]
    assert torch.equal(shared, shared[:1].expand_as(shared))
    assert (personal[0] != personal[1]).all()
    d1 = data.d1
    # w^sp ~ U(-0.1, 0.1) on personal covariates, w^ss ~ U(-1, 1) on shared ones; w^ps ~ U(-0.1, 0.1)
    assert shared[..., :d1].abs().max() <= 0.1 and 0.5 < shared[..., d1:].abs().max() <= 1
    assert personal[..., d1:].abs().max() <= 0.1


def test_generator_distributions_on_a_large_draw():
    data = generate(4, 40, 40, p=0.5, alpha=0.5, n_train=20000, n_test=1, generator=_gen(2))
    d1 = data.d1
    x_p = data.x_train[..., :d1] - data.mu[:, None, :]  # x_p - mu_c ~ N(0, Sigma)
    x_s = data.x_train[..., d1:]  # ~ N(0, I)
    var = x_p.pow(2).mean((0, 1))
    lag1 = (x_p[..., 1:] * x_p[..., :-1]).mean((0, 1)) / var[1:]
    lag2 = (x_p[..., 2:] * x_p[..., :-2]).mean((0, 1)) / var[2:]
    assert torch.allclose(var, torch.ones(d1), atol=0.05)
    assert abs(float(lag1.mean()) - 0.5) < 0.01 and abs(float(lag2.mean()) - 0.25) < 0.01
    assert abs(float(x_s.mean())) < 0.01 and abs(float(x_s.var()) - 1) < 0.02
    assert abs(float((x_s[..., 1:] * x_s[..., :-1]).mean())) < 0.01
    # w^pp_cq ~ N(mu_c, I): mean over a client's personal units is mu_c, variance 1
    w_pp = data.weights[:, ~data.shared, :d1]
    assert (w_pp.mean(1) - data.mu).abs().max() < 4 / math.sqrt(w_pp.shape[1])
    assert abs(float((w_pp - data.mu[:, None, :]).var()) - 1) < 0.1


def test_paper_threshold_gives_one_class_labels_at_the_paper_size():
    # Why label_threshold defaults to client_median: y = 1 iff y* > 0, as written, is one class.
    data = generate(4, 100, 200, p=0.5, alpha=0.4, n_train=200, n_test=1, label_threshold="zero",
                    generator=_gen(0))
    majority = torch.maximum(data.y_train.mean(1), 1 - data.y_train.mean(1))
    assert float(majority.mean()) > 0.95


def test_generator_rejects_settings_without_shared_or_personal_parts():
    with pytest.raises(ValueError, match="no shared or no personal"):
        generate(3, 10, 10, p=0.01, alpha=0.5, n_train=5, n_test=5)


# ------------------------------------------------------------------------------ student training


def test_batched_gradients_are_each_clients_own():
    data = generate(3, 8, 10, p=0.5, alpha=0.5, n_train=20, n_test=1, generator=_gen(3))
    model = init_mlp(3, 10, 8, _gen(4))
    local_train(model, data.x_train, data.y_train, lr=0.1, steps=2)  # clients differ now
    loss, grad = loss_and_grads(model, data.x_train, data.y_train)
    for c in range(3):  # one client alone, as a plain MLP
        W, b, a, b0 = (t[c].clone().requires_grad_(True) for t in (model.W, model.b, model.a, model.b0))
        f = torch.relu(data.x_train[c] @ W.T + b) @ a + b0
        ref = torch.nn.functional.binary_cross_entropy_with_logits(f, data.y_train[c])
        ref.backward()
        assert torch.allclose(loss[c], ref.detach(), atol=1e-6)
        for name, leaf in zip(("W", "b", "a", "b0"), (W, b, a, b0)):
            assert torch.allclose(getattr(grad, name)[c], leaf.grad, atol=1e-6), name


def test_a_round_averages_only_shared_units_and_the_output_layer():
    C, m, d = 4, 6, 5
    data = generate(C, d, m, p=0.5, alpha=0.4, n_train=12, n_test=1, generator=_gen(5))
    model = init_mlp(C, m, d, _gen(6))
    local_train(model, data.x_train, data.y_train, lr=0.2, steps=3)
    before = model.clone()
    participants = torch.tensor([True, True, True, False])
    local_train(model, data.x_train, data.y_train, lr=0.2, steps=2, participants=participants)
    local = model.clone()
    assert torch.equal(local.W[3], before.W[3])  # a client outside the round does not train
    shared = torch.tensor([False, True, False, True, True, False])
    n = torch.tensor([1.0, 2.0, 3.0, 100.0])
    aggregate(model, shared, participants, n)
    w = torch.tensor([1.0, 2.0, 3.0, 0.0]) / 6
    # personal units: each client's own local update (a non-participant keeps its old ones)
    assert torch.equal(model.W[:, ~shared], local.W[:, ~shared])
    assert torch.equal(model.b[:, ~shared], local.b[:, ~shared])
    # shared units: equal across all clients, the participants' sample-weighted mean
    assert torch.allclose(model.W[:, shared], torch.einsum("c,cmd->md", w, local.W[:, shared]).expand(C, -1, -1))
    assert torch.allclose(model.b[:, shared], (w @ local.b[:, shared]).expand(C, -1))
    # the output layer is outside Lambda: shared as in FedAvg
    assert torch.allclose(model.a, (w @ local.a).expand(C, -1)) and torch.allclose(model.b0, (w @ local.b0).expand(C))


def test_oracle_factor_analysis_recovers_the_true_split_and_share_keeps_the_count():
    data = generate(30, 30, 60, p=0.3, alpha=0.4, n_train=1, n_test=1, generator=_gen(7))
    mask = fa_mask(data.weights, "share", 0.3, kappa=0.85, method="principal")
    assert int(mask.sum()) == 18  # m2 = round(0.3 * 60), as the truth
    assert float((mask == data.shared).float().mean()) >= 0.9  # 1.0 at the paper's size (C = d = 100, m = 200)


def test_run_setting_records_every_round_and_is_deterministic():
    cfg = load_simulation_config(CONFIG, TINY + ["decompositions=[true,static,dynamic,random,random_fixed]"])
    first = run_setting(cfg, 0.5, 0.4, 0)
    assert run_setting(cfg, 0.5, 0.4, 0) == first
    for name, h in first.items():
        assert len(h["accuracy"]) == 4 and all(0 <= a <= 1 for a in h["accuracy"])
        assert math.isnan(h["stability"][0]) and h["n_shared"] == [6] * 4  # m2 = 0.5 * 12, for every rule
    for name in ("true", "static", "random_fixed"):  # fixed masks never change state
        assert first[name]["stability"][1:] == [1.0] * 3
    assert first["true"]["agreement"] == [1.0] * 4
    assert min(first["random"]["stability"][1:]) < 1  # `random` is redrawn every round


def test_true_beats_random_and_a_fixed_random_mask_does_not_lose():
    # 20 clients, d = 20, m = 40, 10 rounds: ~0.1 s a seed. Redrawing the mask every round averages
    # personal units away (~10 points lost); a FIXED random mask of the same size is, with exchangeable
    # student units, the same model as the true one (the module docstring's check).
    cfg = load_simulation_config(CONFIG, ["data.clients=20", "data.d=20", "data.m=40", "data.train_samples=40",
                                          "data.test_samples=100", "train.rounds=10"])
    acc = {"true": [], "random": [], "random_fixed": []}
    for seed in (0, 1, 2):
        for name, h in run_setting(cfg, 0.5, 0.4, seed, list(acc)).items():
            acc[name].append(h["accuracy"][-1])
    mean = {name: sum(v) / len(v) for name, v in acc.items()}
    assert mean["true"] - mean["random"] > 0.05
    assert abs(mean["true"] - mean["random_fixed"]) < 0.02


# -------------------------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_cli_runs_a_tiny_study_end_to_end(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--config", CONFIG, *_sets(TINY), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "| setting | true | oracle | static | dynamic | random |" in captured.out
    assert captured.err.count("seed 0: final accuracy") == len(settings_of(load_simulation_config(CONFIG)))
    runs = pd.read_csv(out / "simulation.csv")
    assert len(runs) == 5 * 5 and set(runs.decomposition) == {"true", "oracle", "static", "dynamic", "random"}
    assert runs[["final_accuracy", "best_accuracy", "agreement", "stability"]].notna().all().all()
    assert (runs.best_accuracy >= runs.final_accuracy).all()
    rounds = pd.read_csv(out / "rounds.csv")
    assert sorted(rounds["round"].unique()) == [0, 1, 2, 3]
    md = (out / "simulation.md").read_text()
    assert "p = 0.3, alpha = 0.4" in md and "Paper 001, section 4.3.2" in md and "Measured:" in md
    for name in ("figure6", "figure7"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (out / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("args, message", [
    (["--set", "data.bogus=1"], "unknown config key 'data.bogus'"),
    (["--set", "split.tau=banana"], "split.tau"),
    (["--set", "grid.p=[0.3,1.5]"], "grid.p"),
    (["--set", "decompositions=[true,magic]"], "decompositions"),
    (["--set", "grid.p=[0.001]"], "no shared or no personal"),
    (["--set", "train.rounds=0"], "train.rounds"),
])
def test_bad_config_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    out = tmp_path / "sim"
    assert main(["simulate", "--config", CONFIG, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedfactor: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_missing_config_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_simulation_config(tmp_path / "nope.yaml")


def test_config_file_states_the_defaults():
    assert load_simulation_config(CONFIG) == load_simulation_config()
