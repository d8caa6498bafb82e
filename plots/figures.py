"""Plots of results and schedules: independent functions, each returning a matplotlib Figure.

Functions build a :class:`matplotlib.figure.Figure` directly (no pyplot state, never
``plt.show()``), so they work headless and in tests; save with ``fig.savefig(path)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter, ScalarFormatter

from perfmodel.compute import layer as compute
from perfmodel.core import units
from perfmodel.hardware import collectives as coll
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.layers import layout_chunk_times, stage_layer_table
from perfmodel.parallel.topology import group_placement
from perfmodel.pipeline.schedules import simulate
from perfmodel.spec.specs import SpecError, load_cluster
from perfmodel.step.evaluate import MEMORY_TERMS, TIME_TERMS
from perfmodel.step.timeline import layout_timeline
from search.api import plan

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

    from perfmodel.pipeline.schedules import Timeline
    from perfmodel.spec.specs import ClusterSpec

__all__ = [
    "allreduce_crossovers",
    "allreduce_frame",
    "config_label",
    "memory_breakdown_frame",
    "plot_allreduce_vs_size",
    "plot_config_timeline",
    "plot_cost_vs_days",
    "plot_goodput_vs_gpus",
    "plot_memory_breakdown",
    "plot_pareto_front",
    "plot_pipeline_timeline",
    "plot_scaling_curve",
    "plot_time_breakdown",
    "plot_validation_scatter",
    "scaling_frame",
    "time_breakdown_frame",
    "train_frame",
]

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
    timeline : a :class:`perfmodel.pipeline.schedules.Timeline` from :func:`perfmodel.pipeline.schedules.simulate`.
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
        bbox_to_anchor=(0.5, -0.26 if timeline.p > 2 else -0.4),
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


# --------------------------------------------------------------------------------------------
# Step-time and memory breakdowns
# --------------------------------------------------------------------------------------------
_TIME_TERMS = TIME_TERMS
_MEMORY_TERMS = tuple(t for t in MEMORY_TERMS if t != "peak")
_TERM_COLORS = {
    "compute": "#4C72B0", "tp_comm": "#DD8452", "cp_comm": "#937860", "bubble": "#C44E52",
    "pp_comm": "#8172B3", "dp_comm": "#55A868", "zero3_comm": "#DA8BC3", "optimizer": "#8C8C8C",
    "overlap_slowdown": "#CCB974", "link_shared": "#64B5CD",
}
_MEMORY_COLORS = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer": "#8172B3",
                  "activations": "#DD8452", "other": "#BBBBBB"}
_CONFIG_KEYS = ("dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "recompute")


def config_label(cfg: Any) -> str:
    """Short label of a configuration (dict, Series or DataFrame row): ``d8 t2 p2 z1 b1 sel``."""
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    parts = [f"d{get('dp', 1)}", f"t{get('tp', 1)}", f"p{get('pp', 1)}"]
    if int(get("vp", 1) or 1) > 1:
        parts.append(f"v{get('vp')}")
    if int(get("cp", 1) or 1) > 1:
        parts.append(f"cp{get('cp')}")
    parts += [f"z{get('zero_stage', 0)}", f"b{get('micro_batch_size', 1)}"]
    rc = get("recompute", "none")
    rc = ("none", "selective", "full")[int(rc)] if isinstance(rc, (int, np.integer)) else str(rc)
    if rc != "none":
        parts.append(rc[:3])
    return " ".join(str(p) for p in parts)


def _as_frame(obj: Any) -> pd.DataFrame:
    """Anything with per-configuration results as a DataFrame with unit-named columns:
    a StepResult, a SearchResult (its ``top``), a DataFrame or Series, one ``row()`` dict
    (``{"config", "time_s", "memory_bytes", ...}``) or a list of them."""
    if isinstance(obj, pd.DataFrame):
        return obj.reset_index(drop=True)
    if isinstance(obj, pd.Series):
        return obj.to_frame().T.reset_index(drop=True)
    if hasattr(obj, "top") and isinstance(obj.top, pd.DataFrame):
        return obj.top.reset_index(drop=True)
    if hasattr(obj, "to_frame") and hasattr(obj, "time_s"):
        return obj.to_frame()
    rows = [obj] if isinstance(obj, dict) else list(obj)
    out = []
    for r in rows:
        flat: dict[str, Any] = dict(r.get("config", {}))
        flat.update({k: v for k, v in r.items() if not isinstance(v, dict)})
        flat.update({f"{k}_time_s": v for k, v in r.get("time_s", {}).items()})
        mem = r.get("memory_bytes", {})
        flat.update({f"{k}_memory_bytes": v for k, v in mem.items() if k != "peak"})
        if "peak" in mem:
            flat["peak_memory_bytes"] = mem["peak"]
        out.append(flat)
    return pd.DataFrame(out)


def _labels(frame: pd.DataFrame, labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(frame):
            raise ValueError(f"{len(labels)} labels for {len(frame)} configurations")
        return [str(x) for x in labels]
    if all(k in frame.columns for k in ("dp", "tp", "pp")):
        return [config_label(r) for _, r in frame.iterrows()]
    return [str(i) for i in range(len(frame))]


def time_breakdown_frame(result: Any, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Step-time terms [s] per configuration: one row per configuration (index: label), one
    column per term of :data:`perfmodel.step.evaluate.TIME_TERMS`, plus ``step_time_s``."""
    f = _as_frame(result)
    terms = [t for t in _TIME_TERMS if f"{t}_time_s" in f.columns]
    out = pd.DataFrame({t: f[f"{t}_time_s"].astype(float).to_numpy() for t in terms},
                       index=_labels(f, labels))
    out["step_time_s"] = (f["step_time_s"].astype(float).to_numpy() if "step_time_s" in f
                          else out[terms].sum(axis=1).to_numpy())
    return out


def memory_breakdown_frame(result: Any, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Memory terms [bytes per GPU] per configuration (weights, gradients, optimizer,
    activations, other) plus ``peak``; index: configuration labels."""
    f = _as_frame(result)
    terms = [t for t in _MEMORY_TERMS if f"{t}_memory_bytes" in f.columns]
    out = pd.DataFrame({t: f[f"{t}_memory_bytes"].astype(float).to_numpy() for t in terms},
                       index=_labels(f, labels))
    out["peak"] = (f["peak_memory_bytes"].astype(float).to_numpy() if "peak_memory_bytes" in f
                   else out[terms].sum(axis=1).to_numpy())
    return out


def _new_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize)
    return fig, fig.add_subplot(1, 1, 1)


def plot_time_breakdown(
    result: Any,
    *,
    labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    relative: bool = False,
    title: str | None = None,
) -> Figure:
    """Stacked horizontal bars of the step-time terms, one bar per configuration.

    The terms are those of :func:`perfmodel.step.evaluate.evaluate` (compute, exposed TP / CP / PP /
    DP / ZeRO-3 communication, pipeline bubble, optimizer); they add up to the step time.

    Parameters
    ----------
    result : a StepResult, a SearchResult (its top configurations), a DataFrame with
        ``<term>_time_s`` columns, a ``row()`` dict or a list of them.
    labels : bar labels; default the configuration (``d8 t2 p2 z1 b1``).
    ax : draw into this Axes; default a new Figure.
    relative : show shares of the step (%) instead of seconds.
    title : axes title.

    Returns
    -------
    matplotlib.figure.Figure
    """
    df = time_breakdown_frame(result, labels)
    terms = [t for t in _TIME_TERMS if t in df.columns and (df[t] > 0).any()]
    fig, ax = _new_axes(ax, (8.0, 1.2 + 0.45 * len(df)))
    total = df["step_time_s"].to_numpy()
    if relative:
        scale, unit = 100.0, "% of step"
        data = df[terms].div(total, axis=0)
    else:
        scale, unit = _time_scale(float(np.nanmax(total)) if len(total) else 1.0)
        data = df[terms]
    y = np.arange(len(df))
    left = np.zeros(len(df))
    for t in terms:
        w = data[t].to_numpy() * scale
        ax.barh(y, w, left=left, height=0.7, color=_TERM_COLORS[t], label=t,
                edgecolor="white", linewidth=0.5)
        left += w
    if not relative:
        for yi, x in zip(y, left):
            ax.text(x, yi, f" {x:.3g}", va="center", fontsize=8)
        ax.set_xlim(0, float(left.max()) * 1.15 if len(left) else 1.0)
    ax.set_yticks(y)
    ax.set_yticklabels(df.index, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"step time [{unit}]")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / max(len(df), 1) * 0.3),
              ncol=min(len(terms), 4), frameon=False, fontsize=8)
    ax.set_title(title or "step-time breakdown", fontsize=10)
    fig.tight_layout()
    return fig


def plot_memory_breakdown(
    result: Any,
    hbm_bytes: float | None = None,
    *,
    labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Stacked bars of the memory per GPU (weights, gradients, optimizer states, activations,
    other) for each configuration, against the GPU's HBM (dashed line).

    Parameters
    ----------
    result : as :func:`plot_time_breakdown` (``<term>_memory_bytes`` columns).
    hbm_bytes : HBM capacity per GPU [bytes] (``cluster.gpu.hbm_bytes``); a SearchResult
        brings its own. None draws no line.
    labels, ax, title : as :func:`plot_time_breakdown`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if hbm_bytes is None:
        hbm_bytes = getattr(result, "hbm_bytes", None)
    df = memory_breakdown_frame(result, labels)
    terms = [t for t in _MEMORY_TERMS if t in df.columns and (df[t] > 0).any()]
    fig, ax = _new_axes(ax, (max(4.5, 1.0 + 0.9 * len(df)), 4.5))
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for t in terms:
        h = df[t].to_numpy() / units.GIB
        ax.bar(x, h, bottom=bottom, width=0.65, color=_MEMORY_COLORS[t], label=t,
               edgecolor="white", linewidth=0.5)
        bottom += h
    ax.plot(x, df["peak"].to_numpy() / units.GIB, "k_", markersize=22, label="peak")
    if hbm_bytes:
        hbm = float(hbm_bytes) / units.GIB
        ax.axhline(hbm, color="black", linestyle="--", linewidth=1)
        ax.text(len(df) - 0.5, hbm, f"HBM {hbm:.0f} GiB", ha="right", va="bottom", fontsize=8)
        ax.set_ylim(0, max(hbm, float(bottom.max()) if len(df) else 0.0) * 1.12)
    ax.set_xticks(x)
    ax.set_xticklabels(df.index, rotation=30 if len(df) > 2 else 0, ha="right" if len(df) > 2
                       else "center", fontsize=8)
    ax.set_ylabel("memory per GPU [GiB]")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(title or "memory per GPU", fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# Pareto fronts
# --------------------------------------------------------------------------------------------
def _axis_values(frame: pd.DataFrame, col: str) -> tuple[np.ndarray, str]:
    v = frame[col].astype(float).to_numpy()
    if col.endswith("_bytes"):
        return v / units.GIB, col[: -len("_bytes")].replace("_", " ") + " [GiB]"
    if col.endswith("_s") and not col.endswith("_per_s"):
        return v, col[: -len("_s")].replace("_", " ") + " [s]"
    return v, col.replace("_", " ")


def _front_2d(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both x and y (minimise both), by x."""
    order = np.lexsort((y, x))
    keep, best = [], np.inf
    for i in order:
        if y[i] < best:
            keep.append(i)
            best = y[i]
    return np.asarray(keep, dtype=np.int64)


def plot_pareto_front(
    *fronts: Any,
    labels: Sequence[str] | None = None,
    x: str = "peak_memory_bytes",
    y: str = "step_time_s",
    color_by: str | None = "gpus",
    side_by_side: bool = True,
    log: bool = True,
    title: str | None = None,
) -> Figure:
    """Pareto fronts (e.g. NSGA-II next to exhaustive search): points, and the 2-D front in
    (``x``, ``y``) as a staircase.

    Parameters
    ----------
    *fronts : DataFrames (``SearchResult.pareto``) or SearchResults (their ``pareto``).
    labels : one name per front (default ``result.strategy`` or "front i").
    x, y : columns to minimise; ``*_bytes`` are drawn in GiB, ``*_s`` in seconds.
    color_by : colour the points by this column (default the GPU count: the third objective of
        ``plan``'s front) when it takes more than one value; None for one colour per front.
    side_by_side : one panel per front sharing the axes; False overlays them in one panel.
    log : logarithmic axes where the values span more than a factor of 10.
    title : figure title.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if not fronts:
        raise ValueError("give at least one front")
    frames = [f.pareto if hasattr(f, "pareto") else _as_frame(f) for f in fronts]
    if labels is None:
        labels = [getattr(f, "strategy", f"front {i}") for i, f in enumerate(fronts)]
    if len(labels) != len(frames):
        raise ValueError(f"{len(labels)} labels for {len(frames)} fronts")
    panels = len(frames) if side_by_side else 1
    fig = Figure(figsize=(4.6 * panels + (1.0 if color_by else 0.0), 4.0), layout="constrained")
    axes = fig.subplots(1, panels, sharex=True, sharey=True, squeeze=False)[0]
    colored = bool(color_by) and any(
        color_by in f.columns and f[color_by].nunique() > 1 for f in frames)
    if colored:
        allc = np.concatenate([f[color_by].astype(float).to_numpy() for f in frames])
        vmin, vmax = float(np.nanmin(allc)), float(np.nanmax(allc))
    markers, colors = "os^Dv", ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3"]
    sc = None
    xlabel = ylabel = ""
    for i, (f, name) in enumerate(zip(frames, labels)):
        ax = axes[i if side_by_side else 0]
        xv, xlabel = _axis_values(f, x)
        yv, ylabel = _axis_values(f, y)
        kw: dict[str, Any] = {"marker": markers[i % 5], "s": 28, "edgecolor": "black",
                              "linewidth": 0.4, "zorder": 3}
        if colored:
            kw.update(c=f[color_by].astype(float).to_numpy(), cmap="viridis", vmin=vmin,
                      vmax=vmax)
        else:
            kw.update(color=colors[i % 5])
        sc_i = ax.scatter(xv, yv, label=f"{name} ({len(f)} points)", **kw)
        sc = sc_i if colored else sc
        keep = _front_2d(xv, yv)
        if len(keep):
            ax.step(xv[keep], yv[keep], where="post", color=colors[i % 5], linewidth=1.2,
                    alpha=0.8, zorder=2)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if side_by_side:
            ax.set_title(f"{name}: {len(f)} points, {len(keep)} on the 2-D front", fontsize=9)
    axes[0].set_ylabel(ylabel)
    if log:
        for col, setter in ((x, axes[0].set_xscale), (y, axes[0].set_yscale)):
            v = np.concatenate([f[col].astype(float).to_numpy() for f in frames])
            v = v[v > 0]
            if len(v) and v.max() > 10 * v.min():
                setter("log")
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
    if not side_by_side:
        axes[0].legend(fontsize=8, frameon=False)
    if colored and sc is not None:
        fig.colorbar(sc, ax=list(axes), label=color_by.replace("_", " "), shrink=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# --------------------------------------------------------------------------------------------
# Scaling curve
# --------------------------------------------------------------------------------------------
def scaling_frame(
    model: Any,
    cluster: Any,
    gpu_counts: Iterable[int],
    training: Any = None,
    *,
    strategy: str = "grid",
    **plan_kwargs: Any,
) -> pd.DataFrame:
    """The best configuration of ``model`` at each GPU count (one :func:`search.plan` each).

    Returns a DataFrame: ``gpus``, ``tokens_per_s``, ``tokens_per_s_per_gpu``, ``step_time_s``,
    ``mfu``, ``peak_memory_bytes``, ``config`` (label); NaN where nothing fits or no
    configuration is valid (``config`` then says why, shortened).
    """

    rows = []
    for n in gpu_counts:
        n = int(n)
        row: dict[str, Any] = {"gpus": n, "tokens_per_s": np.nan, "tokens_per_s_per_gpu": np.nan,
                               "step_time_s": np.nan, "mfu": np.nan,
                               "peak_memory_bytes": np.nan, "config": ""}
        try:
            r = plan(model, cluster, training, gpus=n, strategy=strategy, top=1, **plan_kwargs)
        except SpecError as err:
            row["config"] = str(err)[:80]
            rows.append(row)
            continue
        if not r.fits_any:
            row["config"] = "nothing fits"
            rows.append(row)
            continue
        b = r.best.iloc[0]
        row.update(tokens_per_s=float(b["tokens_per_s"]),
                   tokens_per_s_per_gpu=float(b["tokens_per_s"]) / n,
                   step_time_s=float(b["step_time_s"]), mfu=float(b["mfu"]),
                   peak_memory_bytes=float(b["peak_memory_bytes"]), config=config_label(b))
        rows.append(row)
    return pd.DataFrame(rows)


def plot_scaling_curve(
    model: Any,
    cluster: Any,
    gpu_counts: Iterable[int],
    training: Any = None,
    *,
    frame: pd.DataFrame | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool = True,
    **plan_kwargs: Any,
) -> Figure:
    """Throughput (tokens/s) of the best configuration versus GPU count for a fixed model,
    with ideal linear scaling from the smallest count (dashed) and MFU on the right axis.

    Parameters
    ----------
    model, cluster, training : as :func:`search.plan` (names, paths or specs).
    gpu_counts : GPU counts to search (each a :func:`search.plan` call: keep the space small
        by pinning dimensions in ``plan_kwargs``, e.g. ``zero_stage=1``).
    frame : a :func:`scaling_frame` result to draw instead of searching.
    ax, title : as the other plots.
    annotate : write the chosen configuration next to each point.
    **plan_kwargs : passed to :func:`search.plan` (``strategy``, ``global_batch_size``, pins).

    Returns
    -------
    matplotlib.figure.Figure
    """
    if frame is None:
        frame = scaling_frame(model, cluster, gpu_counts, training, **plan_kwargs)
    df = frame.dropna(subset=["tokens_per_s"])
    fig, ax = _new_axes(ax, (7.0, 4.2))
    g = df["gpus"].to_numpy(dtype=float)
    tps = df["tokens_per_s"].to_numpy(dtype=float)
    ax.plot(g, tps, "o-", color="#4C72B0", label="best configuration")
    if len(g):
        ax.plot(g, tps[0] * g / g[0], "--", color="gray", label="linear scaling")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if len(g):
        ax.set_xticks(g)
        ax.set_xticklabels([f"{int(v)}" for v in g])
        ax.set_xlim(g.min() / 1.3, g.max() * 1.8)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("throughput [tokens/s]")
    if annotate:
        for gi, ti, c in zip(g, tps, df["config"]):
            ax.annotate(c, (gi, ti), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax2 = ax.twinx()
    ax2.plot(g, df["mfu"].to_numpy(dtype=float) * 100, "s:", color="#C44E52", label="MFU")
    ax2.set_ylabel("MFU [%]", color="#C44E52")
    ax2.set_ylim(0, 100)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left", frameon=False)
    name = getattr(model, "name", model)
    cname = getattr(cluster, "name", cluster)
    ax.set_title(title or f"{name} on {cname}: best configuration per GPU count", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# All-reduce algorithms versus message size
# --------------------------------------------------------------------------------------------
_AR_ALGOS = ("ring", "tree", "hierarchical")
_AR_COLORS = {"ring": "#4C72B0", "tree": "#DD8452", "hierarchical": "#55A868"}


def allreduce_frame(
    cluster: str | ClusterSpec,
    sizes_bytes: Any = None,
    *,
    n: int | None = None,
    stride: int = 1,
) -> pd.DataFrame:
    """Ring, tree and hierarchical all-reduce time [s] versus buffer size on a cluster.

    The group of ``n`` GPUs (default all of them), ``stride`` ranks apart, is placed on the
    cluster's tiers by :func:`perfmodel.parallel.topology.group_placement`: flat ring and tree run at the
    bandwidth and latency of the slowest tier they cross; hierarchical is reduce-scatter inside
    each scale-up domain, all-reduce across domains, all-gather inside
    (:mod:`perfmodel.hardware.collectives`).

    Returns a DataFrame: ``size_bytes``, ``ring_s``, ``tree_s``, ``hierarchical_s``, ``best``.
    """

    c = load_cluster(cluster) if not hasattr(cluster, "tiers") else cluster
    n = c.total_gpus if n is None else int(n)
    sizes = (np.logspace(10, 36, 261, base=2.0) if sizes_bytes is None
             else np.asarray(sizes_bytes, dtype=np.float64))
    g = group_placement(c, n, stride)
    t = {
        "ring": coll.ring_all_reduce_time(sizes, g.size, g.bw_bytes_per_s, g.latency_s),
        "tree": coll.tree_all_reduce_time(sizes, g.size, g.bw_bytes_per_s, g.latency_s),
        "hierarchical": coll.hierarchical_all_reduce_time(
            sizes, g.intra_size, g.inter_size, g.intra_bw_bytes_per_s, g.inter_bw_bytes_per_s,
            g.intra_latency_s, g.inter_latency_s),
    }
    df = pd.DataFrame({"size_bytes": sizes, **{f"{a}_s": t[a] for a in _AR_ALGOS}})
    df["best"] = np.asarray(_AR_ALGOS)[np.argmin(np.stack([t[a] for a in _AR_ALGOS]), axis=0)]
    df.attrs.update(cluster=c.name, n=n, intra_size=float(g.intra_size),
                    inter_size=float(g.inter_size))
    return df


def allreduce_crossovers(frame: pd.DataFrame) -> pd.DataFrame:
    """Message sizes where one all-reduce algorithm overtakes another, from
    :func:`allreduce_frame` (log-linear interpolation between grid points).

    Returns a DataFrame: ``faster_below``, ``faster_above``, ``size_bytes``, ``time_s``,
    ``changes_best`` (the fastest of the three changes there).
    """
    s = frame["size_bytes"].to_numpy(dtype=float)
    best = frame["best"].to_numpy()
    rows = []
    for i, a in enumerate(_AR_ALGOS):
        for b in _AR_ALGOS[i + 1:]:
            ta, tb = frame[f"{a}_s"].to_numpy(float), frame[f"{b}_s"].to_numpy(float)
            d = np.log(ta) - np.log(tb)
            for k in np.nonzero(np.sign(d[:-1]) * np.sign(d[1:]) < 0)[0]:
                w = d[k] / (d[k] - d[k + 1])
                size = float(np.exp(np.log(s[k]) + w * (np.log(s[k + 1]) - np.log(s[k]))))
                tt = float(np.exp(np.log(ta[k]) + w * (np.log(ta[k + 1]) - np.log(ta[k]))))
                below, above = (a, b) if d[k] < 0 else (b, a)
                changes = {best[k], best[k + 1]} == {a, b}
                rows.append({"faster_below": below, "faster_above": above, "size_bytes": size,
                             "time_s": tt, "changes_best": bool(changes)})
    return pd.DataFrame(rows, columns=["faster_below", "faster_above", "size_bytes", "time_s",
                                       "changes_best"]).sort_values("size_bytes",
                                                                    ignore_index=True)


def plot_allreduce_vs_size(
    cluster: str | ClusterSpec,
    *,
    n: int | None = None,
    sizes_bytes: Any = None,
    stride: int = 1,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Ring versus tree versus hierarchical all-reduce time against message size (log-log),
    crossover points marked (filled where the fastest algorithm changes).

    Parameters
    ----------
    cluster : preset name, path or ClusterSpec.
    n, sizes_bytes, stride : see :func:`allreduce_frame`.
    ax, title : as the other plots.

    Returns
    -------
    matplotlib.figure.Figure
    """
    df = allreduce_frame(cluster, sizes_bytes, n=n, stride=stride)
    xo = allreduce_crossovers(df)
    fig, ax = _new_axes(ax, (7.0, 4.5))
    s = df["size_bytes"].to_numpy()
    for a in _AR_ALGOS:
        ax.plot(s, df[f"{a}_s"].to_numpy(), color=_AR_COLORS[a], label=a, linewidth=1.6)
    for _, r in xo.iterrows():
        ax.plot(r["size_bytes"], r["time_s"], "o", markersize=7,
                markerfacecolor="black" if r["changes_best"] else "white",
                markeredgecolor="black", zorder=4)
        if r["changes_best"]:
            ax.axvline(r["size_bytes"], color="black", linestyle=":", linewidth=0.8)
            ax.annotate(f"{units.fmt_bytes(r['size_bytes'])}\n{r['faster_below']}→"
                        f"{r['faster_above']}", (r["size_bytes"], r["time_s"]),
                        textcoords="offset points", xytext=(5, 12), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [2.0 ** k for k in range(10, 41, 5) if s.min() <= 2.0 ** k <= s.max()]
    ax.set_xticks(ticks)
    ax.set_xticklabels([units.fmt_bytes(t).replace(".00", "") for t in ticks], fontsize=8)
    ax.set_xlabel("message size per GPU")
    ax.set_ylabel("all-reduce time [s]")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    a = df.attrs
    ax.set_title(title or f"{a['cluster']}: all-reduce over {a['n']} GPUs "
                 f"({a['intra_size']:.0f} per scale-up domain x {a['inter_size']:.0f})",
                 fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------
def plot_validation_scatter(
    report: pd.DataFrame,
    *,
    measured: str = "measured_s",
    predicted: str = "predicted_s",
    label: str = "row_id",
    color_by: str | None = "scope",
    band: float = 0.2,
    errors: bool = True,
    title: str | None = None,
) -> Figure:
    """Predicted versus measured (log-log, ``y = x`` and a +-``band`` cone), and, with
    ``errors``, the signed error per row as bars.

    Parameters
    ----------
    report : DataFrame with the measured and predicted columns (e.g.
        :func:`validation.validate.training_runs_report`'s first frame).
    measured, predicted, label : column names; ``label`` names the rows outside the band.
    color_by : a categorical column to colour the points by (if present).
    band : relative error drawn as the acceptance cone (0.2 = +-20 %).
    errors : add the per-row error panel.
    title : figure title (default the mean absolute percentage error).

    Returns
    -------
    matplotlib.figure.Figure
    """
    df = report.reset_index(drop=True)
    meas = df[measured].to_numpy(dtype=float)
    pred = df[predicted].to_numpy(dtype=float)
    err = pred / meas - 1.0
    fig = Figure(figsize=(12.0 if errors else 5.5, 5.0))
    if errors:
        ax, axe = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    else:
        ax, axe = fig.add_subplot(1, 1, 1), None
    groups = (df[color_by].astype(str) if color_by and color_by in df.columns
              else pd.Series(["rows"] * len(df)))
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]
    for i, gname in enumerate(pd.unique(groups)):
        mk = (groups == gname).to_numpy()
        ax.scatter(meas[mk], pred[mk], s=22, color=palette[i % 6], label=str(gname),
                   edgecolor="black", linewidth=0.3, zorder=3)
    lo = float(np.nanmin([meas.min(), pred.min()])) / 1.5
    hi = float(np.nanmax([meas.max(), pred.max()])) * 1.5
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k-", linewidth=0.8)
    ax.fill_between(xs, xs * (1 - band), xs * (1 + band), color="gray", alpha=0.15,
                    label=f"±{band:.0%}")
    if label in df.columns:
        for i in np.nonzero(np.abs(err) > band)[0]:
            ax.annotate(str(df.loc[i, label]), (meas[i], pred[i]), textcoords="offset points",
                        xytext=(3, 3), fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"published {measured}")
    ax.set_ylabel(f"predicted {predicted}")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    if axe is not None:
        x = np.arange(len(df))
        colors = np.where(np.abs(err) > band, "#C44E52", "#4C72B0")
        axe.bar(x, err * 100, color=colors)
        for yv in (-band, band):
            axe.axhline(yv * 100, color="gray", linestyle="--", linewidth=0.8)
        axe.axhline(0, color="black", linewidth=0.6)
        axe.set_xticks(x)
        axe.set_xticklabels(df[label].astype(str) if label in df.columns else x, rotation=90,
                            fontsize=6)
        axe.set_ylabel("error (predicted / published - 1) [%]")
        axe.grid(alpha=0.3, axis="y")
    mape = float(np.nanmean(np.abs(err)))
    within = float(np.nanmean(np.abs(err) <= band))
    fig.suptitle(title or f"{len(df)} rows: mean |error| {mape:.1%}, {within:.0%} within "
                 f"±{band:.0%}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_config_timeline(
    model: Any,
    training: Any,
    cluster: Any,
    config: Any,
    *,
    kernels: str = "fused",
    ax: Axes | None = None,
    labels: bool = False,
) -> Figure:
    """Gantt chart of one configuration's step with its Megatron-LM layer layout: per-chunk
    times from :func:`perfmodel.parallel.layers.stage_layer_table` and the compute model, simulated by
    :func:`perfmodel.pipeline.schedules.simulate` (the layers of rank 0's and the last rank's chunks are
    in the title). ``config`` is a resolved :class:`~perfmodel.parallel.config.ParallelConfig`."""

    c = config
    batch = ConfigBatch.from_configs([c])
    ct = compute.compute_times(model, training, cluster.gpu, batch, kernels=kernels)
    table = stage_layer_table(model.num_layers, c.pp, c.vp, c.first_stage_layers or 0,
                              c.last_stage_layers or 0, c.embedding_as_layer, c.loss_as_layer)
    val = {k: float(np.asarray(v)[0]) for k, v in ct.items()}
    if getattr(c, "stage_layers", None):  # a per-stage layout of search/dp.py

        table = np.array([[n // c.vp] * c.vp for n in c.stage_layers])
        tl = layout_timeline(model, training, cluster, c, kernels=kernels)
    else:
        fwd, bwd = layout_chunk_times(
            table, val["layer_fwd_s"], val["layer_bwd_s"] + val["layer_recompute_s"],
            val["embed_fwd_s"], val["embed_bwd_s"], val["logits_fwd_s"], val["logits_bwd_s"])
        tl = simulate(fwd, bwd, int(c.num_microbatches), c.schedule, v=c.vp)
    title = (f"{model.name}: pp={c.pp} vp={c.vp} m={c.num_microbatches}, layers of rank 0 "
             f"{'/'.join(map(str, table[0]))}, of rank {c.pp - 1} "
             f"{'/'.join(map(str, table[-1]))}; makespan {tl.makespan_s:.3g} s")
    return plot_pipeline_timeline(tl, ax=ax, title=title, labels=labels)


# --------------------------------------------------------------------------------------------
# The whole run: goodput, days and cost versus GPU count
# --------------------------------------------------------------------------------------------
_TRAIN_COLS = ("days", "gpu_hours", "energy_mwh", "cost", "expected_interruptions",
               "checkpoint_interval_s", "goodput", "wall_s")


def train_frame(
    model: Any,
    cluster: Any,
    gpu_counts: Iterable[int],
    training: Any = None,
    *,
    train_tokens: float | None = None,
    train_steps: int | None = None,
    **plan_kwargs: Any,
) -> pd.DataFrame:
    """The whole run of the best configuration at each GPU count (one :func:`search.plan`
    each, with ``train_tokens`` or ``train_steps``).

    Returns a DataFrame: ``gpus``, ``step_time_s``, the run's ``days``, ``gpu_hours``,
    ``energy_mwh``, ``cost``, ``expected_interruptions``, ``checkpoint_interval_s``,
    ``goodput``, ``wall_s`` (:class:`perfmodel.run.TrainRun`), ``config``; NaN where nothing
    fits (``config`` says why).
    """
    rows = []
    for n in gpu_counts:
        row: dict[str, Any] = {"gpus": int(n), "step_time_s": np.nan, "config": "",
                               **dict.fromkeys(_TRAIN_COLS, np.nan)}
        try:
            r = plan(model, cluster, training, gpus=int(n), top=1, train_tokens=train_tokens,
                     train_steps=train_steps, **plan_kwargs)
        except SpecError as err:
            row["config"] = str(err)[:80]
            rows.append(row)
            continue
        if not r.fits_any:
            row["config"] = "nothing fits"
            rows.append(row)
            continue
        t = r.train.to_dict()
        row.update({k: np.nan if t[k] is None else t[k] for k in _TRAIN_COLS})
        row.update(step_time_s=r.rows[0]["step_time_s"], config=config_label(r.best.iloc[0]))
        rows.append(row)
    return pd.DataFrame(rows)


def plot_goodput_vs_gpus(frame: pd.DataFrame, *, ax: Axes | None = None,
                         title: str | None = None) -> Figure:
    """Goodput (useful / wall time) and days to train versus GPU count, from a
    :func:`train_frame`: more GPUs finish sooner but are interrupted more often.

    Returns
    -------
    matplotlib.figure.Figure
    """
    df = frame.dropna(subset=["goodput"])
    fig, ax = _new_axes(ax, (7.0, 4.2))
    g = df["gpus"].to_numpy(dtype=float)
    ax.plot(g, df["goodput"].to_numpy(dtype=float) * 100, "o-", color="#4C72B0",
            label="goodput")
    ax.set_xscale("log", base=2)
    if len(g):
        ax.set_xticks(g)
        ax.set_xticklabels([f"{int(v)}" for v in g])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("goodput [% of wall time training]", color="#4C72B0")
    ax2 = ax.twinx()
    ax2.plot(g, df["days"].to_numpy(dtype=float), "s:", color="#C44E52", label="days")
    ax2.set_ylabel("time to train [days]", color="#C44E52")
    ax2.set_yscale("log")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left", frameon=False)
    ax.set_title(title or "goodput and time to train versus GPU count", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def plot_cost_vs_days(frame: pd.DataFrame, *, ax: Axes | None = None,
                      title: str | None = None) -> Figure:
    """GPU-hours (or cost, where priced) versus days to train, one point per GPU count of a
    :func:`train_frame`, the Pareto front (neither faster nor cheaper) joined.

    Returns
    -------
    matplotlib.figure.Figure
    """
    priced = frame["cost"].notna().any()
    col = "cost" if priced else "gpu_hours"
    df = frame.dropna(subset=["days", col])
    fig, ax = _new_axes(ax, (6.0, 4.2))
    x = df["days"].to_numpy(dtype=float)
    y = df[col].to_numpy(dtype=float)
    ax.scatter(x, y, color="#4C72B0", zorder=3)
    for xi, yi, n in zip(x, y, df["gpus"]):
        ax.annotate(f"{int(n)} GPUs", (xi, yi), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)
    front = _front_2d(x, y)
    order = front[np.argsort(x[front])]
    ax.plot(x[order], y[order], "-", color="gray", label="Pareto front")
    ax.set_xlabel("time to train [days]")
    ax.set_ylabel("cost" if priced else "GPU-hours")
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(title or "cost versus time to train", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
