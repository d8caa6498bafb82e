"""MoE cost terms: hand-computed dispatch bytes, expert shapes, tier pricing, memory and FLOPs,
and the invariants (ep = 1 is today's all-experts-local MoE; more ep never raises the expert
weight bytes per GPU; the all-to-all bytes grow with top-k)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.comm import comm_volume
from perfmodel.comm.comm_time import comm_times
from perfmodel.compute import flops
from perfmodel.compute.layer import compute_times, layer_gemms
from perfmodel.memory import memory_breakdown
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.topology import group_placement
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate

MIX = load_model("mixtral-8x7b")
TR = load_training(global_batch_size=256, seq_len=4096)


def batch(**kw):
    kw.setdefault("num_microbatches", 4)
    return ConfigBatch.from_arrays(**kw)


def test_dispatch_bytes_by_hand():
    # Mixtral, b=1, s=4096, tp=1, cp=1, ep=8: T = 4096 tokens, k = 2, h = 4096, bf16:
    # buffer 4096*2*4096*2 = 64 MiB per exchange, 7/8 of it leaves the GPU; 4 exchanges per
    # MoE layer per micro-batch (dispatch + combine, forward and backward), 32/4 = 8 layers per
    # stage (pp=4), m = 4 micro-batches.
    b = batch(dp=16, pp=4, ep=8, etp=1)
    per = 4096 * 2 * 4096 * 2 * 7 / 8
    assert comm_volume.ep_dispatch_bytes(MIX, TR, b)[0] == pytest.approx(4 * 8 * 4 * per)
    assert comm_volume.comm_bytes_per_gpu(MIX, TR, b)["ep"][0] == pytest.approx(4 * 8 * 4 * per)
    # full recompute repeats the forward's two exchanges
    rb = batch(dp=16, pp=4, ep=8, etp=1, recompute="full")
    assert comm_volume.ep_dispatch_bytes(MIX, TR, rb)[0] == pytest.approx(6 * 8 * 4 * per)
    # ep = 1: nothing leaves the GPU
    assert comm_volume.ep_dispatch_bytes(MIX, TR, batch(dp=16, pp=4))[0] == 0.0


def test_allgather_dispatcher_bytes():
    ag = TR.model_copy(update={"moe_token_dispatcher": "allgather"})
    b = batch(dp=16, pp=4, ep=8, etp=1)
    # all-gather of the 8 GPUs' 4096 tokens (no top-k copies): 7/8 of 8*4096*4096*2
    per = 7 / 8 * 8 * 4096 * 4096 * 2
    assert comm_volume.ep_dispatch_bytes(MIX, ag, b)[0] == pytest.approx(4 * 8 * 4 * per)


def test_expert_rows_and_gemm_shapes():
    # tp=2 (sequence parallel), ep=4, etp=1: T = 4096/2 = 2048 tokens per GPU, 2048*2 copies,
    # the ep*etp = 4 GPUs' 16384 copies over 8 experts = 2048 rows per expert, 8/4 = 2 local
    b = batch(dp=8, tp=2, pp=4, ep=4, etp=1, sequence_parallel=True)
    assert moe.expert_rows_per_gpu(MIX, TR, b)[0] == 2048
    g = {name: (m, n, k, c) for name, m, n, k, c in
         layer_gemms(MIX, np.array([4096.0]), b.tp, b.ep, b.etp,
                     moe.expert_rows_per_gpu(MIX, TR, b))}
    m, n, k, c = g["expert_fc1"]
    assert (m[0], n[0], k[0], c[0]) == (2048, 2 * 14336, 4096, 2)
    assert g["router"][0][0] == 2048 and g["router"][1][0] == 8
    # ep = 1, etp = tp: the all-experts-local shape b*s/cp * k / E = 1024 rows of f/tp columns
    b1 = batch(dp=8, tp=2, pp=4, sequence_parallel=True)
    assert moe.expert_rows_per_gpu(MIX, TR, b1)[0] == 4096 * 2 / 8
    # load imbalance scales the busiest expert's rows
    imb = MIX.model_copy(update={"moe_load_imbalance": 1.5})
    assert moe.expert_rows_per_gpu(imb, TR, b)[0] == 1.5 * 2048


def test_a2a_priced_on_the_tier_the_group_spans():
    # 64 MiB buffer, ep = 8 inside one DGX H100 node: 7/8 over NVLink (450 GB/s);
    # ep = 16 over two nodes: 7/16 over NVLink, 8/16 over the GPU's 400 Gb/s NIC (slower).
    h100 = load_cluster("dgx-h100", gpus=64)
    s = 64 * 2**20
    g8 = group_placement(h100, np.array([8]), np.array([1]))
    nv = h100.tiers[0]
    t8 = moe.all_to_all_tiered_time(np.array([s]), g8)[0]
    assert t8 == pytest.approx(7 / 8 * s / nv.effective_bw_bytes_per_s + 7 * nv.latency_s)
    g16 = group_placement(h100, np.array([16]), np.array([1]))
    ib = h100.tiers[1]
    t16 = moe.all_to_all_tiered_time(np.array([s]), g16)[0]
    assert t16 == pytest.approx(8 / 16 * s / ib.effective_bw_bytes_per_s + 15 * ib.latency_s)
    # an NVL72 rack keeps ep = 64 on NVLink when the job uses 64 GPUs per rack (16 trays)
    gb = load_cluster("gb200-nvl72", gpus=256)
    gb64 = gb.model_copy(update={"tiers": [gb.tiers[0].model_copy(update={"domain_size": 64}),
                                           gb.tiers[1]]})
    g64 = group_placement(gb64, np.array([64]), np.array([1]))
    assert g64.tier[0] == 0
    t64 = moe.all_to_all_tiered_time(np.array([s]), g64)[0]
    assert t64 == pytest.approx(63 / 64 * s / 900e9 + 63 * 4e-6)


def test_overlap_switch_hides_dispatch():
    c = load_cluster("dgx-h100", gpus=64)
    # interleaved (Megatron-Core overlaps with pp > 1 only there: combined 1F1B)
    b = batch(dp=16, pp=4, vp=2, schedule="interleaved", ep=8, etp=1, num_microbatches=16)
    plain = evaluate(MIX, TR, c, b)
    hidden = evaluate(MIX, TR.model_copy(update={"overlap_moe_comm": True}), c, b)
    assert plain.time_s["ep_comm"][0] > 0
    assert hidden.time_s["ep_comm"][0] < plain.time_s["ep_comm"][0]
    assert hidden.step_time_s[0] < plain.step_time_s[0]


def test_expert_memory_sharded_by_ep_and_expert_dp():
    c = load_cluster("dgx-h100", gpus=64)
    # Mixtral routed experts: 32 layers * 8 * 3*4096*14336 = 45.1e9; pp = 4, ep = 8, etp = 1:
    # 45.1e9 / 4 / 8 per GPU, bf16 weights (2 bytes)
    b = batch(dp=16, pp=4, ep=8, etp=1, zero_stage=1)
    n = moe.expert_params_per_gpu(MIX, b)[0]
    assert n == pytest.approx(32 * 8 * 3 * 4096 * 14336 / 4 / 8)
    one = batch(dp=16, pp=4, zero_stage=1)
    w8 = memory_breakdown(MIX, TR, c, b)["weights"][0]
    w1 = memory_breakdown(MIX, TR, c, one)["weights"][0]
    assert w1 - w8 == pytest.approx(2 * (n * 8 - n))
    # optimizer states of the experts sharded over expert-dp = 16/8 = 2
    o8 = memory_breakdown(MIX, TR, c, b)["optimizer"][0]
    o1 = memory_breakdown(MIX, TR, c, one)["optimizer"][0]
    assert o1 - o8 == pytest.approx(12 * (8 * n / 16 - n / 2))


def test_stage_expert_params_by_hand():
    # DeepSeek-V3: 61 layers, the first 3 dense, 256 experts of 3*7168*2048 = 44.04e6.
    # pp = 16, ep = 8: rank 0 with 2 layers (both dense) holds no experts, a middle rank with 4
    # MoE layers 4*256*44.04e6/8 = 5.64e9, and with pp = 1 all 58 MoE layers over ep.
    from perfmodel.memory.breakdown import stage_expert_params

    m = load_model("deepseek-v3")
    b = batch(dp=16, pp=16, ep=8, etp=1)
    per_layer = 256 * 3 * 7168 * 2048
    assert stage_expert_params(m, b, 2.0, 2.0)[0] == 0.0
    assert stage_expert_params(m, b, 4.0, 0.0)[0] == pytest.approx(4 * per_layer / 8)
    assert stage_expert_params(m, b, 5.0, 3.0)[0] == pytest.approx(2 * per_layer / 8)
    one = batch(dp=256, ep=8, etp=1)
    assert stage_expert_params(m, one, 61.0, 3.0)[0] == pytest.approx(
        moe.expert_params_per_gpu(m, one)[0])
    # a model whose MoE layers are every 2nd (Llama-4 Maverick style): half of a stage's layers
    alt = m.model_copy(update={"moe_dense_layers": 0, "moe_layer_freq": 2, "num_layers": 48})
    assert stage_expert_params(alt, b, 6.0)[0] == pytest.approx(3 * per_layer / 8)


def test_middle_rank_holds_its_experts():
    # DeepSeek-V3 on pp = 16 (61 layers: 2 / 4 per middle rank / 3): the peak is a middle rank,
    # and its weights include its 4 MoE layers' experts (4*256*44.04e6/8 params, bf16), not
    # only attention and norms.
    m = load_model("deepseek-v3")
    c = load_cluster("dgx-b200", gpus=256)
    tr = load_training(global_batch_size=2048, seq_len=4096, precision="bf16")
    b = ConfigBatch.from_arrays(dp=16, pp=16, ep=8, etp=1, num_microbatches=128,
                                zero_stage=1)
    mem = memory_breakdown(m, tr, c, b)
    assert mem["peak_stage"][0] == 2
    experts = 4 * 256 * 3 * 7168 * 2048 / 8
    assert mem["weights"][0] > 2 * experts
    # more ep never raises it either (the property, on the middle rank)
    b16 = ConfigBatch.from_arrays(dp=16, pp=16, ep=16, etp=1, num_microbatches=128,
                                  zero_stage=1)
    assert memory_breakdown(m, tr, c, b16)["peak"][0] < mem["peak"][0]


def test_active_parameter_flops_deepseek():
    # per token per layer, forward: MLA 2*187.1e6, MoE layers (58/61) 8 routed + 1 shared
    # experts 2*3*7168*2048*9 and the router 2*7168*256; dense layers (3/61) 2*3*7168*18432
    m = load_model("deepseek-v3")
    phi = 58 / 61
    want = 2 * 187_107_328 + phi * (2 * 3 * 7168 * 2048 * 9 + 2 * 7168 * 256) + (
        (1 - phi) * 2 * 3 * 7168 * 18432)
    assert flops.layer_matmul_flops_per_token(m) == pytest.approx(want)
    # attention: QK^T over 192, PV over 128 per head
    assert flops.layer_attention_flops_per_token(m, 4096) == 2 * 4096 * 128 * (192 + 128)
    # 6 * active parameters (+ attention) per token, roughly: within 10 % of 6 * 37e9
    per_token = flops.model_flops_per_step(m, load_training(global_batch_size=1, seq_len=4096))
    assert per_token / 4096 == pytest.approx(6 * 37e9 + 3 * 61 * 2 * 4096 * 128 * 320, rel=0.1)


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------
def test_ep1_equals_todays_all_experts_local_moe():
    # Before expert parallelism, an MoE model ran all experts locally, split by tp, with no
    # all-to-all. ep = 1 and etp = tp (Megatron's default) must be exactly that: no dispatch
    # bytes or time, expert weights tp-split like the dense MLP, optimizer states over dp.
    c = load_cluster("dgx-h100", gpus=64)
    b = batch(dp=8, tp=2, pp=4, sequence_parallel=True, zero_stage=1)
    assert b.etp[0] == 2 and b.ep[0] == 1
    r = evaluate(MIX, TR, c, b)
    assert r.comm_bytes_per_gpu["ep"][0] == 0.0 and r.time_s["ep_comm"][0] == 0.0
    # weights = every layer parameter split by tp (norms and router replicated), as one
    # dense GPU holds them: the expert share is exactly ffn / tp
    n = moe.expert_params_per_gpu(MIX, b)[0]
    assert n == pytest.approx(32 / 4 * 8 * 3 * 4096 * 14336 / 2)
    t = comm_times(MIX, TR, c, b)
    assert t["ep_layer_fwd_s"][0] == 0.0 and t["expert_dp_grad_s"][0] > 0


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]),
       st.integers(0, 3))
def test_more_ep_never_raises_expert_weight_bytes(ep, etp, pp, zero):
    c = load_cluster("dgx-h100", gpus=64)
    dp = 64 // pp
    lo = batch(dp=dp, pp=pp, ep=ep, etp=etp, zero_stage=zero)
    hi = batch(dp=dp, pp=pp, ep=min(2 * ep, 8), etp=etp, zero_stage=zero)
    assert moe.expert_params_per_gpu(MIX, hi)[0] <= moe.expert_params_per_gpu(MIX, lo)[0]
    assert (memory_breakdown(MIX, TR, c, hi)["weights"][0]
            <= memory_breakdown(MIX, TR, c, lo)["weights"][0] + 1e-6)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.integers(1, 7), st.sampled_from(["alltoall"]))
def test_a2a_bytes_grow_with_top_k(ep, k, dispatcher):
    lo_m = MIX.model_copy(update={"moe_top_k": k})
    hi_m = MIX.model_copy(update={"moe_top_k": k + 1})
    b = batch(dp=16, pp=4, ep=ep, etp=1)
    assert (comm_volume.ep_dispatch_bytes(hi_m, TR, b)[0]
            > comm_volume.ep_dispatch_bytes(lo_m, TR, b)[0])


def test_compute_runs_for_every_moe_preset():
    gpu = load_cluster("gb200-nvl72").gpu
    for name in ("deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x22b"):
        m = load_model(name)
        b = batch(dp=8, ep=8, etp=1)
        out = compute_times(m, TR, gpu, b)
        assert all(np.all(np.isfinite(v)) and np.all(v >= 0) for v in out.values())


def test_etp_other_than_tp_pays_the_gather_even_without_ep():
    # tp = 1, etp = 4, ep = 1: the 4 expert shards need every token of the etp group: an
    # all-gather of 4*T*k*h (3/4 of it from the others) per dispatch, and no tp collective
    b = batch(dp=8, tp=1, pp=1, ep=1, etp=4)
    T = 4096  # b*s/(cp*tp)
    per = 3 / 4 * 4 * T * 2 * 4096 * 2
    assert comm_volume.ep_dispatch_bytes(MIX, TR, b)[0] == pytest.approx(4 * 32 * 4 * per)
    same = batch(dp=8, tp=4, pp=1, ep=1, etp=4, sequence_parallel=True)
    assert comm_volume.ep_dispatch_bytes(MIX, TR, same)[0] == 0.0  # behind the tp all-gather


def test_grouped_gemm_launches_one_gemm_per_local_expert(monkeypatch):
    # Transformer Engine's GroupedLinear launches one cuBLAS GEMM per local expert. With the
    # host cost per launch made huge (1 s) the layer is launch-bound: Mixtral with ep = 2 holds
    # 8/2 = 4 local experts, with ep = 8 one; the forward's two grouped GEMMs (fc1, fc2) then
    # differ by 2 * (4 - 1) = 6 launches = 6 s, the backward's four (dgrad, wgrad) by 12 s.
    from perfmodel.compute import layer as compute

    gpu = load_cluster("dgx-h100").gpu
    monkeypatch.setattr(compute, "CPU_FWD_LAUNCH_S", 1.0)
    monkeypatch.setattr(compute, "CPU_BWD_LAUNCH_S", 1.0)
    t2 = compute_times(MIX, TR, gpu, batch(dp=16, pp=4, ep=2, etp=1))
    t8 = compute_times(MIX, TR, gpu, batch(dp=16, pp=4, ep=8, etp=1))
    assert t2["layer_fwd_s"][0] - t8["layer_fwd_s"][0] == pytest.approx(6.0, rel=0.01)
    assert t2["layer_bwd_s"][0] - t8["layer_bwd_s"][0] == pytest.approx(12.0, rel=0.01)


def test_unfused_elementwise_kernels_by_hand():
    # GPT-OSS (Megatron-Bridge leaves bias_activation_fusion off): the gated activation runs as
    # 8 kernels moving 20 values per intermediate column and token instead of the fused 3;
    # the backward 16 kernels and 40 values instead of 5; RoPE 6 kernels instead of 1.
    from perfmodel.compute.layer import UNFUSED_ROPE_KERNELS, unfused_activation_kernels

    oss = load_model("gpt-oss-120b")
    assert not oss.fused_elementwise and MIX.fused_elementwise
    assert unfused_activation_kernels(oss, "fwd") == (8, 20.0)
    assert unfused_activation_kernels(oss, "bwd") == (16, 40.0)
    assert UNFUSED_ROPE_KERNELS == 6
    # the unfused model is slower, by the extra elementwise traffic only (same GEMMs)
    gpu = load_cluster("dgx-b200").gpu
    tr = load_training(global_batch_size=64, seq_len=4096)
    b = batch(dp=8, ep=8, etp=1, micro_batch_size=4)
    slow = compute_times(oss, tr, gpu, b)["layer_fwd_s"][0]
    fast = compute_times(oss.model_copy(update={"fused_elementwise": True}), tr, gpu, b)
    # extra forward traffic: (20 - 3) values * k*f = 4*2880 columns * 16384 tokens * 2 bytes at
    # the activation kernels' bandwidth, and 5 more RoPE passes over q and k (64 + 8 heads of
    # 64, read and written: 2 * 2 bytes) at the copy bandwidth; the phase is GPU-bound, so the
    # smooth maximum passes the difference through (within 5 %)
    from perfmodel.hardware.calibration import calibration_for

    cal = calibration_for(gpu, None)
    extra_s = (17 * 4 * 2880 * 16384 * 2 / cal.membw_bytes_per_s("gelu")
               + 5 * 2 * 2 * 16384 * 72 * 64 / cal.membw_bytes_per_s("copy"))
    assert slow - fast["layer_fwd_s"][0] == pytest.approx(extra_s, rel=0.05)


def test_fp8_recipes_save_the_permuted_expert_input_in_fp8():
    # Mixtral, b=1, s=4096, tp=1: T*k = 8192 routed rows of h = 4096; bf16: permuted input 2
    # bytes per value (fp8: 1), the fp32 permuted probabilities 4 bytes per row, + fp32 router
    # scores 8 * 4096 * 8 bytes; the expert output is not kept (probabilities applied in the
    # experts, the combine's unpermute is a pure gather)
    b = batch(dp=16, pp=4, ep=8, etp=1)
    router = 8.0 * 4096 * 8
    bf16 = moe.moe_activation_extra_bytes(MIX, TR, b, 2.0)[0]
    fp8 = moe.moe_activation_extra_bytes(MIX, TR, b, 2.0, 1.0)[0]
    assert bf16 == pytest.approx(8192 * (4096 * 2 + 4) + router)
    assert fp8 == pytest.approx(8192 * (4096 * 1 + 4) + router)


def test_host_time_per_local_expert_by_hand():
    # DeepSeek-V3 with ep = 8 holds 256/8 = 32 routed experts per GPU: 32 * 0.07 ms exposed
    # per MoE layer pass; ep = 64: 4 * 0.07 ms; a dense model none (the router / preprocess
    # host time is perfmodel.moe.dispatch.static_host_s)
    ds = load_model("deepseek-v3")
    b = batch(dp=64, pp=1, ep=np.array([8, 64]), etp=1)
    assert moe.local_experts(ds, b).tolist() == [32.0, 4.0]
    assert moe.moe_host_exposed_s(ds, b) == pytest.approx(
        moe.MOE_HOST_SYNC_S + moe.MOE_EXPERT_HOST_S * np.array([32.0, 4.0]))
    assert moe.MOE_EXPERT_HOST_S * 32 == pytest.approx(2.24e-3, rel=0.01)
    assert moe.moe_host_exposed_s(ds, b, TR) == pytest.approx([32 * 7e-5, 4 * 7e-5])
    assert moe.moe_host_exposed_s(load_model("llama2-7b"), batch(dp=8)).tolist() == [0.0]


def test_grouped_gemm_slowdown_by_hand():
    # Transformer Engine's multi-stream grouped GEMM: 1 + 0.30 where a GPU holds more than one
    # routed expert. DeepSeek-V3 (256 experts) at ep 8: 32 local, 1.30; ep 256: 1 local, 1.0;
    # Mixtral-8x7B at ep 8: one expert, a plain GEMM, 1.0; ep 2: 4 local, 1.30; dense: 1.0
    ds = load_model("deepseek-v3")
    assert moe.TE_GROUPED_GEMM_SLOWDOWN == pytest.approx(0.30)
    b = batch(dp=256, pp=1, ep=np.array([8, 256]), etp=1)
    assert moe.grouped_gemm_slowdown(ds, b).tolist() == pytest.approx([1.30, 1.0])
    b = batch(dp=16, pp=4, ep=np.array([8, 2]), etp=1)
    assert moe.grouped_gemm_slowdown(MIX, b).tolist() == pytest.approx([1.0, 1.30])
    assert moe.grouped_gemm_slowdown(load_model("llama2-7b"), batch(dp=8)).tolist() == [1.0]


def test_grouped_gemm_slowdown_scales_only_the_expert_gemms(monkeypatch):
    # Mixtral with ep = 2 (4 local experts): the slowdown made 1.0 (factor 2) adds the routed
    # experts' grouped-GEMM time once more to each pass; with ep = 8 (one expert) nothing changes
    from perfmodel.compute import layer as compute

    gpu = load_cluster("dgx-h100").gpu
    cal = compute.sustained_calibration(gpu, None, "fused")
    for ep, factor in ((2, 1.0), (8, 0.0)):
        b = batch(dp=16, pp=4, ep=ep, etp=1)
        monkeypatch.setattr(moe, "TE_GROUPED_GEMM_SLOWDOWN", 0.0)
        t0 = compute_times(MIX, TR, gpu, b)
        monkeypatch.setattr(moe, "TE_GROUPED_GEMM_SLOWDOWN", 1.0)
        t1 = compute_times(MIX, TR, gpu, b)
        c = compute._layer_context(MIX, TR, gpu, b, cal, False)
        pr = c.pr
        for key, lays in (("layer_fwd_s", ("fwd",)), ("layer_bwd_s", ("dgrad", "wgrad"))):
            g = sum(compute.grouped_gemm_time_s(cal, cnt, m_, n_, k_, lay, pr.peak, pr.ratio)[0]
                    for name, m_, n_, k_, cnt in c.gemms if name.startswith("expert_")
                    for lay in lays)
            # the phase is the smooth max of device and launch time: the device side grows by g
            assert t1[key][0] - t0[key][0] == pytest.approx(factor * g, rel=0.05, abs=1e-12)


def test_host_time_per_local_expert_adds_to_each_pass(monkeypatch):
    # made 1 s per local expert: Mixtral (every layer MoE) with ep = 2 holds 4 local experts,
    # with ep = 8 one, so forward and backward each differ by 3 s (plus a few launches)

    gpu = load_cluster("dgx-h100").gpu
    monkeypatch.setattr(moe, "MOE_EXPERT_HOST_S", 1.0)
    t2 = compute_times(MIX, TR, gpu, batch(dp=16, pp=4, ep=2, etp=1))
    t8 = compute_times(MIX, TR, gpu, batch(dp=16, pp=4, ep=8, etp=1))
    assert t2["layer_fwd_s"][0] - t8["layer_fwd_s"][0] == pytest.approx(3.0, rel=0.01)
    assert t2["layer_bwd_s"][0] - t8["layer_bwd_s"][0] == pytest.approx(3.0, rel=0.01)


def test_a2a_overlap_only_where_megatron_core_runs_it():
    # Megatron-Core's combined 1F1B overlaps the dispatch / combine only with pp = 1 or an
    # interleaved pipeline, ep > 1 and no full recomputation; elsewhere it refuses the switch,
    # so the all-to-all stays exposed (the same as with the switch off).
    c = load_cluster("dgx-h100", gpus=64)
    on = TR.model_copy(update={"overlap_moe_comm": True})
    cases = {  # (pp, vp, recompute, ep): overlap runs
        (1, 1, "none", 8): True, (4, 2, "none", 8): True, (4, 1, "none", 8): False,
        (1, 1, "full", 8): False, (4, 2, "full", 8): False, (1, 1, "none", 1): False,
    }
    for (pp, vp, rc, ep), runs in cases.items():
        sched = "interleaved" if vp > 1 else "1f1b"
        b = batch(dp=64 // pp, pp=pp, vp=vp, schedule=sched, recompute=rc, ep=ep, etp=1,
                  num_microbatches=8)
        assert bool(moe.a2a_overlap_applies(on, b)[0]) is runs
        hidden, plain = evaluate(MIX, on, c, b), evaluate(MIX, TR, c, b)
        if runs:
            assert hidden.time_s["ep_comm"][0] < plain.time_s["ep_comm"][0]
        else:
            assert hidden.time_s["ep_comm"][0] == pytest.approx(plain.time_s["ep_comm"][0])
    # the allgather dispatcher has no overlap
    ag = on.model_copy(update={"moe_token_dispatcher": "allgather"})
    assert not moe.a2a_overlap_applies(ag, batch(dp=64, ep=8, etp=1))[0]


def test_a2a_overlap_holds_one_more_microbatch():
    # pp = 1: forward of micro-batch i+1 runs with the backward of i, 2 in flight instead of 1
    # (+1); interleaved pp = 4, vp = 2: one more warm-up chunk (+1/2); plain 1F1B: no overlap.
    on = TR.model_copy(update={"overlap_moe_comm": True})
    b = batch(dp=16, pp=1, ep=8, etp=1, num_microbatches=8)
    assert moe.a2a_overlap_extra_inflight(on, b)[0] == 1.0
    bi = batch(dp=16, pp=4, vp=2, schedule="interleaved", ep=8, etp=1, num_microbatches=8)
    assert moe.a2a_overlap_extra_inflight(on, bi)[0] == 0.5
    assert moe.a2a_overlap_extra_inflight(on, batch(dp=16, pp=4, ep=8, etp=1))[0] == 0.0
    assert moe.a2a_overlap_extra_inflight(TR, b)[0] == 0.0
    c = load_cluster("dgx-h100", gpus=16)
    with_ov = memory_breakdown(MIX, on, c, b)["activations"][0]
    without = memory_breakdown(MIX, TR, c, b)["activations"][0]
    assert with_ov > 1.5 * without


def test_a2a_overlap_hides_a_share_of_what_fits_under_compute():
    # 10 ms of exchanges under 6 ms of compute: 0.6 * 6 ms hidden, 6.4 ms exposed; under 20 ms
    # of compute 0.6 * 10 ms hidden, 4 ms exposed; never more than without the overlap
    e = moe.a2a_overlap_exposed_s(np.array([10e-3, 10e-3, 0.0]), np.array([6e-3, 20e-3, 1.0]))
    assert moe.MOE_A2A_OVERLAP_HIDDEN == 0.6
    assert e == pytest.approx([6.4e-3, 4.0e-3, 0.0])


def test_no_host_sync_when_experts_are_padded_to_capacity(monkeypatch):
    # Megatron-Core drop_and_pad: split sizes fixed on the host, cuda_sync_point "no_sync": the
    # per-pass sync part goes, the per-expert part (TE's per-expert kernels) stays: 32 x 0.07 ms
    ds = load_model("deepseek-v3").model_copy(update={"moe_capacity_factor": 1.0})
    b = batch(dp=64, pp=1, ep=8, etp=1)
    pad = TR.model_copy(update={"moe_pad_expert_input_to_capacity": True})
    assert moe.moe_host_exposed_s(ds, b, pad)[0] == pytest.approx(32 * 7e-5)
    monkeypatch.setattr(moe, "MOE_HOST_SYNC_S", 1e-3)
    assert moe.moe_host_exposed_s(ds, b, pad)[0] == pytest.approx(32 * 7e-5)
    assert moe.moe_host_exposed_s(ds, b, TR)[0] == pytest.approx(1e-3 + 32 * 7e-5)
    monkeypatch.setattr(moe, "MOE_HOST_SYNC_S", 0.0)
    assert moe.moe_host_exposed_s(ds, b, TR)[0] == pytest.approx(
        moe.MOE_HOST_SYNC_S + 32 * moe.MOE_EXPERT_HOST_S)
    cl = load_cluster("dgx-h100", gpus=64)
    t_pad = evaluate(ds, pad, cl, b).step_time_s[0]
    t_sync = evaluate(ds, TR, cl, b).step_time_s[0]
    assert t_pad < t_sync


def test_mtp_stage_time_by_hand():
    from perfmodel.compute.mtp import mtp_stage_s

    ds = load_model("deepseek-v3")  # h 7168, V 129280
    one = ds.model_copy(update={"mtp_num_layers": 1})
    # 1 * (layer + (1 + 2*7168/129280) * logits) = 10 ms + 1.1109 * 20 ms
    assert mtp_stage_s(one, 0.010, 0.020) == pytest.approx(0.010 + (1 + 14336 / 129280) * 0.020)
    assert mtp_stage_s(ds, 0.010, 0.020) == 0.0


def test_mtp_adds_to_the_last_stage_only():
    ds = load_model("deepseek-v3").model_copy(update={"num_layers": 64})
    one = ds.model_copy(update={"mtp_num_layers": 1})
    cl = load_cluster("dgx-h100", gpus=256)
    tr = load_training(global_batch_size=512, seq_len=4096)
    from perfmodel.parallel.config import ParallelConfig, resolve_config

    cfg = resolve_config(ParallelConfig(dp=16, pp=16, ep=8, etp=1), ds, tr, cl)
    b = ConfigBatch.from_configs([cfg])
    r0, r1 = evaluate(ds, tr, cl, b), evaluate(one, tr, cl, b)
    # even split: the last stage (4 layers + logits) paces; MTP adds a layer, a second head and
    # eh_proj to it for every micro-batch of the steady state
    from perfmodel.compute.mtp import mtp_stage_s

    extra = mtp_stage_s(one, r0.extra["layer_s"], r0.extra["logits_s"])[0]
    m = b.num_microbatches[0]
    assert r1.step_time_s[0] - r0.step_time_s[0] == pytest.approx(m * extra, rel=0.1)
    assert r1.model_flops[0] == r0.model_flops[0]  # time only, the FLOPs convention unchanged


def test_expert_output_bias_traffic_by_hand():
    # GPT-OSS-120B, b=4, s=4096, tp=1, ep=64 (2 local experts), k=4: 65536 routed rows of
    # h = 2880 on this GPU; bf16. Forward: 5 values per output element (b*p written, t + bp
    # read 2 / written 1, cat read + written) in 2*2 + 1 kernels; backward 8 values in 4*2 + 1.
    oss = load_model("gpt-oss-120b")
    tr = load_training(global_batch_size=256, seq_len=4096)
    b = batch(dp=64, ep=64, etp=1, micro_batch_size=4)
    nb, nk = moe.expert_output_bias_traffic(oss, tr, b, 2.0, "fwd")
    assert nb[0] == pytest.approx(65536 * 2880 * 5 * 2) and nk[0] == 5
    nb, nk = moe.expert_output_bias_traffic(oss, tr, b, 2.0, "bwd")
    assert nb[0] == pytest.approx(65536 * 2880 * 8 * 2) and nk[0] == 9
    # no linear biases (Mixtral): nothing
    nb, nk = moe.expert_output_bias_traffic(MIX, TR, batch(dp=16, pp=4, ep=8, etp=1), 2.0, "fwd")
    assert nb[0] == 0 and nk[0] == 0
    # it slows GPT-OSS's MoE layer by about its bytes over the elementwise bandwidth
    from perfmodel.hardware.calibration import calibration_for

    gpu = load_cluster("dgx-b200").gpu
    cal = calibration_for(gpu, None)
    with_bias = compute_times(oss, tr, gpu, b)["layer_fwd_s"][0]
    no_bias = compute_times(oss.model_copy(update={"linear_bias": False}), tr, gpu, b)
    fwd_bias_s = 65536 * 2880 * 5 * 2 / cal.membw_bytes_per_s("add")
    assert with_bias - no_bias["layer_fwd_s"][0] == pytest.approx(fwd_bias_s, rel=0.05)


def test_all_to_all_at_measured_busbw():
    """An 8-GPU expert-parallel all-to-all on a PCIe box whose nccl-tests alltoall busbw is
    10 GB/s: 7 steps x 5.7 us + 7/8 * 64 MB / 10 GB/s = 39.9 us + 5.6 ms (NCCL-tests
    PERFORMANCE.md, bus factor (n-1)/n)."""
    base = load_cluster("pcie-a100-8")
    tier = base.tiers[0].model_copy(update={"busbw_gbyte_per_s": {"all_to_all": {8: 10.0}}})
    cl = base.model_copy(update={"tiers": [tier, base.tiers[1]]})
    t = moe.all_to_all_tiered_time(np.array([64e6]), group_placement(cl, np.array([8]), 1))
    assert t[0] == pytest.approx(7 * 5.7e-6 + 7 / 8 * 64e6 / 10e9)
