"""Tests for fedfactor.fedfac_simulation.teacher: the simulation's data (paper 001, section 4.3.1)."""

from __future__ import annotations

import math

import pytest
import torch

from fedfactor.fedfac_simulation.teacher import generate


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


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
