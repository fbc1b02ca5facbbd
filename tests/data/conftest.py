"""What the tests of fedfactor.data share: checks of a loaded dataset, labelled data with splits to
partition (and with natural clients), the specs every partition kind is tried with, and Factorized-FL's
Table 2, which the label maps, the class groups and the shared splits all reproduce."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfactor.data import make_partition, make_splits
from fedfactor.data.partition import Partition
from fedfactor.data.partition_kinds import SPLITS


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def expected_x(parts: list[np.ndarray]) -> np.ndarray:
    """What load_dataset should return: parts stacked, normalised with the first part's stats."""
    train = parts[0].astype(np.float64)
    mean = train.mean(axis=(0, 2, 3), keepdims=True)
    std = train.std(axis=(0, 2, 3), keepdims=True)
    return (np.concatenate(parts).astype(np.float64) - mean) / std


def assert_one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.strip() == text and text
    return text


def check_loaded(ds, written: dict, n_train: int) -> None:
    assert ds.n_official_train == n_train
    assert ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
    np.testing.assert_array_equal(ds.y.numpy(), written["y"])
    np.testing.assert_allclose(ds.x.numpy(), expected_x(written["x"]), rtol=1e-5, atol=1e-5)


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
