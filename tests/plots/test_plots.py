"""Every plot function renders to a PNG; the data helpers behind them give hand-checked numbers."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from perfmodel.core.units import GIB
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import TIME_TERMS, evaluate
from plots import figures as plots

MODEL = load_model("gpt3-125m")
TRAINING = load_training(global_batch_size=16, seq_len=1024)
CLUSTER = load_cluster("dgx-a100-80g", gpus=8)
BATCH = ConfigBatch.from_arrays(dp=[8, 4, 2], tp=[1, 2, 2], pp=[1, 1, 2],
                                num_microbatches=[2, 4, 8])


@pytest.fixture(scope="module")
def step_result():
    return evaluate(MODEL, TRAINING, CLUSTER, BATCH)


def _png(fig, path):
    assert isinstance(fig, Figure)
    fig.savefig(path, dpi=50)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 2000


def test_time_breakdown_renders_all_inputs(step_result, tmp_path):
    _png(plots.plot_time_breakdown(step_result), tmp_path / "a.png")
    _png(plots.plot_time_breakdown(step_result.to_frame(), relative=True), tmp_path / "b.png")
    _png(plots.plot_time_breakdown(step_result.row(2), labels=["x"]), tmp_path / "c.png")


def test_time_breakdown_frame_terms_add_up(step_result):
    df = plots.time_breakdown_frame(step_result)
    assert list(df.columns) == [*TIME_TERMS, "step_time_s"]
    np.testing.assert_allclose(df[list(TIME_TERMS)].sum(axis=1), df["step_time_s"], rtol=1e-9)
    assert list(df.index) == ["d8 t1 p1 z0 b1", "d4 t2 p1 z0 b1", "d2 t2 p2 z0 b1"]
    # a row dict gives the same numbers as the batch
    one = plots.time_breakdown_frame([step_result.row(1)])
    np.testing.assert_allclose(one.to_numpy()[0], df.to_numpy()[1])


def test_time_breakdown_bars_stack_to_step_time(step_result):
    fig = plots.plot_time_breakdown(step_result)
    ax = fig.axes[0]
    ends = {}
    for p in ax.patches:
        y = round(p.get_y() + p.get_height() / 2)
        ends[y] = max(ends.get(y, 0.0), p.get_x() + p.get_width())
    # axis in ms for sub-second steps
    np.testing.assert_allclose([ends[i] for i in range(3)], step_result.step_time_s * 1e3,
                               rtol=1e-9)


def test_memory_breakdown_against_hbm(step_result, tmp_path):
    fig = plots.plot_memory_breakdown(step_result, CLUSTER.gpu.hbm_bytes)
    _png(fig, tmp_path / "m.png")
    ax = fig.axes[0]
    hlines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert hlines and hlines[0].get_ydata()[0] == pytest.approx(CLUSTER.gpu.hbm_bytes / GIB)
    df = plots.memory_breakdown_frame(step_result)
    np.testing.assert_allclose(df["peak"], step_result.memory_bytes["peak"])


def test_config_label():
    assert plots.config_label({"dp": 4, "tp": 2, "pp": 2, "vp": 2, "cp": 1, "zero_stage": 1,
                               "micro_batch_size": 2, "recompute": "selective"}) \
        == "d4 t2 p2 v2 z1 b2 sel"


def _front(seed):
    rng = np.random.default_rng(seed)
    mem = rng.uniform(1, 60, 40) * GIB
    return pd.DataFrame({"peak_memory_bytes": mem, "step_time_s": 50 * GIB / mem
                         + rng.uniform(0, 1, 40), "gpus": rng.choice([8, 16], 40)})


def test_pareto_front_side_by_side_and_overlay(tmp_path):
    a, b = _front(0), _front(1)
    fig = plots.plot_pareto_front(a, b, labels=["exhaustive", "NSGA-II"])
    _png(fig, tmp_path / "p.png")
    assert len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"]) == 2
    _png(plots.plot_pareto_front(a, b, side_by_side=False, color_by=None), tmp_path / "q.png")
    with pytest.raises(ValueError):
        plots.plot_pareto_front(a, labels=["x", "y"])


def test_front_2d_hand_example():
    x = np.array([1.0, 2.0, 3.0, 2.5, 4.0])
    y = np.array([5.0, 3.0, 1.0, 4.0, 0.5])
    assert plots._front_2d(x, y).tolist() == [0, 1, 2, 4]


def test_scaling_curve_from_plan_and_from_frame(tmp_path):
    df = plots.scaling_frame("gpt3-125m", "dgx-a100-80g", [1, 2, 3], global_batch_size=8,
                             seq_len=1024, tp=1, pp=1, zero_stage=0, recompute="none",
                             micro_batch_size=1)
    assert list(df["gpus"]) == [1, 2, 3]
    assert np.isfinite(df["tokens_per_s"][:2]).all()
    assert np.isnan(df["tokens_per_s"][2])  # 3 GPUs do not divide the global batch of 8
    assert df["config"][1] == "d2 t1 p1 z0 b1"
    _png(plots.plot_scaling_curve("gpt3-125m", "dgx-a100-80g", [], frame=df), tmp_path / "s.png")


def test_allreduce_one_domain_hand_numbers():
    # 8 GPUs in one NVLink domain (300 GB/s x NCCL protocol 0.8 = 240 GB/s, 3 us): hierarchical == ring; ring of 1 GiB is
    # 14 * 3 us + 2 * 7/8 * 2^30 / 240e9 s.
    df = plots.allreduce_frame("dgx-a100-80g", [2.0**30], n=8)
    ring = 14 * 3e-6 + 2 * 7 / 8 * 2**30 / 240e9
    assert df["ring_s"][0] == pytest.approx(ring, rel=1e-12)
    assert df["hierarchical_s"][0] == pytest.approx(ring, rel=1e-12)
    # tree: 2 * ceil(log2 8) * 3 us + 2 * 2^30 / 300e9
    assert df["tree_s"][0] == pytest.approx(2 * 3 * 3e-6 + 2 * 2**30 / 240e9, rel=1e-12)


def test_allreduce_crossover_tree_to_ring_in_one_domain():
    # ring - tree = (14 - 6) alpha - (2 - 1.75) S / B = 0  =>  S = 8 alpha B / 0.25
    df = plots.allreduce_frame("dgx-a100-80g", np.logspace(10, 34, 2001, base=2.0), n=8)
    xo = plots.allreduce_crossovers(df)
    tr = xo[(xo["faster_below"] == "tree") & (xo["faster_above"] == "ring")]
    assert len(tr) == 1
    assert tr["size_bytes"].iloc[0] == pytest.approx(8 * 3e-6 * 240e9 / 0.25, rel=1e-3)
    assert bool(tr["changes_best"].iloc[0])


def test_allreduce_plot_two_clusters(tmp_path):
    for name in ("dgx-h100", "ethernet-a100"):
        fig = plots.plot_allreduce_vs_size(name, n=32)
        _png(fig, tmp_path / f"{name}.png")
        assert len(fig.axes[0].get_lines()) >= 3


def test_validation_scatter(tmp_path):
    rep = pd.DataFrame({"row_id": ["R1", "R2", "R3"], "measured_s": [1.0, 2.0, 10.0],
                        "predicted_s": [1.1, 1.0, 10.0], "scope": ["step", "step", "layer"]})
    fig = plots.plot_validation_scatter(rep)
    _png(fig, tmp_path / "v.png")
    assert "mean |error| 20.0%" in fig._suptitle.get_text()
    _png(plots.plot_validation_scatter(rep, errors=False, color_by=None), tmp_path / "w.png")
