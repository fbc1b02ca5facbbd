"""Label maps: each client's task as original class -> the client's model target (-1 outside it).

They are how permuted-label and domain scenarios are expressed, and follow from the partition spec
alone (`task_label_maps`), without any data.
"""

from __future__ import annotations

import random

import numpy as np

from ..errors import UsageError
from .partition_groups import _resolve_groups
from .partition_inputs import _check_counts, _resolve_spec


def client_permutation(num_classes: int, permutation_seed: int, client: int) -> list[int]:
    """Factorized-FL's per-client label permutation: seed = global seed + client id (B.1).

    Uses Python's `random` on purpose: that is what reproduces supplement Table 2 exactly.
    """
    perm = list(range(num_classes))
    random.Random(permutation_seed + client).shuffle(perm)
    return perm


def _permute(label_maps: np.ndarray, num_outputs: int, permutation_seed: int) -> np.ndarray:
    out = label_maps.copy()
    for k, row in enumerate(out):
        perm = np.asarray(client_permutation(num_outputs, permutation_seed, k), dtype=np.int64)
        present = row >= 0
        row[present] = perm[row[present]]
    return out


def task_label_maps(spec: dict, num_classes: int, num_clients: int) -> tuple[np.ndarray, int]:
    """(label maps int64 [K, C], model outputs) of a partition spec, without any data.

    A label map says what each client's task is, not which classes its share happens to hold: in a
    single-domain scenario every client solves the whole problem (identity over all classes, even
    under heavy label skew); with class_groups a client's domain classes are labelled 0..n-1 in
    sorted order and the other classes are -1. permute_labels then applies each client's
    `client_permutation` to its labels.
    """
    _check_counts(num_classes, num_clients)
    return _label_maps(_resolve_spec(spec), num_classes, num_clients)


def _label_maps(spec: dict, num_classes: int, num_clients: int) -> tuple[np.ndarray, int]:
    """task_label_maps of a spec `_resolve_spec` has already checked."""
    if isinstance(spec["groups"], list):  # checked under every kind, not only class_groups
        beyond = [c for g in spec["groups"] for c in g if c >= num_classes]
        if beyond:
            raise UsageError(f"partition.groups names class {beyond[0]}, but the dataset has classes 0..{num_classes - 1}")
    if spec["kind"] == "class_groups":
        groups, _, per_group, _ = _resolve_groups(spec, num_classes, num_clients)
        num_outputs = max(map(len, groups))
        label_maps = np.full((num_clients, num_classes), -1, dtype=np.int64)
        for k in range(num_clients):
            group = sorted(groups[k // per_group])
            label_maps[k, group] = np.arange(len(group))  # supplement Table 3's order
    else:
        num_outputs = num_classes
        label_maps = np.tile(np.arange(num_classes, dtype=np.int64), (num_clients, 1))
    _check_outputs(num_outputs)
    if spec["permute_labels"]:
        label_maps = _permute(label_maps, num_outputs, spec["permutation_seed"])
    return label_maps, num_outputs


def _check_outputs(num_outputs: int, source: str = "partition") -> None:
    """Refuse tasks of a single class: the model would have one output, every prediction right, and
    the run would report accuracy 1.0 (as an npz dataset with one class is refused)."""
    if num_outputs < 2:
        raise UsageError(f"{source}: every client's task has a single class, so every prediction would be right "
                         "(accuracy 1.0); give each client at least two classes (class groups of two or more)")
