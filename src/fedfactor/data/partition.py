"""Split a pooled labelled dataset into per-client train/val/test sets.

Every client gets its own train, val and test indices drawn from the same class mix, so each
personalised model is evaluated on its own task, plus a label map (original class -> the client's
model target), which is how permuted-label and domain scenarios are expressed. The label maps
describe each client's task and follow from the spec alone (`task_label_maps`); the partition also
keeps the pooled val and test splits, on which Factorized-FL and SimFed score every client.

Most kinds are defined by a share matrix P [K, C] (P[k, c] = share of class c that client k gets);
`_cut_by_shares` then cuts every split of every class at the same boundaries, so the clients are
disjoint and together cover every sample of every class some client uses. `dirichlet_fixed`
(FedDecomp) instead draws a fixed number of samples per client and split, by default independently
of the other clients, as FedDecomp's code does. `natural` takes the clients the data come with
(FEMNIST's writers, Shakespeare's speaking roles), each with its own samples.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn

import numpy as np
from pydantic import ValidationError

from ..config import PartitionConfig, regular_file, validation_message
from ..errors import UsageError
from ..io import atomic_write_text
from ..registry import Registry
from .base import check_owners

SPLITS = ("train", "val", "test")
POOLED_SPLITS = ("val", "test")  # the pooled splits a partition keeps for shared evaluation
FORMAT_VERSION = 2

# Factorized-FL supplement, Table 3 (B.2): five CIFAR-100 domains of ten classes, four clients each.
# The class sets are the paper's (OCR-corrected) label column; each is the union of two standard
# CIFAR-100 superclasses.
CIFAR100_5DOMAINS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("Household Objects", (5, 20, 22, 25, 39, 40, 84, 86, 87, 94)),
    ("Fruits & Foods", (0, 9, 10, 16, 28, 51, 53, 57, 61, 83)),
    ("Trees & Flowers", (47, 52, 54, 56, 59, 62, 70, 82, 92, 96)),
    ("Transport", (8, 13, 41, 48, 58, 69, 81, 85, 89, 90)),
    ("Animals", (3, 34, 42, 43, 63, 64, 66, 75, 88, 97)),
)

# The standard CIFAR-100 coarse labels (SimFed's 20 domains), indexed by fine label in the
# dataset's alphabetical fine-label order.
CIFAR100_SUPERCLASS_NAMES: tuple[str, ...] = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes",
    "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates", "people",
    "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
)  # fmt: skip
CIFAR100_FINE_TO_COARSE: tuple[int, ...] = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)  # fmt: skip


def _superclass_groups() -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(
        (name, tuple(f for f, c in enumerate(CIFAR100_FINE_TO_COARSE) if c == s))
        for s, name in enumerate(CIFAR100_SUPERCLASS_NAMES)
    )


# preset name -> (named groups, default clients per group)
GROUP_PRESETS: dict[str, tuple[tuple[tuple[str, tuple[int, ...]], ...], int]] = {
    "cifar100_5domains": (CIFAR100_5DOMAINS, 4),
    "cifar100_superclasses": (_superclass_groups(), 1),
}

_GROUPS_HINT = (
    f"a preset name ({', '.join(sorted(GROUP_PRESETS))}) "
    "or a non-empty list of non-empty lists of classes"
)

# Independent random streams per purpose, so e.g. the share draw does not depend on split sizes.
_STREAM_SHARES, _STREAM_CUT, _STREAM_FIXED = 0, 1, 2


def _rng(seed: int, *tags: int) -> np.random.Generator:
    return np.random.default_rng([seed, *tags])


def labels_sha1(y: np.ndarray) -> str:
    return hashlib.sha1(np.asarray(y).astype(np.int64).tobytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# The result


@dataclass(eq=False)
class Partition:
    num_clients: int
    num_classes: int  # model outputs
    clients: list[dict[str, np.ndarray]]
    label_maps: np.ndarray  # [K, original classes]: the client's target, or -1 outside its task
    pools: dict[str, np.ndarray]  # the sorted pooled val and test indices the clients were cut from
    meta: dict = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        return (
            self.num_clients == other.num_clients
            and self.num_classes == other.num_classes
            and self.meta == other.meta
            and np.array_equal(self.label_maps, other.label_maps)
            and self.pools.keys() == other.pools.keys()
            and all(np.array_equal(self.pools[s], other.pools[s]) for s in self.pools)
            and all(
                np.array_equal(a[s], b[s])
                for a, b in zip(self.clients, other.clients, strict=True)
                for s in SPLITS
            )
        )

    def check_labels(self, y: np.ndarray, source: str = "partition") -> None:
        """Refuse labels other than the ones this partition was made from."""
        if labels_sha1(y) != self.meta.get("labels_sha1"):
            raise UsageError(
                f"{source}: the labels do not match the ones this partition was made from "
                "(labels_sha1 differs); rebuild the partition for this dataset"
            )

    def validate(self, y: np.ndarray, source: str = "partition") -> None:
        """Refuse a partition that does not fit the labels y, naming `source` and the first problem.

        `load` checks only the file's structure. An edited or foreign file could still hold an
        index past the data (a crash mid-run) or a negative one (numpy would silently take a
        sample from the end), a test sample inside train (inflated accuracy), or a sample outside
        its client's task (target -1, another crash mid-run).
        """
        y = np.asarray(y)
        n, label_maps = len(y), np.asarray(self.label_maps)

        def fail(problem: str) -> NoReturn:
            raise UsageError(
                f"{source}: {problem}; delete the partition file and create it again with "
                "`fedfactor partition`"
            )

        named = [(f"client {k}'s {s}", c[s]) for k, c in enumerate(self.clients) for s in SPLITS]
        named += [(f"the pooled {s}", pool) for s, pool in self.pools.items()]
        for what, idx in named:
            bad = idx[(idx < 0) | (idx >= n)]
            if bad.size:
                fail(
                    f"{what} split holds the index {bad[0]}, outside 0..{n - 1} "
                    f"(the dataset has N={n} samples)"
                )
            values, counts = np.unique(idx, return_counts=True)
            if (counts > 1).any():
                # a repeated index weighs its sample twice (train) or scores it twice (test)
                fail(
                    f"{what} split holds the index {values[counts.argmax()]} {counts.max()} times; "
                    "an index may appear once per split"
                )

        for k, c in enumerate(self.clients):
            for a, b in (("train", "test"), ("train", "val"), ("val", "test")):
                shared = np.intersect1d(c[a], c[b])
                if shared.size:
                    fail(
                        f"client {k}'s {a} and {b} splits share {shared.size} indices "
                        f"(e.g. {shared[0]}); a sample scored on must never be trained on"
                    )
        train, owner = self._stacked("train")
        for s, pool in self.pools.items():
            in_pool = np.zeros(n, dtype=bool)
            in_pool[pool] = True
            leaked = in_pool[train]
            if leaked.any():
                k = owner[leaked.argmax()]
                fail(
                    f"client {k}'s train split shares {in_pool[self.clients[k]['train']].sum()} "
                    f"indices with the pooled {s} split, on which every client is scored"
                )
        empty = [k for k, c in enumerate(self.clients) if len(c["train"]) == 0]
        if empty:
            fail(f"client {empty[0]} has an empty train split")

        n_orig = int(y.max()) + 1 if n else 0
        rows, columns = label_maps.shape if label_maps.ndim == 2 else (-1, -1)
        if rows != self.num_clients or columns < n_orig:
            fail(
                f"label_maps has shape {list(label_maps.shape)}, but it needs one row per client "
                f"({self.num_clients}) and a column for each of the dataset's {n_orig} classes"
            )
        bad = np.argwhere((label_maps < -1) | (label_maps >= self.num_classes))
        if bad.size:
            k, c = bad[0]
            fail(
                f"client {k}'s label map sends class {c} to {label_maps[k, c]}; a target must be "
                f"0..{self.num_classes - 1}, or -1 for a class outside the client's task"
            )
        # two classes on one model output could never be told apart
        ordered = np.sort(label_maps, axis=1)
        twice = np.argwhere((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0))
        if twice.size:
            k, j = twice[0]
            fail(f"client {k}'s label map sends more than one class to target {ordered[k, j]}")
        # the model has one output per class of the largest task; more would never be trained
        largest = int((label_maps >= 0).sum(axis=1).max())
        if largest != self.num_classes:
            fail(
                f"num_classes is {self.num_classes} but the largest client task has {largest} "
                "classes; they must be equal"
            )
        _check_outputs(self.num_classes, source)

        for s in SPLITS:
            idx, owner = self._stacked(s)
            outside = label_maps[owner, y[idx]] < 0
            if outside.any():
                i = outside.argmax()
                k = owner[i]
                fail(
                    f"client {k}'s {s} split holds {outside[owner == k].sum()} samples outside "
                    f"its task (e.g. index {idx[i]} of class {y[idx[i]]}, which its label map "
                    "sends to -1)"
                )

    def _stacked(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Every client's `split` indices in one array, and the client each one belongs to."""
        parts = [c[split] for c in self.clients]
        owner = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        return np.concatenate([np.empty(0, np.int64), *parts]), owner

    def targets(self, y: np.ndarray, client: int, split: str) -> np.ndarray:
        """The model targets of one client's split: its label map applied to the original labels."""
        return self.label_maps[client][np.asarray(y)[self.clients[client][split]]]

    def shared_split(self, y: np.ndarray, client: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(indices, targets) of the pooled `split` samples inside the client's task.

        Factorized-FL and SimFed score every client on the pooled split, restricted to the classes
        its label map covers (all of them, except in a domain scenario) and relabelled through it.
        """
        if split not in self.pools:
            raise UsageError(
                f"the shared split must be one of {', '.join(POOLED_SPLITS)} (got {split!r})"
            )
        idx = self.pools[split]
        labels = self.label_maps[client][np.asarray(y)[idx]]
        inside = labels >= 0
        return idx[inside], labels[inside]

    def histograms(self, y: np.ndarray) -> dict[str, list[list[int]]]:
        n_orig = int(self.label_maps.shape[1])
        y = np.asarray(y)
        return {
            s: [np.bincount(y[c[s]], minlength=n_orig).astype(int).tolist() for c in self.clients]
            for s in SPLITS
        }

    def to_json(self, y: np.ndarray) -> str:
        self.check_labels(y)
        doc = {
            "format_version": FORMAT_VERSION,
            "num_clients": int(self.num_clients),
            "num_classes": int(self.num_classes),
            "clients": [{s: c[s].astype(int).tolist() for s in SPLITS} for c in self.clients],
            "label_maps": self.label_maps.astype(int).tolist(),
            "pools": {s: p.astype(int).tolist() for s, p in self.pools.items()},
            "meta": self.meta,
            "histograms": self.histograms(y),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)

    def save(self, path: str | os.PathLike, y: np.ndarray) -> None:
        """Write JSON atomically, so a crashed or concurrent run never leaves half a file."""
        atomic_write_text(path, self.to_json(y))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Partition:
        regular_file(path, "partition file", "; create it first")
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
            return cls._from_doc(doc)
        # ValueError covers bad JSON and bad UTF-8 too; OverflowError is an int beyond int64;
        # RecursionError: arrays nested 10**5 deep
        except (OSError, ValueError, OverflowError, KeyError, TypeError, AttributeError, RecursionError) as e:
            reason = " ".join(str(e).split()) or type(e).__name__  # the message must stay on one line
            raise UsageError(
                f"partition file {str(path)!r} is not a valid partition file ({reason}); "
                "delete it and create it again"
            ) from None

    @classmethod
    def _from_doc(cls, doc: dict) -> Partition:
        if doc["format_version"] != FORMAT_VERSION:
            raise ValueError(
                f"format_version {doc['format_version']!r}, this version of fedfactor reads "
                f"{FORMAT_VERSION}"
            )
        num_clients, num_classes = doc["num_clients"], doc["num_classes"]
        if not (_is_int(num_clients) and _is_int(num_classes)) or min(num_clients, num_classes) < 1:
            raise ValueError("num_clients and num_classes must be integers >= 1")
        label_maps = _int_array(doc["label_maps"], 2, "label_maps must be lists of integers")
        clients = [{s: _index_list(c[s]) for s in SPLITS} for c in doc["clients"]]
        if len(clients) != num_clients or len(label_maps) != num_clients:
            raise ValueError("client lists do not match num_clients")
        if not isinstance(doc["pools"], dict) or set(doc["pools"]) != set(POOLED_SPLITS):
            raise ValueError(f"pools must have exactly the keys {', '.join(POOLED_SPLITS)}")
        pools = {s: _index_list(doc["pools"][s]) for s in POOLED_SPLITS}
        if not isinstance(doc["meta"], dict):
            raise ValueError("meta must be an object")
        return cls(num_clients, num_classes, clients, label_maps, pools, doc["meta"])


def _int_array(values: Any, ndim: int, problem: str) -> np.ndarray:
    # np.asarray(..., dtype=int64) would silently turn 1.5 and true into 1 and "3" into 3, so every
    # parsed JSON value must itself be an int (bool is a subclass of int, hence `type(v) is int`)
    array = np.asarray(values, dtype=object)
    if array.ndim != ndim or not all(type(v) is int for v in array.flat):
        raise ValueError(problem)
    return array.astype(np.int64)  # an int beyond int64 raises OverflowError


def _index_list(values: Any) -> np.ndarray:
    return _int_array(values, 1, "indices must be flat lists of integers")


# --------------------------------------------------------------------------------------------
# What a kind sees and returns


@dataclass
class _Task:
    y: np.ndarray
    splits: dict[str, np.ndarray]
    num_classes: int
    num_clients: int
    spec: dict[str, Any]
    seed: int
    owners: np.ndarray | None = None  # int64 [N]: each sample's natural client, where the data have them
    # class_pools[split][c]: sorted indices of class c in that split
    class_pools: dict[str, list[np.ndarray]] = field(init=False)

    def __post_init__(self) -> None:
        self.class_pools = {}
        for s in SPLITS:
            idx = self.splits[s]
            by_label = idx[np.argsort(self.y[idx], kind="stable")]
            bounds = np.searchsorted(self.y[by_label], np.arange(self.num_classes + 1))
            self.class_pools[s] = [
                by_label[bounds[c] : bounds[c + 1]] for c in range(self.num_classes)
            ]

    def class_counts(self, split: str) -> np.ndarray:
        return np.array([len(p) for p in self.class_pools[split]], dtype=np.int64)


@dataclass
class _Layout:
    clients: list[dict[str, np.ndarray]]
    meta: dict[str, Any]
    pools: dict[str, np.ndarray] | None = None  # None: the pooled val and test splits as given


PARTITIONS: Registry[Callable[[_Task], _Layout]] = Registry("partition")


def _boundaries(share_column: np.ndarray, n: int) -> np.ndarray:
    """Cut points 0 = b_0 <= ... <= b_K = n for one class of one split."""
    cuts = np.clip(np.rint(np.cumsum(share_column) * n), 0, n).astype(np.int64)
    cuts[-1] = n  # float error must never drop the last samples
    return np.concatenate([[0], cuts])


def _train_counts(task: _Task, shares: np.ndarray) -> np.ndarray:
    """Per-client train sizes that `_cut_by_shares` will produce, without drawing anything."""
    counts = np.zeros(task.num_clients, dtype=np.int64)
    for c, n in enumerate(task.class_counts("train")):
        if shares[:, c].sum() > 0:
            counts += np.diff(_boundaries(shares[:, c], int(n)))
    return counts


def _cut_by_shares(task: _Task, shares: np.ndarray) -> list[dict[str, np.ndarray]]:
    clients: list[dict[str, np.ndarray]] = [{} for _ in range(task.num_clients)]
    for split_no, split in enumerate(SPLITS):
        rng = _rng(task.seed, _STREAM_CUT, split_no)
        parts: list[list[np.ndarray]] = [[] for _ in range(task.num_clients)]
        for c in range(task.num_classes):
            if shares[:, c].sum() == 0:  # no client uses this class
                continue
            pool = rng.permutation(task.class_pools[split][c])
            cuts = _boundaries(shares[:, c], len(pool))
            for k in range(task.num_clients):
                parts[k].append(pool[cuts[k] : cuts[k + 1]])
        for k in range(task.num_clients):
            clients[k][split] = _sorted_union(parts[k])
    return clients


def _sorted_union(chunks: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate([np.empty(0, np.int64), *chunks]))


# --------------------------------------------------------------------------------------------
# Kinds


@PARTITIONS.register("iid", "every class spread evenly over all clients")
def _iid(task: _Task) -> _Layout:
    shares = np.full((task.num_clients, task.num_classes), 1.0 / task.num_clients)
    return _Layout(_cut_by_shares(task, shares), {})


@PARTITIONS.register(
    "dirichlet", "Hsu et al. label skew: each class split over clients by Dir(alpha)"
)
def _dirichlet(task: _Task) -> _Layout:
    alpha, need = task.spec["alpha"], task.spec["min_train_samples"]
    rng = _rng(task.seed, _STREAM_SHARES)
    tries = 1000
    for _ in range(tries):
        shares = rng.dirichlet(np.full(task.num_clients, alpha), size=task.num_classes).T
        # tiny alpha can underflow to an all-zero (NaN) column; treat it as a failed draw
        if np.all(np.isfinite(shares)) and _train_counts(task, shares).min() >= need:
            meta = {"alpha": alpha, "min_train_samples": need}
            return _Layout(_cut_by_shares(task, shares), meta)
    raise UsageError(
        f"dirichlet partition: no draw in {tries} tries gave every client at least {need} train "
        "samples; raise alpha, lower min_train_samples or use fewer clients"
    )


@PARTITIONS.register(
    "shards", "McMahan pathological: each client gets classes_per_client label-sorted shards"
)
def _shards(task: _Task) -> _Layout:
    per_client = task.spec["classes_per_client"]
    if not 1 <= per_client <= task.num_classes:
        raise UsageError(
            f"classes_per_client must be between 1 and {task.num_classes} (got {per_client})"
        )
    n_train = len(task.splits["train"])
    n_shards = task.num_clients * per_client
    if n_shards > n_train:
        raise UsageError(
            f"shards: {n_shards} shards (num_clients x classes_per_client) but only {n_train} "
            "train samples; use fewer clients or classes_per_client"
        )
    sorted_labels = np.sort(task.y[task.splits["train"]])
    shards = np.array_split(sorted_labels, n_shards)  # sizes differ by at most one
    owner = _rng(task.seed, _STREAM_SHARES).permutation(n_shards).reshape(task.num_clients, -1)
    held = np.stack(
        [
            np.bincount(np.concatenate([shards[s] for s in owner[k]]), minlength=task.num_classes)
            for k in range(task.num_clients)
        ]
    )
    totals = task.class_counts("train")
    shares = np.divide(held, totals, out=np.zeros(held.shape), where=totals > 0)
    return _Layout(_cut_by_shares(task, shares), {"classes_per_client": per_client})


def _resolve_groups(
    spec: dict[str, Any], num_classes: int, num_clients: int
) -> tuple[list[list[int]], list[str], int, str | None]:
    """(groups, group names, clients per group, preset name or None), all checked."""
    groups_spec, per_group = spec["groups"], spec["clients_per_group"]
    preset: str | None = None
    if isinstance(groups_spec, str):
        if groups_spec not in GROUP_PRESETS:
            raise UsageError(
                f"unknown class-group preset {groups_spec!r}; choose one of: "
                f"{', '.join(sorted(GROUP_PRESETS))}, or give a list of lists of classes"
            )
        preset = groups_spec
        named, preset_per_group = GROUP_PRESETS[preset]
        names = [n for n, _ in named]
        groups = [list(g) for _, g in named]
        per_group = preset_per_group if per_group is None else per_group
    elif groups_spec and all(groups_spec):  # PartitionConfig has made it a list of int lists
        groups = [list(g) for g in groups_spec]
        names = [f"group_{i}" for i in range(len(groups))]
        if per_group is None:  # infer it when the client count allows only one answer
            per_group = max(1, num_clients // len(groups))
    else:
        raise UsageError(f"class_groups needs groups: {_GROUPS_HINT}")

    seen: set[int] = set()
    for g in groups:
        missing = [c for c in g if not 0 <= c < num_classes]
        if missing:
            raise UsageError(
                f"class group {g} names classes {missing} that do not exist; "
                f"classes are 0..{num_classes - 1}"
            )
        overlap = seen.intersection(g) | {c for c in g if g.count(c) > 1}
        if overlap:
            raise UsageError(f"class groups must be disjoint; classes {sorted(overlap)} repeat")
        seen.update(g)
    if num_clients != len(groups) * per_group:
        raise UsageError(
            f"class_groups with {len(groups)} groups x {per_group} clients_per_group needs "
            f"num_clients = {len(groups) * per_group} (got {num_clients})"
        )
    return groups, names, per_group, preset


@PARTITIONS.register(
    "class_groups", "domains: clients_per_group clients per disjoint class group (preset or list)"
)
def _class_groups(task: _Task) -> _Layout:
    groups, names, per_group, preset = _resolve_groups(
        task.spec, task.num_classes, task.num_clients
    )
    shares = np.zeros((task.num_clients, task.num_classes))
    for k in range(task.num_clients):
        shares[k, groups[k // per_group]] = 1.0 / per_group
    meta = {
        "groups": groups,
        "group_names": names,
        "clients_per_group": per_group,
        "client_group": [k // per_group for k in range(task.num_clients)],
    }
    if preset is not None:
        meta["groups_preset"] = preset
    return _Layout(_cut_by_shares(task, shares), meta)


def _capped_counts(
    rng: np.random.Generator, n: int, mix: np.ndarray, room: np.ndarray
) -> np.ndarray:
    """Multinomial(n, mix) class counts, none above its room (the caller ensures sum(room) >= n).

    What a full class cannot give is redrawn among the classes with room left, in proportion to
    the mix, or to the room where the mix puts nothing on them (tiny alpha gives exact zeros).
    Every redraw fills a class or ends the loop, so it runs at most once per class.
    """
    counts = np.zeros(len(mix), dtype=np.int64)
    while (short := n - counts.sum()) > 0:
        weights = np.where(counts < room, mix, 0.0)
        if weights.sum() == 0:
            weights = room - counts
        counts = np.minimum(counts + rng.multinomial(short, weights / weights.sum()), room)
    return counts


@PARTITIONS.register(
    "dirichlet_fixed",
    "FedDecomp: Dir(alpha) class mix per client, samples_per_client per split (overlap: shared)",
)
def _dirichlet_fixed(task: _Task) -> _Layout:
    """FedDecomp's official sampler: every client draws its own samples of every split.

    With `overlap` (the official code) a client draws from the whole class pools, without
    replacement but independently of the other clients, so clients may share samples; without it
    a client draws from what the previous clients left. A client's splits never share a sample,
    because the pooled splits are disjoint.
    """
    alpha, sizes, overlap = (task.spec[k] for k in ("alpha", "samples_per_client", "overlap"))
    mixes = _rng(task.seed, _STREAM_SHARES).dirichlet(
        np.full(task.num_classes, alpha), size=task.num_clients
    )
    clients: list[dict[str, np.ndarray]] = [{} for _ in range(task.num_clients)]
    for split_no, split in enumerate(SPLITS):
        n, have = sizes[split], len(task.splits[split])
        needed = n if overlap else n * task.num_clients
        if needed > have:
            who = "per client" if overlap else f"({n} x {task.num_clients} disjoint clients)"
            raise UsageError(
                f"dirichlet_fixed needs {needed} {split} samples {who} but the {split} split has "
                f"{have}; lower samples_per_client"
            )
        rng = _rng(task.seed, _STREAM_FIXED, split_no)
        pools = task.class_pools[split]
        if not overlap:  # shuffled once, so taking from the front is drawing without replacement
            pools = [rng.permutation(p) for p in pools]
        taken = np.zeros(task.num_classes, dtype=np.int64)  # stays zero with overlap
        for k, mix in enumerate(mixes):
            counts = _capped_counts(rng, n, mix, task.class_counts(split) - taken)
            if overlap:
                chunks = [rng.choice(pool, m, replace=False) for pool, m in zip(pools, counts)]
            else:
                chunks = [pool[t : t + m] for pool, t, m in zip(pools, taken, counts)]
                taken += counts
            clients[k][split] = _sorted_union(chunks)
    meta = {"alpha": alpha, "samples_per_client": sizes, "overlap": overlap}
    return _Layout(clients, meta)


@PARTITIONS.register(
    "natural", "the data's own clients (writers, speaking roles): fl.clients of them, sampled, each its own samples"
)
def _natural(task: _Task) -> _Layout:
    """fl.clients natural clients, drawn without replacement (seeded) from those with at least
    min_train_samples train samples and a test sample; a client's splits are its samples in the
    given splits (`make_splits` with owners cuts each client's samples on their own). The pooled val
    and test splits are the union of the drawn clients' own, so every sample scored belongs to a
    client that takes part.
    """
    if task.owners is None:
        raise UsageError("partition kind 'natural' needs data whose samples come from natural clients (femnist, "
                         "shakespeare or their synthetic: stand-ins); this dataset has none")
    need = task.spec["min_train_samples"]
    n_owners = int(task.owners.max()) + 1 if len(task.owners) else 0
    by_split = {}
    for s in SPLITS:
        idx = task.splits[s]
        order = np.argsort(task.owners[idx], kind="stable")  # idx is sorted, so each client's stays sorted
        bounds = np.searchsorted(task.owners[idx][order], np.arange(n_owners + 1))
        by_split[s] = (idx[order], bounds)
    counts = {s: np.diff(bounds) for s, (_, bounds) in by_split.items()}
    eligible = np.flatnonzero((counts["train"] >= need) & (counts["test"] >= 1))
    if task.num_clients > len(eligible):
        raise UsageError(
            f"natural: {task.num_clients} clients asked for, but only {len(eligible)} of the data's {n_owners} "
            f"natural clients have {need}+ train samples and a test sample; use at most {len(eligible)} clients"
        )
    chosen = np.sort(_rng(task.seed, _STREAM_SHARES).choice(eligible, size=task.num_clients, replace=False))
    clients = [
        {s: idx[bounds[o] : bounds[o + 1]].astype(np.int64) for s, (idx, bounds) in by_split.items()}
        for o in chosen
    ]
    pools = {s: _sorted_union([c[s] for c in clients]) for s in POOLED_SPLITS}
    meta = {"natural_clients": chosen.tolist(), "eligible_clients": int(len(eligible)), "min_train_samples": need}
    return _Layout(clients, meta, pools)


# --------------------------------------------------------------------------------------------
# Spec checking, label maps and the entry point


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct: json keeps the last of two silently."""
    doc = dict(pairs)
    if len(doc) < len(pairs):
        raise ValueError(f"key {next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))!r} appears twice")
    return doc


def _resolve_spec(spec: Any) -> dict[str, Any]:
    """The spec completed and checked by PartitionConfig, the one source of defaults and ranges."""
    if not isinstance(spec, dict):
        raise UsageError(
            "partition spec must be a mapping with a kind and its options "
            f"(got {type(spec).__name__})"
        )
    # PartitionConfig falls back on iid, but a spec handed to make_partition without a kind is
    # more likely a mistake than a wish for iid
    if spec.get("kind") is None:
        raise UsageError(
            f"partition spec needs a kind; choose one of: {', '.join(PARTITIONS.names())}"
        )
    try:
        resolved = PartitionConfig.model_validate(spec).model_dump(exclude={"file"})
    except ValidationError as err:
        raise UsageError(validation_message(err, prefix="partition.")) from None
    if spec.get("file") is not None:
        raise UsageError(
            "partition.file names a saved partition (Partition.load reads it); "
            "a spec to build one must leave it out"
        )
    PARTITIONS.get(resolved["kind"])  # unknown kind -> UsageError naming the choices
    # checked under every kind: a setting the kind does not read must still not be nonsense
    if isinstance(resolved["groups"], str) and resolved["groups"] not in GROUP_PRESETS:
        raise UsageError(f"partition.groups: unknown class-group preset {resolved['groups']!r}; {_GROUPS_HINT}")
    return resolved


def _check_counts(num_classes: Any, num_clients: Any) -> None:
    if not _is_int(num_clients) or num_clients < 1:
        raise UsageError(f"num_clients must be an integer >= 1 (got {num_clients!r})")
    if not _is_int(num_classes) or num_classes < 1:
        raise UsageError(f"num_classes must be an integer >= 1 (got {num_classes!r})")


def _check_inputs(
    y: np.ndarray, splits: dict[str, np.ndarray], num_classes: int, num_clients: int, seed: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    _check_counts(num_classes, num_clients)
    if not _is_int(seed) or seed < 0:
        raise UsageError(f"seed must be an integer >= 0 (got {seed!r})")
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise UsageError("labels y must be a 1-D integer array")
    y = y.astype(np.int64)
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise UsageError(f"labels must lie in 0..{num_classes - 1} (num_classes={num_classes})")
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        raise UsageError(f"splits must have exactly the keys {', '.join(SPLITS)}")
    out = {}
    for s in SPLITS:
        idx = np.asarray(splits[s])
        if idx.ndim != 1 or (len(idx) and not np.issubdtype(idx.dtype, np.integer)):
            raise UsageError(f"split {s!r} must be a 1-D integer index array")
        idx = np.sort(idx.astype(np.int64))
        if len(idx) and (idx[0] < 0 or idx[-1] >= len(y) or np.any(np.diff(idx) == 0)):
            raise UsageError(
                f"split {s!r} holds repeated indices or indices outside 0..{len(y) - 1}"
            )
        out[s] = idx
    if len(np.unique(np.concatenate(list(out.values())))) != sum(map(len, out.values())):
        raise UsageError("the train, val and test splits overlap; they must be disjoint")
    if num_clients > len(out["train"]):
        raise UsageError(
            f"{num_clients} clients but only {len(out['train'])} train samples; use fewer clients"
        )
    return y, out


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


def make_partition(
    y: np.ndarray,
    splits: dict[str, np.ndarray],
    num_classes: int,
    num_clients: int,
    spec: dict,
    seed: int,
    owners: np.ndarray | None = None,
) -> Partition:
    """Partition (y, splits) over num_clients clients as `spec` says; deterministic in `seed`.

    `owners` (int [N]) names each sample's natural client; the kind `natural` needs it, the others
    ignore it.
    """
    y, splits = _check_inputs(y, splits, num_classes, num_clients, seed)
    resolved = _resolve_spec(spec)
    label_maps, num_outputs = _label_maps(resolved, num_classes, num_clients)
    owners = None if owners is None else check_owners(owners, len(y))
    task = _Task(y, splits, int(num_classes), int(num_clients), resolved, int(seed), owners)
    layout = PARTITIONS.get(resolved["kind"])(task)

    sizes = [len(c["train"]) for c in layout.clients]
    if min(sizes) == 0:
        empty = [k for k, n in enumerate(sizes) if n == 0]
        raise UsageError(
            f"clients {empty[:10]} got no train samples; "
            "use fewer clients or a less skewed partition"
        )
    meta: dict[str, Any] = {"kind": resolved["kind"], **layout.meta}
    if resolved["permute_labels"]:
        meta["permutation_seed"] = resolved["permutation_seed"]
    meta.update(
        permute_labels=resolved["permute_labels"],
        seed=int(seed),
        num_original_classes=int(num_classes),
        labels_sha1=labels_sha1(y),
    )
    pools = layout.pools if layout.pools is not None else {s: splits[s] for s in POOLED_SPLITS}
    return Partition(task.num_clients, num_outputs, layout.clients, label_maps, pools, meta)
