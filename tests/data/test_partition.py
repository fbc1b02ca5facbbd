"""The Partition and its file (save, load, validate), and what make_partition returns whatever the kind."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from fedfactor.data.partition import Partition, make_partition
from fedfactor.data.partition_kinds import SPLITS
from fedfactor.errors import UsageError

from .conftest import ALL_SPECS, TABLE2, class_sets, make_data, natural_data, natural_partition


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


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s["kind"])
def test_targets_are_valid_model_outputs(c10, spec):
    y, splits = c10
    part = make_partition(y, splits, 10, 9, spec, seed=0)
    assert part.label_maps.shape == (9, 10) and part.label_maps.dtype == np.int64
    for k in range(9):
        for s in SPLITS:
            t = part.targets(y, k, s)
            assert t.min(initial=0) >= 0 and t.max(initial=0) < part.num_classes


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


def test_natural_partition_round_trips_through_its_file(tmp_path):
    y, owners = natural_data()
    part = natural_partition(y, owners, 6, seed=2, spec={"kind": "natural", "permute_labels": True})
    part.save(tmp_path / "p.json", y)
    loaded = Partition.load(tmp_path / "p.json")
    assert loaded == part and loaded.meta["natural_clients"] == part.meta["natural_clients"]
    loaded.validate(y, "p.json")


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


def test_validate_refuses_a_partition_file_of_single_class_tasks(c10):
    y, splits = c10
    part = make_partition(y, splits, 10, 2, {"kind": "class_groups", "groups": [[0, 1], [2, 3]]}, seed=0)
    part.validate(y, "p.json")
    part.label_maps[:, [1, 3]] = -1  # an edited file: each client's task down to one class
    part.num_classes = 1
    with pytest.raises(UsageError, match="^p.json: every client's task has a single class"):
        part.validate(y, "p.json")
