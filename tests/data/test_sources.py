"""The small sources: scikit-learn's digits, copied into the data root by prepare-data (LEAF's: test_leaf.py)."""

from __future__ import annotations

import numpy as np
import torch

from fedfactor.data import DATASETS, load_dataset, prepare_dataset


def test_digits_copied_by_prepare_load_bit_for_bit_without_scikit_learn(tmp_path, monkeypatch, caplog):
    source = load_dataset("digits", tmp_path)  # no copy in the root yet: read from scikit-learn
    assert not (tmp_path / "digits.npz").exists()  # a training job's read writes nothing
    prepare_dataset("digits", tmp_path)
    with np.load(tmp_path / "digits.npz") as f:
        assert (f["x_train"].dtype, f["x_train"].shape, f["y_train"].dtype) == (np.float32, (1797, 1, 8, 8), np.int64)
        assert f["x_test"].shape == (0, 1, 8, 8) and f["y_test"].shape == (0,)
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind

    def no_sklearn():
        raise AssertionError("read scikit-learn although the root holds digits.npz")

    with monkeypatch.context() as m:
        m.setattr(DATASETS.get("digits"), "_from_package", no_sklearn)
        copied = load_dataset("digits", tmp_path)
    assert torch.equal(copied.x, source.x) and torch.equal(copied.y, source.y)  # bitwise: the same results
    assert copied.n_official_train == source.n_official_train == 1797

    (tmp_path / "digits.npz").write_bytes(b"half a file")  # unreadable: scikit-learn again, with a warning
    with caplog.at_level("WARNING", logger="fedfactor"):
        again = load_dataset("digits", tmp_path)
    assert torch.equal(again.x, source.x) and "digits.npz" in caplog.text
    prepare_dataset("digits", tmp_path)  # prepare-data repairs the copy
    with np.load(tmp_path / "digits.npz") as f:
        np.testing.assert_array_equal(f["y_train"], source.y.numpy())
