import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfactor.analysis.factor import factor_analysis, n_factors_for, parse_tau, split, threshold_value, unit_matrix


@pytest.fixture
def FactorAnalyzer(monkeypatch):
    """factor-analyzer 0.5 passes scikit-learn's removed `force_all_finite`; translate it."""
    import sklearn.utils.validation as validation
    import factor_analyzer.factor_analyzer as module

    original = validation.check_array

    def check_array(*args, force_all_finite=True, **kwargs):
        try:
            return original(*args, ensure_all_finite=force_all_finite, **kwargs)
        except TypeError:  # scikit-learn before 1.6
            return original(*args, force_all_finite=force_all_finite, **kwargs)

    monkeypatch.setattr(module, "check_array", check_array)
    warnings.filterwarnings("ignore", category=UserWarning)
    return module.FactorAnalyzer


def planted(n=600, d=12, g=3, noise=0.6, seed=0):
    """n observations of d variables: a sparse loading on g factors plus independent noise."""
    rng = np.random.default_rng(seed)
    loadings = rng.uniform(0.4, 0.9, (d, g)) * (rng.random((d, g)) < 0.5)
    loadings[0] = 0  # one variable with no common factor at all
    x = rng.normal(size=(n, g)) @ loadings.T + rng.normal(size=(n, d)) * noise
    return x, loadings


def same_up_to_sign(a, b):
    signs = np.sign((a * b).sum(0))
    return np.abs(a - b * signs).max()


@pytest.mark.parametrize("data", ["planted", "random"])
def test_starting_loadings_equal_factor_analyzers_principal_method(FactorAnalyzer, data):
    x = planted()[0] if data == "planted" else np.random.default_rng(3).normal(size=(200, 9))
    ours = factor_analysis(torch.tensor(x), n_factors=3, max_iter=0)
    ref = FactorAnalyzer(n_factors=3, rotation=None, method="principal", svd_method="lapack").fit(x)
    assert ours.iterations == 0
    assert same_up_to_sign(ours.loadings.numpy(), ref.loadings_[:, :3]) < 1e-10


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_iterated_principal_factors_reach_the_minres_solution(FactorAnalyzer, seed):
    # Iterated principal-factor estimation converges to the unweighted least-squares fit, which is
    # what factor-analyzer's minres method computes directly.
    x, _ = planted(seed=seed)
    ours = factor_analysis(torch.tensor(x), n_factors=3, max_iter=2000, tol=1e-10)
    ref = FactorAnalyzer(n_factors=3, rotation=None, method="minres").fit(x)
    assert ours.converged
    np.testing.assert_allclose(ours.communalities.numpy(), ref.get_communalities(), atol=1e-4)


def test_communalities_find_the_variables_the_common_factors_drive():
    x, loadings = planted(n=4000, seed=5)
    ours = factor_analysis(torch.tensor(x), n_factors=3)
    truth = (loadings**2).sum(1) / ((loadings**2).sum(1) + 0.36)
    np.testing.assert_allclose(ours.communalities.numpy(), truth, atol=0.08)
    assert ours.communalities[0] < 0.05  # the variable without a factor
    assert not split(ours.communalities, "mean")[0]


def test_eigen_method_is_the_squared_eigenvectors_of_the_correlation_matrix():
    x, _ = planted()
    corr = np.corrcoef(x.T)
    values, vectors = np.linalg.eigh(corr)
    top = vectors[:, ::-1][:, :4]
    ours = factor_analysis(torch.tensor(x), method="eigen", n_factors=4)
    np.testing.assert_allclose(ours.communalities.numpy(), (top**2).sum(1), atol=1e-10)
    everything = factor_analysis(torch.tensor(x), method="eigen", n_factors=x.shape[1])
    np.testing.assert_allclose(everything.communalities.numpy(), 1.0, atol=1e-10)


def test_number_of_factors_is_the_smallest_reaching_kappa():
    values = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64)  # shares 0.4, 0.7, 0.9, 1.0
    assert [n_factors_for(values, k) for k in (0.3, 0.4, 0.41, 0.7, 0.85, 0.9, 1.0)] == [1, 1, 2, 2, 3, 3, 4]
    with pytest.raises(ValueError):
        n_factors_for(values, 0)


def test_kappa_picks_g_from_the_eigenvalues():
    x, _ = planted()
    eig = np.sort(np.linalg.eigvalsh(np.corrcoef(x.T)))[::-1]
    expected = int(np.argmax(np.cumsum(eig) / eig.sum() >= 0.85)) + 1
    assert factor_analysis(torch.tensor(x), kappa=0.85).n_factors == expected


def test_the_official_count_is_one_factor_fewer_and_may_find_none():
    x, _ = planted()
    paper = factor_analysis(torch.tensor(x), kappa=0.85, method="eigen")
    official = factor_analysis(torch.tensor(x), kappa=0.85, method="eigen", count="official")
    assert official.n_factors == paper.n_factors - 1 >= 1
    corr = np.corrcoef(x.T)
    top = np.linalg.eigh(corr)[1][:, ::-1][:, :official.n_factors]
    np.testing.assert_allclose(official.communalities.numpy(), (top**2).sum(1), atol=1e-10)
    # kappa below the first eigenvalue's share: the paper's G is 1, the code's 0, every nu 0
    first = np.linalg.eigvalsh(corr)[-1] / corr.shape[0]
    none = factor_analysis(torch.tensor(x), kappa=first / 2, method="eigen", count="official")
    assert none.n_factors == 0 and not none.communalities.any()
    assert factor_analysis(torch.tensor(x), kappa=first / 2, method="eigen").n_factors == 1
    with pytest.raises(ValueError, match="count"):
        factor_analysis(torch.tensor(x), count="one fewer")


def test_unit_matrix_stacks_clients_one_after_another():
    # 2 clients, 3 units, fan-in 2: column j is (client 0's unit j, client 1's unit j)
    w = torch.arange(12.0).reshape(2, 3, 2)
    z = unit_matrix(w)
    assert z.shape == (4, 3)
    assert torch.equal(z[:, 1], torch.tensor([2.0, 3.0, 8.0, 9.0]))
    conv = torch.randn(5, 8, 3, 3, 3)  # 5 clients of a conv layer with 8 filters
    assert unit_matrix(conv).shape == (5 * 27, 8)
    assert torch.equal(unit_matrix(list(conv)), unit_matrix(conv))


def test_constant_units_get_zero_communality_and_no_nan():
    z = torch.randn(50, 6, dtype=torch.float64)
    z[:, 2] = 3.0
    result = factor_analysis(z)
    assert result.constant.tolist() == [False, False, True, False, False, False]
    assert result.communalities[2] == 0 and torch.isfinite(result.communalities).all()
    assert not split(result.communalities, "mean")[2]
    everything = factor_analysis(torch.ones(10, 4))
    assert everything.n_factors == 0 and torch.equal(everything.communalities, torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(5, 40), (3, 1), (7, 7)])
def test_fewer_rows_than_units_and_single_units_are_finite(shape):
    result = factor_analysis(torch.randn(*shape))
    nu = result.communalities
    assert torch.isfinite(nu).all() and (nu >= 0).all() and (nu <= 1 + 1e-9).all()


def test_one_client_is_analysed_over_its_own_weights():
    result = factor_analysis(unit_matrix(torch.randn(1, 16, 20)))
    assert result.communalities.shape == (16,) and torch.isfinite(result.communalities).all()


def test_nan_weights_and_too_few_rows_are_clear_errors():
    z = torch.randn(10, 4)
    z[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        factor_analysis(z)
    with pytest.raises(ValueError, match="at least 2 rows"):
        factor_analysis(torch.randn(1, 4))
    with pytest.raises(ValueError, match="method"):
        factor_analysis(torch.randn(5, 4), method="ml")


def test_thresholds():
    nu = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5], dtype=torch.float64)
    assert split(nu, "mean").tolist() == [False, False, True, True, True]
    assert threshold_value(nu, "50%") == threshold_value(nu, "q50") == pytest.approx(0.3)
    assert threshold_value(nu, "q25") == pytest.approx(np.percentile(nu.numpy(), 25))
    assert not split(nu, "inf").any() and split(nu, "-inf").all()
    assert split(nu, 0.35).tolist() == [False, False, False, True, True]
    assert split(nu, "0.35").tolist() == [False, False, False, True, True]
    for bad in ("median", "q101", "-5%", True, float("nan")):
        with pytest.raises(ValueError):
            parse_tau(bad)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(2, 30), cols=st.integers(1, 12), seed=st.integers(0, 10_000),
       kappa=st.floats(0.05, 1.0), q=st.sampled_from([25, 50, 75, 90, 95]))
def test_any_matrix_gives_finite_communalities_and_quantile_shares(rows, cols, seed, kappa, q):
    z = torch.from_numpy(np.random.default_rng(seed).normal(size=(rows, cols)))
    result = factor_analysis(z, kappa=kappa)
    nu = result.communalities
    assert torch.isfinite(nu).all() and (nu >= -1e-12).all() and (nu <= 1 + 1e-9).all()
    assert 1 <= result.n_factors <= cols
    shared = split(nu, f"{q}%")
    # nu >= its own q-th percentile: at least the top (100 - q)% of the units
    assert shared.sum() >= int(np.floor(cols * (100 - q) / 100))
