"""Communication times on a cluster, and the bucketed overlap of the DP reduction."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.comm.comm_time import comm_times, dp_num_buckets, exposed_dp_time_s
from perfmodel.comm.comm_volume import params_per_gpu
from perfmodel.hardware import collectives as c
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ClusterSpec, load_cluster, load_model, load_training

GPT3 = load_model("gpt3-175b")
BF16 = load_training(global_batch_size=1536, seq_len=2048, precision="bf16",
                     grad_reduce_in_fp32=False)  # hand numbers: bf16 gradient reduction
A100 = load_cluster("dgx-a100-80g")  # NVLink 300 GB/s line rate x NCCL protocol 0.8 = 240 GB/s, 3 us (8 GPUs); IB 25 GB/s 8 us
ACT = 2048 * 12288 * 2
BASE = c.NCCL_BASE_LATENCY_S  # 8.4 us per collective call (NCCL tuning.cc baseLat, Simple)
KEYS = {
    "ep_layer_fwd_s",
    "ep_layer_bwd_s",
    "expert_dp_grad_s",
    "expert_zero3_gather_s",
    "tp_layer_fwd_s",
    "tp_layer_bwd_s",
    "cp_layer_fwd_s",
    "cp_layer_bwd_s",
    "cp_kv_send_s",
    "cp_kv_dkv_send_s",
    "cp_qkv_a2a_s",
    "cp_out_a2a_s",
    "cp_kv_gather_s",
    "cp_dkv_scatter_s",
    "pp_p2p_s",
    "dp_grad_s",
    "zero3_gather_s",
}


def scaled(cluster: ClusterSpec, f: float) -> ClusterSpec:
    tiers = [
        t.model_copy(update={"bw_gbyte_per_s": t.bw_bytes_per_s * f / 1e9, "bw_gbit_per_s": None})
        for t in cluster.tiers
    ]
    return cluster.model_copy(update={"tiers": tiers})


def test_keys_and_shapes():
    b = ConfigBatch.from_arrays(dp=[1, 16], tp=[8, 8], pp=[1, 8], num_microbatches=[1, 12])
    t = comm_times(GPT3, BF16, A100, b)
    assert set(t) == KEYS
    assert all(x.shape == (2,) for x in t.values())


def test_megatron_175b_hand():
    # Narayanan et al. 2021 style: t=8 inside a node, p=8 and d=16 across nodes
    b = ConfigBatch.from_arrays(
        dp=16, tp=8, pp=8, num_microbatches=12, sequence_parallel=True, recompute="full"
    )
    t = comm_times(GPT3, BF16, A100, b)
    ring = 14 * 3e-6 + 1.75 * ACT / 240e9  # < tree 18e-6 + 2 ACT / 240e9
    pair = ring + 2 * BASE  # AG + RS = ring AR in bytes and steps, NCCL's fixed cost twice
    assert t["tp_layer_fwd_s"][0] == pytest.approx(2 * pair)
    assert t["tp_layer_bwd_s"][0] == pytest.approx(4 * pair)  # + recomputed forward
    assert t["pp_p2p_s"][0] == pytest.approx(8e-6 + ACT / 8 / 25e9)  # SP: 1/tp of the tensor
    size = params_per_gpu(GPT3, b)[0] * 2
    # dp group of 16, one GPU per node: 25 GB/s, 8 us; ring vs tree
    ring_dp = 30 * 8e-6 + 1.875 * size / 25e9
    tree_dp = 8 * 8e-6 + 2 * size / 25e9
    assert t["dp_grad_s"][0] == pytest.approx(min(ring_dp, tree_dp) + BASE)
    assert t["dp_grad_s"][0] == pytest.approx(ring_dp + BASE)
    assert t["zero3_gather_s"][0] == 0 and t["cp_layer_fwd_s"][0] == 0


def test_context_parallel_and_zero3_hand():
    tr = load_training(global_batch_size=16, seq_len=8192, grad_reduce_in_fp32=False)
    b = ConfigBatch.from_arrays(dp=2, tp=4, cp=4, zero_stage=3, num_microbatches=8)
    t = comm_times(GPT3, tr, A100, b)
    # cp group: stride 4, size 4 -> spans 2 nodes, p2p over IB
    chunk = 2 * (8192 / 4) * (96 / 4) * 128 * 2
    send = 8e-6 + chunk / 25e9
    assert t["cp_layer_fwd_s"][0] == pytest.approx(3 * send)
    assert t["cp_layer_bwd_s"][0] == pytest.approx(6 * send)
    assert t["cp_kv_send_s"][0] == pytest.approx(send)
    assert t["cp_kv_dkv_send_s"][0] == pytest.approx(8e-6 + 2 * chunk / 25e9)  # K/V + dK/dV
    # ZeRO-3 over dp*cp = 8 GPUs at stride 4 (2 per node): ring bw min(300, 2*25) = 50 GB/s
    psi = params_per_gpu(GPT3, b)[0]
    ag = 7 * 8e-6 + 7 / 8 * psi * 2 / 50e9 + BASE
    # one gather per layer (FSDP2): 96 layers per pass, each extra one pays (n-1)*alpha and
    # NCCL's fixed cost again
    per_layer_latency = (96 - 1) * (7 * 8e-6 + BASE)
    assert t["zero3_gather_s"][0] == pytest.approx(2 * 8 * (ag + per_layer_latency))
    assert t["dp_grad_s"][0] == pytest.approx(8 * ag)  # one reduce-scatter per micro-batch
    # DeepSpeed-2021 style: one gather (and gradient reduce-scatter) per weight matrix (QKV 3h^2,
    # proj h^2, fc1 and fc2 4h^2 each, / tp 4; biases and norms are persistent) on one rail
    # (25 GB/s, 8 us); no recompute: forward and backward each gather all four
    t_tensor = comm_times(GPT3, tr.model_copy(update={"zero3_gather": "tensor"}), A100, b)
    h2 = 12288**2 / 4
    gathers = sum(7 * 8e-6 + 7 / 8 * k * h2 * 2 / 25e9 + BASE for k in (3, 1, 4, 4))
    assert t_tensor["zero3_gather_s"][0] == pytest.approx(8 * 96 * 2 * gathers)
    assert t_tensor["dp_grad_s"][0] == pytest.approx(8 * 96 * gathers)  # one RS per weight


def test_all_reduce_calculator_matches_dp_time_in_one_node():
    b = ConfigBatch.from_arrays(dp=8, tp=1, num_microbatches=1)
    t = comm_times(GPT3, BF16, A100, b)
    size = GPT3.param_count() * 2
    assert t["dp_grad_s"][0] == pytest.approx(c.all_reduce_time(size, 8, 240e9, 3e-6, "auto")
                                              + BASE)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8, 32]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]),
    st.integers(0, 3),
    st.floats(1.0, 50.0),
)
def test_time_never_grows_with_bandwidth(dp, tp, pp, cp, zero, f):
    b = ConfigBatch.from_arrays(dp=dp, tp=tp, pp=pp, cp=cp, zero_stage=zero, num_microbatches=4)
    slow = comm_times(GPT3, BF16, A100, b)
    fast = comm_times(GPT3, BF16, scaled(A100, f), b)
    for k in KEYS:
        assert fast[k][0] <= slow[k][0] * (1 + 1e-9)
        assert slow[k][0] >= 0


def test_groups_of_one_cost_nothing():
    t = comm_times(GPT3, BF16, A100, ConfigBatch.from_arrays(dp=1, tp=1, pp=1, cp=1))
    assert all(x[0] == 0 for x in t.values())


def test_exposed_dp_time_hand():
    # C=1, B=2, k=4: max(C/k, C - B(k-1)/k) = max(0.25, -0.5) = 0.25 (last bucket)
    assert exposed_dp_time_s(1.0, 2.0, 4) == pytest.approx(0.25)
    # C=3, B=2, k=4: max(0.75, 3 - 1.5) = 1.5
    assert exposed_dp_time_s(3.0, 2.0, 4) == pytest.approx(1.5)
    assert exposed_dp_time_s(3.0, 2.0, 4, overlap=False) == 3.0
    assert exposed_dp_time_s(3.0, 2.0, 1) == 3.0  # one bucket cannot overlap
    # many buckets: total -> max(B, C)
    assert 2.0 + exposed_dp_time_s(1.0, 2.0, 10**6) == pytest.approx(2.0, abs=1e-5)
    assert 2.0 + exposed_dp_time_s(3.0, 2.0, 10**6) == pytest.approx(3.0, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 10), st.floats(0, 10), st.integers(1, 1000))
def test_exposed_dp_time_bounds(comm, bwd, k):
    e = exposed_dp_time_s(comm, bwd, k)
    assert -1e-12 <= e <= comm + 1e-12
    assert bwd + e >= max(bwd, comm) - 1e-9
    assert e >= comm / k - 1e-12


def test_dp_num_buckets_megatron_default():
    b = ConfigBatch.from_arrays(dp=[8, 128], tp=8, pp=8)
    psi = params_per_gpu(GPT3, b)
    np.testing.assert_allclose(dp_num_buckets(GPT3, b), np.ceil(psi / np.array([40e6, 128e6])))


def test_zero3_per_tensor_reduce_scatter_latency():
    tr = load_training(global_batch_size=16, seq_len=8192, zero3_gather="tensor",
                       grad_reduce_in_fp32=False)
    b = ConfigBatch.from_arrays(dp=2, tp=4, cp=4, zero_stage=3, num_microbatches=8)
    per_layer = comm_times(GPT3, tr.model_copy(update={"zero3_gather": "layer"}), A100, b)
    per_tensor = comm_times(GPT3, tr, A100, b)
    # 8 micro-batches x 96 layers x 4 weight reduce-scatters, each paying the ring latency
    # 7 x 8 us, on one rail (25 GB/s) instead of the 2-per-node ring (50 GB/s)
    psi = params_per_gpu(GPT3, b)[0]
    layer_w = 12 * 12288**2 / 4
    rs_tensor = 8 * (96 * 4 * (7 * 8e-6 + BASE) + 96 * 7 / 8 * layer_w * 2 / 25e9)
    rs_layer = 8 * (7 * 8e-6 + 7 / 8 * psi * 2 / 50e9 + BASE)
    assert per_layer["dp_grad_s"][0] == pytest.approx(rs_layer)
    assert per_tensor["dp_grad_s"][0] == pytest.approx(rs_tensor)


def test_tp_all_reduce_at_measured_busbw():
    """8 GPUs on PCIe with a measured all-reduce busbw of 12.6 GB/s: one all-reduce of a
    2048 x 12288 bf16 activation (50.3 MB) takes 14 steps x 5.7 us + 2*7/8 * 50.3e6 / 12.6e9 =
    79.8 us + 6.990 ms, plus NCCL's fixed 8.4 us (NCCL-tests PERFORMANCE.md: busbw = algbw *
    2(n-1)/n)."""
    base = load_cluster("pcie-a100-8")
    tier = base.tiers[0].model_copy(update={"busbw_gbyte_per_s": {"all_reduce": {8: 12.6}}})
    cl = base.model_copy(update={"tiers": [tier, base.tiers[1]]})
    b = ConfigBatch.from_arrays(dp=1, tp=8, num_microbatches=1)
    one = comm_times(GPT3, BF16, cl, b)["tp_layer_fwd_s"][0] / 2  # two all-reduces forward
    assert one == pytest.approx(BASE + 14 * 5.7e-6 + 2 * 7 / 8 * ACT / 12.6e9, rel=1e-9)
    # without the table: the analytic 31.5 GB/s x 0.8 (faster)
    plain = comm_times(GPT3, BF16, base, b)["tp_layer_fwd_s"][0] / 2
    assert plain < one


@settings(max_examples=20, deadline=None)
@given(st.floats(1.0, 500.0), st.floats(1.0, 4.0), st.sampled_from([2, 4, 8]),
       st.booleans())
def test_more_measured_busbw_never_costs_more(busbw, factor, tp, sp):
    base = load_cluster("pcie-a100-8")
    b = ConfigBatch.from_arrays(dp=8 // tp, tp=tp, num_microbatches=2, sequence_parallel=sp)

    def times(gb):
        tier = base.tiers[0].model_copy(update={"busbw_gbyte_per_s": {"all_reduce": {2: gb}}})
        t = comm_times(GPT3, BF16, base.model_copy(update={"tiers": [tier, base.tiers[1]]}), b)
        return t["tp_layer_fwd_s"][0] + t["tp_layer_bwd_s"][0], t["dp_grad_s"][0]

    slow, fast = times(busbw), times(busbw * factor)
    assert fast[0] <= slow[0] + 1e-15 and fast[1] <= slow[1] + 1e-15
