"""Every strategy: same protocol, same result type, the exhaustive optimum on a small space,
and the same answer for the same seed."""

from __future__ import annotations

import pytest

from search.evolutionary import GeneticSearch
from search.grid import GridSearch
from search.nsga2 import NSGA2Search
from search.result import SearchResult
from tests.search.test_space import small_problem

STRATEGIES = {
    "grid": GridSearch(top=3),
    "ga": GeneticSearch(top=3),
    "nsga2": NSGA2Search(top=3),
}
KEY = ["dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "recompute",
       "sequence_parallel", "schedule", "step_time_s", "peak_memory_bytes"]


@pytest.fixture(scope="module")
def exhaustive():
    return {obj: GridSearch(top=3).run(small_problem(obj)) for obj in ("time", "memory")}


NAMES = ["grid", "ga", pytest.param("nsga2", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("objective", ["time", "memory"])
def test_finds_the_exhaustive_optimum(name, objective, exhaustive):
    r = STRATEGIES[name].run(small_problem(objective), seed=0)
    assert isinstance(r, SearchResult) and r.strategy == name
    ref = exhaustive[objective].best
    col = "step_time_s" if objective == "time" else "peak_memory_bytes"
    assert r.best[col].iloc[0] == pytest.approx(ref[col].iloc[0], rel=1e-12)
    assert r.evaluated >= r.feasible > 0
    assert list(r.top.columns) == list(exhaustive[objective].top.columns)


@pytest.mark.parametrize("name", ["ga", pytest.param("nsga2", marks=pytest.mark.slow)])
def test_same_seed_same_answer(name):
    p = small_problem()
    a = STRATEGIES[name].run(p, seed=3)
    b = STRATEGIES[name].run(p, seed=3)
    assert a.top[KEY].equals(b.top[KEY])
    assert a.pareto[KEY].equals(b.pareto[KEY])
    assert a.evaluated == b.evaluated


def test_ga_finds_optimum_for_several_seeds(exhaustive):
    ref = exhaustive["time"].best["step_time_s"].iloc[0]
    p = small_problem()
    hits = [GeneticSearch().run(p, seed=s).best["step_time_s"].iloc[0] == ref for s in range(4)]
    assert all(hits)
