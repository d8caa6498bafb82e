"""NSGA-II adapter: hypervolume (hand-computed), and the front against the exhaustive one."""

from __future__ import annotations

import numpy as np
import pytest

from search.strategies.grid import GridSearch
from search.strategies.nsga2 import NSGA2Search, hypervolume, hypervolume_ratio
from tests.search.test_space import small_problem

OBJ = ["step_time_s", "peak_memory_bytes", "gpus"]


def test_hypervolume_hand_computed():
    """Points (1,2), (2,1), reference (3,3): [1,3]x[2,3] and [2,3]x[1,3] overlap in
    [2,3]x[2,3]: 2 + 2 - 1 = 3."""
    assert hypervolume(np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([3.0, 3.0])) == 3.0


def test_hypervolume_ratio_of_exact_front_is_one_and_subsets_less():
    F = np.array([[1.0, 4.0, 8], [2.0, 2.0, 8], [4.0, 1.0, 8]])
    assert hypervolume_ratio(F, F) == pytest.approx(1.0)
    assert hypervolume_ratio(F[:2], F) < 1.0


@pytest.mark.slow
def test_nsga2_front_close_to_exhaustive():
    """Hypervolume ratio against the exact Pareto front of the small space, and the number of
    evaluations it took (printed; run with -s to see)."""
    p = small_problem()
    exact = GridSearch().run(p)
    r = NSGA2Search(population=60, generations=40).run(p, seed=0)
    ratio = hypervolume_ratio(r.pareto[OBJ].to_numpy(float), exact.pareto[OBJ].to_numpy(float))
    print(f"\nNSGA-II: hypervolume ratio {ratio:.4f} with {r.evaluated} configurations evaluated "
          f"({r.extra['function_calls']} function calls) vs {exact.evaluated} exhaustive; "
          f"front {len(r.pareto)} vs {len(exact.pareto)} points")
    assert ratio >= 0.95
    assert r.evaluated < exact.evaluated
