"""A round's record: its training loss and extra loss terms, its metrics row, and its checkpoint form."""

import numpy as np
import pytest

from fedfactor.fl.train import TrainLoss
from fedfactor.run.records import RoundRecord, round_loss


def test_a_rounds_loss_is_the_cross_entropy_with_each_extra_loss_in_a_column_of_its_own():
    # clients: cross-entropy 2 with an L1 term of 1, cross-entropy 4 without the term (a plan without
    # it counts 0), one without a step (NaN: left out), 3 from a method's own loop (a plain float)
    loss = round_loss([TrainLoss(2.0, {"l1": 1.0}), TrainLoss(4.0), float("nan"), 3.0])
    assert float(loss) == 3.0 and loss.terms == pytest.approx({"l1": 1 / 3})
    assert np.isnan(round_loss([float("nan")])) and round_loss([]).terms == {}
    rec = RoundRecord(1, float(loss), 10, 10, 10, 10, 1.0, loss_terms=loss.terms)
    row = rec.metrics()
    assert list(row)[:3] == ["round", "train_loss", "train_l1"] and row["train_l1"] == pytest.approx(1 / 3)
    assert RoundRecord.from_dict(rec.to_dict()) == rec
    # a checkpoint written before the terms were reported apart loads, without them
    old = {k: v for k, v in rec.to_dict().items() if k != "loss_terms"}
    assert RoundRecord.from_dict(old) == RoundRecord(1, 3.0, 10, 10, 10, 10, 1.0)
