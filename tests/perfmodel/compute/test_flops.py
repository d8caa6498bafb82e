"""FLOP conventions: hand-computed values (GPT-3 175B) and invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.compute import flops as F
from perfmodel.spec.specs import ModelSpec, load_model, load_training

# GPT-3 175B in Megatron's papers: l=96, h=12288, s=2048, V=51200.
L, H, S, V = 96, 12288, 2048, 51200


def test_korthikanti_eq7_gpt3_175b_by_hand():
    # 72*2048*96*12288^2 = 2.137450604e15; 1 + 2048/73728 + 51200/(12*12288*96) = 1.0313947
    assert F.korthikanti_model_flops(1, S, L, H, V) == pytest.approx(2.137450604e15 * 1.0313947,
                                                                     rel=1e-6)


def test_megatron_96_formula_gpt3_175b_by_hand():
    # B=1536: 96*1536*2048*96*12288^2 = 4.37751e18; * (1 + 1/36 + 51200/(16*96*12288)) = 4.5110e18
    assert F.megatron_96_flops(1536, S, L, H, V) == pytest.approx(4.37751e18 * 1.0304905, rel=1e-5)


def test_korthikanti_eq8_selective():
    # 1 + 2048/36864 + 0.0036169 = 1.0591725
    assert F.korthikanti_selective_hardware_flops(1, S, L, H, V) == pytest.approx(
        2.137450604e15 * 1.0591725, rel=1e-6)


def gpt(vocab=V):
    return ModelSpec(name="g", num_layers=L, hidden_size=H, num_attention_heads=96,
                     ffn_hidden_size=4 * H, vocab_size=vocab, max_seq_len=S)


def test_general_count_equals_eq7_for_gpt():
    tr = load_training(global_batch_size=1536, seq_len=S)
    assert F.model_flops_per_step(gpt(), tr) == pytest.approx(
        F.korthikanti_model_flops(1536, S, L, H, V), rel=1e-12)


def test_full_recompute_hardware_flops_equal_96_formula():
    tr = load_training(global_batch_size=1536, seq_len=S)
    hw = F.hardware_flops_per_step(gpt(), tr, np.array([0, 1, 2]))
    assert hw[2] == pytest.approx(F.megatron_96_flops(1536, S, L, H, V), rel=1e-12)
    assert hw[0] == pytest.approx(F.model_flops_per_step(gpt(), tr), rel=1e-12)
    # selective adds one forward of attention scores: 4*s*h per token per layer
    assert hw[1] - hw[0] == pytest.approx(1536 * S * L * 4 * S * H, rel=1e-12)


def test_causal_halves_attention_term():
    tr = load_training(global_batch_size=1, seq_len=S)
    full = F.model_flops_per_step(gpt(), tr)
    causal = F.model_flops_per_step(gpt(), tr, causal=True)
    assert full - causal == pytest.approx(3 * S * L * 2 * S * H, rel=1e-12)


def test_gqa_swiglu_per_token_by_hand():
    m = load_model("llama3.1-70b")  # h 8192, 64 heads of 128, 8 kv heads, f 28672
    qkv = 2 * 8192 * (64 + 16) * 128
    proj = 2 * 8192 * 8192
    mlp = 3 * 2 * 8192 * 28672
    assert F.layer_matmul_flops_per_token(m) == qkv + proj + mlp
    # NeMo reports Llama3-70B at ~4.82e11 FLOPs per token (non-causal, seq 8192)
    tr = load_training(global_batch_size=1, seq_len=8192)
    per_token = F.model_flops_per_step(m, tr) / 8192
    assert per_token == pytest.approx(4.82e11, rel=0.01)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64), st.sampled_from([512, 1024, 2048, 4096]))
def test_flops_scale_with_batch_and_recompute_order(b, s):
    m = load_model("gpt3-1.3b")
    tr1 = load_training(global_batch_size=1, seq_len=s)
    trb = load_training(global_batch_size=b, seq_len=s)
    assert F.model_flops_per_step(m, trb) == pytest.approx(b * F.model_flops_per_step(m, tr1))
    hw = F.hardware_flops_per_step(m, trb, np.array([0, 1, 2]))
    assert hw[0] < hw[1] < hw[2]
