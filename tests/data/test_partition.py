"""Tests for fedfactor.data.partition (expected paper values are embedded, not read from disk)."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from fedfactor.data.datasets import make_splits
from fedfactor.data.partition import (
    CIFAR100_FINE_TO_COARSE,
    GROUP_PRESETS,
    PARTITIONS,
    SPLITS,
    Partition,
    _boundaries,
    client_permutation,
    make_partition,
    task_label_maps,
)
from fedfactor.errors import UsageError

# Factorized-FL supplement Table 2: client k's permutation, perm[y] = the client's label of class y.
TABLE2 = [
    [2, 8, 3, 5, 6, 4, 9, 0, 1, 7], [5, 4, 0, 9, 2, 1, 3, 7, 8, 6],
    [3, 1, 5, 0, 6, 4, 2, 9, 7, 8], [0, 5, 3, 7, 9, 8, 1, 4, 6, 2],
    [8, 1, 4, 9, 6, 5, 2, 3, 7, 0], [2, 8, 9, 3, 5, 6, 0, 7, 4, 1],
    [4, 1, 9, 8, 2, 6, 3, 0, 5, 7], [4, 0, 5, 8, 1, 6, 2, 3, 7, 9],
    [2, 9, 4, 7, 0, 3, 6, 5, 8, 1], [2, 7, 1, 6, 9, 4, 3, 0, 5, 8],
    [0, 7, 5, 2, 6, 9, 3, 1, 8, 4], [6, 3, 5, 7, 1, 4, 0, 2, 9, 8],
    [1, 6, 3, 8, 7, 4, 5, 9, 0, 2], [8, 2, 0, 7, 3, 4, 6, 5, 9, 1],
    [4, 0, 1, 6, 7, 5, 2, 3, 8, 9], [0, 4, 6, 7, 5, 9, 1, 2, 3, 8],
    [0, 1, 3, 4, 5, 8, 7, 9, 6, 2], [6, 8, 7, 4, 3, 1, 2, 5, 0, 9],
    [9, 1, 6, 3, 8, 2, 5, 0, 7, 4], [7, 4, 5, 8, 9, 0, 1, 6, 2, 3],
]  # fmt: skip

# Factorized-FL supplement Table 3: the domains' CIFAR-100 label sets (corrected label column).
DOMAINS = {
    "Household Objects": [5, 20, 22, 25, 39, 40, 84, 86, 87, 94],
    "Fruits & Foods": [0, 9, 10, 16, 28, 51, 53, 57, 61, 83],
    "Trees & Flowers": [47, 52, 54, 56, 59, 62, 70, 82, 92, 96],
    "Transport": [8, 13, 41, 48, 58, 69, 81, 85, 89, 90],
    "Animals": [3, 34, 42, 43, 63, 64, 66, 75, 88, 97],
}
# A few Table 3 cells: (client number as printed, 1-based; original label; permuted label).
TABLE3_CELLS = [
    (1, 5, 2),  # Household, Bed
    (1, 94, 7),  # Household, Television
    (4, 86, 4),  # Household, Lamp
    (6, 0, 2),  # Fruits & Foods, Apple
    (8, 83, 9),  # Fruits & Foods, Plate
    (10, 54, 1),  # Trees & Flowers, Rose (an OCR-fixed cell)
    (16, 90, 8),  # Transport, Train
    (17, 66, 7),  # Animals, Leopard (an OCR-fixed cell)
    (18, 63, 3),  # Animals, Skunk (an OCR-fixed cell)
    (20, 97, 3),  # Animals, Wolf
]

CIFAR100_FINE = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus "
    "butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch "
    "crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo "
    "keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse "
    "mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy "
    "porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper "
    "snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television "
    "tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
SUPERCLASS_MEMBERS = {
    "aquatic_mammals": "beaver dolphin otter seal whale",
    "fish": "aquarium_fish flatfish ray shark trout",
    "flowers": "orchid poppy rose sunflower tulip",
    "food_containers": "bottle bowl can cup plate",
    "fruit_and_vegetables": "apple mushroom orange pear sweet_pepper",
    "household_electrical_devices": "clock keyboard lamp telephone television",
    "household_furniture": "bed chair couch table wardrobe",
    "insects": "bee beetle butterfly caterpillar cockroach",
    "large_carnivores": "bear leopard lion tiger wolf",
    "large_man-made_outdoor_things": "bridge castle house road skyscraper",
    "large_natural_outdoor_scenes": "cloud forest mountain plain sea",
    "large_omnivores_and_herbivores": "camel cattle chimpanzee elephant kangaroo",
    "medium_mammals": "fox porcupine possum raccoon skunk",
    "non-insect_invertebrates": "crab lobster snail spider worm",
    "people": "baby boy girl man woman",
    "reptiles": "crocodile dinosaur lizard snake turtle",
    "small_mammals": "hamster mouse rabbit shrew squirrel",
    "trees": "maple_tree oak_tree palm_tree pine_tree willow_tree",
    "vehicles_1": "bicycle bus motorcycle pickup_truck train",
    "vehicles_2": "lawn_mower rocket streetcar tank tractor",
}


def make_data(num_classes: int, per_class: int, seed: int = 0, val_frac: float = 0.1):
    """Pooled labels with random disjoint splits: 80% train, val_frac val, the rest test."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.repeat(np.arange(num_classes), per_class)).astype(np.int64)
    order = rng.permutation(len(y))
    n_train, n_val = int(0.8 * len(y)), int(val_frac * len(y))
    splits = {
        "train": np.sort(order[:n_train]),
        "val": np.sort(order[n_train : n_train + n_val]),
        "test": np.sort(order[n_train + n_val :]),
    }
    return y, splits


@pytest.fixture(scope="module")
def c10():
    return make_data(10, 600)


@pytest.fixture(scope="module")
def c100():
    return make_data(100, 60)


def class_sets(part: Partition, y: np.ndarray, split: str) -> list[set[int]]:
    return [set(np.unique(y[c[split]]).tolist()) for c in part.clients]


def assert_disjoint(part: Partition) -> None:
    for s in SPLITS:
        allidx = np.concatenate([c[s] for c in part.clients])
        assert len(np.unique(allidx)) == len(allidx), f"clients overlap in {s}"


def assert_covers(part: Partition, y, splits, classes=None) -> None:
    for s in SPLITS:
        want = splits[s] if classes is None else splits[s][np.isin(y[splits[s]], classes)]
        got = np.sort(np.concatenate([c[s] for c in part.clients]))
        np.testing.assert_array_equal(got, want)


SHARE_SPECS = [
    {"kind": "iid"},
    {"kind": "dirichlet", "alpha": 0.5},
    {"kind": "shards", "classes_per_client": 2},
    {
        "kind": "class_groups",
        "groups": [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]],
        "clients_per_group": 3,
    },
]
ALL_SPECS = SHARE_SPECS + [
    {"kind": "dirichlet_fixed", "samples_per_client": {"train": 100, "val": 10, "test": 20}},
    {"kind": "dirichlet", "permute_labels": True},
]


def test_all_kinds_registered_with_descriptions():
    described = dict(PARTITIONS.describe())
    assert set(described) == {"iid", "dirichlet", "shards", "class_groups", "dirichlet_fixed", "natural"}
    assert all(d and "\n" not in d for d in described.values())


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s["kind"])
def test_deterministic_and_seed_sensitive(c10, spec, tmp_path):
    y, splits = c10
    a = make_partition(y, splits, 10, 9, spec, seed=3)
    b = make_partition(y, splits, 10, 9, dict(spec), seed=3)
    assert a == b
    a.save(tmp_path / "a.json", y)
    b.save(tmp_path / "b.json", y)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    c = make_partition(y, splits, 10, 9, spec, seed=4)
    assert any(not np.array_equal(p["train"], q["train"]) for p, q in zip(a.clients, c.clients))


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


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s["kind"])
def test_targets_are_valid_model_outputs(c10, spec):
    y, splits = c10
    part = make_partition(y, splits, 10, 9, spec, seed=0)
    assert part.label_maps.shape == (9, 10) and part.label_maps.dtype == np.int64
    for k in range(9):
        for s in SPLITS:
            t = part.targets(y, k, s)
            assert t.min(initial=0) >= 0 and t.max(initial=0) < part.num_classes


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


def test_permutations_match_supplement_table2():
    for k, expected in enumerate(TABLE2):
        assert client_permutation(10, 1234, k) == expected
        # the paper's recipe: the global `random` seeded with 1234 + client id
        random.seed(1234 + k)
        perm = list(range(10))
        random.shuffle(perm)
        assert perm == expected


def test_permute_labels_applies_table2_to_every_split(c10):
    y, splits = c10
    spec = {"kind": "iid", "permute_labels": True}
    part = make_partition(y, splits, 10, 20, spec, seed=0)
    np.testing.assert_array_equal(part.label_maps, np.array(TABLE2))
    assert part.meta["permutation_seed"] == 1234
    for k in (0, 7, 19):
        for s in SPLITS:
            np.testing.assert_array_equal(
                part.targets(y, k, s), np.array(TABLE2[k])[y[part.clients[k][s]]]
            )
    other = make_partition(y, splits, 10, 20, {**spec, "permutation_seed": 99}, seed=0)
    assert sorted(other.label_maps[0].tolist()) == list(range(10))  # still a bijection
    assert not np.array_equal(other.label_maps, part.label_maps)
    plain = make_partition(y, splits, 10, 20, {"kind": "iid"}, seed=0)
    for a, b in zip(plain.clients, part.clients):  # relabelling does not move samples
        assert all(np.array_equal(a[s], b[s]) for s in SPLITS)


def test_cifar100_5domains_preset_matches_table3(c100):
    named, per_group = GROUP_PRESETS["cifar100_5domains"]
    assert per_group == 4
    assert {name: sorted(g) for name, g in named} == DOMAINS
    assert [name for name, _ in named] == list(DOMAINS)  # the CSV's domain order

    y, splits = c100
    spec = {"kind": "class_groups", "groups": "cifar100_5domains"}
    part = make_partition(y, splits, 100, 20, spec, seed=0)
    assert part.num_classes == 10
    assert part.meta["group_names"] == list(DOMAINS)
    used = sorted(c for g in DOMAINS.values() for c in g)
    assert len(used) == len(set(used)) == 50  # the domains are disjoint
    assert_disjoint(part)
    assert_covers(part, y, splits, classes=used)
    for k, domain in enumerate(DOMAINS.values()):
        for client in range(4 * k, 4 * k + 4):
            assert class_sets(part, y, "train")[client] == set(domain)
            assert class_sets(part, y, "test")[client] <= set(domain)
            np.testing.assert_array_equal(part.label_maps[client][domain], np.arange(10))
            assert np.all(np.delete(part.label_maps[client], domain) == -1)


def test_permuted_domain_labels_match_table3(c100):
    y, splits = c100
    spec = {"kind": "class_groups", "groups": "cifar100_5domains", "permute_labels": True}
    part = make_partition(y, splits, 100, 20, spec, seed=0)
    for client, original, label in TABLE3_CELLS:
        assert part.label_maps[client - 1, original] == label
    # in general: sorted position within the domain, then the client's Table 2 permutation
    for k in range(20):
        domain = list(DOMAINS.values())[k // 4]
        assert part.label_maps[k, domain].tolist() == TABLE2[k]


def test_cifar100_superclasses_preset(c100):
    named, per_group = GROUP_PRESETS["cifar100_superclasses"]
    assert per_group == 1
    assert [n for n, _ in named] == list(SUPERCLASS_MEMBERS)
    for name, group in named:
        assert sorted(CIFAR100_FINE[c] for c in group) == SUPERCLASS_MEMBERS[name].split()
    assert sorted(CIFAR100_FINE_TO_COARSE) == sorted(list(range(20)) * 5)

    y, splits = c100
    spec = {"kind": "class_groups", "groups": "cifar100_superclasses"}
    part = make_partition(y, splits, 100, 20, spec, seed=0)
    assert part.num_classes == 5
    assert_covers(part, y, splits)
    assert part.meta["client_group"] == list(range(20))


def test_class_groups_outputs_are_the_largest_group(c10):
    y, splits = c10
    spec = {"kind": "class_groups", "groups": [[9, 2], [0, 5, 7]], "clients_per_group": 2}
    part = make_partition(y, splits, 10, 4, spec, seed=0)
    assert part.num_classes == 3
    assert part.label_maps[0, [2, 9]].tolist() == [0, 1]  # labelled in sorted class order
    assert part.label_maps[3, [0, 5, 7]].tolist() == [0, 1, 2]
    assert_covers(part, y, splits, classes=[0, 2, 5, 7, 9])


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s["kind"])
def test_label_maps_follow_from_the_spec_alone(c10, spec):
    y, splits = c10
    part = make_partition(y, splits, 10, 9, spec, seed=0)
    label_maps, num_outputs = task_label_maps(spec, 10, 9)
    np.testing.assert_array_equal(part.label_maps, label_maps)
    assert part.num_classes == num_outputs


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "dirichlet", "alpha": 0.05},
        {"kind": "shards", "classes_per_client": 1},
        {"kind": "dirichlet_fixed", "alpha": 0.05, "samples_per_client": {"train": 100}},
    ],
    ids=lambda s: s["kind"],
)
def test_skewed_clients_still_solve_every_class(c10, spec):
    y, splits = c10
    part = make_partition(y, splits, 10, 9, spec, seed=0)
    assert min(map(len, class_sets(part, y, "train"))) < 10  # some client lacks some classes
    np.testing.assert_array_equal(part.label_maps, np.tile(np.arange(10), (9, 1)))


def test_task_label_maps_of_class_groups():
    spec = {"kind": "class_groups", "groups": [[9, 2], [0, 5, 7]], "clients_per_group": 1}
    label_maps, num_outputs = task_label_maps(spec, 10, 2)
    assert num_outputs == 3
    assert label_maps.dtype == np.int64
    assert label_maps.tolist() == [
        [-1, -1, 0, -1, -1, -1, -1, -1, -1, 1],
        [0, -1, -1, -1, -1, 1, -1, 2, -1, -1],
    ]
    permuted, _ = task_label_maps({**spec, "permute_labels": True}, 10, 2)
    # client k's permutation of 3 outputs, applied to its labels, -1 left alone
    for k in range(2):
        perm = client_permutation(3, 1234, k)
        expected = [perm[t] if t >= 0 else -1 for t in label_maps[k]]
        assert permuted[k].tolist() == expected
    assert task_label_maps({"kind": "class_groups", "groups": "cifar100_5domains"}, 100, 20)[1] == 10


@pytest.mark.parametrize(
    "args, pattern",
    [
        (({"kind": "iid"}, 10, 0), "num_clients must be an integer >= 1"),
        (({"kind": "iid"}, 0, 3), "num_classes must be an integer >= 1"),
        (({"alpha": 0.5}, 10, 3), "needs a kind"),
        (({"kind": "class_groups", "groups": [[0], [1]]}, 10, 3), "needs num_clients = 2"),
    ],
)
def test_task_label_maps_rejects_bad_input(args, pattern):
    with pytest.raises(UsageError, match=pattern):
        task_label_maps(*args)


def test_partition_keeps_the_pooled_val_and_test_splits(c10):
    y, splits = c10
    shuffled = {s: np.random.default_rng(0).permutation(idx) for s, idx in splits.items()}
    part = make_partition(y, shuffled, 10, 4, {"kind": "dirichlet", "alpha": 0.1}, seed=0)
    assert set(part.pools) == {"val", "test"}
    for s in ("val", "test"):
        np.testing.assert_array_equal(part.pools[s], splits[s])  # sorted, whatever order came in


def test_shared_split_is_the_whole_pool_for_single_domain_kinds(c10):
    y, splits = c10
    part = make_partition(y, splits, 10, 9, {"kind": "dirichlet", "alpha": 0.05}, seed=0)
    lacking = next(k for k, c in enumerate(class_sets(part, y, "test")) if len(c) < 10)
    idx, targets = part.shared_split(y, lacking, "test")
    np.testing.assert_array_equal(idx, splits["test"])  # classes the client never saw included
    np.testing.assert_array_equal(targets, y[splits["test"]])

    permuted = make_partition(y, splits, 10, 20, {"kind": "iid", "permute_labels": True}, seed=0)
    idx, targets = permuted.shared_split(y, 7, "val")
    np.testing.assert_array_equal(idx, splits["val"])
    np.testing.assert_array_equal(targets, np.array(TABLE2[7])[y[splits["val"]]])


def test_shared_split_of_a_domain_is_its_classes_in_the_pool(c10):
    y, splits = c10
    spec = {"kind": "class_groups", "groups": [[9, 2], [0, 5, 7]], "clients_per_group": 2}
    part = make_partition(y, splits, 10, 4, spec, seed=0)
    idx, targets = part.shared_split(y, 1, "test")  # client 1 is in the domain {2, 9}
    np.testing.assert_array_equal(idx, splits["test"][np.isin(y[splits["test"]], [2, 9])])
    np.testing.assert_array_equal(targets, (y[idx] == 9).astype(np.int64))  # 2 -> 0, 9 -> 1
    with pytest.raises(UsageError, match="shared split must be one of val, test"):
        part.shared_split(y, 1, "train")


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


def groups(g, **extra):
    return {"kind": "class_groups", "groups": g, **extra}


def fixed(overlap: bool = True, **sizes):
    return {"kind": "dirichlet_fixed", "samples_per_client": sizes, "overlap": overlap}


BAD_SPECS = [  # (spec, num_clients, what the message must say)
    ({"kind": "dirichlet", "alpha": 0}, 5, r"^partition.alpha: input should be greater than 0 \("),
    ({"kind": "dirichlet_fixed", "alpha": -1.0}, 5, "partition.alpha: input should be greater"),
    ({"kind": "dirichlet", "alpha": float("nan")}, 5, "partition.alpha: input should be a finite"),
    ({"kind": "nope"}, 5, "unknown partition 'nope'; choose one of: class_groups, dirichlet"),
    ({"alpha": 0.5}, 5, "needs a kind"),
    ({"kind": "iid", "alpah": 0.5}, 5, "unknown config key 'partition.alpah'"),
    (groups([[0, 1], [2, 10]]), 2, r"names class 10, but the dataset has classes 0\.\.9"),
    (groups([[0, 1], [1, 2]]), 2, r"disjoint; classes \[1\]"),
    (groups([[0, 1], [2, 3]], clients_per_group=2), 5, "needs num_clients = 4"),
    (groups("cifar100_5domains"), 20, "do not exist"),
    (groups("cifar10"), 2, "unknown class-group preset"),
    ({"kind": "class_groups"}, 2, "needs groups"),
    ({"kind": "iid"}, 100_000, "only 4800 train samples"),
    ({"kind": "iid"}, 0, "num_clients must be an integer >= 1"),
    ({"kind": "shards", "classes_per_client": 0}, 5, "classes_per_client: input should be greater"),
    ({"kind": "shards", "classes_per_client": 11}, 5, "must be between 1 and 10"),
    (fixed(val=-5), 5, r"samples_per_client.val: input should be greater than or equal to 0 \("),
    (fixed(train=0, test=5), 5, "samples_per_client.train: input should be greater than or equal"),
    (fixed(train=1000, overlap=False), 5, "needs 5000 train samples.*lower samples_per_client"),
    (fixed(train=5000), 5, "needs 5000 train samples per client.*has 4800"),
    (fixed(training=5), 5, "unknown config key 'partition.samples_per_client.training'"),
    ({"kind": "iid", "permute_labels": "maybe"}, 5, "permute_labels: input should be a valid bool"),
    ({"kind": "iid", "min_train_samples": 0}, 5, "min_train_samples: input should be greater"),
    (groups([[0, 1.5]]), 2, r"partition.groups: must be a preset name .* \(got \[\[0, 1.5\]\]\)"),
    (groups(5), 2, "partition.groups: must be a preset name"),
    ({"kind": "iid", "file": "p.json"}, 5, "partition.file names a saved partition"),
    ("iid", 5, "must be a mapping"),
]


@pytest.mark.parametrize("spec, clients, pattern", BAD_SPECS)
def test_bad_specs_raise_one_line_usage_errors(c10, spec, clients, pattern):
    y, splits = c10
    with pytest.raises(UsageError, match=pattern) as err:
        make_partition(y, splits, 10, clients, spec, seed=0)
    assert "\n" not in str(err.value)


def test_bad_inputs_raise_usage_errors(c10):
    y, splits = c10
    overlapping = {**splits, "val": splits["train"][:5]}
    with pytest.raises(UsageError, match="overlap"):
        make_partition(y, overlapping, 10, 5, {"kind": "iid"}, seed=0)
    with pytest.raises(UsageError, match="labels must lie in 0..4"):
        make_partition(y, splits, 5, 5, {"kind": "iid"}, seed=0)
    with pytest.raises(UsageError, match="seed"):
        make_partition(y, splits, 10, 5, {"kind": "iid"}, seed=-1)


def test_save_load_round_trip(c10, tmp_path):
    y, splits = c10
    spec = {"kind": "class_groups", "groups": [[0, 1, 2], [3, 4]], "permute_labels": True}
    part = make_partition(y, splits, 10, 4, spec, seed=5)
    path = tmp_path / "sub" / "partition.json"
    part.save(path, y)
    assert [p.name for p in path.parent.iterdir()] == ["partition.json"]  # no temp file left
    loaded = Partition.load(path)
    assert loaded == part
    assert loaded.meta["labels_sha1"] == part.meta["labels_sha1"]
    loaded.check_labels(y)
    doc = json.loads(path.read_text())
    assert doc["format_version"] == 2
    assert doc["pools"] == {s: splits[s].tolist() for s in ("val", "test")}
    assert doc["histograms"] == part.histograms(y)
    assert " " not in path.read_text()  # compact
    assert part.meta["kind"] == "class_groups" and part.meta["seed"] == 5
    assert part.meta["num_original_classes"] == 10
    with pytest.raises(UsageError, match="labels do not match"):
        part.save(tmp_path / "other.json", y[::-1].copy())


@pytest.mark.parametrize(
    "content",
    ['{"num_clients": 3', "not json at all", "[1, 2, 3]", '{"format_version": 1}', b"\xff\xfe\x00"],
)
def test_load_rejects_garbled_files(tmp_path, content):
    path = tmp_path / "p.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(UsageError, match="not a valid partition file") as err:
        Partition.load(path)
    assert "\n" not in str(err.value)


def saved_doc(c10, tmp_path) -> dict:
    y, splits = c10
    path = tmp_path / "p.json"
    make_partition(y, splits, 10, 3, {"kind": "iid"}, seed=0).save(path, y)
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"format_version": 1}, "format_version 1, this version of fedfactor reads 2"),
        ({"pools": {"val": [1, 2]}}, "pools must have exactly the keys val, test"),
        ({"pools": {"val": [1], "test": [2], "train": [3]}}, "pools must have exactly the keys"),
        ({"pools": {"val": [[1, 2]], "test": [3]}}, "flat lists of integers"),
        ({"pools": {"val": [1.5], "test": [3]}}, "flat lists of integers"),
        ({"pools": [[1], [2]]}, "pools must have exactly the keys"),
    ],
)
def test_load_rejects_old_or_bad_pools(c10, tmp_path, change, reason):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**saved_doc(c10, tmp_path), **change}))
    with pytest.raises(UsageError) as err:
        Partition.load(path)
    message = str(err.value)
    assert reason in message and message.endswith("delete it and create it again")
    assert "\n" not in message


def test_load_missing_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        Partition.load(tmp_path / "missing.json")


# --------------------------------------------------------------------------------------------
# Partition.validate: a partition checked against the labels it will be used with

VALID_SPECS = [(spec, 9) for spec in ALL_SPECS] + [  # (spec, clients)
    # groups of unequal size: the smaller group's clients use only some of the model's outputs
    ({"kind": "class_groups", "groups": [[0, 1, 2], [3, 4]], "permute_labels": True}, 4),
    # clients sharing samples, as FedDecomp's sampler allows
    ({"kind": "dirichlet_fixed", "samples_per_client": {"train": 600, "val": 60, "test": 60}}, 9),
]


@pytest.mark.parametrize("spec, clients", VALID_SPECS, ids=[s["kind"] for s, _ in VALID_SPECS])
def test_every_kind_builds_partitions_that_validate(c10, spec, clients, tmp_path):
    y, splits = c10
    part = make_partition(y, splits, 10, clients, spec, seed=0)
    part.validate(y, "p.json")
    part.save(tmp_path / "p.json", y)
    Partition.load(tmp_path / "p.json").validate(y, "p.json")


def test_validate_is_fast_for_100_clients_and_60k_samples():
    y, splits = make_data(10, 6000)
    part = make_partition(y, splits, 10, 100, {"kind": "dirichlet", "alpha": 0.5}, seed=0)
    start = time.perf_counter()
    part.validate(y)
    assert time.perf_counter() - start < 0.5


def _set(k, split, value):
    """A change that puts `value` in place of the first index of client k's split."""

    def change(part, y):
        part.clients[k][split] = np.concatenate([[value], part.clients[k][split][1:]])

    return change


def _train_takes(k, source_client, split, count):
    def change(part, y):
        extra = part.clients[source_client][split][:count]
        part.clients[k]["train"] = np.union1d(part.clients[k]["train"], extra)

    return change


def _label_map(k, cls, target):
    def change(part, y):
        part.label_maps[k, cls] = target

    return change


def _outside_task(part, y):
    # client 1 loses the class of its first train sample, which other clients still cover
    part.label_maps[1, y[part.clients[1]["train"][0]]] = -1


BROKEN = [  # (change, what the message must say); c10 has N = 6000 samples, 3 iid clients
    (_set(1, "test", -1), r"client 1's test split holds the index -1, outside 0\.\.5999 \(.*=6000"),
    (_set(0, "train", 6000), "client 0's train split holds the index 6000, outside 0..5999"),
    (_set(2, "val", 6005), "client 2's val split holds the index 6005"),
    (lambda p, y: p.pools.update(test=np.append(p.pools["test"], 6000)), "pooled test split holds"),
    (_train_takes(2, 2, "test", 5), "client 2's train and test splits share 5 indices"),
    (_train_takes(0, 0, "val", 1), "client 0's train and val splits share 1 indices"),
    (_train_takes(0, 1, "test", 3), "client 0's train split shares 3 indices with the pooled test"),
    (_train_takes(2, 0, "val", 2), "client 2's train split shares 2 indices with the pooled val"),
    (lambda p, y: p.clients[1].update(train=np.empty(0, np.int64)), "client 1 has an empty train"),
    (lambda p, y: setattr(p, "label_maps", p.label_maps[:, :9]), r"label_maps has shape \[3, 9\]"),
    (lambda p, y: setattr(p, "label_maps", p.label_maps[:2]), r"label_maps has shape \[2, 10\]"),
    (_label_map(0, 3, -2), "client 0's label map sends class 3 to -2; a target must be 0..9"),
    (_label_map(1, 0, 10), "client 1's label map sends class 0 to 10"),
    (_label_map(2, 4, 5), "client 2's label map sends more than one class to target 5"),
    (lambda p, y: setattr(p, "num_classes", 11), "num_classes is 11 but the largest client task"),
    (_outside_task, r"client 1's train split holds \d+ samples outside its task"),
    # a train list repeated three times weighs those samples three times (accuracy 0.55 -> 0.67 once)
    (lambda p, y: p.clients[1].update(train=np.tile(p.clients[1]["train"], 3)),
     r"client 1's train split holds the index \d+ 3 times; an index may appear once per split"),
    (lambda p, y: p.clients[0].update(test=np.append(p.clients[0]["test"], p.clients[0]["test"][0])),
     r"client 0's test split holds the index \d+ 2 times"),
    (lambda p, y: p.pools.update(val=np.append(p.pools["val"], p.pools["val"][:2])), "pooled val split holds the index"),
]


@pytest.mark.parametrize("change, pattern", BROKEN)
def test_validate_names_the_file_and_the_first_problem(c10, change, pattern):
    y, splits = c10
    part = make_partition(y, splits, 10, 3, {"kind": "iid"}, seed=0)
    part.validate(y, "parts/p.json")  # the change alone makes it fail
    change(part, y)
    with pytest.raises(UsageError, match=pattern) as err:
        part.validate(y, "parts/p.json")
    message = str(err.value)
    assert message.startswith("parts/p.json: ") and "\n" not in message
    assert message.endswith("create it again with `fedfactor partition`")


@pytest.mark.parametrize(
    "path, value, reason",
    [
        (("clients", 0, "train", 0), True, "flat lists of integers"),
        (("clients", 1, "test", 1), 1.5, "flat lists of integers"),
        (("clients", 2, "val", 0), "x", "flat lists of integers"),
        (("clients", 0, "train", 2), "7", "flat lists of integers"),
        (("clients", 0, "train", 2), None, "flat lists of integers"),
        (("clients", 0, "train", 2), 2**70, "too large"),
        (("pools", "test", 0), False, "flat lists of integers"),
        (("label_maps", 0, 1), True, "label_maps must be lists of integers"),
        (("label_maps", 1, 2), 2.5, "label_maps must be lists of integers"),
        (("label_maps", 2, 3), "3", "label_maps must be lists of integers"),
        (("label_maps", 2), [0, 1], "label_maps must be lists of integers"),
        (("num_clients",), True, "num_clients and num_classes must be integers >= 1"),
        (("num_classes",), 0, "num_clients and num_classes must be integers >= 1"),
        (("num_classes",), 10.0, "num_clients and num_classes must be integers >= 1"),
    ],
)
def test_load_rejects_values_json_would_coerce(c10, tmp_path, path, value, reason):
    doc = saved_doc(c10, tmp_path)
    *parents, last = path
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="not a valid partition file") as err:
        Partition.load(bad)
    message = str(err.value)
    assert reason in message and "bad.json" in message and "\n" not in message


# --------------------------------------------------------------------------------------------
# natural: the data's own clients (FEMNIST's writers, Shakespeare's roles)


def natural_data(sizes=(12, 5, 1, 30, 7, 2, 9, 20), num_classes=10, seed=0):
    """Labels and owners of len(sizes) writers, their samples interleaved as LEAF's shards are not."""
    rng = np.random.default_rng(seed)
    owners = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    y = rng.integers(0, num_classes, size=len(owners))
    return y, owners


NATURAL = {"kind": "natural"}
FEDFAC_SPLIT = (0.8, 0.0, 0.2)  # "we randomly split the dataset in each client to be training (80%) and testing (20%)"


def natural_partition(y, owners, clients, seed=0, fractions=FEDFAC_SPLIT, spec=NATURAL):
    splits = make_splits(len(y), len(y), fractions, seed=seed, owners=owners)
    return make_partition(y, splits, 10, clients, spec, seed=seed, owners=owners)


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


def test_natural_partition_round_trips_through_its_file(tmp_path):
    y, owners = natural_data()
    part = natural_partition(y, owners, 6, seed=2, spec={"kind": "natural", "permute_labels": True})
    part.save(tmp_path / "p.json", y)
    loaded = Partition.load(tmp_path / "p.json")
    assert loaded == part and loaded.meta["natural_clients"] == part.meta["natural_clients"]
    loaded.validate(y, "p.json")


# issue 39: class groups of one class each trained and reported accuracy 1.0000 +- 0
@pytest.mark.parametrize("permute", [False, True])
def test_tasks_of_a_single_class_are_refused(c10, permute):
    spec = {"kind": "class_groups", "groups": [[c] for c in range(10)], "clients_per_group": 1,
            "permute_labels": permute}
    with pytest.raises(UsageError, match="every client's task has a single class"):
        task_label_maps(spec, 10, 10)
    y, splits = c10
    with pytest.raises(UsageError, match="every client's task has a single class"):
        make_partition(y, splits, 10, 10, spec, seed=0)


def test_validate_refuses_a_partition_file_of_single_class_tasks(c10):
    y, splits = c10
    part = make_partition(y, splits, 10, 2, {"kind": "class_groups", "groups": [[0, 1], [2, 3]]}, seed=0)
    part.validate(y, "p.json")
    part.label_maps[:, [1, 3]] = -1  # an edited file: each client's task down to one class
    part.num_classes = 1
    with pytest.raises(UsageError, match="^p.json: every client's task has a single class"):
        part.validate(y, "p.json")


@pytest.mark.parametrize("kind, message", [("fifo", "is not a regular file"), ("folder", "is a folder"),
                                           ("missing", "does not exist; create it first")])
def test_only_a_regular_file_is_loaded_as_a_partition(tmp_path, kind, message):
    import os

    path = tmp_path / "p.json"
    if kind == "fifo":
        os.mkfifo(path)  # reading it would block until a writer comes
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(UsageError, match=f"^partition file '{path}' {message}"):
        Partition.load(path)


def test_a_classs_cut_points_end_at_its_last_sample_even_when_the_shares_sum_short_of_one():
    """Catches: the last cut left to float arithmetic, which drops a class's last samples whenever
    the shares' sum falls short of 1 (here by 1e-6 of a million samples: one sample)."""
    n = 1_000_000
    cuts = _boundaries(np.array([0.5, 0.5 - 1e-6]), n)
    assert cuts[0] == 0 and cuts[-1] == n and (np.diff(cuts) >= 0).all()
    assert cuts[1] == n // 2  # the others where the shares put them
