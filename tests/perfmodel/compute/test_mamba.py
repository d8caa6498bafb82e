"""Hybrid Mamba2 / attention / MLP / MoE layers (perfmodel.compute.mamba): hand-computed parameters,
FLOPs, traffic, a kernel time and activations of one Mamba2 layer; spec checks; the
config.json import; properties (an attention / MLP hybrid is the transformer it spells; turning
a Mamba2 layer into an MLP changes only that layer's terms)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.compute import mamba
from perfmodel.compute.flops import model_flops_per_step
from perfmodel.compute.layer import _Phase
from perfmodel.core.errors import SpecError
from perfmodel.memory import hybrid as mem_hybrid
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec import hybrid
from perfmodel.spec.specs import load_cluster, load_model, load_training, model_from_hf_config
from perfmodel.step.evaluate import evaluate

NANO = load_model("nemotron3-nano-30b-a3b")
NH8 = load_model("nemotron-h-8b")


def test_mamba_layer_params_hand_computed():
    # in_proj 2688*(2*4096 + 2*8*128 + 64) + conv (4096 + 2048)*(4 + 1) + 3*64 + norm 4096
    # + out_proj 4096*2688
    assert hybrid.mamba_params_per_layer(NANO) == 27_697_152 + 30_720 + 192 + 4_096 + 11_010_048
    assert hybrid.mamba_d_inner(NANO) == 4096 and hybrid.mamba_in_proj_size(NANO) == 10_304


def test_nano_total_and_active_params_within_1_percent():
    # model card: 31.6 B total, 3.6 B active with embeddings (3.2 B without the input table)
    assert NANO.param_count() == pytest.approx(31.6e9, rel=0.01)
    assert NANO.active_param_count() == pytest.approx(3.6e9, rel=0.01)
    assert NANO.active_param_count() - NANO.vocab_size * NANO.hidden_size == pytest.approx(
        3.2e9, rel=0.01)
    assert NANO.hybrid_layer_counts == {"M": 23, "*": 6, "-": 0, "E": 23}
    assert NANO.num_moe_layers == 23


def test_ssd_flops_and_bytes_hand_computed():
    # 2QNG + 2QPH + 2NPH + 2NPH/Q + 2NPH, Q 128, N 128, P 64, H 64, G 8
    assert mamba.ssd_flops_per_token(NANO) == 262_144 + 1_048_576 * 3 + 8_192
    # 2 bytes * (5*4096 + 6*8*128) + 4 * (4*64*64*128/128 + 2*8*128)
    assert mamba.ssd_bytes_per_token(NANO, 1, 2.0) == pytest.approx(53_248 + 73_728)
    fwd = 126_976.0
    # recompute + gradient kernels: 16 di + 12 GN 16-bit values, 11 state and 6 C B^T passes
    assert mamba.ssd_bytes_per_token(NANO, 1, 2.0, "bwd") == pytest.approx(
        2 * (16 * 4096 + 12 * 1024) + 4 * (11 * 4096 + 6 * 1024))
    assert mamba.ssd_bwd_flops_per_token(NANO) == 3 * 262_144 + 3 * 1_048_576 + 5 * 1_048_576
    # tp splits heads and groups: the traffic per GPU halves
    assert mamba.ssd_bytes_per_token(NANO, 2, 2.0) == pytest.approx(fwd / 2)


def test_mamba_mixer_kernel_time_hand_computed():
    """One forward pass of the Mamba2 kernels of a half-Mamba model ('M-'), 8192 tokens on one
    GPU at 1 TB/s and a 1 PFLOP/s 16-bit peak: conv1d 2*2*8192*6144 B, SSD max(126,976*8192 B
    / (0.5 * 1 TB/s), 3,416,064*8192 FLOP / 0.25 PFLOP/s), norm 2*2*8192*4096 B, each times
    1/2 (the SSD kernels at SSD_BANDWIDTH_EFFICIENCY of the copy bandwidth)."""

    class Cal:
        def membw_bytes_per_s(self, op):
            return 1e12

    m = NANO.model_copy(update={"hybrid_override_pattern": "M-", "num_layers": 2,
                                "num_experts": 1, "moe_top_k": 1, "num_shared_experts": 0,
                                "moe_shared_ffn_hidden_size": None})
    ph = _Phase(Cal(), 1)
    mamba.mamba_kernels(m, load_training(), Cal(), ph, np.array([8192.0]), np.array([1.0]),
                        2.0, 1e15, "fwd")
    conv = 2 * 2 * 8192 * 6144 / 1e12
    ssd = max(126_976 * 8192 / 0.5e12, 3_416_064 * 8192 / 0.25e15)
    norm = 2 * 2 * 8192 * 4096 / 1e12
    assert mamba.SSD_BANDWIDTH_EFFICIENCY == 0.5
    assert ph.gpu_s[0] == pytest.approx(0.5 * (conv + ssd + norm))
    assert ph.gpu_s[0] == pytest.approx(1_207_960e-9, rel=1e-5)
    # a micro-batch of 2 adds the layout copies of zxBCdt and y: 2 * 2 * 8192 * (10304 + 4096)
    ph2 = _Phase(Cal(), 1)
    mamba.mamba_kernels(m, load_training(), Cal(), ph2, np.array([8192.0]), np.array([1.0]),
                        2.0, 1e15, "fwd", mb=2)
    assert ph2.gpu_s[0] - ph.gpu_s[0] == pytest.approx(0.5 * 2 * 2 * 8192 * 14_400 / 1e12)


def test_ssd_bandwidth_efficiency_from_the_published_forward_benchmark():
    """SSD_BANDWIDTH_EFFICIENCY from its source: vLLM PR #27299's H100 microbenchmark of
    mamba_ssm's five forward SSD kernels at granite-4.0-h-small dims (128 heads x 64, 1 group,
    state 128, chunk 256, no z): 1.262e7 tokens/s at 8192 tokens, 1.292e7 at 16384. The traffic
    ssd_bytes_per_token counts for that shape, 2*(3*8192 + 6*128) + 4*(4*128*64*128/256 +
    2*1*256) = 118,272 bytes a token, at the H100's calibrated copy bandwidth gives 2.51e7
    tokens/s: the kernels reach 0.50 (0.52) of it."""
    from perfmodel.compute.layer import sustained_calibration
    from perfmodel.spec.specs import load_gpu

    granite = NANO.model_copy(update={"mamba_num_heads": 128, "mamba_num_groups": 1,
                                      "mamba_chunk_size": 256})
    nbytes = float(mamba.ssd_bytes_per_token(granite, 1, 2.0, z_in_scan=False))
    assert nbytes == 2 * (3 * 8192 + 6 * 128) + 4 * (4 * 128 * 64 * 128 / 256 + 2 * 256)
    assert nbytes == 118_272
    bw = sustained_calibration(load_gpu("H100-SXM5-80GB")).membw_bytes_per_s("copy")
    roofline_tokens_per_s = bw / nbytes
    assert roofline_tokens_per_s == pytest.approx(2.51e7, rel=0.01)
    measured = {8192: 1.262327e7, 16384: 1.292440e7}
    eff = {n: t / roofline_tokens_per_s for n, t in measured.items()}
    assert eff[8192] == pytest.approx(0.503, abs=0.005)
    assert eff[16384] == pytest.approx(0.515, abs=0.005)
    assert mamba.SSD_BANDWIDTH_EFFICIENCY == pytest.approx(eff[8192], abs=0.02)
    # with the gate inside the scan (Megatron's training path) the forward reads z and writes
    # the ungated out_x: two more 16-bit passes over d_inner
    assert float(mamba.ssd_bytes_per_token(granite, 1, 2.0)) == nbytes + 2 * 2 * 8192


def test_hybrid_quantise_casts_are_the_per_operand_terms_by_hand():
    """A hybrid layer's fp8 casts are the per-GEMM operand casts of perfmodel.compute.quantise (as for a
    transformer), weighted by the layers' shares. 'M-' (half Mamba2, half MLP) at tp 1 under
    MXFP8 on a B200, 8192 tokens: every operand reads 2 bytes and writes two 1 + 1/32 byte
    copies (4.0625 bytes an element), one kernel each. Forward inputs in_proj h 2688, out_proj
    d_inner 4096, fc1 h 2688, fc2 f 1856; backward output gradients in_proj 10304, out_proj
    2688, fc1 1856, fc2 2688; each in 1/2 of the layers."""
    from perfmodel.compute import layer as compute
    from perfmodel.compute import quantise
    from perfmodel.compute.layer import LOW_PRECISION_RECIPES, layer_gemms
    from perfmodel.spec.specs import load_gpu

    assert "mamba_in_proj" in quantise.NORM_FED_GEMMS  # TELayerNormColumnParallelLinear
    assert "mamba_out_proj" in quantise.ROW_PARALLEL_GEMMS  # TERowParallelLinear
    m = NANO.model_copy(update={"hybrid_override_pattern": "M-", "num_layers": 2,
                                "num_experts": 1, "moe_top_k": 1, "num_shared_experts": 0,
                                "moe_shared_ffn_hidden_size": None})
    T, tp = np.array([8192.0]), np.array([1.0])
    g = layer_gemms(m, T, tp)
    mx = LOW_PRECISION_RECIPES["mxfp8"]
    per = 2 + 2 * (1 + 1 / 32)
    b200 = load_gpu("B200")
    for pass_, cols in (("fwd", 2688 + 4096 + 2688 + 1856), ("bwd", 10_304 + 2688 + 1856 + 2688)):
        nb, nk = quantise.layer_quantise_terms(g, "mxfp8", mx, 2.0, b200, tp, False, pass_)
        assert float(nb[0]) == pytest.approx(0.5 * 8192 * per * cols)
        assert float(nk[0]) == pytest.approx(2.0)  # four operands, each in half the layers
    # and the layer forward prices exactly these as copy kernels
    tr = load_training(precision="fp8", low_precision_recipe="mxfp8", seq_len=8192)
    batch = ConfigBatch.from_arrays(dp=1, micro_batch_size=1, num_microbatches=1)
    cal = compute.sustained_calibration(b200)
    c = compute._layer_context(m, tr, b200, batch, cal, False)
    ph = _Phase(cal, 1)
    compute._quantise_casts(c, ph, "fwd")
    want = 2.0 * max(0.5 * 8192 * per * 11_328 / 2.0 / cal.membw_bytes_per_s("copy"),
                     compute.KERNEL_MIN_S)
    assert ph.gpu_s[0] == pytest.approx(want) and ph.launches[0] == pytest.approx(2.0)


def test_mamba_activation_bytes_hand_computed():
    b = mem_hybrid.mamba_activation_bytes(NANO, 8192, 1, dropout=False)
    # in_proj input 2h, zxBCdt 2*10304, out_x 2*4096, norm input 2*4096, out_proj input 2*4096
    assert b == pytest.approx(8192 * (2 * 2688 + 2 * (10_304 + 4_096) + 2 * 4096 + 2 * 4096))
    assert b == pytest.approx(414_187_520)


def test_megatron_mamba_flops_convention():
    # Megatron-LM hybrid_flops: d_in = 2h even where H*P differs
    h = 2688
    want = 2 * h * (2 * 2 * h + 2 * 8 * 128 + 64) + 7 * 2 * h * 128 + 2 * 2 * h * h
    assert mamba.megatron_mamba_flops_per_token(NANO) == want


@pytest.mark.parametrize("update, words", [
    ({"hybrid_override_pattern": "MX" + "E" * 50}, ["'X'", "position 1"]),
    ({"hybrid_override_pattern": "ME"}, ["2 letters", "num_layers (52)"]),
    ({"num_experts": 1, "moe_top_k": 1}, ["23 MoE layers", "num_experts"]),
    ({"mamba_num_groups": 7}, ["mamba_num_groups (7)", "mamba_num_heads (64)"]),
    ({"moe_layer_freq": 2}, ["moe_layer_freq (2)"]),
])
def test_hybrid_spec_errors_name_field_and_value(update, words):
    data = {**NANO.model_dump(exclude_none=True), **update}
    data.pop("published_training", None)
    from perfmodel.spec.specs import ModelSpec, build_spec

    with pytest.raises(SpecError) as e:
        build_spec(ModelSpec, data, "test")
    assert all(w in str(e.value) for w in words), str(e.value)


def test_nemotron_h_config_json_import_matches_preset():
    cfg = {"model_type": "nemotron_h", "num_hidden_layers": 52, "hidden_size": 2688,
           "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "intermediate_size": 1856, "vocab_size": 131072, "max_position_embeddings": 262144,
           "norm_eps": 1e-5, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
           "attention_bias": False, "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu",
           "rope_theta": 10000, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
           "hybrid_override_pattern": NANO.hybrid_override_pattern, "mamba_num_heads": 64,
           "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
           "expand": 2, "chunk_size": 128, "n_routed_experts": 128, "num_experts_per_tok": 6,
           "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712}
    m = model_from_hf_config(cfg, "nano")
    assert m.param_count() == NANO.param_count()
    assert m.active_param_count() == NANO.active_param_count()
    assert m.position_embedding == "none" and m.activation == "relu2"
    with pytest.raises(SpecError, match="ssm_state_size = '128'"):
        model_from_hf_config({**cfg, "ssm_state_size": "128"}, "nano")
    with pytest.raises(SpecError, match="moe_latent_size = 1024"):
        model_from_hf_config({**cfg, "moe_latent_size": 1024}, "super")


def test_cp_and_tp_limits_refused_with_a_message():
    from perfmodel.parallel.config import ParallelConfig, resolve_config

    tr = load_training(global_batch_size=64, seq_len=4096)
    cl = load_cluster("dgx-h100", gpus=16)
    with pytest.raises(SpecError, match="cp > 1 with Mamba2"):
        resolve_config(ParallelConfig(dp=8, cp=2, ep=8, etp=1), NANO, tr, cl)
    h3 = NH8.model_copy(update={"mamba_num_groups": 2})
    with pytest.raises(SpecError, match=r"mamba_num_groups \(2\)"):
        resolve_config(ParallelConfig(dp=4, tp=4, sequence_parallel=True), h3, tr, cl)
    assert (hybrid.unsupported_parallelism(NH8, np.array([1, 8, 16]), 1) != "").tolist() == [
        False, False, True]


def _as_hybrid(model, n):
    """The transformer ``model`` spelled as a hybrid: ``n`` '*-' pairs."""
    return model.model_copy(update={"hybrid_override_pattern": "*-" * n, "num_layers": 2 * n})


def test_attention_mlp_hybrid_is_the_transformer_it_spells():
    dense = load_model("llama3.1-8b")
    hyb = _as_hybrid(dense, dense.num_layers)
    assert hyb.param_count() == dense.param_count()
    tr = load_training(global_batch_size=64, seq_len=4096, precision="bf16")
    assert model_flops_per_step(hyb, tr) == pytest.approx(model_flops_per_step(dense, tr),
                                                          rel=1e-12)
    cl = load_cluster("dgx-h100", gpus=8)
    # (full recompute is left out: it checkpoints each of the 2n hybrid layers, and each
    # checkpoint costs host time, compute.CHECKPOINT_CPU_S)
    batch = ConfigBatch.from_arrays(dp=[8, 4, 2], tp=[1, 2, 4], pp=1, micro_batch_size=[1, 2, 1],
                                    num_microbatches=[8, 8, 32], recompute=[0, 1, 1],
                                    sequence_parallel=[False, True, True])
    a, b = evaluate(dense, tr, cl, batch), evaluate(hyb, tr, cl, batch)
    # equal up to per-layer nonlinear terms (exposed tp communication per layer): < 0.01 %
    np.testing.assert_allclose(b.step_time_s, a.step_time_s, rtol=1e-4)
    np.testing.assert_allclose(b.memory_bytes["peak"], a.memory_bytes["peak"], rtol=1e-7)
    np.testing.assert_allclose(b.comm_bytes_per_gpu["tp"], a.comm_bytes_per_gpu["tp"], rtol=1e-9)


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_replacing_a_mamba_layer_by_an_mlp_changes_only_that_layer(data):
    p = NH8.hybrid_override_pattern
    i = data.draw(st.sampled_from([k for k, c in enumerate(p) if c == "M"]))
    new = NH8.model_copy(update={"hybrid_override_pattern": p[:i] + "-" + p[i + 1:]})
    d_params = new.param_count() - NH8.param_count()
    assert d_params == NH8.mlp_params_per_layer() - hybrid.mamba_params_per_layer(NH8)
    tr = load_training(global_batch_size=8, seq_len=2048)
    tokens = tr.tokens_per_step
    mlp = 2.0 * 2 * NH8.hidden_size * NH8.ffn_hidden_size
    mix = mamba.mamba_matmul_flops_per_token(NH8) + mamba.ssd_flops_per_token(NH8)
    assert model_flops_per_step(new, tr) - model_flops_per_step(NH8, tr) == pytest.approx(
        3 * tokens * (mlp - mix), rel=1e-9)
    # attention untouched: same share of the layers, same attention FLOPs
    assert new.attention_layer_fraction == NH8.attention_layer_fraction


def test_megatron_hybrid_flops_reproduce_the_rows_tflops():
    """Megatron's hybrid_flops on the Nano preset reproduces the published TFLOP/s over
    tokens/s of the four Megatron-Bridge 26.02.01 rows (E0078-E0081) within 0.3 %: a check of
    the preset's dims and of the convention those rows' TFLOP/s use."""
    import pandas as pd

    from perfmodel.compute.framework_flops import megatron_flops_per_token
    from validation.validate import VALIDATION_DIR

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv")
    rows = df[df["model"] == "Nemotron-3-Nano-30B-A3B"]
    assert len(rows) == 4
    f = megatron_flops_per_token(NANO, 8192)
    for _, r in rows.iterrows():
        implied = float(r["tflops_per_gpu"]) * 1e12 / float(r["tokens_per_sec_per_gpu"])
        assert implied == pytest.approx(f, rel=0.003), r["row_id"]
    # the planner's own count (d_inner = H*P, SSD chunk matmuls, non-causal attention) is
    # 1.2 % lower: 22.01 against 22.28 GFLOP per token
    ours = model_flops_per_step(NANO, load_training(global_batch_size=1, seq_len=8192)) / 8192
    assert ours / f == pytest.approx(0.988, abs=0.002)


@pytest.mark.slow
def test_plan_on_a_hybrid_preset_and_its_launch_arguments():
    from emit.launch import megatron_args
    from search.api import plan

    res = plan("nemotron3-nano-30b-a3b", "dgx-b200", gpus=8, global_batch_size=64,
               seq_len=4096, precision="fp8", top=3, micro_batch_size=1, recompute="none",
               pp=1, ep=8, zero_stage=1)
    from perfmodel.parallel.config import ParallelConfig

    c = res.best_row["config"]
    assert c["cp"] == 1 and hybrid.unsupported_parallelism(NANO, c["tp"], c["cp"])[()] == ""
    best = ParallelConfig(**{k: c[k] for k in ParallelConfig.model_fields if k in c})
    args = megatron_args(best, NANO, load_training(global_batch_size=64, seq_len=4096,
                                                    precision="fp8"))
    assert "pretrain_mamba.py" in args
    assert f"--hybrid-override-pattern {NANO.hybrid_override_pattern}" in args
    assert "--mamba-num-heads 64" in args and "--position-embedding-type none" in args
    with pytest.raises(SpecError, match="cp > 1 with Mamba2"):
        plan("nemotron3-nano-30b-a3b", "dgx-b200", gpus=8, global_batch_size=64, seq_len=4096,
             cp=2)


def test_pipeline_layouts_of_a_hybrid_use_its_letters_and_average_layer():
    from perfmodel.parallel.layers import moe_layer_mask, stage_moe_layers, typed_layer_costs

    mask = moe_layer_mask(NANO)
    assert mask.sum() == 23 and mask[1] and not mask[0] and not mask[5]
    assert not typed_layer_costs(NANO) and typed_layer_costs(load_model("qwen3-30b-a3b"))
    b = ConfigBatch.from_arrays(dp=2, pp=4, ep=2, etp=1, micro_batch_size=1, num_microbatches=8,
                                stage_layers=[(13, 13, 13, 13)])
    assert stage_moe_layers(NANO, b, np.array([[13, 13, 13, 13]])).sum() == 23
