"""The one round loop.

Every method runs through `Simulator.run`; only this loop moves state between clients and the
server, and it passes every payload through the communication meter. The evaluation protocol
(`eval` section: which test pool, which model, which number is reported) is applied here, the same
way for every method, so no method can score itself differently. The clients' data comes from
clients.py; what each round records, from records.py.
"""

from __future__ import annotations

import contextlib
import functools
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from .clients import client_domains, head_is_local, held_out_clients, load_clients, read_partition
from ..config import Config
from ..data import DatasetInfo, Partition, dataset_info
from ..data.augment import AUGMENT_KINDS
from ..data.partition_labels import task_label_maps
from ..devices import available_memory, memory_bytes, resolve_device
from ..errors import Interrupted, RunFailed, UsageError
from ..fl.batched import BatchedTrainer, batchable
from ..fl.comm import CommMeter
from ..fl.state import State, WeightedSum, clone
from ..fl.store import ClientStates, choose, move
from ..fl.train import Batch, Diverged, Optim, Phase, Split, Trainer, TrainLoss, derive_seed
from ..methods import Context, build
from ..methods.base import Method, refuse_recurrent
from ..models import build_model, resolve_layers
from ..models.layers import layer_entries
from .records import RESERVED, RESERVED_PREFIX, RoundRecord, Scores, round_loss


class Simulator:
    """K clients with persistent state, a server, and one method plugged in.

    dry_run=True builds everything on the meta device, with no data: the loop runs its downloads,
    uploads and aggregations on shapes alone, so `fedfactor cost` measures through this same code.
    A dry run refuses a method whose payloads' sizes depend on trained values, unless
    `largest_payloads` (`fedfactor plan`, which sizes memory and takes such payloads at their largest).
    """

    def __init__(self, cfg: Config, dry_run: bool = False, largest_payloads: bool = False,
                 states_folder: Path | None = None, method: Method | None = None):
        """`method`: the one a job set up from `cfg.method` (run.setup); built here when not given."""
        self.cfg = cfg
        self.dry_run = dry_run
        device = resolve_device(cfg.fl.device, available=not dry_run)
        self.device = torch.device("meta") if dry_run else device
        info = dataset_info(cfg.data.name, cfg.data.root)
        K = cfg.fl.clients
        # Cheap checks first: a typo should not wait for a dataset to load.
        if method is not None and hasattr(method, "ctx"):  # bound: it holds another run's state
            raise ValueError(f"method {cfg.method['name']!r} already served a run: set the run up again (run.setup)")
        self.method = build(cfg.method) if method is None else method
        if dry_run and self.method.payload_depends_on_values and not largest_payloads:
            raise UsageError(f"method {cfg.method['name']!r} sends payloads whose size depends on trained values; "
                             "`fedfactor cost` cannot project it from shapes: run `fedfactor train` and read "
                             "bytes_total from its summary.json")
        self.augment = info.augment if cfg.data.augment == "auto" else cfg.data.augment
        if self.augment not in AUGMENT_KINDS:
            raise UsageError(f"data.augment {self.augment!r} is unknown; choose auto, {', '.join(AUGMENT_KINDS)}")
        if info.input == "tokens" and self.augment != "none":  # cropping token ids would garble the text
            raise UsageError(f"data.augment {self.augment!r} does not apply to {info.name}'s token inputs; use auto "
                             "or none")
        self.partition: Partition | None = None
        self.clients: list[dict[str, Split]] = []
        self.x = torch.empty(0, device=self.device)
        label_maps, num_classes, train_sizes = self._set_up_clients(info.num_classes)
        self.head_local = head_is_local(cfg.fl.head, label_maps)

        torch.manual_seed(cfg.seed)
        init = self._build_model(info, num_classes)
        fl = cfg.fl
        optim = Optim(fl.optimizer, fl.lr, fl.momentum, fl.weight_decay)
        self._build_trainers(optim)
        self.ctx = self._context(info, train_sizes, label_maps, optim)
        self.method.bind(self.ctx)
        # after bind: a method may size a layer only once it knows the input (pFedGate's gate)
        self.params_total = sum(p.numel() for p in self.model.parameters())
        self.init = init
        self.newcomers = held_out_clients(cfg.fl.clients, cfg.eval.new_clients, cfg.seed)
        self.members = [k for k in range(K) if k not in set(self.newcomers)]
        # A trained client keeps only what is its own when nothing reads the rest again: scored with
        # the received model, every entry the method's receive overwrites whole (replaced_on_receive)
        # is replaced before the client's state is trained or scored again. The clients whose final
        # weights the diagnostics keep (diagnostics.weights.save_client_weights) keep the entries of those layers. A
        # dry run trims too, so that `fedfactor plan` counts what a real run holds.
        self._trim = cfg.eval.model == "received"
        where = "device" if dry_run else self._client_store(states_folder)
        self.states = ClientStates([self.method.init_client(k, init) for k in range(K)], where, self.device,
                                   states_folder)
        self.server = self.method.init_server(init)
        # With the base aggregate, each upload is added to the weighted sum as it arrives: together
        # with the trimming, a round no longer holds every sampled client's model until it ends.
        self._stream = type(self.method).aggregate is Method.aggregate
        self._kept_for_diagnostics: dict[int, set[str]] = {}
        if cfg.diagnostics.keep_weights:  # an unknown layer is refused here, before the run's folder exists
            self.diagnostic_layers()
        if self._trim and cfg.diagnostics.keep_weights:
            # the entries each analysed layer's weight is computed from (u, v, mu of a factorized layer)
            keys = {key for name in self.diagnostic_layers().values() for key in layer_entries(self.model, name)}
            self._kept_for_diagnostics = dict.fromkeys(self.diagnosed_clients(), keys)
        self.meter = CommMeter()
        self.round = 0  # the last completed round: what a checkpoint holds
        self.records: list[RoundRecord] = []
        # Set (from a signal handler) to the number of a stop signal; the loop stops at the next
        # training step with the last completed round intact.
        self.stop_signal: int | None = None
        # True while a phase runs that a stop signal ends at once (job.stop_signals raises Interrupted
        # from its handler): a round's training and aggregation, the scoring, the new clients' scoring.
        # Their work is discarded on a stop; the commits and writes between them run outside, and a
        # signal that arrives during one ends the next phase at its start.
        self.stoppable = False
        # The round whose training is committed and whose scores are not yet recorded: a checkpoint
        # written then would resume that round's states as the round before's, so none is.
        self.scoring_round: int | None = None
        self._generators: dict[int, torch.Generator] = {}
        self._training = False  # inside a method's local_train: its batches stop on a stop signal
        self._scalars: dict[str, float] = {}
        self._arrays: dict[str, np.ndarray] = {}

    # -- set-up --------------------------------------------------------------------------------
    def _set_up_clients(self, num_classes: int) -> tuple[np.ndarray, int, list[int]]:
        """The partition and every client's splits; a dry run reads only the partition file, if any,
        and holds no data. Returns (label maps, number of outputs, train sizes)."""
        cfg, K = self.cfg, self.cfg.fl.clients
        if self.dry_run:
            if cfg.partition.file:
                self.partition = read_partition(cfg.partition.file, cfg.fl.clients, cfg.data.seed)
                label_maps, num_classes = self.partition.label_maps, self.partition.num_classes
            else:
                label_maps, num_classes = task_label_maps(cfg.partition.spec(), num_classes, K)
            return label_maps, num_classes, [1] * K
        self.partition, self.x, self.clients = load_clients(cfg, num_classes, self.device)
        return self.partition.label_maps, self.partition.num_classes, [len(c["train"]) for c in self.clients]

    def _build_model(self, info: DatasetInfo, num_classes: int) -> State:
        """The one model all clients share, as the method prepares it; returns its initial weights."""
        with self.device:
            # A dry run (`fedfactor cost`) needs shapes only: no weights file, no download.
            model = build_model(self.cfg.model.name, info.channels, info.height, info.width, num_classes,
                                pretrained=self.cfg.model.pretrained and not self.dry_run,
                                width_multiplier=self.cfg.model.width_multiplier)
            refuse_recurrent(self.method, model)
            self.model = self.method.prepare_model(model)
        return clone(self.model.state_dict())

    def _build_trainers(self, optim: Optim) -> None:
        fl = self.cfg.fl
        self.trainer = Trainer(self.model, self.x, fl.batch_size, self.augment, optim, fl.max_loss, fl.precision,
                               fl.channels_last)
        self.trainer.check_interrupt = self._check_interrupt
        # Methods with their own training loop (local_train overridden) train one client at a time.
        own_loop = type(self.method).local_train is not Method.local_train
        self.batched = (BatchedTrainer(self.trainer)
                        if not self.dry_run and not own_loop and batchable(self.model, self.device, fl.batch_clients)
                        else None)

    def _context(self, info: DatasetInfo, train_sizes: list[int], label_maps: np.ndarray, optim: Optim) -> Context:
        """What the method is told about the run, and the client-side services it calls."""
        head = getattr(self.model, "head_name", "head") + "."
        params = [k for k, _ in self.model.named_parameters()]
        buffers = [k for k, b in self.model.named_buffers() if b.is_floating_point()]
        return Context(
            model=self.model,
            num_clients=self.cfg.fl.clients,
            train_sizes=train_sizes,
            param_keys=params,
            buffer_keys=buffers,
            head_keys=[k for k in [*params, *buffers] if k.startswith(head)],
            head_local=self.head_local,
            epochs=self.cfg.fl.epochs,
            optim=optim,
            max_loss=self.cfg.fl.max_loss,
            skip_single=self.trainer.skip_single,
            fit=self._fit,
            evaluate=lambda k, state, split: self.trainer.evaluate(state, self.clients[k][split]),
            split=lambda k, name: self.clients[k][name],
            batches=self._batches,
            log=self._log,
            input_shape=(info.channels, info.height, info.width),
            seed=self.cfg.seed,
            domains=client_domains(label_maps),
        )

    def dropped_when_trained(self) -> set[str]:
        """The entries a trained client lets go of (`_trim`): what its method's receive overwrites."""
        return self.method.replaced_on_receive() if self._trim else set()

    def _client_store(self, folder: Path | None) -> str:
        """Where the clients' states wait (store.client_states; `auto` chooses by their size), refused
        when they cannot fit there: the model once, and for every client that can train in the run's
        rounds (a client holds a state of its own only once trained) what it keeps of its own (all of
        the model unless a trained client drops what receive overwrites; the fewest bytes a method
        holds: the real need is higher)."""
        def bytes_of(keys: Iterable[str]) -> int:
            return sum(self.init[k].numel() * self.init[k].element_size() for k in keys)

        model = bytes_of(self.init)
        own = bytes_of(set(self.init) - self.dropped_when_trained())
        K = min(len(self.members), self.cfg.fl.rounds * len(self.sample(0)))
        need, where = model + K * own, str(self.cfg.store.client_states)  # auto: resolved to one of the three
        on_gpu = self.device.type == "cuda"
        if where == "auto":
            where = choose(need, on_gpu, memory_bytes(self.device) if on_gpu else None, available_memory())
        if where == "disk":
            probe = folder if folder is not None else Path(tempfile.gettempdir())
            while not probe.exists():  # the run's folder is made after these checks
                probe = probe.parent
            have: int | None = shutil.disk_usage(probe).free
            kind = "free disk"
        else:
            device = self.device if where == "device" else torch.device("cpu")
            have, kind = memory_bytes(device), f"{device.type} memory"
        if have is not None and need > have:
            raise UsageError(f"{K:,} clients trained x {own / 2**20:,.1f} MiB of a {model / 2**20:,.1f} MiB model "
                             f"kept per client = {need / 2**30:,.1f} GiB of client states, more than the "
                             f"{have / 2**30:,.1f} GiB of {kind} here (store.client_states={where}); use fewer "
                             "clients or a smaller model, or another store (`fedfactor plan` gives a study's needs)")
        return where

    # -- services the method calls through its Context -----------------------------------------
    def _generator(self, k: int) -> torch.Generator:
        """One random stream per (seed, round, client), shared by every phase of that client's round."""
        if k not in self._generators:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(derive_seed(self.cfg.seed, self.ctx.round, k))
            self._generators[k] = gen
        return self._generators[k]

    def _fit(self, k: int, state: State, phases: Sequence[Phase]) -> tuple[State, float]:
        return self.trainer.fit(state, self.clients[k]["train"], phases, self._generator(k))

    def _batches(self, k: int, epochs: int | None = None, steps: int | None = None, split: str = "train",
                 seed: int | None = None) -> Iterator[Batch]:
        gen = self._generator(k)
        if seed is not None:  # a stream of its own, which no other draw of the round moves
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        batches = self.trainer.batches(self.clients[k][split], gen, epochs, steps)
        return self._training_batches(batches) if self._training else batches

    def _training_batches(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """What a method's own training loop gets, under Trainer's rules: it stops at the next batch
        after a stop signal (scoring, outside local training, never stops half-way), and a model
        with BatchNorm skips a batch of one sample."""
        for batch in batches:
            self._check_interrupt()
            if not (self.trainer.skip_single and len(batch.y) == 1):
                yield batch

    def _log(self, name: str, value: Any) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in RESERVED or name.startswith(RESERVED_PREFIX):
            raise ValueError(f"diagnostic name {name!r} must be [A-Za-z0-9_.-]+, not start with {RESERVED_PREFIX!r} "
                             f"and not be one of {sorted(RESERVED)}")
        if self.dry_run:
            return
        arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if arr.ndim == 0:
            self._scalars[name] = float(arr)
        else:
            self._arrays[name] = arr

    # -- the loop ------------------------------------------------------------------------------
    def sample(self, rnd: int) -> list[int]:
        K = len(self.members)
        m = max(1, int(round(self.cfg.fl.fraction * K)))
        rng = np.random.default_rng(derive_seed(self.cfg.seed, rnd, 2**31))
        return sorted(self.members[i] for i in rng.choice(K, size=m, replace=False).tolist())

    def _check_interrupt(self) -> None:
        if self.stop_signal is not None:
            raise Interrupted(self.stop_signal)

    @contextlib.contextmanager
    def stoppable_phase(self) -> Iterator[None]:
        """A phase a stop signal ends at once (`stoppable`), within seconds at paper scale, where a
        check at each training step alone left scoring 20 clients running for 45 s after SIGTERM."""
        self.stoppable = True
        try:
            self._check_interrupt()  # after the flag: a signal between the two still stops the phase
            yield
        finally:
            self.stoppable = False

    def _local_training(self, sampled: list[int]) -> Iterator[tuple[int, State, tuple[State, float] | Diverged | None]]:
        """Each sampled client's download, receive and local training, as (k, received state,
        (trained state, loss) | Diverged | None on a dry run), in client order.

        One by one, a client is downloaded to and trained before the next (one payload in memory at
        a time); batched, every client receives first and clients with equal plans train together.
        """
        received = {}
        for k in sampled:
            self._check_interrupt()
            payload = self.meter.download(self.method.download(self.server, k))
            state = self.method.receive(k, self.states[k], payload)
            if self.dry_run:
                yield k, state, None
            elif self.batched is None:
                yield k, state, self._train(k, state, payload)
            else:
                received[k] = (state, payload)
        if not received:
            return
        results = self._train_batched(received)
        for k, (state, _) in received.items():
            yield k, state, results[k]

    def _train(self, k: int, state: State, payload: State) -> tuple[State, float] | Diverged:
        self._training = True
        try:
            return self.method.local_train(k, state, payload)
        except Diverged as e:
            return e
        finally:
            self._training = False

    def _train_batched(self, received: dict[int, tuple[State, State]]) -> dict[int, tuple[State, float] | Diverged]:
        """Clients whose plans are equal train as one batch; a client with a plan of its own alone."""
        groups: list[tuple[list[Phase], list[int]]] = []
        plans = {}
        for k, (state, payload) in received.items():
            plan = plans[k] = self.method.plan(k, state, payload)
            for phases, members in groups:
                if phases == plan:
                    members.append(k)
                    break
            else:
                groups.append((plan, [k]))
        results = {}
        for phases, members in groups:
            if len(members) == 1 or not self._batch_pays(members):
                for k in members:
                    results[k] = self._train(k, *received[k])
                continue
            size = self.cfg.fl.batch_clients_max
            for chunk in (members[i : i + size] for i in range(0, len(members), size)):
                jobs = [(received[k][0], self.clients[k]["train"], self._generator(k), plans[k]) for k in chunk]
                assert self.batched is not None  # this runs only where the run has a batched trainer
                results.update(zip(chunk, self.batched.fit_many(jobs)))
        return results

    def _batch_pays(self, members: list[int]) -> bool:
        """Under `auto` on a CPU, a batch of clients whose sizes differ by more than a quarter trains
        one by one: the tail of steps that only the largest clients take costs more batched
        (BENCHMARKS.md, unequal sizes); on a GPU, or when batching is forced, it always batches."""
        if self.cfg.fl.batch_clients is True or self.device.type == "cuda":
            return True
        sizes = [len(self.clients[k]["train"]) for k in members]
        return max(sizes) <= 1.25 * min(sizes)

    def run_round(self, rnd: int) -> tuple[TrainLoss, list[int]]:
        """One round: sampled clients download, train and upload; the server aggregates.

        Nothing is committed until the round is complete: clients' new states, the server and the
        meter change together at the end, so an interrupted round leaves the previous one intact.
        Returns the mean training loss (round_loss) and the clients whose diverged update was skipped.
        """
        self.ctx.round = rnd
        self._generators, self._scalars, self._arrays = {}, {}, {}
        uploads: dict[int, State] = {}
        weights: dict[int, float] = {}
        total = WeightedSum()
        drop = self.dropped_when_trained()
        losses, skipped, trained = [], [], 0
        try:
            with self.stoppable_phase():
                for k, state, result in self._local_training(self.sample(rnd)):
                    if isinstance(result, Diverged):
                        if self.cfg.fl.on_divergence == "stop":
                            raise RunFailed(f"round {rnd}, client {k}: {result}; lower fl.lr, or set "
                                            "fl.on_divergence=skip to drop such updates and go on") from None
                        skipped.append(k)
                        continue
                    if result is not None:
                        state, loss = result
                        losses.append(loss)
                    upload = self.meter.upload(self.method.upload(k, state))
                    weights[k] = float(self.ctx.train_sizes[k])
                    if self._stream:
                        if upload:
                            total.add(upload, weights[k])
                    else:
                        uploads[k] = upload
                    gone = drop - self._kept_for_diagnostics.get(k, set())
                    self.states.stage(k, {key: t for key, t in state.items() if key not in gone} if gone else state)
                    trained += 1
                    # the next client trains without this one's state in memory, where a store holds it off the device
                    del state, result, upload
                if skipped and not trained:
                    # Nothing reached the server: the run would go on, and end "successfully", with the
                    # model it had; an untrained model's accuracy must not pass for a result.
                    raise RunFailed(f"round {rnd} kept no update: the training loss of every client it trained "
                                    f"({', '.join(map(str, skipped[:10]))}{', ...' if len(skipped) > 10 else ''}) "
                                    "diverged (fl.on_divergence=skip); lower fl.lr")
                server = (self.method.set_global(self.server, total) if self._stream
                          else self.method.aggregate(self.server, uploads, weights))
        except BaseException:
            self.meter.discard_round()
            self.states.discard()
            raise
        self.states.commit()
        self.server = server
        self.meter.end_round()
        return round_loss(losses), skipped

    def diagnostic_layers(self) -> dict[int, str]:
        """{paper index: module name} of the layers whose final client weights the diagnostics analyse:
        `diagnostics.layers`, else the method's choice."""
        layers = self.cfg.diagnostics.layers
        return resolve_layers(self.model, layers) if layers else self.method.analysed_layers()

    def diagnosed_clients(self) -> list[int]:
        """The clients whose final weights the diagnostics keep: those sampled in the last round first,
        at most `diagnostics.max_clients` (known from the start: sampling depends on the seed alone)."""
        last = self.sample(self.cfg.fl.rounds)
        return [*last, *(k for k in self.members if k not in last)][: self.cfg.diagnostics.max_clients]

    def scored_state(self, k: int) -> State:
        """The state client k is scored with under `eval.model`."""
        if self.cfg.eval.model == "trained":
            state = self.states[k]  # after its last local training; never-sampled clients: the initial model
        else:
            state = self.method.receive(k, self.states[k], self.method.download(self.server, k))
        return self.method.evaluation_state(k, state)

    def evaluate(self, splits: tuple[str, ...] = ("test",)) -> dict[str, Scores]:
        """Every client's scored model on each of `splits` as the protocol defines them.

        The scored state is built once per client and used for every split: a personalised
        download (similarity mixing) is not recomputed per split.
        """
        results: dict[str, tuple[list[int], list[int]]] = {s: ([], []) for s in splits}
        loss = dict.fromkeys(splits, 0.0)
        for k in self.members:
            state = self.scored_state(k)
            for s in splits:
                c, n, l = self.trainer.evaluate(state, self.clients[k][s])
                results[s][0].append(c)
                results[s][1].append(n)
                loss[s] += l
        return {s: Scores(np.array(c), np.array(n), loss[s]) for s, (c, n) in results.items()}

    def evaluate_new_clients(self) -> dict[str, Scores]:
        """The held-out clients' test scores under each of the method's strategies for new clients."""
        # As of the last completed round, also in a job resumed after it (random streams derive from it).
        self.ctx.round, self._generators = self.round, {}
        results: dict[str, tuple[list[int], list[int], float]] = {}
        members = functools.cache(lambda: [self.scored_state(j) for j in self.members])  # built once, if asked
        for k in self.newcomers:
            models = self.method.new_client_models(self.server, k, self.method.init_client(k, self.init), members)
            for name, model in models.items():
                split = self.clients[k]["test"]
                c, n, l = (self.trainer.evaluate_ensemble(model, split) if isinstance(model, list)
                           else self.trainer.evaluate(self.method.evaluation_state(k, model), split))
                correct, count, loss = results.get(name, ([], [], 0.0))
                results[name] = ([*correct, c], [*count, n], loss + l)
        return {name: Scores(np.array(c), np.array(n), l) for name, (c, n, l) in results.items()}

    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> list[RoundRecord]:
        R = self.cfg.fl.rounds
        if self.dry_run:
            try:
                for rnd in range(1, R + 1):
                    self.run_round(rnd)
            except NotImplementedError as e:  # an operation meta tensors cannot do: sizes depend on values
                raise UsageError(f"method {self.cfg.method['name']!r} cannot be costed from shapes alone "
                                 f"({str(e).splitlines()[0][:120]}); run `fedfactor train` and read bytes_total "
                                 "from its summary.json") from None
            return []
        has_val = any(len(c["val"]) for c in self.clients)
        # A resumed run goes on from its last completed round, its clock from that round's time.
        start = time.perf_counter() - (self.records[-1].elapsed_seconds if self.records else 0.0)
        bar = tqdm(range(self.round + 1, R + 1), desc=f"{self.cfg.method['name']}", unit="round",
                   initial=self.round, total=R, disable=not sys.stderr.isatty(), leave=False)
        for rnd in bar:
            loss, skipped = self.run_round(rnd)
            self.scoring_round = rnd
            scored = {}
            if rnd % self.cfg.fl.eval_every == 0 or rnd == R:
                with self.stoppable_phase():
                    scored = self.evaluate(("test", "val") if has_val else ("test",))
            test, val = scored.get("test"), scored.get("val")
            up, down = self.meter.history[-1]
            rec = RoundRecord(rnd, float(loss), self.meter.up, self.meter.down, up, down,
                              time.perf_counter() - start, test, val, dict(self._scalars), dict(self._arrays),
                              skipped, loss.terms)
            self.records.append(rec)
            self.round, self.scoring_round = rnd, None
            if test is not None:
                bar.set_postfix(acc=f"{test.mean:.3f}")
            if on_round is not None:
                on_round(rec)
        return self.records

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the next round depends on, as tensors, numbers and lists (weights_only-loadable).

        Per-round random streams are derived from (seed, round, client), so they need no saving; the
        global ones are saved for any code that draws from them.
        """
        if self.scoring_round is not None:
            raise RuntimeError(f"round {self.scoring_round} is trained and not yet scored: a checkpoint now "
                               f"would resume its states as round {self.round}'s")
        np_state = np.random.get_state(legacy=True)
        assert isinstance(np_state, tuple)  # legacy: the tuple numpy's set_state takes back
        return {
            "round": self.round,
            "states": self.states.as_list(),
            "server": self.server,
            "meter": self.meter.state_dict(),
            "records": [r.to_dict() for r in self.records],
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
                "python": random.getstate(),
            },
        }

    def load_state_dict(self, ckpt: dict[str, Any]) -> None:
        self.round = int(ckpt["round"])
        self.states.load(list(ckpt["states"]))
        self.server = move(ckpt["server"], self.device)  # read to the host where the states wait off the device
        self.meter.load_state_dict(ckpt["meter"])
        self.records = [RoundRecord.from_dict(r) for r in ckpt["records"]]
        rng = ckpt["rng"]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        name, key, *rest = rng["numpy"]
        np.random.set_state((name, key.numpy().astype(np.uint32), *rest))
        random.setstate(rng["python"])
