"""The simulation study's results: simulation.md (the paper's claim checked) and Figures 6 and 7 of paper 001.

simulation.md gives, per setting (p, alpha) and decomposition, the mean +- std over seeds of the
final and best test accuracy, of the final mask's agreement with the true one and, for dynamic
FedFac, of the split's stability; figure6 draws the accuracy per round, figure7 the stability.
"""

from __future__ import annotations

from pathlib import Path

from .config import SimulationConfig, panels_of, settings_of


CLAIM = ("Paper 001, section 4.3.2 (Figure 6): the true, oracle, static FedFac and dynamic FedFac "
         "decompositions give nearly identical test accuracies (here: within about a point of each other), "
         "while the random decomposition is much inferior (clearly lower).")


def _setting_label(p: float, alpha: float) -> str:
    return f"p = {p:g}, alpha = {alpha:g}"


def summary_markdown(cfg: SimulationConfig, runs, seconds: float | None = None) -> str:
    """Mean +- std over seeds: settings as rows, decompositions as columns; the claim and a check."""
    names = [n for n in cfg.decompositions if n in set(runs["decomposition"])]
    settings = settings_of(cfg)

    def table(column: str, scale: float, digits: int, only: list[str] | None = None) -> list[str]:
        cols = [n for n in names if only is None or n in only]
        lines = ["| setting | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for p, alpha in settings:
            cells = []
            for n in cols:
                v = scale * runs[(runs.p == p) & (runs.alpha == alpha) & (runs.decomposition == n)][column]
                cells.append(f"{v.mean():.{digits}f} ± {v.std(ddof=0):.{digits}f}" if len(v) else "")
            lines.append(f"| {_setting_label(p, alpha)} | " + " | ".join(cells) + " |")
        return lines

    seeds = ", ".join(map(str, cfg.seeds))
    lines = ["# FedFac simulation study (paper 001, section 4.3)", "",
             f"Test accuracy after the last round ({cfg.train.rounds}), in %, mean ± std over seeds {seeds}; "
             f"C = {cfg.data.clients} clients, d = {cfg.data.d}, m = {cfg.data.m}, threshold tau = "
             f"{cfg.split.tau!s}" + (" (the (1 - p) quantile of nu: as many shared units as the truth)"
                                    if cfg.split.tau == "share" else "") + ".", ""]
    lines += table("final_accuracy", 100, 1)
    lines += ["", CLAIM, ""]
    close = [n for n in ("true", "oracle", "static", "dynamic") if n in names]
    if close:
        per = runs[runs.decomposition.isin(close)].groupby(["p", "alpha", "decomposition"])["final_accuracy"].mean()
        spread = 100 * per.groupby(["p", "alpha"]).agg(lambda s: s.max() - s.min())
        text = (f"Measured: the largest spread among {', '.join(close)} in one setting is "
                f"{spread.max():.1f} points (mean over settings {spread.mean():.1f})")
        if "random" in names:
            lo = per.groupby(["p", "alpha"]).min()
            rnd = runs[runs.decomposition == "random"].groupby(["p", "alpha"])["final_accuracy"].mean()
            gap = 100 * (lo - rnd)
            text += (f"; random is below the lowest of them by {gap.min():.1f} to {gap.max():.1f} points "
                     f"(mean {gap.mean():.1f})")
        lines += [text + ".", ""]
    lines += ["Best accuracy over rounds, in %:", ""] + table("best_accuracy", 100, 1)
    lines += ["", "Agreement of the final mask with the true mask (share of units), in %. Meaningful for oracle "
              "(the teacher's own units); for static, dynamic and random it is the student's units against the "
              "teacher's indices, which no method can match (exchangeable units): chance is p² + (1 - p)².", ""]
    lines += table("agreement", 100, 1)
    if "dynamic" in names:
        lines += ["", "Dynamic FedFac: share of units that kept their state in the last round, in % (Figure 7).", ""]
        lines += table("stability", 100, 1, only=["dynamic"])
    if seconds is not None:
        lines += ["", f"Wall time: {seconds:.0f} s."]
    return "\n".join(lines) + "\n"


def figure6(cfg: SimulationConfig, rounds, out: str | Path) -> None:
    """Six panels (p sweep, alpha sweep): mean client test accuracy per round per decomposition."""
    from ..report.figures import legend_outside, mean_band, method_styles, pyplot, rounds_axis, save_figure

    plt = pyplot()
    panels = panels_of(cfg)
    names = [n for n in cfg.decompositions if n in set(rounds["decomposition"])]
    styles = method_styles(names)
    cols = max(len(cfg.grid.p), len(cfg.grid.alpha))
    fig, axes = plt.subplots(2, cols, figsize=(4.2 * cols, 6.4), squeeze=False, sharey=True, layout="constrained")
    slots = [axes[0, i] for i in range(len(cfg.grid.p))] + [axes[1, i] for i in range(len(cfg.grid.alpha))]
    for ax, (title, p, alpha) in zip(slots, panels):
        for name in names:
            d = rounds[(rounds.p == p) & (rounds.alpha == alpha) & (rounds.decomposition == name)]
            mean_band(ax, d, "accuracy", label=name, **styles[name])
        ax.set_title(title)
        rounds_axis(ax)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("mean client test accuracy [%]")
    for ax in axes.flat:
        if ax not in slots:
            ax.set_visible(False)
    legend_outside(fig, slots, title="decomposition (mean ± std over seeds)")
    fig.suptitle("Test accuracy under different decompositions (paper 001, Figure 6)")
    save_figure(fig, out)


def figure7(cfg: SimulationConfig, rounds, out: str | Path) -> None:
    """Dynamic FedFac: share of units that did not change state since the previous round."""
    from ..report.figures import legend_outside, pyplot, rounds_axis, save_figure

    fig, ax = pyplot().subplots(figsize=(6.4, 4.0), layout="constrained")
    d = rounds[(rounds.decomposition == "dynamic") & (rounds["round"] > 0)]
    for i, (p, alpha) in enumerate(settings_of(cfg)):
        g = d[(d.p == p) & (d.alpha == alpha)].groupby("round")["stability"].mean()
        if len(g):
            ax.plot(g.index, 100 * g, color=f"C{i}", label=_setting_label(p, alpha))
    rounds_axis(ax)
    ax.set_ylabel("units that kept their state [%]")
    ax.set_title("Dynamic FedFac: stability of the split (paper 001, Figure 7)")
    ax.grid(alpha=0.3)
    if len(d):
        legend_outside(fig, [ax], title="setting")
    else:
        ax.text(0.5, 0.5, "dynamic not among the decompositions", ha="center", va="center", transform=ax.transAxes)
    save_figure(fig, out)

