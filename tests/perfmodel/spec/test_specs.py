"""Spec models and loaders: bad input is a SpecError (or pydantic ValidationError) whose one-line
message names the field and the value; Hugging Face config.json loading; unit conversions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hardware_specs import preset_dir
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import (
    ClusterSpec,
    GPUSpec,
    LinkTier,
    ModelSpec,
    TrainingSpec,
    load_cluster,
    load_gpu,
    load_model,
    load_training,
    model_from_hf_config,
)

# Hugging Face config.json of meta-llama/Llama-2-7b-hf (the keys the loader reads, as published).
LLAMA2_7B_HF = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
# openai-community/gpt2 config.json (GPT-2 small, 124M).
GPT2_HF = {
    "activation_function": "gelu_new",
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}


def _preset_text(kind: str, name: str) -> str:
    return (preset_dir(kind) / f"{name}.toml").read_text()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, f"error message spans lines: {msg!r}"
    return msg


# ------------------------------------------------------------------------------------------
# Typos, bad values, bad files
# ------------------------------------------------------------------------------------------
def test_typo_in_model_file_names_key_and_value(tmp_path):
    text = _preset_text("model", "gpt3-125m").replace("num_layers = 12", "num_layer = 12")
    with pytest.raises(SpecError) as err:
        load_model(_write(tmp_path, "typo.toml", text))
    msg = _one_line(err)
    assert "unknown key 'num_layer'" in msg and "12" in msg
    assert "missing key 'num_layers'" in msg and "typo.toml" in msg


def test_typo_in_cluster_tier_names_key(tmp_path):
    text = _preset_text("cluster", "dgx-a100-80g").replace(
        "bw_gbyte_per_s = 300", "bw_gbyte_per_sec = 300"
    )
    with pytest.raises(SpecError) as err:
        load_cluster(_write(tmp_path, "c.toml", text))
    assert ("tier 0 (NVLink 'nvlink3'): unknown key 'bw_gbyte_per_sec' (value 300)"
            in _one_line(err))
    assert "did you mean 'bw_gbyte_per_s'?" in _one_line(err)


def test_typo_in_gpu_file(tmp_path):
    text = _preset_text("gpu", "a100-sxm4-80gb").replace("hbm_gib", "hbm_gb")
    with pytest.raises(SpecError, match=r"unknown key 'hbm_gb' \(value 80\)"):
        load_gpu(_write(tmp_path, "g.toml", text))


def test_negative_bandwidth_names_field_and_value(tmp_path):
    text = _preset_text("cluster", "dgx-a100-80g").replace(
        "bw_gbit_per_s = 200", "bw_gbit_per_s = -200"
    )
    with pytest.raises(SpecError) as err:
        load_cluster(_write(tmp_path, "c.toml", text))
    msg = _one_line(err)
    assert "tier 1 (InfiniBand 'hdr-ib'): bw_gbit_per_s = -200" in msg and "greater than 0" in msg


def test_negative_values_rejected_everywhere():
    with pytest.raises(ValidationError, match="hbm_tbyte_per_s"):
        GPUSpec(
            name="g",
            peak_tflops={"fp32": 1, "tf32": 1, "bf16": 1, "fp16": 1},
            hbm_gib=1,
            hbm_tbyte_per_s=-1,
        )
    with pytest.raises(ValidationError, match="latency_us"):
        LinkTier(name="t", kind="nvlink", bw_gbyte_per_s=1, latency_us=-1)
    with pytest.raises(ValidationError, match="oversubscription"):
        LinkTier(name="t", kind="nvlink", bw_gbyte_per_s=1, oversubscription=0.5)


def test_tier_needs_exactly_one_bandwidth():
    with pytest.raises(
        ValidationError, match=r"give exactly one of bw_gbyte_per_s or bw_gbit_per_s"
    ):
        LinkTier(name="t", kind="infiniband", bw_gbyte_per_s=25, bw_gbit_per_s=200)
    with pytest.raises(ValidationError, match=r"got bw_gbyte_per_s=None, bw_gbit_per_s=None"):
        LinkTier(name="t", kind="infiniband")


def test_protocol_efficiency_scales_the_delivered_bandwidth():
    # NCCL over NVLink delivers ~80 % of the line rate (nccl-tests#212): 300 GB/s -> 240 GB/s
    t = LinkTier(name="nvl", kind="nvlink", domain_size=8, bw_gbyte_per_s=300,
                 protocol_efficiency=0.8)
    assert t.bw_bytes_per_s == 300e9
    assert t.effective_bw_bytes_per_s == pytest.approx(240e9)
    # with oversubscription 2 on top: 300 * 0.8 / 2 = 120 GB/s
    t2 = LinkTier(name="ib", kind="infiniband", bw_gbyte_per_s=300, protocol_efficiency=0.8,
                  oversubscription=2)
    assert t2.effective_bw_bytes_per_s == pytest.approx(120e9)
    for bad in (0.0, -0.1, 1.2):
        with pytest.raises(ValidationError, match="protocol_efficiency"):
            LinkTier(name="t", kind="nvlink", bw_gbyte_per_s=1, protocol_efficiency=bad)
    # the A100 / V100 presets carry it, Hopper keeps the line rate
    assert load_cluster("dgx-a100-80g").tiers[0].effective_bw_bytes_per_s == pytest.approx(240e9)
    assert load_cluster("dgx2-v100").tiers[0].effective_bw_bytes_per_s == pytest.approx(120e9)
    assert load_cluster("dgx-h100").tiers[0].effective_bw_bytes_per_s == pytest.approx(450e9)


def test_tier_kind_must_be_known():
    with pytest.raises(ValidationError, match="kind"):
        LinkTier(name="t", kind="carrier-pigeon", bw_gbyte_per_s=1)


def test_tiers_must_nest(tmp_path):
    text = _preset_text("cluster", "dgx-a100-80g").replace(
        'name = "hdr-ib"', 'name = "hdr-ib"\ndomain_size = 12'
    )
    with pytest.raises(
        SpecError,
        match=r"domain_size \(12\) must be a multiple of the inner tier's domain_size \(8\)",
    ):
        load_cluster(_write(tmp_path, "c.toml", text))


def test_only_outermost_tier_may_omit_domain_size():
    gpu = load_gpu("a100-sxm4-80gb")
    tiers = [
        LinkTier(name="a", kind="nvlink", bw_gbyte_per_s=300),
        LinkTier(name="b", kind="infiniband", bw_gbit_per_s=200),
    ]
    with pytest.raises(ValidationError, match="only the outermost tier may omit domain_size"):
        ClusterSpec(name="c", gpu=gpu, gpus_per_node=8, num_nodes=2, tiers=tiers)


def test_cluster_file_total_gpus_and_inline_gpu(tmp_path):
    text = _preset_text("cluster", "dgx-a100-80g").replace("num_nodes = 128", "total_gpus = 64")
    assert load_cluster(_write(tmp_path, "c.toml", text)).num_nodes == 8
    bad = text.replace("total_gpus = 64", "total_gpus = 100")
    with pytest.raises(
        SpecError, match=r"total_gpus \(100\) must be a positive multiple of gpus_per_node \(8\)"
    ):
        load_cluster(_write(tmp_path, "bad.toml", bad))
    gpu_table = _preset_text("gpu", "h100-sxm5-80gb").split("\n[peak_tflops]")
    inline = text.replace('gpu = "a100-sxm4-80gb"\n', "").replace(
        "[[tiers]]",
        "[gpu]\n" + gpu_table[0] + "\n[gpu.peak_tflops]" + gpu_table[1] + "\n[[tiers]]",
        1,
    )
    c = load_cluster(_write(tmp_path, "inline.toml", inline))
    assert c.gpu.name == "H100-SXM5-80GB" and c.total_gpus == 64
    typo = inline.replace("hbm_gib", "hbm_gigs")
    with pytest.raises(SpecError, match=r"\[gpu\].*unknown key 'hbm_gigs'"):
        load_cluster(_write(tmp_path, "typo.toml", typo))


def test_unknown_gpu_in_cluster_file(tmp_path):
    text = _preset_text("cluster", "dgx-a100-80g").replace('"a100-sxm4-80gb"', '"a100-sxm4-80"')
    with pytest.raises(
        SpecError, match=r"unknown gpu preset 'a100-sxm4-80'; closest: a100-sxm4-80gb"
    ):
        load_cluster(_write(tmp_path, "c.toml", text))


def test_unreadable_files(tmp_path):
    with pytest.raises(SpecError, match=r"not valid TOML"):
        load_model(_write(tmp_path, "bad.toml", "num_layers = = 3"))
    with pytest.raises(SpecError, match=r"model file '.*nope.toml' does not exist"):
        load_model(tmp_path / "nope.toml")
    with pytest.raises(SpecError, match=r"not valid JSON"):
        load_model(_write(tmp_path, "config.json", "{not json"))


@pytest.mark.parametrize(
    ("kind", "loader", "typo", "expected"),
    [
        ("model", load_model, "gpt3-175", "gpt3-175b"),
        ("model", load_model, "llama2_70b", "llama2-70b"),
        ("model", load_model, "GPT3-175B", None),  # case-insensitive: loads
        ("cluster", load_cluster, "dgx-a100", "dgx-a100-80g"),
        ("cluster", load_cluster, "dgx-h10", "dgx-h100"),
        ("gpu", load_gpu, "h100", "h100-sxm5-80gb"),
    ],
)
def test_unknown_preset_suggests_closest(kind, loader, typo, expected):
    if expected is None:
        assert loader(typo).name.lower() == typo.lower()
        return
    with pytest.raises(SpecError) as err:
        loader(typo)
    msg = _one_line(err)
    assert msg.startswith(f"unknown {kind} preset '{typo}'; closest: ")
    assert expected in msg.split("closest: ")[1].split(", ")


def test_unknown_preset_without_close_match_lists_known():
    with pytest.raises(SpecError, match=r"unknown model preset 'zzzzzzzz'; known: bloom-176b, "):
        load_model("zzzzzzzz")


def test_training_errors_name_field_and_value():
    with pytest.raises(SpecError, match=r"precision = 'fp9'"):
        load_training(precision="fp9")
    with pytest.raises(SpecError, match=r"global_batch_size = -1"):
        load_training(global_batch_size=-1)
    with pytest.raises(SpecError, match=r"unknown key 'batch'"):
        load_training({"batch": 8})


def test_load_training_sources(tmp_path):
    assert load_training() == TrainingSpec()
    t = load_training(seq_len=4096, precision=None)  # None overrides are ignored
    assert t.seq_len == 4096 and t.precision == "bf16"
    assert t.tokens_per_step == 1536 * 4096
    p = _write(tmp_path, "t.toml", 'global_batch_size = 512\nprecision = "fp8"\n')
    t2 = load_training(p, optimizer="sgd")
    assert (t2.global_batch_size, t2.precision, t2.optimizer) == (512, "fp8", "sgd")
    assert load_training(t2, seq_len=1024).global_batch_size == 512


def test_model_validators_print_operands():
    base = {
        "name": "x",
        "num_layers": 2,
        "hidden_size": 64,
        "ffn_hidden_size": 256,
        "vocab_size": 100,
    }
    with pytest.raises(
        ValidationError, match=r"num_attention_heads \(6\) must divide hidden_size \(64\)"
    ):
        ModelSpec(num_attention_heads=6, **base)
    ModelSpec(num_attention_heads=6, head_dim=16, **base)  # explicit head_dim is fine
    with pytest.raises(
        ValidationError, match=r"num_kv_heads \(3\) must divide num_attention_heads \(8\)"
    ):
        ModelSpec(num_attention_heads=8, num_kv_heads=3, **base)
    with pytest.raises(ValidationError, match=r"moe_top_k \(4\) must be <= num_experts \(2\)"):
        ModelSpec(num_attention_heads=8, num_experts=2, moe_top_k=4, **base)
    with pytest.raises(ValidationError, match="activation"):
        ModelSpec(num_attention_heads=8, activation="tanh", **base)


def test_specs_are_frozen():
    m = load_model("gpt3-125m")
    with pytest.raises(ValidationError):
        m.num_layers = 3
    assert load_model(m) is m


def test_gpu_peak_flops_errors():
    a100 = load_gpu("a100-sxm4-80gb")
    with pytest.raises(
        SpecError, match=r"gpu 'A100-SXM4-80GB' has no fp8 tensor-core rate \(peak_tflops.fp8\)"
    ):
        a100.peak_flops("fp8")
    with pytest.raises(ValueError, match="bf8"):  # not a dtype at all
        a100.peak_flops("bf8")


# ------------------------------------------------------------------------------------------
# Hugging Face config.json
# ------------------------------------------------------------------------------------------
def test_hf_llama2_7b_config(tmp_path):
    d = tmp_path / "Llama-2-7b-hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA2_7B_HF))
    m = load_model(d / "config.json")
    assert m.name == "Llama-2-7b-hf"
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads) == (32, 4096, 32, 32)
    assert (m.activation, m.norm, m.position_embedding) == ("swiglu", "rmsnorm", "rope")
    assert not m.tied_embeddings and not m.linear_bias and m.max_seq_len == 4096
    assert m.param_count() == 6_738_415_616  # HF safetensors total for Llama-2-7b-hf
    assert m.param_count() == load_model("llama2-7b").param_count()


def test_hf_llama_gqa_and_head_dim():
    cfg = dict(LLAMA2_7B_HF, num_key_value_heads=8, head_dim=128, num_attention_heads=32)
    m = model_from_hf_config(cfg, name="gqa")
    assert m.kv_heads == 8 and m.head_size == 128
    # q and out 4096*4096 each, k and v 4096*(8*128) each
    assert m.attention_params_per_layer() == 2 * 4096**2 + 2 * 4096 * 1024


def test_hf_llama31_8b_matches_preset():
    cfg = dict(
        LLAMA2_7B_HF,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
    )
    assert (
        model_from_hf_config(cfg).param_count()
        == load_model("llama3.1-8b").param_count()
        == 8_030_261_248
    )


def test_hf_gpt2_config(tmp_path):
    p = _write(tmp_path, "gpt2.json", json.dumps(GPT2_HF))
    m = load_model(p)
    assert m.name == "gpt2"
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size) == (
        12,
        768,
        12,
        3072,
    )
    assert (m.max_seq_len, m.position_embedding, m.tied_embeddings) == (1024, "learned", True)
    # HF GPT2LMHeadModel: 124,439,808 parameters (tied head, 1024 learned positions).
    assert m.param_count() == 124_439_808


def test_hf_errors(tmp_path):
    with pytest.raises(SpecError, match=r"missing key 'hidden_size'"):
        load_model(_write(tmp_path, "config.json", json.dumps({"num_hidden_layers": 2})))
    with pytest.raises(SpecError, match=r"not a recognised Hugging Face config"):
        load_model(_write(tmp_path, "other.json", json.dumps({"layers": 2})))
    with pytest.raises(SpecError, match=r"hidden_act = 'tanh'"):
        model_from_hf_config(dict(LLAMA2_7B_HF, hidden_act="tanh"))
    with pytest.raises(SpecError, match=r"num_key_value_heads|num_kv_heads \(5\)"):
        model_from_hf_config(dict(LLAMA2_7B_HF, num_key_value_heads=5))


# ------------------------------------------------------------------------------------------
# Units and cluster scaling
# ------------------------------------------------------------------------------------------
def test_units_convert_once():
    t = LinkTier(name="ib", kind="infiniband", bw_gbit_per_s=400, latency_us=5, oversubscription=2)
    assert t.bw_bytes_per_s == 50e9  # 400 Gb/s / 8
    assert t.effective_bw_bytes_per_s == 25e9
    assert t.latency_s == pytest.approx(5e-6)
    g = load_gpu("h100-sxm5-80gb")
    assert g.hbm_bytes == 80 * 1024**3 and g.hbm_bw_bytes_per_s == pytest.approx(3.35e12)


def test_with_gpus():
    c = load_cluster("dgx-a100-80g")
    assert c.with_gpus(16).num_nodes == 2 and c.with_gpus(16).gpus_per_node == 8
    small = c.with_gpus(4)
    assert (small.gpus_per_node, small.num_nodes, small.total_gpus) == (4, 1, 4)
    assert load_cluster("dgx-a100-80g", gpus=2048).total_gpus == 2048
    with pytest.raises(
        SpecError,
        match=r"gpus \(12\) must be a multiple of gpus_per_node \(8\) of cluster 'dgx-a100-80g'",
    ):
        c.with_gpus(12)
    with pytest.raises(SpecError, match=r"gpus \(0\) must be positive"):
        c.with_gpus(0)
    assert c.with_gpus(64).tier_domain_sizes() == [8, 64]
    assert c.with_gpus(64).tiers == c.tiers and c.with_gpus(64).gpu == c.gpu


_SCALABLE = {n: load_cluster(n) for n in ["dgx-h100", "gb200-nvl72", "dgx-v100", "ring8-100gbps"]}


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 4096), name=st.sampled_from(sorted(_SCALABLE)))
def test_with_gpus_property(nodes, name):
    c = _SCALABLE[name]
    s = c.with_gpus(nodes * c.gpus_per_node)
    assert s.total_gpus == nodes * c.gpus_per_node and s.num_nodes == nodes
    assert s.tier_domain_sizes()[-1] == s.total_gpus


@settings(max_examples=60, deadline=None)
@given(gbit=st.floats(0.1, 1e5), over=st.floats(1.0, 16.0))
def test_bit_and_byte_bandwidths_agree(gbit, over):
    a = LinkTier(name="a", kind="ethernet", bw_gbit_per_s=gbit, oversubscription=over)
    b = LinkTier(name="b", kind="ethernet", bw_gbyte_per_s=gbit / 8, oversubscription=over)
    assert a.bw_bytes_per_s == pytest.approx(b.bw_bytes_per_s)
    assert a.effective_bw_bytes_per_s <= a.bw_bytes_per_s


# ------------------------------------------------------------------------------------------
# Parameter counts (hand-computed)
# ------------------------------------------------------------------------------------------
def test_param_count_terms_tiny_gpt():
    # l=2, h=8, a=2, f=32, V=10, s=4, tied, LayerNorm, biases:
    # attention 4*64 + (8+8+8) + 8 = 288; MLP 2*8*32 + 32 + 8 = 552; norms 2*16 = 32
    # layer 872; embeddings 10*8 + 4*8 = 112; final norm 16 -> 112 + 2*872 + 16 = 1872.
    m = ModelSpec(
        name="t",
        num_layers=2,
        hidden_size=8,
        num_attention_heads=2,
        ffn_hidden_size=32,
        vocab_size=10,
        max_seq_len=4,
    )
    assert m.attention_params_per_layer() == 288
    assert m.mlp_params_per_layer() == 552
    assert m.layer_params() == 872
    assert m.param_count() == 1872
    # Megatron's 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) with f = 4h: 1536 + 208 + 112 = 1856,
    # i.e. ours minus the final LayerNorm (2h = 16).
    assert m.param_count() - 2 * 8 == pytest.approx(12 * 2 * 64 * (1 + 13 / 96 + 14 / 192))


def test_param_count_moe_router():
    m = ModelSpec(
        name="moe",
        num_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        ffn_hidden_size=16,
        vocab_size=10,
        activation="swiglu",
        norm="rmsnorm",
        position_embedding="rope",
        tied_embeddings=False,
        linear_bias=False,
        num_experts=4,
        moe_top_k=2,
    )
    # attention 4*64 = 256; 4 experts x 3*8*16 = 1536; router 8*4 = 32; norms 2*8 = 16
    assert m.layer_params() == 256 + 1536 + 32 + 16
    assert m.param_count() == 10 * 8 + 1840 + 8 + 10 * 8


# ---------------------------------------------------------------------------------------------
# Strict types where files are read: no silent coercion, the field is named
# ---------------------------------------------------------------------------------------------
_CLUSTER_TOML = """
name = "c"
gpu = "a100-sxm4-80gb"
gpus_per_node = {gpn}
num_nodes = {nodes}
[[tiers]]
name = "nvlink"
kind = "nvlink"
domain_size = 8
bw_gbyte_per_s = 300
[[tiers]]
name = "ib"
kind = "infiniband"
bw_gbit_per_s = 200
"""


@pytest.mark.parametrize(
    "gpn, nodes, needle",
    [("true", "4", "gpus_per_node = True"), ("8", '"128"', "num_nodes = '128'"),
     ("8.0", "4", "gpus_per_node = 8.0"), ("8", "false", "num_nodes = False")],
)
def test_cluster_file_wrong_types_refused_naming_the_field(tmp_path, gpn, nodes, needle):
    f = tmp_path / "c.toml"
    f.write_text(_CLUSTER_TOML.format(gpn=gpn, nodes=nodes))
    with pytest.raises(SpecError) as ei:
        load_cluster(f)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_cluster_file_right_types_still_load(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(_CLUSTER_TOML.format(gpn="8", nodes="4"))
    assert load_cluster(f).total_gpus == 32


def test_total_gpus_bool_refused(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(_CLUSTER_TOML.format(gpn="8", nodes="4").replace("num_nodes = 4", "total_gpus = true"))
    with pytest.raises(SpecError, match="total_gpus"):
        load_cluster(f)


@pytest.mark.parametrize(
    "patch, needle",
    [({"n_embd": "768"}, "n_embd = '768'"), ({"n_layer": 12.0}, "n_layer = 12.0"),
     ({"n_head": True}, "n_head = True"), ({"tie_word_embeddings": "false"},
                                           "tie_word_embeddings = 'false'")],
)
def test_hf_config_wrong_types_refused_naming_the_key(tmp_path, patch, needle):
    cfg = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, **patch}))
    with pytest.raises(SpecError) as ei:
        load_model(f)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_training_and_model_dicts_strict():
    with pytest.raises(SpecError, match="global_batch_size = '64'"):
        load_training({"global_batch_size": "64"})
    with pytest.raises(SpecError, match="seq_len = True"):
        load_training(seq_len=True)


def test_tier_bandwidth_below_a_kilobyte_per_second_refused(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(_CLUSTER_TOML.format(gpn="8", nodes="4").replace("bw_gbit_per_s = 200",
                                                                  "bw_gbit_per_s = 1e-300"))
    with pytest.raises(SpecError, match="bw_gbit_per_s = 1e-300"):
        load_cluster(f)
