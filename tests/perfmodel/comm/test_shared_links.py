"""Shared links, overlap slowdown, low-precision recipes and causal HFU."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from perfmodel.comm import comm_time
from perfmodel.compute import layer as compute
from perfmodel.hardware import overlap
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import TrainingSpec, load_cluster, load_gpu, load_model
from perfmodel.step import evaluate as step_mod


def test_link_busy_sums_streams_on_the_same_tier():
    streams = {
        "dp": (np.array([0.7, 0.7]), np.array([1, 0])),
        "z3": (np.array([2.7, 2.7]), np.array([1, 1])),
        "tp": (np.array([0.5, 0.5]), np.array([0, -1])),  # -1: a group of one GPU sends nothing
    }
    busy = comm_time.link_busy_s(streams, 2)
    assert busy[:, 0] == pytest.approx([0.5, 3.4])
    assert busy[:, 1] == pytest.approx([0.7, 2.7])


def test_stream_busy_in_window_hand_computed():
    # docstring example: 0.7 s own + 2.7 s of other traffic * (0.5 s window / 3 s span)
    assert comm_time.stream_busy_in_window_s(0.7, 3.4, 0.5, 3.0) == pytest.approx(1.15)


def test_shared_link_excess():
    busy = np.array([[1.0, 1.0], [3.5, 2.0]])
    out = comm_time.shared_link_excess_s(busy, np.array([3.0, 3.0]), np.array([0.1, 0.1]))
    assert out == pytest.approx([0.6, 0.0])


def test_overlap_slowdown_hand_computed():
    assert overlap.overlap_slowdown_s(0.4, 3.0, 0.2) == pytest.approx(0.08)
    assert overlap.overlap_slowdown_s(5.0, 3.0, 0.2) == pytest.approx(0.6)  # capped by compute
    assert overlap.gpu_generation(load_gpu("h100-sxm5-80gb")) == "hopper"
    assert overlap.gpu_generation(load_gpu("gb200")) == "blackwell"
    own = load_gpu("a100-sxm4-80gb").model_copy(update={"comm_overlap_slowdown": 0.3})
    assert overlap.overlap_slowdown_for(own) == 0.3


def test_gpu_generation_from_compute_capability_else_name():
    h100 = load_gpu("h100-sxm5-80gb")
    renamed = h100.model_copy(update={"name": "my-accelerator"})
    assert overlap.gpu_generation(renamed) == "hopper"  # 9.0
    assert overlap.gpu_generation(renamed.model_copy(update={"compute_capability": "10.3"})) == (
        "blackwell")
    assert overlap.gpu_generation(renamed.model_copy(update={"compute_capability": None})) == (
        "other")  # neither stated nor a known name
    assert overlap.gpu_generation(h100.model_copy(update={"compute_capability": None})) == "hopper"


def test_quantise_bytes_hand_computed():
    cs = compute.LOW_PRECISION_RECIPES["fp8-cs"]
    assert compute.quantise_bytes(1e6, cs) == pytest.approx(6e6)  # 2 reads of 2 B + 2 x 1 B
    delayed = compute.LOW_PRECISION_RECIPES["fp8-delayed"]
    assert compute.quantise_bytes(1e6, delayed) == pytest.approx(4e6)


@pytest.mark.parametrize("name,dtype,recipe", [
    ("fp8", "fp8", "fp8-delayed"), ("fp8-cs", "fp8", "fp8-cs"), ("mxfp8", "fp8", "mxfp8"),
    ("fp8-block", "fp8", "fp8-block"), ("fp4", "fp4", "nvfp4"), ("nvfp4", "fp4", "nvfp4"),
    ("bf16", "bf16", None),
])
def test_precision_names(name, dtype, recipe):
    t = TrainingSpec(precision=name)
    assert (t.precision, t.low_precision_recipe) == (dtype, recipe)
    assert t.precision_name == (recipe or dtype)


def test_fp8_param_gather_halves_zero_gather_bytes():
    from perfmodel.comm.comm_volume import dp_ops

    m = load_model("llama3.1-8b")
    b = ConfigBatch.from_arrays(dp=8, tp=1, pp=1, zero_stage=3, micro_batch_size=1,
                                num_microbatches=4)
    bf = dp_ops(m, TrainingSpec(precision="bf16"), b)["zero3_param_all_gather"].buffer_bytes
    f8 = dp_ops(m, TrainingSpec(precision="fp8-cs", fp8_params=True),
                b)["zero3_param_all_gather"].buffer_bytes
    off = dp_ops(m, TrainingSpec(precision="fp8-cs"), b)["zero3_param_all_gather"].buffer_bytes
    assert f8 == pytest.approx(bf / 2)
    assert off == pytest.approx(bf)


def test_causal_hfu_below_mfu_at_long_context():
    m = load_model("llama3.1-8b")
    c = load_cluster("dgx-h100", gpus=8)
    t = TrainingSpec(global_batch_size=8, seq_len=131072)
    b = ConfigBatch.from_arrays(dp=1, tp=8, pp=1, cp=1, zero_stage=1, micro_batch_size=1,
                                num_microbatches=8, sequence_parallel=True)
    r = step_mod.evaluate(m, t, c, b)
    assert r.hfu[0] < 0.8 * r.mfu[0]  # flash attention runs half of the s x s square
    assert 0.2 < r.mfu[0] < 0.9


def _double_dp(monkeypatch, factor):
    real = comm_time.comm_times

    def scaled(*a, **k):
        out = dict(real(*a, **k))
        out["dp_grad_s"] = out["dp_grad_s"] * factor
        out["zero3_gather_s"] = out["zero3_gather_s"] * factor
        return out

    monkeypatch.setattr(step_mod.comm_time_mod, "comm_times", scaled)


@settings(max_examples=25, deadline=None)
@given(dp_log=st.integers(1, 5), zero=st.sampled_from([0, 1, 2, 3]), mbs=st.sampled_from([1, 2]),
       m=st.sampled_from([1, 2, 4]), model_name=st.sampled_from(["llama3.1-8b", "llama3.1-70b"]))
def test_doubling_dp_traffic_on_a_saturated_link_raises_step_time(dp_log, zero, mbs, m,
                                                                   model_name):
    """Property: when the DP link is busy for the whole step, doubling the DP
    traffic never leaves the step time unchanged."""
    import pytest as _pt

    model = load_model(model_name)
    cluster = load_cluster("ethernet-a100", gpus=8 * 2**dp_log)
    dp = 2**dp_log
    t = TrainingSpec(global_batch_size=dp * mbs * m, seq_len=2048)
    b = ConfigBatch.from_arrays(dp=dp, tp=8, pp=1, zero_stage=zero, micro_batch_size=mbs,
                                num_microbatches=m, sequence_parallel=True)
    base = step_mod.evaluate(model, t, cluster, b)
    busy = max(v[0] for k, v in base.extra.items() if k.startswith("link_busy_"))
    assume(busy >= 0.8 * base.step_time_s[0])  # the DP port is busy (almost) all the step
    with _pt.MonkeyPatch.context() as mp:
        _double_dp(mp, 2.0)
        doubled = step_mod.evaluate(model, t, cluster, b)
    assert doubled.step_time_s[0] > base.step_time_s[0] * 1.05
    dbusy = max(v[0] for k, v in doubled.extra.items() if k.startswith("link_busy_"))
    assert doubled.step_time_s[0] >= dbusy  # never shorter than the busiest port


def test_saturated_case_exists_and_link_shared_term_shows_it():
    model = load_model("llama3.1-70b")
    cluster = load_cluster("ethernet-a100", gpus=256)
    t = TrainingSpec(global_batch_size=256, seq_len=4096)
    b = ConfigBatch.from_arrays(dp=32, tp=8, pp=1, zero_stage=3, micro_batch_size=1,
                                num_microbatches=8, sequence_parallel=True)
    r = step_mod.evaluate(model, t, cluster, b)
    busy = max(v[0] for k, v in r.extra.items() if k.startswith("link_busy_"))
    # the step can never be shorter than the busiest port's traffic
    assert r.step_time_s[0] >= busy
    total = sum(r.time_s[k][0] for k in step_mod.TIME_TERMS)
    assert total == pytest.approx(r.step_time_s[0], rel=1e-9)
