"""Label maps: Factorized-FL's per-client permutations (supplement Table 2) and each client's task."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fedfactor.data import make_partition
from fedfactor.data.partition_kinds import SPLITS
from fedfactor.data.partition_labels import client_permutation, task_label_maps
from fedfactor.errors import UsageError

from .conftest import ALL_SPECS, TABLE2, assert_covers, class_sets


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
