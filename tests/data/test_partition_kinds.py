"""The partition kinds: how each cuts the clients out of the pooled splits."""

from __future__ import annotations

import numpy as np
import pytest

from fedfactor.data import make_partition, make_splits
from fedfactor.data.partition import Partition
from fedfactor.data.partition_kinds import PARTITIONS, SPLITS, _boundaries
from fedfactor.errors import UsageError

from .conftest import (FEDFAC_SPLIT, NATURAL, SHARE_SPECS, assert_covers, assert_disjoint, class_sets, make_data,
                       natural_data, natural_partition)


def test_all_kinds_registered_with_descriptions():
    described = dict(PARTITIONS.describe())
    assert set(described) == {"iid", "dirichlet", "shards", "class_groups", "dirichlet_fixed", "natural"}
    assert all(d and "\n" not in d for d in described.values())


@pytest.mark.parametrize("spec", SHARE_SPECS, ids=lambda s: s["kind"])
def test_share_kinds_are_disjoint_and_cover_every_split(c10, spec):
    y, splits = c10
    part = make_partition(y, splits, 10, 9, spec, seed=0)
    assert part.num_clients == len(part.clients) == 9
    assert_disjoint(part)
    assert_covers(part, y, splits)
    for c in part.clients:
        for s in SPLITS:
            assert c[s].dtype == np.int64 and np.all(np.diff(c[s]) > 0)


def test_val_and_test_follow_the_train_mix_dirichlet(c10):
    y, splits = c10
    part = make_partition(y, splits, 10, 8, {"kind": "dirichlet", "alpha": 0.3}, seed=1)
    hist = {s: np.array(h) for s, h in part.histograms(y).items()}
    n = {s: np.bincount(y[splits[s]], minlength=10) for s in SPLITS}
    for s in ("val", "test"):
        # both splits are cut from the same shares, so only rounding separates them
        ratio = n[s] / n["train"]
        assert np.all(np.abs(hist[s] - hist["train"] * ratio) <= 1 + ratio + 1e-9)


def test_shards_clients_hold_few_classes_and_test_within_train():
    # every class has exactly 480 train samples, so each of the 20 shards holds a single class
    y = np.repeat(np.arange(10), 600)
    within = np.arange(len(y)) % 600
    splits = {
        "train": np.flatnonzero(within < 480),
        "val": np.flatnonzero((within >= 480) & (within < 540)),
        "test": np.flatnonzero(within >= 540),
    }
    part = make_partition(y, splits, 10, 10, {"kind": "shards", "classes_per_client": 2}, seed=0)
    train, test, val = (class_sets(part, y, s) for s in ("train", "test", "val"))
    assert sum(len(t) == 1 for t in train) < 10  # a client usually gets two different classes
    for k in range(10):
        assert 1 <= len(train[k]) <= 2
        assert test[k] <= train[k] and val[k] <= train[k]
    # a client holding two classes still solves the whole 10-class problem
    np.testing.assert_array_equal(part.label_maps, np.tile(np.arange(10), (10, 1)))
    # two shards of 240 = two halves of classes, so a client gets half of 2 x 60 test samples
    assert all(len(c["train"]) == 480 for c in part.clients)
    assert all(len(c["val"]) == len(c["test"]) == 60 for c in part.clients)


def test_iid_spreads_every_class_evenly(c10):
    y, splits = c10
    part = make_partition(y, splits, 10, 7, {"kind": "iid"}, seed=0)
    for s, h in part.histograms(y).items():
        per_class = np.bincount(y[splits[s]], minlength=10)
        assert np.all(np.abs(np.array(h) - per_class / 7) <= 1)
    np.testing.assert_array_equal(part.label_maps, np.tile(np.arange(10), (7, 1)))


def test_dirichlet_concentration_follows_alpha():
    y, splits = make_data(100, 500)
    K = 10

    def shares(alpha: float) -> np.ndarray:
        part = make_partition(y, splits, 100, K, {"kind": "dirichlet", "alpha": alpha}, seed=0)
        h = np.array(part.histograms(y)["train"], dtype=float)
        return h / h.sum(axis=0)

    skewed, flat = shares(0.1), shares(100.0)
    # averaged over 100 classes: Dir(0.1) puts most of a class on one client, Dir(100) ~ 1/K
    assert skewed.max(axis=0).mean() > 0.5
    assert flat.max(axis=0).mean() < 0.15
    assert np.all(np.abs(flat - 1 / K) < 0.06)


def test_dirichlet_respects_min_train_samples(c10):
    y, splits = c10
    spec = {"kind": "dirichlet", "alpha": 0.1, "min_train_samples": 150}
    part = make_partition(y, splits, 10, 10, spec, seed=0)
    assert min(len(c["train"]) for c in part.clients) >= 150
    with pytest.raises(UsageError, match="min_train_samples"):
        make_partition(y, splits, 10, 10, {**spec, "min_train_samples": 480}, seed=0)


def test_a_classs_cut_points_end_at_its_last_sample_even_when_the_shares_sum_short_of_one():
    """Catches: the last cut left to float arithmetic, which drops a class's last samples whenever
    the shares' sum falls short of 1 (here by 1e-6 of a million samples: one sample)."""
    n = 1_000_000
    cuts = _boundaries(np.array([0.5, 0.5 - 1e-6]), n)
    assert cuts[0] == 0 and cuts[-1] == n and (np.diff(cuts) >= 0).all()
    assert cuts[1] == n // 2  # the others where the shares put them


# --------------------------------------------------------------------------------------------
# dirichlet_fixed: FedDecomp's sampler


def test_dirichlet_fixed_disjoint_sizes():
    y, splits = make_data(10, 3000)
    sizes = {"train": 120, "val": 15, "test": 30}
    spec = {"kind": "dirichlet_fixed", "alpha": 0.5, "samples_per_client": sizes, "overlap": False}
    part = make_partition(y, splits, 10, 20, spec, seed=0)
    assert_disjoint(part)
    for c in part.clients:
        for s in SPLITS:
            assert len(c[s]) == sizes[s]
            assert np.all(np.isin(c[s], splits[s]))
    # val/test are drawn from the client's own mix: test classes mostly among its train classes
    train, test = class_sets(part, y, "train"), class_sets(part, y, "test")
    assert np.mean([len(te - tr) for tr, te in zip(train, test)]) < 1.5
    assert part.meta["samples_per_client"] == sizes and part.meta["overlap"] is False


def tiny_two_class_data():
    """Train pool: 3 samples of class 0, 7 of class 1; no val or test."""
    y = np.array([0] * 3 + [1] * 7)
    return y, {"train": np.arange(10), "val": np.array([], int), "test": np.array([], int)}


def two_class_spec(overlap: bool) -> dict:
    # alpha this small gives every client a single class (mix [1, 0] or [0, 1])
    sizes = {"train": 5, "val": 0, "test": 0}
    return {
        "kind": "dirichlet_fixed",
        "alpha": 1e-3,
        "samples_per_client": sizes,
        "overlap": overlap,
    }


def test_dirichlet_fixed_caps_a_class_at_its_pool_and_redraws_the_rest():
    y, splits = tiny_two_class_data()
    part = make_partition(y, splits, 2, 8, two_class_spec(overlap=True), seed=0)
    hist = part.histograms(y)["train"]
    # a class-0 client wants 5 but only 3 exist: it takes all 3 and 2 of class 1
    assert set(map(tuple, hist)) == {(3, 2), (0, 5)}
    assert all(len(c["train"]) == 5 for c in part.clients)


def test_dirichlet_fixed_disjoint_clients_take_what_the_others_left():
    y, splits = tiny_two_class_data()
    # two clients of 5 need all 10 samples, whichever class each prefers
    for seed in range(4):
        part = make_partition(y, splits, 2, 2, two_class_spec(overlap=False), seed=seed)
        assert_covers(part, y, splits)
        assert sorted(map(tuple, part.histograms(y)["train"])) == [(0, 5), (3, 2)]


def test_dirichlet_fixed_errors_only_when_a_whole_split_runs_out():
    y, splits = tiny_two_class_data()
    with pytest.raises(UsageError, match=r"needs 15 train samples \(5 x 3 disjoint clients\)"):
        make_partition(y, splits, 2, 3, two_class_spec(overlap=False), seed=0)
    spec = {**two_class_spec(overlap=True), "samples_per_client": {"train": 11, "test": 0}}
    with pytest.raises(UsageError, match="needs 11 train samples per client but the train split"):
        make_partition(y, splits, 2, 3, spec, seed=0)


def official_cifar(num_classes: int, train_per_class: int, test_per_class: int):
    """CIFAR-shaped labels (official train part, then official test part) and official splits."""
    rng = np.random.default_rng(0)
    y = np.concatenate(
        [
            rng.permutation(np.repeat(np.arange(num_classes), train_per_class)),
            rng.permutation(np.repeat(np.arange(num_classes), test_per_class)),
        ]
    )
    n_official_train = num_classes * train_per_class
    return y, make_splits(len(y), n_official_train, (0.9, 0.1, 0.0), mode="official", seed=0)


@pytest.fixture(scope="module")
def cifar10_official():
    return official_cifar(10, 5000, 1000)


@pytest.fixture(scope="module")
def cifar100_official():
    return official_cifar(100, 500, 100)  # ~450 train samples per class after the val cut


def mean_histogram_distance(part: Partition, y: np.ndarray) -> float:
    """Mean total-variation distance between two clients' train class mixes."""
    h = np.array(part.histograms(y)["train"], dtype=float)
    h /= h.sum(axis=1, keepdims=True)
    d = 0.5 * np.abs(h[:, None] - h[None]).sum(axis=-1)
    return float(d[np.triu_indices(len(h), 1)].mean())


FEDDECOMP_SIZES = {"train": 500, "val": 0, "test": 100}


@pytest.mark.parametrize(
    "data, num_classes", [("cifar10_official", 10), ("cifar100_official", 100)]
)
@pytest.mark.parametrize("overlap", [True, False])
def test_dirichlet_fixed_feddecomp_setting(request, data, num_classes, overlap):
    y, splits = request.getfixturevalue(data)
    spec = {"kind": "dirichlet_fixed", "alpha": 0.1, "samples_per_client": FEDDECOMP_SIZES}
    part = make_partition(y, splits, num_classes, 40, {**spec, "overlap": overlap}, seed=0)
    for c in part.clients:
        for s, n in FEDDECOMP_SIZES.items():
            assert len(c[s]) == n and len(np.unique(c[s])) == n  # exact size, no sample twice
            assert np.all(np.isin(c[s], splits[s]))
        assert len(np.intersect1d(c["train"], c["test"])) == 0
    for s in ("train", "test"):
        times_used = np.bincount(np.concatenate([c[s] for c in part.clients]))
        assert (times_used.max() > 1) == overlap  # clients share samples only with overlap
    assert mean_histogram_distance(part, y) > 0.7  # Dir(0.1): clients hold very different mixes
    flat = make_partition(y, splits, num_classes, 40, {**spec, "alpha": 100.0}, seed=0)
    assert mean_histogram_distance(flat, y) < 0.3
    assert make_partition(y, splits, num_classes, 40, {**spec, "overlap": overlap}, seed=0) == part


@pytest.mark.parametrize("overlap", [True, False])
def test_dirichlet_fixed_cifar100_caps_classes_at_their_pool(cifar100_official, overlap):
    y, splits = cifar100_official
    # 1000 train samples from a mix of one or two classes: more than any class pool (~450) holds
    sizes = {"train": 1000, "val": 0, "test": 100}
    spec = dict(kind="dirichlet_fixed", alpha=0.001, samples_per_client=sizes, overlap=overlap)
    part = make_partition(y, splits, 100, 40, spec, seed=0)
    hist = np.array(part.histograms(y)["train"])
    pool = np.bincount(y[splits["train"]], minlength=100)
    assert pool.max() < sizes["train"]
    assert np.all(hist <= pool)
    assert np.sum(hist == pool) >= 10  # many clients took a whole class and drew the rest elsewhere
    assert all(len(c["train"]) == 1000 and len(c["test"]) == 100 for c in part.clients)
    assert all(len(np.unique(c["train"])) == 1000 for c in part.clients)
    if not overlap:
        assert_disjoint(part)


# --------------------------------------------------------------------------------------------
# natural: the data's own clients (FEMNIST's writers, Shakespeare's roles)


def test_natural_clients_are_writers_sampled_with_the_seed():
    y, owners = natural_data()
    part = natural_partition(y, owners, 5, seed=1)
    chosen = part.meta["natural_clients"]
    assert part.meta["kind"] == "natural" and len(chosen) == 5 == len(set(chosen))
    assert 2 not in chosen  # the writer with one sample has no train sample left
    assert part.meta["eligible_clients"] == 7
    for k, writer in enumerate(chosen):
        mine = np.flatnonzero(owners == writer)
        held = np.concatenate([part.clients[k][s] for s in SPLITS])
        assert np.array_equal(np.sort(held), mine)  # all its samples, and only its samples
        m = len(mine)
        assert len(part.clients[k]["test"]) == max(1, round(0.2 * m)) and len(part.clients[k]["val"]) == 0
    # the pooled splits scored on are the chosen clients' own
    assert np.array_equal(part.pools["test"], np.sort(np.concatenate([c["test"] for c in part.clients])))
    assert len(part.pools["val"]) == 0
    assert np.array_equal(part.label_maps, np.tile(np.arange(10), (5, 1)))  # every client: every class
    part.validate(y, "natural")
    # deterministic in the seed; another seed draws other writers
    assert natural_partition(y, owners, 5, seed=1) == part
    draws = {tuple(natural_partition(y, owners, 5, seed=s).meta["natural_clients"]) for s in range(6)}
    assert len(draws) > 1


def test_natural_takes_fl_clients_of_the_eligible_and_refuses_more():
    y, owners = natural_data()
    every = natural_partition(y, owners, 7)
    assert every.meta["natural_clients"] == [0, 1, 3, 4, 5, 6, 7]
    with pytest.raises(UsageError, match="8 clients asked for, but only 7 of the data's 8 natural clients") as err:
        natural_partition(y, owners, 8)
    assert "\n" not in str(err.value)
    # min_train_samples raises the bar: writers 1 (4 train samples), 4 (6) and 5 (1) drop out
    strict = natural_partition(y, owners, 4, spec={"kind": "natural", "min_train_samples": 7})
    assert strict.meta["natural_clients"] == [0, 3, 6, 7] and strict.meta["eligible_clients"] == 4
    assert sorted(len(c["train"]) for c in strict.clients) == [7, 10, 16, 24]


def test_natural_needs_owners():
    y, owners = natural_data()
    splits = make_splits(len(y), len(y), FEDFAC_SPLIT, seed=0)
    with pytest.raises(UsageError, match="partition kind 'natural' needs data whose samples come from natural "
                                         "clients") as err:
        make_partition(y, splits, 10, 3, NATURAL, seed=0)
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match=r"owners must be 86 non-negative integers, .*\(got int64 of shape \[85\]\)"):
        make_partition(y, splits, 10, 3, NATURAL, seed=0, owners=owners[:-1])
    with pytest.raises(UsageError, match="owners must be"):
        make_partition(y, splits, 10, 3, NATURAL, seed=0, owners=owners - 1)
    # the other kinds ignore owners
    iid = make_partition(y, splits, 10, 3, {"kind": "iid"}, seed=0)
    assert make_partition(y, splits, 10, 3, {"kind": "iid"}, seed=0, owners=owners) == iid
