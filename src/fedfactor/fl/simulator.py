"""The one round loop.

Every method runs through `Simulator.run`; only this loop moves state between clients and the
server, and it passes every payload through the communication meter.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from ..config import Config
from ..devices import resolve_device
from ..data import Partition, dataset_info, load_dataset, make_partition, make_splits
from ..data.augment import AUGMENT_KINDS
from ..data.partition import model_classes
from ..errors import UsageError
from ..methods import METHODS, Context
from ..models import build_model
from .comm import CommMeter
from .state import State, clone
from .train import SGDConfig, Split, evaluate, fit


def derive_seed(*parts: int) -> int:
    """An independent seed per (run seed, round, client): results do not depend on client order."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def build_partition(cfg: Config, y: np.ndarray, n_official_train: int, num_classes: int) -> Partition:
    """The partition a config describes: seeded split of the pooled data, then per-client shares."""
    splits = make_splits(len(y), n_official_train, cfg.data.split, cfg.data.split_mode, seed=cfg.seed)
    return make_partition(y, splits, num_classes, cfg.fl.clients, cfg.partition.spec(), seed=cfg.seed)


def head_is_local(cfg: Config) -> bool:
    if cfg.fl.head != "auto":
        return cfg.fl.head == "local"
    return bool(cfg.partition.permute_labels) or cfg.partition.kind == "class_groups"


@dataclass
class EvalRow:
    round: int
    accuracy_mean: float
    accuracy_std: float
    accuracy_weighted: float
    test_loss: float
    train_loss: float
    bytes_up: int
    bytes_down: int
    bytes_up_round: int
    bytes_down_round: int
    elapsed_seconds: float
    per_client_accuracy: list[float] = field(repr=False, default_factory=list)


class Simulator:
    """K clients with persistent state, a server, and one method plugged in.

    dry_run=True builds everything on the meta device, with no data: the loop runs its downloads,
    uploads and aggregations on shapes alone, so `fedfactor cost` measures through this same code.
    """

    def __init__(self, cfg: Config, dry_run: bool = False):
        self.cfg = cfg
        self.dry_run = dry_run
        self.device = torch.device("meta") if dry_run else resolve_device(cfg.fl.device)
        info = dataset_info(cfg.data.name, cfg.data.root)
        K = cfg.fl.clients
        self.head_local = head_is_local(cfg)
        # Cheap checks first: a typo should not wait for a dataset to load.
        method_cls = METHODS.get(cfg.method["name"])
        self.augment = info.augment if cfg.data.augment == "auto" else cfg.data.augment
        if self.augment not in AUGMENT_KINDS:
            raise UsageError(f"data.augment {self.augment!r} is unknown; choose auto, {', '.join(AUGMENT_KINDS)}")
        self.partition: Partition | None = None
        self.clients: list[dict[str, Split]] = []
        if dry_run:
            num_classes = model_classes(info.num_classes, cfg.partition.spec(), K)
            train_sizes = [1] * K
        else:
            self._load_clients(info.num_classes)
            num_classes = self.partition.num_classes
            train_sizes = [len(c["train"]) for c in self.clients]

        torch.manual_seed(cfg.seed)
        with self.device:
            self.model = build_model(cfg.model.name, info.channels, info.height, info.width, num_classes)
        init = clone(self.model.state_dict())
        self.params_total = sum(p.numel() for p in self.model.parameters())
        float_keys = [k for k, v in init.items() if v.is_floating_point()]
        head = getattr(self.model, "head_name", "head") + "."
        self.ctx = Context(
            model=self.model,
            num_clients=K,
            train_sizes=train_sizes,
            float_keys=float_keys,
            head_keys=[k for k in float_keys if k.startswith(head)],
            head_local=self.head_local,
            epochs=cfg.fl.epochs,
            train=self._train,
        )
        params = {k: v for k, v in cfg.method.items() if k != "name"}
        self.method = method_cls(self.ctx, **params)
        self.states: list[State] = [clone(init) for _ in range(K)]
        self.server = self.method.init_server(init)
        self.meter = CommMeter()
        self.sgd = SGDConfig(cfg.fl.lr, cfg.fl.momentum, cfg.fl.weight_decay, cfg.fl.batch_size)
        self._round = 0

    def _load_clients(self, num_classes: int) -> None:
        """The dataset on the device, the partition, and every client's splits with its own labels."""
        cfg = self.cfg
        ds = load_dataset(cfg.data.name, cfg.data.root, download=cfg.data.download, device=self.device)
        y = ds.y.cpu().numpy()
        if cfg.partition.file:
            self.partition = Partition.load(cfg.partition.file)
            self.partition.check_labels(y)
            if self.partition.num_clients != cfg.fl.clients:
                raise UsageError(f"partition {cfg.partition.file} has {self.partition.num_clients} clients "
                                 f"but fl.clients is {cfg.fl.clients}")
        else:
            self.partition = build_partition(cfg, y, ds.n_official_train, num_classes)
        self.x = ds.x
        self.clients = [self._client_splits(ds.y, k) for k in range(cfg.fl.clients)]

    def _client_splits(self, y: torch.Tensor, k: int) -> dict[str, Split]:
        lmap = torch.as_tensor(self.partition.label_maps[k], device=self.device)
        out = {}
        for name, idx in self.partition.clients[k].items():
            idx_t = torch.as_tensor(idx, dtype=torch.long, device=self.device)
            out[name] = Split(idx_t, lmap[y[idx_t]])
        return out

    def _train(self, k: int, params, epochs: int, loss_term=None) -> float:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(derive_seed(self.cfg.seed, self._round, k))
        return fit(self.model, params, self.x, self.clients[k]["train"], epochs, self.sgd, self.augment, gen, loss_term)

    def sample(self, rnd: int) -> list[int]:
        K = self.cfg.fl.clients
        m = max(1, int(round(self.cfg.fl.fraction * K)))
        rng = np.random.default_rng(derive_seed(self.cfg.seed, rnd, 2**31))
        return sorted(rng.choice(K, size=m, replace=False).tolist())

    def run_round(self, rnd: int) -> float:
        """One round: sampled clients download, train and upload; the server aggregates."""
        self._round = rnd
        uploads: dict[int, State] = {}
        losses = []
        for k in self.sample(rnd):
            payload = self.meter.download(self.method.download(self.server, k))
            self.states[k] = self.method.receive(k, self.states[k], payload)
            if not self.dry_run:
                self.model.load_state_dict(self.states[k])
                losses.append(self.method.local_train(k, payload))
                self.states[k] = clone(self.model.state_dict())
            uploads[k] = self.meter.upload(self.method.upload(k, self.states[k]))
        weights = {k: float(self.ctx.train_sizes[k]) for k in uploads}
        self.server = self.method.aggregate(self.server, uploads, weights)
        self.meter.end_round()
        return float(np.nanmean(losses)) if losses and not np.all(np.isnan(losses)) else float("nan")

    def evaluate(self, split: str = "test") -> tuple[np.ndarray, np.ndarray, float]:
        """Every client's personalised model on its own split: (correct, count, summed loss) per client."""
        correct, count, loss = [], [], 0.0
        for k in range(self.cfg.fl.clients):
            self.model.load_state_dict(self.method.evaluation_state(self.server, k, self.states[k]))
            c, n, l = evaluate(self.model, self.x, self.clients[k][split])
            correct.append(c)
            count.append(n)
            loss += l
        return np.array(correct), np.array(count), loss

    def run(self, on_eval: Callable[[EvalRow], None] | None = None) -> list[EvalRow]:
        if self.dry_run:
            for rnd in range(1, self.cfg.fl.rounds + 1):
                self.run_round(rnd)
            return []
        rows: list[EvalRow] = []
        start = time.perf_counter()
        R = self.cfg.fl.rounds
        bar = tqdm(range(1, R + 1), desc=f"{self.cfg.method['name']}", unit="round",
                   disable=not sys.stderr.isatty(), leave=False)
        for rnd in bar:
            train_loss = self.run_round(rnd)
            if rnd % self.cfg.fl.eval_every and rnd != R:
                continue
            correct, count, loss = self.evaluate()
            acc = np.divide(correct, count, out=np.zeros(len(count)), where=count > 0)
            up, down = self.meter.history[-1]
            row = EvalRow(
                round=rnd,
                accuracy_mean=float(acc.mean()),
                accuracy_std=float(acc.std()),
                accuracy_weighted=float(correct.sum() / max(count.sum(), 1)),
                test_loss=loss / max(count.sum(), 1),
                train_loss=train_loss,
                bytes_up=self.meter.up,
                bytes_down=self.meter.down,
                bytes_up_round=up,
                bytes_down_round=down,
                elapsed_seconds=time.perf_counter() - start,
                per_client_accuracy=acc.tolist(),
            )
            rows.append(row)
            bar.set_postfix(acc=f"{row.accuracy_mean:.3f}")
            if on_eval is not None:
                on_eval(row)
        return rows
