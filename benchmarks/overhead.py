"""Simulator overhead: samples/s of FedAvg rounds as a fraction of a plain PyTorch loop's.

Both run in this one process on the same data, model, batches and SGD settings; the plain loop
trains one model over every client's batches with no state swaps, uploads or aggregation. Rounds
and plain passes alternate, so a machine busy with something else slows both alike; the median of
the repeats (after one warm-up each) is compared. The runs train one by one (fl.batch_clients
false): the batched path has its own benchmark.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedfactor.config import load_config
from fedfactor.data.augment import augment_batch
from fedfactor.run.simulator import Simulator

from .common import describe_sets, row, synchronize, timed, write_npz

DESCRIPTION = "FedAvg round vs a plain training loop over the same batches (samples/s ratio)"

BASE = ["fl.clients=20", "fl.epochs=2", "fl.batch_size=32", "fl.lr=0.05", "fl.momentum=0.9",
        "fl.batch_clients=false", "tracking.enabled=false", "data.split=[0.8, 0.1, 0.1]"]


def plain_pass(sim: Simulator, gen: torch.Generator) -> int:
    """The round's SGD steps as a plain loop: one model, one optimizer, every client's batches."""
    model, tr = sim.model, sim.trainer
    opt = torch.optim.SGD(model.parameters(), lr=tr.optim.lr, momentum=tr.optim.momentum)
    model.train()
    samples = 0
    for client in sim.clients:
        split = client["train"]
        for _ in range(sim.cfg.fl.epochs):
            order = torch.randperm(len(split), generator=gen, device=sim.x.device)
            for start in range(0, len(split), tr.batch_size):
                b = order[start : start + tr.batch_size]
                loss = F.cross_entropy(model(augment_batch(sim.x[split.idx[b]], sim.augment, gen)), split.y[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                samples += len(b)
    return samples


def compare(sets: list[str], repeats: int, device: str) -> tuple[float, float, float, int]:
    """(median seconds of a FedAvg round, of the plain pass, of scoring every client; samples a pass)."""
    sim = Simulator(load_config(None, sets))
    gen = torch.Generator(device=sim.x.device).manual_seed(0)
    rounds, plains, evals = [], [], []
    samples = 0
    for rnd in range(1, repeats + 2):
        t_round = timed(lambda: sim.run_round(rnd), device)
        start = time.perf_counter()
        samples = plain_pass(sim, gen)
        synchronize(device)
        t_plain = time.perf_counter() - start
        t_eval = timed(sim.evaluate, device)
        if rnd > 1:  # the first of each warms up allocations and caches
            rounds.append(t_round)
            plains.append(t_plain)
            evals.append(t_eval)
    return statistics.median(rounds), statistics.median(plains), statistics.median(evals), samples


def run(quick: bool, device: str) -> list[dict]:
    repeats = 3 if quick else 9
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            # the default study's CNN on digits (189k weights): 72 samples a client
            "small: cnn on digits 8x8": ["data.name=digits", "model.name=cnn"],
            # the mid model: the same CNN on 16x16 inputs (582k weights), 200 samples a client
            "mid: cnn on 16x16": [f"data.name=npz:{write_npz(Path(tmp) / 'mid.npz', 5000, 0, (16, 16))}",
                                  "model.name=cnn", "data.augment=none"],
        }
        for case, extra in cases.items():
            sets = [*BASE, f"fl.device={device}", *extra]
            t_round, t_plain, t_eval, samples = compare(sets, repeats, device)
            inputs = describe_sets(sets, "5,000 random 16x16 images") + f"; median of {repeats}"
            rows.append(row(f"{case}, plain loop", samples / t_plain, "samples/s", None, None, inputs))
            rows.append(row(f"{case}, FedAvg round", samples / t_round, "samples/s", t_plain / t_round, ">= 0.95",
                            inputs))
            rows.append(row(f"{case}, scoring every client on its test split", 1e3 * t_eval, "ms",
                            t_eval / t_round, None, "ratio: of the round's time; " + inputs))
    return rows
