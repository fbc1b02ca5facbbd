"""Method overhead: the time of one round of each method as a multiple of a FedAvg round.

Every method runs in this one process on the same data, model, clients and seed; rounds of the
methods are interleaved (FedAvg, method 1, method 2, FedAvg, ...) so that a machine busy with
something else slows them alike, and the median over repeats is compared.

    python benchmarks/method_overhead.py [--methods feddecomp feddecomp_simultaneous] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedfactor.config import load_config
from fedfactor.fl.simulator import Simulator

DEFAULTS = ["data.name=digits", "model.name=cnn", "fl.clients=20", "fl.epochs=2", "fl.batch_size=16",
            "fl.lr=0.05", "fl.device=cpu", "tracking.enabled=false"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["feddecomp", "feddecomp_simultaneous"],
                        help="registered names, compared with fedavg (method.<key>=<value> after a colon: "
                             "feddecomp:e_lora=1:style=official)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds timed per method (after one warm-up round)")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="run config override")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sims = {}
    for spec in ["fedavg", *args.methods]:
        name, *params = spec.split(":")
        sims[spec] = Simulator(load_config(None, [*DEFAULTS, *args.sets, f"method.name={name}",
                                                 *(f"method.{p}" for p in params)]))
    times: dict[str, list[float]] = {spec: [] for spec in sims}
    for rnd in range(1, args.repeats + 2):
        for spec, sim in sims.items():
            start = time.perf_counter()
            sim.run_round(rnd)
            if rnd > 1:  # the first round warms up allocations and caches
                times[spec].append(time.perf_counter() - start)
    base = statistics.median(times["fedavg"])
    print(f"inputs: {' '.join(DEFAULTS + args.sets)}; median of {args.repeats} rounds, one thread")
    for spec, ts in times.items():
        med = statistics.median(ts)
        print(f"{spec:45s} {1000 * med:8.1f} ms per round   x{med / base:.2f} of fedavg")


if __name__ == "__main__":
    main()
