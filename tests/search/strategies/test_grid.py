"""Exhaustive grid search, Pareto fronts and the running top-k."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from search.pareto import Tally, dominates, pareto_mask, top_k
from search.strategies.grid import GridSearch
from tests.search.test_space import all_valid_configs, small_problem


def reference_best(problem, k=5):
    """Brute force: score every valid configuration in one call and sort."""
    flat = all_valid_configs(problem.space)
    s = problem.score_flat(flat)
    order = np.lexsort((s.flat, s.peak_memory_bytes, s.step_time_s, s.score))
    order = order[np.isfinite(s.score[order])]
    return s, flat[order[:k]]


def test_grid_equals_brute_force():
    p = small_problem()
    r = GridSearch(top=5).run(p)
    s, best = reference_best(p)
    got = [p.space.encode(p.space.batch(p.space.decode_flat(np.array([f]))[0]).config(0))
           for f in best]
    assert got == best.tolist()
    assert r.top["step_time_s"].iloc[0] == s.score[s.flat == best[0]][0]
    assert r.evaluated == int(s.valid.sum()) and r.feasible == int(s.ok.sum())
    assert r.top["step_time_s"].is_monotonic_increasing


def test_chunking_does_not_change_the_answer():
    p = small_problem()
    a = GridSearch(top=7).run(p)
    b = GridSearch(top=7, chunk_size=997).run(p)
    assert a.top.equals(b.top)
    assert a.pareto.equals(b.pareto)
    assert (a.evaluated, a.feasible) == (b.evaluated, b.feasible)


def test_grid_pareto_is_the_exact_front():
    p = small_problem()
    r = GridSearch().run(p)
    s = p.score_flat(all_valid_configs(p.space))
    ok = s.ok
    front = s.F[ok][pareto_mask(s.F[ok])]
    got = r.pareto[["step_time_s", "peak_memory_bytes", "gpus"]].to_numpy(float)
    assert sorted(map(tuple, got)) == sorted(map(tuple, front))


def test_progress_reaches_total():
    p = small_problem()
    calls = []
    GridSearch(chunk_size=5000).run(p, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (p.space.size, p.space.size)
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(calls) <= -(-p.space.size // 5000) + 1


def test_memory_objective_minimises_peak():
    p = small_problem("memory")
    r = GridSearch(top=3).run(p)
    s = p.score_flat(all_valid_configs(p.space))
    assert r.top["peak_memory_bytes"].iloc[0] == s.peak_memory_bytes[s.ok].min()


def test_pareto_mask_hand_example():
    F = np.array([[1, 5], [2, 2], [3, 1], [3, 3], [1, 5], [np.inf, 0]], dtype=float)
    # (3,3) is dominated by (2,2); the duplicate (1,5) stays; inf rows never count
    assert pareto_mask(F).tolist() == [True, True, True, False, True, False]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 2)),
                min_size=1, max_size=40))
def test_pareto_mask_properties(points):
    F = np.asarray(points, dtype=float)
    m = pareto_mask(F)
    front, rest = F[m], F[~m]
    # no front member is dominated by any point, every other point is dominated by a member
    assert not dominates(F[:, None, :], front[None, :, :]).any()
    for x in rest:
        assert dominates(front, x).any()


def test_top_k_breaks_ties_by_later_keys():
    score = np.array([2.0, 1.0, 1.0, np.inf, 1.0])
    second = np.array([0, 5, 3, 0, 3])
    ident = np.array([10, 11, 12, 13, 9])
    assert top_k((score, second, ident), 3).tolist() == [4, 2, 1]


def test_tally_is_order_independent():
    p = small_problem()
    flat = all_valid_configs(p.space)
    rng = np.random.default_rng(1)
    t1, t2 = Tally(5), Tally(5)
    for part in np.array_split(flat, 4):
        t1.add(p.score_flat(part))
    for part in np.array_split(rng.permutation(flat), 7):
        t2.add(p.score_flat(part))
        t2.add(p.score_flat(part[:3]))  # repeats are not counted twice
    assert t1.top_flat.tolist() == t2.top_flat.tolist()
    assert t1.front_flat.tolist() == t2.front_flat.tolist()
    assert (t1.evaluated, t1.feasible) == (t2.evaluated, t2.feasible)


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 1)),
                min_size=1, max_size=40), st.booleans())
def test_pareto_mask_matches_brute_force(points, constant_third):
    F = np.array(points, dtype=float)
    if constant_third:
        F[:, 2] = 7.0  # the sort-based path (two varying objectives)
    brute = np.array([not any(np.all(F[j] <= F[i]) and np.any(F[j] < F[i])
                              for j in range(len(F))) for i in range(len(F))])
    assert np.array_equal(pareto_mask(F), brute)
