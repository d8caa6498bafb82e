"""Per-layer compute times: contract keys, hand-computed terms, invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.compute import flops as F
from perfmodel.compute import layer as C
from perfmodel.hardware.calibration import KERNEL_MIN_S, calibration_for
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_gpu, load_model, load_training

KEYS = {"layer_fwd_s", "layer_bwd_s", "layer_recompute_s", "embed_fwd_s", "embed_bwd_s",
        "logits_fwd_s", "logits_bwd_s", "optimizer_s", "attn_fwd_s", "attn_bwd_s"}

GPT175 = load_model("gpt3-175b")
A100 = load_gpu("a100-sxm4-80gb")
H200 = load_gpu("h200-sxm-141gb")
TR = load_training(seq_len=2048, precision="bf16", optimizer="adam", global_batch_size=1536)


def batch(**kw):
    base = {"tp": 8, "pp": 8, "dp": 24, "micro_batch_size": 1, "sequence_parallel": True}
    base.update(kw)
    return ConfigBatch.from_arrays(**base)


def test_keys_and_shapes():
    out = C.compute_times(GPT175, TR, A100, batch(recompute=np.array([0, 1, 2])))
    assert set(out) == KEYS
    assert all(v.shape == (3,) and np.all(v > 0) | (k == "layer_recompute_s")
               for k, v in out.items())
    assert out["layer_recompute_s"][0] == 0


def test_attention_core_is_part_of_the_layer_and_splits_over_cp():
    """The attention core alone (what hides the cp ring) is inside the layer's time, and cp 2
    halves it (each rank attends half the queries to the whole sequence)."""
    tr = load_training(seq_len=8192, precision="bf16", global_batch_size=64)
    out = C.compute_times(GPT175, tr, H200, batch(cp=np.array([1, 2])))
    assert np.all(out["attn_fwd_s"] < out["layer_fwd_s"])
    assert np.all(out["attn_bwd_s"] < out["layer_bwd_s"])
    assert out["attn_fwd_s"][1] == pytest.approx(out["attn_fwd_s"][0] / 2, rel=1e-9)
    assert out["attn_bwd_s"][0] > out["attn_fwd_s"][0]


def test_gemm_time_by_hand():
    cal = calibration_for(A100)
    eff = float(cal.gemm_efficiency(2048, 4608, 12288, "fwd"))
    t = C.gemm_time_s(cal, 2048, 4608, 12288, "fwd", 312e12)
    assert t == pytest.approx(2 * 2048 * 4608 * 12288 / (312e12 * eff))
    assert C.gemm_time_s(cal, 1, 1, 1, "fwd", 312e12) == KERNEL_MIN_S


def test_layer_gemm_shapes_gqa_and_tp():
    m = load_model("llama3.1-70b")  # 64 heads, 8 kv heads of 128, swiglu f=28672
    g = {name: (mm, n, k, c) for name, mm, n, k, c in C.layer_gemms(m, 4096.0, np.array([8.0]))}
    assert g["qkv"][1][0] == (64 / 8 + 2 * 1) * 128  # 8 q heads + 1 k + 1 v per GPU
    assert g["proj"][2][0] == 64 * 128 / 8
    assert g["fc1"][1][0] == 2 * 28672 / 8  # gate and up fused
    assert g["fc2"][2][0] == 28672 / 8
    g16 = {name: n for name, _, n, _, _ in C.layer_gemms(m, 4096.0, np.array([16.0]))}
    assert g16["qkv"][0] == (4 + 2 * 1) * 128  # kv heads replicated when tp > kv


def test_gpt3_175b_layer_on_a100_is_sensible():
    out = C.compute_times(GPT175, TR, A100, batch())
    per_token = F.layer_matmul_flops_per_token(GPT175) + F.layer_attention_flops_per_token(
        GPT175, 2048, causal=True)
    layer_flops = 3 * per_token * 2048 / 8
    eff = layer_flops / ((out["layer_fwd_s"] + out["layer_bwd_s"]) * 312e12)
    assert 0.5 <= eff[0] <= 0.75  # A100 MAMF 85.9% of peak: big GEMMs reach ~0.7-0.8
    assert 1.8 < out["layer_bwd_s"][0] / out["layer_fwd_s"][0] < 2.4


def test_optimizer_time_by_hand():
    out = C.compute_times(GPT175, TR, A100, batch(zero_stage=np.array([0, 1])))
    cal = calibration_for(A100)
    p = (96 / 8 * GPT175.layer_params() + GPT175.embedding_params()) / 8
    t0 = 34 * p / cal.membw_bytes_per_s("adamw")
    assert out["optimizer_s"][0] == pytest.approx(t0)
    assert out["optimizer_s"][1] == pytest.approx(t0 / 24)


def test_optimizer_bytes_by_recipe():
    # fp32 main-grad buffer (Megatron-Core default): the shipped 34 bytes
    assert C.optimizer_bytes_per_param(TR) == 34
    # 16-bit gradient buffer (NeMo / Bridge recipes): + the copy into fp32 main grads (2 + 4)
    bf16 = TR.model_copy(update={"grad_reduce_in_fp32": False})
    assert C.optimizer_bytes_per_param(bf16) == 34 + 6
    # Megatron-LM 2021-22 fp16: copy + unscale (read and write the fp32 main grads: 8)
    fp16 = load_training(seq_len=2048, precision="fp16", grad_reduce_in_fp32=False)
    assert C.optimizer_bytes_per_param(fp16) == 34 + 6 + 8
    # Megatron-LM 2020: + apex's per-tensor float(g.float().sum()) (read 2, write 4, read 4)
    fp16_2020 = fp16.model_copy(update={"fp16_overflow_check": "per-tensor"})
    assert C.optimizer_bytes_per_param(fp16_2020) == 58
    # eager kernels and fp32 training keep the table
    assert C.optimizer_bytes_per_param(fp16_2020, "eager") == 28
    fp32 = load_training(seq_len=2048, precision="fp32", grad_reduce_in_fp32=False)
    assert C.optimizer_bytes_per_param(fp32) == 34
    # the optimizer time follows: 58 / 34 of the fp32-buffer step on the same shard
    b = batch()
    t = C.compute_times(GPT175, fp16_2020, A100, b)["optimizer_s"][0]
    t0 = C.compute_times(GPT175, fp16.model_copy(update={"grad_reduce_in_fp32": True,
                                                         "precision": "bf16"}), A100, b)
    assert t == pytest.approx(t0["optimizer_s"][0] * 58 / 34)


def test_recompute_order_and_full_equals_forward_when_fused():
    out = C.compute_times(GPT175, TR, H200, batch(recompute=np.array([0, 1, 2])))
    r = out["layer_recompute_s"]
    assert r[0] == 0 < r[1] < r[2]
    # the recompute is one more forward (its host dispatch overlaps the backward: within 10%)
    assert r[2] == pytest.approx(out["layer_fwd_s"][2], rel=0.1)


def test_sequence_parallel_and_cp_reduce_time():
    out = C.compute_times(GPT175, TR, H200, batch(sequence_parallel=np.array([False, True])))
    assert out["layer_fwd_s"][1] < out["layer_fwd_s"][0]
    o2 = C.compute_times(GPT175, TR, H200, ConfigBatch.from_arrays(tp=8, cp=np.array([1, 2])))
    assert o2["layer_fwd_s"][1] < o2["layer_fwd_s"][0]


def test_precisions():
    b = batch()
    t = {p: C.compute_times(GPT175, load_training(seq_len=2048, precision=p), H200, b)
         for p in ("fp32", "bf16", "fp8")}
    assert t["fp8"]["layer_fwd_s"][0] < t["bf16"]["layer_fwd_s"][0] < t["fp32"]["layer_fwd_s"][0]
    e32 = C.compute_times(GPT175, load_training(seq_len=2048, precision="fp32"), H200, b,
                          kernels="eager")
    assert e32["layer_fwd_s"][0] > 5 * t["fp32"]["layer_fwd_s"][0]  # fp32 CUDA cores vs TF32


def test_eager_slower_than_fused():
    m = load_model("gpt3-760m")
    b = ConfigBatch.from_arrays(micro_batch_size=np.array([1, 8]))
    fused = C.compute_times(m, TR, H200, b)
    eager = C.compute_times(m, TR, H200, b, kernels="eager")
    for k in ("layer_fwd_s", "layer_bwd_s"):
        assert np.all(eager[k] > fused[k])
    with pytest.raises(ValueError):
        C.compute_times(m, TR, H200, b, kernels="compiled")


def test_swiglu_rope_moe_models_run():
    for name in ("llama3.1-8b", "nemotron4-15b"):
        out = C.compute_times(load_model(name), TR, H200, batch(tp=4, pp=2, dp=1))
        assert all(np.all(np.isfinite(v)) for v in out.values())
    moe = load_model("llama3.1-8b").model_copy(update={"num_experts": 8, "moe_top_k": 2})
    dense = C.compute_times(load_model("llama3.1-8b"), TR, H200, batch(tp=1, pp=1, dp=1))
    sparse = C.compute_times(moe, TR, H200, batch(tp=1, pp=1, dp=1))
    assert sparse["layer_fwd_s"][0] > dense["layer_fwd_s"][0]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
                          st.integers(0, 2), st.sampled_from([0, 1, 3])), min_size=1, max_size=5),
       st.sampled_from(["fused", "eager"]))
def test_batch_equals_one_by_one(rows, kernels):
    tp, mb, rc, z = (np.array(x) for x in zip(*rows))
    b = ConfigBatch.from_arrays(tp=tp, micro_batch_size=mb, recompute=rc, zero_stage=z, dp=2)
    m = load_model("gpt3-1.3b")
    whole = C.compute_times(m, TR, H200, b, kernels=kernels)
    for i in range(len(b)):
        one = C.compute_times(m, TR, H200, b.take([i]), kernels=kernels)
        for k in KEYS:
            assert one[k][0] == pytest.approx(whole[k][i], rel=1e-9)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8, 16]))
def test_more_tokens_never_faster(tp, mb):
    m = load_model("gpt3-1.3b")
    b = ConfigBatch.from_arrays(tp=tp, micro_batch_size=np.array([mb, 2 * mb]))
    out = C.compute_times(m, TR, H200, b)
    for k in ("layer_fwd_s", "layer_bwd_s", "logits_fwd_s", "logits_bwd_s"):
        assert out[k][1] >= out[k][0]


def test_unfused_gradient_accumulation_adds_one_pass_per_weight():
    """gradient_accumulation_fusion off under FSDP (Megatron-Bridge's Megatron-FSDP configs): the
    backward gains one memory-bound add over the layer's weights on this GPU, nothing else
    changes; a ZeRO-1 configuration keeps the fused accumulation.
    Llama 3.1 8B, tp 1: 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 = 218.1e6
    weights, 4 bytes each with bf16 main gradients (0.87 GB: read 2, write 2)."""
    m = load_model("llama3.1-8b")
    tr = load_training(seq_len=8192, precision="bf16", grad_reduce_in_fp32=False)
    b = batch(tp=1, pp=1, dp=8, zero_stage=3)
    off = tr.model_copy(update={"fsdp_gradient_accumulation_fusion": False})
    fused = C.compute_times(m, tr, H200, b)
    unfused = C.compute_times(m, off, H200, b)
    z1 = batch(tp=1, pp=1, dp=8, zero_stage=1)
    assert C.compute_times(m, off, H200, z1)["layer_bwd_s"][0] == pytest.approx(
        C.compute_times(m, tr, H200, z1)["layer_bwd_s"][0], rel=1e-12)
    w = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    assert w == 218_103_808
    cal = C.sustained_calibration(H200)
    extra = 4.0 * w / cal.membw_bytes_per_s("copy")
    assert unfused["layer_bwd_s"][0] - fused["layer_bwd_s"][0] == pytest.approx(extra, rel=1e-6)
    assert unfused["layer_fwd_s"][0] == fused["layer_fwd_s"][0]
