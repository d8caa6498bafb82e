"""The emitted Megatron flags follow the dispatcher switches the plan assumes."""

from emit.moe import megatron_bridge_moe_fields, megatron_moe_args
from perfmodel.parallel.config import ParallelConfig
from perfmodel.spec.specs import TrainingSpec, load_model

DS = load_model("deepseek-v3")
CFG = ParallelConfig(dp=64, tp=1, pp=4, ep=64, etp=1)


def test_flex_hybridep_with_partial_graphs():
    t = TrainingSpec(moe_token_dispatcher="flex", moe_flex_backend="hybridep",
                     cuda_graph_scope=("attn", "moe_router", "moe_preprocess"))
    args = megatron_moe_args(CFG, DS, t)
    assert "--moe-token-dispatcher-type flex" in args
    assert "--moe-flex-dispatcher-backend hybridep" in args
    assert "--moe-router-fusion" in args
    assert "--cuda-graph-impl transformer_engine" in args
    assert "--cuda-graph-scope attn moe_router moe_preprocess" in args
    f = megatron_bridge_moe_fields(CFG, DS, t)
    assert f["moe_flex_dispatcher_backend"] == "hybridep"
    assert f["cuda_graph_scope"] == ["attn", "moe_router", "moe_preprocess"]
    assert f["cuda_graph_impl"] == "transformer_engine" and f["moe_router_fusion"] is True


def test_alltoall_without_graphs_or_fusion_prints_none_of_them():
    t = TrainingSpec(moe_router_fusion=False)
    args = " ".join(megatron_moe_args(CFG, DS, t))
    assert "--moe-token-dispatcher-type alltoall" in args
    for flag in ("--moe-flex-dispatcher-backend", "--cuda-graph", "--moe-router-fusion"):
        assert flag not in args
    assert "cuda_graph_scope" not in megatron_bridge_moe_fields(CFG, DS, t)


def test_pad_flag_only_when_the_plan_pads():
    capped = DS.model_copy(update={"moe_capacity_factor": 1.0})
    drop = " ".join(megatron_moe_args(CFG, capped, TrainingSpec()))
    assert "--moe-expert-capacity-factor 1.0" in drop
    assert "--moe-pad-expert-input-to-capacity" not in drop
    pad = TrainingSpec(moe_pad_expert_input_to_capacity=True)
    assert "--moe-pad-expert-input-to-capacity" in megatron_moe_args(CFG, capped, pad)


def test_result_setup_carries_the_switches_to_the_emitter():
    # a plan under a framework that sets the dispatcher switches records them in its setup,
    # and the launch config rebuilt from that setup prints them (emit.launch.training_from_setup)
    from emit.launch import training_from_setup

    t = TrainingSpec(moe_token_dispatcher="flex", moe_flex_backend="hybridep",
                     cuda_graph_scope=("attn", "moe_router", "moe_preprocess"),
                     overlap_moe_comm=True)
    setup = {"global_batch_size": t.global_batch_size, "seq_len": t.seq_len,
             "training_switches": {k: getattr(t, k) for k in (
                 "moe_token_dispatcher", "moe_flex_backend", "moe_router_fusion",
                 "cuda_graph_scope", "overlap_moe_comm")}}
    back = training_from_setup(setup)
    assert (back.moe_token_dispatcher, back.moe_flex_backend, back.cuda_graph_scope,
            back.overlap_moe_comm) == ("flex", "hybridep", ("attn", "moe_router",
                                                            "moe_preprocess"), True)


def test_plan_records_the_framework_switches():
    from search.api import plan

    r = plan("qwen3-30b-a3b", "dgx-b200", gpus=8, global_batch_size=64, seq_len=4096,
             framework="bridge-26.02", top=1, tp=1, pp=1, ep=8)
    sw = r.setup["training_switches"]
    assert sw["moe_token_dispatcher"] == "flex" and sw["moe_flex_backend"] == "hybridep"
    assert tuple(sw["cuda_graph_scope"]) == ("attn", "moe_router", "moe_preprocess")
