"""The MoE dispatcher switches (perfmodel/moe_dispatch.py): hand-computed counts and times."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.compute.layer import compute_times
from perfmodel.core.errors import SpecError
from perfmodel.moe import dispatch as md
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch, ParallelConfig
from perfmodel.spec.specs import TrainingSpec, load_cluster, load_model, load_training

TR = load_training(global_batch_size=256, seq_len=4096)
QWEN = load_model("qwen3-30b-a3b")
DS = load_model("deepseek-v3")


def _batch(ep=8, mb=1):
    return ConfigBatch.from_configs([ParallelConfig(dp=8, tp=1, pp=1, ep=ep, etp=1,
                                                    micro_batch_size=mb, num_microbatches=4)])


def test_router_preprocess_kernels_from_the_gb200_study():
    # 72 unfused, 31 with --moe-router-fusion, 17 with the flex dispatcher's fused preprocess
    assert md.router_preprocess_kernels(TR) == 31
    assert md.router_preprocess_kernels(TR.model_copy(update={"moe_router_fusion": False})) == 72
    flex = TR.model_copy(update={"moe_token_dispatcher": "flex"})
    assert md.router_preprocess_kernels(flex) == 17


def test_router_host_time_by_hand():
    # 31 x 6.9 us = 0.2139 ms; flex 17 x 6.9 us = 0.1173 ms; a moe_router graph: one launch
    assert md.router_host_s(TR) == pytest.approx(2.139e-4)
    flex = TR.model_copy(update={"moe_token_dispatcher": "flex"})
    assert md.router_host_s(flex) == pytest.approx(1.173e-4)
    g = TR.model_copy(update={"cuda_graph_scope": ("moe_router", "moe_preprocess")})
    assert md.router_host_s(g) == pytest.approx(6.9e-6)
    # derivation: 0.30 s a step over 1054 layer passes x 41 kernels fewer
    t = 16.555113 * 494.46
    assert (t / 529.55 - t / 540.00) / (8 * 64 * 2 * 1.03 * 41) == pytest.approx(
        md.MOE_ROUTER_KERNEL_HOST_S, rel=0.02)


def test_attention_graph_saves_launches_by_hand():
    # GQA fp8 forward: 6 + 2 quantisations = 8 kernels, one graph launch: 7 saved;
    # MLA bf16 backward: 10 + 2 * 4 = 18, 17 saved; nothing without "attn"
    g = TR.model_copy(update={"cuda_graph_scope": ("attn",)})
    assert md.attention_kernels(QWEN, "fwd", True) == 8
    assert md.graph_saved_launches(QWEN, g, "fwd", True) == 7.0
    assert md.attention_kernels(DS, "bwd", False) == 18
    assert md.graph_saved_launches(DS, g, "bwd", False) == 17.0
    assert md.graph_saved_launches(QWEN, TR, "fwd", True) == 0.0


def test_sync_only_without_padding_to_capacity():
    assert md.dispatch_syncs(QWEN, TR)
    pad = TR.model_copy(update={"moe_pad_expert_input_to_capacity": True})
    assert not md.dispatch_syncs(QWEN.model_copy(update={"moe_capacity_factor": 1.0}), pad)
    assert not md.dispatch_syncs(load_model("llama2-7b"), TR)


def test_pad_needs_capacity_factor_for_no_sync():
    pad = TR.model_copy(update={"moe_pad_expert_input_to_capacity": True})
    assert md.dispatch_syncs(QWEN, pad)  # no capacity factor: padding does not apply
    assert not md.dispatch_syncs(QWEN.model_copy(update={"moe_capacity_factor": 1.0}), pad)


def test_flex_fuses_the_global_permute():
    assert md.permute_copy_kernels(TR) == 2
    assert md.permute_copy_kernels(TR.model_copy(update={"moe_token_dispatcher": "flex"})) == 1


def test_switches_never_slow_the_layer_down():
    # graphs and the flex dispatcher only take host work away: layer times never grow
    gpu = load_cluster("dgx-b200").gpu
    b = _batch()
    base = compute_times(QWEN, TR, gpu, b)
    for upd in ({"cuda_graph_scope": ("attn",)},
                {"cuda_graph_scope": ("attn", "moe_router", "moe_preprocess")},
                {"moe_token_dispatcher": "flex", "moe_flex_backend": "hybridep"}):
        t = compute_times(QWEN, TR.model_copy(update=upd), gpu, b)
        for k in ("layer_fwd_s", "layer_bwd_s"):
            assert t[k][0] <= base[k][0] + 1e-12, (upd, k)
    # unfused router: slower by (72 - 31) x 6.9 us per pass exposed after the sync
    uf = compute_times(QWEN, TR.model_copy(update={"moe_router_fusion": False}), gpu, b)
    assert uf["layer_fwd_s"][0] - base["layer_fwd_s"][0] == pytest.approx(41 * 6.9e-6, rel=0.01)


def test_host_after_sync_adds_to_the_device_side(monkeypatch):
    # the per-expert host time after the sync keeps the GPU idle: 16 local experts (Qwen3-30B,
    # ep 8) x 1 ms a pass adds to the device side, 16 ms, less what the launch side had already
    # added to the pass through the smooth max (perfmodel.compute.layer._overlap_s)
    gpu = load_cluster("dgx-b200").gpu
    monkeypatch.setattr(moe, "MOE_EXPERT_HOST_S", 0.0)
    t0 = compute_times(QWEN, TR, gpu, _batch())
    monkeypatch.setattr(moe, "MOE_EXPERT_HOST_S", 1e-3)
    t1 = compute_times(QWEN, TR, gpu, _batch())
    for k in ("layer_fwd_s", "layer_bwd_s"):
        assert 0.85 * 16e-3 < t1[k][0] - t0[k][0] <= 16e-3 + 1e-12


def test_static_host_time_by_hand(monkeypatch):
    # shipped: the router / preprocess only (31 x 6.9 us); with the study's 60 us per TE kernel:
    # Qwen3-30B fp8 forward, no graphs: 8 attention kernels x 60 us + 0.2139 ms = 0.6939 ms;
    # DeepSeek-V3 (MLA, one shared expert) fp8 forward: (12 + 5) x 60 us + 0.2139 = 1.2339 ms;
    # all three graphs: one router launch, 6.9 us; padded to capacity (no sync): 0
    assert md.static_host_s(QWEN, TR, "fwd", True) == pytest.approx(2.139e-4)
    monkeypatch.setattr(md, "TE_KERNEL_HOST_S", 6e-5)
    assert md.static_host_s(QWEN, TR, "fwd", True) == pytest.approx(6.939e-4)
    assert md.shared_expert_kernels(DS, "fwd", True) == 5
    assert md.shared_expert_kernels(QWEN, "fwd", True) == 0
    assert md.static_host_s(DS, TR, "fwd", True) == pytest.approx(1.2339e-3)
    g = TR.model_copy(update={"cuda_graph_scope": ("attn", "moe_router", "moe_preprocess")})
    assert md.static_host_s(DS, g, "fwd", True) == pytest.approx(6.9e-6)
    pad = TR.model_copy(update={"moe_pad_expert_input_to_capacity": True})
    assert md.static_host_s(DS.model_copy(update={"moe_capacity_factor": 1.0}), pad, "fwd",
                            True) == 0.0


def test_graph_scope_checked():
    with pytest.raises((SpecError, ValueError), match="moe_preprocess"):
        TrainingSpec(cuda_graph_scope=("moe_preprocess",))
    with pytest.raises((SpecError, ValueError)):
        TrainingSpec(cuda_graph_scope=("moe",))
    assert TrainingSpec(cuda_graph_scope=("attn", "moe_router")).cuda_graph_scope == (
        "attn", "moe_router")


_GPU = load_cluster("dgx-b200").gpu


@settings(max_examples=25, deadline=None)
@given(scope=st.sets(st.sampled_from(["attn", "moe_router"])),
       extra=st.sampled_from(["attn", "moe_router"]),
       flex=st.booleans(), fusion=st.booleans(), ep=st.sampled_from([1, 2, 4, 8]),
       mb=st.sampled_from([1, 4]))
def test_more_graphs_or_flex_never_slower(scope, extra, flex, fusion, ep, mb):
    # graphing one more part, or the flex dispatcher in place of alltoall, only removes host
    # work and launches: the layer's forward and backward never get slower
    def tr(parts, dispatcher):
        parts = set(parts)
        if "moe_router" in parts:
            parts.add("moe_preprocess")
        order = [p for p in ("attn", "moe_router", "moe_preprocess") if p in parts]
        return TR.model_copy(update={"cuda_graph_scope": tuple(order),
                                     "moe_token_dispatcher": dispatcher,
                                     "moe_router_fusion": fusion})
    b = _batch(ep=ep, mb=mb)
    disp = "flex" if flex else "alltoall"
    base = compute_times(QWEN, tr(scope, disp), _GPU, b)
    more = compute_times(QWEN, tr(scope | {extra}, disp), _GPU, b)
    fl = compute_times(QWEN, tr(scope, "flex"), _GPU, b)
    for k in ("layer_fwd_s", "layer_bwd_s"):
        assert more[k][0] <= base[k][0] + 1e-12
        assert fl[k][0] <= base[k][0] + 1e-12
