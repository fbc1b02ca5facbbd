"""summary.json's accuracies: last round, best round, best on validation, and the one eval.report picks."""

import numpy as np
import pytest

from fedfactor.run.records import RoundRecord, Scores
from fedfactor.run.summary import summarize


def _record(rnd, test_mean, val_mean=None, weighted=None):
    def scores(mean, w):
        # two clients of 10 and 30 samples: mean = (a + b) / 2 and weighted = (a + 3 b) / 4
        b = 2 * w - mean
        return Scores(np.array([10 * (2 * mean - b), 30 * b]), np.array([10, 30]), 0.0)

    val = scores(val_mean, val_mean) if val_mean is not None else None
    return RoundRecord(rnd, 0.0, 0, 0, 0, 0, 0.0, scores(test_mean, test_mean if weighted is None else weighted), val)


def test_summary_names_last_best_and_best_on_validation():
    records = [_record(1, 0.5, 0.8, 0.5), _record(2, 0.7, 0.6, 0.55), _record(3, 0.6, 0.9, 0.65)]
    s = summarize(records, "best_val")
    assert s["accuracy_mean"] == pytest.approx(0.6)  # last round
    assert (s["accuracy_best_mean"], s["best_round"]) == (pytest.approx(0.7), 2)
    assert (s["accuracy_best_weighted"], s["best_weighted_round"]) == (pytest.approx(0.65), 3)
    assert (s["accuracy_at_best_val"], s["best_val_round"]) == (pytest.approx(0.6), 3)
    assert (s["accuracy"], s["accuracy_round"]) == (pytest.approx(0.6), 3)
    assert summarize(records, "best")["accuracy"] == pytest.approx(0.7)
    assert summarize(records, "best_weighted")["accuracy"] == pytest.approx(0.65)
    assert summarize(records, "last")["accuracy_round"] == 3
    no_val = [_record(1, 0.5), _record(2, 0.4)]
    assert summarize(no_val, "last")["accuracy_at_best_val"] is None
