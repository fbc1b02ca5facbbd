"""fedfactor.diagnostics.layer_analysis: the factor analysis of one layer's client weights, and the
stability of FedFac's split over the rounds."""

import numpy as np
import pytest

from fedfactor.diagnostics.figures import unit_order
from fedfactor.diagnostics.layer_analysis import analyse_weights, stability

from .conftest import planted


def test_planted_shared_units_have_high_communality_and_personal_ones_low():
    numbers, nu, curve = analyse_weights(planted(), kappa=0.45)
    assert (numbers["K"], numbers["d"], numbers["fan_in"]) == (6, 12, 32)
    # two common patterns: two factors, which explain the shared units almost fully and the others not
    assert numbers["G"] == 2 and curve[1] >= 0.45 > curve[0]
    assert nu[:6].min() > 0.9 and nu[6:].max() < 0.1
    assert numbers["shared_mean"] == numbers["shared_ge0.5"] == numbers["shared_ge0.9"] == 0.5
    assert numbers["nu_min"] == pytest.approx(nu.min()) and numbers["nu_max"] == pytest.approx(nu.max())
    # quantile thresholds share ~1 - q of the units by construction (12 distinct values here)
    assert (numbers["shared_q25"], numbers["shared_q50"], numbers["shared_q75"]) == (0.75, 0.5, 0.25)
    # the same weights with the units in another order: the same communalities, in that order
    order = np.random.default_rng(1).permutation(12)
    _, nu_perm, _ = analyse_weights(planted()[:, order], kappa=0.45)
    np.testing.assert_allclose(nu_perm, nu[order], atol=1e-6)
    # without the common patterns nothing stands out
    _, nu_none, _ = analyse_weights(planted(n_shared=0), kappa=0.45)
    assert nu_none.max() < 0.9


def test_stability_is_the_share_of_units_unchanged_since_the_previous_round():
    states = np.zeros((4, 10), np.uint8)
    states[:, :4] = 1
    states[2:, 7] = 1  # unit 7 becomes shared between rounds 2 and 3
    np.testing.assert_allclose(stability(states), [1.0, 0.9, 1.0])
    assert len(stability(states[:1])) == 0  # static FedFac: one analysed round, nothing to compare
    # the split-history heatmap: most often shared first, ties by index (uint8 counts, no wrap-around)
    np.testing.assert_array_equal(unit_order(states), [0, 1, 2, 3, 7, 4, 5, 6, 8, 9])
