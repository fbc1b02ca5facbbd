"""What the benchmarks share: result rows, CUDA clocks, npz datasets of a given size, run settings."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch


def row(case: str, value: float, unit: str, ratio: float | None = None, target: str | None = None,
        inputs: str = "") -> dict[str, Any]:
    """One result row as the runner prints and saves it."""
    return {"case": case, "value": float(value), "unit": unit, "ratio": None if ratio is None else float(ratio),
            "target": target, "inputs": inputs}


def synchronize(device: str) -> None:
    """Wait for queued CUDA work, so that a clock read after it measures the work, not its launch."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def write_npz(path: Path, n_train: int, n_test: int, shape: tuple[int, ...] = (8, 8), classes: int = 10,
              seed: int = 0) -> Path:
    """An npz dataset (see fedfactor.data.npz) of n_train + n_test images, every class equally often.

    A class is a random template plus noise, as synthetic:NAME builds it, so training sees a falling
    loss; the values do not matter for timing. x_test is the official test part, so that
    `data.split_mode=official` keeps exactly n_train samples for training. n_test = 0 leaves the test
    part out (the pooled split mode then cuts all samples).
    """
    rng = np.random.default_rng(seed)
    # half a template plus up to 127 of noise stays within uint8: no float copy of a large set
    templates = rng.integers(0, 256, size=(classes, *shape), dtype=np.uint8) // 2

    def images(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % classes
        return templates[y] + rng.integers(0, 128, size=(n, *shape), dtype=np.uint8), y.astype(np.int64)

    x, y = images(n_train)
    test = dict(zip(("x_test", "y_test"), images(n_test))) if n_test else {}
    np.savez(path, x=x, y=y, **test)
    return path


def client_sets(npz: Path, clients: int, train: int, test: int, device: str, epochs: int = 1, model: str = "cnn",
                batch_size: int = 10) -> list[str]:
    """Run-config overrides giving each of `clients` clients exactly `train` training and `test` test samples.

    dirichlet_fixed draws samples_per_client per client; without overlap the clients are disjoint, so
    with clients x train = the npz's training samples every sample is used exactly once; a huge alpha
    makes every client's class mix near uniform.
    """
    return [f"data.name=npz:{npz}", "data.split=[1.0, 0.0, 0.0]", "data.split_mode=official",
            "partition.kind=dirichlet_fixed", "partition.alpha=1000", "partition.overlap=false",
            f"partition.samples_per_client={{train: {train}, val: 0, test: {test}}}", f"fl.clients={clients}",
            f"model.name={model}", f"fl.epochs={epochs}", f"fl.batch_size={batch_size}", "fl.lr=0.05", "fl.rounds=2",
            "eval.test_pool=client", f"fl.device={device}", "tracking.enabled=false"]


def describe_sets(sets: list[str], npz_note: str) -> str:
    """The overrides as `--set` arguments, the temporary npz path replaced by what it holds."""
    shown = [f"data.name=npz:<{npz_note}>" if s.startswith("data.name=npz:") else s for s in sets]
    return shlex.join(a for s in shown for a in ("--set", s))


def timed(fn: Callable[[], Any], device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start
