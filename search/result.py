"""One result type for every strategy: best, top-k and Pareto configurations plus statistics.

A strategy only decides *which* configurations (flat indices of the space) to report;
:func:`finalize` evaluates those few again through the same path and builds the tables, so
every strategy's output has the same columns and JSON shape.

Columns (``top`` / ``pareto``: pandas DataFrames, built when first read; ``top_columns`` /
``pareto_columns``: the same columns as numpy arrays): the configuration fields, ``gpus``, ``step_time_s``, ``tokens_per_s``,
``mfu``, ``hfu``, ``fits``, ``peak_memory_bytes``, ``<term>_time_s`` (one per step-time term),
``<term>_memory_bytes``, ``<dim>_comm_bytes_per_gpu``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.compute.layer import sustained_gemm_fraction
from perfmodel.core import units
from perfmodel.core.codes import COMPRESSION, CP_COMM, RECOMPUTE, SCHEDULE
from perfmodel.core.frames import data_frame
from perfmodel.hardware.calibration import calibration_for
from perfmodel.hardware.kernel_tables import kernel_table_notes
from perfmodel.hardware.overlap import gpu_generation
from perfmodel.parallel.config import ConfigBatch
from search.intervals import Interval, interval_for
from search.space import PARETO_OBJECTIVES, PARETO_SETS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Diagnostic",
    "SearchResult",
    "diagnose",
    "explain_difference",
    "finalize",
    "finalize_batch",
    "finalize_tally",
]

#: Thresholds of the diagnostics (second seed, "monitoring": bubble > 0.3, comm ratio > 0.4).
BUBBLE_SHARE_MAX = 0.30
EXPOSED_COMM_SHARE_MAX = 0.40
MEMORY_HEADROOM_MIN = 0.05

_CONFIG_COLS = (
    "dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "num_microbatches",
    "recompute", "sequence_parallel", "schedule", "grad_compression", "ep", "etp", "cp_comm",
)


@dataclass(frozen=True)
class Diagnostic:
    """A flagged property of a configuration: what, how much, the limit, and what to change."""

    name: str
    value: float
    limit: float
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "limit": self.limit,
                "message": self.message}


#: A table as ``column -> array`` (one value per configuration), in column order.
Columns = dict[str, np.ndarray]


def _rows(batch: ConfigBatch, res: Any) -> tuple[Columns, list[dict[str, Any]]]:
    """Columns and JSON rows of an evaluated batch (the StepResult contract's arrays)."""
    n = len(batch)
    cols: dict[str, Any] = {
        "dp": batch.dp, "tp": batch.tp, "pp": batch.pp, "vp": batch.vp, "cp": batch.cp,
        "zero_stage": batch.zero_stage, "micro_batch_size": batch.micro_batch_size,
        "num_microbatches": batch.num_microbatches,
        "recompute": np.asarray(RECOMPUTE)[batch.recompute],
        "sequence_parallel": batch.sequence_parallel,
        "schedule": np.asarray(SCHEDULE)[batch.schedule],
        "grad_compression": np.asarray(COMPRESSION)[batch.grad_compression],
        "ep": batch.ep, "etp": batch.etp,
        "cp_comm": np.asarray(CP_COMM)[batch.cp_comm],
        "gpus": batch.gpus,
        "step_time_s": np.asarray(res.step_time_s, dtype=float),
        "tokens_per_s": np.asarray(res.tokens_per_s, dtype=float),
        "mfu": np.asarray(res.mfu, dtype=float),
        "hfu": np.asarray(getattr(res, "hfu", res.mfu), dtype=float),
        "fits": np.asarray(res.fits, dtype=bool),
        "peak_memory_bytes": np.asarray(res.memory_bytes["peak"], dtype=float),
    }
    cols.update({f"{k}_time_s": np.asarray(v, dtype=float) for k, v in res.time_s.items()})
    cols.update({f"{k}_memory_bytes": np.asarray(v, dtype=float)
                 for k, v in res.memory_bytes.items() if k != "peak"})
    cols.update({f"{k}_comm_bytes_per_gpu": np.asarray(v, dtype=float)
                 for k, v in res.comm_bytes_per_gpu.items()})
    frame = {k: np.array(np.broadcast_to(v, (n,))) for k, v in cols.items()}
    rows = []
    for i in range(n):  # only the handful of reported configurations
        rows.append({
            "config": batch.config(i).model_dump(),
            "gpus": int(batch.gpus[i]),
            "step_time_s": float(res.step_time_s[i]),
            "tokens_per_s": float(res.tokens_per_s[i]),
            "mfu": float(res.mfu[i]),
            "hfu": float(np.asarray(getattr(res, "hfu", res.mfu))[i]),
            "fits": bool(res.fits[i]),
            "memory_bytes": {k: float(v[i]) for k, v in res.memory_bytes.items()},
            "time_s": {k: float(v[i]) for k, v in res.time_s.items()},
            "comm_bytes_per_gpu": {k: float(v[i]) for k, v in res.comm_bytes_per_gpu.items()},
            # per-tier port busy time over the step (perfmodel.step.evaluate: shared links)
            "link_busy_s": {k[len("link_busy_"):-2]: float(np.asarray(v)[i])
                            for k, v in getattr(res, "extra", {}).items()
                            if k.startswith("link_busy_")},
        })
    return frame, rows


def diagnose(row: dict[str, Any], hbm_bytes: float) -> list[Diagnostic]:
    """Flag a configuration's pipeline bubble, exposed communication and memory headroom.

    The second seed's "monitoring" section measures these on a running job; here they are
    computed from the prediction: bubble share = ``time_s['bubble'] / step_time_s`` (> 30%),
    exposed communication share = sum of the ``*_comm`` terms / step time (> 40%), memory
    headroom = ``1 - peak / HBM`` (< 5%).

    Note: the seed advises "increase the micro-batch size" against a large bubble. With a fixed
    global batch that *lowers* the number of micro-batches ``m`` and raises the bubble
    ``(p-1)/m`` (Narayanan et al. 2021, Sec. 2.2.1); what helps is more micro-batches (a smaller
    micro-batch or a larger global batch), interleaving (bubble / v) or fewer stages.
    """
    out = []
    step = row["step_time_s"]
    t = row["time_s"]
    cfg = row["config"]
    bubble = t.get("bubble", 0.0) / step if step > 0 else 0.0
    if bubble > BUBBLE_SHARE_MAX:
        advice = [(f"more micro-batches (now {cfg['num_microbatches']}: smaller micro-batch "
                  "or larger global batch)")]
        if cfg["schedule"] != "interleaved":
            advice.append("the interleaved schedule (vp > 1)")
        advice.append(f"fewer pipeline stages (pp now {cfg['pp']})")
        out.append(Diagnostic("bubble_share", bubble, BUBBLE_SHARE_MAX,
                              f"pipeline bubble is {bubble:.0%} of the step (> 30%): use "
                              + ", ".join(advice)))
    comm_terms = {k: v for k, v in t.items() if k.endswith("comm")}
    comm = sum(comm_terms.values()) / step if step > 0 else 0.0
    if comm > EXPOSED_COMM_SHARE_MAX:
        worst = max(comm_terms, key=comm_terms.get)
        tips = {
            "tp_comm": "smaller tp, tp inside the NVLink domain, or sequence parallelism",
            "cp_comm": "smaller cp (or a longer sequence per GPU to hide ring attention)",
            "pp_comm": "fewer pipeline stages or overlapped p2p",
            "dp_comm": "overlap the gradient reduce with the backward, a larger micro-batch "
                       "per reduce, ZeRO-1 instead of ZeRO-3, or gradient compression",
            "zero3_comm": "ZeRO-1/2 instead of ZeRO-3 if it fits, or more tp/pp",
        }
        out.append(Diagnostic("exposed_comm_share", comm, EXPOSED_COMM_SHARE_MAX,
                              f"exposed communication is {comm:.0%} of the step (> 40%), "
                              f"mostly {worst}: try {tips.get(worst, 'less of it')}"))
    peak = row["memory_bytes"]["peak"]
    headroom = 1.0 - peak / hbm_bytes
    if headroom < MEMORY_HEADROOM_MIN:
        what = "over" if headroom < 0 else "within"
        out.append(Diagnostic("memory_headroom", headroom, MEMORY_HEADROOM_MIN,
                              f"peak memory {units.fmt_bytes(peak)} is {what} 5% of HBM "
                              f"({units.fmt_bytes(hbm_bytes)}): fragmentation may OOM; use a "
                              "higher ZeRO stage, selective/full recompute, a smaller "
                              "micro-batch or more tp/pp"))
    return out


def explain_difference(best: dict[str, Any], other: dict[str, Any], objective: str = "time"
                       ) -> str:
    """Why ``other`` ranks below ``best``: the config fields that differ and the largest
    step-time (or memory) terms that grew. One short line."""
    ca, cb = best["config"], other["config"]
    a, b = best, other
    short = {"zero_stage": "zero", "micro_batch_size": "mbs", "num_microbatches": "m",
             "sequence_parallel": "sp"}
    follows_tp = ca.get("etp", ca["tp"]) == ca["tp"] and cb.get("etp", cb["tp"]) == cb["tp"]
    diffs = [f"{short.get(k, k)} {_fmt(ca[k])}->{_fmt(cb[k])}" for k in ca
             if k in _CONFIG_COLS and ca[k] != cb[k] and not (k == "etp" and follows_tp)]
    if objective == "memory":
        d = {k: b["memory_bytes"][k] - a["memory_bytes"].get(k, 0.0)
             for k in b["memory_bytes"] if k != "peak"}
        worst = sorted((k for k in d if d[k] > 0), key=d.get, reverse=True)[:2]
        delta = b["memory_bytes"]["peak"] - a["memory_bytes"]["peak"]
        why = f"+{units.fmt_bytes(delta)} peak" + "".join(
            f", {k} +{units.fmt_bytes(d[k])}" for k in worst)
    else:
        d = {k: b["time_s"][k] - a["time_s"].get(k, 0.0) for k in b["time_s"]}
        worst = sorted((k for k in d if d[k] > 0), key=d.get, reverse=True)[:2]
        delta = b["step_time_s"] - a["step_time_s"]
        rel = delta / a["step_time_s"] if a["step_time_s"] > 0 else 0.0
        sign = "+" if delta >= 0 else "-"
        why = f"{sign}{units.fmt_seconds(abs(delta))} ({rel:+.1%})" + "".join(
            f", {k} +{units.fmt_seconds(d[k])}" for k in worst)
        if objective == "cost" and b["gpus"] != a["gpus"]:
            why += f", {b['gpus']} GPUs vs {a['gpus']}"
    return (", ".join(diffs) + ": " if diffs else "") + why


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


@dataclass(frozen=True, eq=False)
class SearchResult:
    """What every strategy returns.

    Attributes
    ----------
    best, top, pareto : pandas.DataFrame
        The best configuration (one row, or empty when nothing fits), the top-k by the
        objective, and the Pareto front over (step time, peak memory, GPUs); unit-named columns.
        Built from ``top_columns`` / ``pareto_columns`` when first read (pandas is loaded then).
    top_columns, pareto_columns : dict of str to numpy.ndarray
        The same tables as columns.
    rows : list of dict
        JSON objects of ``top`` (``rows[0]`` is the best), shaped like ``StepResult.row``.
    strategy, objective : str
    evaluated, feasible : int
        Configurations evaluated by the cost model (structurally valid), and of those, how
        many fit in memory.
    seconds : float
        Wall time of the search.
    space_size : int
        Gene vectors in the space (before constraints).
    """

    strategy: str
    objective: str
    evaluated: int
    feasible: int
    seconds: float
    space_size: int
    top_columns: Columns
    pareto_columns: Columns
    rows: list[dict[str, Any]]
    pareto_rows: list[dict[str, Any]]
    hbm_bytes: float
    smallest: dict[str, Any] | None = None
    gpus_available: int = 0
    usable_bytes: float = 0.0
    memory_headroom: float = 0.0
    limits: dict[str, float] = field(default_factory=dict)
    setup: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    #: the whole run of the ``top`` configurations (perfmodel.run.TrainRun) when the search
    #: was given its length (train_tokens or train_steps)
    train: Any = None
    #: the best step time (``time``) and GPU-seconds per step (``cost``) among the evaluated
    #: configurations that memory alone kept out (search.pareto.Tally.unfit_floor; empty when
    #: the strategy does not say): a search for less memory (offload) cannot beat the best
    #: where these are no better
    unfit_floor: dict[str, float] = field(default_factory=dict)

    @functools.cached_property
    def top(self) -> pd.DataFrame:
        """The top-k configurations as a DataFrame (``top_columns``)."""
        return _frame(self.top_columns)

    @functools.cached_property
    def pareto(self) -> pd.DataFrame:
        """The Pareto front as a DataFrame (``pareto_columns``)."""
        return _frame(self.pareto_columns)

    @property
    def best(self) -> pd.DataFrame:
        return self.top.head(1)

    @property
    def fits_any(self) -> bool:
        return bool(self.rows)

    @property
    def best_row(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return diagnose(self.rows[0], self.hbm_bytes) if self.rows else []

    def why_nothing_fits(self) -> str:
        """One line: the smallest footprint found and what it would need."""
        if self.smallest is None:
            return "no configuration was evaluated"
        peak = self.smallest["memory_bytes"]["peak"]
        c = self.smallest["config"]
        usable = self.usable_bytes or self.hbm_bytes
        cfg = (f"dp={c['dp']} tp={c['tp']} pp={c['pp']} cp={c['cp']} zero={c['zero_stage']} "
               f"mbs={c['micro_batch_size']} recompute={c['recompute']}")
        if peak <= usable and self.limits:
            lim = ", ".join(f"{k} {units.fmt_bytes(v) if 'memory' in k else f'{v:.3g} s'}"
                            for k, v in self.limits.items())
            return (f"nothing meets the limits ({lim}); the smallest footprint found is "
                    f"{units.fmt_bytes(peak)} per GPU ({cfg})")
        gap = peak - usable
        return (
            f"nothing fits: the smallest footprint found is {units.fmt_bytes(peak)} per GPU "
            f"({cfg}) but only {units.fmt_bytes(usable)} is usable (HBM "
            f"{units.fmt_bytes(self.hbm_bytes)} less the reserve less "
            f"{self.memory_headroom:.0%} headroom): {units.fmt_bytes(gap)} too much; a GPU "
            f"with more memory, about {peak / usable:.1f}x the GPUs, or a smaller model, "
            "sequence or micro-batch"
        )

    def explain(self, i: int) -> str:
        """Why the i-th of the top ranks below the best."""
        return explain_difference(self.rows[0], self.rows[i], self.objective)

    def breakdown(self, i: int = 0) -> dict[str, list[tuple[str, float, float]]]:
        """Terms of the i-th top configuration: ``time`` (name, seconds, share of the step),
        ``memory`` (name, bytes, share of HBM), ``comm`` (dim, bytes per GPU per step, 0)."""
        r = self.rows[i] if self.rows else self.smallest
        if r is None:
            return {"time": [], "memory": [], "comm": []}
        step = r["step_time_s"]
        return {
            "time": [(k, v, v / step if step > 0 else 0.0) for k, v in r["time_s"].items()],
            "memory": [(k, v, v / self.hbm_bytes) for k, v in r["memory_bytes"].items()],
            "comm": [(k, v, 0.0) for k, v in r["comm_bytes_per_gpu"].items()],
        }

    def stats(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "objective": self.objective,
                "evaluated": self.evaluated, "feasible": self.feasible,
                "seconds": self.seconds, "space_size": self.space_size, **self.extra}

    def to_json(self) -> dict[str, Any]:
        """The CLI's ``--json`` document: ``best``, ``top``, ``pareto``, ``diagnostics``,
        ``search``."""
        return {
            "best": self.rows[0] if self.rows else None,
            "top": self.rows,
            "pareto": self.pareto_rows,
            "diagnostics": [d.to_json() for d in self.diagnostics],
            "setup": self.setup,
            "model_summary": self.setup.get("model_summary"),
            "search": self.stats(),
            **({"train": self.train.to_dict()} if self.train is not None else {}),
        }


def _frame(columns: Columns) -> pd.DataFrame:
    """A DataFrame of a table's columns. pandas is loaded here, when a caller asks for a
    frame: planning itself (the command line's tables and JSON) does not need it."""
    return data_frame(columns)


def _take(columns: Columns, rows: Any) -> Columns:
    """The given rows (a slice or index array) of every column, as new arrays."""
    return {k: np.array(v[rows]) for k, v in columns.items()}


def _interval_of(problem: Any) -> Interval:
    """The 80 % interval of the problem's predictions (:mod:`search.intervals`): its GPU
    generation, precision, dense / MoE model and framework, and the efficiency profile whose
    runs' residuals may give it."""
    space = problem.space
    fw = None if space.framework is None else space.framework.name
    return interval_for(gpu_generation(space.cluster.gpu), space.training.precision_name,
                        bool(space.model.is_moe), fw,
                        getattr(problem, "efficiency_profile", None))


def _attach_intervals(frame: Columns, rows: list[dict[str, Any]], iv: Interval) -> Columns:
    """``step_time_interval_s`` ([low, high] seconds), ``tokens_per_s_interval`` and
    ``mfu_interval`` on every JSON row; ``step_time_low_s`` / ``step_time_high_s`` columns."""
    for row in rows:
        step, tps, mfu = row["step_time_s"], row["tokens_per_s"], row["mfu"]
        row["step_time_interval_s"] = [step * iv.low, step * iv.high]
        row["tokens_per_s_interval"] = [tps / iv.high, tps / iv.low]
        row["mfu_interval"] = [mfu / iv.high, mfu / iv.low]
    return frame | {"step_time_low_s": frame["step_time_s"] * iv.low,
                    "step_time_high_s": frame["step_time_s"] * iv.high}


def model_summary(m: Any) -> dict[str, Any]:
    """The model as read (a preset or a Hugging Face ``config.json``), for the user to check
    before trusting a plan: parameters total and active (per token), layers, hidden size,
    attention heads and KV groups, experts and top-k (1 and 1 for a dense model)."""
    return {"params_total": int(m.param_count()), "params_active": int(m.active_param_count()),
            "num_layers": int(m.num_layers), "hidden_size": int(m.hidden_size),
            "num_attention_heads": int(m.num_attention_heads), "kv_heads": int(m.kv_heads),
            "num_experts": int(m.num_experts), "moe_top_k": int(m.moe_top_k)}


def finalize(
    problem: Any,
    *,
    strategy: str,
    top_flat: np.ndarray,
    pareto_flat: np.ndarray,
    smallest_flat: np.ndarray,
    evaluated: int,
    feasible: int,
    seconds: float,
    extra: dict[str, Any] | None = None,
    unfit_floor: dict[str, float] | None = None,
) -> SearchResult:
    """Evaluate the reported configurations once more and build the :class:`SearchResult`.

    ``top_flat`` must already be ordered best first; ``pareto_flat`` is ordered here by step
    time.
    """
    space = problem.space
    top_flat = np.asarray(top_flat, dtype=np.int64)
    pareto_flat = np.asarray(pareto_flat, dtype=np.int64)
    smallest_flat = np.asarray(smallest_flat, dtype=np.int64)
    allf = np.concatenate([top_flat, pareto_flat, smallest_flat])
    a, viol = space.decode_flat(allf)
    assert not viol.any(), "strategies report valid configurations only"
    return finalize_batch(problem, space.batch(a), len(top_flat), len(pareto_flat),
                          strategy=strategy, evaluated=evaluated, feasible=feasible,
                          seconds=seconds, extra=extra, unfit_floor=unfit_floor)


def finalize_batch(
    problem: Any,
    batch: ConfigBatch,
    n_top: int,
    n_pareto: int,
    *,
    strategy: str,
    evaluated: int,
    feasible: int,
    seconds: float,
    extra: dict[str, Any] | None = None,
    unfit_floor: dict[str, float] | None = None,
    result: Any = None,
) -> SearchResult:
    """:func:`finalize` from the configurations themselves: ``batch`` holds the top (best
    first), then the Pareto front, then at most one smallest-footprint configuration. For
    strategies whose configurations are not points of the space (the layouts of
    :mod:`search.strategies.dp`). ``result``: the batch's evaluation, when already done."""
    space = problem.space
    res = problem.evaluate_batch(batch) if result is None else result
    frame, rows = _rows(batch, res)
    interval = _interval_of(problem)
    frame = _attach_intervals(frame, rows, interval)
    nt, npar = n_top, n_pareto
    has_smallest = len(batch) > nt + npar
    top = _take(frame, slice(0, nt))
    if strategy == "single" and nt == 0 and has_smallest:
        # one configuration asked for: show it even though it does not fit (fits is False)
        top = _take(frame, slice(nt + npar, nt + npar + 1))
    par, order = _pareto_of(problem, res, frame, rows, nt, npar)
    pareto = _take(par, order)
    pareto_rows = [rows[nt + i] for i in order]
    smallest = rows[nt + npar] if has_smallest else None
    return SearchResult(
        strategy=strategy,
        objective=problem.objective,
        evaluated=int(evaluated),
        feasible=int(feasible),
        seconds=float(seconds),
        space_size=space.size,
        top_columns=top,
        pareto_columns=pareto,
        rows=rows[:nt],
        pareto_rows=pareto_rows,
        hbm_bytes=float(space.cluster.gpu.hbm_bytes),
        smallest=smallest,
        gpus_available=space.gpus,
        usable_bytes=float(problem.usable_bytes) if hasattr(problem, "usable_bytes") else 0.0,
        memory_headroom=float(getattr(problem, "memory_headroom", 0.0)),
        limits={k: float(v) for k, v in (
            ("max_step_time_s", getattr(problem, "max_step_time_s", None)),
            ("max_memory_bytes", getattr(problem, "max_memory_bytes", None))) if v is not None},
        setup={
            "model": space.model.name,
            "num_layers": space.model.num_layers,
            "model_summary": model_summary(space.model),
            "cluster": space.cluster.name,
            "gpu": space.cluster.gpu.name,
            "gpus": space.gpus,
            "hbm_bytes": float(space.cluster.gpu.hbm_bytes),
            "memory_headroom": float(getattr(problem, "memory_headroom", 0.0)),
            "usable_hbm_bytes": float(problem.usable_bytes)
            if hasattr(problem, "usable_bytes") else float(space.cluster.gpu.hbm_bytes),
            "global_batch_size": space.training.global_batch_size,
            "seq_len": space.training.seq_len,
            "precision": space.training.precision_name,
            "optimizer": space.training.optimizer,
            "kernels": problem.kernels,
            "framework": None if space.framework is None else space.framework.name,
            "framework_source": (getattr(problem, "assumed", None) or {}).get("framework"),
            "profile": getattr(problem, "profile", None),
            "interval": interval.basis(), "interval_source": interval.source(),
            "kernel_tables": kernel_table_notes(
                space.cluster.gpu, space.training.precision,
                calibration_for(space.cluster.gpu, getattr(problem, "calibration", None)).source,
                sustained_gemm_fraction(space.cluster.gpu) if problem.kernels == "fused" else 1.0),
            "training_switches": {k: getattr(space.training, k) for k in (
                "overlap_grad_reduce", "overlap_tp_comm", "overlap_p2p_comm",
                "flash_attention", "zero3_gather", "grad_reduce_in_fp32", "fp8_params",
                "cross_entropy", "cpu_offload_layers", "overlap_moe_comm",
                "moe_token_dispatcher", "moe_flex_backend", "moe_router_fusion",
                "cuda_graph_scope", "cuda_graph_full_iteration",
                "moe_pad_expert_input_to_capacity", "moe_parallel_folding",
                "attention_backend", "recompute_modules")}
            | _set_host_sharding_switches(space.training),
            "recompute_searched": [RECOMPUTE[int(v)] for v in space.values["recompute"]],
        },
        extra=dict(extra or {}) | _pareto_names(problem),
        unfit_floor=dict(unfit_floor or {}),
    )


def _pareto_names(problem: Any) -> dict[str, Any]:
    """``pareto_objectives`` (the front's columns) for the search's statistics when the front
    is not the step's (step time, peak memory, GPUs), so that a plan without it reports what
    it always did."""
    names = PARETO_SETS.get(getattr(problem, "pareto", ""), PARETO_OBJECTIVES)
    return {} if names == PARETO_OBJECTIVES else {"pareto_objectives": list(names)}


def _pareto_of(problem: Any, res: Any, frame: Columns, rows: list[dict[str, Any]],
               nt: int, npar: int) -> tuple[Columns, np.ndarray]:
    """The Pareto front's frame and its order: fastest step first (then smallest peak); with
    the run's length (``problem.run``) every front row also carries its whole run (``train``
    in JSON, ``train_<field>`` columns), with the bounds from the step time's interval
    (``<figure>_interval``, ``train_<figure>_low`` / ``_high``), and the run's view
    (``time-to-train-cost``) is ordered by the run's wall time (then cost)."""
    par = _take(frame, slice(nt, nt + npar))
    run = getattr(problem, "run", None)
    if run is None or npar == 0:
        order = np.lexsort((par["peak_memory_bytes"], par["step_time_s"]))
        return par, order
    sl = slice(nt, nt + npar)
    sub = SimpleNamespace(  # the front's share of the evaluation, what the run's terms read
        memory_bytes={k: np.asarray(v)[sl] for k, v in res.memory_bytes.items()},
        time_s={k: np.asarray(v)[sl] for k, v in res.time_s.items()})
    t = problem.train_of(sub, par["step_time_s"], par["gpus"],
                         (par["step_time_low_s"], par["step_time_high_s"]))
    for i in range(npar):
        rows[nt + i]["train"] = t.row(i)
    par = par | {f"train_{k}": np.array(np.broadcast_to(v, (npar,)))
                 for k, v in t.columns().items()}
    if getattr(problem, "pareto", "") == "time-to-train-cost":
        order = np.lexsort((par["train_gpu_hours"], par["train_wall_s"]))
    else:
        order = np.lexsort((par["peak_memory_bytes"], par["step_time_s"]))
    return par, order


def _set_host_sharding_switches(training: Any) -> dict[str, Any]:
    """The routing-imbalance, HSDP and offload fields of the training setup that differ from
    their defaults (so that a plan without them reports what it always did)."""
    defaults = {"moe_imbalance": None, "hsdp_shard": 0, "offload": (),
                "optimizer_offload_fraction": 1.0}
    return {k: getattr(training, k) for k, d in defaults.items() if getattr(training, k) != d}


def finalize_tally(
    problem: Any, tally: Any, *, strategy: str, t0: float, extra: dict[str, Any] | None = None
) -> SearchResult:
    """:func:`finalize` from a :class:`search.pareto.Tally` kept during a search started at
    ``t0`` (``time.perf_counter()``): the one way every strategy builds its result."""
    return finalize(
        problem,
        strategy=strategy,
        top_flat=tally.top_flat,
        pareto_flat=tally.front_flat,
        smallest_flat=tally.small_flat,
        evaluated=tally.evaluated,
        feasible=tally.feasible,
        seconds=time.perf_counter() - t0,
        extra=extra,
        unfit_floor=tally.unfit_floor(),
    )
