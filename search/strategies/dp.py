"""Dynamic-programming searcher: per-stage layer counts and per-stage block recompute.

For every outer choice of the space (tp, cp, dp, pp, vp, ZeRO, micro-batch, sequence
parallelism, schedule) the searcher splits the layers over the pipeline stages and picks how many
layers of each stage recompute (Megatron-LM ``--recompute-granularity full --recompute-method
block --recompute-num-layers N``), minimising the slowest stage under each stage's own memory
cap: stage ``s`` keeps the activations of ``inflight_s`` micro-batches (stage 0 the most), the
first stage also holds the embedding and the last the output layer and loss, and both count as
the stage work and memory they are.

Two solvers of the same problem:

* :func:`partition_dp`, the dynamic programme of exercise 9.4 generalised (arbitrary per-layer
  costs and memory, per-stage fixed work, in-flight counts and caps, recompute chosen per
  stage): ``D[s][i] = min_k max(D[s-1][k], W_s(k, i))``, where ``W_s(k, i)`` is the time of
  layers ``k..i-1`` on stage ``s`` with the fewest recomputed layers that fit. O(P L^2) time,
  O(P L) memory (one column of candidates at a time). A second pass takes, among the layouts
  with that bottleneck, the one of least total time (what the pipeline's fill and drain pay).
* :func:`balanced_counts`, the same optimum for identical transformer layers, vectorised over
  thousands of outer points at once. With identical layers a stage's cost depends only on how
  many layers it holds, and it grows with that count, so a bottleneck ``T`` is reachable exactly
  when the stages' largest counts within ``T`` add up to the layers; a bisection on ``T`` finds
  the optimum for every outer point together. The outer points differ only by a few scalars
  (one layer's time and recompute time, the fixed work of the end stages, the memory of a
  layer and of each stage's fixed part, the in-flight counts), so the whole search is a few
  array passes instead of a DP per point. A test checks it against :func:`partition_dp` and
  both against brute force. MoE models whose MoE layers interleave with dense ones, where a
  stage's cost depends on which layers it holds, run :func:`range_dp` instead: the same two
  passes over the stage costs of every unit range, batched over outer points
  (:func:`_solve_ranges`).

The searcher then evaluates, for every outer point, the even split (the grid's configuration)
and the DP's layouts through the problem's evaluator, so its best is never worse than the
grid's on the same space.

References
----------
Bokhari 1988 (chains-on-chains partitioning); Narayanan et al. 2019 (PipeDream, Sec. 3.1, the
layer-partition DP); Zheng et al. 2022 (Alpa) and Miao et al. 2022 (Galvatron), which run such
DPs over profiled costs; Megatron-LM ``transformer_block.py`` (block recompute) and
``--pipeline-model-parallel-layout``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from perfmodel.core.codes import Recompute, Schedule
from perfmodel.core.errors import SpecError
from perfmodel.memory import stage_layout as layout_mod
from perfmodel.parallel import layers as layers_mod
from perfmodel.parallel.config import ConfigBatch
from perfmodel.step.evaluate import evaluate, layer_times_by_type
from search.pareto import Tally
from search.result import SearchResult, finalize_batch
from search.space import Problem, Scored

__all__ = ["DP_MAX_CELLS", "DPLayout", "DPSearch", "balanced_counts", "brute_force_partition",
           "cell_chunks", "partition_dp", "range_dp"]



# --------------------------------------------------------------------------------------------
# The general dynamic programme (one problem, arbitrary per-layer costs)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DPLayout:
    """A split of L layers over P stages: stage ``s`` holds ``bounds[s]:bounds[s+1]`` and
    recomputes its first ``recomputed[s]`` layers; ``bottleneck_s`` is the slowest stage,
    ``total_s`` the sum of the stage times."""

    bounds: np.ndarray
    recomputed: np.ndarray
    bottleneck_s: float
    total_s: float

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.bounds)


def _stage_cost(s, k, i, P, pre, fixed_s, fixed_b, inflight, once_b, cap_b, recompute_layers):
    """Time and recompute count of layers ``k..i-1`` (``k`` an array) on stage ``s``: the
    fewest recomputed leading layers whose memory fits (inf where none does)."""
    C, Cr, Wb, A, Dl = pre
    n = i - k
    need = fixed_b[s] + Wb[i] - Wb[k] + inflight[s] * (A[i] - A[k]) - cap_b[s]
    if recompute_layers is None:  # per stage: the fewest that fit
        target = Dl[k] + (need + once_b[s]) / max(inflight[s], 1e-300)
        r = np.searchsorted(Dl, target, side="left") - k
        r = np.where(need <= 0, 0, np.maximum(r, 1))
        ok = r <= n
    else:  # one count for every stage (Megatron's --recompute-num-layers)
        r = np.minimum(int(recompute_layers), n)
        freed = inflight[s] * (Dl[np.minimum(k + r, len(Dl) - 1)] - Dl[k])
        ok = need + np.where(r > 0, once_b[s], 0.0) - freed <= 0
        r = np.where(ok, r, 0)
    r = np.clip(r, 0, n)
    t = C[i] - C[k] + Cr[np.minimum(k + r, len(Cr) - 1)] - Cr[k] + fixed_s[s]
    return np.where(ok & (n > 0), t, np.inf), r


def partition_dp(
    layer_s,
    recompute_s,
    state_bytes,
    act_keep_bytes,
    act_ckpt_bytes,
    stage_fixed_s,
    stage_fixed_bytes,
    stage_inflight,
    stage_once_bytes,
    stage_cap_bytes,
    recompute_layers: int | None = None,
) -> DPLayout | None:
    """Split ``L`` layers over ``P`` contiguous non-empty stages minimising the slowest stage.

    Stage ``s`` holding layers ``k..i-1`` of which the first ``r`` recompute takes
    ``sum(layer_s[k:i]) + sum(recompute_s[k:k+r]) + stage_fixed_s[s]`` and needs
    ``stage_fixed_bytes[s] + sum(state_bytes[k:i]) + stage_inflight[s] * (sum(act_keep[k:i])
    - sum(act_keep - act_ckpt)[k:k+r]) + [r > 0] stage_once_bytes[s] <= stage_cap_bytes[s]``;
    ``r`` is the fewest that fit (``recompute_layers=None``) or ``min(N, i - k)`` for a given
    ``N`` on every stage. Ties on the bottleneck go to the least total time.

    Parameters
    ----------
    layer_s, recompute_s : per-layer time and extra time when recomputed [s], length L
    state_bytes, act_keep_bytes, act_ckpt_bytes : per-layer model states and activations
        without and with recompute [bytes], length L (``act_ckpt <= act_keep``)
    stage_fixed_s, stage_fixed_bytes, stage_inflight, stage_once_bytes, stage_cap_bytes :
        per-stage fixed time, fixed memory, in-flight micro-batches, memory of one layer being
        recomputed, memory cap; length P

    Returns
    -------
    :class:`DPLayout`, or None when no split fits.
    """
    c = np.asarray(layer_s, dtype=np.float64)
    L = c.shape[0]
    fixed_s = np.asarray(stage_fixed_s, dtype=np.float64)
    P = fixed_s.shape[0]
    if P < 1 or L < P:
        raise ValueError(f"need 1 <= stages <= layers (got {P} stages, {L} layers)")

    def prefix(x):
        return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=np.float64))])

    keep = np.asarray(act_keep_bytes, dtype=np.float64)
    pre = (prefix(c), prefix(recompute_s), prefix(state_bytes), prefix(keep),
           prefix(keep - np.asarray(act_ckpt_bytes, dtype=np.float64)))
    args = (P, pre, fixed_s, np.asarray(stage_fixed_bytes, dtype=np.float64),
            np.asarray(stage_inflight, dtype=np.float64),
            np.asarray(stage_once_bytes, dtype=np.float64),
            np.asarray(stage_cap_bytes, dtype=np.float64), recompute_layers)
    ks = np.arange(L + 1)
    # Pass 1: the bottleneck. D[s, i]: best slowest stage of layers 0..i-1 on stages 0..s.
    D = np.full((P + 1, L + 1), np.inf)
    D[0, 0] = 0.0
    for s in range(P):
        for i in range(1, L + 1):
            k = ks[:i]
            w, _ = _stage_cost(s, k, i, *args)
            D[s + 1, i] = np.min(np.maximum(D[s, :i], w))
    T = D[P, L]
    if not np.isfinite(T):
        return None
    # Pass 2: least total time among the splits whose every stage is within T.
    tol = T * 1e-12
    S = np.full((P + 1, L + 1), np.inf)
    S[0, 0] = 0.0
    arg = np.zeros((P + 1, L + 1), dtype=np.int64)
    rec = np.zeros((P + 1, L + 1), dtype=np.int64)
    for s in range(P):
        for i in range(1, L + 1):
            k = ks[:i]
            w, r = _stage_cost(s, k, i, *args)
            tot = np.where(w <= T + tol, S[s, :i] + w, np.inf)
            j = int(np.argmin(tot))
            S[s + 1, i], arg[s + 1, i], rec[s + 1, i] = tot[j], j, r[j]
    bounds, recomputed = [L], []
    for s in range(P, 0, -1):
        recomputed.append(int(rec[s, bounds[-1]]))
        bounds.append(int(arg[s, bounds[-1]]))
    return DPLayout(np.array(bounds[::-1], dtype=np.int64),
                    np.array(recomputed[::-1], dtype=np.int64), float(T), float(S[P, L]))


def brute_force_partition(*args, recompute_layers: int | None = None) -> DPLayout | None:
    """Every split and every recompute count, for checking :func:`partition_dp` on small
    problems (same arguments). Lexicographic (bottleneck, total)."""
    (layer_s, recompute_s, state_b, keep_b, ckpt_b, fixed_s, fixed_b, infl, once_b,
     cap_b) = (np.asarray(a, dtype=np.float64) for a in args)
    L, P = layer_s.shape[0], fixed_s.shape[0]
    best = None
    for cuts in combinations(range(1, L), P - 1):
        bounds = (0, *cuts, L)
        times, recs = [], []
        for s in range(P):
            k, i = bounds[s], bounds[s + 1]
            choices = range(i - k + 1) if recompute_layers is None else [
                min(recompute_layers, i - k)]
            t_best, r_best = np.inf, 0
            for r in choices:
                m = (fixed_b[s] + state_b[k:i].sum()
                     + infl[s] * (keep_b[k:i].sum() - (keep_b - ckpt_b)[k:k + r].sum())
                     + (once_b[s] if r > 0 else 0.0))
                if m <= cap_b[s]:
                    t = layer_s[k:i].sum() + recompute_s[k:k + r].sum() + fixed_s[s]
                    if t < t_best:
                        t_best, r_best = t, r
            times.append(t_best)
            recs.append(r_best)
        key = (max(times), sum(times))
        if np.isfinite(key[0]) and (best is None or key < (best.bottleneck_s, best.total_s)):
            best = DPLayout(np.array(bounds), np.array(recs), key[0], key[1])
    return best


# --------------------------------------------------------------------------------------------
# The same optimum for identical layers, vectorised over outer points
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageCoefficients:
    """What an outer point's stage costs depend on, one entry per job (``(J,)`` or ``(J, S)``).

    Stage ``s`` holding ``n >= 1`` units (a unit is ``vp`` layers, one per chunk) of which
    ``r`` recompute: time ``n c + r c_r + fixed_s``; memory ``mem1_s + (n - 1) mem_unit_s +
    [r > 0] once_s - r saved_s``. ``recompute_units`` < 0: the fewest that fit per stage;
    otherwise ``min(N, n)`` on every stage. ``stages``: the job's pp (stages beyond are
    padding).
    """

    unit_s: np.ndarray
    recompute_unit_s: np.ndarray
    fixed_s: np.ndarray
    mem1_bytes: np.ndarray
    mem_unit_bytes: np.ndarray
    once_bytes: np.ndarray
    saved_bytes: np.ndarray
    cap_bytes: np.ndarray
    units: np.ndarray
    stages: np.ndarray
    recompute_units: np.ndarray

    def cost(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(time, recomputed units)`` of every stage holding ``n`` units, ``(J, S)``;
        time is inf where it does not fit or ``n < 1``."""
        n = np.asarray(n, dtype=np.float64)
        base = self.mem1_bytes + (n - 1.0) * self.mem_unit_bytes - self.cap_bytes[:, None]
        N = self.recompute_units[:, None].astype(np.float64)
        per_stage = N < 0
        saved = np.maximum(self.saved_bytes, 1e-300)
        r_ps = np.where(base <= 0, 0.0, np.maximum(np.ceil((base + self.once_bytes) / saved
                                                           - 1e-9), 1.0))
        r_uni = np.minimum(np.maximum(N, 0.0), n)
        r = np.where(per_stage, r_ps, r_uni)
        fits = base + np.where(r > 0, self.once_bytes, 0.0) - r * self.saved_bytes <= 0
        fits &= (r <= n) & (n >= 1)
        t = (n * self.unit_s[:, None] + r * self.recompute_unit_s[:, None] + self.fixed_s)
        return np.where(fits, t, np.inf), r


def _max_count(coef: StageCoefficients, T: np.ndarray) -> np.ndarray:
    """Largest ``n`` in ``[0, units]`` with stage cost <= T, per (job, stage) (costs grow with
    n); a binary search over n, all jobs and stages at once."""
    J, S = coef.fixed_s.shape
    lo = np.zeros((J, S))
    hi = np.broadcast_to(coef.units[:, None].astype(np.float64), (J, S)).copy()
    def within(n):
        t = coef.cost(n)[0]
        return np.isfinite(t) & (t <= T[:, None])

    lo = np.where(within(hi), hi, lo)
    while True:
        active = hi - lo > 1
        if not active.any():
            break
        mid = np.floor((lo + hi) / 2)
        ok = within(mid)
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid, hi)
    return lo


def balanced_counts(coef: StageCoefficients, iterations: int = 60
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Units per stage minimising the slowest stage, for every job at once.

    A bottleneck ``T`` is reachable when every stage can hold one unit within ``T`` and the
    largest counts within ``T`` add up to the job's units; a bisection on ``T`` finds the
    smallest. Surplus units are then taken back one by one from the stage whose last unit
    costs most, which lowers the total (the recompute of the stages below the bottleneck).

    Returns ``(counts, recomputed, bottleneck_s)``: ``(J, S)`` int arrays (0 beyond a job's
    stages) and ``(J,)`` (inf where nothing fits).
    """
    J, S = coef.fixed_s.shape
    valid = np.arange(S)[None, :] < coef.stages[:, None]
    U = coef.units.astype(np.float64)
    one, _ = coef.cost(np.ones((J, S)))
    one = np.where(valid, one, 0.0)
    lo = np.max(one, axis=1)  # every stage holds at least one unit
    # the largest count that fits each stage, and the time it takes: the loosest bottleneck
    n_fit = _max_count(coef, np.full(J, np.inf))
    t_fit, _ = coef.cost(np.maximum(n_fit, 1))
    hi = np.max(np.where(valid & (n_fit >= 1), t_fit, 0.0), axis=1)

    def reachable(T):
        cnt = np.where(valid, _max_count(coef, T), 0.0)
        return (cnt.sum(axis=1) >= U) & np.all(~valid | (cnt >= 1), axis=1), cnt

    feasible = (np.where(valid, n_fit, 0.0).sum(axis=1) >= U) & np.all(~valid | (n_fit >= 1),
                                                                        axis=1)
    hi = np.where(feasible, np.maximum(hi, lo), 0.0)
    lo = np.where(feasible, lo * (1 - 1e-12), 0.0)
    ok_lo, _ = reachable(lo)
    hi = np.where(ok_lo, lo, hi)
    for _ in range(iterations):
        if not np.any(feasible & (hi - lo > 1e-10 * hi)):
            break
        mid = 0.5 * (lo + hi)
        ok, _ = reachable(mid)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    _, cnt = reachable(np.where(feasible, hi, 0.0))
    cnt = np.where(feasible[:, None] & valid, cnt, 0.0)
    # Take the surplus back where a unit costs most.
    surplus = np.where(feasible, cnt.sum(axis=1) - U, 0.0)
    rows = np.arange(J)
    while np.any(surplus > 0):
        t_now, _ = coef.cost(cnt)
        t_less, _ = coef.cost(cnt - 1)
        with np.errstate(invalid="ignore"):
            gain = np.where(valid & (cnt > 1), t_now - t_less, -np.inf)
        k = np.argmax(gain, axis=1)
        take = surplus > 0
        cnt[rows[take], k[take]] -= 1
        surplus = surplus - take
    t, r = coef.cost(np.maximum(cnt, 1))
    t = np.where(valid, t, 0.0)
    bottleneck = np.where(feasible, np.max(t, axis=1), np.inf)
    return cnt.astype(np.int64), np.where(valid, r, 0).astype(np.int64), bottleneck


# --------------------------------------------------------------------------------------------
# The searcher
# --------------------------------------------------------------------------------------------
def _coefficients(problem: Problem, rows: ConfigBatch, width: int) -> dict[str, np.ndarray]:
    """Per-configuration scalars of the stage costs, from the cost model's own terms: one
    layer's time without and with full recompute (:func:`perfmodel.step.evaluate.evaluate`), the
    embedding and logits time, and each stage's memory at ``a`` and ``a + 1`` units with 0, 1
    and 2 recomputed (:func:`perfmodel.memory.stage_layout.stage_memory_bytes`; memory is affine in both).

    MoE models: a layer beyond the ``D`` dense leading ones is MoE (``rho = num_moe_layers /
    (L - D) = 1``; interleaved MoE layers go to the exact range DP instead,
    :func:`_solve_ranges`), so a unit costs an MoE layer
    (:func:`perfmodel.memory.stage_layout.layer_times_by_type`), and stage
    0, which holds the dense leading layers (at least ``D`` layers in its first chunk), gets
    ``D * (dense - unit layer)`` as fixed work and memory. The probes start at ``a = 1 +
    ceil(D / vp)`` units so that stage 0's MoE layers are counted where it holds them all. The
    layouts found are then priced by the full model, which counts each stage's MoE layers
    exactly (:func:`perfmodel.memory.stage_layout.stage_moe_layers`)."""
    s = problem.space
    kw: dict[str, Any] = {"kernels": problem.kernels}
    if problem.calibration is not None:
        kw["calibration"] = problem.calibration
    keep = evaluate(s.model, s.training, s.cluster,
                    layers_mod.without_layout(rows, "keep"), **kw).extra
    full = evaluate(s.model, s.training, s.cluster,
                    layers_mod.without_layout(rows, "full"), **kw).extra
    model = s.model
    D, rho = 0.0, 0.0
    keep_s, full_s, dense_fixed_s = keep["layer_s"], full["layer_s"], 0.0
    if layers_mod.typed_layer_costs(model):
        lt = layer_times_by_type(model, s.training, s.cluster, rows, average=False,
                                            **kw)
        D = float(model.moe_dense_layers)
        rest = model.num_layers - model.moe_dense_layers
        rho = model.num_moe_layers / rest if rest else 0.0
        keep_s = rho * lt["moe_keep"] + (1.0 - rho) * lt["dense_keep"]
        full_s = rho * lt["moe_full"] + (1.0 - rho) * lt["dense_full"]
        dense_fixed_s = D * (lt["dense_keep"] - keep_s)
    # the last stage's logits + loss, and the MTP layers (perfmodel.compute.mtp) of the row's mode
    head = np.where(rows.recompute == Recompute.FULL, full["head_s"], keep["head_s"])
    out = {
        "unit_s": rows.vp * keep_s,
        "recompute_unit_s": rows.vp * np.maximum(full_s - keep_s, 0.0),
    }
    per_stage = {k: np.zeros((len(rows), int(width))) for k in
                 ("fixed_s", "mem1_bytes", "mem_unit_bytes", "once_bytes", "saved_bytes")}
    for p in np.unique(rows.pp):  # one pass per pipeline depth: arrays of pp stages only
        idx = np.flatnonzero(rows.pp == p)
        sub = rows.take(idx)
        vp = sub.vp.astype(np.float64)[:, None]
        stage = np.broadcast_to(np.arange(p)[None, :], (idx.size, int(p)))

        def m(units, rec_units, sub=sub, vp=vp, stage=stage):
            n = units * vp
            moe_layers = None
            if layers_mod.typed_layer_costs(model):  # rho of the layers MoE, D dense on stage 0
                moe_layers = rho * (n - np.where(stage == 0, D, 0.0))
            return layout_mod.stage_memory_bytes(
                s.model, s.training, s.cluster, sub, stage, n, rec_units * vp,
                flash_attention=s.training.flash_attention, moe_layers=moe_layers)["peak"]

        a = 1 + np.ceil(D / vp)  # units where stage 0 holds every dense leading layer
        m10, m20, m21, m22 = m(a, 0), m(a + 1, 0), m(a + 1, 1), m(a + 1, 2)
        saved = m21 - m22
        e = keep["embed_s"][idx, None]
        g = head[idx, None]
        dfix = np.asarray(dense_fixed_s + 0.0 * keep_s)[idx, None]
        vals = {
            "fixed_s": (np.where(stage == 0, e + dfix, 0.0)
                        + np.where(stage == p - 1, g, 0.0)),
            "mem1_bytes": m10 - (a - 1) * (m20 - m10),
            "mem_unit_bytes": m20 - m10,
            "once_bytes": m21 - m20 + saved,
            "saved_bytes": saved,
        }
        for k, v in vals.items():
            per_stage[k][idx, :p] = v
    out.update(per_stage)
    return out


def _interleaves(model) -> bool:
    """MoE layers that interleave with dense ones (Llama 4's every k-th layer): a stage's cost
    then depends on where its layers are, not only on how many it holds."""
    return (model.is_moe and not model.is_hybrid
            and model.num_moe_layers < model.num_layers - model.moe_dense_layers)


def _unit_moe_prefix(model, vp: int) -> np.ndarray:
    """``F[x]``, x = 0..U (U = L / vp units): MoE layers before per-chunk offset ``x`` summed
    over the ``vp`` chunks, so a rank holding units ``k..i-1`` (layers ``c U + k .. c U + i - 1``
    of every chunk c, Megatron-LM's interleaved order) holds ``F[i] - F[k]`` MoE layers
    (:func:`perfmodel.memory.stage_layout.stage_moe_layers`)."""
    mask = layers_mod.moe_layer_mask(model)
    U = mask.size // vp
    cum = np.concatenate([[0], np.cumsum(mask)])
    x = np.arange(U + 1)
    return sum(cum[c * U + x] for c in range(vp)).astype(np.float64)


def _range_costs(problem: Problem, rows: ConfigBatch, recompute_units: np.ndarray,
                 kk: np.ndarray, ii: np.ndarray):
    """Time and recomputed units of every stage holding units ``kk..ii-1`` (``(K,)`` pairs) of
    every job (rows of one pp and vp), ``(J, p, K)``, priced by the layout model's own terms:
    the stage's dense and MoE layers at their own time (:func:`perfmodel.parallel.layers.stage_times_s`'
    formula) and its memory (:func:`perfmodel.memory.stage_layout.stage_memory_bytes` with its MoE layers);
    inf where it does not fit. Recompute: ``min(N, n)`` units, or (N < 0) the fewest that fit,
    from the memory at 0, 1 and 2 recomputed units (memory is affine in them)."""

    sp = problem.space
    model, tr, cl = sp.model, sp.training, sp.cluster
    kw: dict[str, Any] = {"kernels": problem.kernels}
    if problem.calibration is not None:
        kw["calibration"] = problem.calibration
    J, p, vp = len(rows), int(rows.pp[0]), int(rows.vp[0])
    F = _unit_moe_prefix(model, vp)
    n_u = (ii - kk).astype(np.float64)[None, None, :]
    n_m = (F[ii] - F[kk])[None, None, :]
    stage = np.broadcast_to(np.arange(p, dtype=np.float64)[None, :, None], (J, p, kk.size))
    cap = problem.usable_bytes

    def peak(r_u):
        return layout_mod.stage_memory_bytes(model, tr, cl, rows, stage, n_u * vp, r_u * vp,
                                             flash_attention=tr.flash_attention,
                                             moe_layers=n_m + 0.0 * stage)["peak"]

    N = recompute_units.astype(np.float64)[:, None, None]
    m0 = peak(np.zeros_like(stage))
    m1, m2 = peak(np.ones_like(stage)), peak(np.full_like(stage, 2.0))
    saved = np.maximum(m1 - m2, 1e-300)
    r_ps = np.where(m0 <= cap, 0.0, 1.0 + np.maximum(np.ceil((m1 - cap) / saved - 1e-9), 0.0))
    r = np.where(N < 0, r_ps, np.minimum(np.maximum(N, 0.0), n_u))
    ok = r <= n_u
    r = np.minimum(r, n_u)
    fits = ok & (peak(r) <= cap)
    lt = layer_times_by_type(model, tr, cl, rows, average=False, **kw)
    dk, df, mk, mf = (lt[k][:, None, None] for k in ("dense_keep", "dense_full", "moe_keep",
                                                        "moe_full"))
    keep = evaluate(model, tr, cl, layers_mod.without_layout(rows, "keep"), **kw).extra
    full = evaluate(model, tr, cl, layers_mod.without_layout(rows, "full"), **kw).extra
    head = np.where(rows.recompute == Recompute.FULL, full["head_s"], keep["head_s"])
    n = n_u * vp
    frac = n_m / n
    t = ((n - n_m) * dk + n_m * mk + r * vp * ((1.0 - frac) * (df - dk) + frac * (mf - mk))
         + np.where(stage == 0, keep["embed_s"][:, None, None], 0.0)
         + np.where(stage == p - 1, head[:, None, None], 0.0))
    return np.where(fits, t, np.inf), r


def range_dp(W: np.ndarray, R: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`partition_dp`'s two passes over precomputed stage costs, for many jobs at once:
    ``W[j, s, k, i]`` the time of units ``k..i-1`` on stage ``s`` (inf: does not fit), ``R``
    its recomputed units. Least bottleneck, then least total. Returns ``(counts, recomputed,
    bottleneck_s)``, ``(J, P)``, ``(J, P)``, ``(J,)`` (inf where nothing fits)."""
    J, P, U1, _ = W.shape
    U = U1 - 1
    D = np.full((J, P + 1, U + 1), np.inf)
    D[:, 0, 0] = 0.0
    for s in range(P):
        for i in range(1, U + 1):
            D[:, s + 1, i] = np.min(np.maximum(D[:, s, :i], W[:, s, :i, i]), axis=1)
    T = D[:, P, U]
    tol = np.where(np.isfinite(T), T * 1e-12, 0.0)
    S = np.full((J, P + 1, U + 1), np.inf)
    S[:, 0, 0] = 0.0
    arg = np.zeros((J, P + 1, U + 1), dtype=np.int64)
    for s in range(P):
        for i in range(1, U + 1):
            w = W[:, s, :i, i]
            tot = np.where(w <= (T + tol)[:, None], S[:, s, :i] + w, np.inf)
            arg[:, s + 1, i] = np.argmin(tot, axis=1)
            S[:, s + 1, i] = np.min(tot, axis=1)
    jr = np.arange(J)
    cnt = np.zeros((J, P), dtype=np.int64)
    rec = np.zeros((J, P), dtype=np.int64)
    end = np.full(J, U)
    for s in range(P, 0, -1):
        start = arg[jr, s, end]
        cnt[:, s - 1] = end - start
        rec[:, s - 1] = R[jr, s - 1, start, end]
        end = start
    ok = np.isfinite(T)
    return np.where(ok[:, None], cnt, 0), np.where(ok[:, None], rec, 0), T


RANGE_DP_CELLS = 4_000_000
"""Stage-cost cells (jobs x stages x unit pairs) per pass of the range DP (memory bound)."""


def _solve_ranges(problem: Problem, rows: ConfigBatch, recompute_units: np.ndarray,
                  job_row: np.ndarray, width: int):
    """The exact DP over each stage's actual unit range (:func:`range_dp` on
    :func:`_range_costs`), for MoE layers that interleave (:func:`_interleaves`)."""
    L = problem.space.model.num_layers
    J = job_row.size
    cnt = np.zeros((J, width), dtype=np.int64)
    rec = np.zeros((J, width), dtype=np.int64)
    bott = np.full(J, np.inf)
    pp_job, vp_job = rows.pp[job_row], rows.vp[job_row]
    for p, vp in set(zip(pp_job.tolist(), vp_job.tolist())):
        U = L // vp
        kk, ii = np.triu_indices(U + 1, k=1)
        sel = np.flatnonzero((pp_job == p) & (vp_job == vp))
        step = max(1, RANGE_DP_CELLS // (p * kk.size))
        for a in range(0, sel.size, step):
            j = sel[a:a + step]
            t, r = _range_costs(problem, rows.take(job_row[j]), recompute_units[j], kk, ii)
            W = np.full((j.size, p, U + 1, U + 1), np.inf)
            R = np.zeros((j.size, p, U + 1, U + 1), dtype=np.int64)
            W[:, :, kk, ii], R[:, :, kk, ii] = t, r
            cnt[j, :p], rec[j, :p], bott[j] = range_dp(W, R)
    return cnt, rec, bott


def _solve(problem: Problem, rows: ConfigBatch, coef: dict[str, np.ndarray],
           recompute_units: np.ndarray, job_row: np.ndarray):
    """Run :func:`balanced_counts` for jobs (row, N) and return counts and recomputed units
    (interleaved MoE layers: :func:`_solve_ranges`, the stage's cost by its actual layers)."""
    if _interleaves(problem.space.model):
        return _solve_ranges(problem, rows, recompute_units, job_row,
                             coef["fixed_s"].shape[1])
    units = problem.space.model.num_layers // rows.vp
    cap = problem.usable_bytes  # HBM less the reserve less --memory-headroom
    J = job_row.size
    width = coef["fixed_s"].shape[1]
    cnt = np.zeros((J, width), dtype=np.int64)
    rec = np.zeros((J, width), dtype=np.int64)
    bott = np.full(J, np.inf)
    pp_job = rows.pp[job_row]
    for p in np.unique(pp_job):  # one pass per pipeline depth: arrays of pp stages only
        j = np.flatnonzero(pp_job == p)
        r = job_row[j]
        c = StageCoefficients(
            **{k: (v[r, :p] if v.ndim == 2 else v[r]) for k, v in coef.items()},
            cap_bytes=np.full(j.shape, cap),
            units=units[r],
            stages=pp_job[j],
            recompute_units=recompute_units[j],
        )
        cnt[j, :p], rec[j, :p], bott[j] = balanced_counts(c)
    return cnt, rec, bott


class _Keeper:
    """The candidates a search still reports: every evaluated batch is folded into the
    ``tally``, and only the configurations it keeps (top, front, smallest) are held."""

    def __init__(self, problem: Problem, tally: Tally) -> None:
        self.problem, self.tally = problem, tally
        self.batch: ConfigBatch | None = None
        self.ids = np.zeros(0, dtype=np.int64)
        self.n_cand = 0

    def score(self, cand: ConfigBatch) -> Any:
        """Evaluate, fold into the tally, keep only what the tally still reports."""
        problem, tally = self.problem, self.tally
        res = problem.evaluate_batch(cand)
        ids = self.n_cand + np.arange(len(cand), dtype=np.int64)
        self.n_cand += len(cand)
        step = np.asarray(res.step_time_s, dtype=float)
        peak = np.asarray(res.memory_bytes["peak"], dtype=float)
        fits = np.asarray(res.fits, dtype=bool)
        ok = fits & problem.within_limits(step, peak)
        score, F = problem.values(res, step, peak, cand.gpus)
        score = np.where(ok, score, np.inf)
        tally.add(Scored(ids, np.zeros(len(cand), dtype=np.int8), fits, step, peak,
                         cand.gpus, score, F))
        live = np.concatenate([tally.top_flat, tally.front_flat, tally.small_flat])
        both = cand if self.batch is None else _concat([self.batch, cand])
        both_ids = np.concatenate([self.ids, ids])
        sel = np.flatnonzero(np.isin(both_ids, live))
        self.batch, self.ids = both.take(sel), both_ids[sel]
        return res

    def picked(self) -> ConfigBatch:
        """The kept configurations the tally reports, in its order (top, front, smallest)."""
        tally = self.tally
        pick = np.concatenate([tally.top_flat, tally.front_flat, tally.small_flat])
        pos = {int(x): k for k, x in enumerate(self.ids)}
        return self.batch.take(np.array([pos[int(x)] for x in pick], dtype=np.int64))


@dataclass(frozen=True)
class _OuterRows:
    """The outer configurations the DP can lay out (``vp`` divides the layers, at least one
    unit per stage), their step-time lower bound [s] and their p2p + optimizer time [s]."""

    rows: ConfigBatch
    bound: np.ndarray
    other_s: np.ndarray


def _even_splits(problem: Problem, keeper: _Keeper, progress=None) -> _OuterRows | None:
    """Phase 1 of :meth:`DPSearch.run`: every valid outer configuration evaluated with the even
    split (kept by ``keeper``), and those the DP can lay out with their lower bound (None when
    there is none)."""
    space = problem.space  # MoE: the layout model has the expert terms (perfmodel.memory.stage_layout)
    L = space.model.num_layers
    rows_l, bound_l, other_l = [], [], []
    total = space.size
    for flat in space.iter_chunks():
        a, viol = space.decode_flat(flat)
        valid = np.flatnonzero(viol == 0)
        if progress is not None:
            progress(int(flat[-1]) + 1, total)
        if valid.size == 0:
            continue
        rows = space.batch(a, valid)
        res = keeper.score(rows)
        ok = np.flatnonzero((L % rows.vp == 0) & (L // rows.vp >= rows.pp))
        if ok.size:
            sub = rows.take(ok)
            rows_l.append(sub)
            t = getattr(res, "time_s", {})
            other = sum(np.broadcast_to(np.asarray(t.get(k, 0.0), dtype=float),
                                        (len(rows),))[ok] for k in ("pp_comm", "optimizer"))
            bound_l.append(_step_lower_bound(problem, sub, other, L))
            other_l.append(other)
    if progress is not None:
        progress(total, total)
    if not rows_l:
        return None
    return _OuterRows(_concat(rows_l), np.concatenate(bound_l), np.concatenate(other_l))


DP_MAX_CELLS = 2**18
"""(outer configurations x pipeline stages) cells of one pass of the DP: the coefficient,
count and recompute arrays of a pass are each a few times this many float64 / int64 entries
(a few MB), whatever the number of stages."""


def cell_chunks(pp: np.ndarray, max_cells: int) -> list[np.ndarray]:
    """Consecutive index ranges of ``pp`` (rows in the order given) whose ``rows x max pp``
    stays within ``max_cells`` (one row at least per range).

    Example: ``pp = [2, 2, 8, 8]`` and 16 cells give ``[0, 1, 2]`` (3 rows x 8 = 24 > 16,
    so) ``[0, 1]``, ``[2, 3]``: 2 x 2 and 2 x 8.
    """
    pp = np.asarray(pp, dtype=np.int64)
    out, start, n = [], 0, pp.size
    while start < n:
        widest = np.maximum.accumulate(pp[start:])
        cells = widest * np.arange(1, n - start + 1)
        k = max(1, int(np.searchsorted(cells, max_cells, side="right")))
        out.append(np.arange(start, start + k))
        start += k
    return out


@dataclass(frozen=True)
class DPSearch:
    """For every outer configuration, the even split plus the DP's per-stage layouts.

    Parameters
    ----------
    top : configurations to report
    per_stage_recompute : let every stage recompute its own number of layers (FlagScale's
        ``recompute_num_layers_per_stage``; not expressible in Megatron-LM, whose
        ``--recompute-num-layers`` is one count for every stage). Default False: one count for
        every stage, searched around the per-stage optimum (its largest count, one less, one
        more) and at "all layers".
    chunk_rows : outer configurations solved per numpy pass, at most.
    max_cells : (configurations x stages) cells per numpy pass, at most (:func:`cell_chunks`):
        the per-stage arrays of a pass hold ``rows x max pp`` entries each, so a model with
        thousands of stages solves fewer rows at a time and memory stays bounded.
    """

    top: int = 10
    per_stage_recompute: bool = False
    chunk_rows: int = 4096
    max_cells: int = DP_MAX_CELLS
    name: str = "dp"

    def run(self, problem: Problem, seed: int = 0, progress=None) -> SearchResult:
        """Search; ``seed`` is unused (the DP is deterministic).

        Phase 1 evaluates every outer configuration with the even split (what the grid
        evaluates) and bounds from below the step time any layout of it can reach. Phase 2
        runs the DP on the outer configurations in the order of that bound and stops where
        the bound passes the k-th best step found (objectives ``time`` and ``cost``; the
        ``memory`` objective runs the DP everywhere)."""
        t0 = time.perf_counter()
        if problem.kernels != "fused":
            raise SpecError("strategy dp models Megatron-LM layouts: kernels must be 'fused' "
                            f"(got kernels '{problem.kernels}')")
        keeper = _Keeper(problem, Tally(self.top, problem.n_objectives))
        # Phase 1: the even splits, and a lower bound per outer configuration.
        outer = _even_splits(problem, keeper, progress)
        if keeper.batch is None:
            raise SpecError(problem.space.explain_empty())
        # Phase 2: the DP, best bound first, until no layout can enter the top.
        # (a release that splits layers evenly only runs no per-stage layout: phase 1 alone)
        fw = problem.space.framework
        uneven_ok = fw is None or fw.uneven_pipeline
        n_layouts, n_solved = (self._dp_layouts(problem, keeper, outer) if outer and uneven_ok
                               else (0, 0))
        tally = keeper.tally
        return finalize_batch(problem, keeper.picked(), len(tally.top_flat),
                              len(tally.front_flat), strategy=self.name,
                              evaluated=tally.evaluated, feasible=tally.feasible,
                              seconds=time.perf_counter() - t0,
                              extra={"layouts": n_layouts, "dp_solved": n_solved},
                              unfit_floor=tally.unfit_floor())

    def _dp_layouts(self, problem: Problem, keeper: _Keeper,
                    outer: _OuterRows) -> tuple[int, int]:
        """Phase 2: the DP's layouts of the outer configurations, best bound first, in chunks
        of ``chunk_rows``, until the bound passes the k-th best step; returns the layouts
        evaluated and the outer configurations solved."""
        L = problem.space.model.num_layers
        tally = keeper.tally
        rows, bound, other_all = outer.rows, outer.bound, outer.other_s
        two_types = _has_two_layer_types(problem.space.model) and problem.objective != "memory"
        if problem.objective == "memory":
            bound = np.full_like(bound, -np.inf)
        order = np.argsort(bound, kind="stable")
        n_layouts, n_solved = 0, 0
        for start in range(0, order.size, self.chunk_rows):
            kth = tally.top_keys[-1, 0] if len(tally.top_flat) >= self.top else np.inf
            idx = order[start:start + self.chunk_rows]
            idx = idx[bound[idx] < kth]
            if idx.size == 0:
                break
            if two_types:  # the tight bound, by layer type, on what passed the loose one
                tight = _step_lower_bound(problem, rows.take(idx), other_all[idx], L,
                                          typed=True)
                idx = idx[tight < kth]
                if idx.size == 0:
                    continue
            for part in cell_chunks(rows.pp[idx], self.max_cells):
                lay = self._layouts(problem, rows.take(idx[part]), L)
                n_solved += part.size
                if len(lay):
                    n_layouts += len(lay)
                    keeper.score(lay)
        return n_layouts, n_solved

    # ------------------------------------------------------------------------------------
    def _layouts(self, problem: Problem, sub: ConfigBatch, L: int) -> ConfigBatch:
        """The DP's layouts of the outer configurations ``sub`` (all with vp | L)."""
        coef = _coefficients(problem, sub, int(sub.pp.max()))
        rc = sub.recompute
        units = L // sub.vp
        # Jobs: keep-mode rows (none / selective) solve with no recompute; full rows with the
        # per-stage optimum, then (Megatron) one count around its largest and "all".
        job_row = np.arange(len(sub))
        job_n = np.where(rc == Recompute.FULL, -1, 0)
        cnt, rec, bott = _solve(problem, sub, coef, job_n, job_row)
        if not self.per_stage_recompute:
            full_rows = np.flatnonzero(rc == Recompute.FULL)
            n_ps = np.where(np.isfinite(bott[full_rows]), rec[full_rows].max(axis=1), 1)
            extra_rows, extra_n = [], []
            for d in (-1, 0, 1):
                extra_rows.append(full_rows)
                extra_n.append(np.clip(n_ps + d, 1, units[full_rows]))
            extra_rows.append(full_rows)
            extra_n.append(units[full_rows])
            jr = np.concatenate([np.flatnonzero(rc != Recompute.FULL), *extra_rows])
            n_kept = int(np.sum(rc != Recompute.FULL))
            jn = np.concatenate([np.zeros(n_kept, dtype=np.int64), *extra_n])
            cnt, rec, bott = _solve(problem, sub, coef, jn, jr)
            job_row = jr
        ok_job = np.isfinite(bott)
        job_row, cnt, rec = job_row[ok_job], cnt[ok_job], rec[ok_job]
        lay = sub.take(job_row)
        row_layers, _ = layers_mod.stage_counts(problem.space.model, lay)  # the row's own split
        vp = lay.vp[:, None]
        stage_layers = cnt * vp
        stage_rec = rec * vp
        any_rec = stage_rec.sum(axis=1) > 0
        rc_j = lay.recompute
        # A full row whose layout recomputes nothing is the no-recompute layout.
        new_rc = np.where((rc_j == Recompute.FULL) & ~any_rec, Recompute.NONE, rc_j)
        rec_m = np.where(((new_rc == Recompute.FULL) & any_rec)[:, None], stage_rec, -1)
        zeros = np.zeros(len(lay), dtype=np.int64)
        lay = dataclasses.replace(lay, recompute=new_rc, stage_layers=stage_layers,
                                  stage_recompute_layers=rec_m, first_stage_layers=zeros,
                                  last_stage_layers=zeros, embedding_as_layer=zeros.astype(bool),
                                  loss_as_layer=zeros.astype(bool))
        return _dedupe(lay, row_layers)


MOE_BOUND_SLACK = 0.9
"""Models with dense and MoE layers (DeepSeek-V3's dense leading layers, interleaved MoE):
phase 1 bounds with the average layer, which a layout priced by layer type can undercut (the
average layer pays every GEMM's launch floor once; measured 1.1 % on an 8-layer toy MoE), so
that bound is loosened to ``0.9 * total / P``; phase 2 then computes the typed bound
(``typed=True``: :func:`perfmodel.memory.stage_layout.layer_times_by_type`) on the rows that pass it, before
running the DP on them."""


def _has_two_layer_types(model) -> bool:
    return model.is_moe and not model.is_hybrid and 0 < model.num_moe_layers < model.num_layers


def _step_lower_bound(problem: Problem, rows: ConfigBatch, other_s: np.ndarray, L: int,
                      typed: bool = False) -> np.ndarray:
    """A step time no layout of these outer configurations goes below [s].

    The slowest stage is at least the perfect balance without recompute,
    ``T >= max((U c + e + g) / P, c + max(e, g))`` (``c``: one unit of ``vp`` layers, ``e``,
    ``g``: embedding and logits + loss), and the pipeline makespan ``(m - z/v) T + z/v *
    total`` grows with both ``T`` and the total (``z``: the fill factor, 1, or at least 1/3
    for ZB-H1). The p2p and optimizer terms of the even split are kept; the data-parallel and
    ZeRO-3 terms, which a layout can hide differently, are dropped (``other_s``: the p2p and
    optimizer time). The objective ``cost`` multiplies by the GPUs."""

    s = problem.space
    kw: dict[str, Any] = {"kernels": problem.kernels}
    if problem.calibration is not None:
        kw["calibration"] = problem.calibration
    keep = evaluate(s.model, s.training, s.cluster, layers_mod.without_layout(rows, "keep"),
                    **kw).extra
    units = (L // rows.vp).astype(np.float64)
    P = rows.pp.astype(np.float64)
    c = rows.vp * keep["layer_s"]
    e, g = keep["embed_s"], keep["head_s"]  # head: logits + loss and the MTP layers
    total = units * c + e + g
    if typed:  # layouts price dense and MoE layers apart: bound with the cheaper one
        lt = layer_times_by_type(s.model, s.training, s.cluster, rows, average=False,
                                            **kw)
        n_moe = float(s.model.num_moe_layers)
        c = rows.vp * np.minimum(lt["dense_keep"], lt["moe_keep"])
        total = (L - n_moe) * lt["dense_keep"] + n_moe * lt["moe_keep"] + e + g
    elif _has_two_layer_types(s.model):  # a looser bound from the average layer (see above)
        c = 0.0 * c
        total = MOE_BOUND_SLACK * total
    T = np.maximum(total / P, c + np.where(P > 1, np.maximum(e, g), e + g))
    m = rows.num_microbatches.astype(np.float64)
    v = np.where(rows.schedule == Schedule.INTERLEAVED, rows.vp, 1).astype(np.float64)
    z = np.where(rows.schedule == Schedule.ZB, 1.0 / 3.0, 1.0) / v
    z = np.where(P > 1, z, 0.0)
    makespan = (m - z) * T + z * total
    step = makespan + other_s
    if problem.objective == "cost":
        step = step * rows.gpus
    return step


def _layout_width(b: ConfigBatch) -> int:
    w = int(b.pp.max()) if len(b) else 1
    if b.stage_layers is not None:
        w = max(w, b.stage_layers.shape[1])
    return w


def _concat(batches: list[ConfigBatch]) -> ConfigBatch:
    """One batch of several (layout matrices padded to the widest)."""
    batches = [b for b in batches if len(b)]
    width = max(_layout_width(b) for b in batches)
    cols: dict[str, Any] = {}
    for f in dataclasses.fields(ConfigBatch):
        if f.name in ("stage_layers", "stage_recompute_layers"):
            fill = 0 if f.name == "stage_layers" else -1
            parts = []
            for b in batches:
                x = getattr(b, f.name)
                out = np.full((len(b), width), fill, dtype=np.int64)
                if x is not None:
                    out[:, :x.shape[1]] = x
                parts.append(out)
            cols[f.name] = np.concatenate(parts)
        else:
            cols[f.name] = np.concatenate([getattr(b, f.name) for b in batches])
    return ConfigBatch(**cols)


def _dedupe(lay: ConfigBatch, row_layers: np.ndarray) -> ConfigBatch:
    """Drop layouts that are their row's own split (even or Megatron-LM's uneven default) with
    its own recompute (already a candidate), and repeats."""
    pp = lay.pp[:, None]
    s = np.arange(lay.stage_layers.shape[1])[None, :]
    width = min(row_layers.shape[1], lay.stage_layers.shape[1])
    same = np.zeros(lay.stage_layers.shape, dtype=np.int64)
    same[:, :width] = row_layers[:, :width]
    even = np.all((lay.stage_layers == same) | (s >= pp), axis=1)
    rec = lay.stage_recompute_layers
    uniform_rec = (rec[:, 0] < 0) | np.all((rec == lay.stage_layers) | (s >= pp), axis=1)
    keep = np.flatnonzero(~(even & uniform_rec))
    # identical layouts from several jobs of one outer configuration: keep the first
    cols = [getattr(lay, f.name)[keep] for f in dataclasses.fields(ConfigBatch)
            if f.name not in ("stage_layers", "stage_recompute_layers")]
    key = np.column_stack([np.asarray(c, dtype=np.float64) for c in cols]
                          + [lay.stage_layers[keep], rec[keep]])
    _, first = np.unique(key, axis=0, return_index=True)
    return lay.take(keep[np.sort(first)])
