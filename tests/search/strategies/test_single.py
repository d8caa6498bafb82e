"""A fully pinned plan is evaluated once (``evaluate_single``): the same result as the
one-point grid, whether the configuration fits or not."""

from __future__ import annotations

import json

import pytest

from search.api import problem_of
from search.request import PlanRequest
from search.strategies.grid import GridSearch, evaluate_single

_PINS = {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "vp": 1, "micro_batch_size": 1,
         "recompute": "full", "sequence_parallel": False, "schedule": "1f1b"}


@pytest.mark.parametrize("zero_stage", [0, 3])  # 8B without ZeRO does not fit on 8 H100
def test_single_equals_one_point_grid(zero_stage):
    p = problem_of(PlanRequest(model="llama3.1-8b", cluster="dgx-h100", gpus=8,
                               global_batch_size=8, seq_len=4096, zero_stage=zero_stage,
                               offload=["none"], **_PINS))
    a, b = GridSearch(top=1, name="single").run(p).to_json(), evaluate_single(p).to_json()
    for doc in (a, b):
        doc["search"].pop("seconds")
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True,
                                                                   default=str)
    assert bool(a["top"]) == (zero_stage == 3)
