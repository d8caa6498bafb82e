"""Unit and property tests for perfmodel.memory.breakdown (hand-computed numbers, invariants)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel import memory as mem
from perfmodel.core.units import GIB, MIB
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, load_cluster, load_training

GPT = ModelSpec(
    name="gpt-test",
    num_layers=24,
    hidden_size=2048,
    num_attention_heads=16,
    ffn_hidden_size=8192,
    vocab_size=50304,
    max_seq_len=2048,
)
LLAMA = ModelSpec(
    name="llama-test",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=128256,
    activation="swiglu",
    norm="rmsnorm",
    position_embedding="rope",
    tied_embeddings=False,
    linear_bias=False,
)
TRAIN = load_training(global_batch_size=512, seq_len=2048)
CLUSTER = load_cluster("dgx-h100", gpus=64)


# --------------------------------------------------------------------------- model states
@pytest.mark.parametrize(
    "precision, optimizer, expected",
    [
        ("fp32", "adam", (4, 4, 8)),
        ("bf16", "adam", (2, 2, 12)),
        ("fp16", "adamw", (2, 2, 12)),
        ("fp8", "adam", (2, 2, 12)),
        ("fp32", "sgd", (4, 4, 4)),
        ("bf16", "sgd", (2, 2, 8)),
    ],
)
def test_state_bytes_per_param(precision, optimizer, expected):
    assert mem.state_bytes_per_param(precision, optimizer) == expected


def test_fp32_main_grads_is_megatron_18_bytes():
    # Megatron-LM theoretical_memory_usage: 18 bytes/param, 6 + 12/d with distributed optimizer
    w, g, o = mem.state_bytes_per_param("bf16", "adam", fp32_main_grads=True)
    assert w + g + o == 18
    assert mem.model_state_bytes(1.0, 8, 1, "bf16", fp32_main_grads=True) == pytest.approx(
        6 + 12 / 8
    )


def test_model_state_bytes_hand_numbers():
    psi, nd = 1e9, 8
    # fp32 Adam: 16 B/param; ZeRO-1 4+4+8/8 = 9; ZeRO-2 4+12/8 = 5.5; ZeRO-3 16/8 = 2
    got = mem.model_state_bytes(psi, nd, np.array([0, 1, 2, 3]), "fp32")
    np.testing.assert_allclose(got, [16e9, 9e9, 5.5e9, 2e9])
    # bf16 mixed: 16 ; 4 + 12/8 = 5.5 ; 2 + 14/8 = 3.75 ; 2
    got = mem.model_state_bytes(psi, nd, np.array([0, 1, 2, 3]), "bf16")
    np.testing.assert_allclose(got, [16e9, 5.5e9, 3.75e9, 2e9])


def test_exercise_9_3_zero2_16_gpus_70b():
    # fp32 parameters with Adam: 4 Psi + (4 + 8) Psi / 16 = 280 + 52.5 GB
    assert mem.model_state_bytes(70e9, 16, 2, "fp32", "adam") == pytest.approx(332.5e9)
    # bf16 mixed precision (ZeRO paper K = 12): 2 Psi + 14 Psi / 16 = 140 + 61.25 GB
    assert mem.model_state_bytes(70e9, 16, 2, "bf16", "adam") == pytest.approx(201.25e9)
    # neither fits one GPU of 141 GB; ZeRO-3 would: 16 Psi / 16 = 70 GB
    assert mem.model_state_bytes(70e9, 16, 3, "bf16", "adam") == pytest.approx(70e9)
    # the seed's formula Model_size (16 + K) / (N_d S) with K = 12, S = 2 gives 61.25 GB,
    # 3.3x too little: it adds K to a 16 that already contains it and divides the replicated
    # weights by N_d and by the stage number
    seed = 70e9 * (16 + 12) / (16 * 2)
    assert seed == pytest.approx(61.25e9)
    assert mem.model_state_bytes(70e9, 16, 2, "bf16") / seed == pytest.approx(201.25 / 61.25)


def test_bad_precision_and_optimizer():
    with pytest.raises(ValueError, match="precision"):
        mem.state_bytes_per_param("int4")
    with pytest.raises(ValueError, match="optimizer"):
        mem.state_bytes_per_param("bf16", "lion")


# --------------------------------------------------------------------------- activations
def test_layer_activation_korthikanti_22b_hand_number():
    # 22B: s=2048, b=1, h=6144, a=64: sbh(34 + 5as/h) = 12,582,912 * (34 + 106.667)
    sbh = 2048 * 6144
    got = mem.layer_activation_bytes(2048, 1, 6144, 64)
    assert got == pytest.approx(sbh * (34 + 5 * 64 * 2048 / 6144))
    assert got == pytest.approx(1_769_996_288)


def test_flash_and_no_dropout_terms():
    s, b, h, a = 2048, 2, 1024, 16
    sbh = s * b * h
    # flash: no 5as^2b, plus the fp32 lse 4asb; no dropout: no 2 masks (2sbh)
    got = mem.layer_activation_bytes(s, b, h, a, flash=True, dropout=False)
    assert got == pytest.approx(32 * sbh + 4 * a * s * b)
    # no flash, no dropout: only the 2-byte softmax output (2as^2b)
    got = mem.layer_activation_bytes(s, b, h, a, flash=False, dropout=False)
    assert got == pytest.approx(32 * sbh + 2 * a * s * s * b)
    # selective recompute with flash removes nothing more
    sel = mem.layer_activation_bytes(s, b, h, a, flash=True, dropout=False, recompute=1)
    assert sel == pytest.approx(32 * sbh + 4 * a * s * b)


def test_gqa_swiglu_layer_activation():
    s, b, h, a, g, f = 4096, 1, 4096, 32, 8, 14336
    d = h // a
    got = mem.layer_activation_bytes(
        s, b, h, a, flash=True, dropout=False, ffn_hidden_size=f, num_kv_heads=g, gated_mlp=True
    )
    sb = s * b
    want = (
        4 * sb * h  # two norm inputs
        + 2 * sb * h  # QKV input
        + 2 * sb * h  # Q
        + 4 * sb * g * d  # K, V
        + 2 * sb * h  # attention output
        + 4 * a * sb  # lse
        + 2 * sb * h  # fc1 input
        + 6 * sb * f  # gate, up, product
    )
    assert got == pytest.approx(want)


def test_eager_gpt_layer_is_36_sbh():
    s, b, h, a = 2048, 1, 768, 12
    got = mem.eager_layer_activation_bytes(s, b, h, a)
    assert got == pytest.approx(36 * s * b * h + 16 * s * b + 4 * a * s * b)
    assert mem.eager_layer_activation_bytes(s, b, h, a, recompute=2) == 4 * s * b * h


# --------------------------------------------------------------------------- stages and breakdown
def test_stage_params_tied_untied():
    sp = mem.stage_params(GPT, np.array([1, 2]), np.array([1, 4]))
    h, v = 2048, 50304
    layer = GPT.layer_params()
    # tp=1, pp=1: the whole model
    assert sp["first"][0] == pytest.approx(GPT.param_count())
    # tp=2, pp=4 tied: last stage holds its own V h / 2 copy
    gemm = layer - 2 * GPT.norm_params()
    per_layer = gemm / 2 + 2 * GPT.norm_params()
    assert sp["last"][1] == pytest.approx(6 * per_layer + 2 * h + v * h / 2)
    assert sp["first"][1] == pytest.approx(6 * per_layer + v * h / 2 + 2048 * h)
    sl = mem.stage_params(LLAMA, 1, 1)
    assert sl["first"] == pytest.approx(LLAMA.param_count())


def _batch(**kw):
    base = {
        "dp": 8,
        "tp": 4,
        "pp": 2,
        "micro_batch_size": 1,
        "num_microbatches": 16,
        "zero_stage": 1,
    }
    base.update(kw)
    return ConfigBatch.from_arrays(**base)


def test_breakdown_keys_and_sum():
    out = mem.memory_breakdown(LLAMA, TRAIN, CLUSTER, _batch())
    for k in ("weights", "gradients", "optimizer", "activations", "other", "peak", "fits"):
        assert k in out and out[k].shape == (1,)
    total = sum(out[k] for k in ("weights", "gradients", "optimizer", "activations", "other"))
    np.testing.assert_allclose(total, out["peak"])
    assert out["fits"].dtype == bool


def test_breakdown_hand_number_single_gpu_fused():
    # 1 GPU, bf16, Adam: 2 + 4 (fp32 main grads) + 12 bytes per parameter
    m = ModelSpec(
        name="t",
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        ffn_hidden_size=1024,
        vocab_size=1000,
        max_seq_len=128,
        position_embedding="rope",
    )
    tr = load_training(global_batch_size=2, seq_len=128)
    b = ConfigBatch.from_arrays(micro_batch_size=2, num_microbatches=1)
    out = mem.memory_breakdown(m, tr, load_cluster("dgx-h100", gpus=1), b)
    p = m.param_count()
    assert out["weights"][0] == 2 * p and out["gradients"][0] == 4 * p
    assert out["optimizer"][0] == 12 * p
    s, bb, h, a, v = 128, 2, 256, 4, 1000
    layer = mem.layer_activation_bytes(s, bb, h, a, flash=True, dropout=False)
    acts = 2 * layer + 8 * s * bb + 4 * s * bb * h + 4 * s * bb * v + 2 * s * bb * v
    assert out["activations"][0] == pytest.approx(acts)
    assert out["peak_allocated"][0] == pytest.approx(18 * p + acts + mem.LIBRARY_WORKSPACE_BYTES)


def test_pipeline_inflight_gpipe_1f1b_interleaved():
    kw = {
        "dp": 1,
        "tp": 8,
        "pp": 8,
        "num_microbatches": 64,
        "sequence_parallel": True,
        "recompute": 1,
    }
    b = ConfigBatch.from_arrays(
        schedule=["gpipe", "1f1b", "interleaved", "zb"], vp=[1, 1, 3, 1], **kw
    )
    m175 = ModelSpec(
        name="g",
        num_layers=96,
        hidden_size=12288,
        num_attention_heads=96,
        ffn_hidden_size=49152,
        vocab_size=51200,
    )
    out = mem.memory_breakdown(m175, TRAIN, CLUSTER, b)
    layer = 34 * 2048 * 12288 / 8  # sp + selective, per layer (Korthikanti Table 2)
    act = out["activations"]
    # 1F1B stage 0: p micro-batches x L/p layers = L layers (plus small embedding terms)
    assert act[1] == pytest.approx(96 * layer, rel=0.01)
    assert act[3] == pytest.approx(act[1])  # ZB-H1 = 1F1B
    assert act[2] == pytest.approx(96 * layer * (1 + 7 / 24), rel=0.01)  # 1 + (p-1)/(p v)
    # GPipe holds all m = 64 micro-batches; its last stage (also m fp32 logits) is the peak
    assert act[0] >= 64 / 8 * 96 * layer
    assert out["peak_stage"][0] == 1 and out["peak_stage"][1] == 0


def test_zero3_gathers_and_buckets_in_other():
    b = _batch(zero_stage=np.array([1, 2, 3]))
    out = mem.memory_breakdown(LLAMA, TRAIN, CLUSTER, b)
    assert out["other"][1] > out["other"][0]  # ZeRO-2 buckets
    assert out["weights"][2] < out["weights"][1]


def test_fp8_cache_counted():
    b = _batch()
    bf = mem.memory_breakdown(LLAMA, TRAIN, CLUSTER, b)
    f8 = mem.memory_breakdown(LLAMA, load_training(TRAIN, precision="fp8"), CLUSTER, b)
    sp = mem.stage_params(LLAMA, 4, 2)
    extra = 2 * sp["layers_per_stage"] * sp["gemm_layer"]
    held = lambda r: r["other"] - r["allocator_allowance"]  # buffers, no allowance
    np.testing.assert_allclose(held(f8) - held(bf), extra)


def test_max_micro_batch_size_is_largest_fitting():
    b = _batch(dp=np.array([8, 8]), recompute=np.array([0, 2]))
    mbs = mem.max_micro_batch_size(LLAMA, TRAIN, CLUSTER, b, limit=64)
    assert mbs[1] >= mbs[0] >= 1
    for i in range(2):
        for size, ok in ((mbs[i], True), (mbs[i] + 1, False)):
            if size > 64:
                continue
            nmb = max(1, -(-TRAIN.global_batch_size // (8 * size)))
            bi = _batch(recompute=int(b.recompute[i]), micro_batch_size=size, num_microbatches=nmb)
            assert bool(mem.memory_breakdown(LLAMA, TRAIN, CLUSTER, bi)["fits"][0]) is ok


def test_usable_hbm_h200():
    gpu = load_cluster("dgx-h200", gpus=1).gpu
    assert mem.usable_hbm_bytes(gpu) == pytest.approx(139.8 * GIB)
    assert mem.LIBRARY_WORKSPACE_BYTES == 64 * MIB


def test_batch_equals_one_by_one():
    b = ConfigBatch.from_arrays(
        dp=[8, 4, 2],
        tp=[2, 4, 8],
        pp=[4, 4, 4],
        zero_stage=[0, 2, 3],
        micro_batch_size=[1, 2, 4],
        num_microbatches=[32, 32, 16],
        recompute=[0, 1, 2],
        sequence_parallel=[True, False, True],
    )
    for kernels in ("fused", "eager"):
        whole = mem.memory_breakdown(LLAMA, TRAIN, CLUSTER, b, kernels=kernels)
        for i in range(3):
            one = mem.memory_breakdown(LLAMA, TRAIN, CLUSTER, b.take([i]), kernels=kernels)
            for k in ("peak", "weights", "activations", "other"):
                assert one[k][0] == pytest.approx(whole[k][i])


# --------------------------------------------------------------------------- properties
configs = st.fixed_dictionaries(
    {
        "dp": st.sampled_from([1, 2, 8, 64]),
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.sampled_from([1, 2, 4]),
        "mbs": st.integers(1, 8),
        "m": st.integers(1, 64),
        "sp": st.booleans(),
        "kernels": st.sampled_from(["fused", "eager"]),
        "model": st.sampled_from([GPT, LLAMA]),
        "precision": st.sampled_from(["fp32", "bf16", "fp8"]),
        "schedule": st.sampled_from(["1f1b", "gpipe", "zb"]),
    }
)


def _arrays(c, **over):
    sp = c["sp"] and c["tp"] > 1
    kw = {
        "dp": c["dp"],
        "tp": c["tp"],
        "pp": c["pp"],
        "micro_batch_size": c["mbs"],
        "num_microbatches": c["m"],
        "sequence_parallel": sp,
        "schedule": c["schedule"] if c["pp"] > 1 or c["schedule"] == "gpipe" else "1f1b",
    }
    kw.update(over)
    return ConfigBatch.from_arrays(**kw)


@settings(max_examples=40, deadline=None)
@given(configs)
def test_higher_zero_stage_never_needs_more(c):
    tr = load_training(TRAIN, precision=c["precision"])
    b = _arrays(c, zero_stage=np.array([0, 1, 2, 3]))
    out = mem.memory_breakdown(c["model"], tr, CLUSTER, b, kernels=c["kernels"])
    if c["pp"] > 1:
        # the breakdown is the peak stage's, and a higher ZeRO stage can move the peak from the
        # first to the last stage (whose final norm has a few KiB more optimizer state): the
        # model states' order holds on one stage
        return
    states = out["weights"] + out["optimizer"]
    if c["kernels"] == "eager":  # FSDP2 ZeRO-2 holds sharded and unsharded weights
        states = out["optimizer"]
        assert out["weights"][3] <= out["weights"][0] * (1 + 1e-6)
    assert np.all(np.diff(states) <= 1e-6 * states[0])
    # gradients: eager ZeRO-1 keeps them in the main-grad buffer (``other``), so compare the
    # sharded stages with ZeRO-0 only
    g = out["gradients"]
    assert np.all(g[2:] <= g[0] * (1 + 1e-6) + 1e-6)
    ms = mem.model_state_bytes(1e9, c["dp"], np.arange(4), c["precision"])
    assert np.all(np.diff(ms) <= 0)


@settings(max_examples=40, deadline=None)
@given(configs)
def test_more_tp_never_more_weight_bytes(c):
    b = _arrays(c, tp=np.array([1, 2, 4, 8]), sequence_parallel=False)
    sp = mem.stage_params(c["model"], b.tp, b.pp)
    assert np.all(np.diff(sp["first"]) <= 0) and np.all(np.diff(sp["last"]) <= 0)
    out = mem.memory_breakdown(c["model"], TRAIN, CLUSTER, b, kernels=c["kernels"])
    assert np.all(np.diff(out["weights"]) <= 1e-9 * out["weights"][0])


@settings(max_examples=40, deadline=None)
@given(configs, st.booleans(), st.booleans())
def test_recompute_order_per_layer(c, flash, dropout):
    kw = {
        "tp": c["tp"],
        "sequence_parallel": c["sp"] and c["tp"] > 1,
        "flash": flash,
        "dropout": dropout,
        "ffn_hidden_size": c["model"].ffn_hidden_size,
        "num_kv_heads": c["model"].kv_heads,
        "gated_mlp": c["model"].gated_mlp,
    }
    none, sel, full = (
        mem.layer_activation_bytes(
            2048,
            c["mbs"],
            c["model"].hidden_size,
            c["model"].num_attention_heads,
            recompute=r,
            **kw,
        )
        for r in (0, 1, 2)
    )
    assert full <= sel <= none


@settings(max_examples=30, deadline=None)
@given(configs)
def test_recompute_order_whole_gpu(c):
    b = _arrays(c, recompute=np.array([0, 1, 2]))
    out = mem.memory_breakdown(c["model"], TRAIN, CLUSTER, b, kernels="fused")
    a = out["activations"]
    assert a[2] <= a[1] * (1 + 1e-12) and a[1] <= a[0] * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------
# eager PyTorch pipelines (checked against the harness, docs/harness.md)
# ---------------------------------------------------------------------------------------------
TINY = ModelSpec(
    name="tiny", num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
    vocab_size=256, max_seq_len=32,
)  # fmt: skip
TINY_TRAIN = load_training(global_batch_size=8, seq_len=32, precision="fp32", optimizer="adamw")


def _tiny(**kw):
    base = {"dp": 2, "tp": 1, "pp": 4, "micro_batch_size": 4, "num_microbatches": 1,
            "zero_stage": 1, "schedule": "1f1b"}  # fmt: skip
    base.update(kw)
    return ConfigBatch.from_arrays(**base)


def test_eager_zero_bubble_keeps_gemm_output_gradients():
    # last stage (1 layer), s b = 128 tokens, fp32: dY of QKV (192 cols), fc1 (256), o and fc2
    # (64 each) = 4 * 128 * 576 = 294,912 B, plus two fused-QKV-sized gradients in the input
    # pass (2 * 4 * 128 * 192 = 196,608 B); the output gradients of the two norms of the layer
    # and of the final norm (3 * 4 * 128 * 64 = 98,304 B) and of the output layer, one per logit
    # (4 * 128 * 256 = 131,072 B): torch's param-group intermediates
    cl = load_cluster("dgx-h100", gpus=8)
    one = mem.memory_breakdown(TINY, TINY_TRAIN, cl, _tiny(), kernels="eager")
    zb = mem.memory_breakdown(TINY, TINY_TRAIN, cl, _tiny(schedule="zb"), kernels="eager")
    assert zb["peak_stage"][0] == one["peak_stage"][0] == 1
    assert zb["activations"][0] - one["activations"][0] == (
        294_912 + 196_608 + 98_304 + 131_072)


def test_eager_torch_zero_bubble_retains_p_graphs_on_the_last_stage():
    # pp 4, m 4, one layer per stage: the last stage holds 4 micro-batches' graphs (1F1B: 1),
    # 4 sets of output gradients and 3 more loss tensors (8 bytes per logit) and final-norm
    # inputs and stats plus output-layer inputs (fp32: 4 sbh + 8 sb + 4 sbh)
    cl = load_cluster("dgx-h100", gpus=8)
    kw = {"dp": 1, "micro_batch_size": 1, "num_microbatches": 4}
    one = mem.memory_breakdown(TINY, TINY_TRAIN, cl, _tiny(**kw), kernels="eager")
    zb = mem.memory_breakdown(TINY, TINY_TRAIN, cl, _tiny(schedule="zb", **kw), kernels="eager")
    layer = mem.eager_layer_activation_bytes(32, 1, 64, 4, ffn_hidden_size=256, autocast=False)
    sb = 32  # tokens per micro-batch
    dy = 4 * sb * (192 + 256 + 2 * 64) + 3 * 4 * sb * 64 + 4 * sb * 256
    final = 4 * sb * 64 + 8 * sb + 4 * sb * 64
    extra = 3 * (layer + final) + 4 * dy + 2 * 4 * sb * 192 + 3 * 8 * sb * 256
    assert zb["peak_stage"][0] == 1
    assert zb["activations"][0] - one["activations"][0] == pytest.approx(extra)


def test_eager_fsdp2_zero2_holds_sharded_and_unsharded_weights():
    cl = load_cluster("dgx-h100", gpus=8)
    b = _tiny(pp=1, dp=2, micro_batch_size=4, zero_stage=np.array([1, 2]))
    out = mem.memory_breakdown(TINY, TINY_TRAIN, cl, b, kernels="eager")
    n = TINY.param_count()
    assert out["weights"][0] == 4 * n
    assert out["weights"][1] == 4 * n * (1 + 1 / 2)


@pytest.mark.parametrize("dp, stage", [(8, 4), (8, -1), (8, [0, 5]), (0, 1), (-2, 3)])
def test_model_state_bytes_refuses_bad_zero_args(dp, stage):
    from perfmodel.memory.breakdown import model_state_bytes

    with pytest.raises(ValueError):
        model_state_bytes(7.5e9, dp, stage, "bf16")
