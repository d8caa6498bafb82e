"""NSGA-II through pymoo: the multi-objective view (step time, peak memory, GPU count), or,
with the problem's ``pareto`` ``time-to-train-cost``, the whole run's (expected wall time with
failures and checkpoints, cost), both from :meth:`search.space.Problem.values` over the whole
population at once.

This is the only module that imports pymoo. Variables are integers, one per searched dimension:
the index into that dimension's candidate list (the grid's encoding), sampled with
``IntegerRandomSampling`` and varied with SBX and polynomial mutation followed by rounding,
as pymoo's documentation does for discrete variables. Two inequality constraints
(``G <= 0`` is feasible): the number of violated structural constraints, and the memory excess
over HBM. Every configuration evaluated goes into an archive, so the reported front is the
non-dominated set of everything seen (not only the last population).

References
----------
Deb, Pratap, Agarwal, Meyarivan, "A fast and elitist multiobjective genetic algorithm: NSGA-II",
IEEE TEVC 6(2), 2002. Blank & Deb, "pymoo: Multi-Objective Optimization in Python", IEEE Access
8, 2020. Zitzler & Thiele, IEEE TEVC 3(4), 1999 (hypervolume).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2, binary_tournament
from pymoo.core.duplicate import DefaultDuplicateElimination
from pymoo.core.mating import Mating
from pymoo.core.problem import Problem as PymooProblem
from pymoo.core.repair import Repair
from pymoo.indicators.hv import HV
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.repair.rounding import RoundingRepair
from pymoo.operators.sampling.rnd import IntegerRandomSampling
from pymoo.operators.selection.tournament import TournamentSelection
from pymoo.optimize import minimize

from search.pareto import Tally
from search.result import SearchResult, finalize_tally
from search.space import Problem
from search.strategies.grid import Progress

__all__ = ["NSGA2Search", "hypervolume", "hypervolume_ratio"]


class _Adapter(PymooProblem):
    """pymoo view of a :class:`~search.space.Problem` (vectorized: one call per population)."""

    def __init__(self, problem: Problem, tally: Tally, progress: Progress | None,
                 max_evals: int) -> None:
        shape = np.asarray(problem.space.shape)
        super().__init__(n_var=shape.size, n_obj=problem.n_objectives, n_ieq_constr=2,
                         xl=np.zeros(shape.size), xu=shape - 1, vtype=int)
        self.problem = problem
        self.tally = tally
        self.progress = progress
        self.max_evals = max_evals
        self.hbm_bytes = problem.space.cluster.gpu.hbm_bytes
        self.calls = 0

    def _evaluate(self, x, out, *args, **kwargs):
        genes = np.rint(x).astype(np.int64)
        s = self.problem.score_genes(genes)
        self.tally.add(s)
        self.calls += genes.shape[0]
        F = s.F
        big = np.finfo(float).max / 1e6
        out["F"] = np.where(np.isfinite(F), F, big)
        peak_ratio = np.where(s.valid, s.peak_memory_bytes / self.hbm_bytes, 0.0)
        out["G"] = np.stack([
            s.violations.astype(float),
            np.where(s.valid & ~s.fits, np.maximum(peak_ratio - 1.0, 0.0) + 1e-3, 0.0),
        ], axis=1)
        if self.progress is not None:
            self.progress(min(self.calls, self.max_evals), self.max_evals)


class _CanonicalRepair(Repair):
    """Round to integers, then apply :meth:`SearchSpace.repair` (schedule/vp/sp rules)."""

    def __init__(self, space) -> None:
        super().__init__()
        self.space = space

    def _do(self, problem, X, **kwargs):
        X = np.clip(np.rint(X), problem.xl, problem.xu).astype(np.int64)
        return self.space.repair(X)


@dataclass(frozen=True)
class NSGA2Search:
    """NSGA-II settings (the constructor only stores them).

    Parameters
    ----------
    population : int
    generations : int
    top : int
        Configurations reported in ``top`` (ranked by the problem's single objective among
        everything evaluated).
    """

    population: int = 80
    generations: int = 60
    top: int = 10
    name: str = "nsga2"

    def run(self, problem: Problem, seed: int = 0, progress: Progress | None = None
            ) -> SearchResult:
        t0 = time.perf_counter()
        tally = Tally(self.top, problem.n_objectives)
        adapter = _Adapter(problem, tally, progress, self.population * self.generations)
        dedup = DefaultDuplicateElimination()
        repair = _CanonicalRepair(problem.space)
        # pymoo retries mating up to 100 times to fill the offspring with new individuals;
        # in a small discrete space that dominates the run time, so cap it at 5.
        mating = Mating(
            TournamentSelection(func_comp=binary_tournament),
            SBX(prob=1.0, eta=3.0, vtype=float, repair=RoundingRepair()),
            PM(prob=1.0, eta=3.0, vtype=float, repair=RoundingRepair()),
            repair=repair,
            eliminate_duplicates=dedup,
            n_max_iterations=5,
        )
        algorithm = NSGA2(
            pop_size=self.population,
            sampling=IntegerRandomSampling(),
            mating=mating,
            repair=repair,
            eliminate_duplicates=dedup,
        )
        minimize(adapter, algorithm, ("n_gen", self.generations), seed=seed, verbose=False)
        return finalize_tally(problem, tally, strategy=self.name, t0=t0,
                              extra={"function_calls": adapter.calls})


def hypervolume(F: np.ndarray, ref_point: np.ndarray) -> float:
    """Hypervolume dominated by the rows of ``F`` (minimised) up to ``ref_point``.

    References
    ----------
    Zitzler & Thiele 1999; computed by pymoo's ``HV`` indicator.
    """
    F = np.asarray(F, dtype=float)
    if F.size == 0:
        return 0.0
    return float(HV(ref_point=np.asarray(ref_point, dtype=float))(F))


def hypervolume_ratio(F: np.ndarray, F_exact: np.ndarray) -> float:
    """Hypervolume of front ``F`` over that of the exact front ``F_exact`` (1 = as good).

    Both are normalised by the exact front's ideal and nadir points (objectives that are
    constant on the exact front are dropped); the reference point is 1.1 in every normalised
    objective.
    """
    F, F_exact = np.asarray(F, dtype=float), np.asarray(F_exact, dtype=float)
    ideal, nadir = F_exact.min(0), F_exact.max(0)
    keep = nadir > ideal
    if not keep.any():
        return 1.0 if np.any(np.all(F <= nadir, axis=1)) else 0.0
    span = (nadir - ideal)[keep]

    def norm(x):
        return (x[:, keep] - ideal[keep]) / span

    ref = np.full(int(keep.sum()), 1.1)
    return hypervolume(norm(F), ref) / hypervolume(norm(F_exact), ref)
