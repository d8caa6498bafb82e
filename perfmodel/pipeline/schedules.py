"""Pipeline-parallel schedules: bubbles, in-flight micro-batches, timelines, layer partitioning.

Four schedules, coded as in :data:`perfmodel.parallel.config.SCHEDULE`:

=====  ==============  ===================================================================
code   name            per-stage op order (stage ``s`` of ``p``, ``m`` micro-batches)
=====  ==============  ===================================================================
0      ``gpipe``       all forwards, then all backwards (Huang et al. 2019)
1      ``1f1b``        ``p-s-1`` warm-up forwards, then one forward / one backward
                       (PipeDream-Flush; Narayanan et al. 2021, Sec. 2.2.1)
2      ``interleaved`` ``v`` model chunks per device, Megatron-LM's interleaved 1F1B
                       (Narayanan et al. 2021, Sec. 2.2.2)
3      ``zb``          ZB-H1: the backward split into B (input gradient) and W (weight
                       gradient), W deferred to fill the bubble (Qi et al. 2024, Sec. 3.1)
=====  ==============  ===================================================================

Closed forms (:func:`bubble_fraction`, :func:`pipeline_time_s`, :func:`inflight_microbatches`)
are vectorized over numpy arrays and hold for uniform stages. :func:`simulate` is an
event-level simulator for one configuration: it runs each device's op order, starting every op
when its dependencies (previous stage's forward, next stage's backward, plus a p2p latency)
are done. It agrees with the closed forms on uniform stages (property-tested) and is the source
of truth for non-uniform stages (embedding on the first stage, logits on the last).

Time convention: ``t_bwd_s`` / ``stage_bwd_s`` is always the *whole* backward of a micro-batch
(input gradient + weight gradient), so the same numbers serve every schedule. ``t_w_s`` /
``stage_w_s`` is the weight-gradient part of it, split off only by ZB-H1 (default: half, since
the input-gradient and weight-gradient GEMMs have the same FLOPs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from perfmodel.core.codes import SCHEDULE, Schedule
from perfmodel.core.frames import data_frame

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "SCHEDULE",
    "Timeline",
    "bubble_fraction",
    "inflight_microbatches",
    "pipeline_efficiency",
    "pipeline_time_s",
    "schedule_code",
    "simulate",
    "stage_op_order",
]



def schedule_code(schedule) -> np.ndarray:
    """Schedule name(s) or integer code(s) -> int64 code array (see :data:`SCHEDULE`).

    ``"1f1b"`` -> 1; ``["gpipe", "zb"]`` -> ``[0, 3]``; integer input is passed through after a
    range check.
    """
    arr = np.asarray(schedule)
    if arr.dtype.kind in "US" or arr.dtype == object:
        try:
            return np.vectorize(SCHEDULE.index, otypes=[np.int64])(arr)
        except ValueError:
            raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULE}") from None
    codes = arr.astype(np.int64)
    if np.any((codes < 0) | (codes >= len(SCHEDULE))):
        raise ValueError(f"schedule codes must be in 0..{len(SCHEDULE) - 1}, got {schedule!r}")
    return codes


# ---------------------------------------------------------------------------------------------
# Closed forms (vectorized)
# ---------------------------------------------------------------------------------------------


def _whole_at_least_one(name: str, x) -> np.ndarray:
    """``x`` as a float array, or ValueError naming it if any entry is not a whole number >= 1."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} = {x!r}: expected whole numbers >= 1") from None
    bad = ~np.isfinite(a) | (a < 1) | (a != np.floor(a))
    if np.any(bad):
        raise ValueError(f"{name} = {a[bad].ravel()[0]:g}: expected whole numbers >= 1")
    return a


def bubble_fraction(p, m, schedule="1f1b", v=1) -> np.ndarray:
    """Share of the step (makespan) a device spends idle in a uniform pipeline.

    ``bubble = 1 - m*(F+B) / makespan``:

    * GPipe, 1F1B: ``(p-1) / (m + p - 1)``, i.e. ``(p-1)/m`` of the ideal time ``m*(F+B)``.
    * interleaved 1F1B with ``v`` chunks per device: ``(p-1) / (v*m + p - 1)``, i.e.
      ``(p-1)/(v*m)`` of the ideal time (exact when ``p`` divides ``m``).
    * ZB-H1 with ``F = B = W`` (forward, input gradient, weight gradient each a third of the
      micro-batch time): the bubble ``(p-1)(F+B-W) = (p-1)F`` against ``m(F+B+W) = 3mF`` of work,
      so ``(p-1) / (3m + p - 1)``, one third of 1F1B's ``(p-1)/m`` relative to the ideal
      (exact for ``m >= p``; for ``m < p`` see :func:`pipeline_time_s`).

    Parameters
    ----------
    p : pipeline stages (devices), array-like int >= 1.
    m : micro-batches per step, array-like int >= 1.
    schedule : name (``"gpipe" | "1f1b" | "interleaved" | "zb"``) or int code array.
    v : model chunks per device (used by ``interleaved`` only).

    Returns
    -------
    np.ndarray of float in [0, 1), broadcast over the inputs.

    References
    ----------
    Huang et al. 2019 (GPipe), Sec. 2.3; Narayanan et al. 2021 (SC21), Sec. 2.2.1 (1F1B bubble
    ``(p-1)/m``) and Sec. 2.2.2 (interleaved, ``(p-1)/(v m)``); Qi et al. 2024 (ICLR), Sec. 3.1,
    Table 1 (ZB-H1 bubble ``(p-1)(T_F + T_B - T_W)``).

    Raises
    ------
    ValueError when ``p``, ``m`` or ``v`` is not a whole number >= 1.
    """
    p = _whole_at_least_one("p (pipeline stages)", p)
    m = _whole_at_least_one("m (micro-batches)", m)
    v = _whole_at_least_one("v (chunks per device)", v)
    code = schedule_code(schedule)
    if np.any(code == Schedule.ZB):
        # ZB-H1 for m < p is not the (p-1)F formula; use the general time form with F = B = W.
        t = pipeline_time_s(p, m, 1.0, 2.0, 1.0, schedule=code, v=v)
        zb = 1.0 - 3.0 * m / t
    else:
        zb = 0.0
    units = np.where(code == Schedule.INTERLEAVED, v * m, m)  # work in units of the bubble's slots
    fb = (p - 1) / (units + p - 1)
    return np.where(code == Schedule.ZB, zb, fb)


def pipeline_efficiency(p, m, schedule="1f1b", v=1) -> np.ndarray:
    """``1 - bubble_fraction``: the share of the step a device computes (uniform stages).

    For GPipe / 1F1B this is ``m / (m + p - 1)``, which rises monotonically with ``m`` towards 1
    (the seed's "optimum ``M* = P-1`` with maximum efficiency 0.5" is the value *at* ``m = p-1``,
    not a maximum).

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 2.2.1.
    """
    return 1.0 - bubble_fraction(p, m, schedule, v)


def pipeline_time_s(
    p,
    m,
    t_fwd_s,
    t_bwd_s,
    t_w_s=None,
    schedule="1f1b",
    v=1,
    p2p_s=0.0,
) -> np.ndarray:
    """Makespan of one step of a pipeline of ``p`` identical stages [s] (vectorized).

    ``F = t_fwd_s``, ``B = t_bwd_s`` (whole backward) per micro-batch per stage, ``c = p2p_s``
    one transfer between adjacent stages (a latency on the dependency; compute never blocks on
    a send). With ``c = 0``:

    * GPipe and 1F1B: ``(m + p - 1)(F + B)``.
    * interleaved (``v`` chunks of ``F/v``, ``B/v``): ``m(F + B) + (p - 1)(F + B)/v``.
    * ZB-H1 (``W = t_w_s``, ``B_in = B - W``), ``m >= p``:
      ``m(F + B) + (p - 1) max(F + B_in - W, F, B_in)``. Qi et al.'s ``(p-1)(F + B_in - W)`` is
      the first term; the other two are the last stage's fill ``(p-1)F`` and stage 0's wait
      ``(p-1)B_in`` for its first backward, which dominate when ``W > B_in`` or ``W > F``.
      For ``m < p`` the largest of three paths (documented in ``docs/pipeline.md``).

    p2p adds ``2(p-1)c`` (GPipe), ``2c [(p-1) + (m-2) - floor((m-2)/p)]`` (1F1B: in the steady
    state a backward waits for the round trip to the next stage, except once per ``p``
    micro-batches), ``2(vp-1)c`` (interleaved, for ``c <= min(F, B)/v``) and
    ``2c [(p-1) + min(max(m-2, 0), p-1)]`` (ZB-H1).

    Exactness against :func:`simulate` (property-tested): GPipe and 1F1B always; interleaved
    when ``p`` divides ``m`` and ``c <= min(F, B)/v``; ZB-H1 with ``c = 0`` for ``m >= p`` and
    any ``F, B_in, W``, for ``m < p`` when ``F = B_in = W``, and with ``c > 0`` when
    ``F = B_in = W`` and ``2c <= W``. Elsewhere the ZB-H1 forms are estimates (``m < p``: a
    lower bound, within 10 % in our checks; ``c > 0``: an upper bound) and :func:`simulate` is the reference.

    Parameters
    ----------
    p, m : stages and micro-batches, array-like int.
    t_fwd_s, t_bwd_s : forward / whole backward time of one micro-batch on one stage [s].
    t_w_s : weight-gradient part of ``t_bwd_s`` [s] (ZB-H1 only); default ``t_bwd_s / 2``.
    schedule : name or int code array (see :data:`SCHEDULE`).
    v : model chunks per device (interleaved only).
    p2p_s : one adjacent-stage transfer [s].

    Returns
    -------
    np.ndarray of makespans [s], broadcast over the inputs.

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 2.2 (bubble ``(p-1)(t_f+t_b)``, ``/v`` interleaved);
    Qi et al. 2024 (ICLR), Sec. 3.1, Table 1 (ZB-H1 bubble ``(p-1)(T_F + T_B - T_W)``);
    p2p and ``max`` terms derived here and checked against :func:`simulate`.
    """
    p = np.asarray(p, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    f = np.asarray(t_fwd_s, dtype=np.float64)
    b = np.asarray(t_bwd_s, dtype=np.float64)
    w = 0.5 * b if t_w_s is None else np.asarray(t_w_s, dtype=np.float64)
    c = np.asarray(p2p_s, dtype=np.float64)
    code = schedule_code(schedule)
    return _pipeline_time_s(p, m, f, b, w, code, v, c)


def _pipeline_time_s(p, m, f, b, w, code, v, c):
    work = m * (f + b)  # one device's compute per step
    # GPipe: fill p-1 forwards, drain p-1 backwards, one p2p trip each way.
    t_gpipe = (m + p - 1) * (f + b) + 2.0 * (p - 1) * c
    # 1F1B: as GPipe, plus 2c for every micro-batch whose steady-state backward waits on the
    # round trip to the next stage: (m-2) - floor((m-2)/p) of them.
    waits = np.maximum((m - 2) - np.floor((m - 2) / p), 0.0)
    t_1f1b = t_gpipe + 2.0 * c * waits
    # Interleaved: fill and drain shrink to chunk size (F+B)/v; the trip crosses vp-1 links.
    t_inter = work + (p - 1) * (f + b) / v + 2.0 * (v * p - 1) * c
    # ZB-H1: the backward's critical path is the input gradient B_in; W fills the bubble.
    b_in = b - w
    t_zb_big = work + (p - 1) * np.maximum(np.maximum(f + b_in - w, f), b_in)
    t_zb_small = np.maximum(
        np.maximum(
            (p - 1) * f + m * (f + b_in + w),  # last stage: fill, then all its work
            p * f + (p - 1) * b_in + m * (b_in + w),  # stage 0: waits for the first B
        ),
        (m + p - 1) * (f + b_in) + w,  # last micro-batch's F/B chain, then its W
    )
    zb_hops = 2.0 * c * ((p - 1) + np.minimum(np.maximum(m - 2, 0.0), p - 1))
    t_zb = np.where(m >= p, t_zb_big, t_zb_small) + zb_hops
    out = np.select(
        [code == Schedule.GPIPE, code == Schedule.ONE_F_ONE_B, code == Schedule.INTERLEAVED],
        [t_gpipe, t_1f1b, t_inter],
        default=t_zb,
    )
    return np.where(p > 1, out, work)


def inflight_microbatches(p, m, schedule="1f1b", v=1, stage=0) -> np.ndarray:
    """Peak number of micro-batches whose activations a stage holds (vectorized).

    Counted from the start of a micro-batch's forward to the end of its (input-gradient)
    backward, in units of a whole stage's micro-batch activations:

    * GPipe: ``m``.
    * 1F1B and ZB-H1: ``min(p - stage, m)``.
    * interleaved: Megatron-LM's warm-up ``w = 2(p - stage - 1) + (v - 1) p`` chunk forwards plus
      one, each chunk ``1/v`` of the stage: ``min(w + 1, v m) / v``. For ``stage = 0`` and
      ``m >= p`` this is ``p + (p-1)/v``, i.e. ``p`` times Megatron's memory factor
      ``1 + (p-1)/(p v)``.

    ZB-H1 keeps the inputs of the weight-gradient GEMMs until W runs; counting those as whole
    micro-batches gives ``min(p, m)`` on every stage (:attr:`Timeline.peak_held`), the same
    peak as 1F1B's stage 0 (Qi et al. 2024, Sec. 3.1).

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 2.2.1; Korthikanti et al. 2022 (activation memory of the
    first stage, interleaving factor ``1 + (p-1)/(p v)``); Megatron-LM
    ``forward_backward_pipelining_with_interleaving`` (warm-up count).
    """
    p = np.asarray(p, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    s = np.asarray(stage, dtype=np.float64)
    code = schedule_code(schedule)
    one_f_one_b = np.minimum(p - s, m)
    warmup = 2.0 * (p - s - 1) + (v - 1) * p
    inter = np.minimum(warmup + 1, v * m) / v
    return np.select([code == Schedule.GPIPE, code == Schedule.INTERLEAVED], [m + 0.0 * p, inter],
                     one_f_one_b)


# ---------------------------------------------------------------------------------------------
# Event-level simulator (one configuration; loops are fine here)
# ---------------------------------------------------------------------------------------------

# An op is (kind, microbatch, chunk) with kind "F", "B" (whole backward, or input gradient
# for ZB-H1) or "W" (weight gradient, ZB-H1 only).
Op = tuple[str, int, int]


def stage_op_order(p: int, m: int, stage: int, schedule="1f1b", v: int = 1) -> list[Op]:
    """The order in which device ``stage`` runs its ops, as ``(kind, microbatch, chunk)``.

    * GPipe: ``F0..F(m-1)``, then ``B0..B(m-1)``.
    * 1F1B: pairs ``(F_x, B_{x-(p-1-s)})`` for ``x = 0 .. m+p-2-s``, skipping out-of-range
      indices: ``p-s-1`` warm-up forwards, steady one-forward-one-backward, cool-down backwards
      (Megatron-LM ``forward_backward_pipelining_without_interleaving``).
    * interleaved: Megatron-LM's order. Forwards walk the schedule table (groups of ``p``
      micro-batches, each group through chunks ``0..v-1``), backwards the same table with chunks
      reversed; ``2(p-s-1) + (v-1)p`` warm-up forwards (all of them if that reaches ``v m``),
      then alternate one forward, one backward, then the remaining backwards.
    * ZB-H1: triples ``(F_x, B_{x-(p-1-s)}, W_{x-(p-1)})`` for ``x = 0 .. m+p-2``, skipping
      out-of-range indices (Qi et al. 2024, Fig. 3; the W of a micro-batch lags its B by ``s``
      slots on stage ``s``, which fills the drain bubble).
    """
    code = int(schedule_code(schedule))
    s = stage
    if code == Schedule.GPIPE:
        return [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]
    if code == Schedule.ONE_F_ONE_B:
        ops: list[Op] = []
        for x in range(m + p - 1 - s):
            if x < m:
                ops.append(("F", x, 0))
            j = x - (p - 1 - s)
            if 0 <= j < m:
                ops.append(("B", j, 0))
        return ops
    if code == Schedule.ZB:
        ops = []
        for x in range(m + p - 1):
            if x < m:
                ops.append(("F", x, 0))
            j = x - (p - 1 - s)
            if 0 <= j < m:
                ops.append(("B", j, 0))
            k = x - (p - 1)
            if 0 <= k < m:
                ops.append(("W", k, 0))
        return ops
    # interleaved
    table = _interleaved_table(m, v, group=p)
    total = m * v
    warmup = 2 * (p - s - 1) + (v - 1) * p
    warmup = min(total, warmup)
    fwd = [("F", mb, ch) for mb, ch in table]
    bwd = [("B", mb, v - 1 - ch) for mb, ch in table]
    ops = fwd[:warmup]
    for i in range(total - warmup):
        ops.append(fwd[warmup + i])
        ops.append(bwd[i])
    ops.extend(bwd[total - warmup :])
    return ops


def _interleaved_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """Megatron-LM's virtual-pipeline schedule table: ``(microbatch, chunk)`` in forward order.

    Micro-batches go in groups of ``group`` (= p); each group runs through chunks 0..v-1; the
    last group takes whatever micro-batches remain (Megatron-LM ``get_schedule_table``).
    """
    table = []
    for start in range(0, m, group):
        stop = min(m, start + group)
        for ch in range(v):
            table.extend((mb, ch) for mb in range(start, stop))
    return table


@dataclass(frozen=True)
class Timeline:
    """Result of :func:`simulate`: every op of one step on every device.

    Attributes
    ----------
    events : list of ``(stage, microbatch, chunk, op, start_s, end_s)``, ``op`` in F/B/W,
        sorted by stage then start time.
    makespan_s : end of the last op [s].
    peak_inflight : per stage, the peak number of micro-batches between the start of their
        forward and the end of their (input-gradient) backward, in whole-stage units (a chunk
        counts ``1/v``).
    peak_held : as ``peak_inflight`` but held until the weight gradient (W) ends; equal to
        ``peak_inflight`` for schedules that do not split the backward.
    busy_s : per stage, the compute time [s].
    """

    p: int
    m: int
    v: int
    schedule: str
    events: list[tuple[int, int, int, str, float, float]]
    makespan_s: float
    peak_inflight: np.ndarray
    peak_held: np.ndarray
    busy_s: np.ndarray = field(repr=False)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over stages: ``1 - sum(busy) / (p * makespan)``."""
        return float(1.0 - self.busy_s.sum() / (self.p * self.makespan_s))

    def to_frame(self) -> pd.DataFrame:
        """Events as a DataFrame: stage, microbatch, chunk, op, start_s, end_s, duration_s
        (pandas is loaded here: the schedule itself does not need it)."""
        df = data_frame(self.events,
                        columns=["stage", "microbatch", "chunk", "op", "start_s", "end_s"])
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df


def _per_chunk(t, p: int, v: int, name: str) -> np.ndarray:
    """Stage times (p,) for the whole stage, or (p, v) per chunk -> (p, v) per chunk [s]."""
    a = np.asarray(t, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(p, float(a))
    if a.ndim == 1:
        if a.shape[0] != p:
            raise ValueError(f"{name} has {a.shape[0]} stages, expected {p}")
        return np.repeat(a[:, None] / v, v, axis=1)
    if a.shape != (p, v):
        raise ValueError(f"{name} has shape {a.shape}, expected ({p},) or ({p}, {v})")
    return a


def simulate(
    stage_fwd_s,
    stage_bwd_s,
    m: int,
    schedule: str = "1f1b",
    v: int = 1,
    p2p_s=0.0,
    stage_w_s=None,
) -> Timeline:
    """Event-level simulation of one training step of a pipeline.

    Each device runs :func:`stage_op_order` in order; an op starts when the device is free and
    its inputs are there: a forward needs the previous virtual stage's forward of the same
    micro-batch (plus ``p2p_s`` when that ran on another device), a backward needs its own
    forward and the next virtual stage's backward (plus ``p2p_s``), a W needs its B.
    Virtual stage ``chunk * p + stage`` runs on device ``stage``.

    Parameters
    ----------
    stage_fwd_s : per-device forward time of one micro-batch [s], shape ``(p,)`` (the whole
        device, split evenly over its ``v`` chunks) or ``(p, v)`` per chunk.
    stage_bwd_s : the whole backward (input + weight gradient), same shapes [s].
    m : micro-batches.
    schedule : ``"gpipe" | "1f1b" | "interleaved" | "zb"`` (or the int code).
    v : model chunks per device (``interleaved``; 1 otherwise).
    p2p_s : one transfer between adjacent devices [s]: a scalar, or one value per virtual stage
        boundary (``p*v - 1`` values, boundary ``k`` between virtual stages ``k`` and ``k+1``).
    stage_w_s : ZB-H1 only: the weight-gradient part of ``stage_bwd_s`` [s]; default half.

    Returns
    -------
    :class:`Timeline`.

    References
    ----------
    Narayanan et al. 2021 (SC21), Fig. 3-4 (1F1B and interleaved orders); Qi et al. 2024,
    Fig. 3 (ZB-H1).
    """
    code = int(schedule_code(schedule))
    f = np.asarray(stage_fwd_s, dtype=np.float64)
    p = int(f.shape[0]) if f.ndim else 1
    # 1. check the shape of the pipeline, 2. the op durations per chunk, 3. the p2p hops,
    # 4. run every device's op order, 5. the in-flight peaks of the events
    _check_pipeline(code, p, m, v)
    dur = _op_durations(code, p, v, stage_fwd_s, stage_bwd_s, stage_w_s)
    hop = _p2p_hops(p2p_s, p * v)
    events = _run_orders(code, p, m, v, dur, hop)
    peak_inflight, peak_held, busy = _stage_peaks(events, p, v, split=code == Schedule.ZB)
    makespan = max(e[5] for e in events)
    return Timeline(p, m, v, SCHEDULE[code], events, makespan, peak_inflight, peak_held, busy)


def _check_pipeline(code: int, p: int, m: int, v: int) -> None:
    """ValueError for a pipeline :func:`simulate` cannot run: chunks without interleaving, a
    count below 1, or interleaving over micro-batches that ``p`` does not divide."""
    name = SCHEDULE[code]
    if code != Schedule.INTERLEAVED and v != 1:
        raise ValueError(f"v ({v}) > 1 needs schedule 'interleaved' (got '{name}')")
    if m < 1 or p < 1 or v < 1:
        raise ValueError(f"need p, m, v >= 1 (got p={p}, m={m}, v={v})")
    if code == Schedule.INTERLEAVED and m % p:
        raise ValueError(
            f"interleaved schedule: pp ({p}) must divide num_microbatches ({m}), as in Megatron-LM"
        )


def _op_durations(code: int, p: int, v: int, stage_fwd_s, stage_bwd_s,
                  stage_w_s) -> dict[str, np.ndarray]:
    """Duration [s] of each op kind (F, B and, for ZB-H1, W) per device and chunk, (p, v)."""
    fc = _per_chunk(stage_fwd_s, p, v, "stage_fwd_s")
    bc = _per_chunk(stage_bwd_s, p, v, "stage_bwd_s")
    if code != Schedule.ZB:
        return {"F": fc, "B": bc}
    wc = 0.5 * bc if stage_w_s is None else _per_chunk(stage_w_s, p, v, "stage_w_s")
    if np.any(wc > bc + 1e-15) or np.any(wc < 0):
        raise ValueError("stage_w_s must lie in [0, stage_bwd_s] (it is part of the backward)")
    return {"F": fc, "B": bc - wc, "W": wc}


def _p2p_hops(p2p_s, nv: int) -> np.ndarray:
    """One transfer time [s] per boundary of the ``nv`` virtual stages."""
    hop = np.broadcast_to(np.asarray(p2p_s, dtype=np.float64), (max(nv - 1, 0),))
    if np.asarray(p2p_s).ndim and np.asarray(p2p_s).shape[0] != nv - 1:
        raise ValueError(f"p2p_s has {np.asarray(p2p_s).shape[0]} boundaries, expected {nv - 1}")
    return hop


def _run_orders(code: int, p: int, m: int, v: int, dur: dict[str, np.ndarray],
                hop: np.ndarray) -> list[tuple[int, int, int, str, float, float]]:
    """Every op of every device, ``(stage, microbatch, chunk, op, start_s, end_s)``, sorted by
    stage then start: each device takes the next op of its order as soon as its inputs are
    there (:func:`_op_ready`), sweeping the devices until every op ran."""
    orders = [stage_op_order(p, m, s, code, v) for s in range(p)]
    end: dict[tuple[str, int, int], float] = {}  # (kind, mb, virtual stage) -> end time
    ptr = [0] * p
    free = [0.0] * p
    events: list[tuple[int, int, int, str, float, float]] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            order = orders[s]
            while ptr[s] < len(order):
                kind, mb, ch = order[ptr[s]]
                vs = ch * p + s
                r = _op_ready(end, hop, p, p * v, kind, mb, vs)
                if r is None:
                    break
                start = max(free[s], r)
                stop = start + float(dur[kind][s, ch])
                end[(kind, mb, vs)] = stop
                free[s] = stop
                events.append((s, mb, ch, kind, start, stop))
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the built-in orders never deadlock
            raise RuntimeError(f"schedule '{SCHEDULE[code]}' deadlocked (p={p}, m={m}, v={v})")
    events.sort(key=lambda e: (e[0], e[4]))
    return events


def _op_ready(end: dict[tuple[str, int, int], float], hop: np.ndarray, p: int, nv: int,
              kind: str, mb: int, vs: int) -> float | None:
    """Time the inputs of op (kind, mb, vs) arrive, or None if not yet computed."""
    if kind == "F":
        if vs == 0:
            return 0.0
        e = end.get(("F", mb, vs - 1))
        return None if e is None else e + _hop_s(hop, p, vs - 1)
    if kind == "W":
        return end.get(("B", mb, vs))
    e_f = end.get(("F", mb, vs))
    if e_f is None:
        return None
    if vs == nv - 1:
        return e_f
    e_b = end.get(("B", mb, vs + 1))
    return None if e_b is None else max(e_f, e_b + _hop_s(hop, p, vs))


def _hop_s(hop: np.ndarray, p: int, k: int) -> float:
    """Transfer time [s] across boundary ``k``, which joins virtual stages k and k+1; no
    transfer within one device (p == 1)."""
    return float(hop[k]) if (k % p) != ((k + 1) % p) else 0.0


def _stage_peaks(events: list[tuple[int, int, int, str, float, float]], p: int, v: int,
                 split: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per stage: the peak micro-batches in flight (forward started, input gradient not done)
    and held (until W ends when the backward is ``split``), in whole-stage units, and the
    compute time [s]."""
    peak_inflight = np.zeros(p)
    peak_held = np.zeros(p)
    busy = np.zeros(p)
    for s in range(p):
        live = held = 0
        top_live = top_held = 0
        for _st, _mb, _ch, kind, t0, t1 in (e for e in events if e[0] == s):
            busy[s] += t1 - t0
            if kind == "F":
                live += 1
                held += 1
            elif kind == "B":
                live -= 1
                held -= 0 if split else 1
            else:
                held -= 1
            top_live = max(top_live, live)
            top_held = max(top_held, held)
        peak_inflight[s] = top_live / v
        peak_held[s] = top_held / v
    return peak_inflight, peak_held, busy






