"""CUDA throughput: a FedAvg round against a plain PyTorch training loop over the same batches, and
the time of one round of Factorized-FL's Table 1 setting.

(1) resnet9 on CIFAR-shaped images (an npz of random 32x32x3 images, crop+flip augmentation),
    20 clients, batch 64, E = 1: images per second of a FedAvg round and of a plain loop that
    trains one model over every client's batches (no state swaps, uploads or aggregation; as
    benchmarks/simulator_overhead.py's plain_epoch), for float32, `fl.precision=bf16` (bf16
    autocast), `fl.channels_last=true` and both; ratio = simulator / plain. The plain loop uses the
    same precision and memory format.
(2) config/runs/factorized_fl.yaml (resnet9, 20 clients, E = 5, batch 256) on 60,000 random
    CIFAR-shaped images cut 80/10/10 as the paper's CIFAR-10 (supplement B.1: 48,000 train, so
    2,400 per client): seconds of one round of FedAvg and of Factorized-FL alpha and beta after a
    warm-up round. Quick: 6,000 images (240 per client).

Without a CUDA device the benchmark returns one row, case "skipped". CUDA is synchronised before
every clock read.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .common import client_sets, describe_sets, one_line, row, timed, write_npz

DESCRIPTION = ("CUDA: images/s of a FedAvg round vs a plain PyTorch loop (resnet9, CIFAR-shaped, 20 clients, "
               "batch 64) in float32 / bf16 / channels_last; one round of the Factorized-FL Table 1 setting")

VARIANTS = {
    "float32": [],
    "bf16": ["fl.precision=bf16"],
    "channels_last": ["fl.channels_last=true"],
    "bf16+channels_last": ["fl.precision=bf16", "fl.channels_last=true"],
}
CLIENTS = 20
FACTORIZED_FL = "config/runs/factorized_fl.yaml"
ROOT = Path(__file__).resolve().parent.parent


def release(device: str) -> None:
    """Hand the previous setting's cached blocks back, so that each setting starts from the same pool."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def plain_epoch(sim: Any, gen: torch.Generator, precision: str, channels_last: bool) -> None:
    """One epoch over every client's batches on one model: what the simulator's round does, minus the
    federated bookkeeping."""
    from fedfactor.data.augment import augment_batch

    model, tr, fl = sim.model, sim.trainer, sim.cfg.fl
    opt = torch.optim.SGD(model.parameters(), lr=fl.lr, momentum=fl.momentum, weight_decay=fl.weight_decay)
    autocast = (torch.autocast(sim.x.device.type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    model.train()
    for client in sim.clients:
        split = client["train"]
        order = torch.randperm(len(split), generator=gen, device=sim.x.device)
        for start in range(0, len(split), tr.batch_size):
            b = order[start : start + tr.batch_size]
            if len(b) == 1:  # BatchNorm cannot train on one sample; the simulator skips it too
                continue
            x = augment_batch(sim.x[split.idx[b]], sim.augment, gen)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with autocast:
                loss = F.cross_entropy(model(x), split.y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def throughput(sets: list[str], repeats: int, device: str) -> tuple[float, float, int]:
    """(simulator images/s, plain images/s, images per round) under one config, medians after a warm-up."""
    from fedfactor.config import load_config
    from fedfactor.run.simulator import Simulator

    cfg = load_config(None, sets)
    sim = Simulator(cfg)
    images = sum(len(c["train"]) for c in sim.clients) * cfg.fl.epochs
    rounds = itertools.count(1)
    sim.run_round(next(rounds))  # warm-up: cuDNN's algorithm search, the caching allocator
    t_sim = statistics.median(timed(lambda: sim.run_round(next(rounds)), device) for _ in range(repeats))
    gen = torch.Generator(device=sim.x.device).manual_seed(0)
    precision = getattr(cfg.fl, "precision", "float32")
    channels_last = getattr(cfg.fl, "channels_last", False)
    plain_epoch(sim, gen, precision, channels_last)  # warm-up
    t_plain = statistics.median(timed(lambda: plain_epoch(sim, gen, precision, channels_last), device)
                                for _ in range(repeats))
    return images / t_sim, images / t_plain, images


def variant_rows(npz: Path, note: str, per_client: int, repeats: int, device: str) -> list[dict]:
    """Simulator and plain loop under each variant; the npz holds CLIENTS x per_client training images
    and CLIENTS x 10 test images (every client gets exactly its share: benchmarks/clients.py)."""
    rows = []
    base = [*client_sets(npz, CLIENTS, per_client, 10, device, model="resnet9", batch_size=64),
            "data.augment=crop_flip", "method.name=fedavg"]
    for name, extra in VARIANTS.items():
        sets = base + extra
        inputs = describe_sets(sets, note) + f"; median of {repeats} after a warm-up"
        try:
            sim_ips, plain_ips, images = throughput(sets, repeats, device)
        except Exception as e:  # a key FLConfig does not have yet fails this variant only
            rows.append(row(f"{name}: simulator", float("nan"), "images/s", None, None,
                            f"cannot run: {one_line(e)}; {inputs}"))
            continue
        finally:
            release(device)
        rows.append(row(f"{name}: simulator", sim_ips, "images/s", sim_ips / plain_ips, None,
                        f"{images} images a round; ratio = simulator / plain loop; {inputs}"))
        rows.append(row(f"{name}: plain loop", plain_ips, "images/s", None, None,
                        f"{images} images a round; ratio = simulator / plain loop; {inputs}"))
    return rows


def table1_rows(npz: Path, note: str, device: str) -> list[dict]:
    """One round (after a warm-up round) of Factorized-FL Table 1's setting, FedAvg and alpha, beta."""
    import yaml

    from fedfactor.config import load_config
    from fedfactor.run.simulator import Simulator
    from fedfactor.study.workflow import method_sets

    study = yaml.safe_load((ROOT / "config/studies/factorized_fl_label.yaml").read_text())
    rows, base = [], None
    for label in ("fedavg", "factorized_fl_alpha", "factorized_fl_beta"):
        sets = [*method_sets(study["methods"][label], label), f"data.name=npz:{npz}", "data.download=false",
                f"fl.device={device}", "tracking.enabled=false"]
        inputs = f"--config {FACTORIZED_FL} " + describe_sets(sets, note)
        case = f"factorized_fl table 1 round: {label}"
        try:
            sim = Simulator(load_config(ROOT / FACTORIZED_FL, sets))
            sim.run_round(1)  # warm-up
            run_round = sim.run_round
            seconds = timed(lambda: run_round(2), device)
            images = sum(len(c["train"]) for c in sim.clients) * sim.cfg.fl.epochs
            del sim
        except Exception as e:
            rows.append(row(case, float("nan"), "s/round", None, None, f"cannot run: {one_line(e)}; {inputs}"))
            continue
        finally:
            release(device)
        base = seconds if label == "fedavg" else base
        ratio = None if label == "fedavg" or base is None else seconds / base
        rows.append(row(case, seconds, "s/round", ratio, None,
                        f"{images / seconds:.0f} images/s, {images} images a round; ratio = method / fedavg; {inputs}"))
    return rows


def run(quick: bool, device: str) -> list[dict]:
    if not torch.cuda.is_available():
        return [row("skipped", float("nan"), "", None, None, "no CUDA device")]
    # This benchmark is about the GPU: it runs there even when the others were asked to run on the CPU.
    device = device if device.startswith("cuda") else "cuda"
    repeats = 2 if quick else 5
    per_client = 128 if quick else 640
    table1_images = 6_000 if quick else 60_000
    with tempfile.TemporaryDirectory() as tmp:
        n = CLIENTS * per_client
        npz = write_npz(Path(tmp) / "cifar_shaped.npz", n_train=n, n_test=10 * CLIENTS, shape=(3, 32, 32))
        rows = variant_rows(npz, f"{n} train + {10 * CLIENTS} test random 3x32x32 images "
                                 "(benchmarks/clients.py write_npz)", per_client, repeats, device)
        npz = write_npz(Path(tmp) / "table1.npz", n_train=table1_images, n_test=0, shape=(3, 32, 32))
        rows += table1_rows(npz, f"{table1_images} random 3x32x32 images, 10 classes, cut 80/10/10 "
                                 f"(benchmarks/clients.py write_npz)", device)
    return rows
