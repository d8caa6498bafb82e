"""Validation report: predicted versus published step times.

Three data sets ship in ``hardware_specs/validation`` (copied from the project's shared folder):

* ``training_runs_dev.csv``: published multi-GPU training runs (Megatron-LM 2020/2021,
  Korthikanti 2022, NeMo 24.07). Each row becomes (model, training setup, cluster, config); rows
  the tool cannot express are listed with the reason.
* ``vtrain/ground_truth_*.csv``: 1,549 measured A100 iteration times (vTrain, MICRO 2024), used
  as a ranking test: within one model on one GPU count, Spearman correlation of predicted and
  measured times.
* the H200 single-GPU steps are checked in ``tests/validation`` against the shipped calibration.

The mapping from a row to specs uses only what the source states plus documented software
facts of each framework era (what it overlapped, whether it had flash attention); nothing is
fitted per row.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import ValidationError

from hardware_specs import ROOT as SPECS_ROOT
from perfmodel.comm import comm_time
from perfmodel.compute import attention_kernels
from perfmodel.compute import layer as compute
from perfmodel.core.errors import SpecError
from perfmodel.hardware import profile as profile_mod
from perfmodel.hardware.calibration import calibration_for
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.frameworks import load_framework
from perfmodel.spec.specs import (
    ClusterSpec,
    ModelSpec,
    TrainingSpec,
    format_validation_error,
    load_cluster,
)
from perfmodel.step.profiled import evaluate_profiled as profile_evaluate
from search.api import plan
from validation.requests import case_options, predict_options, row_framework
from validation.runs import read_runs

VALIDATION_DIR = SPECS_ROOT / "validation"


@dataclass(frozen=True)
class Case:
    """One published run expressed in the tool's terms."""

    row_id: str
    label: str
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    config: ParallelConfig
    measured_step_s: float
    scope: str  # "step" or "layer" (Korthikanti Table 4: one layer's fwd+bwd)
    reliability: str
    framework: str = ""  # the preset of the release the row ran (its plan's --framework)


def number_or_none(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


_CLUSTER_BY_GPU = (  # (substrings of gpu_type / interconnect text, cluster preset); first match
    (("GB300",), "gb300-nvl72"),
    (("GB200",), "gb200-nvl72"),
    (("B200",), "dgx-b200"),
    (("H200",), "dgx-h200"),
    (("H100",), "dgx-h100"),
    (("MI300",), "mi300x-8"),
    (("A100", "40GB"), "dgx-a100-40g"),
    (("A100",), "dgx-a100-80g"),
    (("V100", "SXM2"), "dgx-v100"),
    (("V100", "DGX-1"), "dgx-v100"),
    (("V100",), "dgx2-v100"),
)


def cluster_for(gpu_type: str, gpus: int) -> ClusterSpec:
    """The cluster preset of a published run's GPU (DGX-class nodes of that GPU)."""
    g = gpu_type.upper()
    for keys, name in _CLUSTER_BY_GPU:
        if all(k in g for k in keys):
            per_node = load_cluster(name).gpus_per_node
            if gpus <= per_node or gpus % per_node == 0:
                return load_cluster(name, gpus=gpus)
            raise SpecError(f"{gpus} GPUs is not whole {name} nodes")
    raise SpecError(f"gpu_type {gpu_type!r} has no cluster preset")


#: The first A100 with 80 GB (HBM2e, 2.0 TB/s) was announced in November 2020 (NVIDIA press
#: release, SC20); until then every A100 was the 40 GB part (HBM2, 1.555 TB/s).
A100_80GB_FIRST_YEAR = 2021


def _dated_gpu_type(r: pd.Series) -> str:
    """The row's GPU type, with an A100 of unstated memory read as the 40 GB part when the run's
    software is dated before the 80 GB part existed (:data:`A100_80GB_FIRST_YEAR`)."""
    g = str(r["gpu_type"])
    up = g.upper()
    if "A100" in up and "80" not in up and "40" not in up:
        years = _years(str(r.get("software", "")))
        if years and max(years) < A100_80GB_FIRST_YEAR:
            return g + " (A100-SXM4-40GB: the only A100 before Nov 2020)"
    return g


def _years(*texts: str) -> list[int]:
    return [int(y) for t in texts for y in re.findall(r"\b(20[12]\d)\b", t)]


def _modern(r: pd.Series) -> bool:
    """Whether a run used a current software stack (flash attention, overlapped data-, tensor-
    and pipeline-parallel communication, distributed optimizer): NeMo / Megatron-Core /
    torchtitan era, any Hopper or newer GPU, or a source dated 2023 or later. Megatron-LM
    2020-2022 (and DeepSpeed of that time) had none of these."""
    low = " ".join(str(r.get(k, "")) for k in ("source", "software")).lower()
    if any(k in low for k in ("nemo", "megatron-core", "mcore", "torchtitan", "transformer engine",
                              "transformer-engine", "flash")):
        return True
    if any(k in str(r.get("gpu_type", "")).upper() for k in ("H100", "H200", "B200", "GB2",
                                                              "GB3", "MI300")):
        return True
    # the software's own date when given (a paper may be published a year after its runs)
    years = _years(str(r.get("software", ""))) or _years(str(r.get("source", "")))
    return bool(years) and max(years) >= 2023


def _count(r: pd.Series, col: str, *, minimum: int = 1) -> int:
    """A whole number >= minimum from a CSV cell, or SpecError naming the column and value."""
    v = number_or_none(r.get(col))
    if v is None or not v.is_integer() or v < minimum:
        raise SpecError(f"{col} = {r.get(col)!r}: expected a whole number >= {minimum}")
    return int(v)


def _opt_count(r: pd.Series, col: str, default: int | None) -> int | None:
    """Like :func:`_count`, but a blank cell gives ``default``."""
    v = r.get(col)
    if v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == "":
        return default
    return _count(r, col)


#: Columns every row needs (the rest may be blank).

#: the switches a row's software era decides (the rest follow the source's recipe below)
ERA_SWITCHES = ("overlap_grad_reduce", "overlap_tp_comm", "overlap_p2p_comm", "flash_attention")


def era_switches(modern: bool) -> dict[str, bool]:
    """Overlap and flash-attention switches of a run's era, read from the framework presets
    (``nemo-24.07`` for a current stack, ``megatron-2021`` for Megatron-LM 2020-2022)."""
    fw = load_framework("nemo-24.07" if modern else "megatron-2021").training_switches()
    return {k: fw[k] for k in ERA_SWITCHES}


#: The attention environment of the DGX Cloud recipes behind the dev rows, keyed by the recipe
#: directory (or README) their ``source_locator`` names: NVIDIA/dgxc-benchmarking
#: ``<dir>/configure.sh`` of the v24.11.1 tables ("export NVTE_FLASH_ATTN=0 / NVTE_FUSED_ATTN=1"
#: in llama3.1; nemotron sets NVTE_FUSED_ATTN=1 for 15b and 0 for 340b; grok1
#: NVTE_FUSED_ATTN=0). Transformer Engine's choice under it: :func:`attention_switches`.
DGXC_ATTENTION_ENV = {
    "llama3.1/": "nvte_flash_attn=0; nvte_fused_attn=1",
    "nemotron/README_15b": "nvte_fused_attn=1",
    "nemotron/README_340b": "nvte_fused_attn=0",
    "grok1/": "nvte_fused_attn=0",
}


def dgxc_attention_env(r: pd.Series) -> str:
    """The :data:`DGXC_ATTENTION_ENV` entry of a DGX Cloud row ('' for other sources)."""
    loc = str(r.get("source_locator", ""))
    if "dgx cloud" not in str(r.get("source", "")).lower():
        return ""
    return next((env for key, env in DGXC_ATTENTION_ENV.items() if key in loc), "")


def attention_switches(gpu, env: str, *, softmax_type: str = "vanilla",
                       cudnn_version: tuple[int, ...] | None = None, mla: bool = False) -> dict:
    """``flash_attention`` / ``attention_backend`` for a run whose environment text ``env``
    (lower-case ``nvte_fused_attn=0`` / ``nvte_flash_attn=0`` items) is given: the backend
    Transformer Engine selects (:func:`perfmodel.compute.attention_kernels.te_attention_backend`);
    the unfused one as ``flash_attention = False``.

    Example: H100 with ``nvte_fused_attn=0`` -> ``{"flash_attention": True,
    "attention_backend": "flash-attn-2"}``.
    """
    backend = attention_kernels.te_attention_backend(
        gpu, nvte_fused_attn="nvte_fused_attn=0" not in env,
        nvte_flash_attn="nvte_flash_attn=0" not in env, softmax_type=softmax_type,
        cudnn_version=cudnn_version, mla=mla)
    if backend == "unfused":
        return {"flash_attention": False}
    return {"flash_attention": True, "attention_backend": backend}


_GATED = ("llama", "mistral", "mixtral", "qwen", "gemma", "deepseek", "yi-", "baichuan", "olmo")


#: Megatron-Bridge performance presets' ``cpu_offloading_num_layers`` for its Megatron-FSDP
#: configurations (scripts/performance/configs/llama/llama3_workload_base_configs.py and
#: llama31_workload_base_configs.py), keyed by (model, system, precision); the summary tables
#: the rows come from do not print it, the presets they were run with do.
BRIDGE_FSDP_CPU_OFFLOAD_LAYERS = {
    ("llama3_70b", "gb300", "bf16"): 30, ("llama3_70b", "gb300", "fp8"): 20,
    ("llama3_70b", "gb200", "bf16"): 20, ("llama3_70b", "gb200", "fp8"): 40,
    ("llama3_70b", "b200", "fp8"): 5,
    ("llama3.1_405b", "gb300", "bf16"): 40, ("llama3.1_405b", "gb300", "fp8"): 10,
    ("llama3.1_405b", "gb200", "fp8"): 95,
}


def _bridge_cpu_offload_layers(r: pd.Series, zero_txt: str, src_txt: str,
                               precision: str) -> int:
    """CPU-offloaded layers of a Megatron-Bridge Megatron-FSDP row (its preset's
    ``cpu_offloading_num_layers``, :data:`BRIDGE_FSDP_CPU_OFFLOAD_LAYERS`), else 0."""
    if "megatron-bridge" not in src_txt or "megatron-fsdp" not in zero_txt:
        return 0
    g = str(r["gpu_type"]).lower()
    system = next((k for k in ("gb300", "gb200", "b200") if k in g), "")
    low = precision.startswith(("fp8", "mxfp8", "nvfp4", "fp4"))  # any low-precision recipe
    key = (str(r["model"]).lower(), system, "fp8" if low else precision)
    return BRIDGE_FSDP_CPU_OFFLOAD_LAYERS.get(key, 0)


def _mbs_from_ga_column(r: pd.Series, gb: float, d: int, mbs: int) -> int:
    """The micro-batch a row's own gradient-accumulation column implies, where the notes give
    one ("GA column = N") and the table's shared MBS column contradicts it: a parenthetical
    variant of a Megatron-Bridge table cell shares the cell's MBS but states its own GA (R0172:
    GBS 128, dp 8, GA 16 -> micro-batch 1, the FP8-MX preset's, not the FSDP variant's 2)."""
    m = re.search(r"GA column = (\d+)", str(r.get("notes", "")))
    if not m or not gb:
        return mbs
    ga = int(m.group(1))
    implied = gb / (d * ga)
    if implied != mbs and float(implied).is_integer() and implied >= 1:
        return int(implied)
    return mbs


def _bridge_parenthetical(r: pd.Series) -> bool:
    """Whether a Megatron-Bridge row is the parenthetical variant of its table cell: the FP8-MX
    (MXFP8) run. The 25.11 tables label those FP8-MX; the 25.09 tables print no precision, but
    their parenthetical layouts are the FP8_MX presets of the same release's performance scripts
    (``scripts/performance/configs/llama/llama31_workload_base_configs.py``: GB200 405B FP8_MX
    tp4 pp8 cp2 vp8, FP8_CS Megatron-FSDP tp2; ``llama3_workload_base_configs.py``: GB200 70B
    FP8_MX tp2 pp4 vp5, FP8_CS Megatron-FSDP)."""
    return ("megatron-bridge" in str(r.get("source", "")).lower()
            and "parenthetical variant" in str(r.get("notes", "")).lower())


def precision_from_text(text: str, modern: bool = True, parenthetical: bool = False) -> str:
    """The ``--precision`` name (dtype or low-precision recipe) of a published row's precision
    text: FP4 -> nvfp4; FP8-MX / MXFP8 -> mxfp8 (Blackwell MXFP8 block scaling); ``parenthetical``
    (a 25.09 Megatron-Bridge row that is the FP8-MX variant of its table cell) -> mxfp8; FP8-CS /
    current scaling -> fp8-cs; FP8 blockwise -> fp8-block; any other FP8 -> fp8-delayed (NeMo
    24.x / Transformer Engine's default DelayedScaling, "hybrid"); BF16; FP32 / TF32 unless mixed;
    else fp16 before the bf16 era (``modern`` False), bf16 after.

    Example: "FP8-CS (inferred)" -> fp8-cs; "MXFP8 (footnote: '32x32' granularity)" -> mxfp8;
    "FP8 (TE delayed scaling, fp8_hybrid)" -> fp8-delayed."""
    t = text.lower()
    if "fp4" in t:
        return "nvfp4"
    if "fp8-mx" in t or "mxfp8" in t:
        return "mxfp8"  # Megatron-Bridge FP8-MX: MXFP8 block scaling (Blackwell)
    if parenthetical:
        return "mxfp8"  # 25.09: the FP8-MX variant of a Megatron-Bridge table cell
    if "fp8-cs" in t or "current scaling" in t:
        return "fp8-cs"  # Megatron-Bridge 25.x FP8-CS (25.09 rows: inferred, see README)
    if "block" in t and "fp8" in t:
        return "fp8-block"
    if "fp8" in t:
        return "fp8-delayed"  # NeMo 24.x / TE default recipe: delayed scaling ("hybrid")
    if "bf16" in t or "bfloat" in t:
        return "bf16"
    if ("fp32" in t or "tf32" in t) and "mixed" not in t:
        return "fp32"
    return "fp16" if not modern else "bf16"


def case_from_row(r: pd.Series) -> Case:
    """Express one row of a training-runs CSV (the columns of ``training_runs_dev.csv``);
    raises SpecError with the reason if the tool cannot express it."""
    # the steps run in this order so that a row with several problems reports the same first one
    layer_scope = str(r["measurement_scope"]).lower().startswith("one transformer layer")
    gb = _row_global_batch(r, layer_scope)
    modern = _modern(r)
    model = _row_model(r, modern)
    training = _row_training(r, model.max_seq_len, gb, modern)
    cfg, gpus = _row_config(r, gb, modern)
    cluster = cluster_for(_dated_gpu_type(r), gpus)
    scope = "layer" if layer_scope else "step"
    if layer_scope:  # one micro-batch through one layer on one data-parallel rank
        training = training.model_copy(update={"global_batch_size": cfg.micro_batch_size})
        cfg = cfg.model_copy(update={"dp": 1})
    measured = _row_measured_s(r, layer_scope, gb, model.max_seq_len, gpus)
    cfg = resolve_config(cfg, model, training, cluster if scope == "step" else None)
    return Case(r["row_id"], str(r["model"]), model, training, cluster, cfg, float(measured),
                scope, str(r["reliability"])[:2].strip(), row_framework_preset(r, modern))


def row_framework_preset(r: pd.Series, modern: bool) -> str:
    """The framework preset of the release a dense row ran (its request's ``framework``): the
    vendor source's release (:data:`VENDOR_SOURCE_FRAMEWORK`), DeepSpeed's ZeRO-3 for a
    DeepSpeed row (``deepspeed-2021`` before 2023), Megatron-LM v3.0 (``megatron-2022``:
    selective recompute, sequence parallelism) for Korthikanti et al. 2022, ``megatron-2020``
    for Megatron-LM's 2020 README runs, else the era's
    stack of :func:`era_switches` (``nemo-24.07`` current, ``megatron-2021`` before)."""
    group = source_group(str(r.get("source", "")))
    if "deepspeed" in str(r["zero_or_dist_optimizer"]).lower():
        return "deepspeed" if modern else "deepspeed-2021"
    if "megatron-lm (2020)" in " ".join(str(r.get(k, "")) for k in ("source", "software")).lower():
        return "megatron-2020"  # its fp16 loss scaler (_row_switches)
    if group in VENDOR_SOURCE_FRAMEWORK:
        return VENDOR_SOURCE_FRAMEWORK[group]
    if group == "Korthikanti 2022":
        return "megatron-2022"
    return "nemo-24.07" if modern else "megatron-2021"


def _row_global_batch(r: pd.Series, layer_scope: bool) -> float:
    """The row's global batch [sequences]: one micro-batch for a one-layer measurement."""
    gb = number_or_none(r["global_batch_size"])
    if layer_scope:
        gb = number_or_none(r["micro_batch_size"])  # one micro-batch through one layer
    if gb is None:
        raise SpecError("global batch size not published")
    return gb


def _row_model(r: pd.Series, modern: bool) -> ModelSpec:
    """The dense model of a row: its published shape, and the architecture of its family
    (gated MLP and RoPE for the Llama-like, squared ReLU for Nemotron, GPT-3's otherwise)."""
    name = str(r["model"])
    lname = name.lower()
    if any(k in lname for k in ("moe", "mixtral", "switch", "deepseek-v", "expert")):
        raise SpecError("mixture-of-experts run: give it in the columns of moe_runs_dev.csv "
                        "(validation.validate_moe), which carry the expert layout")
    L, h = _count(r, "num_layers"), _count(r, "hidden_size")
    heads = _count(r, "num_attention_heads")
    kv = number_or_none(r.get("num_query_groups"))
    gated = any(k in lname for k in _GATED)
    is_nemotron = "nemotron" in lname
    rope = gated or is_nemotron or "bloom" not in lname and modern and "gpt" not in lname
    vocab = number_or_none(r.get("vocab_size"))
    if vocab is None:
        # NeMo's default tokenizers: Nemotron 256000, GPT-3 51200 (validation README notes).
        vocab = 256000 if is_nemotron else (128256 if "llama3" in lname.replace("-", "")
                                            else 32000 if gated else 51200)
    act = "swiglu" if gated else ("relu2" if is_nemotron else "gelu")
    seq = _count(r, "seq_len")
    return ModelSpec(
        name=name,
        num_layers=L,
        hidden_size=h,
        num_attention_heads=heads,
        num_kv_heads=int(kv) if kv else None,
        ffn_hidden_size=int(number_or_none(r.get("ffn_hidden_size")) or 4 * h),
        vocab_size=int(vocab),
        max_seq_len=seq,
        activation=act,
        norm="rmsnorm" if gated else "layernorm",
        position_embedding="rope" if rope else "learned",
        tied_embeddings=not (gated or is_nemotron),
        linear_bias=not (gated or is_nemotron),
    )


def _row_training(r: pd.Series, seq: int, gb: float, modern: bool) -> TrainingSpec:
    """The training setup of a row: its precision and its software's switches."""
    prec_txt = str(r["precision"]).lower()
    precision = precision_from_text(prec_txt, modern, "fp8" in prec_txt and "inferred" in prec_txt
                                    and _bridge_parenthetical(r))
    sw = _row_switches(r, modern, precision)
    return TrainingSpec(global_batch_size=int(gb), seq_len=seq, precision=precision,
                        optimizer="adam", **sw)


def _row_switches(r: pd.Series, modern: bool, precision: str) -> dict:
    """The overlap, attention, reduction and offload switches of a row's software."""
    # the era's overlap and attention switches, from its framework preset: Megatron-LM 2020-2022
    # (gradient all-reduce after the flush, no TP overlap, blocking p2p, fused softmax storing
    # the attention scores) or a current Megatron-Core / NeMo stack
    sw = era_switches(modern)
    zero_txt = str(r["zero_or_dist_optimizer"]).lower()
    src_txt = " ".join(str(r.get(k, "")) for k in ("source", "software")).lower()
    if any(k in src_txt for k in ("nemo", "megatron-bridge", "dgxc")):
        # NVIDIA's performance recipes reduce gradients in bf16: NeMo 2 / Megatron-Bridge
        # set grad_reduce_in_fp32 = False (scripts/performance, recipes' performance mode)
        sw["grad_reduce_in_fp32"] = False
        # and their fp8 recipes keep fp8 model weights (NeMo bf16_with_fp8_mixed: fp8_params /
        # fp8_param_gather = True)
        sw["fp8_params"] = True
    if "megatron-bridge" in src_txt:
        # Megatron-Bridge's performance recipes fuse the loss with Transformer Engine's kernel
        # (``_benchmark_common``: cross_entropy_fusion_impl = "te")
        sw["cross_entropy"] = "fused"
    if not modern and precision == "fp16" and "deepspeed" not in zero_txt:
        # Megatron-LM 2020-2022 fp16 runs keep 16-bit gradients and reduce them in fp16: 2020's
        # local DDP all-reduces each parameter dtype's gradients as they are (megatron/model/
        # distributed.py allreduce_params; --fp32-allreduce off by default), 2021-22 accumulate
        # in fp32 only with --accumulate-allreduce-grads-in-fp32 (forced for bf16; the fp16
        # examples/sc21 scripts do not set it)
        sw["grad_reduce_in_fp32"] = False
        if "megatron-lm (2020)" in src_txt:
            # 2020's apex-style dynamic loss scaler checks every fp16 gradient on its own
            # (megatron/fp16/loss_scaler.py _has_inf_or_nan: float(x.float().sum()))
            sw["fp16_overflow_check"] = "per-tensor"
    n_off = _bridge_cpu_offload_layers(r, zero_txt, src_txt, precision)
    if n_off:
        sw["cpu_offload_layers"] = n_off
    if "megatron-bridge" in src_txt:
        # Megatron-Bridge's performance scripts turn the fused weight-gradient accumulation off
        # with Megatron-FSDP (the switch acts under zero_stage 3 only, as the bridge presets set
        # it; scripts/performance/configs/llama/llama3_llm_pretrain.py, 70B and 8B, and
        # llama31_llm_pretrain.py, 405B: "if cfg.ddp.use_megatron_fsdp: ...
        # cfg.model.gradient_accumulation_fusion = False  # Disabled to avoid functional errors")
        sw["fsdp_gradient_accumulation_fusion"] = False
    if "deepspeed" in zero_txt and not modern:
        # DeepSpeed ZeRO-3 (2021) gathers parameter by parameter (perfmodel.comm.zero3_deepspeed)
        sw["zero3_gather"] = load_framework("deepspeed-2021").zero3_gather
    env = dgxc_attention_env(r)
    if env and modern:  # the attention kernel the recipe's environment leaves TE
        sw.update(attention_switches(cluster_for(_dated_gpu_type(r), 8).gpu, env))
    return sw


def _row_config(r: pd.Series, gb: float, modern: bool) -> tuple[ParallelConfig, int]:
    """The row's parallel configuration (unresolved) and its GPU count."""
    t = _opt_count(r, "tensor_parallel", 1)
    p = _opt_count(r, "pipeline_parallel", 1)
    cp = _opt_count(r, "context_parallel", 1)
    gpus = _count(r, "num_gpus")
    d = _opt_count(r, "data_parallel", None) or gpus // (t * p * cp)
    if d < 1:
        raise SpecError(f"tp*pp*cp ({t}*{p}*{cp}) exceeds num_gpus ({gpus})")
    vp = _opt_count(r, "virtual_pipeline_stages", 1)
    mbs = _row_micro_batch(r, gb, d, p)
    zero_txt = str(r["zero_or_dist_optimizer"]).lower()
    sp_txt = str(r["sequence_parallel"]).lower()
    sp_off = sp_txt in ("n", "no", "false", "off", "0")
    sp = sp_txt.startswith("y") or (modern and t > 1 and not sp_off)
    cfg = ParallelConfig(
        dp=d, tp=t, pp=p, vp=vp, cp=cp, zero_stage=_row_zero_stage(zero_txt, modern),
        micro_batch_size=mbs, recompute=_row_recompute(r, modern), sequence_parallel=sp,
        schedule="interleaved" if vp > 1 else "1f1b",
    )
    return cfg, gpus


def _row_micro_batch(r: pd.Series, gb: float, d: int, p: int) -> int:
    """The row's micro-batch [sequences]: published, or the whole per-rank batch of a
    one-micro-batch step, corrected by the row's own gradient-accumulation column."""
    mbs = number_or_none(r["micro_batch_size"])
    if mbs is None:
        # Megatron README 2020 rows print no micro-batch: one micro-batch per step (p = 1).
        if p > 1 or gb % d or gb < d:
            raise SpecError("micro_batch_size not published (and not one micro-batch per "
                            f"step: pp {p}, global batch {gb:g}, dp {d})")
        mbs = gb / d
    if not float(mbs).is_integer() or mbs < 1:
        raise SpecError(f"micro_batch_size = {mbs!r}: expected a whole number >= 1")
    return _mbs_from_ga_column(r, gb, d, int(mbs))


def _row_recompute(r: pd.Series, modern: bool) -> str:
    """The row's activation recompute mode."""
    rec_txt = str(r["activation_recompute"]).lower()
    if rec_txt.startswith("full"):
        return "full"
    if rec_txt.startswith("selective"):
        return "selective"
    if modern or rec_txt.startswith("none"):
        return "none"
    return "full"  # Megatron/DeepSpeed era runs of this size used full recompute


def _row_zero_stage(zero_txt: str, modern: bool) -> int:
    """The ZeRO stage of a row's optimizer text (distributed optimizer: 1, FSDP: 3)."""
    fsdp = "fsdp" in zero_txt and "fsdp=0" not in zero_txt  # "DDP (table FSDP=0)": no FSDP
    if "stage 3" in zero_txt or "zero-3" in zero_txt or fsdp:
        return 3
    if "stage 2" in zero_txt or "zero-2" in zero_txt:
        return 2
    if "stage 1" in zero_txt or "zero-1" in zero_txt or "distributed optimizer" in zero_txt:
        return 1
    if zero_txt.startswith(("none", "no ")):
        return 0
    return 1 if modern else 0


def _row_measured_s(r: pd.Series, layer_scope: bool, gb: float, seq: int, gpus: int) -> float:
    """The row's measured time [s]: its iteration time, or the step its tokens/s imply."""
    measured = number_or_none(r["seconds_per_iteration"])
    if not layer_scope and measured is None:
        tps = number_or_none(r["tokens_per_sec_per_gpu"])
        if tps is None:
            tps_total = number_or_none(r.get("tokens_per_sec_total"))
            if tps_total is None:
                raise SpecError("neither iteration time nor tokens/s published")
            tps = tps_total / gpus
        measured = gb * seq / (tps * gpus)
    if measured is None:
        raise SpecError("no measured time")
    if not math.isfinite(measured) or measured <= 0:
        raise SpecError(f"measured time {measured!r} s: expected a positive number")
    return measured


def case_request(case: Case, profile=None) -> dict:
    """The :class:`search.request.PlanRequest` keywords of a step-scope case: what a user types
    to predict the row (:func:`validation.requests.case_options`, ``--framework`` the row's
    release)."""
    return case_options(case, case.framework, profile=profile)


def predict_row(case: Case, profile=None) -> tuple[float, bool | None]:
    """Predicted seconds for a case's measured quantity as ``plan validate`` reports it: a step
    through the request a user types (:func:`case_request`, evaluated by ``plan``'s own
    :func:`search.api.plan_request`), one layer's time (no request takes it) by
    :func:`predict_case`; and whether the step fits in memory (None: a layer)."""
    if case.scope != "step":
        return predict_case(case, profile=profile), None
    step_s, row = predict_options(case_request(case, profile))
    return step_s, bool(row.get("fits", False))


def predict_case(case: Case, kernels: str = "fused", profile=None) -> float:
    """Predicted seconds for the case's measured quantity (under an efficiency profile: a
    :class:`perfmodel.hardware.profile.EfficiencyProfile`, a shipped name or a TOML path), by
    the step model directly: the refits' inner loop (:mod:`validation.calibrate`,
    :mod:`validation.forward`); for a step the same number as :func:`predict_row`'s request
    (``tests/validation/test_one_path.py``)."""
    prof = profile_mod.load_profile(profile)
    batch = ConfigBatch.from_configs([case.config])
    if case.scope == "layer":
        cal, cluster = None, case.cluster
        if prof is not None and not prof.is_neutral:
            cal = prof.calibration(calibration_for(cluster.gpu), case.training.precision)
            cluster = prof.cluster(cluster)
        ct = compute.compute_times(case.model, case.training, cluster.gpu, batch,
                                   kernels=kernels, calibration=cal)
        cm = comm_time.comm_times(case.model, case.training, cluster, batch)
        layer = (ct["layer_fwd_s"] + ct["layer_bwd_s"] + ct["layer_recompute_s"]
                 + cm["tp_layer_fwd_s"] + cm["tp_layer_bwd_s"])
        return float(layer[0])
    res = profile_evaluate(case.model, case.training, case.cluster, batch, profile=prof,
                               kernels=kernels)
    return float(res.step_time_s[0])


def training_runs_report(path: Path | pd.DataFrame | None = None, profile=None,
                         progress=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predicted vs published for every expressible row (under ``profile``, see
    :func:`predict_case`).

    ``path``: a runs CSV (default: the dev split) or a table :func:`validation.runs.read_runs`
    read; ``progress(done, total)`` is called before each row
    (:func:`validation.runs.row_progress`).

    Returns ``(report, skipped)``: ``report`` has row_id, model, gpus, measured_s, predicted_s,
    error (signed fraction); ``skipped`` has row_id and reason.
    """
    df = path if isinstance(path, pd.DataFrame) else read_runs(path)
    rows, skipped = [], []
    for i, (_, r) in enumerate(df.iterrows()):
        if progress is not None:  # progress(done, total): validation.runs.row_progress
            progress(i, len(df))
        try:
            case = case_from_row(r)
            pred, fits = predict_row(case, profile=profile)
        except ValidationError as err:
            skipped.append({"row_id": r["row_id"], "model": r["model"],
                            "reason": format_validation_error(err)})
            continue
        except (SpecError, ValueError, TypeError, ZeroDivisionError, OverflowError) as err:
            skipped.append({"row_id": r["row_id"], "model": r["model"], "reason": str(err)})
            continue
        if not math.isfinite(pred):
            skipped.append({"row_id": r["row_id"], "model": r["model"],
                            "reason": f"prediction is {pred} (the configuration is invalid)"})
            continue
        c = case.config
        rows.append({
            "row_id": case.row_id,
            "model": case.label,
            "gpus": int(r["num_gpus"]),
            "config": f"d{c.dp} t{c.tp} p{c.pp} v{c.vp} cp{c.cp} z{c.zero_stage} "
                      f"b{c.micro_batch_size} m{c.num_microbatches} {c.recompute}"
                      f"{' sp' if c.sequence_parallel else ''}",
            "scope": case.scope,
            "reliability": case.reliability,
            "measured_s": case.measured_step_s,
            "predicted_s": pred,
            "error": pred / case.measured_step_s - 1.0,
            "source": source_group(str(r["source"])),
            "gpu_type": case.cluster.gpu.name,
            "precision": case.training.precision_name,
            "framework": request_framework_name(case),
            "fits": fits,
        })
    return pd.DataFrame(rows), pd.DataFrame(skipped, columns=["row_id", "model", "reason"])


def row_requests(path: Path | pd.DataFrame | None = None) -> dict[str, dict]:
    """Row id -> :class:`search.request.PlanRequest` keywords (:func:`case_request`) of every
    step-scope row :func:`training_runs_report` predicts."""
    df = path if isinstance(path, pd.DataFrame) else read_runs(path)
    out = {}
    for _, r in df.iterrows():
        try:
            case = case_from_row(r)
        except (SpecError, ValidationError, ValueError):
            continue
        if case.scope == "step":
            out[case.row_id] = case_request(case)
    return out


def request_framework_name(case: Case) -> str:
    """The ``--framework`` of a case's request: its release's preset, or ``<preset>+recipe``
    where the row's recipe switches differ from the preset's
    (:func:`validation.requests.row_framework`); '' for a one-layer row (no request)."""
    if case.scope != "step":
        return ""
    fw = row_framework(case.framework, case.training, case.model.is_moe)
    return fw if isinstance(fw, str) else fw.name




_SOURCE_GROUPS = (  # (substring of the source text, short name); first match
    ("Narayanan", "Megatron-LM 2021"), ("Megatron-LM README", "Megatron-LM README 2020"),
    ("Korthikanti", "Korthikanti 2022"), ("24.07", "NeMo 24.07"),
    ("dgxc", "NeMo 24.09 DGX Cloud"), ("25.09", "Megatron-Bridge 25.09"),
    ("25.11", "Megatron-Bridge 25.11"),
)
#: The framework preset (``hardware_specs/frameworks``) each vendor source ran: the tuned
#: search keeps to what that stack can run (its ZeRO stages, schedules, recompute modes).
VENDOR_SOURCE_FRAMEWORK = {"NeMo 24.07": "nemo-24.07", "NeMo 24.09 DGX Cloud": "nemo-24.09",
                     "Megatron-Bridge 25.09": "bridge-25.09", "Megatron-Bridge 25.11": "bridge-25.x"}
#: Sources that publish tuned vendor recipes (what ``--tuned`` searches against).
VENDOR_RECIPE_SOURCES = ("NeMo 24.07", "NeMo 24.09 DGX Cloud", "Megatron-Bridge 25.09",
                         "Megatron-Bridge 25.11")


def source_group(source: str) -> str:
    """Short name of a row's source (its publication / framework release)."""
    low = source.lower()
    for key, name in _SOURCE_GROUPS:
        if key.lower() in low:
            return name
    return source[:32]


def group_table(report: pd.DataFrame) -> pd.DataFrame:
    """Rows grouped by source x GPU type x precision: count, mean signed error (bias), MAPE."""
    if report.empty or "source" not in report.columns:
        return pd.DataFrame(columns=["source", "gpu_type", "precision", "rows", "bias", "mape"])
    g = report.groupby(["source", "gpu_type", "precision"], sort=False)["error"]
    out = pd.DataFrame({"rows": g.size(), "bias": g.mean(),
                        "mape": g.apply(lambda e: float(e.abs().mean()))}).reset_index()
    return out


def tuned_report(path: Path | None = None) -> pd.DataFrame:
    """Free search per distinct vendor-recipe setting (model, GPU type, GPU count, global batch,
    sequence, precision): the best predicted step time versus the recipe's measured one.

    Nothing but the setting is pinned: the search is the planner's own (grid over dp, tp, pp,
    vp, cp, ZeRO, micro-batch, recompute, schedule). ``ratio = measured / predicted best``; a
    planner may beat a tuned recipe by a little (ratio a bit above 1) but not by a lot, and
    should not lose to it (ratio below 1).
    """

    df = read_runs(path)
    settings: dict[tuple, list] = {}
    for _, r in df.iterrows():
        if source_group(str(r["source"])) not in VENDOR_RECIPE_SOURCES:
            continue
        try:
            case = case_from_row(r)
        except SpecError:
            continue
        if "proxy" in case.label.lower():
            continue  # fewer layers than the model: no free search of the real one
        t = case.training
        key = (case.model.name, case.model.num_layers, case.cluster.gpu.name,
               int(r["num_gpus"]), t.global_batch_size, t.seq_len, t.precision_name)
        key = key + ((source_group(str(r["source"])),),)
        settings.setdefault(key, []).append(case)
    rows = []
    for key, cases in settings.items():
        c0 = cases[0]
        measured = min(c.measured_step_s for c in cases)
        try:
            res = plan(c0.model, c0.cluster, c0.training, gpus=key[3], top=1,
                       framework=VENDOR_SOURCE_FRAMEWORK.get(key[-1][0], "ideal"))
            best = float(res.best_row["step_time_s"])
            cfg = res.best_row["config"]
            txt = (f"d{cfg['dp']} t{cfg['tp']} p{cfg['pp']} v{cfg['vp']} cp{cfg['cp']} "
                   f"z{cfg['zero_stage']} b{cfg['micro_batch_size']} {cfg['recompute']}")
        except SpecError as err:
            best, txt = float("nan"), f"no feasible config: {err}"
        rows.append({"model": key[0], "gpu_type": key[2], "gpus": key[3], "global_batch": key[4],
                     "seq_len": key[5], "precision": key[6], "source": key[-1][0], "measured_s": measured,
                     "predicted_best_s": best, "ratio": measured / best, "best_config": txt,
                     "recipe_rows": ",".join(c.row_id for c in cases)})
    return pd.DataFrame(rows)


def summary(report: pd.DataFrame) -> dict:
    """MAPE and worst row of a training-runs report."""
    if len(report) == 0:
        return {"rows": 0, "mape": float("nan"), "max_abs_error": float("nan"), "worst_row": ""}
    err = report["error"].abs()
    return {
        "rows": len(report),
        "mape": float(err.mean()),
        "max_abs_error": float(err.max()),
        "worst_row": str(report.loc[err.idxmax(), "row_id"]) if len(report) else "",
    }


