"""MoE routing imbalance (perfmodel.moe.imbalance): hand numbers, and F = 1 keeps today's result."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.moe.experts import dispatch_ops_per_layer
from perfmodel.moe.imbalance import TYPICAL_IMBALANCE, effective_imbalance, with_imbalance
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate

MIXTRAL = load_model("mixtral-8x7b")  # dropless: load_imbalance 1.0
H100 = load_cluster("dgx-h100").with_gpus(64)


def test_effective_imbalance_hand_numbers():
    assert effective_imbalance(1.5, 1.25) == 1.25  # dropped beyond the capacity
    assert effective_imbalance(1.1, 1.25) == 1.1
    assert effective_imbalance(1.1, 1.25, padded=True) == 1.25  # padded to capacity
    assert effective_imbalance(1.5, None) == 1.5  # dropless
    assert 1.0 < TYPICAL_IMBALANCE <= 1.3


def test_with_imbalance_keeps_the_model_when_unset_or_dense():
    assert with_imbalance(MIXTRAL, None) is MIXTRAL
    dense = load_model("llama3.1-8b")
    assert with_imbalance(dense, 2.0) is dense
    assert with_imbalance(MIXTRAL, 1.5).load_imbalance == 1.5


def _batch(ep, mbs):
    return ConfigBatch.from_arrays(dp=[8, 16], tp=[8, 4], pp=1, ep=ep, etp=1, zero_stage=1,
                                   micro_batch_size=mbs, recompute="selective",
                                   sequence_parallel=True, num_microbatches=[16, 8])


@settings(max_examples=5, deadline=None)
@given(ep=st.sampled_from([4, 8]), mbs=st.sampled_from([1, 2]))
def test_imbalance_one_is_todays_result_bit_for_bit(ep, mbs):
    b = _batch(ep, mbs)
    t0 = load_training(global_batch_size=128, seq_len=4096)
    t1 = load_training(global_batch_size=128, seq_len=4096, moe_imbalance=1.0)
    r0, r1 = evaluate(MIXTRAL, t0, H100, b), evaluate(MIXTRAL, t1, H100, b)
    assert np.array_equal(r0.step_time_s, r1.step_time_s)
    assert np.array_equal(r0.memory_bytes["peak"], r1.memory_bytes["peak"])


def test_busiest_expert_slows_the_step_and_the_all_to_all():
    b = _batch(8, 1)
    t0 = load_training(global_batch_size=128, seq_len=4096)
    t1 = load_training(global_batch_size=128, seq_len=4096, moe_imbalance=1.5)
    r0, r1 = evaluate(MIXTRAL, t0, H100, b), evaluate(MIXTRAL, t1, H100, b)
    assert np.all(r1.step_time_s > r0.step_time_s)
    assert np.all(r1.time_s["ep_comm"] >= r0.time_s["ep_comm"])


def test_busiest_rank_all_to_all_buffer_by_hand():
    """The busiest rank receives F x the mean routed tokens: Mixtral (h 4096, top-2), one
    micro-batch of 4096 tokens at tp = cp = 1, ep 8, bf16, F = 1.5:
    4096 * 2 * 1.5 * 4096 * 2 B = 100,663,296 B per dispatch (F = 1: 67,108,864 B)."""
    b = ConfigBatch.from_arrays(dp=8, tp=1, pp=1, ep=8, etp=1, zero_stage=1,
                                micro_batch_size=1, recompute="selective",
                                sequence_parallel=False, num_microbatches=8)
    t = load_training(global_batch_size=64, seq_len=4096)
    for f, want in ((1.5, 100_663_296.0), (1.0, 67_108_864.0)):
        _, buf, _ = dispatch_ops_per_layer(with_imbalance(MIXTRAL, f), t, b, 2.0)["a2a"]
        assert buf[0] == want
