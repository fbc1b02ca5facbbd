"""Split a pooled labelled dataset into per-client train/val/test sets.

Every client gets its own train, val and test indices drawn from the same class mix, so each
personalised model is evaluated on its own task, plus a label map (original class -> the client's
model target), which is how permuted-label and domain scenarios are expressed.

Most kinds are defined by a share matrix P [K, C] (P[k, c] = share of class c that client k gets);
`_cut_by_shares` then cuts every split of every class at the same boundaries, so the clients are
disjoint and together cover every sample of every class some client uses. `dirichlet_fixed`
(FedDecomp) instead draws a fixed number of samples per client and split.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import UsageError
from ..io import atomic_write_text
from ..registry import Registry

SPLITS = ("train", "val", "test")
FORMAT_VERSION = 1

DEFAULT_SPEC: dict[str, Any] = {
    "kind": None,
    "alpha": 0.5,
    "classes_per_client": 2,
    "groups": None,
    "clients_per_group": None,
    "samples_per_client": {"train": 500, "val": 0, "test": 100},
    "min_train_samples": 1,
    "permute_labels": False,
    "permutation_seed": 1234,
}

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
    num_classes: int
    clients: list[dict[str, np.ndarray]]
    label_maps: np.ndarray
    meta: dict = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        return (
            self.num_clients == other.num_clients
            and self.num_classes == other.num_classes
            and self.meta == other.meta
            and np.array_equal(self.label_maps, other.label_maps)
            and all(
                np.array_equal(a[s], b[s])
                for a, b in zip(self.clients, other.clients, strict=True)
                for s in SPLITS
            )
        )

    def check_labels(self, y: np.ndarray) -> None:
        """Refuse labels other than the ones this partition was made from."""
        if labels_sha1(y) != self.meta.get("labels_sha1"):
            raise UsageError(
                "the labels do not match the ones this partition was made from "
                "(labels_sha1 differs); rebuild the partition for this dataset"
            )

    def targets(self, y: np.ndarray, client: int, split: str) -> np.ndarray:
        """The model targets of one client's split: its label map applied to the original labels."""
        return self.label_maps[client][np.asarray(y)[self.clients[client][split]]]

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
            "meta": self.meta,
            "histograms": self.histograms(y),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)

    def save(self, path: str | os.PathLike, y: np.ndarray) -> None:
        """Write JSON atomically, so a crashed or concurrent run never leaves half a file."""
        atomic_write_text(path, self.to_json(y))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Partition:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls._from_doc(doc)
        except FileNotFoundError:
            raise UsageError(
                f"partition file {str(path)!r} does not exist; create it first"
            ) from None
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            reason = " ".join(str(e).split())  # the message must stay on one line
            raise UsageError(
                f"partition file {str(path)!r} is not a valid partition file ({reason}); "
                "delete it and create it again"
            ) from None

    @classmethod
    def _from_doc(cls, doc: dict) -> Partition:
        if doc["format_version"] != FORMAT_VERSION:
            raise ValueError(f"format_version {doc['format_version']!r}, expected {FORMAT_VERSION}")
        num_clients, num_classes = doc["num_clients"], doc["num_classes"]
        label_maps = np.asarray(doc["label_maps"], dtype=np.int64)
        clients = [{s: np.asarray(c[s], dtype=np.int64) for s in SPLITS} for c in doc["clients"]]
        if not isinstance(num_clients, int) or not isinstance(num_classes, int):
            raise ValueError("num_clients and num_classes must be integers")
        if len(clients) != num_clients or label_maps.ndim != 2 or len(label_maps) != num_clients:
            raise ValueError("client lists do not match num_clients")
        if any(c[s].ndim != 1 for c in clients for s in SPLITS):
            raise ValueError("client indices must be flat lists")
        if not isinstance(doc["meta"], dict):
            raise ValueError("meta must be an object")
        return cls(num_clients, num_classes, clients, label_maps, doc["meta"])


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
    # pools[split][c]: sorted indices of class c in that split
    pools: dict[str, list[np.ndarray]] = field(init=False)

    def __post_init__(self) -> None:
        self.pools = {}
        for s in SPLITS:
            idx = self.splits[s]
            by_label = idx[np.argsort(self.y[idx], kind="stable")]
            bounds = np.searchsorted(self.y[by_label], np.arange(self.num_classes + 1))
            self.pools[s] = [by_label[bounds[c] : bounds[c + 1]] for c in range(self.num_classes)]

    def class_counts(self, split: str) -> np.ndarray:
        return np.array([len(p) for p in self.pools[split]], dtype=np.int64)


@dataclass
class _Layout:
    clients: list[dict[str, np.ndarray]]
    num_outputs: int
    label_maps: np.ndarray  # before any permutation
    meta: dict[str, Any]


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
            pool = rng.permutation(task.pools[split][c])
            cuts = _boundaries(shares[:, c], len(pool))
            for k in range(task.num_clients):
                parts[k].append(pool[cuts[k] : cuts[k + 1]])
        for k in range(task.num_clients):
            clients[k][split] = np.sort(np.concatenate([np.empty(0, np.int64), *parts[k]]))
    return clients


def _layout_from_shares(
    task: _Task,
    shares: np.ndarray,
    meta: dict[str, Any],
    num_outputs: int | None = None,
    labels: np.ndarray | None = None,
) -> _Layout:
    """Cut the data by `shares`.

    A client's label map is the identity (or `labels`) for the classes it has a share of and -1
    for the classes it can never see.
    """
    if labels is None:
        labels = np.broadcast_to(np.arange(task.num_classes), shares.shape)
    label_maps = np.where(shares > 0, labels, -1).astype(np.int64)
    num_outputs = task.num_classes if num_outputs is None else num_outputs
    return _Layout(_cut_by_shares(task, shares), num_outputs, label_maps, meta)


# --------------------------------------------------------------------------------------------
# Kinds


@PARTITIONS.register("iid", "every class spread evenly over all clients")
def _iid(task: _Task) -> _Layout:
    shares = np.full((task.num_clients, task.num_classes), 1.0 / task.num_clients)
    return _layout_from_shares(task, shares, {})


def _check_alpha(alpha: float) -> None:
    if not alpha > 0:
        raise UsageError(f"partition alpha must be > 0 (got {alpha}); e.g. 0.1, 0.5 or 1.0")


@PARTITIONS.register(
    "dirichlet", "Hsu et al. label skew: each class split over clients by Dir(alpha)"
)
def _dirichlet(task: _Task) -> _Layout:
    alpha, need = task.spec["alpha"], task.spec["min_train_samples"]
    _check_alpha(alpha)
    rng = _rng(task.seed, _STREAM_SHARES)
    tries = 1000
    for _ in range(tries):
        shares = rng.dirichlet(np.full(task.num_clients, alpha), size=task.num_classes).T
        # tiny alpha can underflow to an all-zero (NaN) column; treat it as a failed draw
        if np.all(np.isfinite(shares)) and _train_counts(task, shares).min() >= need:
            return _layout_from_shares(task, shares, {"alpha": alpha, "min_train_samples": need})
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
    return _layout_from_shares(task, shares, {"classes_per_client": per_client})


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
    elif isinstance(groups_spec, (list, tuple)) and groups_spec and all(
        isinstance(g, (list, tuple)) and g and all(_is_int(c) for c in g) for g in groups_spec
    ):
        groups = [[int(c) for c in g] for g in groups_spec]
        names = [f"group_{i}" for i in range(len(groups))]
        if per_group is None:  # infer it when the client count allows only one answer
            per_group = max(1, num_clients // len(groups))
    else:
        raise UsageError(
            f"class_groups needs groups: a preset name ({', '.join(sorted(GROUP_PRESETS))}) "
            "or a non-empty list of non-empty lists of classes"
        )

    if not _is_int(per_group) or per_group < 1:
        raise UsageError(f"clients_per_group must be an integer >= 1 (got {per_group!r})")
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
    return groups, names, int(per_group), preset


@PARTITIONS.register(
    "class_groups", "domains: clients_per_group clients per disjoint class group (preset or list)"
)
def _class_groups(task: _Task) -> _Layout:
    groups, names, per_group, preset = _resolve_groups(task.spec, task.num_classes, task.num_clients)
    shares = np.zeros((task.num_clients, task.num_classes))
    labels = np.full((task.num_clients, task.num_classes), -1, dtype=np.int64)
    for k in range(task.num_clients):
        group = sorted(groups[k // per_group])
        shares[k, group] = 1.0 / per_group
        # the paper labels each domain's classes in sorted order (supplement Table 3)
        labels[k, group] = np.arange(len(group))
    meta = {
        "groups": groups,
        "group_names": names,
        "clients_per_group": per_group,
        "client_group": [k // per_group for k in range(task.num_clients)],
    }
    if preset is not None:
        meta["groups_preset"] = preset
    return _layout_from_shares(task, shares, meta, max(map(len, groups)), labels)


@PARTITIONS.register(
    "dirichlet_fixed", "FedDecomp: Dir(alpha) class mix per client, samples_per_client per split"
)
def _dirichlet_fixed(task: _Task) -> _Layout:
    alpha, sizes = task.spec["alpha"], task.spec["samples_per_client"]
    _check_alpha(alpha)
    if sizes["train"] < 1:
        raise UsageError("dirichlet_fixed: samples_per_client['train'] must be >= 1 (got 0)")
    for split in SPLITS:
        needed, have = sizes[split] * task.num_clients, len(task.splits[split])
        if needed > have:
            raise UsageError(
                f"dirichlet_fixed needs {needed} {split} samples ({sizes[split]} x "
                f"{task.num_clients} clients) but the split has {have}; lower samples_per_client"
            )
    rng = _rng(task.seed, _STREAM_FIXED)
    # every pool is shuffled once; taking from its front is drawing without replacement
    pools = {s: [rng.permutation(p) for p in task.pools[s]] for s in SPLITS}
    taken = {s: np.zeros(task.num_classes, dtype=np.int64) for s in SPLITS}
    mixes = rng.dirichlet(np.full(task.num_classes, alpha), size=task.num_clients)
    clients = []
    for k, mix in enumerate(mixes):
        if not np.all(np.isfinite(mix)):
            raise UsageError(f"alpha={alpha} is too small to draw a class mix; use a larger alpha")
        client = {}
        for split in SPLITS:
            counts = rng.multinomial(sizes[split], mix / mix.sum())
            chunks = []
            for c in np.flatnonzero(counts):
                start, stop = taken[split][c], taken[split][c] + counts[c]
                if stop > len(pools[split][c]):
                    raise UsageError(
                        f"dirichlet_fixed ran out of {split} samples of class {c} at client {k}; "
                        "use fewer samples_per_client or fewer clients"
                    )
                chunks.append(pools[split][c][start:stop])
                taken[split][c] = stop
            client[split] = np.sort(np.concatenate([np.empty(0, np.int64), *chunks]))
        clients.append(client)
    label_maps = np.where(mixes > 0, np.arange(task.num_classes), -1).astype(np.int64)
    meta = {"alpha": alpha, "samples_per_client": dict(sizes)}
    return _Layout(clients, task.num_classes, label_maps, meta)


# --------------------------------------------------------------------------------------------
# Spec checking, permutation and the entry point


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _resolve_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise UsageError(f"partition spec must be a mapping with keys: {', '.join(DEFAULT_SPEC)}")
    unknown = sorted(set(spec) - set(DEFAULT_SPEC), key=str)
    if unknown:
        raise UsageError(
            f"unknown partition key(s) {', '.join(map(repr, unknown))}; "
            f"valid keys: {', '.join(DEFAULT_SPEC)}"
        )
    out = {**DEFAULT_SPEC, **spec}
    if out["kind"] is None:
        raise UsageError(
            f"partition spec needs a kind; choose one of: {', '.join(PARTITIONS.names())}"
        )
    PARTITIONS.get(out["kind"])  # unknown kind -> UsageError naming the choices

    alpha = out["alpha"]
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or not np.isfinite(alpha):
        raise UsageError(f"partition alpha must be a finite number (got {alpha!r})")
    out["alpha"] = float(alpha)
    for key in ("classes_per_client", "min_train_samples", "permutation_seed"):
        if not _is_int(out[key]):
            raise UsageError(f"partition {key} must be an integer (got {out[key]!r})")
        out[key] = int(out[key])
    if out["min_train_samples"] < 1:
        raise UsageError(f"min_train_samples must be >= 1 (got {out['min_train_samples']})")
    if not isinstance(out["permute_labels"], bool):
        raise UsageError(f"permute_labels must be true or false (got {out['permute_labels']!r})")
    out["samples_per_client"] = _resolve_sizes(out["samples_per_client"])
    return out


def _resolve_sizes(sizes: Any) -> dict[str, int]:
    if not isinstance(sizes, dict) or set(sizes) - set(SPLITS):
        raise UsageError(
            f"samples_per_client must map some of {', '.join(SPLITS)} to sample counts "
            f"(got {sizes!r})"
        )
    out = {**DEFAULT_SPEC["samples_per_client"], **sizes}
    for split, n in out.items():
        if not _is_int(n) or n < 0:
            raise UsageError(f"samples_per_client[{split!r}] must be an integer >= 0 (got {n!r})")
    return {s: int(out[s]) for s in SPLITS}


def _check_inputs(
    y: np.ndarray, splits: dict[str, np.ndarray], num_classes: int, num_clients: int, seed: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    if not _is_int(num_clients) or num_clients < 1:
        raise UsageError(f"num_clients must be an integer >= 1 (got {num_clients!r})")
    if not _is_int(num_classes) or num_classes < 1:
        raise UsageError(f"num_classes must be an integer >= 1 (got {num_classes!r})")
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


def make_partition(
    y: np.ndarray,
    splits: dict[str, np.ndarray],
    num_classes: int,
    num_clients: int,
    spec: dict,
    seed: int,
) -> Partition:
    """Partition (y, splits) over num_clients clients as `spec` says; deterministic in `seed`."""
    y, splits = _check_inputs(y, splits, num_classes, num_clients, seed)
    resolved = _resolve_spec(spec)
    task = _Task(y, splits, int(num_classes), int(num_clients), resolved, int(seed))
    layout = PARTITIONS.get(resolved["kind"])(task)

    sizes = [len(c["train"]) for c in layout.clients]
    if min(sizes) == 0:
        empty = [k for k, n in enumerate(sizes) if n == 0]
        raise UsageError(
            f"clients {empty[:10]} got no train samples; "
            "use fewer clients or a less skewed partition"
        )
    label_maps = layout.label_maps
    meta: dict[str, Any] = {"kind": resolved["kind"], **layout.meta}
    if resolved["permute_labels"]:
        label_maps = _permute(label_maps, layout.num_outputs, resolved["permutation_seed"])
        meta["permutation_seed"] = resolved["permutation_seed"]
    meta.update(
        permute_labels=resolved["permute_labels"],
        seed=int(seed),
        num_original_classes=int(num_classes),
        labels_sha1=labels_sha1(y),
    )
    return Partition(task.num_clients, layout.num_outputs, layout.clients, label_maps, meta)


def model_classes(num_classes: int, spec: dict[str, Any], num_clients: int) -> int:
    """The number of model outputs a partition spec implies, without any data (`fedfactor cost`)."""
    spec = _resolve_spec(spec)
    if spec["kind"] != "class_groups":
        return num_classes
    groups, _, _, _ = _resolve_groups(spec, num_classes, num_clients)
    return max(map(len, groups))
