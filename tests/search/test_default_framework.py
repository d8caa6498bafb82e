"""The default stack is a real release: with no framework a plan is for the GPU generation's
newest shipped preset that runs the model; `ideal` is the what-if stack the planner used to
assume (its switches are the TrainingSpec defaults, and it refuses nothing)."""

from __future__ import annotations

import pytest

from perfmodel.core.codes import RECOMPUTE, SCHEDULE
from perfmodel.spec.frameworks import default_framework, load_framework
from perfmodel.spec.specs import RECIPE_PRECISIONS as PRECISION_RECIPES
from perfmodel.spec.specs import TrainingSpec, load_gpu, load_model
from search import plan


@pytest.mark.parametrize("gpu, model, expected", [
    ("a100-sxm4-80gb", "gpt3-175b", "megatron-2022"),
    ("v100-sxm2-32gb", "gpt3-175b", "megatron-2022"),
    ("a100-sxm4-80gb", "mixtral-8x7b", "megatron-lm"),  # v3.0 has no MoE layers
    ("h100-sxm5-80gb", "llama3.1-8b", "bridge-26.02"),
    ("b200", "mixtral-8x7b", "bridge-26.02"),
    ("gb300", "llama3.1-8b", "bridge-26.02"),
    ("mi300x", "llama3.1-8b", "megatron-lm"),
])
def test_default_release_by_gpu_generation(gpu, model, expected):
    fw, why = default_framework(load_gpu(gpu), load_model(model))
    assert fw.name == expected and why.startswith("default for")


def test_ideal_is_the_planners_own_switches_and_refuses_nothing():
    ideal = load_framework("ideal")
    t = TrainingSpec()
    for k, v in ideal.training_switches().items():
        assert getattr(t, k) == v, k
    assert set(ideal.schedules) == set(SCHEDULE) and set(ideal.recompute) == set(RECOMPUTE)
    assert ideal.zero_stages == (0, 1, 2, 3) and ideal.max_zero_stage_with_pp == 3
    assert set(ideal.precisions) >= set(PRECISION_RECIPES)


def test_plan_names_its_default_release():
    r = plan("llama3.1-8b", "dgx-h100", gpus=8, global_batch_size=32, seq_len=4096, tp=8,
             pp=1, cp=1, top=1)
    assert r.setup["framework"] == "bridge-26.02"
    assert r.setup["framework_source"].startswith("default for compute capability 9.0")
    r = plan("llama3.1-8b", "dgx-h100", gpus=8, global_batch_size=32, seq_len=4096, tp=8,
             pp=1, cp=1, top=1, framework="ideal")
    assert r.setup["framework"] == "ideal" and r.setup["framework_source"] is None


@pytest.mark.slow
def test_default_first_screen_is_within_published_a100_mfu():
    """`plan` with no options (GPT-3 175B on 1024 A100): the default release, Megatron-LM v3.0,
    gives an MFU within what published A100 runs of that scale reached (Narayanan et al. 2021
    and Korthikanti et al. 2022: 44-56 %); the what-if stack gives more."""
    r = plan("gpt3-175b", "dgx-a100-80g", top=1)
    assert r.setup["framework"] == "megatron-2022"
    assert 0.44 <= r.best_row["mfu"] <= 0.563
    ideal = plan("gpt3-175b", "dgx-a100-80g", top=1, framework="ideal")
    assert ideal.best_row["mfu"] > r.best_row["mfu"]
