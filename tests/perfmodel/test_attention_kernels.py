"""Sliding-window layers and the exponential floor of the attention forward: hand-computed
values, the cuDNN timings they are checked against, the GPT-OSS layout from Megatron-Core's
rule and from config.json, and where the floor binds (head dim 64 on Blackwell, not Hopper)."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel import attention_kernels as ak
from perfmodel.compute import compute_times
from perfmodel.config import ConfigBatch
from perfmodel.specs import load_cluster, load_model, load_training, model_from_hf_config


def test_window_tile_fraction_by_hand_and_cudnn():
    # s 4096, tiles of 128: causal visits (32 + 1)/2 = 16.5 key tiles per query tile; a window
    # of 128 keys spans ceil(128/128) + 1 = 2 of them
    assert ak.window_tile_fraction(4096, 128) == pytest.approx(2 / 16.5)
    # cudnn-frontend PR 505, cuDNN backward, B1 S4096 H16 D64: causal 558.2 us, W511 171.0 us
    # (0.306), W1023 276.6 us (0.496)
    assert ak.window_tile_fraction(4096, 511) == pytest.approx(171.0 / 558.2, abs=0.01)
    assert ak.window_tile_fraction(4096, 1023) == pytest.approx(276.6 / 558.2, abs=0.06)
    # a window at least the sequence is full causal attention
    assert ak.window_tile_fraction(4096, 8192) == 1.0


def test_gpt_oss_windows_every_other_layer():
    # Megatron-Core is_layer_window_attention: layer numbers divisible by window_attn_skip_freq
    # keep full attention; GPT-OSS freq 2 over 36 layers: 18 windowed
    oss = load_model("gpt-oss-120b")
    assert (oss.attention_window, oss.window_attn_skip_freq) == (128, 2)
    assert oss.window_layer_fraction == pytest.approx(0.5)
    assert ak.window_layer_factor(oss, 4096) == pytest.approx(0.5 + 0.5 * 2 / 16.5)
    assert load_model("llama3.1-8b").window_layer_fraction == 0.0
    # config.json: sliding_window 128 with alternating layer_types
    hf = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
          "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
          "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4,
          "vocab_size": 201088, "hidden_act": "silu", "attention_bias": True,
          "sliding_window": 128, "max_position_embeddings": 131072,
          "tie_word_embeddings": False,
          "layer_types": ["sliding_attention", "full_attention"] * 18}
    m = model_from_hf_config(hf, name="oss")
    assert (m.attention_window, m.window_attn_skip_freq) == (128, 2)
    # Mixtral-style configs with sliding_window null import without a window
    assert model_from_hf_config({**hf, "sliding_window": None}, name="x").attention_window is None
    # Qwen2 / Qwen3 configs carry a sliding_window with use_sliding_window false
    off = model_from_hf_config({**hf, "use_sliding_window": False}, name="y")
    assert off.attention_window is None


def test_exp_per_mma_flop_and_floor_by_hand():
    h100 = load_cluster("dgx-h100").gpu
    b200 = load_cluster("dgx-b200").gpu
    gb300 = load_cluster("gb300-nvl72").gpu
    assert ak.exp_per_mma_flop(h100) == pytest.approx(16 / 4096)
    assert ak.exp_per_mma_flop(b200) == pytest.approx(16 / 8192)
    assert ak.exp_per_mma_flop(gb300) == pytest.approx(32 / 8192)  # Blackwell Ultra: 2x SFU
    # B200: 4 x 64 heads, s 4096 causal: 2.147e9 exps at 2250e12 / 512 * 0.549 per s
    n_exp = 4 * 64 * 4096**2 / 2
    t = ak.attention_exp_floor_s(b200, 4 * 64, 4096)
    assert t == pytest.approx(n_exp / (b200.peak_flops("bf16") / 512 * 0.549))
    assert 0.8e-3 < t < 1.0e-3


def test_floor_binds_at_head_dim_64_on_blackwell_only():
    # the forward attention time per layer with and without the floor: Blackwell, head dim 64
    # (GPT-OSS) is exp-bound; Hopper at head dim 64 and Blackwell at head dim 128 are not
    tr = load_training(global_batch_size=64, seq_len=4096)
    b = ConfigBatch.from_arrays(dp=8, ep=8, etp=1, micro_batch_size=4, num_microbatches=2)
    oss = load_model("gpt-oss-120b").model_copy(update={"attention_window": None})
    qwen = load_model("qwen3-30b-a3b")
    for name, model, binds in (("dgx-b200", oss, True), ("dgx-h100", oss, False),
                               ("dgx-b200", qwen, False)):
        gpu = load_cluster(name).gpu
        with_floor = compute_times(model, tr, gpu, b)["layer_fwd_s"][0]
        orig = ak.attention_exp_floor_s
        try:
            ak.attention_exp_floor_s = lambda *a, **k: np.zeros(1)
            without = compute_times(model, tr, gpu, b)["layer_fwd_s"][0]
        finally:
            ak.attention_exp_floor_s = orig
        assert (with_floor > without * 1.01) == binds, (name, model.name)
