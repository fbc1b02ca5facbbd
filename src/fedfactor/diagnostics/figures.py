"""The figures of `fedfactor diagnose`: communalities, eigenvalue curves and FedFac's split over the rounds.

communalities (the ECDF of nu) and eigenvalues (the cumulative eigenvalue share against the number of
factors) have one panel per scenario x layer and one line per run, coloured by method; a FedFac run
adds split_history (its split per analysed round) and stability (001 Figure 7).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..report.figures import legend_outside, method_styles, pyplot
from .layer_analysis import LayerResult, stability


def _grid(n: int, width: float = 4.0, height: float = 3.2, max_cols: int = 4):
    plt = pyplot()
    cols = max(1, min(n, max_cols))
    rows = max(1, -(-n // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat)


def _finish(plt, fig, title: str):
    """The figure, titled; `save_figure` writes it as PNG and PDF."""
    fig.suptitle(title, wrap=True)
    return fig


def _panels(results: list[LayerResult]) -> dict[tuple, list[LayerResult]]:
    panels: dict[tuple, list[LayerResult]] = {}
    for r in results:
        panels.setdefault((r.row["scenario"], r.row["layer"], r.row["module"]), []).append(r)
    return panels


def _nothing_fig(title: str, text: str):
    plt, fig, (ax,) = _grid(1, 5, 2.5)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return _finish(plt, fig, title)


def _method_lines(ax, runs: list[LayerResult], xy, colors: dict[str, dict[str, Any]], step: bool = True) -> None:
    """One line per run, coloured by method, each method labelled once."""
    labelled = set()
    for r in runs:
        m = r.row["method"]
        x, y = xy(r)
        style = dict(**colors[m], alpha=0.8, linewidth=1.2, label=None if m in labelled else m)
        if step:
            ax.step(x, y, where="post", **style)
        else:
            ax.plot(x, y, marker="." if len(x) <= 40 else None, **style)
        labelled.add(m)


def _layer_figure(results: list[LayerResult], title: str, draw):
    """One panel per scenario x layer; `draw(ax, runs, styles)` adds the lines of its runs; one
    legend of the methods beside the panels."""
    if not results:
        return _nothing_fig(title, "no layer analysed")
    panels = _panels(results)
    colors = method_styles(list(dict.fromkeys(r.row["method"] for r in results)))
    plt, fig, axes = _grid(len(panels))
    for ax, ((scenario, layer, module), runs) in zip(axes, panels.items()):
        draw(ax, runs, colors)
        ax.set_title(f"{scenario}, layer {layer} ({module})", fontsize="medium")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    legend_outside(fig, axes, title="method (one line per run)")
    return _finish(plt, fig, title)


def communalities_fig(results: list[LayerResult], kappa: float):
    """ECDF of nu, one panel per scenario x layer, one line per run coloured by method."""
    def ecdf(r):
        x = np.sort(r.nu)
        return np.concatenate([[0.0], x]), np.concatenate([[0.0], np.arange(1, len(x) + 1) / len(x)])

    def draw(ax, runs, colors):
        _method_lines(ax, runs, ecdf, colors)
        ax.set_xlabel("communality nu")
        ax.set_ylabel("share of units with nu <= x")
        ax.set_xlim(0, max(1.0, max(float(r.nu.max()) for r in runs)))

    return _layer_figure([r for r in results if r.nu is not None],
                         "Communalities nu of the clients' final weights (ECDF)", draw)


def eigenvalues_fig(results: list[LayerResult], kappa: float):
    """Cumulative eigenvalue share against the number of factors, kappa marked."""
    from matplotlib.ticker import MaxNLocator

    def draw(ax, runs, colors):
        _method_lines(ax, runs, lambda r: (np.arange(0, len(r.curve) + 1), np.concatenate([[0.0], r.curve])),
                      colors, step=False)
        ax.axhline(kappa, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("factors m")
        ax.set_ylabel("cumulative eigenvalue share")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    return _layer_figure([r for r in results if r.curve is not None and len(r.curve)],
                         f"Cumulative eigenvalue share of R (G = first m reaching kappa = {kappa:g})", draw)


def unit_order(states: np.ndarray) -> np.ndarray:
    """The units most often shared first (ties: by index), for the split-history heatmap."""
    states = np.asarray(states)
    return np.lexsort((np.arange(states.shape[1]), -states.sum(axis=0, dtype=np.int64)))


def split_history_fig(results: list[LayerResult]):
    """One heatmap per FedFac run x layer: analysed rounds x units, shared dark, units sorted by how
    often they were shared."""
    from matplotlib.colors import ListedColormap
    from matplotlib.ticker import MaxNLocator

    plt, fig, axes = _grid(len(results), 4.2, 3.0)
    cmap = ListedColormap(["#f0f0f0", "#2b6cb0"])
    for ax, r in zip(axes, results):
        assert r.history is not None  # FedFac runs only, which have a split history
        rounds, states = r.history
        ax.imshow(states[:, unit_order(states)], cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest",
                  extent=(0.5, states.shape[1] + 0.5, len(rounds) - 0.5, -0.5))
        ticks = np.unique(np.linspace(0, len(rounds) - 1, min(len(rounds), 6)).round().astype(int))
        ax.set_yticks(ticks, [str(rounds[t]) for t in ticks])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{r.row['scenario']}/{r.row['method']}/seed{r.row['seed']}, layer {r.row['layer']}",
                     fontsize="medium")
        ax.set_xlabel("unit (most often shared first)")
        ax.set_ylabel("round")
    return _finish(plt, fig, "FedFac split per analysed round (blue: shared, grey: personal)")


def stability_fig(results: list[LayerResult]):
    """Share of units whose state did not change since the previous analysed round (001 Figure 7),
    one panel per scenario x layer, one line per run."""
    from matplotlib.ticker import MaxNLocator

    panels = _panels(results)
    plt, fig, axes = _grid(len(panels))
    for ax, ((scenario, layer, module), runs) in zip(axes, panels.items()):
        drawn = False
        for i, r in enumerate(runs):
            assert r.history is not None  # FedFac runs only, which have a split history
            rounds, states = r.history
            s = stability(states)
            if len(s):
                ax.plot(rounds[1:], s, marker="." if len(s) < 30 else None, color=f"C{i % 10}",
                        label=f"{r.row['method']}/seed{r.row['seed']}")
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "one analysed round only\n(static FedFac): nothing can change", ha="center",
                    va="center", transform=ax.transAxes, fontsize="small")
        else:
            ax.legend(fontsize="x-small", loc="lower left", ncols=1 + len(runs) // 8)
        ax.set_title(f"{scenario}, layer {layer} ({module})", fontsize="medium")
        ax.set_xlabel("round")
        ax.set_ylabel("share of units unchanged")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    return _finish(plt, fig, "Units whose shared/personal state did not change since the previous analysed round")

