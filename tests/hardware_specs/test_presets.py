"""Every shipped preset loads and validates; parameter counts match the published sizes; a few
numbers are checked by hand against their datasheets and papers."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from hardware_specs import calibration_dir, find_preset, list_presets, preset_dir
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import ClusterSpec, GPUSpec, ModelSpec, load_cluster, load_gpu, load_model

GPUS = list_presets("gpu")
CLUSTERS = list_presets("cluster")
MODELS = list_presets("model")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "presets.md"

# Names other tools (CLI, README, users) refer to; they must never disappear.
REQUIRED = {
    "gpu": [
        "v100-sxm2-32gb",
        "a100-sxm4-40gb",
        "a100-sxm4-80gb",
        "h100-sxm5-80gb",
        "h200-sxm-141gb",
        "b200",
        "gb200",
        "gb300",
        "mi300x",
    ],
    "cluster": [
        "dgx-v100",
        "dgx-a100-40g",
        "dgx-a100-80g",
        "dgx-h100",
        "dgx-h200",
        "dgx-b200",
        "gb200-nvl72",
        "gb300-nvl72",
        "ethernet-a100",
        "ring8-100gbps",
    ],
    "model": [
        "gpt3-125m",
        "gpt3-350m",
        "gpt3-760m",
        "gpt3-1.3b",
        "gpt3-2.7b",
        "gpt3-6.7b",
        "gpt3-13b",
        "gpt3-175b",
        "megatron-1.7b",
        "megatron-3.6b",
        "megatron-7.5b",
        "megatron-18b",
        "megatron-39b",
        "megatron-76b",
        "megatron-145b",
        "megatron-310b",
        "megatron-530b",
        "megatron-1t",
        "bloom-176b",
        "opt-175b",
        "mt-nlg-530b",
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3.1-8b",
        "llama3.1-70b",
        "llama3.1-405b",
        "nemotron4-15b",
        "nemotron4-340b",
    ],
}


# ------------------------------------------------------------------------------------------
# Listing and loading
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gpu", "cluster", "model"])
def test_list_presets_holds_every_required_name(kind):
    names = list_presets(kind)
    assert names, f"no {kind} presets shipped"
    assert names == sorted(names)
    missing = sorted(set(REQUIRED[kind]) - set(names))
    assert not missing, f"missing {kind} presets: {missing}"


@pytest.mark.parametrize("kind", ["gpu", "cluster", "model"])
def test_preset_file_names_are_lower_case_with_dashes(kind):
    for name in list_presets(kind):
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", name), name
        assert find_preset(kind, name) == preset_dir(kind) / f"{name}.toml"


@pytest.mark.parametrize("name", GPUS)
def test_gpu_preset_loads(name):
    gpu = load_gpu(name)
    assert isinstance(gpu, GPUSpec)
    p = gpu.peak_tflops
    # Tensor rates never below the plain fp32 rate; halving precision never lowers the rate.
    assert p.tf32 >= p.fp32 and p.bf16 >= p.tf32 and p.fp16 >= p.bf16
    if not name.startswith("v100"):  # Volta: fp16 tensor cores only (see its file)
        assert p.fp16 == p.bf16
    if p.fp8 is not None:
        assert p.fp8 >= p.bf16
    if p.fp4 is not None:
        assert p.fp8 is not None and p.fp4 >= p.fp8
    assert 16 <= gpu.hbm_gib <= 512 and 0.5 <= gpu.hbm_tbyte_per_s <= 20
    if gpu.calibration is not None:
        assert calibration_dir(gpu.calibration) is not None


@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_preset_loads_and_scales(name):
    c = load_cluster(name)
    assert isinstance(c, ClusterSpec) and isinstance(c.gpu, GPUSpec)
    assert c.total_gpus == c.gpus_per_node * c.num_nodes
    sizes = c.tier_domain_sizes()
    assert sizes == sorted(sizes) and sizes[-1] == c.total_gpus
    assert all(t.bw_bytes_per_s > 0 and t.latency_s >= 0 for t in c.tiers)
    # Inner tiers are at least as fast as outer ones.
    bws = [t.bw_bytes_per_s for t in c.tiers]
    assert bws == sorted(bws, reverse=True)
    bigger = load_cluster(name, gpus=4 * c.gpus_per_node)
    assert bigger.total_gpus == 4 * c.gpus_per_node and bigger.gpus_per_node == c.gpus_per_node
    one = load_cluster(name, gpus=1)
    assert one.total_gpus == 1


@pytest.mark.parametrize("name", MODELS)
def test_model_preset_loads(name):
    m = load_model(name)
    assert isinstance(m, ModelSpec)
    assert m.published_params is not None and m.source, f"{name}: published_params and source"
    assert m.num_attention_heads * m.head_size == m.hidden_size or m.head_dim is not None


def _printed_half_unit(published: float) -> float:
    """Half a unit of the last digit the source printed, e.g. 1.7e9 ("1.7 B") -> 0.05e9."""
    text = repr(published / 1e9).rstrip("0").rstrip(".")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** (-decimals) * 1e9


@pytest.mark.parametrize("name", MODELS)
def test_param_count_matches_published_within_2_percent(name):
    m = load_model(name)
    n = m.param_count()
    pub = m.published_params
    # 2%, or the rounding of the printed figure if coarser (Megatron Table 1 prints "1.7" for a
    # model its own Sec. 5.1 formula puts at 1.652e9).
    tol = max(0.02 * pub, _printed_half_unit(pub))
    assert abs(n - pub) <= tol, f"{name}: computed {n / 1e9:.4f}e9 vs published {pub / 1e9}e9"


def test_only_megatron_1_7b_needs_the_rounding_allowance():
    loose = [
        n
        for n in MODELS
        if abs(load_model(n).param_count() / load_model(n).published_params - 1) > 0.02
    ]
    assert loose == ["megatron-1.7b"]


def test_printed_half_unit():
    assert _printed_half_unit(1.7e9) == pytest.approx(0.05e9)
    assert _printed_half_unit(6.738e9) == pytest.approx(0.0005e9)
    assert _printed_half_unit(175e9) == pytest.approx(0.5e9)


# ------------------------------------------------------------------------------------------
# Every number in a GPU or cluster file carries a source comment
# ------------------------------------------------------------------------------------------
_UNIT_KEY = re.compile(r"^\s*(\w+_(gib|per_s|us)|fp32|tf32|bf16|fp16|fp8|fp4|oversubscription)\s*=")


@pytest.mark.parametrize(
    "path",
    [preset_dir("gpu") / f"{n}.toml" for n in GPUS]
    + [preset_dir("cluster") / f"{n}.toml" for n in CLUSTERS],
    ids=lambda p: p.stem,
)
def test_every_hardware_number_has_a_comment(path):
    lines = path.read_text().splitlines()
    assert lines[0].startswith("#"), f"{path.name}: header comment with the source"
    bare = [ln for ln in lines if _UNIT_KEY.match(ln) and "#" not in ln]
    assert not bare, f"{path.name}: values without a source comment: {bare}"


def test_docs_table_lists_every_preset():
    text = DOCS.read_text()
    for kind in ("gpu", "cluster", "model"):
        for name in list_presets(kind):
            assert f"`{name}`" in text, f"docs/presets.md misses {kind} preset {name}"


# ------------------------------------------------------------------------------------------
# Hand-checked numbers
# ------------------------------------------------------------------------------------------
def test_gpt3_175b_params_by_the_megatron_formula():
    # Narayanan et al. 2021, Sec. 5.1: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) with l=96,
    # h=12288, V=50257, s=2048: 12 l h^2 = 173,946,175,488 (matrices), 13 l h = 15,335,424
    # (biases, LayerNorms), (V+s) h = 642,723,840 (embeddings): 174,604,234,752; plus our final
    # LayerNorm (2h = 24,576) = 174,604,259,328.
    layers, h, vocab, seq = 96, 12288, 50257, 2048
    formula = 12 * layers * h**2 * (1 + 13 / (12 * h) + (vocab + seq) / (12 * layers * h))
    assert formula == pytest.approx(174_604_234_752, rel=1e-12)
    assert formula == pytest.approx(174.6e9, rel=1e-4)
    assert load_model("gpt3-175b").param_count() == 174_604_234_752 + 2 * h == 174_604_259_328


def test_llama2_7b_params_exact():
    # 32 layers x (4*4096^2 attention + 3*4096*11008 SwiGLU + 2*4096 RMSNorm)
    # + 2*32000*4096 untied embeddings + 4096 final norm = 6,738,415,616 (HF safetensors total).
    per_layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert per_layer == 202_383_360
    total = 32 * per_layer + 2 * 32000 * 4096 + 4096
    assert total == 6_738_415_616
    assert load_model("llama2-7b").param_count() == total


def test_llama2_70b_gqa_params_exact():
    # attention: q 8192^2 + kv 2*8192*(8*128) + out 8192^2 = 150,994,944
    attn = 2 * 8192**2 + 2 * 8192 * 1024
    assert attn == 150_994_944
    layer = attn + 3 * 8192 * 28672 + 2 * 8192
    total = 80 * layer + 2 * 32000 * 8192 + 8192
    assert total == 68_976_648_192
    assert load_model("llama2-70b").param_count() == total


def test_nemotron4_340b_matches_the_papers_split():
    # Sec. 2.1: 9.4e9 embedding + 331.6e9 non-embedding parameters.
    m = load_model("nemotron4-340b")
    emb = m.embedding_params() + m.output_params()
    assert emb == 2 * 256000 * 18432 == 9_437_184_000
    assert m.param_count() - emb == pytest.approx(331.6e9, rel=1e-3)
    assert m.activation == "relu2" and not m.tied_embeddings and m.kv_heads == 8


def test_bloom_has_no_position_parameters():
    m = load_model("bloom-176b")
    assert m.embedding_params() == 250880 * 14336
    assert m.param_count() == pytest.approx(176_247_271_424, rel=1e-6)


def test_a100_peaks():
    a = load_gpu("a100-sxm4-80gb")
    assert a.peak_flops("bf16") == 312e12
    assert a.peak_flops("tf32") == 156e12
    assert a.hbm_bytes == 80 * 2**30
    assert a.hbm_bw_bytes_per_s == pytest.approx(2.039e12)
    with pytest.raises(SpecError, match=r"A100-SXM4-80GB.*fp8"):
        a.peak_flops("fp8")


def test_h100_and_blackwell_peaks():
    assert load_gpu("h100-sxm5-80gb").peak_flops("bf16") == pytest.approx(989.4e12)
    assert load_gpu("h100-sxm5-80gb").peak_flops("fp8") == pytest.approx(1978.9e12)
    assert load_gpu("h200-sxm-141gb").calibration == "h200"
    assert load_gpu("b200").peak_flops("fp4") == 9000e12  # 144 PF sparse / 8 GPUs / 2
    assert load_gpu("gb200").peak_flops("bf16") == 2500e12  # 360 PF sparse / 72 / 2
    assert load_gpu("gb300").peak_flops("fp4") == 15000e12  # 1,080 PF dense / 72
    with_fp4 = [n for n in GPUS if load_gpu(n).peak_tflops.fp4 is not None]
    assert with_fp4 == ["b200", "b300", "gb200", "gb300"]
    # DGX B300 datasheet: 72 PFLOPS FP8 training per 8 GPUs, as DGX B200 (not the GB300 sheet)
    assert load_gpu("b300").peak_flops("fp8") == load_gpu("b200").peak_flops("fp8") == 4500e12


def test_v100_has_no_bf16_tensor_core():
    v = load_gpu("v100-sxm2-32gb")
    assert v.peak_flops("fp16") == 125e12
    assert v.peak_flops("bf16") == v.peak_flops("tf32") == v.peak_flops("fp32") == 15.7e12
    with pytest.raises(SpecError):
        v.peak_flops("fp8")


def test_mi300x_is_amd():
    g = load_gpu("mi300x")
    assert g.vendor == "amd" and g.peak_flops("bf16") == pytest.approx(1307.4e12)
    assert g.hbm_bytes == 192 * 2**30


def test_dgx_a100_network_in_bytes():
    c = load_cluster("dgx-a100-80g")
    nvl, ib = c.tiers
    assert nvl.bw_bytes_per_s == 300e9  # 600 GB/s bidirectional = 300 GB/s each way
    assert ib.bw_bytes_per_s == 25e9  # HDR 200 Gb/s = 25e9 bytes/s
    assert nvl.latency_s == pytest.approx(3e-6) and ib.latency_s == pytest.approx(8e-6)
    assert c.total_gpus == 1024 and c.scale_up_size == 8


def test_dgx_h100_and_b200_network_in_bytes():
    h = load_cluster("dgx-h100")
    assert h.tiers[0].bw_bytes_per_s == 450e9 and h.tiers[1].bw_bytes_per_s == 50e9
    b = load_cluster("dgx-b200")
    assert b.tiers[0].bw_bytes_per_s == 900e9 and b.gpu.name == "B200"


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb300-nvl72"])
def test_nvl72_domain(name):
    c = load_cluster(name)
    assert c.gpus_per_node == 4 and c.scale_up_size == 72
    assert c.tiers[0].bw_bytes_per_s == 900e9
    assert c.total_gpus % 72 == 0  # whole racks by default
    rack = load_cluster(name, gpus=72)
    assert rack.num_nodes == 18 and rack.tier_domain_sizes() == [72, 72]
    assert load_cluster("gb300-nvl72").tiers[1].bw_bytes_per_s == 100e9  # 800 Gb/s ConnectX-8


def test_ethernet_a100_per_gpu_share():
    c = load_cluster("ethernet-a100")
    eth = c.tiers[-1]
    assert eth.kind == "ethernet"
    assert eth.bw_bytes_per_s * c.gpus_per_node == pytest.approx(100e9 / 8)  # 100 Gb/s per node


def test_ring8_is_the_textbook_exercise():
    c = load_cluster("ring8-100gbps")
    (ring,) = c.tiers
    assert (ring.kind, ring.domain_size, ring.bw_bytes_per_s, ring.latency_s) == (
        "other",
        8,
        100e9,
        0.0,
    )
    assert c.total_gpus == 8
    # Exercise 9.1: ring all-reduce of 175e9 fp16 gradients, 2(N-1)/N * M / B.
    t_s = 2 * (8 - 1) / 8 * 175e9 * 2 / ring.bw_bytes_per_s
    assert t_s == pytest.approx(6.125)


def test_hbm_is_binary_gigabytes():
    assert load_gpu("h200-sxm-141gb").hbm_bytes == 141 * 2**30
    assert math.isclose(load_gpu("v100-sxm2-32gb").hbm_bytes, 32 * 1024**3)
