"""Batched clients: FedAvg rounds with the round's clients trained as one vmapped computation
(fl.batch_clients true) against one by one (false), and `auto`.

Three simulators with the same config train the same clients from the same random streams; their
rounds alternate and the medians after one warm-up round are compared. ratio = samples/s batched /
samples/s one by one.
"""

from __future__ import annotations

import statistics
import time

from fedfactor.config import load_config
from fedfactor.run.simulator import Simulator

from .common import describe_sets, row, synchronize

DESCRIPTION = "clients trained as one vmapped batch vs one by one (FedAvg rounds, samples/s)"

BASE = ["fl.clients=20", "fl.epochs=2", "fl.batch_size=16", "fl.lr=0.05", "fl.momentum=0.9",
        "tracking.enabled=false", "data.split=[0.8, 0.1, 0.1]", "data.name=digits"]


def _round_times(sims: dict[str, Simulator], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in sims}
    for rnd in range(1, repeats + 2):
        for name, sim in sims.items():
            start = time.perf_counter()
            sim.run_round(rnd)
            synchronize(str(sim.device))
            if rnd > 1:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def run(quick: bool, device: str) -> list[dict]:
    repeats = 3 if quick else 7
    cases = {"mlp, iid": ["model.name=mlp", "partition.kind=iid"],
             "mlp, dirichlet 0.5 (unequal sizes)": ["model.name=mlp", "partition.kind=dirichlet",
                                                    "partition.alpha=0.5"],
             "cnn, iid": ["model.name=cnn", "partition.kind=iid"]}
    rows = []
    for case, extra in cases.items():
        sets = [*BASE, f"fl.device={device}", *extra]
        sims = {mode: Simulator(load_config(None, [*sets, f"fl.batch_clients={mode}"]))
                for mode in ("false", "true", "auto")}
        samples = sum(len(c["train"]) for c in sims["false"].clients) * sims["false"].cfg.fl.epochs
        t = _round_times(sims, repeats)
        inputs = describe_sets(sets, "") + f"; median of {repeats}"
        rows.append(row(f"{case}: one by one", samples / t["false"], "samples/s", None, None, inputs))
        on_gpu = sims["false"].device.type == "cuda"
        rows.append(row(f"{case}: batched", samples / t["true"], "samples/s", t["false"] / t["true"],
                        ">= 3" if on_gpu and case.startswith("cnn") else None, inputs))
        # `auto` must never lose to one by one (within the noise of a shared machine)
        rows.append(row(f"{case}: auto", samples / t["auto"], "samples/s", t["false"] / t["auto"], ">= 0.95", inputs))
    return rows
