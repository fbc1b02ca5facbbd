"""The partition kinds: how each cuts the clients' train/val/test indices out of the pooled splits.

Most kinds are defined by a share matrix P [K, C] (P[k, c] = share of class c that client k gets);
`_cut_by_shares` then cuts every split of every class at the same boundaries, so the clients are
disjoint and together cover every sample of every class some client uses. `dirichlet_fixed`
(FedDecomp) instead draws a fixed number of samples per client and split, by default independently
of the other clients, as FedDecomp's code does. `natural` takes the clients the data come with
(FEMNIST's writers, Shakespeare's speaking roles), each with its own samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import UsageError
from ..registry import Registry
from .partition_groups import _resolve_groups

SPLITS = ("train", "val", "test")
POOLED_SPLITS = ("val", "test")  # the pooled splits a partition keeps for shared evaluation

# Independent random streams per purpose, so e.g. the share draw does not depend on split sizes.
_STREAM_SHARES, _STREAM_CUT, _STREAM_FIXED = 0, 1, 2


def _rng(seed: int, *tags: int) -> np.random.Generator:
    return np.random.default_rng([seed, *tags])


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
