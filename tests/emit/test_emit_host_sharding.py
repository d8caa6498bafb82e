"""Launch settings of offload and HSDP: DeepSpeed offload_optimizer / offload_param, Megatron
--optimizer-cpu-offload / --optimizer-offload-fraction, Bridge's optimizer section, torchtitan's
replicate / shard degrees."""

import json

from emit.launch import bridge_yaml, deepspeed_json, megatron_args, torchtitan_toml
from perfmodel.parallel.config import ParallelConfig
from perfmodel.spec.specs import load_model, load_training
from tests.emit.megatron_lm_schema import parse

LLAMA = load_model("llama3.1-8b")
OFF = load_training(global_batch_size=64, seq_len=2048, offload=("optimizer", "params"),
                    optimizer_offload_fraction=0.5, hsdp_shard=8)


def test_deepspeed_offload_sections():
    z3 = json.loads(deepspeed_json(ParallelConfig(dp=32, zero_stage=3), LLAMA, OFF))
    zero = z3["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    z2 = json.loads(deepspeed_json(ParallelConfig(dp=32, zero_stage=2), LLAMA, OFF))
    assert "offload_param" not in z2["zero_optimization"]  # ZeRO-3 only
    plain = load_training(global_batch_size=64, seq_len=2048)
    z3 = json.loads(deepspeed_json(ParallelConfig(dp=32, zero_stage=3), LLAMA, plain))
    assert "offload_optimizer" not in z3["zero_optimization"]


def test_megatron_optimizer_offload_flags_parse(tmp_path):
    args = parse(megatron_args(ParallelConfig(dp=8, zero_stage=1), LLAMA, OFF), tmp_path)
    assert args.optimizer_cpu_offload and args.optimizer_offload_fraction == 0.5
    assert "optimizer_cpu_offload: true" in bridge_yaml(ParallelConfig(dp=8, zero_stage=1),
                                                        LLAMA, OFF)


def test_torchtitan_hsdp_degrees():
    text = torchtitan_toml(ParallelConfig(dp=32, zero_stage=3), LLAMA, OFF)
    assert "data_parallel_replicate_degree = 4" in text
    assert "data_parallel_shard_degree = 8" in text
    plain = load_training(global_batch_size=64, seq_len=2048)
    text = torchtitan_toml(ParallelConfig(dp=32, zero_stage=3), LLAMA, plain)
    assert "data_parallel_replicate_degree = 1" in text
