"""How a run's records are summarised: the accuracies summary.json reports, and what each means."""

from __future__ import annotations

from typing import Any

from .records import RoundRecord, Scores


# What each accuracy in summary.json means; written into the summary so no reader has to guess.
ACCURACY_FIELDS = {
    "accuracy_mean": "mean over clients of each client's accuracy, last round",
    "accuracy_std": "std over clients, last round",
    "accuracy_weighted": "accuracy over all scored samples (clients weighted by test size), last round",
    "per_client_accuracy": "each client's accuracy, last round",
    "accuracy_best_mean": "the highest accuracy_mean over evaluated rounds (round: best_round)",
    "accuracy_best_weighted": "the highest accuracy_weighted over evaluated rounds (round: best_weighted_round)",
    "accuracy_at_best_val": "accuracy_mean at the round with the highest mean validation accuracy "
                            "(round: best_val_round); null without validation data",
    "accuracy": "the number eval.report picks (round: accuracy_round); tables show this one",
    "val_score": "validation accuracy_mean at the round eval.report's rule picks on validation alone (last: the "
                 "last round; best, best_weighted, best_val: the round best on validation); tuning selects on it",
}


def combined(scores: Scores, report: str) -> float:
    """The clients' scores combined as eval.report's number combines them: over all scored samples
    (clients weighted by test size) under best_weighted, the mean over clients under every other rule."""
    return scores.weighted if report == "best_weighted" else scores.mean


def _test(r: RoundRecord) -> Scores:
    assert r.test is not None  # only evaluated rounds reach here
    return r.test


def _val(r: RoundRecord) -> Scores:
    assert r.val is not None  # only rounds with validation scores reach here
    return r.val


def summarize(records: list[RoundRecord], report: str) -> dict[str, Any]:
    """Last-round, best-round and best-on-validation accuracies, and the one `report` picks."""
    scored = [r for r in records if r.test is not None]
    last = scored[-1]
    best = max(scored, key=lambda r: _test(r).mean)  # the first of equal rounds
    best_w = max(scored, key=lambda r: _test(r).weighted)
    with_val = [r for r in scored if r.val is not None]
    best_val = max(with_val, key=lambda r: _val(r).mean) if with_val else None
    out: dict[str, Any] = {
        "accuracy_mean": _test(last).mean,
        "accuracy_std": _test(last).std,
        "accuracy_weighted": _test(last).weighted,
        "per_client_accuracy": _test(last).per_client.tolist(),
        "accuracy_best_mean": _test(best).mean,
        "best_round": best.round,
        "accuracy_best_weighted": _test(best_w).weighted,
        "best_weighted_round": best_w.round,
        "accuracy_at_best_val": _test(best_val).mean if best_val else None,
        "best_val_round": best_val.round if best_val else None,
        "val_accuracy_best": _val(best_val).mean if best_val else None,
        # what tuning selects on: the reported round's rule applied to validation numbers alone
        "val_score": (last.val.mean if last.val else None) if report == "last" else
                     (_val(best_val).mean if best_val else None),
        "skipped_updates": [[r.round, k] for r in records for k in r.skipped],
    }
    picked = {"last": ("accuracy_mean", last), "best": ("accuracy_best_mean", best),
              "best_weighted": ("accuracy_best_weighted", best_w), "best_val": ("accuracy_at_best_val", best_val)}
    key, rec = picked[report]
    out["accuracy"], out["accuracy_round"] = out[key], rec.round if rec else None
    return out
