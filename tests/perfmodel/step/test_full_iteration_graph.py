"""Full-iteration CUDA graphs (``TrainingSpec.cuda_graph_full_iteration``,
:func:`perfmodel.compute.layer.full_iteration_graphed`): the host launches one graph per step, not
its kernels, where nothing in the step syncs the host (MoE: token drop padded to capacity)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.compute import layer as pc
from perfmodel.compute.layer import compute_times, full_iteration_graphed, graph_launch_cost_s
from perfmodel.parallel.config import ConfigBatch, ParallelConfig
from perfmodel.spec.specs import load_cluster, load_model, load_training

TR = load_training(global_batch_size=256, seq_len=4096)
QWEN = load_model("qwen3-30b-a3b")
PADDED = QWEN.model_copy(update={"moe_capacity_factor": 1.0})
TD = TR.model_copy(update={"moe_pad_expert_input_to_capacity": True})
FULL = TD.model_copy(update={"cuda_graph_full_iteration": True})
GPU = load_cluster("dgx-b200").gpu


def _batch(ep=8, mb=1):
    return ConfigBatch.from_configs([ParallelConfig(dp=8, tp=1, pp=1, ep=ep, etp=1,
                                                    micro_batch_size=mb, num_microbatches=4)])


def test_graphed_only_without_a_host_sync():
    assert full_iteration_graphed(PADDED, FULL)  # 25.09 Qwen3-30B B200: token drop, padded
    assert not full_iteration_graphed(QWEN, FULL)  # dropless: the token counts sync the host
    assert not full_iteration_graphed(PADDED, TD)  # no graph asked for
    assert full_iteration_graphed(load_model("llama2-7b"), TR.model_copy(
        update={"cuda_graph_full_iteration": True}))  # dense: nothing syncs


def test_launch_cost_by_hand():
    assert graph_launch_cost_s(GPU, PADDED, FULL) == (0.0, 0.0)
    # otherwise the fitted per-kernel host costs (17 / 38 us on the H200 fit)
    assert graph_launch_cost_s(GPU, QWEN, FULL) == (pc.CPU_FWD_LAUNCH_S, pc.CPU_BWD_LAUNCH_S)
    assert graph_launch_cost_s(GPU, PADDED, TD) == pc.launch_cost_s(GPU)
    # with no host side the phase is its device time: the smooth max of (2 ms, 0) is 2 ms
    assert pc._overlap_s(np.array([2e-3]), np.array([0.0]))[0] == pytest.approx(2e-3)


def test_launch_bound_layer_loses_its_launch_time():
    # Qwen3-30B at micro-batch 1 on B200: the backward is launch-bound (~3.4 ms of launches
    # over ~2.8 ms of device and per-expert time); replayed as a graph it is the device side
    t_eager = compute_times(PADDED, TD, GPU, _batch())
    t_graph = compute_times(PADDED, FULL, GPU, _batch())
    assert t_graph["layer_bwd_s"][0] < 0.95 * t_eager["layer_bwd_s"][0]
    assert t_graph["layer_fwd_s"][0] <= t_eager["layer_fwd_s"][0] + 1e-12


@settings(max_examples=15, deadline=None)
@given(ep=st.sampled_from([1, 2, 8]), mb=st.sampled_from([1, 2, 4]))
def test_full_graph_never_slower_and_no_op_when_dropless(ep, mb):
    b = _batch(ep=ep, mb=mb)
    eager, graph = compute_times(PADDED, TD, GPU, b), compute_times(PADDED, FULL, GPU, b)
    drop_eager = compute_times(QWEN, TR, GPU, b)
    drop_graph = compute_times(QWEN, TR.model_copy(update={"cuda_graph_full_iteration": True}),
                               GPU, b)
    for k in ("layer_fwd_s", "layer_bwd_s", "embed_fwd_s", "logits_bwd_s"):
        assert graph[k][0] <= eager[k][0] + 1e-12, k
        assert drop_graph[k][0] == drop_eager[k][0], k


def test_emitted_only_where_it_is_captured():
    from emit.moe import megatron_bridge_moe_fields, megatron_moe_args

    cfg = ParallelConfig(dp=8, tp=1, pp=1, ep=8, etp=1, micro_batch_size=1, num_microbatches=4)
    args = " ".join(megatron_moe_args(cfg, PADDED, FULL))
    assert "--cuda-graph-impl local --cuda-graph-scope full_iteration" in args
    assert megatron_bridge_moe_fields(cfg, PADDED, FULL)["cuda_graph_scope"] == "full_iteration"
    assert "full_iteration" not in " ".join(megatron_moe_args(cfg, QWEN, FULL))
