"""Tests for fedfactor.data.partition (expected paper values are embedded, not read from disk)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from fedfactor.data.partition import (
    CIFAR100_FINE_TO_COARSE,
    GROUP_PRESETS,
    PARTITIONS,
    SPLITS,
    Partition,
    client_permutation,
    make_partition,
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
    assert set(described) == {"iid", "dirichlet", "shards", "class_groups", "dirichlet_fixed"}
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
        assert set(np.flatnonzero(part.label_maps[k] >= 0).tolist()) == train[k]
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


def test_dirichlet_fixed_sizes_and_disjointness():
    y, splits = make_data(10, 3000)  # pools large enough that no class runs out
    sizes = {"train": 120, "val": 15, "test": 30}
    spec = {"kind": "dirichlet_fixed", "alpha": 0.5, "samples_per_client": sizes}
    part = make_partition(y, splits, 10, 20, spec, seed=0)
    assert_disjoint(part)
    for c in part.clients:
        for s in SPLITS:
            assert len(c[s]) == sizes[s]
            assert np.all(np.isin(c[s], splits[s]))
    # val/test are drawn from the client's own mix: test classes mostly among its train classes
    train, test = class_sets(part, y, "train"), class_sets(part, y, "test")
    assert np.mean([len(te - tr) for tr, te in zip(train, test)]) < 1.5
    assert part.meta["samples_per_client"] == sizes


def test_dirichlet_fixed_reports_an_exhausted_class():
    y, splits = make_data(10, 60)  # 48 train samples per class on average
    sizes = {"train": 40, "val": 0, "test": 5}
    spec = {"kind": "dirichlet_fixed", "alpha": 0.05, "samples_per_client": sizes}
    pattern = r"ran out of train samples of class \d+.*fewer samples_per_client"
    with pytest.raises(UsageError, match=pattern):
        make_partition(y, splits, 10, 12, spec, seed=0)


def groups(g, **extra):
    return {"kind": "class_groups", "groups": g, **extra}


def fixed(**sizes):
    return {"kind": "dirichlet_fixed", "samples_per_client": sizes}


BAD_SPECS = [  # (spec, num_clients, what the message must say)
    ({"kind": "dirichlet", "alpha": 0}, 5, "alpha must be > 0"),
    ({"kind": "dirichlet_fixed", "alpha": -1.0}, 5, "alpha must be > 0"),
    ({"kind": "nope"}, 5, "unknown partition 'nope'; choose one of: class_groups, dirichlet"),
    ({"alpha": 0.5}, 5, "needs a kind"),
    ({"kind": "iid", "alpah": 0.5}, 5, "unknown partition key.*'alpah'.*valid keys: kind, alpha"),
    (groups([[0, 1], [2, 10]]), 2, r"\[10\] that do not exist"),
    (groups([[0, 1], [1, 2]]), 2, r"disjoint; classes \[1\]"),
    (groups([[0, 1], [2, 3]], clients_per_group=2), 5, "needs num_clients = 4"),
    (groups("cifar100_5domains"), 20, "do not exist"),
    (groups("cifar10"), 2, "unknown class-group preset"),
    ({"kind": "class_groups"}, 2, "needs groups"),
    ({"kind": "iid"}, 100_000, "only 4800 train samples"),
    ({"kind": "iid"}, 0, "num_clients must be an integer >= 1"),
    ({"kind": "shards", "classes_per_client": 0}, 5, "classes_per_client must be between 1 and 10"),
    ({"kind": "shards", "classes_per_client": 11}, 5, "must be between 1 and 10"),
    (fixed(train=-5), 5, "must be an integer >= 0"),
    (fixed(train=0, test=5), 5, r"train'\] must be >= 1"),
    (fixed(train=1000), 5, "lower samples_per_client"),
    (fixed(training=5), 5, "samples_per_client must map"),
    ({"kind": "iid", "permute_labels": "yes"}, 5, "permute_labels must be true or false"),
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


def test_load_missing_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        Partition.load(tmp_path / "missing.json")
