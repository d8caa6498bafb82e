"""Sliding-window layers and the exponential floor of the attention forward: hand-computed
values, the cuDNN timings they are checked against, the GPT-OSS layout from Megatron-Core's
rule and from config.json, and where the floor binds (head dim 64 on Blackwell, not Hopper)."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.compute import attention_kernels as ak
from perfmodel.compute.layer import compute_times
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_cluster, load_model, load_training, model_from_hf_config


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


# ---- which kernel Transformer Engine selects, and flash-attn 2's price -------------------


def test_flash_attn2_peak_fraction_by_hand():
    # FlashAttention-3 Figs. 4 / 6, H100 BF16 at 8k: FA2 333 (fwd, d 128), 318 TFLOP/s (bwd)
    assert ak.flash_attn2_peak_fraction(128, "fwd") == pytest.approx(333 / 989)
    assert ak.flash_attn2_peak_fraction(128, "bwd") == pytest.approx(318 / 989)
    # d 192 (Nemotron-4 340B): log2 192 = 7.585, 58.5 % of the way from d 128 to d 256
    x = np.log2(192) - 7
    assert ak.flash_attn2_peak_fraction(192, "fwd") == pytest.approx(
        333 / 989 + x * (297 / 989 - 333 / 989))
    assert ak.flash_attn2_peak_fraction(192, "fwd") == pytest.approx(0.3154, abs=1e-4)
    # no backward measurement above d 128 (held), none below d 64 (held)
    assert ak.flash_attn2_peak_fraction(192, "bwd") == pytest.approx(318 / 989)
    assert ak.flash_attn2_peak_fraction(32, "bwd") == pytest.approx(287 / 989)
    with pytest.raises(ValueError, match="pass"):
        ak.flash_attn2_peak_fraction(128, "fwd+bwd")


class _FlatCal:
    """A calibration whose causal attention runs at one rate [FLOP/s] at every shape."""

    def __init__(self, rate):
        self.rate = rate

    def attention_time_s(self, bh, s, d, pass_, causal=True):
        return (1.0 if pass_ == "fwd" else 2.5) * 4 * bh * s**2 * d / 2 / self.rate


def test_flash_attn2_slowdown_by_hand():
    h100 = load_cluster("dgx-h100").gpu
    a100 = load_cluster("dgx-a100-80g").gpu
    cal = _FlatCal(600e12)
    # H100 (989.4 TFLOP/s): FA2 forward at d 128 runs 333/989 of it = 333.1 TFLOP/s
    fa2 = 333 / 989 * h100.peak_flops("bf16")
    assert ak.flash_attn2_slowdown(cal, h100, "flash-attn-2", 128, "fwd") == pytest.approx(
        600e12 / fa2)
    assert ak.flash_attn2_slowdown(cal, h100, "flash-attn-2", 128, "fwd") == pytest.approx(
        1.801, abs=1e-3)
    # cuDNN itself, and flash-attn 2 on Ampere (its native kernel): the calibrated time
    assert ak.flash_attn2_slowdown(cal, h100, "cudnn", 128, "fwd") == 1.0
    assert ak.flash_attn2_slowdown(cal, a100, "flash-attn-2", 128, "fwd") == 1.0
    # never faster than the calibrated kernel
    assert ak.flash_attn2_slowdown(_FlatCal(200e12), h100, "flash-attn-2", 128, "bwd") == 1.0


def test_flash_attn2_slowdown_of_the_shipped_h100_calibration():
    # at the benchmark shape (s 8192, bh 32, d 128) the shipped calibration (cuDNN) runs the
    # forward at ~580 and the backward at ~438 TFLOP/s: flash-attn 2 takes 1.74x / 1.38x
    from perfmodel.compute.layer import sustained_calibration

    h100 = load_cluster("dgx-h100").gpu
    cal = sustained_calibration(h100)
    fwd = ak.flash_attn2_slowdown(cal, h100, "flash-attn-2", 128, "fwd")
    bwd = ak.flash_attn2_slowdown(cal, h100, "flash-attn-2", 128, "bwd")
    assert 1.6 < fwd < 1.9 and 1.25 < bwd < 1.5
    # the cuDNN the calibration measured is faster than flash-attn 2 at every shape it holds
    # (FlashAttention-3 Fig. 4: FA2 never passes 335 TFLOP/s causal at d 128 on H100; the
    # H200 table: 606 at s 4096, 64 heads)
    flops = 4 * 4 * 64 * 4096**2 * 128 / 2
    assert flops / cal.attention_time_s(4 * 64, 4096, 128, "fwd") > 1.5 * 335e12


def test_te_attention_backend_matrix():
    h100, b200 = load_cluster("dgx-h100").gpu, load_cluster("dgx-b200").gpu
    a100, v100 = load_cluster("dgx-a100-80g").gpu, load_cluster("dgx-v100").gpu
    sel = ak.te_attention_backend
    # both eligible: cuDNN on Hopper and Blackwell, flash-attn 2 before
    assert sel(h100) == sel(b200) == "cudnn"
    assert sel(a100) == "flash-attn-2"
    assert sel(v100) == "unfused"
    # NVTE_FUSED_ATTN=0 (dgxc Grok-1, Nemotron-4 340B): flash-attn 2
    assert sel(h100, nvte_fused_attn=False) == "flash-attn-2"
    assert sel(h100, nvte_flash_attn=False) == "cudnn"  # dgxc Llama 3.1
    # learnable sinks (GPT-OSS): no FlashAttention; cuDNN from 9.13.1 (NeMo 25.11) only
    assert sel(b200, softmax_type="learnable", cudnn_version=(9, 13, 1)) == "cudnn"
    assert sel(b200, softmax_type="learnable", cudnn_version=(9, 11, 0)) == "unfused"
    assert sel(h100, softmax_type="learnable", nvte_fused_attn=False) == "unfused"
    # MLA (q/k head dim != v): no flash-attn 2
    assert sel(h100, mla=True, nvte_fused_attn=False) == "unfused"
    assert sel(a100, mla=True) == "cudnn"


def test_flash_attn2_backend_slows_the_attention_only():
    # Grok-1's layer on H100 (tp 4: 12 heads, head dim 128, s 8192, cp 2): the flash-attn 2
    # run takes longer by the attention's share only; nothing changes on A100 or with cuDNN
    grok = load_model("llama3.1-70b").model_copy(update={"num_attention_heads": 48,
                                                         "hidden_size": 6144, "num_kv_heads": 8})
    b = ConfigBatch.from_arrays(dp=1, tp=4, cp=2, micro_batch_size=1, num_microbatches=8,
                                sequence_parallel=True)
    cudnn = load_training(global_batch_size=8, seq_len=8192)
    fa2 = cudnn.model_copy(update={"attention_backend": "flash-attn-2"})
    h100 = load_cluster("dgx-h100").gpu
    t_c = compute_times(grok, cudnn, h100, b)
    t_f = compute_times(grok, fa2, h100, b)
    assert t_f["layer_fwd_s"][0] > t_c["layer_fwd_s"][0]
    assert t_f["layer_bwd_s"][0] > t_c["layer_bwd_s"][0]
    # the forward grows by (slowdown - 1) x the calibrated attention forward / cp
    from perfmodel.compute.layer import sustained_calibration

    cal = sustained_calibration(h100)
    att = cal.attention_time_s(12, 8192, 128, "fwd") / 2
    k = ak.flash_attn2_slowdown(cal, h100, "flash-attn-2", 128, "fwd")
    assert t_f["layer_fwd_s"][0] - t_c["layer_fwd_s"][0] == pytest.approx(
        (k - 1) * att, rel=0.02)
    a100 = load_cluster("dgx-a100-80g").gpu
    assert compute_times(grok, fa2, a100, b)["layer_fwd_s"][0] == pytest.approx(
        compute_times(grok, cudnn, a100, b)["layer_fwd_s"][0])
