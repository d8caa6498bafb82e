"""MoE / MLA launch flags."""

import argparse

import pytest

from emit.launch import emit
from emit.moe import megatron_bridge_moe_overrides, megatron_moe_args
from perfmodel.parallel.config import ParallelConfig
from perfmodel.spec.specs import load_model, load_training
from tests.emit import megatron_lm_schema

TR = load_training(global_batch_size=2048, seq_len=4096)


def test_megatron_moe_and_mla_flags_deepseek():
    m = load_model("deepseek-v3")
    cfg = ParallelConfig(dp=64, tp=1, pp=4, ep=64, etp=1, num_microbatches=32)
    args = megatron_moe_args(cfg, m, TR)
    for flag in ("--num-experts 256", "--moe-router-topk 8", "--moe-ffn-hidden-size 2048",
                 "--expert-model-parallel-size 64", "--expert-tensor-parallel-size 1",
                 "--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm",
                 "--moe-layer-freq ([0]*3+[1]*58)", "--moe-shared-expert-intermediate-size 2048",
                 "--multi-latent-attention", "--q-lora-rank 1536", "--kv-lora-rank 512",
                 "--qk-pos-emb-head-dim 64", "--v-head-dim 128"):
        assert flag in args, flag
    text = emit("megatron", cfg, m, TR)
    assert "--expert-model-parallel-size 64" in text.splitlines()  # one argument a line
    bridge = emit("bridge", cfg, m, TR)
    assert "expert_model_parallel_size: 64" in bridge and "num_moe_experts: 256" in bridge
    assert "model.expert_model_parallel_size=64" in megatron_bridge_moe_overrides(cfg, m, TR)


def test_dense_model_has_no_moe_flags_and_torchtitan_ep():
    assert megatron_moe_args(ParallelConfig(dp=8), load_model("llama2-7b"), TR) == []
    cfg = ParallelConfig(dp=8, ep=8, etp=1)
    toml = emit("torchtitan", cfg, load_model("mixtral-8x7b"), TR)
    assert "expert_parallel_degree = 8" in toml and "expert_tensor_parallel_degree = 1" in toml
    llama4 = load_model("mixtral-8x7b").model_copy(update={"moe_layer_freq": 2})
    assert "--moe-layer-freq (([0]*1+[1])*16)" in " ".join(megatron_moe_args(cfg, llama4, TR))


def test_moe_layer_freq_survives_the_usage_line(tmp_path):
    """`$(grep -v '^#' megatron.args)` keeps quotes in the words: the pattern is written as one
    unquoted word, which Megatron-LM's moe_freq_type reads; a quoted one it rejects."""
    m = load_model("deepseek-v3")
    cfg = ParallelConfig(dp=64, tp=1, pp=4, ep=64, etp=1, num_microbatches=32)
    text = emit("megatron", cfg, m, TR)
    (tmp_path / "0").write_text("")  # a file a bare [0,...] glob would expand to
    assert megatron_lm_schema.parse(text, tmp_path).moe_layer_freq == [0] * 3 + [1] * 58
    quoted = text.replace("([0]*3+[1]*58)", '"([0]*3+[1]*58)"')
    with pytest.raises(argparse.ArgumentError, match="moe-layer-freq"):
        megatron_lm_schema.parse(quoted, tmp_path)
