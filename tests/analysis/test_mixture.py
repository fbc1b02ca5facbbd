"""Tests for fedfactor.analysis.mixture: the simplex projection, Agnostic-FL's ascent step, entropy."""

import math

import pytest
import torch

from fedfactor.analysis.mixture import ascend, entropy, project_simplex


def test_projection_of_a_point_on_the_simplex_is_itself_and_of_a_vertex_shift_is_the_vertex():
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert torch.allclose(project_simplex(p), p)
    assert torch.equal(project_simplex(torch.tensor([5.0, 0.0, 0.0])), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))


def test_projection_respects_the_floor():
    # (0.9, 0.1, 0) with floor 0.2: the two small weights sit at the floor, the rest goes to the first
    out = project_simplex(torch.tensor([0.9, 0.1, 0.0]), floor=0.2)
    assert torch.allclose(out, torch.tensor([0.6, 0.2, 0.2], dtype=torch.float64))


def test_ascend_moves_lambda_towards_the_clients_with_the_larger_loss():
    lam = torch.full((3,), 1 / 3, dtype=torch.float64)
    # hand-computed: lam + 0.1 * (0.3, 0, 0) = (0.3633, 0.3333, 0.3333); the projection removes 0.01 from each
    out = ascend(lam, {0: 0.3, 1: 0.0}, step=0.1)
    assert out.tolist() == pytest.approx([1 / 3 + 0.02, 1 / 3 - 0.01, 1 / 3 - 0.01])


def test_ascend_ignores_clients_that_did_not_report_or_reported_nan():
    lam = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert torch.equal(ascend(lam, {0: math.nan}, step=1.0), lam)
    assert torch.equal(ascend(lam, {}, step=1.0), lam)


def test_entropy_is_log_k_for_uniform_and_zero_for_a_vertex():
    assert entropy(torch.full((4,), 0.25)) == pytest.approx(math.log(4))
    assert entropy(torch.tensor([1.0, 0.0, 0.0])) == 0.0
