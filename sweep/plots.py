"""Plots of a sweep's table (:func:`sweep.sweep`): each function returns a matplotlib Figure.

- :func:`mfu_heatmap`: the best MFU over (cluster x GPU count), one panel per model;
- :func:`plot_cost_vs_days`: GPU-hours against days to train, one point per scenario, with the
  Pareto front (needs ``train_tokens`` in the spec); without run figures, step time against
  GPUs.

Figures are built directly (no pyplot state), so they work headless; save with
``fig.savefig(path)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from search.pareto import pareto_mask

__all__ = ["best_rows", "mfu_grid", "mfu_heatmap", "plot_cost_vs_days"]


def best_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rank-1 rows of scenarios that found a configuration."""
    return table[(table["rank"] == 1) & (table["status"] == "ok")]


def mfu_grid(table: pd.DataFrame, model: str) -> pd.DataFrame:
    """Best MFU of ``model`` per cluster (rows) and GPU count (columns), over every other
    scenario parameter (batch, sequence, precision, overrides); NaN where nothing fits."""
    rows = best_rows(table)
    rows = rows[rows["model"] == model]
    every = table[table["model"] == model]
    grid = rows.pivot_table(index="cluster", columns="gpus", values="mfu", aggfunc="max")
    return grid.reindex(index=sorted(every["cluster"].unique()),
                        columns=sorted(every["gpus"].unique()))


def mfu_heatmap(table: pd.DataFrame, models: list[str] | None = None) -> Figure:
    """One heatmap per model of the best MFU over (cluster x GPU count); cells where no
    scenario fits are blank and marked "-"."""
    models = models or sorted(table["model"].unique())
    fig = Figure(figsize=(1.2 + 1.1 * table["gpus"].nunique(), 1.2 + 2.4 * len(models)),
                 layout="constrained")
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    image = None
    for ax, model in zip(axes, models):
        grid = mfu_grid(table, model)
        values = grid.to_numpy(dtype=float)
        image = ax.imshow(values * 100, cmap="viridis", vmin=0, vmax=100, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, "-" if np.isnan(v) else f"{v:.0%}", ha="center", va="center",
                    color="white" if np.isnan(v) or v < 0.5 else "black", fontsize=8)
        ax.set_xticks(range(len(grid.columns)), [str(g) for g in grid.columns])
        ax.set_yticks(range(len(grid.index)), list(grid.index))
        ax.set_xlabel("GPUs")
        ax.set_title(f"{model}: best MFU")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="MFU [%]", shrink=0.8)
    return fig


def _front_line(ax, x: np.ndarray, y: np.ndarray) -> None:
    on = pareto_mask(np.column_stack([x, y]))
    order = np.argsort(x[on])
    ax.plot(x[on][order], y[on][order], "-o", color="C3", lw=1.5, ms=5, label="Pareto front",
            zorder=3)


def plot_cost_vs_days(table: pd.DataFrame) -> Figure:
    """GPU-hours against days to train (one point per scenario, colour by model) and the
    Pareto front; if the table has no run figures (no ``train_tokens``), step time against
    GPUs instead."""
    rows = best_rows(table)
    has_run = "train_days" in rows and rows["train_days"].notna().any()
    xcol, ycol = ("train_days", "gpu_hours") if has_run else ("gpus_used", "step_time_s")
    rows = rows[rows[xcol].notna() & rows[ycol].notna()]
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, (model, group) in enumerate(rows.groupby("model", sort=True)):
        ax.scatter(group[xcol], group[ycol], s=18, alpha=0.7, color=f"C{i}", label=model)
    if len(rows):
        _front_line(ax, rows[xcol].to_numpy(float), rows[ycol].to_numpy(float))
    ax.set_xscale("log")
    ax.set_yscale("log")
    if has_run:
        ax.set_xlabel("days to train")
        ax.set_ylabel("cost [GPU-hours]")
        ax.set_title("cost vs time to train, every scenario")
    else:
        ax.set_xlabel("GPUs")
        ax.set_ylabel("step time [s]")
        ax.set_title("step time vs GPUs, every scenario")
    ax.legend(fontsize=8)
    return fig
