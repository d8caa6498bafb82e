"""Pareto fronts (all objectives minimised) and a running top-k, over numpy arrays.

References
----------
Deb, Pratap, Agarwal, Meyarivan, "A fast and elitist multiobjective genetic algorithm: NSGA-II",
IEEE TEVC 6(2), 2002, Sec. II (Pareto dominance).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from search.space import OFFLOAD_KINDS, OFFLOAD_SETS

__all__ = ["Tally", "dominates", "merge_front", "pareto_mask", "top_k"]


def dominates(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """True where ``a`` dominates ``b`` (no worse in every objective, better in one).

    Broadcasts over leading axes; the last axis holds the objectives.
    """
    return np.all(a <= b, axis=-1) & np.any(a < b, axis=-1)


def pareto_mask(F: np.ndarray) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``F`` (n x k, minimised).

    Rows with a non-finite entry are never on the front. Exact duplicates are all kept. The loop
    runs once per front member (not per row): each pass removes every row the current
    lexicographically smallest survivor dominates.
    """
    F = np.asarray(F, dtype=float)
    n = F.shape[0]
    keep = np.zeros(n, dtype=bool)
    cand = np.flatnonzero(np.all(np.isfinite(F), axis=1))
    if cand.size == 0:
        return keep
    # Objectives constant over the candidates decide nothing; with two or fewer left the front
    # is a sort and a running minimum (Kung, Luccio, Preparata 1975), O(n log n).
    Fc = F[cand]
    varying = np.flatnonzero(np.ptp(Fc, axis=0) > 0)
    if varying.size <= 2:
        if varying.size == 0:
            keep[cand] = True
            return keep
        uniq, inv = np.unique(Fc[:, varying], axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        if varying.size == 1:
            on = uniq[:, 0] == uniq[0, 0]
        else:  # rows are sorted by (f0, f1): on the front iff f1 beats every earlier row
            prev_min = np.concatenate([[np.inf], np.minimum.accumulate(uniq[:-1, 1])])
            on = uniq[:, 1] < prev_min
        keep[cand[on[inv]]] = True
        return keep
    # lexicographic order: the first row is always non-dominated
    order = np.lexsort(F[cand].T[::-1])
    cand = cand[order]
    while cand.size:
        head = F[cand[0]]
        keep[cand[0]] = True
        rest = cand[1:]
        cand = rest[~dominates(head, F[rest]) & ~np.all(F[rest] == head, axis=1)]
        # exact duplicates of head are also on the front
        dup = rest[np.all(F[rest] == head, axis=1)]
        keep[dup] = True
    return keep


def merge_front(
    ids_a: np.ndarray, F_a: np.ndarray, ids_b: np.ndarray, F_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pareto front of the union of two sets (ids and objective rows), ids ascending."""
    ids = np.concatenate([ids_a, ids_b])
    F = np.concatenate([F_a, F_b])
    ids, first = np.unique(ids, return_index=True)
    F = F[first]
    m = pareto_mask(F)
    return ids[m], F[m]


def top_k(keys: tuple[np.ndarray, ...], k: int) -> np.ndarray:
    """Indices of the ``k`` smallest entries ordered by ``keys`` (primary key first).

    Ties on the primary key are broken by the following keys, so the answer does not depend on
    the order the entries arrived in (the last key should be unique, e.g. a flat index).
    Non-finite primary keys are excluded.
    """
    primary = np.asarray(keys[0], dtype=float)
    idx = np.flatnonzero(np.isfinite(primary))
    if idx.size > k > 0:
        kth = np.partition(primary[idx], k - 1)[k - 1]
        idx = idx[primary[idx] <= kth]
    order = np.lexsort(tuple(np.asarray(key)[idx] for key in keys[::-1]))
    return idx[order][:k]


class Tally:
    """Running summary of the configurations a strategy has scored: the top-k by the
    objective, the Pareto front, the smallest memory footprint and the counts.

    Every strategy feeds it :class:`~search.space.Scored` blocks (in any order, repeats
    allowed); the summary is the same whatever the order, because ties are broken by the flat
    index.
    """

    def __init__(self, k: int, n_objectives: int = 3, *, repeats: bool = True) -> None:
        """``repeats=False`` promises each flat index is added once (the grid), which skips
        the bookkeeping of indices already seen."""
        self.k = k
        self.repeats = repeats
        self.top_flat = np.zeros(0, dtype=np.int64)
        self.top_keys = np.zeros((0, 3))  # score, step time, peak memory
        self.front_flat = np.zeros(0, dtype=np.int64)
        self.front_F = np.zeros((0, n_objectives))
        self.small_flat = np.zeros(0, dtype=np.int64)
        self.small_peak = np.inf
        self.seen = np.zeros(0, dtype=np.int64)
        self.evaluated = 0
        self.feasible = 0
        #: the fastest step [s] and fewest GPU-seconds per step of the valid configurations
        #: that do not fit in memory (what memory alone kept out: :meth:`unfit_floor`)
        self.unfit_step_s = np.inf
        self.unfit_gpu_s = np.inf
        #: the same among those an offload set could let in (its freeable bytes cover the
        #: excess), each with what the set adds to its step at least (the host optimizer
        #: step), per set of OFFLOAD_SETS; None while no block said what offload frees
        self.unfit_by_set: dict[str, list[float]] | None = None

    def add(self, s) -> None:
        """Fold a scored block into the summary."""
        valid = s.valid
        if not self.repeats:
            self.evaluated += int(valid.sum())
            self.feasible += int(s.ok.sum())
        elif (new := ~np.isin(s.flat, self.seen) & valid).any():
            nf = np.unique(s.flat[new])
            self.seen = np.union1d(self.seen, nf)
            ok_new = np.unique(s.flat[new & s.fits])
            self.evaluated += nf.size
            self.feasible += ok_new.size
        self._add_unfit(s, valid & ~s.fits)
        if valid.any():
            peak = np.where(valid, s.peak_memory_bytes, np.inf)
            i = int(np.lexsort((s.flat, peak))[0])
            if peak[i] < self.small_peak or (
                peak[i] == self.small_peak and s.flat[i] < self.small_flat[0]
            ):
                self.small_peak = float(peak[i])
                self.small_flat = s.flat[i : i + 1].copy()
        ok = s.ok
        if not ok.any():
            return
        flat = np.concatenate([self.top_flat, s.flat[ok]])
        keys = np.concatenate(
            [self.top_keys, np.stack([s.score[ok], s.step_time_s[ok], s.peak_memory_bytes[ok]], 1)]
        )
        flat, first = np.unique(flat, return_index=True)
        keys = keys[first]
        sel = top_k((keys[:, 0], keys[:, 1], keys[:, 2], flat), self.k)
        self.top_flat, self.top_keys = flat[sel], keys[sel]
        F = s.F[ok]
        m = pareto_mask(F)
        self.front_flat, self.front_F = merge_front(
            self.front_flat, self.front_F, s.flat[ok][m], F[m]
        )

    def _add_unfit(self, s, unfit: np.ndarray) -> None:
        """Fold the configurations that do not fit into the floors of :meth:`unfit_floor`."""
        if s.freeable_bytes is not None and self.unfit_by_set is None:
            self.unfit_by_set = {"+".join(k): [np.inf, np.inf] for k in OFFLOAD_SETS}
        if not unfit.any():
            return
        step = s.step_time_s[unfit]
        gpu_s = step * s.gpus[unfit]
        self.unfit_step_s = min(self.unfit_step_s, float(step.min()))
        self.unfit_gpu_s = min(self.unfit_gpu_s, float(gpu_s.min()))
        if s.freeable_bytes is None or self.unfit_by_set is None:
            return
        free, excess = s.freeable_bytes[unfit], s.excess_bytes[unfit]
        host = (np.zeros(step.shape) if s.host_optimizer_s is None
                else s.host_optimizer_s[unfit])
        for kinds in OFFLOAD_SETS:
            cols = [OFFLOAD_KINDS.index(k) for k in kinds]
            could = free[:, cols].sum(axis=1) >= excess
            if could.any():  # each one's step at least, with this offload
                with_s = step[could] + (host[could] if "optimizer" in kinds else 0.0)
                floor = self.unfit_by_set["+".join(kinds)]
                floor[0] = min(floor[0], float(with_s.min()))
                floor[1] = min(floor[1], float((with_s * s.gpus[unfit][could]).min()))

    def unfit_floor(self) -> dict[str, Any]:
        """What memory alone kept out: the fastest step (``time``) and fewest GPU-seconds per
        step (``cost``) among the valid configurations that do not fit (inf: none), and, where
        the blocks said what offload frees, the same per offload set (``sets``, keyed
        ``optimizer``, ``activations``, ``optimizer+params``) among those it could let in."""
        out: dict[str, Any] = {"time": self.unfit_step_s, "cost": self.unfit_gpu_s}
        if self.unfit_by_set is not None:
            out["sets"] = {k: {"time": v[0], "cost": v[1]} for k, v in self.unfit_by_set.items()}
        return out
