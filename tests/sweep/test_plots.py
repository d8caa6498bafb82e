"""Sweep plots from a hand-made table: the MFU grid's cells and the figures' axes."""

import math

import pandas as pd

from sweep.plots import mfu_grid, mfu_heatmap, plot_cost_vs_days
from sweep.store import typed


def _table(run: bool) -> pd.DataFrame:
    rows = []
    for i, (model, cluster, gpus, mfu, status) in enumerate([
        ("a", "c1", 8, 0.40, "ok"), ("a", "c1", 8, 0.45, "ok"), ("a", "c1", 16, 0.30, "ok"),
        ("a", "c2", 8, None, "nothing fits"), ("a", "c2", 16, 0.50, "ok"),
        ("b", "c1", 8, 0.20, "ok"),
    ]):
        tps = None if mfu is None else mfu * 1e6
        rows.append({"scenario_id": f"{i:016x}", "model": model, "cluster": cluster,
                     "gpus": gpus, "gpus_used": gpus, "rank": 1, "status": status, "mfu": mfu,
                     "tokens_per_s": tps, "step_time_s": None if mfu is None else 1 / mfu,
                     **({"train_days": 1e12 / tps / 86400, "gpu_hours": gpus * 1e12 / tps / 3600}
                        if run and tps else {})})
    return typed(pd.DataFrame(rows))


def test_mfu_grid_takes_the_best_per_cell_and_leaves_gaps():
    grid = mfu_grid(_table(run=False), "a")
    assert list(grid.index) == ["c1", "c2"] and list(grid.columns) == [8, 16]
    assert grid.loc["c1", 8] == 0.45 and grid.loc["c2", 16] == 0.50
    assert math.isnan(grid.loc["c2", 8])


def test_heatmap_has_a_panel_per_model():
    fig = mfu_heatmap(_table(run=False))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["a: best MFU", "b: best MFU"]


def test_cost_vs_days_with_and_without_run_figures():
    ax = plot_cost_vs_days(_table(run=True)).axes[0]
    assert ax.get_xlabel() == "days to train" and ax.get_ylabel() == "cost [GPU-hours]"
    ax = plot_cost_vs_days(_table(run=False)).axes[0]
    assert ax.get_xlabel() == "GPUs" and ax.get_ylabel() == "step time [s]"
