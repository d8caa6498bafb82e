"""Single-objective genetic algorithm over the integer encoding, for spaces too large to
enumerate.

Genes are indices into each dimension's candidate list (the same encoding as the grid). Each
generation: binary tournament selection, uniform crossover, per-gene mutation to a random
candidate, the space's canonical repair (schedule/vp/sp rules), and elitism; the whole population is scored in one vectorized call. Infeasible
configurations rank behind every feasible one: structurally invalid ones by their number of
violated constraints, ones that do not fit by their memory excess (a penalty, Deb 2000). Every
random draw comes from ``numpy.random.default_rng(seed)``: same seed, same answer.

References
----------
Goldberg, *Genetic Algorithms in Search, Optimization and Machine Learning*, 1989 (tournament
selection, uniform crossover); Deb, "An efficient constraint handling method for genetic
algorithms", CMAME 186, 2000 (feasible-first ranking).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from search.pareto import Tally
from search.result import SearchResult, finalize_tally
from search.space import Problem, Scored
from search.strategies.grid import Progress

__all__ = ["GeneticSearch", "penalized"]

_INVALID = 1e30
_NO_FIT = 1e20


def penalized(s: Scored, hbm_bytes: float) -> np.ndarray:
    """Fitness to minimise: the score when feasible; ``1e20 * (1 + peak/HBM)`` when valid but
    too large; ``1e30 * violations`` when structurally invalid."""
    over = _NO_FIT * (1.0 + np.nan_to_num(s.peak_memory_bytes / hbm_bytes, posinf=1e6))
    return np.where(s.ok, s.score, np.where(s.valid, over, _INVALID * s.violations))


@dataclass(frozen=True)
class GeneticSearch:
    """Genetic algorithm settings (the constructor only stores them).

    Parameters
    ----------
    population : int
    generations : int
    mutation_rate : float or None
        Per-gene probability; None means ``2 / number of genes``.
    elite : int
        Best individuals copied unchanged into the next generation.
    top : int
        Configurations reported.
    stall_generations : int
        After this many generations without improvement, keep the elite and redraw the rest
        of the population at random.
    """

    population: int = 64
    generations: int = 100
    mutation_rate: float | None = None
    elite: int = 4
    top: int = 10
    stall_generations: int = 15
    name: str = "ga"

    def run(self, problem: Problem, seed: int = 0, progress: Progress | None = None
            ) -> SearchResult:
        t0 = time.perf_counter()
        rng = np.random.default_rng(seed)
        shape = np.asarray(problem.space.shape)
        n_genes = shape.size
        rate = self.mutation_rate if self.mutation_rate is not None else 2.0 / n_genes
        hbm = problem.space.cluster.gpu.hbm_bytes
        tally = Tally(self.top, problem.n_objectives)
        repair = problem.space.repair
        pop = repair((rng.random((self.population, n_genes)) * shape).astype(np.int64))
        s = problem.score_genes(pop)
        tally.add(s)
        fit = penalized(s, hbm)
        best, stall, gen = fit.min(), 0, -1
        for gen in range(self.generations):
            # binary tournaments pick the parents
            a = rng.integers(0, self.population, (2, self.population))
            b = rng.integers(0, self.population, (2, self.population))
            pa = np.where(fit[a[0]] <= fit[b[0]], a[0], b[0])
            pb = np.where(fit[a[1]] <= fit[b[1]], a[1], b[1])
            # uniform crossover, then per-gene mutation to a random candidate
            cross = rng.random((self.population, n_genes)) < 0.5
            child = np.where(cross, pop[pa], pop[pb])
            mutate = rng.random((self.population, n_genes)) < rate
            child = np.where(mutate, (rng.random(child.shape) * shape).astype(np.int64), child)
            child = repair(child)
            cs = problem.score_genes(child)
            tally.add(cs)
            cfit = penalized(cs, hbm)
            # elitism: the best parents survive and replace the worst children
            elite = np.lexsort((s.flat, fit))[: self.elite]
            rest = np.sort(np.lexsort((cs.flat, cfit))[: self.population - self.elite])
            pop = np.concatenate([pop[elite], child[rest]])
            s = Scored.concat([s.take(elite), cs.take(rest)])
            fit = np.concatenate([fit[elite], cfit[rest]])
            if progress is not None:
                progress(gen + 1, self.generations)
            if fit.min() < best:
                best, stall = fit.min(), 0
            else:
                stall += 1
            if stall >= self.stall_generations:
                # restart: keep the elite, draw the rest at random (escapes a converged
                # population; the budget stays `generations`)
                fresh = (rng.random((self.population - self.elite, n_genes)) * shape)
                pop[self.elite:] = repair(fresh.astype(np.int64))
                fs = problem.score_genes(pop[self.elite:])
                tally.add(fs)
                s = Scored.concat([s.take(np.arange(self.elite)), fs])
                fit = np.concatenate([fit[: self.elite], penalized(fs, hbm)])
                stall = 0
        return finalize_tally(problem, tally, strategy=self.name, t0=t0,
                              extra={"generations": gen + 1})
