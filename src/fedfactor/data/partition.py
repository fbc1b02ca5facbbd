"""A pooled labelled dataset split into per-client train/val/test sets: the Partition, its file, and
`make_partition`, which builds one.

Every client gets its own train, val and test indices drawn from the same class mix, so each
personalised model is evaluated on its own task, plus a label map (original class -> the client's
model target), which is how permuted-label and domain scenarios are expressed. The label maps
describe each client's task and follow from the spec alone (`task_label_maps`,
`partition_labels.py`); the partition also keeps the pooled val and test splits, on which
Factorized-FL and SimFed score every client. The kinds that cut the clients are in
`partition_kinds.py`, the checks of what `make_partition` is given in `partition_inputs.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn

import numpy as np

from ..config import regular_file
from ..errors import UsageError
from ..io import atomic_write_text
from .base import check_owners
from .partition_inputs import _check_inputs, _is_int, _resolve_spec
from .partition_kinds import PARTITIONS, POOLED_SPLITS, SPLITS, _Task
from .partition_labels import _check_outputs, _label_maps

FORMAT_VERSION = 2


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

        self._check_indices(n, fail)
        self._check_splits_apart(n, fail)
        empty = [k for k, c in enumerate(self.clients) if len(c["train"]) == 0]
        if empty:
            fail(f"client {empty[0]} has an empty train split")
        self._check_label_maps(y, label_maps, fail)
        _check_outputs(self.num_classes, source)
        self._check_tasks(y, label_maps, fail)

    def _check_indices(self, n: int, fail: Callable[[str], NoReturn]) -> None:
        """Every index of every split (the clients' and the pooled ones) in 0..n-1, and once only."""
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

    def _check_splits_apart(self, n: int, fail: Callable[[str], NoReturn]) -> None:
        """A client's splits share no sample, and no train split holds a sample of a pooled split."""
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

    def _check_label_maps(self, y: np.ndarray, label_maps: np.ndarray, fail: Callable[[str], NoReturn]) -> None:
        """A row per client and a column per class, each target an output or -1, no two classes on
        one output, and as many outputs as the largest task has classes."""
        n = len(y)
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

    def _check_tasks(self, y: np.ndarray, label_maps: np.ndarray, fail: Callable[[str], NoReturn]) -> None:
        """Every sample of a client's splits inside its task: its label map sends no such class to -1."""
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
        atomic_write_text(Path(path), self.to_json(y))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Partition:
        regular_file(Path(path), "partition file", "; create it first")
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


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct: json keeps the last of two silently."""
    doc = dict(pairs)
    if len(doc) < len(pairs):
        raise ValueError(f"key {next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))!r} appears twice")
    return doc


# --------------------------------------------------------------------------------------------
# The entry point


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
