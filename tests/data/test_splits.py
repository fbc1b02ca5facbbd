"""make_splits: the pooled and official train/val/test cuts, and each natural client's own."""

from __future__ import annotations

import numpy as np
import pytest

from fedfactor.data import make_splits
from fedfactor.data.partition_kinds import SPLITS
from fedfactor.errors import UsageError

from .conftest import FEDFAC_SPLIT, natural_data


@pytest.mark.parametrize("n, counts", [(60000, (48000, 6000, 6000)), (99289, (79431, 9929, 9929))])
def test_pooled_split_counts_match_the_official_code(n, counts):
    s = make_splits(n, n - 10000, (0.8, 0.1, 0.1), "pooled", seed=0)
    assert (len(s["train"]), len(s["val"]), len(s["test"])) == counts


def test_pooled_splits_are_disjoint_sorted_covering_and_seeded():
    n = 1000
    s = make_splits(n, 800, seed=3)
    everything = np.concatenate([s["train"], s["val"], s["test"]])
    assert np.array_equal(np.sort(everything), np.arange(n))
    for idx in s.values():
        assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    again = make_splits(n, 800, seed=3)
    assert all(np.array_equal(s[k], again[k]) for k in s)
    other = make_splits(n, 800, seed=4)
    assert not np.array_equal(s["test"], other["test"])
    # pooled mode mixes official test samples (>= 800) into train
    assert np.any(s["train"] >= 800)


def test_pooled_order_is_train_then_test_then_val():
    perm = np.random.default_rng(5).permutation(100)
    s = make_splits(100, 100, (0.7, 0.2, 0.1), seed=5)
    assert np.array_equal(s["train"], np.sort(perm[:70]))
    assert np.array_equal(s["test"], np.sort(perm[70:80]))
    assert np.array_equal(s["val"], np.sort(perm[80:]))


def test_official_split_keeps_the_official_test_part():
    s = make_splits(1000, 700, (0.8, 0.1, 0.1), "official", seed=0)
    assert np.array_equal(s["test"], np.arange(700, 1000))
    assert np.all(s["train"] < 700) and np.all(s["val"] < 700)
    assert len(s["train"]) == round(700 * 0.8 / 0.9) and len(s["train"]) + len(s["val"]) == 700
    assert len(np.intersect1d(s["train"], s["val"])) == 0


@pytest.mark.parametrize(
    "args, match",
    [
        ((100, 100, (0.8, 0.1, 0.1), "official"), "no official test part"),
        ((100, 50, (0.8, 0.1, 0.2), "pooled"), "sum"),
        ((100, 50, (1.1, -0.1, 0.0), "pooled"), "non-negative"),
        ((100, 50, (0.5, 0.5), "pooled"), "three"),
        ((100, 50, (0.8, 0.1, 0.1), "random"), "split mode"),
        ((100, 150, (0.8, 0.1, 0.1), "pooled"), "n_official_train"),
    ],
)
def test_bad_split_arguments_are_usage_errors(args, match):
    with pytest.raises(UsageError, match=match):
        make_splits(*args)


# ---------------------------------------------------------------------------------------------
# natural clients: each one's samples cut on their own


def test_per_owner_splits_cut_each_writer_80_20_with_a_test_sample_each():
    y, owners = natural_data()
    splits = make_splits(len(y), len(y), FEDFAC_SPLIT, seed=3, owners=owners)
    assert len(splits["val"]) == 0
    for k, m in enumerate((12, 5, 1, 30, 7, 2, 9, 20)):
        mine = {s: int((owners[splits[s]] == k).sum()) for s in SPLITS}
        assert mine["test"] == max(1, round(0.2 * m)) and mine["train"] == m - mine["test"]
    # seeded, sorted, disjoint, covering
    again = make_splits(len(y), len(y), FEDFAC_SPLIT, seed=3, owners=owners)
    assert all(np.array_equal(splits[s], again[s]) for s in SPLITS)
    assert not all(np.array_equal(splits[s], make_splits(len(y), len(y), FEDFAC_SPLIT, seed=4, owners=owners)[s])
                   for s in SPLITS)
    assert np.array_equal(np.sort(np.concatenate([splits[s] for s in SPLITS])), np.arange(len(y)))
    assert all(np.array_equal(splits[s], np.sort(splits[s])) for s in SPLITS)
    # a val share comes out of each writer's own samples too
    with_val = make_splits(len(y), len(y), (0.8, 0.1, 0.1), seed=3, owners=owners)
    assert int((owners[with_val["val"]] == 3).sum()) == 3 and int((owners[with_val["test"]] == 3).sum()) == 3


def test_make_splits_without_owners_is_unchanged():
    # the default study's splits: the same indices whether or not owners exist as a parameter
    a = make_splits(1797, 1797, (0.8, 0.1, 0.1), seed=0)
    b = make_splits(1797, 1797, (0.8, 0.1, 0.1), seed=0, owners=None)
    assert all(np.array_equal(a[s], b[s]) for s in SPLITS)
    assert [len(a[s]) for s in SPLITS] == [1438, 179, 180]
