"""Selective recomputation by module (Megatron-Core ``recompute_modules``): hand-computed shares
and recompute times, the default equals the attention-core recompute of before, the rows' text is
parsed, and the launch flags carry the modules."""

from __future__ import annotations

import pytest

from perfmodel.compute.layer import compute_times, mlp_activation_share, unfused_activation_kernels
from perfmodel.core.errors import SpecError
from perfmodel.hardware.calibration import KERNEL_MIN_S, calibration_for
from perfmodel.parallel.config import ConfigBatch, ParallelConfig
from perfmodel.spec.specs import load_cluster, load_model, load_training

GPU = load_cluster("dgx-b200").gpu


def _b(**kw):
    kw.setdefault("num_microbatches", 4)
    return ConfigBatch.from_arrays(**kw)


def test_mlp_activation_shares_by_hand():
    # DeepSeek-V3: 3 of 61 layers dense (f 18432), 58 MoE with 8 x 2048 routed + 2048 shared:
    # effective f = 3/61*18432 + 58/61*18432 = 18432
    ds = load_model("deepseek-v3")
    assert mlp_activation_share(ds, "moe_act") == pytest.approx(58 / 61 * 16384 / 18432)
    assert mlp_activation_share(ds, "shared_experts") == pytest.approx(58 / 61 * 2048 / 18432)
    assert mlp_activation_share(ds, "mlp") == pytest.approx(3 / 61)
    # a dense model: the MLP is all of it, there are no experts
    llama = load_model("llama3.1-8b")
    assert mlp_activation_share(llama, "mlp") == 1.0
    assert mlp_activation_share(llama, "moe_act") == 0.0


def test_default_modules_are_the_attention_core():
    oss = load_model("gpt-oss-120b")
    b = _b(dp=8, ep=8, etp=1, micro_batch_size=4, recompute="selective")
    tr = load_training(global_batch_size=64, seq_len=4096)
    assert tr.recompute_modules == ("core_attn",)
    explicit = tr.model_copy(update={"recompute_modules": ("core_attn",)})
    assert compute_times(oss, tr, GPU, b)["layer_recompute_s"][0] == pytest.approx(
        compute_times(oss, explicit, GPU, b)["layer_recompute_s"][0])


def test_layernorm_and_moe_act_recompute_by_hand():
    # GPT-OSS on B200, b=4, s=4096, tp=1: T = 16384 tokens, h = 2880. "layernorm" repeats the two
    # RMSNorms (read + write 2 * 2 bytes per value); "moe_act" the routed experts' unfused clamped
    # GLU (8 kernels, 20 values per column, k*f = 4*2880 columns, all 36 layers MoE: share 1).
    # The phase is GPU-bound, so the recompute adds its GPU time (smooth maximum, within 1 %).
    oss = load_model("gpt-oss-120b")
    cal = calibration_for(GPU, None)
    tr = load_training(global_batch_size=64, seq_len=4096)
    b = _b(dp=8, ep=8, etp=1, micro_batch_size=4, recompute="selective")
    ln = tr.model_copy(update={"recompute_modules": ("layernorm",)})
    t_ln = max(2 * 2 * 16384 * 2880 / cal.membw_bytes_per_s("layernorm"), KERNEL_MIN_S)
    assert compute_times(oss, ln, GPU, b)["layer_recompute_s"][0] == pytest.approx(
        2 * t_ln, rel=0.01)
    act = tr.model_copy(update={"recompute_modules": ("moe_act",)})
    n_k, vals = unfused_activation_kernels(oss, "fwd")
    assert mlp_activation_share(oss, "moe_act") == pytest.approx(1.0)
    t_act = n_k * (vals / n_k * 4 * 2880 * 2 * 16384) / cal.membw_bytes_per_s("gelu")
    assert compute_times(oss, act, GPU, b)["layer_recompute_s"][0] == pytest.approx(
        t_act, rel=0.01)


def test_mla_up_proj_only_where_there_is_mla():
    tr = load_training(global_batch_size=64, seq_len=4096,
                       recompute_modules=("mla_up_proj",))
    b = _b(dp=8, micro_batch_size=1, recompute="selective")
    llama = load_model("llama3.1-8b")
    assert compute_times(llama, tr, GPU, b)["layer_recompute_s"][0] == pytest.approx(0.0, abs=1e-9)
    ds = load_model("deepseek-v3")
    be = _b(dp=8, ep=8, etp=1, micro_batch_size=1, recompute="selective")
    up = compute_times(ds, tr, GPU, be)["layer_recompute_s"][0]
    attn = compute_times(ds, tr.model_copy(update={"recompute_modules": ("core_attn",)}), GPU,
                         be)["layer_recompute_s"][0]
    assert 0 < up < attn  # two up-projection GEMMs cost less than the 128-head MLA attention


def test_bad_module_is_refused():
    with pytest.raises((SpecError, ValueError)):
        load_training(recompute_modules=("attention",))


def test_rows_name_their_modules():
    from validation.validate_moe import recompute_modules

    assert recompute_modules("selective: layernorm+moe_act") == ("layernorm", "moe_act")
    assert recompute_modules("selective: mlp (dense layers) + MLA up_proj") == (
        "mla_up_proj", "mlp")
    assert recompute_modules("selective: mla_up_proj") == ("mla_up_proj",)
    assert recompute_modules("selective") == ("core_attn",)
    assert recompute_modules("none") == ("core_attn",)


def test_emit_carries_the_modules():
    from emit.launch import megatron_args

    oss = load_model("gpt-oss-120b")
    tr = load_training(global_batch_size=64, seq_len=4096,
                       recompute_modules=("layernorm", "moe_act"))
    cfg = ParallelConfig(dp=8, ep=8, etp=1, micro_batch_size=1, recompute="selective")
    assert "--recompute-modules layernorm moe_act" in megatron_args(cfg, oss, tr)
