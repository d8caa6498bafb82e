"""The DP strategy's memory is bounded whatever the space: its per-stage arrays hold at most
``max_cells`` (configurations x pipeline stages) entries per pass (:func:`cell_chunks`), so a
model with thousands of layers split over thousands of stages solves fewer configurations at a
time instead of building (configurations x max pp) matrices."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from perfmodel.spec.specs import load_model
from search.api import make_problem
from search.strategies.dp import DPSearch, cell_chunks


def test_cell_chunks_hand_computed():
    parts = cell_chunks(np.array([2, 2, 8, 8]), 16)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3]]
    # a row wider than the budget still goes, alone
    assert [p.tolist() for p in cell_chunks(np.array([100, 1, 1]), 16)] == [[0], [1, 2]]
    assert cell_chunks(np.array([], dtype=np.int64), 16) == []


@pytest.mark.parametrize("seed", range(5))
def test_cell_chunks_cover_every_row_once_within_the_budget(seed):
    rng = np.random.default_rng(seed)
    pp = rng.integers(1, 4096, size=1000)
    parts = cell_chunks(pp, 2**14)
    assert np.array_equal(np.concatenate(parts), np.arange(pp.size))
    for p in parts:
        assert p.size == 1 or p.size * pp[p].max() <= 2**14


class _Recording(DPSearch):
    """DPSearch recording the (rows, widest pp) of each pass of the DP."""

    def _layouts(self, problem, sub, L):
        self.passes.append((len(sub), int(sub.pp.max())))
        return super()._layouts(problem, sub, L)


@pytest.mark.slow
def test_deep_model_dp_is_bounded_and_unchanged():
    model = load_model("gpt3-125m").model_copy(update={"num_layers": 1024, "name": "deep"})
    problem = make_problem(model, "dgx-h100", gpus=1024, tp=1, cp=1, zero_stage=1,
                           micro_batch_size=1, strategy="dp", global_batch_size=1024,
                           seq_len=256, objective="memory")
    small = _Recording(top=3, max_cells=2**12)
    object.__setattr__(small, "passes", [])
    tracemalloc.start()
    bounded = small.run(problem)
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert small.passes and all(n == 1 or n * w <= 2**12 for n, w in small.passes)
    assert peak_bytes < 256 * 2**20
    whole = DPSearch(top=3, max_cells=2**40).run(problem)
    assert bounded.best["step_time_s"].tolist() == whole.best["step_time_s"].tolist()
