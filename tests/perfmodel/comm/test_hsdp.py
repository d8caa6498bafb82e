"""Hybrid sharding (perfmodel.comm.hsdp, perfmodel.memory.hsdp): hand numbers, and s = dp is
ZeRO-3."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.comm.comm_time import comm_times
from perfmodel.comm.comm_volume import dp_ops
from perfmodel.comm.hsdp import hsdp_groups, hsdp_link_times_s, shard_degree
from perfmodel.hardware import collectives as coll
from perfmodel.memory.hsdp import hsdp_state_factor
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate

LLAMA = load_model("llama3.1-8b")
H100 = load_cluster("dgx-h100").with_gpus(64)
T = load_training(global_batch_size=256, seq_len=4096)


def test_shard_degree_and_state_factor():
    assert shard_degree(np.array([32, 4, 32]), 8).tolist() == [8, 4, 8]
    assert shard_degree(np.array([32]), 0).tolist() == [32]
    assert hsdp_state_factor(np.array([32, 32]), np.array([3, 1]), 8).tolist() == [4.0, 1.0]
    assert hsdp_state_factor(np.array([32]), np.array([3]), 0).tolist() == [1.0]


def test_groups_one_node_shard_and_replicas_across_nodes():
    b = ConfigBatch.from_arrays(dp=64, tp=1, zero_stage=3)
    g_shard, g_rep = hsdp_groups(H100, b, 8)
    assert g_shard.size.tolist() == [8] and g_shard.tier.tolist() == [0]  # NVLink
    assert g_rep.size.tolist() == [8] and g_rep.tier.tolist() == [1]  # InfiniBand


def test_hand_computed_gradient_and_gather():
    # dp = 64, shard 8: the reduce-scatter on NVLink over 8, then the 1/8 shard all-reduced
    # over 8 replicas on InfiniBand; the gathers on NVLink over 8 (+ the per-layer latency)
    b = ConfigBatch.from_arrays(dp=64, tp=1, zero_stage=3, micro_batch_size=1,
                                num_microbatches=4)
    ops = dp_ops(LLAMA, T, b)
    g_shard, g_rep = hsdp_groups(H100, b, 8)
    rs, ag = ops["grad_reduce_scatter"], ops["zero3_param_all_gather"]
    rs_s = coll.reduce_scatter_time(rs.buffer_bytes, 8, g_shard.bw_bytes_per_s, g_shard.latency_s)
    ar_s = coll.all_reduce_time(rs.buffer_bytes / 8, 8, g_rep.bw_bytes_per_s, g_rep.latency_s,
                                "auto")
    got = hsdp_link_times_s(LLAMA, T, H100, b, 8)
    base = coll.NCCL_BASE_LATENCY_S  # each call's fixed cost
    np.testing.assert_allclose(got["grad_s"], rs.count * (rs_s + ar_s + 2 * base), rtol=1e-6)
    ag_s = coll.all_gather_time(ag.buffer_bytes, 8, g_shard.bw_bytes_per_s, g_shard.latency_s)
    lat = coll.all_gather_time(0.0, 8, g_shard.bw_bytes_per_s, g_shard.latency_s) + base
    np.testing.assert_allclose(got["zero3_gather_s"],
                               ag.count * (ag_s + base + (LLAMA.num_layers - 1) * lat), rtol=1e-9)


@settings(max_examples=6, deadline=None)
@given(dp=st.sampled_from([8, 16, 32, 64]), tp=st.sampled_from([1]), cp=st.sampled_from([1]))
def test_shard_over_all_of_dp_is_zero3(dp, tp, cp):
    b = ConfigBatch.from_arrays(dp=dp, tp=tp, cp=cp, zero_stage=3, micro_batch_size=1,
                                num_microbatches=256 // dp, recompute="full")
    z3 = comm_times(LLAMA, T, H100, b)
    hs = hsdp_link_times_s(LLAMA, T, H100, b, dp)
    np.testing.assert_allclose(hs["zero3_gather_s"], z3["zero3_gather_s"], rtol=1e-12)
    np.testing.assert_allclose(hs["grad_s"], z3["dp_grad_s"], rtol=1e-12)
    r0 = evaluate(LLAMA, T, H100, b)
    r1 = evaluate(LLAMA, load_training(T, hsdp_shard=dp), H100, b)
    np.testing.assert_allclose(r1.step_time_s, r0.step_time_s, rtol=1e-12)
    assert np.array_equal(r1.memory_bytes["peak"], r0.memory_bytes["peak"])


def test_smaller_shard_holds_more_state():
    b = ConfigBatch.from_arrays(dp=64, tp=1, zero_stage=3, micro_batch_size=1,
                                num_microbatches=4, recompute="full")
    r0 = evaluate(LLAMA, T, H100, b)
    r1 = evaluate(LLAMA, load_training(T, hsdp_shard=8), H100, b)
    np.testing.assert_allclose(r1.memory_bytes["optimizer"], 8 * r0.memory_bytes["optimizer"])
    assert r1.memory_bytes["peak"][0] > r0.memory_bytes["peak"][0]
