"""Exhaustive grid search: every configuration of the space, in whole numpy chunks.

The space is numbered ``0 .. size-1``; ranges whose (tp, pp, cp, vp) prefix already violates a
constraint are skipped (:meth:`SearchSpace.iter_chunks`), each remaining chunk of flat indices is
decoded, masked by the structural constraints and the valid part evaluated in one call of the
cost model. Only the
top-k, the Pareto front and the smallest footprint are kept between chunks, so memory stays
bounded whatever the size of the space.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from search.pareto import Tally
from search.result import SearchResult, finalize_batch, finalize_tally
from search.space import MAX_GRID_CONFIGURATIONS, Problem, check_search_size

__all__ = ["GridSearch", "Progress", "evaluate_single"]

#: ``progress(done, total)``: flat indices processed so far, out of the space's size.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class GridSearch:
    """Evaluate every configuration.

    Parameters
    ----------
    top : int
        How many of the best configurations to report.
    chunk_size : int
        Flat indices decoded and evaluated per numpy call (2**18 keeps the temporaries at a
        few tens of MB).
    """

    top: int = 10
    chunk_size: int = 2**18
    name: str = "grid"
    max_configurations: int | None = MAX_GRID_CONFIGURATIONS
    """Refuse (SpecError, one line) a space larger than this; None: go on whatever its size."""

    def run(self, problem: Problem, seed: int = 0, progress: Progress | None = None
            ) -> SearchResult:
        """Search the whole space; ``seed`` is unused (exhaustive search is deterministic)."""
        t0 = time.perf_counter()
        tally = Tally(self.top, problem.n_objectives, repeats=False)
        check_search_size(problem.space, self.max_configurations)
        total = problem.space.size
        for flat in problem.space.iter_chunks(self.chunk_size):
            tally.add(problem.score_flat(flat))
            if progress is not None:
                progress(int(flat[-1]) + 1, total)
        if progress is not None:
            progress(total, total)  # ranges after the last valid prefix were skipped
        return finalize_tally(problem, tally, strategy=self.name, t0=t0)


def evaluate_single(problem: Problem) -> SearchResult:
    """The one configuration of a fully pinned space, as ``GridSearch(top=1, name="single")``
    reports it, evaluated once (the grid evaluates it to score it, then again to report it):
    the path of ``plan`` with every dimension pinned and of ``plan validate``'s rows."""
    t0 = time.perf_counter()
    flat = np.zeros(1, dtype=np.int64)
    a, violations = problem.space.decode_flat(flat)
    batch = problem.space.batch(a)
    res = problem.evaluate_batch(batch) if violations[0] == 0 else None
    if res is None or not callable(getattr(res, "take", None)):
        return GridSearch(top=1, name="single").run(problem)  # invalid, or a custom evaluator
    tally = Tally(1, repeats=False)
    tally.add(problem._score(flat, a, violations, res))
    n_top, n_front = len(tally.top_flat), len(tally.front_flat)
    again = np.zeros(n_top + n_front + len(tally.small_flat), dtype=np.int64)
    return finalize_batch(problem, batch.take(again), n_top, n_front, strategy="single",
                          evaluated=tally.evaluated, feasible=tally.feasible,
                          seconds=time.perf_counter() - t0, result=res.take(again))
