"""Hand-computed numbers for the named terms memory_breakdown is composed of (perfmodel.memory.breakdown)."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.core.codes import SCHEDULE
from perfmodel.core.units import GIB, MIB
from perfmodel.memory import breakdown as mem
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, load_cluster, load_model, load_training

GPT = ModelSpec(name="gpt-test", num_layers=24, hidden_size=2048, num_attention_heads=16,
                ffn_hidden_size=8192, vocab_size=50304, max_seq_len=2048)
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=4, num_attention_heads=2,
                 ffn_hidden_size=8, vocab_size=10, max_seq_len=8)
H100 = load_cluster("dgx-h100", gpus=8)
CPU = H100.gpu.model_copy(update={"vendor": "cpu"})
ZB, GPIPE, ONE_F_ONE_B = (np.array([SCHEDULE.index(x)]) for x in ("zb", "gpipe", "1f1b"))


# --------------------------------------------------------------------------- model states
def test_kernel_state_bytes_per_param():
    assert mem.kernel_state_bytes_per_param(load_training(), eager=False) == (2, 4, 12, 0, False)
    bf16_buffer = load_training(grad_reduce_in_fp32=False)
    assert mem.kernel_state_bytes_per_param(bf16_buffer, eager=False) == (2, 2, 12, 4, False)
    fp8 = load_training(precision="fp8", fp8_params=True)
    assert mem.kernel_state_bytes_per_param(fp8, eager=False) == (1, 4, 12, 0, True)
    assert mem.kernel_state_bytes_per_param(load_training(), eager=True) == (4, 4, 8, 0, False)


def test_stage_dense_layers():
    ds = load_model("deepseek-v3")  # 3 dense leading layers
    first, last = mem.stage_dense_layers(ds, np.array([8.0, 8.0, 1.0]), np.array([8.0, 2.0, 61.0]))
    np.testing.assert_array_equal(first, [3, 2, 3])
    np.testing.assert_array_equal(last, [0, 0, 3])


def test_expert_and_rank_state_bytes():
    # experts: 1e9 parameters over expert-dp 4, ZeRO-1, (2, 4, 12): (2e9, 4e9, 3e9)
    w, g, o = mem.expert_state_bytes(1e9, 4, 1, 2.0, 4.0, 12.0)
    assert (w, g, o) == (2e9, 4e9, 3e9)
    # dense 1e9 over shard 8 plus those experts
    w, g, o = mem.rank_state_bytes(1e9, 1e9, 8, 4, 1, 2.0, 4.0, 12.0)
    assert (w, g, o) == (4e9, 8e9, 1.5e9 + 3e9)


def test_stage_model_state_bytes_tiny_tp2_pp2():
    # TINY (GPT-style, tied, learned positions): a layer 172 parameters, 16 of them norms, so
    # 156/2 + 16 = 94 at tp 2; pp 2, one layer a stage. First rank: 94 + 10*4/2 + 8*4 = 146;
    # last: 94 + final norm 8 + its own output table 10*4/2 = 122. Fused bf16 Adam, fp32 main
    # grads (2, 4, 12 bytes), ZeRO-1 over dp 2: optimizer 12/2 = 6 bytes per parameter.
    batch = ConfigBatch.from_arrays(dp=2, tp=2, pp=2, zero_stage=1, num_microbatches=4)
    training = load_training(global_batch_size=8, seq_len=8)
    ctx = mem._memory_context(TINY, training, H100.gpu, batch, False, True, None)
    states = mem._stage_model_state_bytes(ctx, mem._stage_param_counts(ctx))
    np.testing.assert_array_equal(np.concatenate(states.first), [292.0, 584.0, 876.0])
    np.testing.assert_array_equal(np.concatenate(states.last), [244.0, 488.0, 732.0])


def test_fsdp2_zero2_sharded_weight_bytes():
    out = mem.fsdp2_zero2_sharded_weight_bytes(1e9, np.array([8.0, 8.0, 1.0]), 1.0,
                                               np.array([2, 1, 2]), 4.0)
    np.testing.assert_array_equal(out, [0.5e9, 0.0, 0.0])


# --------------------------------------------------------------------------- activations
def test_stage_layer_activation_bytes_korthikanti_and_eager():
    s, b = 2048.0, 1.0
    sbh = s * b * 2048
    kept, full, e, gi = mem.stage_layer_activation_bytes(
        GPT, load_training(), s, b, 1.0, False, np.array([0, 2]), eager=False,
        flash_attention=False, dropout=True)
    # Korthikanti Table 2: sbh (34 + 5 a s / h) = sbh * 114; full recompute 2 sbh
    np.testing.assert_array_equal(kept, [sbh * 114, 2 * sbh])
    np.testing.assert_array_equal(full, [sbh * 114] * 2)
    assert (e, gi) == (2.0, None)
    _, _, _, gi8 = mem.stage_layer_activation_bytes(
        GPT, load_training(precision="fp8"), s, b, 1.0, False, 0, eager=False,
        flash_attention=True, dropout=False)
    assert gi8 == 1.0
    kept, _, e, gi = mem.stage_layer_activation_bytes(
        GPT, load_training(), s, b, 1.0, False, 0, eager=True, flash_attention=True,
        dropout=False)
    # eager GPT block: 36 sbh + 16 sb + 4 a s b
    assert float(kept) == 36 * sbh + 16 * s * b + 4 * 16 * s * b
    assert (e, gi) == (2.0, None)


def test_moe_layer_activation_bytes_dense_and_full_recompute():
    kept, full = mem.moe_layer_activation_bytes(GPT, load_training(), _batch(), np.array([0, 2]),
                                                2.0, None)
    np.testing.assert_array_equal(kept, [0.0, 0.0])
    np.testing.assert_array_equal(full, 0.0)
    oss = load_model("gpt-oss-120b")
    kept, full = mem.moe_layer_activation_bytes(oss, load_training(), _batch(n=2),
                                                np.array([0, 2]), 2.0, None)
    assert full[0] > 0 and kept[0] == full[0] and kept[1] == 0.0


def _batch(n=1, **kw):
    base = {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_microbatches": 8,
            "zero_stage": 1}
    base.update(kw)
    return ConfigBatch.from_arrays(**{k: np.repeat(np.atleast_1d(v), n) if np.size(v) == 1
                                      else v for k, v in base.items()})


def test_stage_inflight_microbatches():
    tr = load_training()
    pp, m = np.array([4.0, 4.0]), np.array([8.0, 8.0])
    sched = np.array([SCHEDULE.index("1f1b"), SCHEDULE.index("gpipe")])
    c = _batch(2, pp=np.array([4, 4]), schedule=sched)
    first, last = mem.stage_inflight_microbatches(tr, c, pp, m, sched, 1.0, eager=False)
    np.testing.assert_array_equal(first, [4, 8])  # 1F1B min(p, m), GPipe m
    np.testing.assert_array_equal(last, [1, 8])
    # eager torch zero bubble: the last rank retains min(p, m) graphs
    c = _batch(1, pp=4, num_microbatches=2, schedule=ZB)
    _, last = mem.stage_inflight_microbatches(tr, c, 4.0, 2.0, ZB, 1.0, eager=True)
    np.testing.assert_array_equal(last, [2])


def test_embedding_final_layer_and_loss_buffers():
    # token ids 8 s b + dropout mask s b h / r
    assert mem.embedding_activation_bytes(4096.0, 4096.0, 1.0, True, eager=False) == 16_809_984
    assert mem.embedding_activation_bytes(4096.0, 4096.0, 1.0, False, eager=False) == 32_768
    assert mem.embedding_activation_bytes(4096.0, 4096.0, 1.0, True, eager=True) == 65_536
    # fused 2 e s b h / r; eager (4 s b h + 8 s b) / r + e s b h: s b = 2, h = 3 -> 40 / 1 + 12
    assert mem.final_layer_activation_bytes(2.0, 3.0, 2.0, 2.0, eager=False) == 12.0
    assert mem.final_layer_activation_bytes(2.0, 3.0, 1.0, 2.0, eager=True) == 52.0
    assert mem.loss_buffer_bytes(load_training(), 1e6, eager=False) == (4e6, 2e6)
    fused = load_training(cross_entropy="fused")
    assert mem.loss_buffer_bytes(fused, 1e6, eager=False) == (2e6, 0.0)
    assert mem.loss_buffer_bytes(load_training(), 1e6, eager=True) == (0.0, 2e6)


def test_stage_and_single_stage_activation_bytes():
    assert mem.stage_activation_bytes(2.0, 4.0, 0, 10.0, 0.0, 3.0) == 83.0
    assert mem.stage_activation_bytes(2.0, 4.0, 2, 10.0, 5.0, 3.0) == 2 * 3 * 10 + 5 + 3  # L-N+1
    first, last = mem.single_stage_activation_bytes(10.0, 20.0, 3.0, np.array([1.0, 2.0]))
    np.testing.assert_array_equal(first, [13, 10])
    np.testing.assert_array_equal(last, [13, 20])


# --------------------------------------------------------------------------- other buffers
def test_library_workspace_bytes():
    assert float(mem.library_workspace_bytes(H100.gpu, 1.0)) == 64 * MIB
    assert float(mem.library_workspace_bytes(CPU, 1.0)) == 0.0


def test_gradient_bucket_bytes():
    zero, shard = np.array([0, 1, 2, 3]), np.full(4, 8.0)
    bucket, repl = mem.gradient_bucket_bytes(1e9, zero, shard, 4.0, eager=False)
    np.testing.assert_array_equal(bucket, [0, 0, 3.2e8, 3.2e8])  # 2 * 40e6 * 4
    assert not repl.any()
    bucket, repl = mem.gradient_bucket_bytes(1e9, zero, shard, 4.0, eager=True)
    np.testing.assert_array_equal(bucket, [4e9, 4e9, 3.2e8, 0])  # DDP copy, main_grad, FSDP2
    np.testing.assert_array_equal(repl, [False, True, False, False])
    bucket, _ = mem.gradient_bucket_bytes(1e7, np.array([2]), np.array([8.0]), 4.0, eager=True)
    np.testing.assert_array_equal(bucket, [4e7])  # a small model is one unit
    bucket, _ = mem.gradient_bucket_bytes(1e9, np.array([2, 3]), np.ones(2), 4.0, eager=False)
    np.testing.assert_array_equal(bucket, [0, 0])  # one rank: nothing to reduce-scatter


def test_zero3_gathered_bytes():
    stage = {"layer": 1e8, "first": 5e8, "last": 3e7, "layers_first": 4.0, "layers_last": 4.0}
    zero, shard = np.array([3, 2, 3]), np.array([8.0, 8.0, 1.0])
    first, last = mem.zero3_gathered_bytes(stage, 0.0, 1.0, zero, shard, 6.0, eager=False)
    np.testing.assert_array_equal(first, [1.2e9, 0, 0])  # 2 layers * 1e8 * (2 + 4)
    np.testing.assert_array_equal(last, first)
    first, last = mem.zero3_gathered_bytes(stage, 0.0, 1.0, zero, shard, 6.0, eager=True)
    np.testing.assert_array_equal(first, [8e7 * 6, 0, 0])  # two FSDP units of 40e6
    np.testing.assert_array_equal(last, [3e7 * 6, 0, 0])  # at most the stage


def test_stage_fp8_weight_cache_bytes():
    args = (4.0, 0.0, 1e8, 0.0, 0, 8.0, 1.0, False)
    assert float(mem.stage_fp8_weight_cache_bytes("fp8", *args)) == 8e8  # 2 * 4 * 1e8
    assert float(mem.stage_fp8_weight_cache_bytes("fp4", *args)) == 4e8
    assert float(np.asarray(mem.stage_fp8_weight_cache_bytes("bf16", *args))) == 0.0


def test_eager_pipeline_receive_and_held_output_bytes():
    pp = np.array([2.0, 1.0])
    first, last = mem.eager_pipeline_receive_bytes(1.0, 1.0, 1.0, pp, 4.0, 1.0, 2.0, 1.0)
    np.testing.assert_array_equal(first, [16, 0])  # 4 gradient buffers of 4 s b h
    np.testing.assert_array_equal(last, [12, 0])  # 3 forward receive buffers
    held = mem.eager_pipeline_held_output_bytes("bf16", pp, 4.0, 1e6)
    np.testing.assert_array_equal(held, [6e6, 0])
    assert float(mem.eager_pipeline_held_output_bytes("fp32", 2.0, 4.0, 1e6)) == 12e6


# --------------------------------------------------------------------------- the peak
def test_fused_peak_stage():
    one = lambda t: tuple(np.array([float(x)]) for x in t)
    first, last, mid = one((1, 1, 1, 6, 1)), one((2, 2, 2, 4, 1)), one((1, 1, 1, 7, 1))
    *terms, stage = mem.fused_peak_stage(first, last, mid, np.array([4.0]), np.array([1.0]))
    assert stage[0] == 1 and terms[3][0] == 5.0  # last: 12 with the transient logits
    *terms, stage = mem.fused_peak_stage(first, last, mid, np.array([2.0]), np.array([0.0]))
    assert stage[0] == 1  # 11 vs 10, the middle rank does not count with pp = 2
    big_mid = one((1, 1, 1, 20, 1))
    *terms, stage = mem.fused_peak_stage(first, last, big_mid, np.array([4.0]), np.array([0.0]))
    assert stage[0] == 2 and terms[3][0] == 20.0


def test_eager_zero_bubble_gradient_bytes_by_hand():
    # h 4, 2 heads of 2, f 8 (gelu): qkv cols 12, dY per layer 2 (20 + 8) = 56, norms 2 * 16
    # -> 88; 2 graphs * (88 + 16 + 2 * 10 logits) + QKV working set 48 + 1 * 8 * 10 = 376
    out = mem.eager_zero_bubble_gradient_bytes(TINY, "bf16", 1.0, 1.0, 1.0, 2.0, 4.0,
                                               np.concatenate([ZB, ONE_F_ONE_B]), 1.0, 10.0)
    np.testing.assert_array_equal(out, [376.0, 0.0])


def test_eager_accumulating_gradients():
    sched = np.concatenate([ONE_F_ONE_B, GPIPE, ONE_F_ONE_B])
    first, last = mem.eager_accumulating_gradients(sched, np.array([8.0, 8.0, 2.0]),
                                                   np.array([2.0, 2.0, 2.0]), 1.0)
    np.testing.assert_array_equal(first, [True, False, False])
    np.testing.assert_array_equal(last, [True, False, True])


def test_optimizer_grad_copy_excess_bytes():
    out = mem.optimizer_grad_copy_excess_bytes(4.0, np.array([1, 0, 1]), 8.0, 8e9,
                                               np.array([1e9, 1e9, 5e9]))
    np.testing.assert_array_equal(out, [3e9, 31e9, 0.0])  # 4 / 8 * 8e9 - 1e9; unsharded; none


@pytest.mark.parametrize("gpu, expected", [(H100.gpu, 0.3 * GIB), (CPU, 0.0)])
def test_allocator_allowance_bytes(gpu, expected):
    assert mem.allocator_allowance_bytes(gpu, 10 * GIB) == pytest.approx(expected, rel=1e-15)


def test_activation_operands():
    t, r, sb, e, gi = mem.activation_operands(4, True, 2048, 2, 2.0, None)
    assert (float(t), float(r), float(sb), e, gi) == (4.0, 4.0, 4096.0, 2.0, 2.0)
    t, r, sb, e, gi = mem.activation_operands(np.array([8]), np.array([False]), 4096, 1, 2.0, 1.0)
    assert (float(r[0]), float(sb), gi) == (1.0, 4096.0, 1.0)  # no sp: divisor 1; fp8 inputs
