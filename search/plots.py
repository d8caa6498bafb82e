"""Plots of results and schedules: independent functions, each returning a matplotlib Figure.

Functions build a :class:`matplotlib.figure.Figure` directly (no pyplot state, never
``plt.show()``), so they work headless and in tests; save with ``fig.savefig(path)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.figure import Figure
from matplotlib.patches import Patch

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

    from perfmodel.pipeline import Timeline

__all__ = ["plot_pipeline_timeline"]

_OP_COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452"}
_OP_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}


def _time_scale(makespan_s: float) -> tuple[float, str]:
    """Pick a display unit for the time axis: (factor from seconds, unit label)."""
    if makespan_s >= 1.0:
        return 1.0, "s"
    if makespan_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def plot_pipeline_timeline(
    timeline: Timeline,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    labels: bool = True,
) -> Figure:
    """Gantt chart of a simulated pipeline step: one row per device, one bar per op.

    Forward ops are blue, backward green, ZB-H1 weight-gradient ops orange; with interleaving,
    later model chunks are drawn lighter. Each bar is labelled with its micro-batch number when
    ``labels`` is set and the bar is wide enough.

    Parameters
    ----------
    timeline : a :class:`perfmodel.pipeline.Timeline` from :func:`perfmodel.pipeline.simulate`.
    ax : draw into this Axes (its figure is returned); default a new Figure.
    title : default names the schedule, p, m, v, makespan and bubble fraction.
    labels : write micro-batch numbers into the bars.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if ax is None:
        fig = Figure(
            figsize=(max(6.0, 0.25 * len(timeline.events) / timeline.p + 4), 0.6 * timeline.p + 1.6)
        )
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    scale, unit = _time_scale(timeline.makespan_s)
    span = timeline.makespan_s * scale
    v = max(timeline.v, 1)
    for stage, mb, chunk, op, t0, t1 in timeline.events:
        x0, width = t0 * scale, (t1 - t0) * scale
        alpha = 1.0 - 0.45 * chunk / max(v - 1, 1) if v > 1 else 1.0
        ax.barh(
            stage,
            width,
            left=x0,
            height=0.8,
            color=_OP_COLORS[op],
            alpha=alpha,
            edgecolor="black",
            linewidth=0.4,
        )
        if labels and width > 0.012 * span:
            ax.text(x0 + width / 2, stage, str(mb), ha="center", va="center", fontsize=7)
    ax.set_ylim(timeline.p - 0.5, -0.5)  # stage 0 on top, as drawn by hand
    ax.set_xlim(0, span)
    ax.set_yticks(range(timeline.p))
    ax.set_yticklabels([f"stage {s}" for s in range(timeline.p)])
    ax.set_xlabel(f"time [{unit}]")
    ops = sorted({e[3] for e in timeline.events}, key="FBW".index)
    ax.legend(
        handles=[Patch(color=_OP_COLORS[o], label=_OP_NAMES[o]) for o in ops],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18 if timeline.p > 2 else -0.3),
        ncol=len(ops),
        frameon=False,
        fontsize=8,
    )
    if title is None:
        vs = f", v={timeline.v}" if timeline.v > 1 else ""
        title = (
            f"{timeline.schedule}: p={timeline.p}, m={timeline.m}{vs}; makespan "
            f"{span:.3g} {unit}, bubble {timeline.bubble_fraction:.1%}"
        )
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
