"""Heatmaps of a run's similarity diagnostics, like Figure 7 of the Factorized-FL paper.

Rows: the cosine similarity between clients of u^{L-1}, of v^{L-1} and of SimFed's embeddings z,
whichever the run logged; columns: a few rounds; plus a panel with how often each client mixed in
each other client. Reads OUT/diagnostics/<name>/round_NNNN.npy, which a run writes as it goes, so
a run still in progress can be drawn too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..report.figures import DatasetKey, decorate, is_synthetic, pyplot, save_figure
from ..report.runs import read_summary

SIMILARITIES = {"similarity_u": "$u^{L-1}$", "similarity_v": "$v^{L-1}$", "similarity_z": "$z$"}
COUNTS = "matching_counts"
_ROUND_FILE = re.compile(r"round_(\d+)\.npy")  # fullmatch: leaves out the writer's .tmp files


@dataclass
class Similarity:
    """What a run's similarity diagnostics hold at the chosen rounds, loaded and checked."""

    run_dir: Path
    rows: list[str]  # the similarity names, in SIMILARITIES' order
    rounds: list[int]  # the columns
    matrices: dict[tuple[str, int], np.ndarray]  # (name, round) -> K x K
    counts: np.ndarray | None  # matching counts after counts_round (cumulative), K x K
    counts_round: int | None
    clients: int


def logged(run_dir: str | Path, name: str) -> bool:
    """Whether `run_dir` has a round file of the diagnostic `name` (without reading or checking it)."""
    folder = Path(run_dir) / "diagnostics" / name
    return folder.is_dir() and any(_ROUND_FILE.fullmatch(p.name) for p in folder.iterdir())


def has_similarity(run_dir: str | Path) -> bool:
    """Whether `run_dir` logged any client similarity."""
    return any(logged(run_dir, name) for name in SIMILARITIES)


def load_similarity(run_dir: str | Path, rounds: list[int] | None = None) -> Similarity:
    """The similarity matrices of `run_dir` at `rounds` (default: first, middle, last) and its last
    matching counts, checked; every problem is one UsageError naming the file."""
    run_dir = Path(run_dir)
    available = available_rounds(run_dir)
    rows = [name for name in SIMILARITIES if name in available]
    if not rows:
        raise UsageError(f"{run_dir / 'diagnostics'} holds none of {', '.join(SIMILARITIES)}; "
                         "run a method that logs client similarities (Factorized-FL, SimFed)")
    columns = _pick_rounds(run_dir, available, rows, rounds)
    counts_round = max(available[COUNTS]) if COUNTS in available else None

    matrices = {(name, r): load_matrix(run_dir, name, r) for name in rows for r in columns}
    counts = load_matrix(run_dir, COUNTS, counts_round) if counts_round is not None else None
    sizes = {m.shape[0] for m in matrices.values()} | ({counts.shape[0]} if counts is not None else set())
    if len(sizes) > 1:
        raise UsageError(f"the diagnostics of {run_dir} disagree on the number of clients "
                         f"({', '.join(map(str, sorted(sizes)))}); they come from different runs: re-run it")
    if counts is not None and not (np.isfinite(counts).all() and (counts >= 0).all()
                                   and (counts == np.round(counts)).all()):
        assert counts_round is not None  # counts were read from it
        raise UsageError(f"{_path(run_dir, COUNTS, counts_round)} holds something other than counts "
                         "(whole numbers >= 0); the file is damaged: re-run the run")
    return Similarity(run_dir, rows, columns, matrices, counts, counts_round, sizes.pop())


def similarity_heatmaps(run_dir: str | Path, out_png: str | Path, rounds: list[int] | None = None,
                        title: str = "", smoke: bool = False) -> dict:
    """Draw the similarity matrices of `run_dir` at `rounds` (default: first, middle, last) to
    `out_png` and its .pdf twin. A run on synthetic data, or `smoke`, marks the figure a smoke run.

    Returns what was drawn: {"rows": names, "rounds": rounds, "counts_round": round or None,
    "clients": K}.
    """
    sim = load_similarity(run_dir, rounds)
    run_title, synthetic = _run_info(sim.run_dir)
    _draw(sim, out_png, title or run_title, smoke or synthetic)
    return {"rows": sim.rows, "rounds": sim.rounds, "counts_round": sim.counts_round, "clients": sim.clients}


def available_rounds(run_dir: Path) -> dict[str, list[int]]:
    """The sorted rounds each diagnostic name has files for (names without any are left out)."""
    folder = run_dir / "diagnostics"
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a folder; pass the --out folder of a run")
    if not folder.is_dir():
        raise UsageError(f"{run_dir} has no diagnostics folder; pass the --out folder of a run of a method "
                         "that logs client similarities (Factorized-FL, SimFed)")
    found = {}
    for name in (*SIMILARITIES, COUNTS):
        sub = folder / name
        numbers = sorted(int(m.group(1)) for p in (sub.iterdir() if sub.is_dir() else [])
                         if (m := _ROUND_FILE.fullmatch(p.name)))
        if numbers:
            found[name] = numbers
    return found


def _pick_rounds(run_dir: Path, available: dict[str, list[int]], rows: list[str],
                 rounds: list[int] | None) -> list[int]:
    if rounds is not None:
        rounds = list(dict.fromkeys(rounds))
        if not rounds:
            raise UsageError("no round given; pass at least one round, e.g. --rounds 1,50,100")
        for name in rows:
            missing = [r for r in rounds if r not in available[name]]
            if missing:
                raise UsageError(f"{run_dir} has no {name} for round {', '.join(map(str, missing))}; "
                                 f"its rounds are {_spans(available[name])}")
        return rounds
    # Every column shows the same round in every row, so only rounds all rows have qualify.
    common = sorted(set.intersection(*(set(available[name]) for name in rows)))
    if not common:
        have = "; ".join(f"{name}: rounds {_spans(available[name])}" for name in rows)
        raise UsageError(f"the similarity diagnostics of {run_dir} share no round ({have}); "
                         "the run logged them at different rounds: re-run it")
    return list(dict.fromkeys([common[0], common[(len(common) - 1) // 2], common[-1]]))


def _spans(numbers: list[int]) -> str:
    """1,2,3,5,7,8 -> "1-3, 5, 7-8": a run's rounds in a message of one readable line."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _path(run_dir: Path, name: str, r: int) -> Path:
    return run_dir / "diagnostics" / name / f"round_{r:04d}.npy"


def load_matrix(run_dir: Path, name: str, r: int) -> np.ndarray:
    path = _path(run_dir, name, r)
    fix = "the file is damaged or was not written by fedfactor: re-run the run"
    try:
        m = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:  # ValueError: not an .npy file, or a truncated one
        raise UsageError(f"cannot read {path} ({' '.join(str(e).split())}); {fix}") from None
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise UsageError(f"{path} holds an array of shape {m.shape}, not a square clients x clients matrix; {fix}")
    if m.dtype.kind not in "biuf":  # complex numbers would lose their imaginary part unnoticed
        raise UsageError(f"{path} holds {m.dtype} values, not real numbers; {fix}")
    m = m.astype(float)
    # NaN marks a client that has not uploaded yet; a cosine similarity lies in -1..1 (up to rounding)
    if name in SIMILARITIES and not (np.isnan(m) | (np.abs(m) <= 1 + 1e-6)).all():
        raise UsageError(f"{path} holds values outside -1..1, not cosine similarities; {fix}")
    return m


def _run_info(run_dir: Path) -> tuple[str, bool]:
    """The run's default title and whether it trained on synthetic data."""
    # summary.json appears only when a run finishes, and a figure of an unfinished or oddly
    # ended run is still worth drawing: without a readable summary there is just no title.
    try:
        run = read_summary(run_dir / "summary.json", DatasetKey)
    except UsageError:
        return "", False
    return f"{run.scenario} / {run.method} / seed {run.seed}", is_synthetic(run.dataset)


def heatmap(ax, m: np.ndarray, cmap, vmin: float, vmax: float):
    """A clients x clients matrix with clients numbered 1..K on both axes; returns the image."""
    from matplotlib.ticker import MaxNLocator

    k = m.shape[0]
    # extent puts pixel centres at client numbers 1..K, so integer ticks label clients
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest",
                   extent=(0.5, k + 0.5, k + 0.5, 0.5))
    for axis in (ax.xaxis, ax.yaxis):
        if k <= 10:
            axis.set_ticks(range(1, k + 1))
        else:  # every client number would be unreadable
            axis.set_major_locator(MaxNLocator(integer=True, nbins=6))
    return im


def similarity_cmap():
    """Diverging, grey where a client had not uploaded yet (NaN)."""
    return pyplot().get_cmap("RdBu_r").with_extremes(bad="lightgrey")


def _draw(sim: Similarity, out_png, title: str, smoke: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    rows, columns, counts = sim.rows, sim.rounds, sim.counts
    n_cols = len(columns) + (counts is not None)
    fig, axes = plt.subplots(len(rows), n_cols, figsize=(3.2 * n_cols + 1, 3.3 * len(rows) + 0.5),
                             squeeze=False, layout="constrained")
    for i, name in enumerate(rows):
        for j, r in enumerate(columns):
            ax = axes[i, j]
            im = heatmap(ax, sim.matrices[name, r], similarity_cmap(), -1, 1)
            ax.set_title(f"{SIMILARITIES[name]}, round {r}", fontsize="medium")
            ax.set_xlabel("client")
            ax.set_ylabel("client")
    fig.colorbar(im, ax=axes[:, :len(columns)].ravel().tolist(), label="cosine similarity", shrink=0.8)

    if counts is not None:
        ax = axes[0, -1]
        im = heatmap(ax, counts, "viridis", 0, max(counts.max(), 1))
        ax.set_title(f"matching counts after round {sim.counts_round}", fontsize="medium")
        ax.set_xlabel("client mixed in")
        ax.set_ylabel("client")
        fig.colorbar(im, ax=ax, label="rounds", shrink=0.8, ticks=MaxNLocator(integer=True))
        for ax in axes[1:, -1]:
            ax.set_visible(False)
    decorate(fig, title, smoke)
    save_figure(fig, out_png)
