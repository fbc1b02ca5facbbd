"""`fedfactor plan`: what a study needs before it is launched (docs/plan.md).

Per study: its runs (final and tuning), their local steps, its datasets (download and disk), the
peak host and device memory of a run, a run's checkpoint, the disk its results keep, the time where
a benchmark has measured a step, and the runs that cannot fit the memory the profile requests.

Memory is measured, not written down by hand: each group of runs that share what sets their memory
(dataset, model, method and its settings, clients, batch size, ...) builds its simulator once on the
meta device (`Simulator(cfg, dry_run=True)`: shapes, no data), runs one dry round in which every
client trains, and counts the bytes of the tensors the clients and the server then hold, each tensor
once (clients share their initial tensors). One forward pass of a batch on the meta device, with
autograd's saved-tensor hooks counting what backward keeps, gives the activations of training.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from ..config import Config, FLConfig, read_mapping
from ..errors import UsageError
from ..data.facts import DatasetFacts, dataset_facts
from ..fl.store import choose
from ..run.setup import read_run
from .workflow import StudyRun
from .workflow import study_runs as workflow_study_runs

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
PROFILE = REPO / "profiles" / "slurm"

MiB = 2**20
GiB = 2**30

# Peak RSS of a training process whose model, data and states are negligible: `fedfactor train` of
# an MLP on digits, 2 clients, one round, tracked in MLflow as a study's runs are, in a fresh install
# as .ci/run makes it (BENCHMARKS.md, "A training process alone": 966 MiB; 815 in the development
# environment, whose torch maps 118 MiB less at import).
PROCESS_BYTES = 966 * MiB
# Scoring runs batches of this many samples without gradients (fl.train.Trainer.evaluate).
EVAL_BATCH = 1024

# Seconds of one local step on a GPU, by model, input shape (C, H, W) and batch size, measured by
# `python -m benchmarks gpu` (with where and when): a group with a row here has "measured" GPU hours,
# any other "estimated" ones (GPU_ESTIMATE). CPU hours are timed at plan time (StepCost).
STEP_SECONDS: dict[tuple[str, str, tuple[int, int, int], int], tuple[float, str]] = {}
DEVICES = ("cpu", "gpu")
# The GPU whose hours the plan estimates where no GPU step is measured: its name, FP32 peak FLOP/s, and
# the share of that peak a step is taken to reach. An estimate from FLOPs alone: small models, whose
# steps are bound by kernel launches, take longer than it says.
GPU_ESTIMATE = ("NVIDIA A100", 19.5e12, 0.3)
# A checkpoint's write, planned at the slowest rate measured on this project's machine (61 MB/s, 50 GiB
# VGG-16 states; 61-170 MB/s), must fit between SLURM's stop signal and its SIGKILL: the train rule's
# lead (`--signal=TERM@SECONDS` in its slurm_extra) plus KillWait (30 s, SLURM's default).
WRITE_BYTES_PER_SECOND = 60 * 10**6
KILL_WAIT_SECONDS = 30


# ------------------------------------------------------------------------------- a study's runs

def read_study(paths: Iterable[str | Path]) -> dict[str, Any]:
    """A study file, and files that override it, merged as Snakemake merges --configfile files, with
    the schema's defaults filled in (the workflow's checks of the files apply: workflow.py)."""
    from snakemake.utils import validate

    from .workflow import check_config_files, check_required_keys, check_study, deep_merge

    paths = [str(p) for p in paths]
    check_config_files(paths)
    config: dict[str, Any] = {}
    for path in paths:
        config = deep_merge(config, read_mapping(path))
    check_required_keys(config)
    try:
        validate(config, str(SCHEMA), set_default=True)
    except Exception as e:  # noqa: BLE001 - Snakemake's WorkflowError: the schema's message in one line
        from .workflow import schema_problem

        raise UsageError(f"{paths[0]}: {schema_problem(e)}") from None
    try:
        check_study(config)  # as the workflow's DAG build checks it: the same line for the same file
    except UsageError as e:
        raise UsageError(f"{', '.join(map(str, paths))}: {e}") from None
    return config


def study_runs(config: dict[str, Any]) -> list[StudyRun]:
    """Every run the study's workflow trains (workflow.study_runs), the final runs at the values chosen
    on validation where the study is tuned and they can be read, else at the study's own."""
    from . import tuning
    from .workflow import implemented, selected, tuning_file

    tuned: dict[str, dict[str, dict]] | None = None
    tune = config["tuning"] if tuning_file(config) and "simulation" not in config else None
    if tune:
        listed = implemented(config, selected(config, "methods"))
        try:
            tuned = tuning.read_chosen({**tune, "file": str(_repo_path(tune["file"]))}, selected(config, "scenarios"),
                                       [m for m, ok in listed.items() if ok])
        except UsageError:  # not tuned yet: the final runs' settings are the study's own
            tuned = None
    return workflow_study_runs(config, tuned)


def _repo_path(path: str | Path) -> Path:
    """A path a study names, from the working directory, else from the repository (tests run anywhere)."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else REPO / p


# ------------------------------------------------------------------------------------ measuring

def tensor_bytes(objs: Iterable[Any]) -> int:
    """Bytes of the tensors in nested dicts, lists and tuples, each tensor object once (clients share
    their initial tensors: a run holds them once; torch.save writes a shared storage once)."""
    seen: set[int] = set()
    total = 0
    stack = list(objs)
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


@contextlib.contextmanager
def _shapes_only() -> Iterator[None]:
    """Meta `nonzero` assumes every element non-zero, so that payloads whose sizes depend on values
    (FedFac's split, Factorized-FL's pruned mu) come out at their largest."""
    import torch.fx.experimental._config as fx_config

    with getattr(fx_config, "patch")(meta_nonzero_assume_all_nonzero=True):
        yield


def _activation_bytes(model: torch.nn.Module, input_shape: tuple[int, ...], batch: int) -> int:
    """What backward keeps of one training batch: the bytes of the tensors autograd saves during the
    forward pass and the loss (the model's own parameters, which autograd saves too, not counted:
    they are counted as the model)."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: set[int] = set()
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        key = t.untyped_storage()._cdata
        if key not in params and key not in seen:
            seen.add(key)
            saved += t.untyped_storage().nbytes()
        return t

    x = torch.zeros((batch, *input_shape), device="meta")
    y = torch.zeros(batch, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.nn.functional.cross_entropy(model(x).reshape(batch, -1), y)
    return saved


def _eval_bytes(model: torch.nn.Module, input_shape: tuple[int, ...]) -> int:
    """A bound of scoring's transient memory: the largest output of any module at batch EVAL_BATCH,
    twice (its input and output live together); nothing is saved without gradients."""
    largest = 0

    def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
        nonlocal largest
        if isinstance(out, torch.Tensor):
            largest = max(largest, out.numel() * out.element_size())

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(torch.zeros((EVAL_BATCH, *input_shape), device="meta"))
    finally:
        for h in handles:
            h.remove()
    return 2 * largest


@dataclass
class Measured:
    """One group's memory, in bytes, measured on the meta device."""

    model: int  # the model's parameters and buffers
    states: int  # what the clients and the server hold once every client has trained
    server: int  # the server's part of it (which stays on the device whatever store.client_states)
    round_extra: int  # what a round holds on top: uploads kept for aggregate, or the streamed sum
    training: int  # on a GPU: one batched step's (clients trained together) gradients, optimizer state, activations
    training_cpu: int  # on a CPU, where clients train one by one: one client's
    checkpoint: int  # the simulator's state_dict, shared tensors once
    kept: int  # client_weights.npz: the diagnosed clients' analysed layers (float16)
    how: str  # "measured", or why a part is a bound
    cost: StepCost | None = None  # timed where asked (`measure(cfg, timed=True)`)
    together: int = 1  # clients whose states a GPU holds at once while they train (batched clients)


def _round_all_clients(sim: Any) -> str:
    """One dry round in which every client trains: what every client holds late in a long run. A
    method whose round needs values (a split decided on trained weights) keeps its clients as built,
    and the plan counts for each what a trained client keeps of its own (Method.replaced_on_receive)."""
    sampled = sim.sample
    sim.sample = lambda rnd: list(sim.members)
    try:
        sim.run_round(1)
    except (NotImplementedError, RuntimeError) as e:
        return (f"bound: {type(e).__name__} in the dry round ({str(e).splitlines()[0][:60]}), each client what a "
                "trained one keeps of its own")
    finally:
        sim.sample = sampled
    # Training writes a client's entries into tensors of its own; a dry round trains nothing, so what
    # a client kept may still be the server's or the initial tensors: each gets a copy of its own.
    for k in sim.members:
        copies: dict[int, torch.Tensor] = {}
        sim.states[k] = {key: copies.setdefault(id(t), t.clone()) if isinstance(t, torch.Tensor) else t
                         for key, t in sim.states[k].items()}
    return "measured"


def measure(cfg: Config, timed: bool = False) -> Measured:
    """A group's memory: its simulator on the meta device after a dry round of every client; `timed`:
    its step and scoring timed and counted too (StepCost)."""
    from ..fl.batched import batchable
    from ..models.layers import effective_weight
    from ..run.simulator import Simulator

    cfg = cfg.model_copy(deep=True)
    cfg.partition.file = None  # the partition job's file need not exist yet: shapes come from the spec
    with _shapes_only():
        sim = Simulator(cfg, dry_run=True, largest_payloads=True)
        how = _round_all_clients(sim)
    model = tensor_bytes([sim.init])
    members = len(sim.members)
    if how == "measured":
        states = tensor_bytes([sim.states.as_list(), sim.server])
        upload = sim.meter.history[-1][0] // max(members, 1)
    else:  # what a trained client keeps of its own (Simulator._trim), each client a copy of it
        dropped = sim.dropped_when_trained()
        own = {key: t for key, t in sim.states[0].items() if key not in dropped}
        states = model + members * tensor_bytes([own]) + tensor_bytes([sim.server])
        upload = model
    params = sum(p.numel() * p.element_size() for p in sim.model.parameters() if p.requires_grad)
    if getattr(getattr(sim.method, "hp", None), "keep_optimizer", False):
        # A client that keeps its optimizer's state from round to round (Factorized-FL's and pFedGate's
        # code) holds it beside its weights, in the checkpoint too; a dry round trains nothing, so it
        # is counted here: momentum one copy, Adam's moments two.
        states += members * {"sgd": 1 if cfg.fl.momentum > 0 else 0, "adam": 2}[cfg.fl.optimizer] * params
    sampled = len(sim.sample(1))
    # Streamed (the base aggregate): one upload at a time and the float64 sum; otherwise every upload
    # of the round until aggregate.
    round_extra = upload + 2 * upload if sim._stream else sampled * upload
    # the optimizer's state (momentum; Adam's two moments) and the temporaries of torch's foreach
    # step: Adam's square root of its second moment, and the gradients plus weight decay
    optimizer = {"sgd": 1 if cfg.fl.momentum > 0 else 0, "adam": 3}[cfg.fl.optimizer] + (cfg.fl.weight_decay > 0)
    info = sim.ctx.input_shape
    net = sim.model
    try:
        activations = _activation_bytes(net.train(), info, cfg.fl.batch_size)
    except (NotImplementedError, RuntimeError):
        # a forward pass that reads values (pFedGate's gate rounds its weights): the model the method
        # prepared from, whose layers the method's model computes too
        from ..data import dataset_info
        from ..models import build_model

        d = dataset_info(cfg.data.name, cfg.data.root)
        with torch.device("meta"):
            net = build_model(cfg.model.name, d.channels, d.height, d.width, d.num_classes,
                              width_multiplier=cfg.model.width_multiplier)
        activations = _activation_bytes(net.train(), info, cfg.fl.batch_size)
        how += "; activations and time of the plain model (its forward pass reads values)"
    step = activations + (2 + optimizer) * params
    # batched clients (fl/batched.py) train up to batch_clients_max at once, on a GPU under auto
    together = min(sampled, cfg.fl.batch_clients_max) if batchable(sim.model, torch.device("cuda"),
                                                                      cfg.fl.batch_clients) else 1
    scoring = _eval_bytes(net.eval(), info)
    training, training_cpu = max(together * step, scoring), max(step, scoring)
    # the checkpoint holds the states and server, then the meter, records and random states
    checkpoint = states + tensor_bytes([sim.state_dict()]) - tensor_bytes([sim.states.as_list(), sim.server])
    kept = 0
    if cfg.diagnostics.keep_weights:
        layers = sim.diagnostic_layers().values()
        clients = len(sim.diagnosed_clients())
        kept = clients * sum(effective_weight(sim.model, name, sim.init).numel() * 2 for name in layers)
    cost = None
    if timed:
        from ..data import dataset_info

        d = dataset_info(cfg.data.name, cfg.data.root)
        augment = d.augment if cfg.data.augment == "auto" else cfg.data.augment
        # methods that train the same network (FedAvg, FedProx, FedPer, ...) share one timing
        network = [[type(m).__name__ for m in net.modules()], [[k, list(v.shape)] for k, v in net.state_dict().items()]]
        key = json.dumps([network, info, cfg.fl.batch_size, cfg.fl.optimizer, cfg.fl.momentum > 0, cfg.fl.precision,
                          augment])
        if key not in _COSTS:
            _COSTS[key] = step_cost(net, info, d.input == "tokens", cfg.fl, augment)
        cost = _COSTS[key]
    return Measured(model, states, tensor_bytes([sim.server]), round_extra, training, training_cpu, checkpoint, kept,
                    how, cost, together)


@dataclass(frozen=True)
class StepCost:
    """A group's compute, timed and counted at plan time: one local step (forward, backward, the
    optimizer's update) and the scoring of one sample, in seconds on one CPU thread, and their FLOPs
    (torch's flop counter)."""

    step_seconds: float
    score_seconds: float  # a sample, scored in batches of EVAL_BATCH without gradients
    step_flops: int
    score_flops: int  # a sample


def _seconds(fn: Callable[[], Any], budget: float = 0.3, most: int = 50) -> float:
    """The mean CPU seconds of `fn` after one call that warms it up, over calls filling `budget`
    seconds: the process's CPU time, which other jobs on a busy machine do not inflate as they do the
    clock's. A first call of 2 s or more is taken as it is: what warming up adds is small beside it,
    and a paper-scale step is timed once, not three times."""
    start = time.process_time()
    fn()
    first = time.process_time() - start
    if first >= 2.0:
        return first
    n, start = 0, time.process_time()
    while True:
        fn()
        n += 1
        took = time.process_time() - start
        if took >= budget or n >= most:
            return took / n


def step_cost(model: torch.nn.Module, input_shape: tuple[int, ...], tokens: bool, fl: FLConfig,
              augment: str) -> StepCost:
    """Time and count local steps and scoring of `model` (a meta-device model, given random weights on
    the CPU here) through the run's own Trainer, its loop's overhead included, on random data of the
    run's shape and batch; on one thread, as the plan's CPU hours are."""
    from ..fl.train import Optim, Phase, Split, Trainer

    import torch._dynamo  # noqa: F401 - what an optimizer's first step imports (2 s), not timed as a step

    net = copy.deepcopy(model).to_empty(device="cpu")
    with torch.no_grad():
        for weight in net.parameters():
            weight.normal_(0, 0.02)
        for buffer in net.buffers():
            buffer.fill_(1 if buffer.is_floating_point() else 0)
    batch, steps = fl.batch_size, 2
    scoring = min(max(batch, 64), EVAL_BATCH)
    n = max(batch * steps, scoring)
    x = torch.zeros((n, *input_shape), dtype=torch.long) if tokens else torch.randn(n, *input_shape)
    trainer = Trainer(net, x, batch, augment, Optim(fl.optimizer, 1e-9, fl.momentum), precision=fl.precision)
    state = {key: t.detach().clone() for key, t in net.state_dict().items()}
    train = Split(torch.arange(batch * steps), torch.zeros(batch * steps, dtype=torch.long))
    scored = Split(torch.arange(scoring), torch.zeros(scoring, dtype=torch.long))
    generator = torch.Generator().manual_seed(0)

    def fit() -> None:
        trainer.fit(state, train, [Phase(epochs=1)], generator)

    def score() -> None:
        trainer.evaluate(state, scored)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step_seconds, score_seconds = _seconds(fit) / steps, _seconds(score) / scoring
    finally:
        torch.set_num_threads(threads)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counted:
        fit()
    step_flops = counted.get_total_flops() // steps
    with FlopCounterMode(display=False) as counted:
        score()
    return StepCost(step_seconds, score_seconds, step_flops, counted.get_total_flops() // scoring)


# Config keys that change neither a run's memory nor its cost per step: runs differing in these alone
# are one group, measured once.
_NOT_MEMORY = {"seed": None, "scenario": None, "label": None, "tracking": None, "checkpoint": None,
               "fl": ("rounds", "lr", "weight_decay", "eval_every", "max_loss", "on_divergence"),
               "eval": ("report",), "partition": ("alpha", "permutation_seed", "min_train_samples"),
               "data": ("root", "download")}


def group_key(cfg: Config) -> str:
    d = cfg.model_dump(mode="json")
    for section, keys in _NOT_MEMORY.items():
        if keys is None:
            d.pop(section, None)
        else:
            for key in keys:
                d.get(section, {}).pop(key, None)
    return json.dumps(d, sort_keys=True)


_MEASURED: dict[str, Measured] = {}  # one measurement per group in a process (--all shares groups)
_COSTS: dict[str, StepCost] = {}  # one timing per network, input, batch and optimizer in a process


def measured(cfg: Config, timed: bool = False) -> Measured:
    key = group_key(cfg)
    if key not in _MEASURED or (timed and _MEASURED[key].cost is None):
        _MEASURED[key] = measure(cfg, timed)
    return _MEASURED[key]


# ------------------------------------------------------------------------------------- the plan

@dataclass
class Group:
    """Runs that share their memory and cost per step."""

    key: str
    names: list[str]
    kind: str
    runs: int
    steps: int  # local steps of all its runs
    dataset: str
    model: str
    method: str
    clients: int
    batch: int
    host_cpu: int  # peak host memory of a run on a CPU
    host_gpu: int  # peak host memory of a run on a GPU
    device: int  # peak GPU memory of a run on a GPU
    memory: Measured
    step_key: tuple[str, tuple[int, int, int], int]
    fits: str = ""  # why it cannot fit the requested memory, or ""
    scored: int = 0  # samples scored by all its runs
    where: str = "device"  # where the clients' states wait on the node (store.client_states: auto's choice)

    @property
    def disk(self) -> int:
        """A run's peak disk: a new checkpoint is written beside the last one, which it replaces once
        complete (job._Checkpoints), the diagnosed clients' weights stay, and the disk store's files."""
        states = self.memory.states - self.memory.server if self.where == "disk" else 0
        return 2 * self.memory.checkpoint + self.memory.kept + states


def placed(g: Group, node: Node) -> Group:
    """The group with its clients' states where `auto` keeps them on the node (fl.store.choose, with the
    node's GPU and host memory) and its needs as they follow: off the device a GPU holds only the
    clients it trains at once; in host memory the host holds them all; on disk the host holds one
    client's at a time and the disk holds them all (Group.disk)."""
    clients = g.memory.states - g.memory.server
    where = choose(g.memory.states, bool(node.gpus), node.device_memory if node.gpus else None, node.memory)
    if where == "device":
        return g
    # Besides the clients it trains at once, the run's device keeps the initial model, which the
    # clients not yet trained share in every store.
    one = clients // max(g.clients, 1)
    if node.gpus:
        return replace(g, where=where, device=g.device - clients + min(g.memory.together, g.clients) * one
                       + g.memory.model, host_gpu=g.host_gpu + (clients if where == "host" else one))
    return replace(g, where=where, host_cpu=g.host_cpu - clients + one + g.memory.model)


def local_steps(cfg: Config, facts: DatasetFacts) -> int:
    """One run's local steps: rounds x clients sampled a round x epochs x batches of a client's mean
    train share (a method's extra phases, FedRep's head epochs, FedEM's components, not counted)."""
    K = cfg.fl.clients
    f_train, f_val, _ = cfg.data.split
    if cfg.partition.kind == "dirichlet_fixed":
        per_client = float(cfg.partition.samples_per_client.train)
    elif cfg.partition.kind == "natural":
        per_client = facts.samples / max(facts.natural_clients, 1) * f_train
    elif cfg.data.split_mode == "official":
        per_client = facts.official_train * f_train / (f_train + f_val) / K
    else:
        per_client = facts.samples * f_train / K
    members = K - int(round(cfg.eval.new_clients * K))
    sampled = max(1, int(round(cfg.fl.fraction * members)))
    return cfg.fl.rounds * sampled * cfg.fl.epochs * math.ceil(per_client / cfg.fl.batch_size)


def scored_samples(cfg: Config, facts: DatasetFacts) -> int:
    """One run's scored samples: at every evaluated round, each member client's validation and test
    samples (under eval.test_pool: shared, the pooled test split for each)."""
    K = cfg.fl.clients
    members = K - int(round(cfg.eval.new_clients * K))
    rounds, every = cfg.fl.rounds, cfg.fl.eval_every
    evaluated = rounds // every + (rounds % every != 0)
    f_train, f_val, f_test = cfg.data.split
    if cfg.partition.kind == "dirichlet_fixed":
        spc = cfg.partition.samples_per_client
        val, test = float(spc.val * members), float(spc.test * members)
    elif cfg.data.split_mode == "official":
        val, test = facts.official_train * f_val / (f_train + f_val), float(facts.samples - facts.official_train)
    else:
        val, test = facts.samples * f_val, facts.samples * f_test
    if cfg.eval.test_pool == "shared":
        test *= members
    return int(evaluated * (val + test))


def dataset_bytes(facts: DatasetFacts, shape: tuple[int, int, int]) -> tuple[int, int]:
    """(while loading, resident): the file's uint8 arrays and their float32 copy while a job loads it,
    then the float32 samples and int64 labels it trains from (datasets.load_dataset)."""
    n = facts.samples
    resident = 4 * n * math.prod(shape) + 8 * n
    return n * math.prod(shape) + resident, resident


@dataclass
class StudyPlan:
    study: str
    files: list[str]
    groups: list[Group] = field(default_factory=list)
    datasets: dict[str, DatasetFacts] = field(default_factory=dict)
    flagged: list[str] = field(default_factory=list)
    runtime: str | None = None  # runtime_problem's answer: "" fits, None: no runtime requested


@dataclass(frozen=True)
class Node:
    """What the profile's train rule asks of a node: memory in bytes (None: not requested) and GPUs."""

    memory: int | None
    gpus: int
    source: str
    device_memory: int | None = None
    disk: int | None = None  # a run's disk, in bytes (disk_mb of the train rule); None: not requested
    runtime: int | None = None  # the train rule's time limit in minutes; None: none
    attempts: int = 1  # a job's attempts: the profile's retries + 1
    lead: int = 0  # seconds between SLURM's stop signal and the time limit (--signal=TERM@lead)


def signal_lead(slurm_extra: Any) -> int:
    """The seconds before its time limit at which SLURM signals a job to stop: the lead of a
    `--signal=[B:]TERM@SECONDS` among the train rule's sbatch options (slurm_extra), else 0: the
    SIGTERM comes at the limit."""
    found = re.search(r"--signal[= ](?:[BR]+:)?(?:SIG)?(?:TERM|15)@(\d+)", str(slurm_extra or ""))
    return int(found[1]) if found else 0


def profile_node(profile: str | Path | None, gpus_per_job: int, device_memory: int | None = None) -> Node:
    """The train rule's request under a Snakemake profile (its set-resources, else default-resources):
    mem_mb and gpu. Without a profile: no memory request, the study's gpus_per_job."""
    if profile is None:
        return Node(None, gpus_per_job, "no profile", device_memory)
    path = Path(profile) / "config.yaml"
    doc = read_mapping(path)
    train = (doc.get("set-resources") or {}).get("train") or {}
    default = doc.get("default-resources") or {}
    mem, gpu_mem, disk = (train.get(key, default.get(key)) for key in ("mem_mb", "gpu_mem_mb", "disk_mb"))
    gpus = train.get("gpu", default.get("gpu", gpus_per_job))
    if device_memory is None and gpu_mem is not None:
        device_memory = int(gpu_mem) * 10**6
    runtime = train.get("runtime", default.get("runtime"))
    return Node(None if mem is None else int(mem) * 10**6, int(gpus), str(path), device_memory,
                None if disk is None else int(disk) * 10**6, None if runtime is None else int(runtime),
                int(doc.get("retries", 0)) + 1, signal_lead(train.get("slurm_extra", default.get("slurm_extra"))))


def _run_config(run_config: str, sets: list[str]) -> Config:
    """A run's config as its train job sets it up, the method's hyperparameters typed and checked."""
    return read_run(run_config, sets).cfg


def plan_study(paths: list[str], node_for: Callable[[dict], Node] | None = None) -> StudyPlan:
    config = read_study(paths)
    plan = StudyPlan(config["study"], [str(p) for p in paths])
    run_config = str(_repo_path(config.get("run_config", "")))
    groups: dict[str, Group] = {}
    for spec in study_runs(config):
        try:
            cfg = _run_config(run_config, spec.sets)
        except UsageError as e:
            raise UsageError(f"{paths[0]}: {spec.name}: {e}") from None
        facts = plan.datasets.get(cfg.data.name) or dataset_facts(cfg.data.name, cfg.data.root)
        plan.datasets[cfg.data.name] = facts
        key = spec.kind + group_key(cfg)
        seeds = len(spec.seeds)
        steps = seeds * local_steps(cfg, facts)
        scored = seeds * scored_samples(cfg, facts)
        if key in groups:
            g = groups[key]
            g.names.append(spec.name)
            g.runs += seeds
            g.steps += steps
            g.scored += scored
            continue
        try:
            groups[key] = _group(cfg, facts, key, spec.name, spec.kind, seeds, steps, timed=True)
        except UsageError as e:
            raise UsageError(f"{paths[0]}: {spec.name}: {e}") from None
        groups[key].scored = scored
    plan.groups = list(groups.values())
    node = node_for(config) if node_for else None
    if node is not None:
        plan.groups = [placed(g, node) for g in plan.groups]
        for g in plan.groups:
            g.fits = fit_problem(g, node)
            if g.fits:
                more = f" (and {len(g.names) - 1} more)" if len(g.names) > 1 else ""
                plan.flagged.append(f"{plan.study}: {g.kind} {g.names[0]}{more}: {g.fits}")
        if node.runtime is not None:
            plan.runtime = runtime_problem(plan, node)
            if plan.runtime:
                plan.flagged.append(f"{plan.study}: {plan.runtime}")
    return plan


def _group(cfg: Config, facts: DatasetFacts, key: str, name: str, kind: str = "final", runs: int = 1,
           steps: int = 0, timed: bool = False) -> Group:
    """A run group's needs, measured once: host memory on a CPU and on a GPU, GPU memory, disk, and
    (`timed`) the time of a step and of scoring."""
    m = measured(cfg, timed)
    from ..data import dataset_info

    info = dataset_info(cfg.data.name, cfg.data.root)
    shape = (info.channels, info.height, info.width)
    loading, resident = dataset_bytes(facts, shape)
    on_device = resident + m.states + m.round_extra + m.training
    on_cpu = resident + m.states + m.round_extra + m.training_cpu
    return Group(
        key, [name], kind, runs, steps, cfg.data.name, cfg.model.name, cfg.method["name"],
        cfg.fl.clients, cfg.fl.batch_size,
        host_cpu=PROCESS_BYTES + max(loading, on_cpu),
        # on a GPU the host loads the data and hands it over; a checkpoint is copied out tensor by tensor
        host_gpu=PROCESS_BYTES + loading,
        device=on_device, memory=m, step_key=(cfg.model.name, shape, cfg.fl.batch_size))


def fit_problem(g: Group, node: Node) -> str:
    """Why a group's runs cannot fit the node, or "": host memory, GPU memory, disk, and under a time
    limit the checkpoint's write at the stop signal, each naming the setting to change."""
    host = g.host_gpu if node.gpus else g.host_cpu
    if node.memory is not None and host > node.memory:
        return (f"needs {gib(host)} of host memory, the train rule requests {gib(node.memory)} ({node.source})")
    if node.gpus and node.device_memory is not None and g.device > node.device_memory:
        return (f"needs {gib(g.device)} of GPU memory, the GPU has {gib(node.device_memory)} (gpu_mem_mb of the "
                "train rule, or plan's --gpu-memory-gib): give it a larger GPU, or fewer clients or a smaller model")
    if node.disk is not None and g.disk > node.disk:
        return (f"needs {gib(g.disk)} of disk (its checkpoint, {gib(g.memory.checkpoint)}, twice while a new one "
                f"is written), the train rule requests {gib(node.disk)} (disk_mb): raise disk_mb")
    write = g.memory.checkpoint / WRITE_BYTES_PER_SECOND
    if node.runtime is not None and write > node.lead + KILL_WAIT_SECONDS:
        return (f"writes a checkpoint of {gib(g.memory.checkpoint)} when stopped at its time limit, about "
                f"{write:,.0f} s at {WRITE_BYTES_PER_SECOND // 10**6} MB/s, and SLURM kills it "
                f"{node.lead + KILL_WAIT_SECONDS} s after its stop signal: give the train rule's slurm_extra "
                f"--signal=TERM@{math.ceil(write / 60) * 60}")
    return ""


def group_hours(g: Group, where: str) -> tuple[float, bool]:
    """(hours, measured) of a group's runs, their local steps and scoring, on one CPU thread (timed at
    plan time) or one GPU: measured where `python -m benchmarks gpu` timed the step (STEP_SECONDS), else
    estimated from the FLOPs at GPU_ESTIMATE's share of its peak (scoring too). Start-up, the methods'
    server work and their extra phases (FedRep's head epochs, FedEM's components) are not counted."""
    cost = g.memory.cost
    if cost is None:
        raise ValueError(f"group {g.names[0]} was not timed")
    if where == "cpu":
        return (g.steps * cost.step_seconds + g.scored * cost.score_seconds) / 3600, True
    step = STEP_SECONDS.get(("gpu", *g.step_key))
    _, peak, share = GPU_ESTIMATE
    scoring = g.scored * cost.score_flops / (share * peak)
    if step is not None:
        return (g.steps * step[0] + scoring) / 3600, True
    return (g.steps * cost.step_flops / (share * peak) + scoring) / 3600, False


def hours(plan: StudyPlan, where: str) -> tuple[float, bool]:
    """The study's (hours, all measured) on `where`, every group's runs together."""
    each = [group_hours(g, where) for g in plan.groups]
    return sum(h for h, _ in each), all(m for _, m in each)


def runtime_problem(plan: StudyPlan, node: Node) -> str:
    """Whether the study's longest run fits the train rule's runtime over its attempts (a run stopped
    at the limit resumes in the next attempt from its checkpoint), and what to set if not; "" where
    the profile gives no runtime."""
    if node.runtime is None or not plan.groups:
        return ""
    where = "gpu" if node.gpus else "cpu"
    return over_runtime("its longest run", max(group_hours(g, where)[0] / g.runs for g in plan.groups), node)


def over_runtime(run: str, hours: float, node: Node) -> str:
    """Why a run of `hours` does not fit the train rule's runtime over its attempts, or ""."""
    if node.runtime is None or hours <= node.runtime / 60 * node.attempts:
        return ""
    return (f"{run} takes {hours:,.1f} h on one {'GPU' if node.gpus else 'CPU thread'}, over "
            f"{node.attempts} attempts of runtime {node.runtime} min: set train:runtime to at least "
            f"{math.ceil(hours * 60 / node.attempts)} (or raise retries)")


# ---------------------------------------------------------------------------------------- output

def gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB" if n >= GiB / 10 else f"{n / MiB:,.1f} MiB"


def _size(n: int | None) -> str:
    return "not known" if n is None else "0" if n == 0 else gib(n)


def summary(plan: StudyPlan) -> dict[str, Any]:
    """One study's row, as numbers (the JSON) before formatting."""
    final = [g for g in plan.groups if g.kind == "final"]
    tune = [g for g in plan.groups if g.kind == "tuning"]
    downloads = [f.download for f in plan.datasets.values()]
    disk = sum((f.download or 0) + (f.extracted or 0) for f in plan.datasets.values())
    biggest = max(plan.groups, key=lambda g: g.memory.checkpoint) if plan.groups else None
    hours_by = {where: hours(plan, where) for where in DEVICES}
    return {
        "study": plan.study, "files": plan.files,
        "runs": sum(g.runs for g in final), "tuning_runs": sum(g.runs for g in tune),
        "groups": len(plan.groups),
        "local_steps": sum(g.steps for g in final), "tuning_local_steps": sum(g.steps for g in tune),
        "datasets": {name: {"samples": f.samples, "download_bytes": f.download, "source": f.source,
                            "extracted_bytes": f.extracted} for name, f in plan.datasets.items()},
        "download_bytes": None if None in downloads else sum(d or 0 for d in downloads),
        "disk_bytes_at_least": disk,
        "host_bytes_cpu_run": max((g.host_cpu for g in plan.groups), default=0),
        "host_bytes_gpu_run": max((g.host_gpu for g in plan.groups), default=0),
        "device_bytes": max((g.device for g in plan.groups), default=0),
        "checkpoint_bytes": biggest.memory.checkpoint if biggest else 0,
        "results_bytes": sum(g.runs * g.memory.kept for g in plan.groups),
        "cpu_hours": hours_by["cpu"][0], "gpu_hours": hours_by["gpu"][0],
        "gpu_hours_are": "measured" if hours_by["gpu"][1] else f"estimated ({GPU_ESTIMATE[0]}, FLOPs at "
                         f"{GPU_ESTIMATE[2]:.0%} of {GPU_ESTIMATE[1] / 1e12:g} TFLOP/s)",
        "fits_runtime": None if plan.runtime is None else not plan.runtime,
        "bounds": sorted({g.memory.how for g in plan.groups if g.memory.how != "measured"}),
        "cannot_fit": plan.flagged,
    }


def group_rows(plan: StudyPlan) -> list[dict[str, Any]]:
    return [{"kind": g.kind, "runs": g.runs, "first": g.names[0], "more": len(g.names) - 1, "dataset": g.dataset,
             "model": g.model, "method": g.method, "clients": g.clients, "batch": g.batch, "local_steps": g.steps,
             "model_bytes": g.memory.model, "states_bytes": g.memory.states, "round_bytes": g.memory.round_extra,
             "training_bytes": g.memory.training, "host_bytes_cpu_run": g.host_cpu, "host_bytes_gpu_run": g.host_gpu,
             "device_bytes": g.device, "checkpoint_bytes": g.memory.checkpoint, "kept_bytes": g.memory.kept,
             "memory": g.memory.how, "client_states": g.where, "cannot_fit": g.fits} for g in plan.groups]


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table, columns padded so it reads as well in a terminal."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _hours(h: float, runs: int, measured: bool = True) -> str:
    return "-" if not runs else f"{h:,.1f}" if measured else f"{h:,.1f} (est.)"


def summary_table(plans: list[StudyPlan]) -> str:
    header = ["study", "runs", "tuning runs", "local steps", "datasets", "download", "disk (at least)",
              "host/run CPU", "host/run GPU", "GPU mem/run", "checkpoint", "results kept", "CPU-h (1 thread)",
              "GPU-h", "runs that cannot fit", "longest run in runtime"]
    rows = []
    for plan in plans:
        s = summary(plan)
        rows.append([s["study"], f"{s['runs']:,}", f"{s['tuning_runs']:,}",
                     f"{s['local_steps'] + s['tuning_local_steps']:,}", ", ".join(s["datasets"]) or "-",
                     _size(s["download_bytes"]), _size(s["disk_bytes_at_least"]), gib(s["host_bytes_cpu_run"]),
                     gib(s["host_bytes_gpu_run"]), gib(s["device_bytes"]), gib(s["checkpoint_bytes"]),
                     _size(s["results_bytes"]), _hours(s["cpu_hours"], s["runs"]),
                     _hours(s["gpu_hours"], s["runs"], s["gpu_hours_are"] == "measured"),
                     f"{sum(g.runs for g in plan.groups if g.fits):,}",
                     {None: "-", True: "yes", False: "no"}[s["fits_runtime"]]])
    return _table(header, rows)


def groups_table(plan: StudyPlan) -> str:
    header = ["runs", "kind", "scenario/method", "dataset", "model", "method", "clients", "batch", "local steps",
              "states", "where", "round", "training", "host/run CPU", "host/run GPU", "GPU mem", "checkpoint", "memory"]
    rows = [[f"{r['runs']:,}", r["kind"], r["first"] + (f" +{r['more']}" if r["more"] else ""), r["dataset"],
             r["model"], r["method"], f"{r['clients']:,}", str(r["batch"]), f"{r['local_steps']:,}",
             gib(r["states_bytes"]), r["client_states"], gib(r["round_bytes"]), gib(r["training_bytes"]), gib(r["host_bytes_cpu_run"]),
             gib(r["host_bytes_gpu_run"]), gib(r["device_bytes"]), gib(r["checkpoint_bytes"]),
             "measured" if r["memory"] == "measured" else "bound"] for r in group_rows(plan)]
    return _table(header, rows)


def study_files(all_studies: bool, study: list[str] | None) -> list[list[str]]:
    """The study files to plan: --all (config/config.yaml, then config/studies/*.yaml), or one study
    and the files that override it."""
    if all_studies:
        return [[str(REPO / "config" / "config.yaml")],
                *([str(p)] for p in sorted((REPO / "config" / "studies").glob("*.yaml")))]
    if not study:
        raise UsageError("give --study FILE [OVERRIDE ...] or --all")
    return [study]


def check_memory(study: str, run_config: str, runs: Iterable[tuple[str, list[str]]], node: Node) -> None:
    """The workflow's check at DAG build: each run group's planned needs (`fedfactor plan`) against
    what the profile or command line requests of the train rule: host memory, GPU memory, disk, and
    under a time limit the run's hours (timed here on a CPU, from FLOPs on a GPU) over its attempts and
    its checkpoint's write at the stop signal. The first run that cannot fit ends the build in one line
    naming the study, the run, the need and the setting to change. Each group is measured once."""
    if node.memory is None and node.device_memory is None and node.disk is None and node.runtime is None:
        return
    seen: set[str] = set()
    for name, sets in runs:
        cfg = _run_config(run_config, sets)
        key = group_key(cfg)
        if key in seen:
            continue
        seen.add(key)
        facts = dataset_facts(cfg.data.name, cfg.data.root)
        timed = node.runtime is not None
        g = placed(_group(cfg, facts, key, name, steps=local_steps(cfg, facts), timed=timed), node)
        g.scored = scored_samples(cfg, facts)
        problem = fit_problem(g, node) or (timed and over_runtime("it", group_hours(g, "gpu" if node.gpus else "cpu")[0],
                                                                  node))
        if problem:
            where = "on a GPU" if node.gpus else "on the CPU"
            raise UsageError(f"study {study}: {name} {problem} ({where}; `fedfactor plan` says why)")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _requested(settings: Any, rule: str, name: str) -> Iterator[Any]:
    """The values the command line or profile gives `name` for `rule`: --set-resources first, then
    --default-resources; none for an expression Snakemake evaluates per job."""
    for mapping in (settings.overwrite_resources.get(rule), settings.default_resources):
        try:
            value = mapping[name]
        except (KeyError, TypeError):  # not given, or no mapping at all
            continue
        try:
            yield getattr(value, "value", value)  # Snakemake's Resource
        except ValueError:  # an expression (Snakemake's default disk_mb) it evaluates per job
            continue


def requested_resource(settings: Any, rule: str, name: str) -> int | None:
    """A number the command line or profile requests for `rule` (--set-resources, else
    --default-resources), or None where none is given or it is an expression evaluated per job."""
    for value in _requested(settings, rule, name):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None


def snakemake_retries(argv: list[str], workdir: Path) -> int:
    """The retries of the Snakemake command `argv`: its --retries (or --restart-times), else its
    workflow profile's (--workflow-profile, profiles/default where none is named), else 0. Snakemake
    sets its own value only after it has read the Snakefile, where the dry run's checks run."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--retries", "--restart-times", type=int)
    parser.add_argument("--workflow-profile")
    known, _ = parser.parse_known_args(argv)
    if known.retries is not None:
        return known.retries
    profile = workdir / (known.workflow_profile or "profiles/default") / "config.yaml"
    doc = read_mapping(profile) if profile.is_file() else {}
    return int(doc.get("retries", doc.get("restart-times", 0)))


def check_run_memory(config: dict[str, Any], run_config: str, runs: Iterable[tuple[str, list[str]]],
                     settings: Any, retries: int = 0) -> None:
    """Every run group's planned needs (`fedfactor plan`) against what the active profile or command
    line requests of the train rule: mem_mb, gpu_mem_mb (a GPU's memory, which SLURM does not know:
    declared for this check), disk_mb, and runtime over `retries` + 1 attempts with the lead of its
    stop signal (slurm_extra); nothing to check where none is requested (the default local profile).
    With GPUs requested, the host holds the data while it loads."""
    mem_mb, gpu_mem_mb, disk_mb, runtime = (requested_resource(settings, "train", key)
                                            for key in ("mem_mb", "gpu_mem_mb", "disk_mb", "runtime"))
    if mem_mb is None and gpu_mem_mb is None and disk_mb is None and runtime is None:
        return
    gpus = requested_resource(settings, "train", "gpu")
    extra = next(_requested(settings, "train", "slurm_extra"), None)
    node = Node(None if mem_mb is None else mem_mb * 10**6, config["gpus_per_job"] if gpus is None else gpus,
                f"mem_mb={mem_mb} of the train rule", None if gpu_mem_mb is None else gpu_mem_mb * 10**6,
                None if disk_mb is None else disk_mb * 10**6, runtime, retries + 1, signal_lead(extra))
    check_memory(config["study"], run_config, runs, node)
