"""What a run records: each client's scores on a split, each round's record (a row of metrics.csv and
a checkpoint's entry), the metric names a method's diagnostics may not take, and a round's training loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..fl.train import TrainLoss


@dataclass
class Scores:
    """One evaluation of every client on one split."""

    correct: np.ndarray
    count: np.ndarray
    loss: float  # summed over all clients' samples

    @property
    def per_client(self) -> np.ndarray:
        return np.divide(self.correct, self.count, out=np.zeros(len(self.count)), where=self.count > 0)

    @property
    def mean(self) -> float:
        return float(self.per_client.mean())

    @property
    def std(self) -> float:
        return float(self.per_client.std())

    @property
    def weighted(self) -> float:
        """Weighted by each client's number of scored samples."""
        return float(self.correct.sum() / max(self.count.sum(), 1))

    @property
    def mean_loss(self) -> float:
        return self.loss / max(self.count.sum(), 1)


@dataclass
class RoundRecord:
    round: int
    train_loss: float  # the task loss (cross-entropy) alone, mean over the round's clients
    bytes_up: int  # cumulative
    bytes_down: int
    bytes_up_round: int
    bytes_down_round: int
    elapsed_seconds: float
    test: Scores | None = None  # None in rounds that are not evaluated
    val: Scores | None = None  # None when not evaluated or no client has validation data
    diagnostics: dict[str, float] = field(default_factory=dict)  # a method's scalars
    arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # a method's matrices
    skipped: list[int] = field(default_factory=list)  # clients whose diverged update was dropped
    # the mean of each extra training loss by its Phase.loss_name (column train_<name>); the
    # objective the clients trained on is train_loss plus these
    loss_terms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain numbers and lists (arrays are on disk already), for a weights_only checkpoint."""
        scores = lambda s: None if s is None else {  # noqa: E731
            "correct": s.correct.tolist(), "count": s.count.tolist(), "loss": float(s.loss)}
        return {"round": self.round, "train_loss": self.train_loss, "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down, "bytes_up_round": self.bytes_up_round,
                "bytes_down_round": self.bytes_down_round, "elapsed_seconds": self.elapsed_seconds,
                "test": scores(self.test), "val": scores(self.val), "diagnostics": dict(self.diagnostics),
                "skipped": list(self.skipped), "loss_terms": dict(self.loss_terms)}

    @classmethod
    def from_dict(cls, d: dict) -> RoundRecord:
        scores = lambda s: None if s is None else Scores(  # noqa: E731
            np.asarray(s["correct"], dtype=np.int64), np.asarray(s["count"], dtype=np.int64), s["loss"])
        # a checkpoint written before loss_terms existed has none (its train_loss included them)
        return cls(**{**d, "test": scores(d["test"]), "val": scores(d["val"])})

    def metrics(self) -> dict[str, float]:
        """The row of metrics.csv and the metrics MLflow gets at step = round."""
        row: dict[str, float] = {
            "round": self.round, "train_loss": self.train_loss,
            **{f"train_{name}": value for name, value in self.loss_terms.items()}, "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down, "bytes_up_round": self.bytes_up_round,
            "bytes_down_round": self.bytes_down_round, "elapsed_seconds": self.elapsed_seconds,
            "skipped_clients": len(self.skipped),
        }
        for prefix, s in (("", self.test), ("val_", self.val)):
            if s is not None:
                row.update({f"{prefix}accuracy_mean": s.mean, f"{prefix}accuracy_std": s.std,
                            f"{prefix}accuracy_weighted": s.weighted, f"{prefix}loss": s.mean_loss})
        return {**row, **self.diagnostics}


# Metric names a method's diagnostics may not take (they would overwrite the loop's own columns),
# and the prefix of the columns of extra training losses (train_<Phase.loss_name>).
RESERVED_PREFIX = "train_"
RESERVED = set(RoundRecord(0, 0.0, 0, 0, 0, 0, 0.0, Scores(np.ones(1), np.ones(1), 0), Scores(np.ones(1), np.ones(1), 0)).metrics())


def round_loss(losses: list[float]) -> TrainLoss:
    """A round's training loss from its clients' (TrainLoss, or a plain float from a method's own
    loop): the mean over the clients that took a step of the task loss and of each extra term; a
    client without one of the terms (pFedSD's first round, without a teacher) counts 0 for it, so
    the round's columns still add up to the mean objective. NaN when no client took a step."""
    took = [loss for loss in losses if not np.isnan(loss)]
    if not took:
        return TrainLoss(float("nan"))
    terms = [getattr(loss, "terms", {}) for loss in took]
    names = dict.fromkeys(name for t in terms for name in t)
    return TrainLoss(float(np.mean(took)),
                     {name: float(np.mean([t.get(name, 0.0) for t in terms])) for name in names})
