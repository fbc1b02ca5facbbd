"""The simulation itself: the decompositions' masks, every setting x seed trained, and `simulate`.

Each decomposition of the student's hidden layer (true, oracle, static, dynamic, random, ...: see the
package docstring) starts from one warm-up state and sees the same participants each round, so only
its mask differs; `simulate` runs the grid and writes the tables and figures (`results`).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..errors import UsageError
from ..analysis.factor import FAMethod, factor_analysis, split, unit_matrix
from .config import SimulationConfig, settings_of
from .results import figure6, figure7, summary_markdown
from .student import accuracy, aggregate, init_mlp, local_train
from .teacher import generate


def fa_mask(weights: torch.Tensor, tau: Any, p: float, kappa: float, method: FAMethod) -> torch.Tensor:
    """Shared mask from a factor analysis of K clients' weights (K x m x d): nu_j >= tau."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # eigh of an m x m matrix: one thread is 4x faster than two, and far more under load
    try:
        fa = factor_analysis(unit_matrix(weights), kappa=kappa, method=method)
    finally:
        torch.set_num_threads(threads)
    nu = fa.communalities.cpu()
    if tau != "share":
        return split(nu, tau)
    # nu >= its (1 - p) quantile, i.e. the m2 = round(p * m) largest; ties (Heywood communalities
    # clipped to 1) would let the quantile rule pick more, so they are broken by unit index
    mask = torch.zeros(nu.numel(), dtype=torch.bool)
    mask[torch.argsort(nu, descending=True, stable=True)[:round(p * nu.numel())]] = True
    return mask


def random_mask(m: int, m2: int, generator: torch.Generator) -> torch.Tensor:
    mask = torch.zeros(m, dtype=torch.bool)
    mask[torch.randperm(m, generator=generator)[:m2]] = True
    return mask


def _seed(*parts: float | int | str) -> int:
    """A 63-bit seed from the seed, the setting and a purpose, independent of the grid's other settings."""
    key = [int(x) if isinstance(x, int) else (round(x * 1e6) if isinstance(x, float) else sum(map(ord, x)))
           for x in parts]
    return int(np.random.SeedSequence(key).generate_state(2, np.uint64)[0] >> np.uint64(1))


def _gen(*parts) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*parts))


def run_setting(cfg: SimulationConfig, p: float, alpha: float, seed: int,
                decompositions: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    """Train every decomposition on one setting and seed; per decomposition, per round 0..R:
    accuracy (mean over clients), stability (share of units in the same state as the round
    before; NaN at round 0), agreement (with the true mask), n_shared."""
    dc, tc, sc = cfg.data, cfg.train, cfg.split
    data = generate(dc.clients, dc.d, dc.m, p, alpha, dc.train_samples, dc.test_samples, dc.noise,
                    dc.label_threshold, _gen(seed, p, alpha, "data"))
    C, m = dc.clients, dc.m
    m2 = int(data.shared.sum())
    start = init_mlp(C, m, dc.d, _gen(seed, p, alpha, "init"))
    local_train(start, data.x_train, data.y_train, tc.lr, tc.warmup_steps)
    n_samples = torch.full((C,), float(dc.train_samples))
    fixed: dict[str, torch.Tensor] = {"true": data.shared, "all_shared": torch.ones(m, dtype=torch.bool),
                                      "all_personal": torch.zeros(m, dtype=torch.bool)}
    todo = list(decompositions or cfg.decompositions)
    if "oracle" in todo:
        fixed["oracle"] = fa_mask(data.weights, sc.tau, p, sc.kappa, sc.method)
    if "static" in todo or "dynamic" in todo:
        fixed["static"] = fa_mask(start.W, sc.tau, p, sc.kappa, sc.method)
    k = max(1, round(tc.fraction * C))
    out = {}
    for name in todo:
        model = start.clone()
        part_gen = _gen(seed, p, alpha, "participants")  # the same participants for every decomposition
        rand_gen = _gen(seed, p, alpha, "random")
        redraw = name == "random" and sc.random == "round"
        if name in ("random", "random_fixed"):
            mask = random_mask(m, m2, rand_gen)
        else:  # dynamic starts from static's mask (Algorithm 2's initialisation)
            mask = fixed["static" if name == "dynamic" else name]
        hist: dict[str, list[float]] = {
            "accuracy": [float(accuracy(model, data.x_test, data.y_test).mean())], "stability": [math.nan],
            "agreement": [float((mask == data.shared).float().mean())], "n_shared": [int(mask.sum())],
            "train_loss": [math.nan]}
        for _ in range(tc.rounds):
            if k == C:
                participants = torch.ones(C, dtype=torch.bool)
            else:
                participants = torch.zeros(C, dtype=torch.bool)
                participants[torch.randperm(C, generator=part_gen)[:k]] = True
            loss = local_train(model, data.x_train, data.y_train, tc.lr, tc.local_steps, participants)
            previous = mask
            if name == "dynamic":
                mask = fa_mask(model.W[participants], sc.tau, p, sc.kappa, sc.method)
            elif redraw:
                mask = random_mask(m, m2, rand_gen)
            aggregate(model, mask, participants, n_samples)
            hist["accuracy"].append(float(accuracy(model, data.x_test, data.y_test).mean()))
            hist["stability"].append(float((mask == previous).float().mean()))
            hist["agreement"].append(float((mask == data.shared).float().mean()))
            hist["n_shared"].append(int(mask.sum()))
            hist["train_loss"].append(float(loss[participants].mean()))
        out[name] = hist
    return out


# ------------------------------------------------------------------------------------------ study


def run_study(cfg: SimulationConfig, progress: Callable[[str], None] | None = None):
    """Every setting x seed; returns (per-run summary rows, per-round rows) as DataFrames."""
    import pandas as pd

    rows, rounds = [], []
    for p, alpha in settings_of(cfg):
        for seed in cfg.seeds:
            t0 = time.perf_counter()
            result = run_setting(cfg, p, alpha, seed)
            for name, h in result.items():
                rows.append({"p": p, "alpha": alpha, "decomposition": name, "seed": seed,
                             "final_accuracy": h["accuracy"][-1], "best_accuracy": max(h["accuracy"][1:]),
                             "agreement": h["agreement"][-1], "stability": h["stability"][-1],
                             "n_shared": h["n_shared"][-1]})
                for r in range(len(h["accuracy"])):
                    rounds.append({"p": p, "alpha": alpha, "decomposition": name, "seed": seed, "round": r,
                                   **{k: h[k][r] for k in ("accuracy", "stability", "agreement", "n_shared",
                                                           "train_loss")}})
            if progress:
                accs = ", ".join(f"{n} {100 * h['accuracy'][-1]:.1f}" for n, h in result.items())
                progress(f"p = {p:g}, alpha = {alpha:g}, seed {seed}: final accuracy % {accs} "
                         f"({time.perf_counter() - t0:.1f} s)")
    return pd.DataFrame(rows), pd.DataFrame(rounds)


def simulate(cfg: SimulationConfig, out: str | Path, progress: Callable[[str], None] | None = None) -> str:
    """Run the study and write OUT/simulation.csv, rounds.csv, simulation.md (and .html, for the
    workflow's report), figure6.png, figure7.png (each figure with a .pdf twin)."""
    import html

    from ..io import atomic_write_text

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a folder")
    say = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    runs, rounds = run_study(cfg, say)
    seconds = time.perf_counter() - t0
    md = summary_markdown(cfg, runs, seconds)
    atomic_write_text(out / "simulation.csv", runs.to_csv(index=False))
    atomic_write_text(out / "rounds.csv", rounds.to_csv(index=False))
    figure6(cfg, rounds, out / "figure6.png")
    figure7(cfg, rounds, out / "figure7.png")
    atomic_write_text(out / "simulation.html", "<!DOCTYPE html><html><head><meta charset='utf-8'><title>FedFac "
                      f"simulation</title></head><body><pre>{html.escape(md)}</pre></body></html>\n")
    atomic_write_text(out / "simulation.md", md)
    return md
