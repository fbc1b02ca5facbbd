"""Method overhead: the time of a round of each method as a multiple of a FedAvg round under the same
run config, and the share of FedFac's round its factor analysis takes.

(a) paper settings: each paper's methods (Factorized-FL alpha and beta, pFedPara, SimFed, FedFac,
    FedDecomp) under that paper's run config, its study's scenario and method entry, on
    synthetic:<the paper's dataset> (300 images of its shape), 20 clients; target <= 1.15 x FedAvg.
    Quick: the same methods under the default study's digits config (config/runs/digits.yaml).
(b) every other registered method under the default study's digits config, with the method's entry
    of config/config.yaml where it has one; no target. A method that cannot run there is reported
    with the reason.
(c) FedFac's factor analysis (its `_analyse`, timed through a wrapper of the instance's bound
    method) per round, as a share of FedFac's round under its paper setting; target <= 0.05.

All simulators of a setting live in this one process on the same data and seed; their rounds are
interleaved (FedAvg, method 1, method 2, ..., FedAvg, ...) so that a machine busy with something
else slows them alike, and the median over the timed rounds (after one warm-up round) is compared.
Rounds are `run_round` alone: evaluation is not timed.
"""

from __future__ import annotations

import math
import shlex
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .common import one_line, row, synchronize

DESCRIPTION = ("ms per round of each method vs FedAvg under the same run config (interleaved rounds, median "
               "after a warm-up), and FedFac's factor analysis as a share of its round")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STUDY = "config/config.yaml"
TARGET = "<= 1.15"
FA_TARGET = "<= 0.05"

# (study, scenario, method labels): each paper's main table, one scenario of it. The scenario's
# partition matters for what a method does (permuted labels keep heads local); the dataset is
# replaced by its synthetic stand-in.
PAPERS = [
    ("config/studies/factorized_fl_label.yaml", "cifar10_permuted_iid",
     ["factorized_fl_alpha", "factorized_fl_beta", "pfedpara"]),
    ("config/studies/simfed_single.yaml", "cifar10_permuted_iid", ["simfed"]),
    ("config/studies/fedfac_table2.yaml", "cifar10_pi1", ["fedfac"]),
    ("config/studies/feddecomp_table1_cifar10.yaml", "cifar10_a0.5", ["feddecomp"]),
]
# Training samples a client holds in the paper (its set-up, config/runs/*.yaml and docs/papers/): Factorized-FL
# and SimFed cut CIFAR-10's pooled 60,000 into 48,000 train shared by 20 clients; FedFac's 100
# clients hold 500 each; FedDecomp gives each client 500.
PAPER_TRAIN_PER_CLIENT = {"factorized_fl_label": 2400, "simfed_single": 2400, "fedfac_table2": 500,
                          "feddecomp_table1_cifar10": 500}
# What the synthetic stand-in (300 images) and 20 clients need beyond the paper's own settings.
PAPER_FIXES = {
    # FedFac samples C = 0.1 of 100 clients, 10 a round: as many of 20 clients, so that the factor
    # analysis sees as many clients as in the paper.
    "fedfac_table2": ["fl.fraction=0.5"],
    # FedDecomp's 500/100/100 samples per client do not fit in 300 images (about 200 train, 22 val,
    # 75 test in its official split mode): as many as fit, drawn the paper's way.
    "feddecomp_table1_cifar10": ["partition.samples_per_client={train: 100, val: 10, test: 50}"],
}


@dataclass
class Setting:
    """One run config and scenario under which a group of methods is compared with FedAvg."""

    name: str
    run_config: str
    sets: list[str]  # overrides of the run config for every method of the group (scenario, benchmark)
    entries: dict[str, dict[str, Any]]  # method label -> its study entry; "fedavg" first
    part: dict[str, str] = field(default_factory=dict)  # label -> "a" (paper method, target) or "b"
    # SGD steps a round takes in the paper (clients a round x epochs x batches a client), and the
    # paper's batch size; None: not a paper setting
    paper_steps: int | None = None
    batch_size: int | None = None


def _read(path: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / path).read_text())


def default_entry(name: str, entries: dict[str, dict]) -> dict[str, Any]:
    """A method's entry of the default study: its own label's, else the first with its name, else the defaults."""
    if name in entries and entries[name]["name"] == name:
        return dict(entries[name])
    return next((dict(e) for e in entries.values() if e["name"] == name), {"name": name})


def paper_settings(device: str) -> list[Setting]:
    from fedfactor.config import load_config
    from fedfactor.study.workflow import dataset_name, run_sets

    out = []
    for study_path, scenario, labels in PAPERS:
        study = _read(study_path)
        run_config = study["run_config"]
        overrides = study["scenarios"][scenario]
        data = dataset_name(str(ROOT / run_config), overrides)
        sets = [*run_sets(overrides), f"data.name=synthetic:{data}", "data.download=false", "model.pretrained=false",
                "fl.clients=20", "tracking.enabled=false", f"fl.device={device}",
                *PAPER_FIXES.get(study["study"], [])]
        entries = {"fedavg": {"name": "fedavg"}, **{label: dict(study["methods"][label]) for label in labels}}
        paper = load_config(ROOT / run_config, run_sets(overrides)).fl
        per_round = max(1, round(paper.fraction * paper.clients))
        steps = per_round * paper.epochs * math.ceil(PAPER_TRAIN_PER_CLIENT[study["study"]] / paper.batch_size)
        out.append(Setting(f"{study['study']}/{scenario}", run_config, sets, entries, dict.fromkeys(labels, "a"),
                           steps, paper.batch_size))
    return out


def default_setting(device: str, paper_methods: bool) -> Setting:
    """The default study's digits config with every registered method not timed under a paper setting
    (part b), and with `paper_methods` the paper methods too (part a in quick mode)."""
    from fedfactor.methods import METHODS

    study = _read(DEFAULT_STUDY)
    paper = [label for _, _, labels in PAPERS for label in labels]
    part = dict.fromkeys(paper, "a") if paper_methods else {}
    part.update({n: "b" for n in METHODS.names() if n not in paper and n != "fedavg"})
    entries = {"fedavg": {"name": "fedavg"}, **{n: default_entry(n, study["methods"]) for n in part}}
    return Setting("default study (digits)", study["run_config"], ["tracking.enabled=false", f"fl.device={device}"],
                   entries, part)


class Timer:
    """Wraps a bound method of an instance; seconds per call, with the round it ran in."""

    def __init__(self, obj: Any, name: str, sim: Any, device: str):
        self.calls: list[tuple[int, float]] = []
        fn = getattr(obj, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            synchronize(device)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                synchronize(device)
                self.calls.append((sim.ctx.round, time.perf_counter() - start))

        setattr(obj, name, wrapper)

    def seconds(self, rounds: set[int]) -> float:
        return sum(s for r, s in self.calls if r in rounds)


@dataclass
class Outcome:
    inputs: dict[str, str] = field(default_factory=dict)  # label -> how to rerun it
    times: dict[str, list[float]] = field(default_factory=dict)  # label -> seconds of each timed round
    failed: dict[str, str] = field(default_factory=dict)  # label -> why it could not run
    fa: Timer | None = None  # FedFac's factor analysis, when the group has FedFac
    train: dict[str, Timer] = field(default_factory=dict)  # label -> its Trainer.fit calls
    step: dict[str, float] = field(default_factory=dict)  # label -> seconds per step at the paper's batch


def method_sets(setting: Setting, label: str) -> list[str]:
    """The method's entry (its `run` overrides included), then the group's overrides on top."""
    from fedfactor.study.workflow import method_sets as entry_sets

    return [*entry_sets(setting.entries[label], label), *setting.sets]


def compare(setting: Setting, repeats: int, device: str) -> Outcome:
    """Build every method of the setting, then time `repeats` interleaved rounds after a warm-up round."""
    from fedfactor.config import load_config
    from fedfactor.run.simulator import Simulator

    out = Outcome()
    sims = {}
    for label in setting.entries:
        sets = method_sets(setting, label)
        out.inputs[label] = shlex.join(["--config", setting.run_config, *(a for s in sets for a in ("--set", s))])
        try:
            cfg = load_config(ROOT / setting.run_config, sets)
            if cfg.fl.rounds < repeats + 1:  # a method may schedule by the run's length: raise it only if needed
                cfg = load_config(ROOT / setting.run_config, [*sets, f"fl.rounds={repeats + 1}"])
            sims[label] = Simulator(cfg)
        except Exception as e:  # a method that cannot run here is reported, the others go on
            out.failed[label] = one_line(e)
    if "fedfac" in sims:
        out.fa = Timer(sims["fedfac"].method, "_analyse", sims["fedfac"], device)
    for label, sim in sims.items():
        out.train[label] = Timer(sim.trainer, "fit", sim, device)
    out.times = {label: [] for label in sims}
    for rnd in range(1, repeats + 2):
        for label in list(sims):
            synchronize(device)
            start = time.perf_counter()
            try:
                sims[label].run_round(rnd)
            except Exception as e:
                out.failed[label] = f"round {rnd}: {one_line(e)}"
                del sims[label], out.times[label]
                continue
            synchronize(device)
            if rnd > 1:  # the first round warms up allocations and caches
                out.times[label].append(time.perf_counter() - start)
    if setting.batch_size:
        for label, sim in sims.items():
            try:
                out.step[label] = step_seconds(sim, setting.batch_size, device)
            except Exception as e:
                out.failed[label] = f"one step at batch {setting.batch_size}: {one_line(e)}"
    return out


def step_seconds(sim: Any, batch_size: int, device: str, repeats: int = 2) -> float:
    """Seconds per SGD step of the method's plan at the paper's batch size: one client holding exactly
    one batch (its samples repeated if it has fewer) trains its round's plan; the median over repeats."""
    import torch

    from fedfactor.fl.train import Split

    own = sim.clients[0]["train"]
    pick = torch.arange(batch_size, device=own.idx.device) % len(own)
    split = Split(own.idx[pick], own.y[pick])
    payload = sim.method.download(sim.server, 0)
    state = sim.method.receive(0, sim.states[0], payload)
    phases = sim.method.plan(0, state, payload)
    steps = sum(p.steps if p.steps is not None else p.epochs for p in phases)  # one batch = one step an epoch
    times = []
    for _ in range(repeats + 1):
        gen = torch.Generator(device=sim.x.device).manual_seed(0)
        synchronize(device)
        start = time.perf_counter()
        type(sim.trainer).fit(sim.trainer, state, split, phases, gen)  # not the Timer's wrapper
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) / max(steps, 1)


def rows_of(setting: Setting, out: Outcome, repeats: int) -> list[dict]:
    how = f"; median of {repeats} rounds after 1 warm-up, interleaved with the other methods of the setting"
    rows = []
    base = statistics.median(out.times["fedavg"]) if "fedavg" in out.times else None
    for label in setting.entries:
        target = TARGET if setting.part.get(label) == "a" else None
        case = f"{setting.name}: {label}"
        if label in out.failed:
            rows.append(row(case, float("nan"), "ms/round", None, target,
                            f"cannot run: {out.failed[label]}; {out.inputs[label]}"))
            continue
        med = statistics.median(out.times[label])
        ratio = None if base is None or label == "fedavg" else med / base
        if setting.paper_steps is None:
            rows.append(row(case, 1e3 * med, "ms/round", ratio, target, out.inputs[label] + how))
            continue
        # On this data (300 images) a round is mostly per-round work; the paper's rounds are mostly
        # SGD steps. Both parts are measured; the paper-scale round is their sum at the paper's steps.
        rows.append(row(case + " (300 synthetic images)", 1e3 * med, "ms/round", ratio, None, out.inputs[label] + how))
        if label not in out.step or "fedavg" not in out.step:
            continue
        rows.append(row(case + f" (one step at batch {setting.batch_size})", 1e3 * out.step[label], "ms/step",
                        None if label == "fedavg" else out.step[label] / out.step["fedavg"], None,
                        f"the method's plan for one client holding one batch; {out.inputs[label]}"))
        rest = {lb: statistics.median(out.times[lb]) - out.train[lb].seconds(timed_rounds(repeats)) / repeats
                for lb in (label, "fedavg")}
        paper = {lb: setting.paper_steps * out.step[lb] + rest[lb] for lb in (label, "fedavg")}
        rows.append(row(case + f" (paper scale: {setting.paper_steps} steps a round)", 1e3 * paper[label], "ms/round",
                        None if label == "fedavg" else paper[label] / paper["fedavg"], target,
                        f"= {setting.paper_steps} x the step above + the round's measured time outside "
                        f"Trainer.fit ({1e3 * rest[label]:.0f} ms)"))
    return rows


def timed_rounds(repeats: int) -> set[int]:
    return set(range(2, repeats + 2))


def fa_row(setting: Setting, out: Outcome, repeats: int) -> dict:
    case = f"{setting.name}: fedfac factor analysis"
    if out.fa is None or "fedfac" not in out.times:
        why = out.failed.get("fedfac", "no fedfac in this setting")
        return row(case, float("nan"), "ms/round", None, FA_TARGET, f"cannot run: {why}")
    fa, rounds = out.fa.seconds(timed_rounds(repeats)) / repeats, statistics.median(out.times["fedfac"])
    if setting.paper_steps is None or "fedfac" not in out.step:
        return row(case, 1e3 * fa, "ms/round", fa / rounds, FA_TARGET,
                   f"FedFac._analyse over the {repeats} timed rounds / those rounds' time; {out.inputs['fedfac']}")
    outside = rounds - out.train["fedfac"].seconds(timed_rounds(repeats)) / repeats
    paper = setting.paper_steps * out.step["fedfac"] + outside
    return row(case + " (paper scale)", 1e3 * fa, "ms/round", fa / paper, FA_TARGET,
               f"FedFac._analyse per round / a paper-scale FedFac round ({1e3 * paper:.0f} ms: "
               f"{setting.paper_steps} steps + the rest); on the 300 images it is {fa / rounds:.2f} of the round; "
               f"{out.inputs['fedfac']}")


def run(quick: bool, device: str) -> list[dict]:
    repeats = 2 if quick else 5
    settings = [default_setting(device, paper_methods=True)] if quick else [*paper_settings(device),
                                                                          default_setting(device, paper_methods=False)]
    rows, fa = [], []
    for setting in settings:  # one setting at a time: its simulators are freed before the next is built
        out = compare(setting, repeats, device)
        rows += rows_of(setting, out, repeats)
        if "fedfac" in setting.entries and setting.part.get("fedfac") == "a":
            fa.append(fa_row(setting, out, repeats))
    return rows + fa
