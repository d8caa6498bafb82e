"""Memory side of selective recomputation by module (Megatron-Core ``recompute_modules``):
what each module's ``CheckpointWithoutOutput`` frees, by hand, and its effect on the peak."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.memory import memory_breakdown
from perfmodel.memory.breakdown import (
    fp8_gemm_input_bytes,
    layer_activation_bytes,
    selective_recompute_freed_bytes,
)
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.specs import load_cluster, load_model, load_training

OSS = load_model("gpt-oss-120b")  # 36 MoE layers, h 2880, top-4 of 128 experts of f 2880
DS = load_model("deepseek-v3")  # MLA, 128 heads of 128 (K/V per head), 58 of 61 layers MoE


def test_gpt_oss_layernorm_and_moe_act_by_hand():
    # bf16, s 4096, b 1, tp 1: the pre-MLP norm output 2 B x 4096 x 2880 = 23,592,960 B and the
    # routed experts' activation output 2 B x 4096 x 4 x 2880 = 94,371,840 B (every layer MoE)
    ln = selective_recompute_freed_bytes(OSS, ("layernorm",), 4096, 1)
    act = selective_recompute_freed_bytes(OSS, ("moe_act",), 4096, 1)
    both = selective_recompute_freed_bytes(OSS, ("layernorm", "moe_act"), 4096, 1)
    assert float(ln) == 23_592_960
    assert float(act) == 94_371_840
    assert float(both) == 117_964_800
    # tp 2 with sequence parallelism: both halve (norm output sequence-sharded, experts' f / tp)
    half = selective_recompute_freed_bytes(OSS, ("layernorm", "moe_act"), 4096, 1, tp=2,
                                           sequence_parallel=True)
    assert float(half) == 117_964_800 / 2


def test_fp8_keeps_the_experts_quantised_fc2_input():
    # under fp8 GroupedLinear saves its own 1-byte copy of the activation output: moe_act frees
    # nothing; the norm output is counted at the GEMM-input byte (1 B x 4096 x 2880)
    gi = fp8_gemm_input_bytes("fp8")
    act = selective_recompute_freed_bytes(OSS, ("moe_act",), 4096, 1, gemm_input_bytes=gi)
    ln = selective_recompute_freed_bytes(OSS, ("layernorm",), 4096, 1, gemm_input_bytes=gi)
    assert float(act) == 0.0
    assert float(ln) == 4096 * 2880


def test_deepseek_mla_up_proj_and_layernorm_by_hand():
    # mla_up_proj: Q, K and V after the up projections, 2 B x 4096 x (128 + 2 x 128) x 128
    up = selective_recompute_freed_bytes(DS, ("mla_up_proj",), 4096, 1)
    assert float(up) == 2 * 4096 * 384 * 128 == 402_653_184
    # layernorm: MLA's input norm in every layer, the pre-MLP norm in the 58 MoE of 61 layers
    ln = selective_recompute_freed_bytes(DS, ("layernorm",), 4096, 1)
    assert float(ln) == pytest.approx(2 * 4096 * 7168 * (1 + 58 / 61))


def test_dense_model_and_default_modules_free_nothing():
    llama = load_model("llama3.1-8b")  # norms fused into LayerNormLinear, no experts, no MLA
    for mods in (("layernorm",), ("moe_act",), ("mla_up_proj",), ("core_attn",)):
        assert float(selective_recompute_freed_bytes(llama, mods, 8192, 2)) == 0.0
    for mods in (("core_attn",), ("mlp",), ("shared_experts",)):
        assert float(selective_recompute_freed_bytes(DS, mods, 4096, 1)) == 0.0


@settings(max_examples=40, deadline=None)
@given(s=st.sampled_from([1024, 4096, 8192]), b=st.sampled_from([1, 2, 4]),
       t=st.sampled_from([1, 2, 4, 8]), fp8=st.booleans(),
       name=st.sampled_from(["gpt-oss-120b", "deepseek-v3", "qwen3-30b-a3b"]))
def test_freed_never_exceeds_what_the_layer_keeps(s, b, t, fp8, name):
    model = load_model(name)
    gi = fp8_gemm_input_bytes("fp8") if fp8 else None
    kept = layer_activation_bytes(
        s, b, model.hidden_size, model.num_attention_heads, tp=t, sequence_parallel=t > 1,
        recompute=1, flash=True, dropout=False, ffn_hidden_size=moe.effective_ffn_size(model),
        num_kv_heads=model.kv_heads, head_dim=model.head_size, gated_mlp=model.gated_mlp,
        gemm_input_bytes=gi)
    mods = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts")
    freed = selective_recompute_freed_bytes(model, mods, s, b, tp=t, sequence_parallel=t > 1,
                                            gemm_input_bytes=gi)
    assert 0.0 <= float(freed) < float(kept)
    # more modules never free less
    some = selective_recompute_freed_bytes(model, mods[:2], s, b, tp=t,
                                           sequence_parallel=t > 1, gemm_input_bytes=gi)
    assert float(some) <= float(freed)


def test_peak_drops_by_the_freed_bytes_of_the_layers_in_flight():
    # GPT-OSS-120B on 64 B200, bf16, t1 p1 ep8 b4: one stage of 36 layers, one micro-batch in
    # flight (pp 1): the activations drop by 36 x freed(s 4096, b 4), the recomputed modules
    # only change the selective configurations
    cluster = load_cluster("dgx-b200", gpus=64)
    base = load_training(global_batch_size=256, seq_len=4096, precision="bf16")
    mods = base.model_copy(update={"recompute_modules": ("layernorm", "moe_act")})
    out = {}
    for rc in ("none", "selective"):
        cfg = resolve_config(ParallelConfig(dp=64, ep=8, etp=1, micro_batch_size=4,
                                            recompute=rc), OSS, base, cluster)
        batch = ConfigBatch.from_configs([cfg])
        out[rc] = [memory_breakdown(OSS, tr, cluster, batch)["activations"][0]
                   for tr in (base, mods)]
    assert out["none"][0] == out["none"][1]  # no selective recompute: modules do nothing
    assert out["selective"][0] == pytest.approx(out["none"][0])  # core_attn with flash: same
    freed = 36 * float(selective_recompute_freed_bytes(OSS, ("layernorm", "moe_act"), 4096, 4))
    assert out["selective"][0] - out["selective"][1] == pytest.approx(freed, rel=1e-9)
    assert np.isfinite(freed) and freed > 0
