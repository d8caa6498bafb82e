"""Framework capabilities (``[capabilities]`` of the presets): per capability, the space of the
older release excludes what the newer one includes; a pinned setting the release cannot run is a
one-line SpecError naming the framework, its release and the setting (exit 2 on the CLI)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.compute import attention_kernels as ak
from perfmodel.core.errors import SpecError
from perfmodel.spec.frameworks import (
    Capabilities,
    FrameworkSpec,
    capability_refusals,
    load_framework,
)
from perfmodel.spec.specs import (
    GPUSpec,
    build_spec,
    list_presets,
    load_cluster,
    load_gpu,
    load_model,
    load_training,
)
from search.space import make_space

MIX = load_model("mixtral-8x7b")
TR = load_training(global_batch_size=256, seq_len=4096)
H100_64 = load_cluster("dgx-h100", gpus=64)
B200_64 = load_cluster("dgx-b200", gpus=64)


def _valid(space) -> dict[str, np.ndarray]:
    """Every structurally valid configuration of a space (decoded arrays)."""
    parts: dict[str, list] = {}
    for flat in space.iter_chunks():
        a, v = space.decode_flat(flat)
        ok = v == 0
        for k in ("tp", "pp", "vp", "cp", "ep", "etp"):
            parts.setdefault(k, []).append(np.asarray(a[k])[ok])
    return {k: np.concatenate(v) for k, v in parts.items()}


def _with(name: str, **caps) -> FrameworkSpec:
    """A preset with some capabilities replaced (a release between two shipped presets)."""
    fw = load_framework(name)
    c = fw.capabilities.model_dump()
    for k, (value, source) in caps.items():
        c[k] = {"value": value, "source": source}
    return fw.model_copy(update={"capabilities": Capabilities.model_validate(c)})


# -- etp: before MoE parallel folding (Megatron-Core 0.10) the experts are split by tp -------
def test_etp_equal_tp_before_parallel_folding_free_after():
    old = _valid(make_space(MIX, TR, H100_64, framework=load_framework("nemo-24.09")))
    assert np.all(old["etp"] == old["tp"]) and len(old["tp"])
    new = _valid(make_space(MIX, TR, H100_64, framework=load_framework("bridge-25.x")))
    assert np.any(new["etp"] != new["tp"])


def test_etp_one_or_tp_in_torchtitan():
    a = _valid(make_space(MIX, TR, H100_64, framework=load_framework("torchtitan")))
    assert np.all((a["etp"] == a["tp"]) | ((a["etp"] == 1) & (a["ep"] > 1)))
    assert np.any((a["etp"] == 1) & (a["tp"] > 1))  # etp 1 with ep > 1 is in
    free = _valid(make_space(MIX, TR, H100_64, framework=load_framework("megatron-lm")))
    assert np.any((free["etp"] != free["tp"]) & (free["etp"] != 1))  # e.g. tp 4, etp 2


def test_torchtitan_ep_spans_cp_and_tp():
    a = _valid(make_space(MIX, TR, H100_64, framework=load_framework("torchtitan"), cp=[1, 2]))
    multi = a["ep"] > 1
    assert np.all((a["ep"][multi] * a["etp"][multi]) % (a["cp"][multi] * a["tp"][multi]) == 0)
    m = _valid(make_space(MIX, TR, H100_64, framework=load_framework("megatron-lm"), cp=[1, 2]))
    assert np.any((m["ep"] > 1) & ((m["ep"] * m["etp"]) % (m["cp"] * m["tp"]) != 0))


# -- context parallelism in a MoE model (Megatron-Core 0.8) ----------------------------------
def test_moe_context_parallel_capability():
    pre08 = _with("nemo-24.07", moe_context_parallel=(False, "Megatron-Core 0.7 (test)"))
    a = _valid(make_space(MIX, TR, H100_64, framework=pre08))
    assert np.all(a["cp"] == 1)
    b = _valid(make_space(MIX, TR, H100_64, framework=load_framework("nemo-24.07")))
    assert np.any(b["cp"] > 1)
    why = make_space(MIX, TR, H100_64, framework=pre08, cp=2).explain_empty()
    assert "cannot run context parallelism in a MoE model (cp 2); source: Megatron-Core 0.7" in why


# -- MoE at all -------------------------------------------------------------------------------
def test_moe_refused_before_megatron_core():
    with pytest.raises(SpecError, match=r"^framework megatron-2022 \(Megatron-LM v3\.0 \(2022\)\) "
                       r"cannot run a mixture-of-experts model \(mixtral-8x7b, 8 experts\); "
                       r"source: .*CHANGELOG"):
        make_space(MIX, TR, H100_64, framework=load_framework("megatron-2022"))
    with pytest.raises(SpecError, match="deepspeed-2021 .* mixture-of-experts"):
        make_space(MIX, load_training(global_batch_size=256, seq_len=4096, precision="fp16"),
                   H100_64, framework=load_framework("deepspeed-2021"))
    assert make_space(MIX, TR, H100_64, framework=load_framework("nemo-24.07")).size > 0


# -- training-level switches: dispatcher, flex backend, CUDA-graph scope, recompute modules --
def test_flex_dispatcher_only_from_megatron_core_012():
    flex = TR.model_copy(update={"moe_token_dispatcher": "flex", "moe_flex_backend": "deepep"})
    with pytest.raises(SpecError, match=r"nemo-24\.09 \(NeMo 24\.09 \(Megatron-Core 0\.9\)\) "
                       r"cannot run moe_token_dispatcher = flex .*0\.12\.0"):
        make_space(MIX, flex, H100_64, framework=load_framework("nemo-24.09"))
    assert make_space(MIX, flex, H100_64, framework=load_framework("bridge-25.x")).size > 0


def test_hybridep_backend_only_from_megatron_core_015():
    hyb = TR.model_copy(update={"moe_token_dispatcher": "flex", "moe_flex_backend": "hybridep"})
    mc014 = _with("bridge-25.x", moe_flex_backends=(["deepep"], "Megatron-Core 0.14 (test)"))
    with pytest.raises(SpecError, match=r"cannot run moe_flex_backend = hybridep \(it has deepep\)"):
        make_space(MIX, hyb, B200_64, framework=mc014)
    assert make_space(MIX, hyb, B200_64, framework=load_framework("bridge-26.02")).size > 0


def test_cuda_graph_scopes_only_from_megatron_core_015():
    g = TR.model_copy(update={"cuda_graph_scope": ("attn", "moe_router")})
    with pytest.raises(SpecError, match=r"nemo-24\.09 .* cannot run cuda_graph_scope = "
                       r"\['attn', 'moe_router'\] \(it captures no partial CUDA graphs\)"):
        make_space(MIX, g, H100_64, framework=load_framework("nemo-24.09"))
    assert make_space(MIX, g, H100_64, framework=load_framework("bridge-26.02")).size > 0


def test_recompute_modules_only_from_megatron_core_013():
    r = TR.model_copy(update={"recompute_modules": ("moe_act", "layernorm")})
    with pytest.raises(SpecError, match=r"cannot run selective recompute of moe_act, layernorm "
                       r"\(it recomputes core_attn\)"):
        make_space(MIX, r, H100_64, framework=load_framework("nemo-24.09"))
    # without selective recompute in the space the modules do not matter
    assert make_space(MIX, r, H100_64, framework=load_framework("nemo-24.09"),
                      recompute="full").size > 0
    assert make_space(MIX, r, H100_64, framework=load_framework("megatron-lm")).size > 0


# -- interleaved pipeline with unequal stages (Megatron-Core 0.11) ----------------------------
def test_uneven_interleaved_only_from_megatron_core_011():
    m = load_model("llama3.1-405b")  # 126 layers: pp 8 x vp 2 = 16 does not divide them
    t = load_training(global_batch_size=512, seq_len=8192)
    c = load_cluster("dgx-h100", gpus=1024)
    pins = {"tp": 8, "pp": 8, "vp": [1, 2], "cp": 1}
    old = _valid(make_space(m, t, c, framework=load_framework("nemo-24.09"), **pins))
    assert set(old["vp"].tolist()) == {1}  # pp 8 x vp 1: uneven first / last stages (0.9) stay
    new = _valid(make_space(m, t, c, framework=load_framework("bridge-25.x"), **pins))
    assert 2 in set(new["vp"].tolist())
    why = make_space(m, t, c, framework=load_framework("nemo-24.09"), tp=8, pp=8, vp=2,
                     cp=1).explain_empty()
    assert ("framework nemo-24.09 (NeMo 24.09 (Megatron-Core 0.9)) cannot run the interleaved "
            "schedule with unequal stages (126 layers on pp 8 x vp 2)") in why


# -- precision recipes: per release, and by the GPU's compute capability ---------------------
def test_mxfp8_needs_blackwell_and_a_release_that_has_it():
    mx = load_training(global_batch_size=256, seq_len=4096, precision="mxfp8")
    with pytest.raises(SpecError, match=r"^precision mxfp8 needs compute capability 10\.0 or "
                       r"higher .*gpu 'H100-SXM5-80GB' is 9\.0$"):
        make_space(MIX, mx, H100_64)
    with pytest.raises(SpecError, match=r"^framework nemo-24\.09 \(NeMo 24\.09 \(Megatron-Core "
                       r"0\.9\)\) cannot run precision mxfp8: it runs fp32, bf16, fp16, "
                       r"fp8-delayed$"):
        make_space(MIX, mx, B200_64, framework=load_framework("nemo-24.09"))
    assert make_space(MIX, mx, B200_64, framework=load_framework("bridge-26.02")).size > 0
    assert make_space(MIX, mx, B200_64).size > 0


def test_compute_capability_field():
    assert load_gpu("b300").compute_capability_tuple == (10, 3)
    assert load_gpu("h100-sxm5-80gb").compute_capability_tuple == (9, 0)
    assert load_gpu("mi300x").compute_capability_tuple is None  # no CUDA compute capability
    with pytest.raises(SpecError, match=r"compute_capability.*'nine'"):
        build_spec(GPUSpec, {**load_gpu("h100-sxm5-80gb").model_dump(), "compute_capability": "nine"},
               "test")


# -- the presets themselves -------------------------------------------------------------------
def test_every_preset_states_its_capabilities_with_a_source():
    for name in list_presets("framework"):
        fw = load_framework(name)
        stated = {k: v for k, v in fw.capabilities if v is not None}
        assert "moe" in stated and "cuda_graph_scopes" in stated, name
        if stated["moe"].value:
            assert {"expert_tensor_parallel", "moe_token_dispatchers"} <= set(stated), name
        assert all(len(v.source) > 20 for v in stated.values()), name


def test_preset_switches_must_be_within_its_capabilities():
    fw = load_framework("bridge-26.02")
    data = fw.model_dump()
    data["capabilities"]["moe_flex_backends"] = {"value": ["deepep"], "source": "test"}
    with pytest.raises(ValueError, match=r"moe_flex_backend = 'hybridep' is not among "
                       r"capabilities: deepep"):
        FrameworkSpec.model_validate(data)


def test_refusals_of_one_configuration():
    cfg = {"tp": 4, "pp": 4, "vp": 8, "cp": 2, "ep": 8, "etp": 1}
    grok_like = capability_refusals(load_framework("nemo-24.09"), MIX, cfg)
    assert len(grok_like) == 1 and "etp 1, tp 4" in grok_like[0]
    assert capability_refusals(load_framework("bridge-26.02"), MIX, cfg) == []
    assert capability_refusals(None, MIX, cfg) == []


# -- API and CLI -----------------------------------------------------------------------------
def test_fully_pinned_configuration_refused_by_the_api():
    import search

    with pytest.raises(SpecError, match=r"^framework nemo-24\.09 .* cannot run expert tensor "
                       r"parallelism other than tp \(etp 1, tp 2\)"):
        search.evaluate_config("mixtral-8x7b", "dgx-h100", gpus=64, global_batch_size=256,
                               seq_len=4096, framework="nemo-24.09", dp=16, tp=2, pp=2, ep=8,
                               etp=1, sequence_parallel=True)


def test_cli_exits_2_naming_framework_release_and_setting():
    from cli.main import app

    res = CliRunner().invoke(app, ["--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                                   "--gpus", "64", "--framework", "nemo-24.09", "--tp", "4",
                                   "--etp", "1", "--top", "1"])
    assert res.exit_code == 2
    err = res.stderr if hasattr(res, "stderr") else res.output
    line = [ln for ln in err.splitlines() if ln.startswith("plan: error:")]
    assert len(line) == 1 and "Traceback" not in err
    assert ("framework nemo-24.09 (NeMo 24.09 (Megatron-Core 0.9)) cannot run expert tensor "
            "parallelism other than tp (etp 1, tp 4)") in line[0]
    res = CliRunner().invoke(app, ["--model", "mixtral-8x7b", "--cluster", "dgx-b200",
                                   "--gpus", "64", "--framework", "nemo-24.09", "--precision",
                                   "mxfp8", "--top", "1"])
    assert res.exit_code == 2 and "cannot run precision mxfp8" in (
        res.stderr if hasattr(res, "stderr") else res.output)


# -- the attention exponential rate is a GPUSpec field ---------------------------------------
@pytest.mark.parametrize("gpu,sfu,tensor", [
    ("h100-sxm5-80gb", 16, 4096), ("h200-sxm-141gb", 16, 4096), ("b200", 16, 8192),
    ("gb200", 16, 8192), ("b300", 32, 8192), ("gb300", 32, 8192), ("a100-sxm4-80gb", 16, 2048)])
def test_sfu_rate_from_the_gpu_preset_same_as_before(gpu, sfu, tensor):
    g = load_gpu(gpu)
    assert g.sfu_exp_per_clock_sm == sfu
    assert ak.exp_per_mma_flop(g) == pytest.approx(sfu / tensor)
    # the floor as the old name test gave it (B300 / GB300: 32, other parts 16)
    old_sfu = 32.0 if ("B300" in g.name.upper() or "GB3" in g.name.upper()) else 16.0
    n_exp = 4 * 64 * 4096**2 / 2
    assert ak.attention_exp_floor_s(g, 4 * 64, 4096) == pytest.approx(
        n_exp / (g.peak_flops("bf16") * old_sfu / tensor * ak.ATTENTION_EXP_UTILISATION))


def test_sfu_rate_follows_the_field_not_the_name():
    b300 = load_gpu("b300")
    plain = b300.model_copy(update={"sfu_exp_per_clock_sm": None})
    assert ak.exp_per_mma_flop(plain) == pytest.approx(ak.SFU_EXP_PER_CLOCK_SM / 8192)
    fast_b200 = load_gpu("b200").model_copy(update={"sfu_exp_per_clock_sm": 32.0})
    assert ak.exp_per_mma_flop(fast_b200) == pytest.approx(32 / 8192)


def test_bridge_25_09_lacks_what_megatron_core_015_added():
    """NeMo 25.09 (Megatron-Core 0.14) runs DeepEP but not HybridEP, and no partial CUDA graphs;
    NeMo 25.11 (bridge-25.x, Megatron-Core 0.15) runs both."""
    hyb = TR.model_copy(update={"moe_token_dispatcher": "flex", "moe_flex_backend": "hybridep"})
    g = TR.model_copy(update={"cuda_graph_scope": ("attn",)})
    old, new = load_framework("bridge-25.09"), load_framework("bridge-25.x")
    for t in (hyb, g):
        with pytest.raises(SpecError, match=r"bridge-25\.09 .* cannot run"):
            make_space(MIX, t, B200_64, framework=old)
        assert make_space(MIX, t, B200_64, framework=new).size > 0
    deep = TR.model_copy(update={"moe_token_dispatcher": "flex", "moe_flex_backend": "deepep"})
    assert make_space(MIX, deep, B200_64, framework=old).size > 0
