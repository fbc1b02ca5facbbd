"""The clients' data: the partition a config describes, each client's splits under the evaluation
protocol (eval.test_pool), and what the partition decides about the clients (local heads, domains,
the clients held out of training).
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import Config
from ..data import Partition, load_dataset, make_partition, make_splits
from ..data.partition_kinds import SPLITS
from ..errors import UsageError
from ..fl.train import Split, derive_seed


def build_partition(cfg: Config, y: np.ndarray, n_official_train: int, num_classes: int,
                    owners: np.ndarray | None = None) -> Partition:
    """The partition a config describes: the train/val/test cut of the pooled data, then per-client shares.

    The cut follows data.seed alone, the shares the run seed: every run of a study (its tuning runs
    too) scores the same test samples and trains on none of them. `owners` is each sample's natural
    client (Dataset.owners). Under the kind `natural` each natural client's samples are split on their
    own (data.split per client), as FedFac splits every client's data.
    """
    own = owners if cfg.partition.kind == "natural" else None
    splits = make_splits(len(y), n_official_train, cfg.data.split, cfg.data.split_mode, seed=cfg.data.seed,
                         owners=own)
    partition = make_partition(y, splits, num_classes, cfg.fl.clients, cfg.partition.spec(), seed=cfg.seed,
                               owners=owners)
    partition.meta["data_seed"] = cfg.data.seed  # the cut's seed, which a run reading the file must share
    return partition


def head_is_local(head: str, label_maps: np.ndarray) -> bool:
    """A shared head needs every client to map classes to outputs the same way.

    Decided from the partition actually used (its label maps), so a partition file with permuted
    labels or class groups makes heads local even when the config's own fields do not say so.
    """
    if head != "auto":
        return head == "local"
    return bool((label_maps != label_maps[0]).any())


def client_domains(label_maps: np.ndarray) -> list[int]:
    """A domain id per client: clients whose tasks cover the same original classes share one."""
    tasks = [tuple(np.flatnonzero(np.asarray(row) >= 0)) for row in label_maps]
    ids = {t: i for i, t in enumerate(dict.fromkeys(tasks))}
    return [ids[t] for t in tasks]


def held_out_clients(K: int, share: float, seed: int) -> list[int]:
    """The clients held out of training, `share` of the K (eval.new_clients), drawn from the run's seed:
    never sampled, scored only as new clients."""
    held = int(round(share * K))
    if held >= K:
        raise UsageError(f"eval.new_clients={share} holds out all {K} clients; lower it")
    rng = np.random.default_rng(derive_seed(seed, 2**31 + 2))
    return sorted(rng.choice(K, size=held, replace=False).tolist()) if held else []


def read_partition(file: str, clients: int, data_seed: int) -> Partition:
    """The run's partition file (partition.file), refused unless it was made for its `clients`
    (fl.clients) from the cut of its `data_seed` (data.seed)."""
    part = Partition.load(file)
    if part.num_clients != clients:
        raise UsageError(f"partition {file} has {part.num_clients} clients but fl.clients is {clients}")
    cut = part.meta.get("data_seed")
    if cut is not None and cut != data_seed:
        # another cut's test samples may be this run's train samples
        raise UsageError(f"partition {file} was cut with data.seed={cut}, but the run has "
                         f"data.seed={data_seed}; make the partition again with the run's data.seed")
    return part


def load_clients(cfg: Config, num_classes: int,
                 device: torch.device) -> tuple[Partition, torch.Tensor, list[dict[str, Split]]]:
    """The dataset on the device, the partition, and every client's splits under the protocol:
    (the partition, the dataset's inputs, each client's splits by name)."""
    ds = load_dataset(cfg.data.name, cfg.data.root, download=cfg.data.download, device=device)
    y = ds.y.cpu().numpy()
    if cfg.partition.file:
        partition = read_partition(cfg.partition.file, cfg.fl.clients, cfg.data.seed)
        partition.check_labels(y, str(cfg.partition.file))
        partition.validate(y, str(cfg.partition.file))
    else:
        partition = build_partition(cfg, y, ds.n_official_train, num_classes, ds.owners)
    # Beside the protocol's splits, "own_val": the client's own validation cut under every test
    # pool, what a method weighs or picks models on (FedFomo); under the shared pool "val" is the
    # pooled split the protocol scores with, one set for all clients of a task.
    shared = cfg.eval.test_pool == "shared"
    clients = [{s: client_split(partition, y, k, s, shared, device) for s in (*SPLITS, "own_val")}
               for k in range(cfg.fl.clients)]
    empty = [k for k, c in enumerate(clients) if len(c["test"]) == 0]
    if empty:
        # Scoring such a client 0 (or leaving it out) would bias every mean silently.
        raise UsageError(f"client {empty[0]} ({len(empty)} of {cfg.fl.clients} in all) has no test samples under "
                         f"eval.test_pool={cfg.eval.test_pool}; give the test split a larger share "
                         "(data.split, partition.samples_per_client.test) or use fewer clients")
    if cfg.eval.report == "best_val" and not any(len(c["val"]) for c in clients):
        raise UsageError("eval.report best_val needs validation data, but every client's val split is empty; "
                         "give data.split (or partition.samples_per_client.val) a val share, or report last/best")
    return partition, ds.x, clients


def client_split(partition: Partition, y: np.ndarray, k: int, name: str, shared: bool, device: torch.device) -> Split:
    """Client k's split: its own cut, or for val/test under the shared pool the pooled split
    restricted to its task's classes, always in the client's own labels; "own_val" is its own
    val cut under either pool."""
    if name in ("val", "test") and shared:
        idx, targets = partition.shared_split(y, k, name)
    else:
        cut = "val" if name == "own_val" else name
        idx, targets = partition.clients[k][cut], partition.targets(y, k, cut)
    as_tensor = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.long, device=device)  # noqa: E731
    return Split(as_tensor(idx), as_tensor(targets))
