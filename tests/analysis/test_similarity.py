"""Tests for fedfactor.analysis.similarity: cosine similarity and mixing weights (000 eqs. 4-5)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfactor.analysis.similarity import cosine_matrix, mixing_weights

SETTINGS = settings(max_examples=40, deadline=None)
RULES = [("similarity", "paper"), ("similarity", "official"), ("random", "paper"),
         ("worst", "paper"), ("fedavg", "paper")]


# ---------------------------------------------------------------- cosine_matrix


def test_cosine_matrix_matches_pairwise_cosine_similarity():
    keys = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(0))
    sim = cosine_matrix(keys)
    assert sim.shape == (6, 6) and sim.dtype == torch.float64
    flat = keys.reshape(6, -1).double()
    for a in range(6):
        for b in range(6):
            expected = F.cosine_similarity(flat[a], flat[b], dim=0)
            assert abs(sim[a, b] - expected) < 1e-12


def test_cosine_matrix_is_symmetric_with_unit_diagonal():
    keys = torch.randn(9, 17, generator=torch.Generator().manual_seed(1)) * 100
    sim = cosine_matrix(keys)
    torch.testing.assert_close(sim, sim.T, rtol=0, atol=1e-15)
    torch.testing.assert_close(sim.diagonal(), torch.ones(9, dtype=torch.float64), rtol=0, atol=1e-12)
    assert (sim.abs() <= 1 + 1e-12).all()


def test_cosine_matrix_is_scale_invariant_and_sign_aware():
    k = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [-1.0, -2.0, -3.0], [3.0, 0.0, -1.0]])
    sim = cosine_matrix(k)
    assert abs(sim[0, 1] - 1) < 1e-12
    assert abs(sim[0, 2] + 1) < 1e-12
    assert abs(sim[0, 3]) < 1e-12


# ---------------------------------------------------------------- mixing_weights: properties


@st.composite
def similarity_matrices(draw):
    n = draw(st.integers(1, 8))
    vals = draw(st.lists(st.floats(-1, 1, allow_nan=False), min_size=n * n, max_size=n * n))
    m = torch.tensor(vals, dtype=torch.float64).reshape(n, n)
    m = torch.triu(m, 1)
    m = m + m.T
    m.fill_diagonal_(1.0)
    return m


@SETTINGS
@given(sim=similarity_matrices(), tau=st.floats(-1, 1), epsilon=st.floats(0.1, 30),
       rule=st.sampled_from(RULES), minimum_aggr=st.integers(1, 10), num_matched=st.integers(0, 10),
       seed=st.integers(0, 2**31 - 1))
def test_rows_are_probability_vectors_with_positive_self_weight(sim, tau, epsilon, rule, minimum_aggr,
                                                                num_matched, seed):
    matching, weighting = rule
    n = len(sim)
    sizes = torch.arange(1, n + 1, dtype=torch.float64)
    w = mixing_weights(sim, matching, weighting, tau=tau, epsilon=epsilon, minimum_aggr=minimum_aggr,
                       num_matched=num_matched, sizes=sizes, generator=torch.Generator().manual_seed(seed))
    assert w.shape == (n, n)
    assert torch.isfinite(w).all()
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
    assert (w.diagonal() > 0).all()


@SETTINGS
@given(sim=similarity_matrices(), tau=st.floats(-1, 1), epsilon=st.floats(0.1, 30))
def test_paper_rule_is_softmax_over_clients_at_or_above_tau(sim, tau, epsilon):
    w = mixing_weights(sim, "similarity", "paper", tau=tau, epsilon=epsilon)
    n = len(sim)
    for k in range(n):
        kept = [j for j in range(n) if j == k or sim[k, j] >= tau]
        denom = sum(math.exp(epsilon * (1.0 if j == k else float(sim[k, j]))) for j in kept)
        assert math.isclose(float(w[k, k]), math.exp(epsilon) / denom, rel_tol=1e-9)
        for j in range(n):
            if j == k:
                continue
            if sim[k, j] < tau:
                assert w[k, j] == 0
            else:
                assert math.isclose(float(w[k, j]), math.exp(epsilon * float(sim[k, j])) / denom, rel_tol=1e-9)


@SETTINGS
@given(sim=similarity_matrices(), tau=st.floats(-1, 1), epsilon=st.floats(0.1, 30),
       minimum_aggr=st.integers(1, 10))
def test_official_rule_keeps_max_of_count_and_minimum_clients(sim, tau, epsilon, minimum_aggr):
    w = mixing_weights(sim, "similarity", "official", tau=tau, epsilon=epsilon, minimum_aggr=minimum_aggr)
    n = len(sim)
    sigma = sim.clone()
    sigma.fill_diagonal_(1.0)
    for k in range(n):
        expected = min(n, max(int((sigma[k] >= tau).sum()), minimum_aggr))
        kept = w[k] > 0
        assert int(kept.sum()) == expected
        assert kept[k]
        # the kept clients are the most similar ones
        if kept.sum() < n:
            assert sigma[k][kept].min() >= sigma[k][~kept].max()


@SETTINGS
@given(sim=similarity_matrices(), num_matched=st.integers(0, 10), seed=st.integers(0, 2**31 - 1),
       matching=st.sampled_from(["random", "worst"]))
def test_random_and_worst_keep_self_plus_num_matched_others(sim, num_matched, seed, matching):
    n = len(sim)
    w = mixing_weights(sim, matching, num_matched=num_matched, epsilon=1.0,
                       generator=torch.Generator().manual_seed(seed))
    assert ((w > 0).sum(1) == min(num_matched, n - 1) + 1).all()
    if matching == "worst":
        for k in range(n):
            others = torch.tensor([j for j in range(n) if j != k], dtype=torch.long)
            if 0 < len(others) and num_matched < len(others):
                picked = others[w[k, others] > 0]
                left = others[w[k, others] == 0]
                if len(picked):
                    assert sim[k, picked].max() <= sim[k, left].min()


def test_self_score_is_taken_as_one_whatever_the_diagonal():
    sim = torch.tensor([[0.0, 0.5], [0.5, -3.0]], dtype=torch.float64)
    w = mixing_weights(sim, tau=0.0, epsilon=1.0)
    e = math.exp
    assert math.isclose(float(w[0, 0]), e(1) / (e(1) + e(0.5)), rel_tol=1e-12)
    assert math.isclose(float(w[1, 1]), e(1) / (e(1) + e(0.5)), rel_tol=1e-12)


# ---------------------------------------------------------------- mixing_weights: hand-computed cases


SIGMA4 = torch.tensor([
    [1.0, 0.8, 0.2, -0.5],
    [0.8, 1.0, 0.1, 0.3],
    [0.2, 0.1, 1.0, 0.6],
    [-0.5, 0.3, 0.6, 1.0],
], dtype=torch.float64)


def test_paper_rule_hand_computed_four_clients():
    w = mixing_weights(SIGMA4, "similarity", "paper", tau=0.5, epsilon=2.0)
    e = math.exp
    d0 = e(2) + e(1.6)
    expected0 = [e(2) / d0, e(1.6) / d0, 0.0, 0.0]
    d2 = e(2) + e(1.2)
    expected2 = [0.0, 0.0, e(2) / d2, e(1.2) / d2]
    torch.testing.assert_close(w[0], torch.tensor(expected0, dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(w[2], torch.tensor(expected2, dtype=torch.float64), rtol=1e-12, atol=0)
    # client 1 keeps itself and client 0 (0.8); 0.1 and 0.3 are below tau
    assert (w[1] > 0).tolist() == [True, True, False, False]


def test_thresholding_excludes_clients_below_tau():
    for tau in (-1.0, -0.5, 0.0, 0.25, 0.7, 0.9, 1.0):
        w = mixing_weights(SIGMA4, tau=tau, epsilon=3.0)
        for k in range(4):
            for j in range(4):
                if j != k:
                    assert (w[k, j] > 0) == bool(SIGMA4[k, j] >= tau), (tau, k, j)


def test_tau_one_keeps_only_self():
    w = mixing_weights(SIGMA4, tau=1.0, epsilon=5.0)
    assert torch.equal(w, torch.eye(4, dtype=torch.float64))


def test_official_rule_fills_up_to_minimum_aggr():
    e = math.exp
    # row 0: only clients 0 and 1 reach tau 0.5; minimum_aggr 3 adds the next best (client 2)
    w = mixing_weights(SIGMA4, "similarity", "official", tau=0.5, epsilon=2.0, minimum_aggr=3)
    d = e(2) + e(1.6) + e(0.4)
    torch.testing.assert_close(w[0], torch.tensor([e(2) / d, e(1.6) / d, e(0.4) / d, 0.0],
                                                  dtype=torch.float64), rtol=1e-12, atol=0)
    assert (w > 0).sum(1).tolist() == [3, 3, 3, 3]
    # minimum_aggr beyond n keeps everybody
    w = mixing_weights(SIGMA4, "similarity", "official", tau=0.5, epsilon=2.0, minimum_aggr=10)
    assert (w > 0).all()
    # minimum_aggr below the count changes nothing: the official rule equals the paper rule here
    w_off = mixing_weights(SIGMA4, "similarity", "official", tau=0.5, epsilon=2.0, minimum_aggr=1)
    w_pap = mixing_weights(SIGMA4, "similarity", "paper", tau=0.5, epsilon=2.0)
    torch.testing.assert_close(w_off, w_pap, rtol=0, atol=1e-15)


def test_official_rule_prefers_self_among_ties_at_one():
    sim = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    w = mixing_weights(sim, "similarity", "official", tau=2.0, minimum_aggr=1)
    assert torch.equal(w, torch.eye(3, dtype=torch.float64))


def test_worst_picks_the_least_similar_others():
    w = mixing_weights(SIGMA4, "worst", num_matched=2, epsilon=1.0)
    kept = [set(torch.nonzero(w[k] > 0).flatten().tolist()) for k in range(4)]
    assert kept == [{0, 3, 2}, {1, 2, 3}, {2, 1, 0}, {3, 0, 1}]
    e = math.exp
    d = e(1) + e(-0.5) + e(0.2)
    assert math.isclose(float(w[0, 3]), e(-0.5) / d, rel_tol=1e-12)
    # num_matched beyond n - 1 takes every client
    assert (mixing_weights(SIGMA4, "worst", num_matched=10) > 0).all()


def test_worst_and_random_ignore_tau():
    a = mixing_weights(SIGMA4, "worst", num_matched=1, tau=0.99)
    b = mixing_weights(SIGMA4, "worst", num_matched=1, tau=-1.0)
    assert torch.equal(a, b)
    assert ((a > 0).sum(1) == 2).all()


def _support(w):
    return tuple(tuple((row > 0).tolist()) for row in w)


def test_random_picks_num_matched_others_deterministically_per_seed():
    n = 8
    sim = torch.zeros(n, n, dtype=torch.float64)
    supports = set()
    for seed in range(10):
        w1 = mixing_weights(sim, "random", num_matched=3, generator=torch.Generator().manual_seed(seed))
        w2 = mixing_weights(sim, "random", num_matched=3, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(w1, w2)
        assert ((w1 > 0).sum(1) == 4).all()
        assert (w1.diagonal() > 0).all()
        # equal similarities 0: self gets e^1, each of the three others e^0
        torch.testing.assert_close(w1.diagonal(), torch.full((n,), math.e / (math.e + 3), dtype=torch.float64))
        supports.add(_support(w1))
    assert len(supports) > 1


def test_random_with_a_single_client_is_self():
    w = mixing_weights(torch.ones(1, 1), "random", num_matched=3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(w, torch.ones(1, 1, dtype=torch.float64))


def test_fedavg_rows_are_size_proportional():
    sizes = torch.tensor([10, 30, 60, 100])
    w = mixing_weights(SIGMA4, "fedavg", sizes=sizes)
    expected = sizes.double() / sizes.double().sum()
    for k in range(4):
        torch.testing.assert_close(w[k], expected, rtol=0, atol=1e-15)
    # without sizes: uniform
    torch.testing.assert_close(mixing_weights(SIGMA4, "fedavg"), torch.full((4, 4), 0.25, dtype=torch.float64))
    # rows are independent tensors (not a view of one row)
    w[0, 0] = 5.0
    assert w[1, 0] != 5.0


def test_unknown_matching_is_rejected():
    with pytest.raises(ValueError):
        mixing_weights(SIGMA4, "nearest")


def test_decayed_alpha_steps_down_once_per_period_from_round_one():
    from fedfactor.analysis.similarity import decayed

    # rounds 1-3 keep alpha, 4-6 get one factor, 7 two; round 0 (before training) counts as round 1
    assert [decayed(8.0, 0.5, 3, r) for r in (0, 1, 3, 4, 6, 7)] == [8.0, 8.0, 8.0, 4.0, 4.0, 2.0]
    assert decayed(8.0, 0.5, 0, 100) == 8.0  # every = 0: never decays
