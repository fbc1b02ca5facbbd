"""Figures from run outputs: accuracy against rounds, and the pieces every figure of fedfactor shares.

Every figure is written twice, as PNG (to look at) and PDF (for a paper), by `save_figure`. A figure
drawn from runs on synthetic data (a smoke run: its summary's dataset starts with "synthetic:")
carries the title SMOKE_TITLE and a diagonal watermark (`decorate`), so it cannot pass for a result,
and is written as PNG only: it is for no paper, and the PDF's font embedding is over half of a
figure's time.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence, cast

import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_bytes
from .runs import RunKey, find_summaries, read_summary

if TYPE_CHECKING:
    from matplotlib.colors import ListedColormap

SMOKE_TITLE = "SMOKE RUN on synthetic data — not results"
WATERMARK = "SMOKE RUN\nsynthetic data"
WATERMARK_GID = "fedfactor-smoke-watermark"  # the watermark's artist id, for tests and viewers
SYNTHETIC_PREFIX = "synthetic:"
_PNG_DPI = 150


class DatasetKey(RunKey):
    """A run's name and the dataset it trained on (absent in summaries of older fedfactors)."""

    dataset: str | None = None


def is_synthetic(dataset: Any) -> bool:
    """True for the dataset name of a smoke run on generated data."""
    return isinstance(dataset, str) and dataset.startswith(SYNTHETIC_PREFIX)


# -- drawing helpers ------------------------------------------------------------------------------


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_title(title: str, smoke: bool) -> str:
    """`title`, led by SMOKE_TITLE for a figure of a smoke run."""
    if not smoke or title.startswith(SMOKE_TITLE):  # the workflow's titles may carry it already
        return title
    return f"{SMOKE_TITLE}: {title}" if title else SMOKE_TITLE


def decorate(fig, title: str, smoke: bool = False) -> None:
    """The figure's title and, for a smoke run, SMOKE_TITLE before it and a diagonal watermark."""
    text = figure_title(title, smoke)
    if text:
        fig.suptitle(text, color="firebrick" if smoke else None, fontweight="bold" if smoke else None, wrap=True)
    if smoke:
        width, height = fig.get_size_inches()
        fig.text(0.5, 0.5, WATERMARK, transform=fig.transFigure, ha="center", va="center",
                 rotation=30, fontsize=max(24.0, 10 * min(width, height)), fontweight="bold",
                 color="firebrick", alpha=0.22, zorder=1000, gid=WATERMARK_GID)


def is_watermarked(fig) -> bool:
    """Whether `decorate` marked `fig` as a smoke run's."""
    return any(t.get_gid() == WATERMARK_GID for t in fig.texts)


def method_styles(methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A distinct colour and line style per method, the same in every figure of one call.

    Up to 10 methods: tab10. More: tab20's strong colours first, then their light partners, then
    tab20b's; past those the colours repeat with dashed, then dotted lines.
    """
    import matplotlib

    def colors(name: str) -> tuple[tuple[float, float, float], ...]:
        # the qualitative maps are ListedColormaps of RGB tuples; the stubs type both more loosely
        cmap = cast("ListedColormap", matplotlib.colormaps[name])
        return cast(tuple[tuple[float, float, float], ...], cmap.colors)

    if len(methods) <= 10:
        palette = list(colors("tab10"))
    else:
        t20, t20b = colors("tab20"), colors("tab20b")
        palette = list(t20[0::2]) + list(t20[1::2]) + list(t20b[0::4]) + list(t20b[2::4])
    lines = ["-", "--", ":", "-."]
    return {m: {"color": palette[i % len(palette)], "linestyle": lines[(i // len(palette)) % len(lines)]}
            for i, m in enumerate(methods)}


def legend_outside(fig, axes: Iterable, title: str | None = None, where: str = "right") -> None:
    """One legend for all `axes`, outside them (right or below), in columns for many entries.

    The figure must use the constrained layout; it is widened (or made taller) to make room, and
    made tall enough that a legend on the right clears the figure's title.
    """
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if not entries:
        return
    n = len(entries)
    small = n > 12
    longest = max(len(label) for label in entries)
    width, height = fig.get_size_inches()
    if where == "right":
        ncols = -(-n // 18)
        rows = -(-n // ncols) + (title is not None)
        # centred beside the panels, with a title's height free above it
        height = max(height, rows * (0.18 if small else 0.22) + 1.2)
        fig.set_size_inches(width + ncols * (0.7 + (0.055 if small else 0.068) * longest), height)
        loc = "outside right center"
    else:
        ncols = max(1, min(n, int(width // (0.7 + 0.068 * longest))))
        fig.set_size_inches(width, height + 0.25 * -(-n // ncols) + 0.3)
        loc = "outside lower center"
    fig.legend(list(entries.values()), list(entries), loc=loc, ncols=ncols, fontsize="x-small" if small else "small",
               title=title, title_fontsize="small", frameon=False)


def save_figure(fig, path: str | Path, pdf: bool = True) -> list[Path]:
    """Write `fig` to `path` (.png) and, unless `pdf` is false or the figure is a smoke run's
    (watermarked by `decorate`), to a .pdf of the same stem beside it, each atomically, and close it;
    a .pdf left beside it by an earlier drawing is then removed, so the two never disagree.
    Returns the files written; the PNG and PDF carry the figure's title as metadata."""
    plt = pyplot()
    path = Path(path)
    try:
        if path.suffix.lower() not in (".png", ".pdf"):
            raise UsageError(f"{path}: a figure's file name must end in .png (a .pdf twin is written beside it)")
        title = fig.get_suptitle()
        data = {path.with_suffix(".png"): _render(fig, "png", {"Title": title} if title else {})}
        if pdf and not is_watermarked(fig):  # no date: same runs, same file
            data[path.with_suffix(".pdf")] = _render(fig, "pdf", {"Title": title, "CreationDate": None})
    finally:
        plt.close(fig)
    for target, content in data.items():
        atomic_write_bytes(target, content)
    if path.with_suffix(".pdf") not in data:
        path.with_suffix(".pdf").unlink(missing_ok=True)
    return list(data)


def _render(fig, fmt: str, metadata: dict) -> bytes:
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"pdf.fonttype": 42}):  # TrueType, not Type 3: what publishers ask for
        fig.savefig(buf, format=fmt, dpi=_PNG_DPI, metadata=metadata)
    return buf.getvalue()


def panel_grid(n: int, width: float = 4.2, height: float = 3.2, cols: int = 3, **kw):
    """(plt, fig, axes) with n panels in rows of at most `cols`, constrained layout; unused panels hidden."""
    plt = pyplot()
    cols = max(1, min(n, cols))
    rows = max(1, -(-n // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained", **kw)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return plt, fig, axes


# -- run outputs ----------------------------------------------------------------------------------


def load_curves(paths: list[str | Path]) -> pd.DataFrame:
    """Every run's metrics.csv, tagged with the scenario, method, seed and dataset of its summary.json."""
    frames = []
    for s in find_summaries(paths):
        run = read_summary(s, DatasetKey)
        frames.append(_read_metrics(s.parent / "metrics.csv").assign(
            scenario=run.scenario, method=run.method, seed=run.seed, dataset=run.dataset))
    return pd.concat(frames, ignore_index=True)


def _read_metrics(path: Path) -> pd.DataFrame:
    """The evaluated rounds of one metrics.csv: round and accuracy_mean, checked."""
    fix = "the run did not finish or the file is damaged: re-run it"
    try:
        m = pd.read_csv(path)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist, though its run has a summary.json; {fix}") from None
    except (OSError, ValueError) as e:  # ValueError: pandas' parser and empty-data errors, bad UTF-8
        raise UsageError(f"cannot read {path} ({' '.join(str(e).split())}); {fix}") from None
    missing = [c for c in ("round", "accuracy_mean") if c not in m.columns]
    if missing:
        raise UsageError(f"{path} has no column {' or '.join(map(repr, missing))}; {fix}")
    # Rounds that were not evaluated (fl.eval_every > 1) have training metrics but no accuracy.
    m = m.dropna(subset=["accuracy_mean"])
    if m.empty:
        raise UsageError(f"{path} has no evaluated round (no accuracy_mean value); {fix}")
    if not (pd.api.types.is_integer_dtype(m["round"]) and (m["round"] >= 1).all()):
        raise UsageError(f"{path}: the round column holds something other than whole numbers >= 1; {fix}")
    if m["round"].duplicated().any():  # a run writes one row a round: a repeated one would be averaged in
        raise UsageError(f"{path} holds round {m['round'][m['round'].duplicated()].iloc[0]} twice; {fix}")
    if not holds_numbers(m["accuracy_mean"]):
        raise UsageError(f"{path}: accuracy_mean holds something other than numbers; {fix}")
    if not m["accuracy_mean"].between(0, 1).all():
        raise UsageError(f"{path}: accuracy_mean holds values outside 0..1; {fix}")
    return m


def holds_numbers(column: pd.Series) -> bool:
    """Whether a metrics.csv column holds numbers (read_csv reads a column of True/False as booleans)."""
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def rounds_axis(ax) -> None:
    """An x axis of communication rounds, with whole-number ticks only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("communication round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def mean_band(ax, frame, column: str, color, label: str, scale: float = 100.0, x: str | None = None,
              x_scale: float = 1.0, linestyle: str = "-") -> None:
    """The mean over seeds of `column` per round, times `scale` (accuracies in %), with a +-std band.

    The x positions are the rounds, or with `x` the mean over seeds of that column per round, times
    `x_scale` (cumulative bytes, say).
    """
    g = frame.groupby("round")
    mean, std = scale * g[column].mean(), scale * g[column].std(ddof=0)
    xs = mean.index if x is None else x_scale * g[x].mean()
    ax.plot(xs, mean, color=color, linestyle=linestyle, label=label)
    ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.18, linewidth=0)


def accuracy_curves(curves: pd.DataFrame, out: str | Path, title: str = "", smoke: bool = False,
                    pdf: bool = True) -> list[str]:
    """One panel per scenario: mean client accuracy per round, mean over seeds with a +-std band.

    Written to `out` (.png) and, with `pdf`, its .pdf twin. Runs on synthetic data (a `dataset` column starting
    with "synthetic:"), or `smoke`, mark the figure as a smoke run. Returns the panel titles, in the
    order the scenarios first appear in `curves`.
    """
    smoke = smoke or ("dataset" in curves and curves["dataset"].map(is_synthetic).any())
    scenarios = list(dict.fromkeys(curves["scenario"]))
    methods = list(dict.fromkeys(curves["method"]))
    styles = method_styles(methods)
    plt, fig, axes = panel_grid(len(scenarios), sharey=True)
    for ax, scenario in zip(axes.flat, scenarios):
        for method in methods:
            d = curves[(curves.scenario == scenario) & (curves.method == method)]
            if not d.empty:
                mean_band(ax, d, "accuracy_mean", label=method, **styles[method])
        ax.set_title(scenario)
        rounds_axis(ax)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("mean client accuracy [%]")
    legend_outside(fig, axes.flat, title="method (mean ± std over seeds)")
    decorate(fig, title, smoke)
    save_figure(fig, out, pdf=pdf)
    return scenarios
