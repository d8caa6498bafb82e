"""Validation on published MoE training runs (``moe_runs_dev.csv``): predicted versus measured
step time, and the tuned-recipe check (a free search's best against the published recipe).

Each row becomes (model, training setup, cluster, config) from what the row states and
documented facts of its framework, nothing fitted per row:

* **model**: the shipped preset of the row's model when there is one (DeepSeek-V3, Qwen3,
  GPT-OSS, Mixtral, the hybrid Mamba2 / attention / MoE Nemotron-3 Nano: :mod:`perfmodel.compute.mamba`),
  else the row's architecture columns (Grok-1, Llama-4 Scout).
* **software**: Megatron-Core of 2024-2026: distributed optimizer (ZeRO-1; FSDP rows ZeRO-3),
  overlapped data-parallel, tensor-parallel and pipeline communication, flash attention,
  sequence parallelism with tp > 1, the dispatcher switches the row names
  (:func:`dispatch_switches`: alltoall or flex DeepEP / HybridEP, router fusion, partial CUDA
  graphs; a Bridge row without a matched preset takes its sibling recipe's,
  :func:`sibling_recipe_switches`), the all-to-all overlapped only where the row says
  ``moe_a2a_overlap=True``;
  dropless, force-balanced routing (the benchmark footnotes), so load imbalance 1, except the
  25.09 "(tokendrop)" rows, padded to capacity 1.0 as their recipe ran them, Qwen3-30B on B200 /
  GB200 with the recipe's full-iteration CUDA graph (:data:`RECIPE_FACTS`); 25.11 rows the
  dataset left unmatched take the settings of a stored preset version with their GPUs,
  layout, MBS and GBS (:data:`RECIPE_FACTS_BY_LAYOUT`).
* **config**: where the row leaves etp empty, 1 for Megatron-Bridge (its MoE recipes set
  ``expert_tensor_parallel_size=1``) and Megatron-Core's default etp = tp for the others; layers that do not divide into ``pp*vp`` chunks are split
  unevenly (Megatron-Bridge's ``pipeline_model_parallel_layout`` / embedding-aware split).
* **cluster**: the GPU's preset. GB200/GB300 jobs run on 64-GPU NVLink segments (16 of a rack's
  18 trays, Slurm ``--segment``; one row says "32 GB200 per NVL domain segment"), so the NVLink
  tier is 64 GPUs (32 where the row says so).
* **measured**: ``seconds_per_iteration`` (derived by the source from tokens/s where it says so);
  rows with only TFLOP/s are converted with the source's own FLOP formula
  (:func:`flop_convention`, :mod:`perfmodel.compute.framework_flops`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import get_args

import numpy as np
import pandas as pd

from perfmodel.compute.framework_flops import megatron_flops_per_token, step_time_from_tflops
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.frameworks import FrameworkSpec, load_framework, with_switches_of
from perfmodel.spec.specs import (
    ClusterSpec,
    ModelSpec,
    RecomputeModule,
    TrainingSpec,
    load_cluster,
    load_model,
)
from perfmodel.step.evaluate import TIME_TERMS, evaluate
from search.api import plan
from search.host_sharding import imbalance_defaulted
from validation.requests import case_options, predict_options, row_framework
from validation.validate import (
    VALIDATION_DIR,
    Case,
    attention_switches,
    cluster_for,
    dgxc_attention_env,
    era_switches,
    number_or_none,
    precision_from_text,
)

__all__ = [
    "RECIPE_ERROR_BAND",
    "SEARCH_GAIN_BAND",
    "model_from_row",
    "moe_case_from_row",
    "moe_row_requests",
    "moe_runs_report",
    "moe_summary",
    "moe_tuned_report",
    "moe_tuned_summary",
    "print_moe_tuned",
    "tuned_miss_kind",
]

_PRESETS = {"deepseek-v3": "deepseek-v3", "qwen3-235b-a22b": "qwen3-235b-a22b",
            "qwen3-30b-a3b": "qwen3-30b-a3b", "gpt-oss-120b": "gpt-oss-120b",
            "mixtral-8x7b": "mixtral-8x7b", "mixtral-8x22b": "mixtral-8x22b"}


#: Hybrid Mamba2 / attention / MoE models of the rows and their presets (perfmodel.compute.mamba).
_HYBRID_PRESETS = {"nemotron-3-nano-30b-a3b": "nemotron3-nano-30b-a3b"}


def model_from_row(r: pd.Series) -> ModelSpec:
    """The model of a published MoE run: its preset where one exists (a hybrid Mamba2 row's
    shipped preset), else built from the row's columns (layers, widths, experts, vocabulary);
    :class:`SpecError` when the row does not publish the architecture."""
    name = str(r["model"])
    key = name.lower()
    if key in _PRESETS:
        return load_model(_PRESETS[key])
    pattern = str(r.get("moe_layer_pattern", "")).lower()
    if "mamba" in pattern or "hybrid" in str(r.get("attention_type", "")).lower():
        # hybrid rows name a shipped preset of theirs (Nemotron-3 Nano); others are refused
        hybrid = _HYBRID_PRESETS.get(key)
        if hybrid is None:
            raise SpecError(f"hybrid Mamba2 model {name!r}: no preset with its layer pattern")
        return load_model(hybrid)
    vocab = number_or_none(r["vocab_size"]) or number_or_none(str(r["vocab_size"]).split(" ")[0])
    L, h = int(r["num_layers"]), int(r["hidden_size"])
    if number_or_none(r["num_experts"]) is None or vocab is None:
        raise SpecError("architecture not published (expert count or vocabulary missing)")
    kv = number_or_none(r["num_query_groups"])
    d = number_or_none(r["head_dim"])
    return ModelSpec(
        name=name, num_layers=L, hidden_size=h, num_attention_heads=int(r["num_attention_heads"]),
        num_kv_heads=int(kv) if kv else None, head_dim=int(d) if d else None,
        ffn_hidden_size=int(r["ffn_hidden_size"]),
        moe_ffn_hidden_size=int(number_or_none(r["moe_ffn_hidden_size"]) or r["ffn_hidden_size"]),
        num_experts=int(r["num_experts"]), moe_top_k=int(r["moe_top_k"]),
        num_shared_experts=int(number_or_none(r["num_shared_experts"]) or 0), vocab_size=int(vocab),
        max_seq_len=int(r["seq_len"]), activation="swiglu",  # GeGLU: the same three matrices
        norm="rmsnorm", position_embedding="rope", tied_embeddings=False, linear_bias=False,
    )


def _nvlink_segment(cluster: ClusterSpec, r: pd.Series) -> ClusterSpec:
    """NVL72 racks as benchmark jobs use them: 64-GPU NVLink segments (32 where stated)."""
    if cluster.tiers[0].domain_size != 72:
        return cluster
    seg = 32 if re.search(r"\b32 GB[23]00 per NVL", str(r.get("other_config", ""))) else 64
    tiers = [cluster.tiers[0].model_copy(update={"domain_size": seg}), *cluster.tiers[1:]]
    return cluster.model_copy(update={"tiers": tiers})


def _cluster(r: pd.Series) -> ClusterSpec:
    gpu = str(r["gpu_type"]).upper()
    gpus = int(r["num_gpus"])
    if gpu.startswith("B300"):
        c = load_cluster("dgx-b300", gpus=gpus)
    elif gpu.startswith("H800"):
        raise SpecError("H800 (export NVLink 400 GB/s) has no cluster preset")
    else:
        c = cluster_for(gpu, gpus)
    return _nvlink_segment(c, r)


def _precision(text: str) -> str:
    """The row's precision and low-precision recipe (:func:`validation.validate.precision_from_text`:
    MXFP8, FP8-CS, FP8 blockwise or delayed scaling; each prices its own quantisation and GEMM
    rate, :data:`perfmodel.compute.layer.LOW_PRECISION_RECIPES`)."""
    return precision_from_text(text)


def _recompute(text: str) -> str:
    t = text.lower()
    if t.startswith("full"):
        return "full"
    if t.startswith("selective"):
        return "selective"
    return "none"


#: Spellings of the recompute modules in the rows' text besides their own names.
_MODULE_ALIASES = {"mla up_proj": "mla_up_proj"}


def recompute_modules(text: str) -> tuple[str, ...]:
    """The selective-recompute modules a row names (``"selective: layernorm+moe_act"`` ->
    ``("layernorm", "moe_act")``; Megatron-Core's ``recompute_modules``), Megatron-Core's
    default ``("core_attn",)`` when it names none. Order as in Megatron-Core's list."""
    t = text.lower()
    if not t.startswith("selective"):
        return ("core_attn",)
    order = get_args(RecomputeModule)
    names = {**{m: m for m in order}, **_MODULE_ALIASES}
    named = {v for k, v in names.items() if re.search(rf"(?<![a-z_]){k}(?![a-z_])", t)}
    return tuple(m for m in order if m in named) or ("core_attn",)


def flop_convention(r: pd.Series) -> tuple[str, int]:
    """The FLOP formula a row's TFLOP/s was counted with: ``(form, mtp_layers)`` of
    :func:`perfmodel.compute.framework_flops.megatron_flops_per_token`.

    * Megatron-LM MoE README (MCore v0.8 / v0.9): the 2024 ``num_floating_point_operations``.
    * Megatron-LM DeepSeek-V3 GB200 study (Megatron-LM of Nov 2025) and Megatron-Bridge: the
      2025 ``transformer_flops``; DeepSeek-V3 counts its one MTP layer (``mtp_num_layers=1``
      of ``DeepSeekV3ModelProvider``) unless the row says "w/o MTP" or the launch script has
      no MTP flag. Checked on the rows that publish both tokens/s and TFLOP/s: the 2025 form
      reproduces their ratio within 0.3 % for DeepSeek-V3 (with MTP, w/o MTP where labelled),
      Qwen3, Grok-1, Mixtral-8x22B and Llama-4 Scout (``tests/perfmodel/compute/test_framework_flops.py``).
    """
    src = str(r.get("source", "")).lower()
    release = str(r.get("release", "")).lower()
    if "moe/readme" in src or re.match(r"mcore v0\.[0-9]\b", release):
        return "2024", 0
    text = (str(r.get("notes", "")) + " " + str(r.get("config_source", ""))).lower()
    no_mtp = "w/o mtp" in text or "no mtp" in text
    mtp = 1 if str(r["model"]).lower().startswith("deepseek-v3") and not no_mtp else 0
    return "2025", mtp


def _step_from_tflops(r: pd.Series, model: ModelSpec) -> float:
    """Step time from a published TFLOP/s/GPU under the source's own FLOP formula."""

    tflops = number_or_none(r["tflops_per_gpu"])
    if tflops is None:
        raise SpecError("no step time, tokens/s or TFLOP/s published")
    form, mtp = flop_convention(r)
    f_tok = megatron_flops_per_token(model, int(r["seq_len"]),
                                     tp=int(number_or_none(r["tensor_parallel"]) or 1), mtp_layers=mtp,
                                     form=form)
    return step_time_from_tflops(tflops, f_tok, int(r["global_batch_size"]), int(r["seq_len"]),
                                 int(r["num_gpus"]))


#: Settings of recipes the dataset did not enrich, read from the recipe files of the release:
#: (release, model, GPU) -> other_config text. Megatron-Bridge 25.09 (the dataset leaves these
#: rows unenriched: its 25.09 YAML presets disagree with the table):
#:
#: * DeepSeek-V3: ``scripts/performance/configs/deepseek/deepseek_llm_pretrain.py`` and
#:   ``parallelism_configs.py`` @0132842 (their parallelism matches every 25.09 DeepSeek-V3
#:   table row): H100 1024 GPUs ``enable_deepep=True`` and ``set_moe_a2a_overlap_overrides(cfg)``
#:   (B200 / GB200: neither). ``scripts/performance/run_script.py`` of the 25.09 perf-matrix
#:   series (``pp_vp_map = {"h100": (8, 4), "b200": (16, 1), "gb200": (4, 4)}``, the table's
#:   layouts): ``use_tokendrop = bool(args.gpu in ["b200", "gb200"])`` ->
#:   ``apply_moe_token_drop`` (capacity factor 1.0, ``moe_pad_expert_input_to_capacity=True``;
#:   the table labels these rows "(tokendrop)", H100 "(dropless)"), and
#:   ``recompute_modules = ["mla_up_proj"]`` on B200 and with token drop on GB200 (the rows'
#:   recompute column is empty; also the 25.09 python recipe ``deepseek_v3_gb200_fp8_config``:
#:   ``["mla_up_proj"]`` with token drop). Its H100 ``["mla_up_proj", "mlp"]`` is not applied:
#:   the recipe @0132842 that matches the H100 row was not checked for it.
#: * Qwen3-30B / 235B: the same ``run_script.py`` calls ``apply_moe_token_drop`` for both
#:   models on every GPU, as do the 25.09 presets' ``set_qwen3_common_configs``
#:   (``scripts/performance/configs/qwen3/qwen3_llm_pretrain.py``); every 25.09 Qwen3 row is
#:   labelled "(tokendrop)". Qwen3-30B on B200 and GB200 runs ``cuda_graph_impl="local"``,
#:   ``cuda_graph_scope="full_iteration"`` (``configs/qwen3/parallelism_configs.py`` /
#:   ``workload_base_configs.py`` ``QWEN3_30B_A3B_{B200,GB200}_8GPUS_*``: 8 GPUs, ep 8, GBS 512,
#:   MBS 1 / 4 as the table; the perf-matrix YAML ``qwen3_30b_a3b_llm_pretrain.yaml``: gb200
#:   ``cuda_graphs: true``, h100 ``cuda_graphs: false``); H100 and the Qwen3-235B layouts of the
#:   table run no CUDA graphs (235B B200 / H100 presets set none; the table's GB200 235B
#:   layout, tp 2 ep 64, matches no GB200 preset).
_TOKEN_DROP = "moe_expert_capacity_factor=1.0; moe_pad_expert_input_to_capacity=True"
_FULL_GRAPH = "cuda_graph_impl=local; cuda_graph_scope=full_iteration"
RECIPE_FACTS = {
    ("NeMo container 25.09", "DeepSeek-V3", "H100"):
        "moe_flex_dispatcher_backend=deepep; moe_a2a_overlap=True",
    ("NeMo container 25.09", "DeepSeek-V3", "B200"): _TOKEN_DROP + "; recompute_modules=mla_up_proj",
    ("NeMo container 25.09", "DeepSeek-V3", "GB200"):
        _TOKEN_DROP + "; recompute_modules=mla_up_proj",
    ("NeMo container 25.09", "Qwen3-235B-A22B", "H100"): _TOKEN_DROP,
    ("NeMo container 25.09", "Qwen3-235B-A22B", "B200"): _TOKEN_DROP,
    ("NeMo container 25.09", "Qwen3-235B-A22B", "GB200"): _TOKEN_DROP,
    ("NeMo container 25.09", "Qwen3-30B-A3B", "H100"): _TOKEN_DROP,
    ("NeMo container 25.09", "Qwen3-30B-A3B", "B200"): _TOKEN_DROP + "; " + _FULL_GRAPH,
    ("NeMo container 25.09", "Qwen3-30B-A3B", "GB200"): _TOKEN_DROP + "; " + _FULL_GRAPH,
}


#: Facts of the 25.11 presets for rows the dataset left unmatched (``config_source`` "no preset
#: ... matched": it searched the release tags and the summary commits), keyed by (release,
#: model, GPU, ``row_layout``: GPUs, t/p/v/ep, MBS, GBS) and taken from a stored version of the
#: release's preset file whose preset of that model and GPU has every one of these numbers:
#:
#: * DeepSeek-V3, 25.11 table of @1804c076f (E0018 GB200 BF16, E0021 / E0022 GB300):
#:   Megatron-Bridge ``scripts/performance/configs/deepseek/workload_base_configs.py``
#:   @d19cb73c80ae (the 25.11 file name; 26.02 renamed it ``deepseek_workload_base_configs.py``).
#:   ``DEEPSEEK_V3_GB200_BASE_CONFIG`` (= its BF16 / FP8_CS / FP8_MX presets): 256 GPUs, GBS
#:   4096, p4 v4 ep64, ``moe_flex_dispatcher_backend="hybridep"``, ``moe_a2a_overlap=False``,
#:   ``recompute_modules=["mla_up_proj"]``, TE graphs of ``moe_router`` / ``moe_preprocess``;
#:   ``DEEPSEEK_V3_GB300_BASE_CONFIG``: 256 GPUs, GBS 4096, p2 v4 ep32, HybridEP, no a2a
#:   overlap, TE graphs of ``attn`` / ``moe_router`` / ``moe_preprocess``,
#:   ``recompute_modules=[]``. Its B200 preset (p16 ep8, GBS 2048, ``["mla_up_proj"]``) is what
#:   the table's B200 row E0016 matched at v0.2.1, so the one file fits every row of that table
#:   that any preset fits (E0019, GB200 p8 v4 ep32, fits none: left).
#: * GPT-OSS-120B, E0036 (GB200, 64 GPUs, ep64, MBS 1, GBS 1280; sequence 8192):
#:   ``configs/gpt_oss/workload_base_configs.py`` @6b296ac1061f ``GPT_OSS_120B_GB200_BF16_
#:   BASE_CONFIG``: ``recompute_modules=["layernorm", "moe_act"]`` (the v0.2.1 preset E0037
#:   matched, ep64 MBS 4 GBS 512, recomputes the same). Its other presets fit no other row:
#:   E0034 (H100 MBS 4; the presets' MBS 1), E0035 (B200 ep8; the presets' ep64), E0038 (GB300
#:   MBS 2; MBS 4) are left. E0035 read as the B200 preset (ep 64 + the recompute) would be
#:   -3.7 % instead of -23.7 %, and its tokens/s equal the ep-64 26.02 row E0055's within 2 %;
#:   a what-if only, since the table prints ep 8 (docs/moe.md "The 25.x B200 rows against their
#:   26.x siblings", ``benchmarks/b200_release_probe.py``).
#:
#: Left as well, where no stored version can be tied to the row's release:
#: * E0025 (Qwen3-235B, 25.11, 64 B200 p8 v2 ep8 GBS 1024): ``configs/qwen3/
#:   workload_base_configs.py`` @767255d2f5c7 has this layout with ``moe_a2a_overlap=True``,
#:   but its Qwen3-30B B200 / GB200 presets graph ``attn`` too, unlike the v0.2.1 presets the
#:   same table's E0031 / E0032 matched (and the 25.09 file has the layout without overlap).
#: * E0074 / E0075 (GPT-OSS-120B, 26.02.01, ep8 on B200 / B300): only versions of
#:   ``configs/gpt_oss/gpt_oss_workload_base_configs.py`` later than v0.3.1 have ep 8 there
#:   (``_B200_BF16_V2``: recompute ``layernorm`` / ``moe_act`` inherited from V1, HybridEP in
#:   one version and not in @07eea52d4523; ``_B300_BF16_V2``: HybridEP, TE graphs of ``attn``
#:   / ``moe_router`` / ``moe_preprocess``), and both give ``_GB200_BF16_V2`` the
#:   ``moe_a2a_overlap=True`` that v0.3.1's, which E0076 of the same table matched, lacks.
#: * E0065 / E0068 (Qwen3, 26.02.01): no stored version has their layouts. No Qwen3 preset of
#:   25.11-26.02.01 names recompute modules (``set_qwen3_common_configs``:
#:   ``recompute_granularity = None``).
RECIPE_FACTS_BY_LAYOUT = {
    ("NeMo container 25.11", "DeepSeek-V3", "GB200", "n256 t1 p4 v4 ep64 b1 gbs4096"):
        "moe_flex_dispatcher_backend=hybridep; cuda_graph_impl=transformer_engine; "
        "cuda_graph_scope=['moe_router', 'moe_preprocess']; recompute_modules=mla_up_proj",
    ("NeMo container 25.11", "DeepSeek-V3", "GB300", "n256 t1 p2 v4 ep32 b1 gbs4096"):
        "moe_flex_dispatcher_backend=hybridep; cuda_graph_impl=transformer_engine; "
        "cuda_graph_scope=['attn', 'moe_router', 'moe_preprocess']",
    ("NeMo container 25.11", "GPT-OSS-120B", "GB200", "n64 t1 p1 v1 ep64 b1 gbs1280"):
        "recompute_modules=layernorm,moe_act",
}


def row_layout(r: pd.Series) -> str:
    """A row's GPUs, parallel layout and batch as :data:`RECIPE_FACTS_BY_LAYOUT` keys them
    (``n256 t1 p4 v4 ep64 b1 gbs4096``)."""
    def n(col: str) -> int:
        return int(number_or_none(r.get(col)) or 1)
    return (f"n{n('num_gpus')} t{n('tensor_parallel')} p{n('pipeline_parallel')} "
            f"v{n('virtual_pipeline_stages')} ep{n('expert_parallel')} "
            f"b{n('micro_batch_size')} gbs{n('global_batch_size')}")


def recipe_recompute(r: pd.Series, other: str) -> str:
    """The row's ``activation_recompute`` text, or where the row leaves it empty the recipe's
    ``recompute_modules=a,b`` of :data:`RECIPE_FACTS` (``other``, lower-cased) as
    ``"selective: a+b"``; '' when neither names one.

    Example: 25.09 DeepSeek-V3 on B200 (empty column, recipe ``["mla_up_proj"]``) ->
    ``"selective: mla_up_proj"``."""
    own = r.get("activation_recompute", "")
    own = "" if not isinstance(own, str) else own.strip()
    if own:
        return own
    m = re.search(r"recompute_modules=([a-z_,]+)", other)
    return "selective: " + "+".join(m.group(1).split(",")) if m else ""


def full_iteration_graph(other: str) -> bool:
    """Whether a row's recipe (``other``, lower-cased) replays the whole step as one CUDA graph:
    ``cuda_graph_scope=full_iteration`` (Megatron-Core ``--cuda-graph-impl local
    --cuda-graph-scope full_iteration``; :data:`RECIPE_FACTS`). Transformer Engine's partial
    graphs (``cuda_graph_scope=[...]``) are :func:`dispatch_switches`."""
    return bool(re.search(r"cuda_graph_scope=full_iteration\b", other))


#: cuDNN of the NeMo containers (Megatron-Bridge docs/releases/software-versions.md): what
#: decides whether Transformer Engine's fused attention takes GPT-OSS's learnable sinks
#: (cuDNN >= 9.13.1, :func:`perfmodel.compute.attention_kernels.te_attention_backend`).
CUDNN_BY_RELEASE = {
    "NeMo container 25.09": (9, 11, 0), "NeMo container 25.11": (9, 13, 1),
    "NeMo container 26.02": (9, 18, 0), "NeMo container 26.02.01": (9, 18, 0),
}


def recipe_attention_switches(r: pd.Series, other: str, gpu) -> dict:
    """``flash_attention`` / ``attention_backend`` of a row (:func:`validation.validate.
    attention_switches`): the recipe's ``NVTE_FUSED_ATTN`` / ``NVTE_FLASH_ATTN`` (``other``,
    lower-cased, and the DGX Cloud recipes' :data:`validation.validate.DGXC_ATTENTION_ENV`), the
    model's softmax (learnable sinks where the row's attention says so), MLA, and the
    release's cuDNN (:data:`CUDNN_BY_RELEASE`).

    Example: dgxc Grok-1 (``grok1/configure.sh``: NVTE_FUSED_ATTN=0) -> flash-attn 2; GPT-OSS
    on NeMo 25.11 (learnable sinks, cuDNN 9.13.1) -> cuDNN.
    """
    att = str(r.get("attention_type", "")).lower()
    return attention_switches(
        gpu, other + "; " + dgxc_attention_env(r),
        softmax_type="learnable" if "learnable softmax sink" in att else "vanilla",
        cudnn_version=CUDNN_BY_RELEASE.get(str(r.get("release", ""))), mla="mla" in att)


#: Whether the Megatron-Bridge MoE rows run Transformer Engine's fused cross-entropy, as their
#: recipes set it and the dense Bridge rows run it (:func:`validation.validate.case_from_row`).
#: Off: applied alone it takes all MoE rows 9.86 -> 10.33 % (B200 12.5 -> 14.9 %, rows that are
#: already too fast; docs/moe.md "Qwen3-235B on the NVL72 racks"), so it waits for the missing
#: time those rows lack; a switch so a refit can turn it on.
BRIDGE_FUSED_CROSS_ENTROPY = False


def recipe_loss_switches(r: pd.Series) -> dict:
    """The loss kernel of a row: Megatron-Bridge's recipes fuse the cross-entropy with
    Transformer Engine's kernel (``recipes/qwen/qwen3_moe.py``, ``deepseek/deepseek_v3.py``,
    ``gpt_oss``: ``cross_entropy_loss_fusion = True``, ``cross_entropy_fusion_impl = "te"``), so
    only the 16-bit logits are read (:func:`perfmodel.compute.layer.fused_cross_entropy`) instead of
    the fp32 vocab-parallel softmax; other sources keep the era default.

    Example: Qwen3-235B on 256 GB200 (p8, 4096 tokens x 151936 columns on the last stage):
    34.8 GB moved per micro-batch unfused, 3.7 GB fused."""
    if BRIDGE_FUSED_CROSS_ENTROPY and "megatron-bridge" in str(r.get("source", "")).lower():
        return {"cross_entropy": "fused"}
    return {}


def recipe_facts(r: pd.Series) -> str:
    """The :data:`RECIPE_FACTS` of a row, and those of :data:`RECIPE_FACTS_BY_LAYOUT` where
    its release, model, GPU and parallel layout have one ('' when none)."""
    key = (str(r.get("release", "")), str(r["model"]), str(r.get("gpu_type", "")).upper())
    facts = [RECIPE_FACTS.get(key, ""), RECIPE_FACTS_BY_LAYOUT.get((*key, row_layout(r)), "")]
    return "; ".join(f for f in facts if f)


#: Megatron-Bridge releases with workload presets, in order (the dataset matched presets from
#: 25.11 on; 25.09's YAML disagrees with its table, so 25.09 rows are not inferred).
_PRESET_RELEASES = ("NeMo container 25.11", "NeMo container 26.02", "NeMo container 26.02.01")
_SWITCH_KEYS = ("moe_flex_dispatcher_backend=", "cuda_graph_impl=", "cuda_graph_scope=")


def _preset_matched(config_source: pd.Series) -> pd.Series:
    """Rows whose ``config_source`` names a matched Megatron-Bridge workload preset."""
    cs = config_source.astype(str)
    return cs.str.contains("workload_base_configs", regex=False) & cs.str.contains("::", regex=False)


def _switch_text(other: str) -> str:
    """The dispatcher / CUDA-graph items of an ``other_config`` ('' when none)."""
    return "; ".join(p.strip() for p in other.split(";")
                     if p.strip().startswith(_SWITCH_KEYS))


def sibling_recipe_switches(r: pd.Series, df: pd.DataFrame) -> str:
    """Dispatcher and CUDA-graph settings for a Megatron-Bridge row (25.11 on) whose own preset
    did not match (the dataset leaves its ``other_config`` empty: "no preset ... matched"):
    those of the matched preset of the same model and GPU in the same release, else in the
    nearest release with one (Megatron-Bridge keeps one workload preset per model, GPU and
    precision, whose scale variants share these settings). '' when there is none; matched
    rows keep their own (an empty ``other_config`` there means the preset sets none).

    Example: 25.11 DeepSeek-V3 on 256 GB200 without a match (E0018) takes E0020's
    ``moe_flex_dispatcher_backend=hybridep; cuda_graph_impl=transformer_engine;
    cuda_graph_scope=['moe_router', 'moe_preprocess']``."""
    rel = str(r.get("release", ""))
    own = _preset_matched(pd.Series([r.get("config_source", "")])).iloc[0]
    if rel not in _PRESET_RELEASES or own or "megatron-bridge" not in str(
            r.get("source", "")).lower():
        return ""
    same = df[(df["model"] == r["model"]) & (df["gpu_type"] == r["gpu_type"])
              & _preset_matched(df["config_source"])]
    if not len(same):
        return ""
    i = _PRESET_RELEASES.index(rel)
    dist = same["release"].map(lambda x: abs(_PRESET_RELEASES.index(x) - i)
                               if x in _PRESET_RELEASES else 99)
    best = same[dist == dist.min()]
    if dist.min() == 99:
        return ""
    texts = {_switch_text(str(o) if isinstance(o, str) else "") for o in best["other_config"]}
    return texts.pop() if len(texts) == 1 else ""  # siblings that disagree: none inferred


_GRAPH_PARTS = ("attn", "moe_router", "moe_preprocess", "mamba")


def dispatch_switches(r: pd.Series, other: str) -> dict:
    """The dispatcher switches a row names (:mod:`perfmodel.moe.dispatch`), from its
    ``other_config`` (lower-cased, with :data:`RECIPE_FACTS`) and its release:

    * ``moe_token_dispatcher``: ``flex`` where a flex backend is named
      (``moe_flex_dispatcher_backend=hybridep|deepep``, "dispatcher=flex / HybridEP"),
      ``allgather`` where named, else ``alltoall``; ``moe_flex_backend`` the backend named;
    * ``cuda_graph_scope``: the parts of ``cuda_graph_scope=[...]`` / "cuda_graphs=TE partial
      CUDA graphs: ..." that the model prices (``attn``, ``moe_router``, ``moe_preprocess``;
      ``mamba``: the Mamba2 mixers); none where the row says none or names none;
    * ``moe_router_fusion``: on for Megatron-Bridge (its performance recipes set
      ``moe_router_fusion = True``: ``set_qwen3_common_configs``,
      ``set_deepseek_v3_common_configs``) and for the Megatron-LM GB200 study's later stages,
      off for its baseline ("Router fusion" is the study's second step) and for the releases
      before Transformer Engine's fused router (MCore v0.8 / v0.9, dgxc 2024-25, NeMo 2.0
      25.02-25.07).
    """
    flex = "moe_flex_dispatcher_backend=" in other or "dispatcher=flex" in other
    dispatcher = "flex" if flex else ("allgather" if "dispatcher=allgather" in other
                                      else "alltoall")
    backend = "hybridep" if "hybridep" in other else "deepep"
    scope: tuple[str, ...] = ()
    m = re.search(r"cuda_graph_scope=\[([^\]]*)\]", other)
    m = m or re.search(r"cuda_graphs=te partial cuda graphs:([^;]*)", other)
    if m:
        named = re.findall(r"[a-z_]+", m.group(1))
        scope = tuple(p for p in _GRAPH_PARTS if p in named)
    source = str(r.get("source", "")).lower()
    notes = str(r.get("notes", "")).lower()
    fusion = "megatron-bridge" in source or (
        "optimizing deepseek-v3" in source and "stage: baseline" not in notes)
    return {"moe_token_dispatcher": dispatcher, "moe_flex_backend": backend,
            "cuda_graph_scope": scope, "moe_router_fusion": fusion}


#: Read each row's gradient-reduction dtype from its recipe (:func:`recipe_grad_reduce_in_fp32`).
#: Off by default: with it, 93 of 94 published recipes are predicted to fit (87 without) and
#: MAPE moves 11.19 -> 11.30 %, but the tuned-recipe check drops from 23 to 19 of 48 settings
#: (below its floor of 22; the freed memory and halved gradient traffic widen the search's gain
#: over the b 1-4 recipes, docs/moe.md "Gradient dtype of the recipes"). False: every row in fp32.
RECIPE_GRAD_DTYPE = False


def recipe_grad_reduce_in_fp32(r: pd.Series) -> bool:
    """Whether a row's recipe accumulates and reduces gradients in fp32 (Megatron-Core
    ``DistributedDataParallelConfig.grad_reduce_in_fp32``), as its source sets it:

    * Megatron-Bridge performance recipes (NeMo 25.09 - 26.02.01): **bf16**. Every MoE preset
      calls a common setter with ``cfg.mixed_precision.grad_reduce_in_fp32 = False`` and
      ``cfg.ddp.grad_reduce_in_fp32 = False``: ``set_deepseek_v3_common_configs``
      (``scripts/performance/configs/deepseek/deepseek_llm_pretrain.py``),
      ``set_qwen3_common_configs`` (``configs/qwen/qwen3_llm_pretrain.py``),
      ``set_gpt_oss_common_configs`` (``configs/gpt_oss/gpt_oss_llm_pretrain.py``);
    * NeMo 2.0 performance recipes (Mixtral, Llama 4 rows, all fp8): **bf16**, NeMo
      ``scripts/performance/helpers.py`` ``set_precision_configs``: for ``compute_dtype == "fp8"``
      ``recipe.trainer.plugins.grad_reduce_in_fp32 = False`` (bf16 keeps the plugin's fp32);
    * DGX Cloud Grok-1 (NeMo launcher ``grok1_314b.yaml``): **bf16**, ``optim.grad_sync_dtype:
      bf16`` with ``mcore_distributed_optim``, which NeMo's ``setup_mcore_distributed_parallel``
      maps to ``grad_reduce_in_fp32 = (grad_sync_dtype == 'fp32')``;
    * Megatron-LM itself (MoE README Mixtral rows, the DeepSeek-V3 GB200 study's launch script):
      **fp32**, ``--bf16`` sets ``accumulate_allreduce_grads_in_fp32`` unless
      ``--grad-reduce-in-bf16`` is passed (the study's script passes ``--main-grads-dtype fp32``
      and not that flag).
    """
    source = str(r.get("source", "")).lower()
    if "megatron-bridge" in source or "dgx cloud" in source:
        return False
    if "nemo framework" in source:
        return "fp8" not in str(r.get("precision", "")).lower()
    return True


def _default_etp(r: pd.Series, tp: int) -> int:
    """Expert tensor parallelism where the row leaves it empty: 1 for Megatron-Bridge (its MoE
    workload presets set ``expert_tensor_parallel_size=1``), else Megatron-Core's own default
    ``etp = tp`` (``parallel_state.initialize_model_parallel``: "if expert_tensor_parallel_size
    is None: expert_tensor_parallel_size = tensor_model_parallel_size"; NeMo 2.0's
    ``MegatronStrategy`` and the NeMo launcher leave it None; before MCore 0.10 the experts were
    split by tp, the same)."""
    return 1 if "megatron-bridge" in str(r.get("source", "")).lower() else tp


def moe_case_from_row(r: pd.Series, siblings: pd.DataFrame | None = None) -> Case:
    """One row of ``moe_runs_dev.csv`` as a :class:`~validation.validate.Case`; raises SpecError
    with the reason when the row cannot be expressed. ``siblings``: the whole table, to infer
    an unmatched row's dispatcher switches (:func:`sibling_recipe_switches`)."""
    model = model_from_row(r)
    measured = number_or_none(r["seconds_per_iteration"])
    if measured is None:
        tps = number_or_none(r["tokens_per_sec_per_gpu"])
        if tps is not None:
            measured = int(r["global_batch_size"]) * int(r["seq_len"]) / (
                tps * int(r["num_gpus"]))
        else:
            measured = _step_from_tflops(r, model)
    other = (str(r.get("other_config", "")) + "; " + recipe_facts(r)).lower()
    if siblings is not None:
        other += "; " + sibling_recipe_switches(r, siblings).lower()
    cf = re.search(r"moe_expert_capacity_factor=([0-9.]+)", other)
    pad = bool(cf) and "moe_pad_expert_input_to_capacity=true" in other
    if cf:  # token-dropping run (Grok-1: 1.0 with the expert inputs padded to capacity)
        model = model.model_copy(update={"moe_capacity_factor": float(cf.group(1))})
    cluster = _cluster(r)
    recompute_text = recipe_recompute(r, other)
    training = TrainingSpec(
        global_batch_size=int(r["global_batch_size"]), seq_len=int(r["seq_len"]),
        precision=_precision(str(r["precision"])), optimizer="adam",
        **{**era_switches(modern=True), **recipe_attention_switches(r, other, cluster.gpu),
           **recipe_loss_switches(r)},
        overlap_moe_comm="moe_a2a_overlap=true" in other,
        moe_parallel_folding=release_moe_parallel_folding(str(r.get("release", ""))),
        moe_pad_expert_input_to_capacity=pad, **dispatch_switches(r, other),
        cuda_graph_full_iteration=full_iteration_graph(other),
        recompute_modules=recompute_modules(recompute_text),
        grad_reduce_in_fp32=recipe_grad_reduce_in_fp32(r) if RECIPE_GRAD_DTYPE else True,
    )
    gpus = int(r["num_gpus"])
    t = int(number_or_none(r["tensor_parallel"]) or 1)
    p = int(number_or_none(r["pipeline_parallel"]) or 1)
    cp = int(number_or_none(r["context_parallel"]) or 1)
    vp = int(number_or_none(r["virtual_pipeline_stages"]) or 1)
    ep = int(number_or_none(r["expert_parallel"]) or 1)
    etp = int(number_or_none(r["expert_tensor_parallel"]) or _default_etp(r, t))
    fsdp = bool(number_or_none(r["fsdp"]))
    dp = gpus // (t * p * cp)
    cfg = ParallelConfig(
        dp=dp, tp=t, pp=p, vp=vp, cp=cp, ep=ep, etp=etp, zero_stage=3 if fsdp else 1,
        micro_batch_size=int(r["micro_batch_size"]),
        recompute=_recompute(recompute_text), sequence_parallel=t > 1,
        schedule="interleaved" if vp > 1 else "1f1b",
    )
    # uneven pipelines: the recipe's own layout where it names one (the embedding and the loss
    # counted as layers), else check the rest against a layer count that divides and evaluate
    # the real one
    chunks = p * vp
    check_model = model
    if bridge_accounts_embedding_and_loss(r, model, p, vp):
        cfg = cfg.model_copy(update={"embedding_as_layer": True, "loss_as_layer": True})
    elif model.num_layers % chunks:
        check_model = model.model_copy(update={"num_layers": chunks * -(-model.num_layers
                                                                         // chunks)})
    try:
        cfg = resolve_config(cfg, check_model, training, cluster)
    except SpecError as err:
        if "must divide tp*cp*dp" in str(err):  # ep*etp*pp larger than the GPU count
            # Megatron-Core initialize_model_parallel: world_size % (etp*ep*pp) == 0. The row's
            # own GA (= GBS / (MBS * dp)) fixes dp, hence pp, so the EP cell is what disagrees.
            ga = number_or_none(r.get("grad_accum"))
            ga_note = ""
            if ga and int(ga) * cfg.micro_batch_size * dp == int(r["global_batch_size"]):
                ga_note = (f"; the row's GA {int(ga)} = GBS/(MBS*dp) confirms dp {dp} and pp {p}")
            raise SpecError(
                f"published layout is not runnable in Megatron-Core: {err}; ep*etp*pp = "
                f"{ep * etp * p} > {gpus} GPUs (initialize_model_parallel needs world_size % "
                f"(etp*ep*pp) == 0){ga_note}") from None
        raise
    return Case(str(r["row_id"]), str(r["model"]), model, training, cluster, cfg,
                float(measured), "step", str(r.get("status", "")),
                release_preset(str(r.get("release", ""))))


def release_preset(release: str) -> str:
    """The ``--framework`` of a row's request: its release's preset
    (:data:`RELEASE_FRAMEWORK`), Megatron-LM main (``megatron-lm``) for a release without one
    (the row's recipe switches ride on it, :func:`validation.requests.row_framework`)."""
    fw = release_framework(release)
    return "megatron-lm" if fw is None else fw.name


def row_request(r: pd.Series, case: Case) -> dict:
    """The :class:`search.request.PlanRequest` keywords of a MoE row: the case on the model and
    per-rank layout it is timed with (:func:`timed_model_and_batch`)."""
    return case_options(case, case.framework, model=timed_model(r, case),
                        stage_layers=bridge_stage_layers(r, case.config))


#: Whether the Megatron-Bridge Qwen3-235B rows are timed on the recipe's pipeline split (the
#: embedding and the loss counted as layers); False: the padded even split of
#: :func:`slowest_rank_model` (a switch for the refit and the docs).
BRIDGE_QWEN3_235B_SPLIT = True


def bridge_accounts_embedding_and_loss(r: pd.Series, model: ModelSpec, pp: int, vp: int) -> bool:
    """Whether a row runs Megatron-Bridge's Qwen3-235B pipeline split: ``qwen3_235b_a22b_
    pretrain_config`` (``recipes/qwen/qwen3_moe.py``, which the performance scripts build on)
    sets ``account_for_embedding_in_pipeline_split = True`` and ``account_for_loss_in_pipeline_
    split = True``, so Megatron-Core (``transformer_block.get_num_layers_to_build``) splits
    ``L + 2`` over the ``pp*vp`` chunks and the first chunk holds one decoder layer fewer (the
    embedding), the last one fewer (the loss). 94 layers on pp 8: ranks 11, 12 x 6, 11; on
    pp 8 x vp 3: chunks of 4, ranks 0 and 7 hold 3 + 4 + 4; pp 4 x vp 12: ranks of 24, the
    first and last 23. Only where ``L`` does not divide ``pp*vp`` and ``L + 2`` does."""
    if not BRIDGE_QWEN3_235B_SPLIT or pp <= 1:
        return False
    if not (str(r["model"]).lower().startswith("qwen3-235b")
            and "megatron-bridge" in str(r.get("source", "")).lower()):
        return False
    chunks = pp * vp
    return model.num_layers % chunks != 0 and (model.num_layers + 2) % chunks == 0


def slowest_rank_model(model: ModelSpec, cfg: ParallelConfig) -> ModelSpec:
    """The model whose even split paces the published uneven pipeline: Megatron puts at most
    ``ceil(L / (pp*vp))`` layers in each of the ``pp*vp`` model chunks (Megatron-Bridge's
    ``pipeline_model_parallel_layout`` maps, e.g. DeepSeek-V3 ``(4, 4)``: ``[E + 4 decoder]``,
    14 x ``[4]``, ``[1 decoder + MTP + loss]``), and the pipeline runs at the pace of a rank with
    full chunks. So a model of ``pp*vp*ceil(L/(pp*vp))`` layers split evenly has that rank's time
    (61 DeepSeek-V3 layers on pp 4 x vp 4: 16 a rank, not 15.25). Unchanged when the layers
    divide or the config names its layout (the embedding / loss counted as layers: Bridge's
    Qwen3-235B, :func:`bridge_accounts_embedding_and_loss`; padded, its last rank had carried 12
    layers and the logits instead of 11 and the logits)."""
    chunks = cfg.pp * cfg.vp
    if model.num_layers % chunks == 0 or cfg.embedding_as_layer or cfg.loss_as_layer:
        return model  # divides, or the row names its layout (bridge_accounts_embedding_and_loss)
    return model.model_copy(update={"num_layers": chunks * -(-model.num_layers // chunks)})


#: Megatron-Bridge's DeepSeek-V3 pipeline layouts, ``(pp, vp) -> decoder layers per model
#: chunk`` (chunk ``c`` on rank ``c % pp``; the first chunk also holds the embedding, the last
#: the MTP layers and the loss): ``recipes/deepseek/deepseek_v3.py`` ``layout_map``
#: (``[["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 14 + [["decoder"] + last_layer]``
#: for (16, 1), (8, 2) and (4, 4), ``last_layer = ["mtp"] * mtp_num_layers + ["loss"]``).
BRIDGE_DEEPSEEK_V3_CHUNKS = {
    (4, 1): [16, 16, 16, 13],
    (8, 1): [8] * 7 + [5],
    (4, 2): [8] * 7 + [5],
    (16, 1): [4] * 15 + [1],
    (8, 2): [4] * 15 + [1],
    (4, 4): [4] * 15 + [1],
}


def bridge_stage_layers(r: pd.Series, cfg: ParallelConfig) -> list[int] | None:
    """Decoder layers per pipeline rank of the row's Megatron-Bridge DeepSeek-V3 layout (all its
    chunks), or None where the recipe names none for the row's ``(pp, vp)`` (those rows keep
    :func:`slowest_rank_model`, whose padding leaves the MTP layer in the missing layers' place).
    E.g. (4, 4): ranks 0-2 hold 16 decoder layers, rank 3 holds 13 + MTP + loss."""
    if not (str(r["model"]).lower().startswith("deepseek-v3")
            and "megatron-bridge" in str(r.get("source", "")).lower()):
        return None
    chunks = BRIDGE_DEEPSEEK_V3_CHUNKS.get((cfg.pp, cfg.vp))
    if chunks is None:
        return None
    ranks = [0] * cfg.pp
    for c, n in enumerate(chunks):
        ranks[c % cfg.pp] += n
    return ranks


def with_stage_layers(batch: ConfigBatch, ranks: list[int]) -> ConfigBatch:
    """A one-config batch with a per-rank layout. Set on the batch, not the ParallelConfig: the
    config's check wants every rank's layers a multiple of vp (its memory model splits them
    evenly over the chunks), which Megatron-Core's ``pipeline_model_parallel_layout`` does not
    (13 layers over 4 chunks as 4 + 4 + 4 + 1); the stage times need only the per-rank counts."""
    zero = np.zeros(1, dtype=np.int64)
    return dataclasses.replace(batch, stage_layers=np.array([ranks], dtype=np.int64),
                               first_stage_layers=zero, last_stage_layers=zero.copy(),
                               embedding_as_layer=np.zeros(1, dtype=bool),
                               loss_as_layer=np.zeros(1, dtype=bool))


def timed_model(r: pd.Series, case: Case) -> ModelSpec:
    """The model of :func:`timed_model_and_batch` (the padded model of an even split, or the
    real one with its MTP layers on a named layout)."""
    if bridge_stage_layers(r, case.config) is None:
        return slowest_rank_model(case.model, case.config)
    return case.model.model_copy(update={"mtp_num_layers": flop_convention(r)[1]})


def timed_model_and_batch(r: pd.Series, case: Case) -> tuple[ModelSpec, ConfigBatch]:
    """The model and batch a row is timed with: with a known Megatron-Bridge DeepSeek-V3 layout
    (:func:`bridge_stage_layers`) the real 61-layer model on that layout, its MTP layers as the
    row's FLOP convention states (:func:`flop_convention`: on unless "w/o MTP"; they run on the
    last stage, :mod:`perfmodel.compute.mtp`); otherwise :func:`slowest_rank_model` on the even split."""
    batch = ConfigBatch.from_configs([case.config])
    ranks = bridge_stage_layers(r, case.config)
    if ranks is None:
        return slowest_rank_model(case.model, case.config), batch
    model = case.model.model_copy(update={"mtp_num_layers": flop_convention(r)[1]})
    return model, with_stage_layers(batch, ranks)


def moe_runs_report(path: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predicted vs measured step time for every expressible MoE row.

    Returns ``(report, skipped)`` like :func:`validation.validate.training_runs_report`; the report
    also has ``gpu``, ``precision`` and ``status``.
    """
    df = pd.read_csv(path or VALIDATION_DIR / "moe_runs_dev.csv")
    rows, skipped = [], []
    for _, r in df.iterrows():
        try:
            case = moe_case_from_row(r, df)
        except SpecError as err:
            skipped.append({"row_id": r["row_id"], "model": r["model"], "reason": str(err)})
            continue
        # the request a user types (validation.requests), through plan's own evaluation
        pred, row = predict_options(row_request(r, case))
        c = case.config
        rows.append({
            "row_id": case.row_id, "model": case.label, "gpu": str(r["gpu_type"]),
            "gpus": int(r["num_gpus"]), "precision": case.training.precision,
            "config": f"t{c.tp} p{c.pp} v{c.vp} cp{c.cp} ep{c.ep} etp{c.etp} d{c.dp} "
                      f"b{c.micro_batch_size} m{c.num_microbatches} {c.recompute}",
            "status": case.reliability, "measured_s": case.measured_step_s, "predicted_s": pred,
            "error": pred / case.measured_step_s - 1.0,
            "fits": bool(row.get("fits", False)), "framework": _framework_name(case),
        })
    return pd.DataFrame(rows), pd.DataFrame(skipped, columns=["row_id", "model", "reason"])


def moe_row_requests(path: Path | None = None) -> dict[str, dict]:
    """Row id -> :class:`search.request.PlanRequest` keywords (:func:`row_request`) of every
    row :func:`moe_runs_report` predicts."""
    df = pd.read_csv(path or VALIDATION_DIR / "moe_runs_dev.csv")
    out = {}
    for _, r in df.iterrows():
        try:
            case = moe_case_from_row(r, df)
        except SpecError:
            continue
        out[case.row_id] = row_request(r, case)
    return out


def _framework_name(case: Case) -> str:
    """The ``--framework`` a row's request names (``<preset>+recipe``: the preset carrying
    the row's own switches)."""
    fw = row_framework(case.framework, case.training, case.model.is_moe)
    return fw if isinstance(fw, str) else fw.name


def moe_summary(report: pd.DataFrame) -> dict:
    err = report["error"].abs()
    return {"rows": len(report), "mape": float(err.mean()),
            "within_10pct": float((err <= 0.10).mean()),
            "max_abs_error": float(err.max()) if len(report) else 0.0,
            "worst_row": str(report.loc[err.idxmax(), "row_id"]) if len(report) else ""}


#: The framework preset whose ``[capabilities]`` each row's release runs under (first match of
#: the row's ``release``): the tuned search keeps to what that release can run (etp = tp before
#: Megatron-Core 0.10, no uneven interleaving before 0.11, ...), with the row's own switches.
#: dgxc v24.11.1 (Grok-1, NeMo-Framework-Launcher on a NeMo dev container of Nov 2024): taken as
#: NeMo 24.09 (Megatron-Core 0.9), the container the same dgxc release names for its Nemotron
#: recipes (training_runs_dev.csv: "NeMo 24.09 container (table title says 24.11)"); its
#: grok1_314b.yaml sets no expert_tensor_parallel_size. Releases without a preset of their own
#: (dgxc v25.02.01 = NeMo 24.12 / Megatron-Core 0.10; NeMo 25.02 - 25.07) are not constrained.
RELEASE_FRAMEWORK = (("MCore v0.8", "nemo-24.07"), ("MCore v0.9", "nemo-24.09"),
                     ("dgxc v24.11.1", "nemo-24.09"), ("NeMo container 25.09", "bridge-25.09"),
                     ("NeMo container 25.11", "bridge-25.x"),
                     ("NeMo container 26.02", "bridge-26.02"),
                     ("Megatron-Core dev", "megatron-lm"))


def release_framework(release: str) -> FrameworkSpec | None:
    """The preset of a row's release (:data:`RELEASE_FRAMEWORK`), or None."""
    for prefix, name in RELEASE_FRAMEWORK:
        if str(release).startswith(prefix):
            return load_framework(name)
    return None


def release_moe_parallel_folding(release: str) -> bool:
    """Whether a row's release lays the experts out with MoE parallel folding: its preset's
    ``[capabilities.moe_parallel_folding]`` (:data:`RELEASE_FRAMEWORK`; False for Megatron-Core
    0.8 / 0.9, :mod:`perfmodel.moe.expert_layout`), True where the preset does not say or the
    release has none."""
    fw = release_framework(release)
    cap = None if fw is None else fw.capabilities.moe_parallel_folding
    return True if cap is None else bool(cap.value)


def moe_tuned_report(path: Path | None = None, limit: int | None = None,
                     release_capabilities: bool = True) -> pd.DataFrame:
    """Tuned-recipe check: for each distinct setting (model, GPU, GPU count, global batch,
    sequence, precision) the published recipe's measured step time over the best step time a
    free search predicts (same training setup; ep, etp, tp, pp, vp, cp, micro-batch, recompute
    searched). A planner whose search is right finds a recipe within [0.90, 1.15] of the
    measured one.

    ``measured`` is the best (shortest) measured step time among the setting's rows: the
    recipes are tuned, so the fastest published one is the reference. The ratio splits into
    ``measured / recipe_predicted`` (the published config's own time error) times
    ``search_gain = recipe_predicted / predicted_best`` (how much faster the search thinks it
    can do); ``recipe_fits`` says whether the published config fits the memory model (it ran,
    so False is a pessimistic memory prediction).

    Where the search's gain comes from: ``gain_by_term_s`` is, per term of the step time
    (:data:`perfmodel.step.evaluate.TIME_TERMS`), the recipe's predicted seconds less the pick's (they
    sum to ``recipe_predicted_s - predicted_best_s``); ``gain_term`` / ``gain_term_s`` name the
    largest. ``recipe_microbatches`` / ``best_microbatches`` show whether the pick amortises
    per-micro-batch costs (the dispatcher's host sync, the all-to-all latency) over fewer, larger
    micro-batches; ``recipe_hbm_frac`` / ``best_hbm_frac`` are the predicted peaks over the
    usable HBM (a pick near 1.0 lives on the memory model's accuracy).

    ``release_capabilities``: the search keeps to what the row's release runs
    (:func:`release_framework`, its capabilities with the row's own switches); ``framework``
    names the preset (empty: not constrained)."""

    df = pd.read_csv(path or VALIDATION_DIR / "moe_runs_dev.csv")
    release = dict(zip(df["row_id"].astype(str), df["release"].astype(str), strict=True))
    cases = []
    for _, r in df.iterrows():
        try:
            cases.append(moe_case_from_row(r, df))
        except SpecError:
            continue
    best: dict[tuple, Case] = {}
    for c in cases:
        key = (c.label, c.cluster.gpu.name, c.cluster.total_gpus, c.training.global_batch_size,
               c.training.seq_len, c.training.precision)
        if key not in best or c.measured_step_s < best[key].measured_step_s:
            best[key] = c
    rows = []
    for i, (key, c) in enumerate(sorted(best.items(), key=lambda kv: str(kv[0]))):
        if limit is not None and i >= limit:
            break
        fw = release_framework(release[c.row_id]) if release_capabilities else None
        forced = 1.0 if imbalance_defaulted(c.training, c.model, None) else None
        r = plan(c.model, c.cluster, c.training, top=1, uneven_layers=True,
                 zero_stage=c.config.zero_stage, sequence_parallel=None, moe_imbalance=forced,
                 framework=with_switches_of(load_framework("ideal") if fw is None else fw,
                                            c.training))
        pred = float(r.top["step_time_s"].iloc[0]) if r.fits_any else float("nan")
        own = evaluate(c.model, c.training, c.cluster, ConfigBatch.from_configs([c.config]))
        recipe_s = float(own.step_time_s[0])
        rows.append({"model": key[0], "gpu": key[1], "gpus": key[2], "global_batch": key[3],
                     "seq_len": key[4], "precision": key[5], "row_id": c.row_id,
                     "measured_s": c.measured_step_s, "predicted_best_s": pred,
                     "ratio": c.measured_step_s / pred if not math.isnan(pred) else float("nan"),
                     "recipe_predicted_s": recipe_s, "recipe_fits": bool(own.fits[0]),
                     "search_gain": recipe_s / pred if not math.isnan(pred) else float("nan"),
                     "best_config": _cfg_text(r.top.iloc[0]) if r.fits_any else "",
                     "framework": "" if fw is None else fw.name,
                     **_gain_split(own, c.config, r)})
    out = pd.DataFrame(rows)
    if len(out):
        out["ok"] = (out["ratio"] >= 0.90) & (out["ratio"] <= 1.15)
    return out


def _gain_split(own, recipe: ParallelConfig, result) -> dict:
    """The tuned check's attribution columns (see :func:`moe_tuned_report`): the recipe's
    evaluation ``own`` against the search's pick (``result.top``'s first row)."""
    usable = float(result.usable_bytes) or float("nan")
    out = {"recipe_microbatches": int(recipe.num_microbatches),
           "recipe_hbm_frac": float(own.memory_bytes["peak"][0]) / usable}
    if not result.fits_any:
        return {**out, "best_microbatches": 0, "best_hbm_frac": float("nan"),
                "gain_by_term_s": {}, "gain_term": "", "gain_term_s": float("nan")}
    best = result.top.iloc[0]
    split = {k: float(own.time_s[k][0]) - float(best[f"{k}_time_s"]) for k in TIME_TERMS}
    term = max(split, key=split.get)
    return {**out, "best_microbatches": int(best["num_microbatches"]),
            "best_hbm_frac": float(best["peak_memory_bytes"]) / usable,
            "gain_by_term_s": split, "gain_term": term, "gain_term_s": split[term]}


RECIPE_ERROR_BAND = 0.10
"""A tuned-check miss is the recipe's own time error when the published config is predicted more
than this far from its measured time (the dev rows' 10 % MAPE target)."""

SEARCH_GAIN_BAND = 1.15
"""... and a search-gain miss when the search claims more than this speed-up over the published
config's own prediction (the band's upper edge: a pick that much faster is to be checked)."""


def tuned_miss_kind(measured_s, recipe_predicted_s, search_gain) -> str:
    """Why a tuned-check setting is outside [0.90, 1.15] (its ratio is
    ``measured / recipe_predicted x search_gain``): ``"recipe"`` where the published config's
    own prediction is off by more than :data:`RECIPE_ERROR_BAND`, ``"gain"`` where the search
    claims more than :data:`SEARCH_GAIN_BAND` over it, ``"both"``, or ``"split"`` where neither
    alone is outside but their product is.

    Example: measured 14.47 s, recipe predicted 11.38 s (-21 %), gain 1.06: ``"recipe"``."""
    err = recipe_predicted_s / measured_s - 1.0
    rec, gain = abs(err) > RECIPE_ERROR_BAND, search_gain > SEARCH_GAIN_BAND
    return "both" if rec and gain else "recipe" if rec else "gain" if gain else "split"


def moe_tuned_summary(tuned: pd.DataFrame) -> dict:
    """Settings of the tuned-recipe check, how many are within [0.90, 1.15], and the misses by
    kind (:func:`tuned_miss_kind`: the recipe's own time error, the search's claimed gain, both,
    or the two together)."""
    n = len(tuned)
    ok = int(tuned["ok"].sum()) if n else 0
    kinds = {"recipe": 0, "gain": 0, "both": 0, "split": 0}
    for r in tuned[~tuned["ok"]].itertuples() if n else ():
        kinds[tuned_miss_kind(r.measured_s, r.recipe_predicted_s, r.search_gain)] += 1
    return {"settings": n, "within": ok, "fraction": ok / n if n else float("nan"),
            "band": [0.90, 1.15], "misses_by_kind": kinds}


def print_moe_tuned(out, tuned: pd.DataFrame) -> None:
    """The tuned-recipe check as a table and its one-line summary."""
    from rich.table import Table

    t = Table(title="MoE tuned recipes: best published over the search's best", title_justify="left")
    for col in ("model", "GPU", "GPUs", "batch", "precision", "measured", "search best",
                "ratio", "recipe err", "gain", "search's config", "gain mostly from"):
        t.add_column(col, justify="left" if col in ("model", "GPU", "precision",
                                                    "search's config", "gain mostly from")
                     else "right")
    for r in tuned.itertuples():
        src = (f"{r.gain_term} {r.gain_term_s:.3g} s (m {r.recipe_microbatches} -> "
               f"{r.best_microbatches})" if r.gain_term else "")
        t.add_row(r.model, r.gpu, str(r.gpus), str(r.global_batch), r.precision,
                  f"{r.measured_s:.4g} s", f"{r.predicted_best_s:.4g} s", f"{r.ratio:.2f}",
                  f"{r.recipe_predicted_s / r.measured_s - 1.0:+.1%}", f"{r.search_gain:.2f}",
                  r.best_config, src)
    out.print(t)
    s = moe_tuned_summary(tuned)
    k = s["misses_by_kind"]
    out.print(f"tuned-recipe check: {s['within']} of {s['settings']} settings within "
              f"[0.90, 1.15] ({s['fraction']:.0%}); outside: {k['recipe']} the recipe's own "
              f"time off > {RECIPE_ERROR_BAND:.0%}, {k['gain']} a search gain > "
              f"{SEARCH_GAIN_BAND:.2f}x, {k['both']} both, {k['split']} the two together")


def _cfg_text(row) -> str:
    return (f"t{row['tp']} p{row['pp']} v{row['vp']} cp{row['cp']} ep{row['ep']} "
            f"etp{row['etp']} d{row['dp']} b{row['micro_batch_size']} {row['recompute']}")


def moe_doc(path: Path | None = None) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """The MoE section of ``plan validate --json``: summary, rows, refused rows."""
    report, skipped = moe_runs_report(path)
    doc = {"summary": moe_summary(report), "rows": report.to_dict("records"),
           "skipped": skipped.to_dict("records")}
    return doc, report, skipped


def print_moe_report(out, report: pd.DataFrame, skipped: pd.DataFrame) -> None:
    """The MoE rows as a table on a rich console, then the summary and the refused rows."""
    from rich.table import Table

    t = Table(title="published MoE runs: predicted vs measured step time", title_justify="left")
    for col in ("row", "model", "GPUs", "config", "prec", "measured", "predicted", "error"):
        t.add_column(col, justify="right" if col in ("GPUs", "measured", "predicted", "error")
                     else "left")
    for r in report.itertuples():
        t.add_row(r.row_id, r.model, f"{r.gpus} {r.gpu}", r.config, r.precision,
                  f"{r.measured_s:.4g} s", f"{r.predicted_s:.4g} s", f"{r.error:+.1%}")
    out.print(t)
    s = moe_summary(report)
    out.print(f"{s['rows']} MoE rows: MAPE {s['mape']:.1%}, {s['within_10pct']:.0%} within 10%, "
              f"worst {s['worst_row']} ({s['max_abs_error']:.1%})")
    for r in skipped.itertuples():
        out.print(f"not expressible: {r.row_id} {r.model}: {r.reason}")
