"""Launch settings: what each format writes for a plan, and what it refuses (no framework
packages needed; tests/emit/test_emit_frameworks.py reads them with the frameworks' own code)."""

import json
import tomllib

import pytest

from emit.launch import emit, refusals, stage_layers
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ParallelConfig
from tests.emit.emit_plans import load_plan


def _flags(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        k, *v = line.split(maxsplit=1)
        out[k] = v[0] if v else True
    return out


def test_stage_layers_even_uneven_interleaved():
    _, m, _ = load_plan("llama405b-uneven")  # 126 layers
    assert stage_layers(ParallelConfig(pp=4), m) == [31, 32, 32, 31]  # ceil(126/4)=32 inside
    assert stage_layers(ParallelConfig(pp=4, vp=2, schedule="interleaved"), m) == [
        15, 16, 16, 16, 16, 16, 16, 15]  # ceil(126/8)=16, (126-96)/2 = 15 at the ends
    assert stage_layers(ParallelConfig(pp=2), m) == [63, 63]
    _, gpt, _ = load_plan("gpt3-zero1-interleaved")
    assert stage_layers(ParallelConfig(pp=8, vp=2, schedule="interleaved"), gpt) == [6] * 16


def test_megatron_gpt_interleaved_zero1():
    c, m, t = load_plan("gpt3-zero1-interleaved")
    f = _flags(emit("megatron", c, m, t))
    assert f["--tensor-model-parallel-size"] == "8" and f["--pipeline-model-parallel-size"] == "8"
    assert f["--num-layers-per-virtual-pipeline-stage"] == "6"  # 96 / (8*2)
    assert f["--use-distributed-optimizer"] is True and f["--sequence-parallel"] is True
    assert f["--recompute-granularity"] == "selective" and f["--recompute-modules"] == "core_attn"
    assert f["--global-batch-size"] == "1536" and f["--micro-batch-size"] == "1"
    assert f["--position-embedding-type"] == "learned_absolute"
    assert "--untie-embeddings-and-output-weights" not in f and "--swiglu" not in f


def test_megatron_llama_architecture_and_qkv_bias():
    c, m, t = load_plan("llama-cp")
    f = _flags(emit("megatron", c, m, t))
    assert f["--rotary-base"] == "500000" and f["--num-query-groups"] == "8"
    assert f["--group-query-attention"] is True and f["--swiglu"] is True
    assert f["--normalization"] == "RMSNorm" and f["--disable-bias-linear"] is True
    assert f["--context-parallel-size"] == "4"
    assert "--add-qkv-bias" not in f
    qwen = m.model_copy(update={"qkv_bias": True})
    assert _flags(emit("megatron", c, qwen, t))["--add-qkv-bias"] is True


def test_megatron_uneven_stages():
    c, m, t = load_plan("llama405b-uneven")
    f = _flags(emit("megatron", c, m, t))
    assert f["--decoder-first-pipeline-num-layers"] == "31"
    assert f["--decoder-last-pipeline-num-layers"] == "31"
    c, m, t = load_plan("llama405b-uneven-interleaved")
    f = _flags(emit("megatron", c, m, t))
    assert f["--pipeline-model-parallel-layout"] == "E,t*15|" + "t*16|" * 6 + "t*15,L"


def test_megatron_zero3_is_megatron_fsdp_and_fp8_recipe():
    c, m, t = load_plan("llama-zero3")
    f = _flags(emit("megatron", c, m, t))
    assert f["--use-megatron-fsdp"] is True
    assert f["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert f["--recompute-granularity"] == "full"
    c, m, t = load_plan("llama-fp8")
    f = _flags(emit("megatron", c, m, t))
    assert (f["--fp8-format"], f["--fp8-recipe"], f["--bf16"]) == ("hybrid", "delayed", True)


def test_bridge_yaml_sections():
    c, m, t = load_plan("llama-fp8")
    text = emit("bridge", c, m, t)
    assert 'mixed_precision: "bf16_with_fp8_delayed_scaling_mixed"' in text
    assert "  pipeline_model_parallel_size: 8\n" in text
    assert "  rotary_base: 500000.0\n" in text and "  num_query_groups: 8\n" in text
    assert text.count("use_distributed_optimizer: true") == 2  # ddp and optimizer agree


def test_torchtitan_zero3_selective_and_stage_split():
    c, m, t = load_plan("llama-zero3")
    doc = tomllib.loads(emit("torchtitan", c, m, t))
    par = doc["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (64, 1)
    assert par["fsdp_reshard_after_forward"] == "always"
    assert doc["training"]["local_batch_size"] == 4  # 256 / 64
    assert doc["model"] == {"name": "llama3", "flavor": "8B"}
    c, m, t = load_plan("llama-zero3-pp")
    doc = tomllib.loads(emit("torchtitan", c, m, t))
    parts = doc["parallelism"]["module_fqns_per_model_part"]
    assert len(parts) == 4 and parts[0][:2] == ["tok_embeddings", "layers.0"]
    assert parts[-1][-2:] == ["norm", "output"] and sum(len(p) for p in parts) == 80 + 3
    sel = ParallelConfig(dp=32, tp=2, sequence_parallel=True, recompute="selective")
    doc = tomllib.loads(emit("torchtitan", sel, m, t))
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_deepspeed_json_batch_rule():
    c, m, t = load_plan("llama-zero3")
    doc = json.loads(emit("deepspeed", c, m, t))
    assert doc["zero_optimization"]["stage"] == 3
    assert (doc["train_batch_size"], doc["train_micro_batch_size_per_gpu"],
            doc["gradient_accumulation_steps"]) == (256, 1, 4)  # 256 = 1 * 4 * 64


def test_refusals_name_the_reason():
    c, m, t = load_plan("llama-zero3-pp")
    with pytest.raises(SpecError, match="deepspeed cannot run this plan: .*ZeRO-3 with pipeline"):
        emit("deepspeed", c, m, t)
    c, m, t = load_plan("gpt3-zero1-interleaved")
    assert any("no ZeRO-1" in w for w in refusals("torchtitan", c, m, t))
    zb = c.model_copy(update={"vp": 1, "schedule": "zb"})
    assert any("'zb' pipeline schedule" in w for w in refusals("megatron", zb, m, t))
    c, m, t = load_plan("llama-fp8")
    assert any("fp8-delayed" in w for w in refusals("torchtitan", c, m, t))


def test_framework_of_the_same_stack_is_used():
    c, m, t = load_plan("llama405b-uneven")
    assert refusals("megatron", c, m, t) == []
    assert any("evenly" in w for w in refusals("megatron", c, m, t, framework="nemo-24.07"))


def test_unknown_format():
    c, m, t = load_plan("llama-zero3")
    with pytest.raises(SpecError, match="expected one of"):
        emit("nemo", c, m, t)


@pytest.mark.parametrize("precision, recipe", [("fp8", "delayed"), ("fp8-cs", "tensorwise"),
                                               ("fp8-delayed", "delayed")])
def test_megatron_writes_the_planned_fp8_recipe(precision, recipe):
    """The recipe the plan was priced with is the one emitted (fp8-cs is current scaling,
    Megatron's ``--fp8-recipe tensorwise``; plain fp8 is delayed scaling)."""
    c, m, t = load_plan("llama-fp8")
    f = _flags(emit("megatron", c, m, t.model_copy(update={"precision": "fp8",
                    "low_precision_recipe": {"fp8": None}.get(precision, precision)})))
    assert f["--fp8-format"] == "hybrid" and f["--fp8-recipe"] == recipe


def test_cp_comm_a2a_is_emitted_and_p2p_left_to_the_default():
    """Ulysses: Megatron-LM's ``--cp-comm-type a2a``, Bridge's ``model.cp_comm_type``; the
    ring is both frameworks' default and is not written."""
    c, m, t = load_plan("llama-cp-a2a")
    assert "--cp-comm-type a2a" in emit("megatron", c, m, t)
    assert 'cp_comm_type: "a2a"' in emit("bridge", c, m, t)
    c, m, t = load_plan("llama-cp")
    assert "cp-comm-type" not in emit("megatron", c, m, t)
    assert "cp_comm_type" not in emit("bridge", c, m, t)
    c, m, t = load_plan("llama-cp-a2a")
    why = [w for w in refusals("deepspeed", c, m, t) if "Ulysses" in w]
    assert len(why) == 1 and len(why[0].splitlines()) == 1


def test_cp_comm_allgather_and_hierarchical_are_emitted():
    """The K/V all-gather as Transformer Engine names it (``all_gather``: Megatron-Core passes
    ``cp_comm_type`` through to ``attn_forward_func_with_cp``, which rejects ``allgather``);
    ``a2a+p2p`` with its hierarchical sizes, the all-to-all group first."""
    c, m, t = load_plan("llama-cp-allgather")
    assert "--cp-comm-type all_gather" in emit("megatron", c, m, t)
    assert 'cp_comm_type: "all_gather"' in emit("bridge", c, m, t)
    c, m, t = load_plan("llama-cp-hier")
    text = emit("megatron", c, m, t)
    assert "--cp-comm-type a2a+p2p" in text
    assert "--hierarchical-context-parallel-sizes 4 2" in text
    y = emit("bridge", c, m, t)
    assert 'cp_comm_type: "a2a+p2p"' in y and "hierarchical_context_parallel_sizes: [4, 2]" in y
    # without its sizes the plan cannot be written: one line
    bare = c.model_copy(update={"cp_a2a": None})
    why = refusals("megatron", bare, m, t)
    assert len(why) == 1 and "hierarchical sizes" in why[0] and len(why[0].splitlines()) == 1
