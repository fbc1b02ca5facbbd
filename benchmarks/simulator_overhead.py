"""Simulator overhead: FedAvg rounds against a plain training loop doing the same SGD steps.

Both run in this one process on the same data, model and batch size; the plain loop trains one
model over every client's batches with no state swaps, uploads or aggregation. The ratio (simulator
time / plain time) is what the performance pass is meant to bring close to 1.

    python benchmarks/simulator_overhead.py [--set key=value ...]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import torch
import torch.nn.functional as F

from fedfactor.config import load_config
from fedfactor.data.augment import augment_batch
from fedfactor.fl.simulator import Simulator

DEFAULTS = ["data.name=digits", "model.name=cnn", "fl.clients=20", "fl.epochs=1", "fl.batch_size=16",
            "data.split=[0.5, 0.1, 0.4]", "tracking.enabled=false"]


def plain_epoch(sim: Simulator, gen: torch.Generator) -> None:
    model = sim.model
    tr = sim.trainer
    opt = torch.optim.SGD(model.parameters(), lr=tr.optim.lr, momentum=tr.optim.momentum)
    model.train()
    for client in sim.clients:
        split = client["train"]
        order = torch.randperm(len(split), generator=gen, device=sim.x.device)
        for start in range(0, len(split), tr.batch_size):
            b = order[start : start + tr.batch_size]
            loss = F.cross_entropy(model(augment_batch(sim.x[split.idx[b]], sim.augment, gen)), split.y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    sim = Simulator(load_config(None, DEFAULTS + args.overrides))
    gen = torch.Generator(device=sim.x.device).manual_seed(0)
    rounds = iter(range(1, 10**6))
    t_round = timed(lambda: sim.run_round(next(rounds)), args.repeats)
    t_plain = timed(lambda: plain_epoch(sim, gen), args.repeats)
    t_eval = timed(sim.evaluate, args.repeats)
    t_ckpt = timed(lambda: torch.save(sim.state_dict(), io.BytesIO()), args.repeats)
    print(f"device {sim.device}, {sim.cfg.model.name} on {sim.cfg.data.name}, {sim.cfg.fl.clients} clients, "
          f"{sum(len(c['train']) for c in sim.clients)} training samples, median of {args.repeats}")
    print(f"plain training loop, one epoch      {t_plain * 1e3:9.1f} ms")
    print(f"simulator FedAvg round (E=1)       {t_round * 1e3:9.1f} ms   ratio {t_round / t_plain:.2f}")
    print(f"evaluation of every client         {t_eval * 1e3:9.1f} ms   ratio {t_eval / t_plain:.2f}")
    print(f"checkpoint of the whole run         {t_ckpt * 1e3:9.1f} ms   ratio {t_ckpt / t_plain:.2f}"
          " (serialised in memory; the job also writes it out)")


if __name__ == "__main__":
    main()
