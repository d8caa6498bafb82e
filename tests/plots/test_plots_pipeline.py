"""The pipeline Gantt chart renders to a PNG."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure

from perfmodel.pipeline.schedules import simulate
from plots.figures import plot_pipeline_timeline


def test_gantt_renders_png(tmp_path):
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("zb", 1)):
        tl = simulate([1e-3] * 4, [2e-3] * 4, 8, schedule, v=v, p2p_s=5e-5)
        fig = plot_pipeline_timeline(tl)
        assert isinstance(fig, Figure)
        path = tmp_path / f"{schedule}.png"
        fig.savefig(path, dpi=60)
        assert path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gantt_draws_one_bar_per_op_into_given_axes():
    tl = simulate([1.0, 1.0], [2.0, 2.0], 3, "gpipe")
    fig = Figure()
    ax = fig.add_subplot(1, 1, 1)
    out = plot_pipeline_timeline(tl, ax=ax, title="t", labels=False)
    assert out is fig
    assert len(ax.patches) == len(tl.events) == 2 * 2 * 3
    assert ax.get_xlabel() == "time [s]"
