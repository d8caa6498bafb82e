"""Emitted launch settings parse and carry the chosen degrees."""

import json
import tomllib

import pytest

from perfmodel.config import ParallelConfig, resolve_config
from perfmodel.specs import load_model, load_training
from search.emit import emit


@pytest.fixture
def setup():
    model = load_model("gpt3-175b")
    training = load_training(global_batch_size=1536, seq_len=2048, precision="bf16")
    cfg = ParallelConfig(dp=16, tp=8, pp=8, vp=2, schedule="interleaved", zero_stage=1,
                         micro_batch_size=1, recompute="selective", sequence_parallel=True)
    return resolve_config(cfg, model, training), model, training


def test_torchtitan_toml_parses(setup):
    cfg, model, training = setup
    doc = tomllib.loads(emit("torchtitan", cfg, model, training))
    par = doc["parallelism"]
    assert par["tensor_parallel_degree"] == 8
    assert par["pipeline_parallel_degree"] == 8
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == 16
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 1
    assert doc["training"]["global_batch_size"] == 1536
    assert doc["training"]["local_batch_size"] == 96  # 1536 / 16
    assert doc["activation_checkpoint"]["mode"] == "selective"


def test_torchtitan_zero3_is_fsdp(setup):
    _, model, training = setup
    cfg = resolve_config(ParallelConfig(dp=128, tp=8, zero_stage=3), model, training)
    par = tomllib.loads(emit("torchtitan", cfg, model, training))["parallelism"]
    assert par["data_parallel_shard_degree"] == 128
    assert par["data_parallel_replicate_degree"] == 1
    assert par["fsdp_reshard_after_forward"] == "always"


def test_deepspeed_json_parses(setup):
    cfg, model, training = setup
    doc = json.loads(emit("deepspeed", cfg, model, training))
    assert doc["train_batch_size"] == 1536
    assert doc["train_micro_batch_size_per_gpu"] == 1
    assert doc["gradient_accumulation_steps"] == 96
    assert doc["zero_optimization"]["stage"] == 1
    assert doc["tensor_parallel"]["autotp_size"] == 8
    assert doc["bf16"]["enabled"] is True
    # train_batch_size = micro * accumulation * dp (DeepSpeed's own consistency rule)
    assert doc["train_batch_size"] == 1 * 96 * 16


def test_megatron_args(setup):
    cfg, model, training = setup
    text = emit("megatron", cfg, model, training)
    flags = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        parts = line.rstrip(" \\").split()
        flags[parts[0]] = parts[1] if len(parts) > 1 else True
    assert flags["--tensor-model-parallel-size"] == "8"
    assert flags["--pipeline-model-parallel-size"] == "8"
    assert flags["--num-layers-per-virtual-pipeline-stage"] == "6"  # 96 / (8*2)
    assert flags["--micro-batch-size"] == "1"
    assert flags["--global-batch-size"] == "1536"
    assert flags["--sequence-parallel"] is True
    assert flags["--use-distributed-optimizer"] is True
    assert flags["--recompute-granularity"] == "selective"
    assert "d=16" in text


def test_unknown_format(setup):
    from perfmodel.specs import SpecError

    cfg, model, training = setup
    with pytest.raises(SpecError, match="expected one of"):
        emit("nemo", cfg, model, training)
