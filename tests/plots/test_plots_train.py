"""Plots of the whole run: goodput and days versus GPUs, cost versus days."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
from matplotlib.figure import Figure

from plots import figures as plots


def test_train_frame_and_plots():
    f = plots.train_frame("llama3.1-8b", "dgx-h100", [16, 64], global_batch_size=64,
                          seq_len=2048, train_tokens=1e11, tp=8, pp=1, cp=1, vp=1,
                          gpu_hour_price=2.0)
    assert list(f["gpus"]) == [16, 64]
    assert np.all(f["goodput"].between(0.5, 1.0))
    assert f["days"].iloc[1] < f["days"].iloc[0]
    assert f["expected_interruptions"].notna().all()
    assert isinstance(plots.plot_goodput_vs_gpus(f), Figure)
    assert isinstance(plots.plot_cost_vs_days(f), Figure)


def test_train_frame_reports_what_does_not_fit():
    f = plots.train_frame("llama3.1-8b", "dgx-h100", [12], train_steps=10, tp=8)
    assert np.isnan(f["goodput"].iloc[0]) and f["config"].iloc[0]
