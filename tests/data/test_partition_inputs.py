"""What make_partition is given: bad specs, labels, splits and seeds refused in one line."""

from __future__ import annotations

import pytest

from fedfactor.data import make_partition
from fedfactor.errors import UsageError


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
