"""The training stack a user will launch (``--framework``): its switches and what it can run.

A framework preset (``hardware_specs/frameworks/*.toml``) names a stack and release
(``megatron-2022``, ``nemo-24.09``, ``bridge-25.x``, ``deepspeed``, ``torchtitan``, ...). It sets
that stack's training switches together (communication overlaps, flash attention) and states what
it can run (ZeRO stages, ZeRO with pipelines, schedules, recompute modes, sequence / context
parallelism, uneven pipeline stages), so that a search keeps to configurations the stack accepts.

Each preset file cites the framework source or paper its values come from. What a release
added later (MoE parallel folding, the flex token dispatcher, scoped CUDA graphs, uneven
interleaved pipelines, ...) is its ``[capabilities]`` table: one entry per capability, each with
the release note or framework file it is read from (:class:`Capabilities`); the search space
keeps to it (:func:`capability_mask`) and a pinned setting outside it is a one-line SpecError
naming the framework, its release and the setting (:func:`capability_refusals`,
:func:`check_training_supported`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from perfmodel.core.codes import (
    CP_COMM,
    RECOMPUTE,
    SCHEDULE,
    CpCommName,
    RecomputeName,
    ScheduleName,
)
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import (
    RECIPE_PRECISIONS,
    GPUSpec,
    ModelSpec,
    RecomputeModule,
    Spec,
    TrainingSpec,
    build_spec,
    resolve_spec,
)

__all__ = ["DEFAULT_FRAMEWORKS", "RECIPE_MIN_COMPUTE_CAPABILITY",
           "Capabilities", "FrameworkSpec", "apply_framework", "capability_mask",
           "capability_refusals", "check_training_supported", "default_framework",
           "explicit_layout_allowed", "framework_pins", "load_framework", "with_switches_of", "zero_pp_allowed"]

#: Precisions a launch config can name (``emit.launch`` maps each to the stack's switch): the
#: names of :data:`perfmodel.spec.specs.RECIPE_PRECISIONS` (plain ``fp8`` is delayed scaling,
#: ``fp4`` NVFP4, as :data:`perfmodel.spec.specs.PRECISION_RECIPES` resolves them).
PrecisionRecipe = Literal[RECIPE_PRECISIONS]


class Capability(Spec):
    """One thing a stack's release can or cannot run, and where that is stated."""

    source: str = Field(min_length=1, description="the release note, or the framework file "
                        "at a commit, that states it")

    @model_validator(mode="before")
    @classmethod
    def _tuple_value(cls, data: Any) -> Any:  # TOML has no tuples
        if isinstance(data, dict) and isinstance(data.get("value"), list):
            data = {**data, "value": tuple(data["value"])}
        return data


class Supported(Capability):
    value: bool


class ExpertTensorParallel(Capability):
    value: Literal["tp", "1-or-tp", "any"] = Field(
        description="expert tensor parallelism the stack runs: 'tp' (the experts split by the "
        "attention's tp), '1-or-tp', or 'any' divisor (MoE parallel folding)")


class Dispatchers(Capability):
    value: tuple[Literal["alltoall", "allgather", "flex"], ...]


class FlexBackends(Capability):
    value: tuple[Literal["deepep", "hybridep"], ...]


class GraphScopes(Capability):
    value: tuple[Literal["attn", "moe_router", "moe_preprocess", "mamba"], ...]


class RecomputeModules(Capability):
    value: tuple[RecomputeModule, ...]


class CpCommTypes(Capability):
    value: tuple[CpCommName, ...] = Field(min_length=1)


class OffloadKinds(Capability):
    value: tuple[Literal["optimizer", "params", "activations"], ...]


class Capabilities(Spec):
    """What a release can run beyond the stack-wide fields of :class:`FrameworkSpec`; an entry
    left out is not constrained."""

    moe: Supported | None = Field(default=None, description="mixture-of-experts layers at all")
    expert_tensor_parallel: ExpertTensorParallel | None = None
    expert_parallel_spans_cp_tp: Supported | None = Field(
        default=None, description="ep is a multiple of cp * tp / etp (torchtitan builds the "
        "expert mesh from dp_shard * cp, and * tp when etp = 1)")
    moe_context_parallel: Supported | None = Field(
        default=None, description="context parallelism in a MoE model")
    cp_comm_types: CpCommTypes | None = Field(
        default=None, description="how the context-parallel ranks exchange attention "
        "(cp_comm_type): 'p2p' the ring, 'a2a' Ulysses (perfmodel.comm.cp_a2a), 'allgather' "
        "the K/V all-gather (perfmodel.comm.cp_allgather), 'a2a+p2p' both, hierarchically "
        "(perfmodel.comm.cp_hierarchical); the search and a pinned cp_comm keep to them; left "
        "out: not constrained")
    moe_parallel_folding: Supported | None = Field(
        default=None, description="the expert groups are laid out by MoE parallel folding "
        "(Megatron-Core >= 0.10); false: the earlier layout (ep carved out of dp, ep | dp; "
        "perfmodel.moe.expert_layout), copied into the TrainingSpec's moe_parallel_folding")
    moe_token_dispatchers: Dispatchers | None = None
    moe_flex_backends: FlexBackends | None = None
    cuda_graph_scopes: GraphScopes | None = Field(
        default=None, description="parts Transformer Engine partial CUDA graphs may capture")
    uneven_interleaved: Supported | None = Field(
        default=None, description="the interleaved schedule (vp > 1) with stages of unequal "
        "layer counts")
    pipeline_layout: Supported | None = Field(
        default=None, description="explicit per-chunk pipeline layouts "
        "(--pipeline-model-parallel-layout / pipeline_model_parallel_layout, Megatron-Core >= "
        "0.13): the search may then use the balanced layout where pp*vp does not divide the "
        "layers (perfmodel.parallel.layers.balanced_stage_layers); left out: not used")
    recompute_modules: RecomputeModules | None = Field(
        default=None, description="modules selective recompute can name")
    hsdp: Supported | None = Field(
        default=None, description="hybrid sharding: ZeRO-3 within a shard group, replicated "
        "across groups (torchtitan data_parallel_shard_degree / data_parallel_replicate_degree); "
        "true: the search tries shard groups (perfmodel.comm.hsdp); left out: not searched")
    offload: OffloadKinds | None = Field(
        default=None, description="what the stack can offload to host memory (optimizer, "
        "params, activations): the search tries it when nothing fits "
        "(perfmodel.memory.optimizer_offload); left out: not searched")


class FrameworkSpec(Spec):
    """One training stack and release: its switches and its capabilities."""

    name: str
    stack: Literal["megatron", "deepspeed", "torchtitan"] = Field(
        description="family whose launch format (`--emit`) this stack reads")
    release: str
    source: str = Field(description="where the values below come from")
    # switches copied into the TrainingSpec (see TrainingSpec for their meaning)
    overlap_grad_reduce: bool
    overlap_tp_comm: bool
    overlap_p2p_comm: bool
    flash_attention: bool
    zero3_gather: Literal["layer", "tensor"] = "layer"
    grad_reduce_in_fp32: bool = Field(
        default=True, description="fp32 main-grad buffer and reduction (Megatron-LM's bf16 "
        "default); NeMo's performance recipes reduce in bf16")
    fp16_grads_in_fp16: bool = Field(
        default=False, description="fp16 training keeps 16-bit gradients and reduces them in "
        "fp16 (Megatron-LM 2020-2022: fp32 accumulation only with "
        "--accumulate-allreduce-grads-in-fp32, forced for bf16)")
    fp8_params: bool = Field(
        default=False, description="fp8 recipes keep fp8 model weights (--fp8-param-gather)")
    fp16_overflow_check: Literal["fused", "per-tensor"] | None = Field(
        default=None, description="fp16 loss scaling's gradient check (Megatron-LM 2020: "
        "apex's per-tensor check, megatron/fp16/loss_scaler.py; None: the TrainingSpec's)")
    fsdp_gradient_accumulation_fusion: bool | None = Field(
        default=None, description="the weight-gradient GEMMs accumulate into main_grad under "
        "Megatron-FSDP (Megatron-Bridge's performance configs turn it off when "
        "use_megatron_fsdp; None: the TrainingSpec's, on)")
    cross_entropy: Literal["fp32", "fused"] = Field(
        default="fp32", description="the loss kernel: 'fused' = Transformer Engine's in-place "
        "parallel_cross_entropy (Megatron-Bridge performance recipes)")
    moe_token_dispatcher: Literal["alltoall", "allgather", "flex"] | None = Field(
        default=None, description="MoE token dispatcher the stack's recipes use (None: the "
        "TrainingSpec's)")
    moe_flex_backend: Literal["deepep", "hybridep"] | None = None
    moe_router_fusion: bool | None = Field(
        default=None, description="fused router kernels (--moe-router-fusion; Transformer "
        "Engine 2.5+, Megatron-Core 0.14+)")
    cuda_graph_scope: tuple[Literal["attn", "moe_router", "moe_preprocess", "mamba"],
                            ...] | None = Field(
        default=None, description="Transformer Engine partial CUDA graphs the recipes enable")
    attention_backend: Literal["cudnn", "flash-attn-2"] | None = Field(
        default=None, description="attention kernel the recipes leave Transformer Engine "
        "(NVTE_FUSED_ATTN=0 without flash-attn 3: 'flash-attn-2'; None: the TrainingSpec's)")
    # capabilities: what a search may choose for this stack
    zero_stages: tuple[Literal[0, 1, 2, 3], ...] = Field(min_length=1)
    max_zero_stage_with_pp: Literal[0, 1, 2, 3] = Field(
        description="highest ZeRO stage the stack runs together with pipeline parallelism")
    schedules: tuple[ScheduleName, ...] = Field(min_length=1)
    recompute: tuple[RecomputeName, ...] = Field(min_length=1)
    sequence_parallel: Literal["off", "optional", "required"] = Field(
        description="Megatron-style sequence parallelism with tp > 1: never, either, always")
    context_parallel: bool
    uneven_pipeline: bool = Field(description="stages may hold different layer counts")
    precisions: tuple[PrecisionRecipe, ...] = Field(
        default=RECIPE_PRECISIONS, min_length=1,
        description="precision recipes the stack's launch config can switch on")
    capabilities: Capabilities = Field(default_factory=Capabilities)

    @model_validator(mode="after")
    def _switches_within_capabilities(self) -> FrameworkSpec:
        c = self.capabilities
        for name, value, cap in (
                ("moe_token_dispatcher", self.moe_token_dispatcher, c.moe_token_dispatchers),
                ("moe_flex_backend", self.moe_flex_backend, c.moe_flex_backends)):
            if value is not None and cap is not None and value not in cap.value:
                raise ValueError(f"{name} = {value!r} is not among capabilities: "
                                 f"{', '.join(cap.value) or 'none'}")
        scope, cap = self.cuda_graph_scope, c.cuda_graph_scopes
        if scope is not None and cap is not None and not set(scope) <= set(cap.value):
            raise ValueError(f"cuda_graph_scope = {list(scope)} is not within capabilities: "
                             f"{', '.join(cap.value) or 'none'}")
        return self

    @property
    def label(self) -> str:
        """``name (release)`` for messages."""
        return f"{self.name} ({self.release})"

    def training_switches(self, precision: str | None = None) -> dict[str, Any]:
        """The TrainingSpec fields this stack fixes (for a run at ``precision``, when given:
        :attr:`fp16_grads_in_fp16` turns the fp32 gradient reduction off for fp16)."""
        out = {k: getattr(self, k) for k in ("overlap_grad_reduce", "overlap_tp_comm",
                                              "overlap_p2p_comm", "flash_attention",
                                              "zero3_gather", "grad_reduce_in_fp32",
                                              "fp8_params", "cross_entropy")}
        if precision == "fp16" and self.fp16_grads_in_fp16:
            out["grad_reduce_in_fp32"] = False
        if precision == "fp16" and self.fp16_overflow_check is not None:
            out["fp16_overflow_check"] = self.fp16_overflow_check
        if self.fsdp_gradient_accumulation_fusion is not None:
            out["fsdp_gradient_accumulation_fusion"] = self.fsdp_gradient_accumulation_fusion
        # MoE dispatcher switches (perfmodel.moe.dispatch) and the attention kernel, where the
        # preset states them
        for k in ("moe_token_dispatcher", "moe_flex_backend", "moe_router_fusion",
                  "cuda_graph_scope", "attention_backend"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        # the release's expert rank layout (perfmodel.moe.expert_layout), where the preset states it
        if self.capabilities.moe_parallel_folding is not None:
            out["moe_parallel_folding"] = self.capabilities.moe_parallel_folding.value
        return out

    def describe(self) -> str:
        """One line for the report header."""
        on = [k.removeprefix("overlap_").replace("_", "-") for k in
              ("overlap_grad_reduce", "overlap_tp_comm", "overlap_p2p_comm") if getattr(self, k)]
        return (f"{self.name} ({self.release}): overlap {', '.join(on) or 'none'}, "
                f"flash attention {'on' if self.flash_attention else 'off'}, "
                f"ZeRO {'/'.join(map(str, self.zero_stages))}")


def load_framework(spec: str | Path | FrameworkSpec) -> FrameworkSpec:
    """A framework from a preset name (``megatron-2022``), a TOML path or a FrameworkSpec."""
    if isinstance(spec, FrameworkSpec):
        return spec
    name = getattr(spec, "value", spec)
    if not isinstance(name, (str, Path)):
        raise SpecError(f"framework = {spec!r}: expected a preset name or a TOML path")
    data, src = resolve_spec("framework", name)
    return build_spec(FrameworkSpec, data, src)


#: The releases a plan is for when no ``--framework`` is named, by the GPU's CUDA compute
#: capability (least first; the last entry at or below the GPU's applies): the first of its
#: list that runs the model (a mixture-of-experts model needs ``[capabilities.moe]``).
#:
#: - Volta and Ampere (sm_70, sm_80): ``megatron-2022``, Megatron-LM v3.0, the newest release
#:   with published end-to-end runs on A100 (Korthikanti et al. 2022: sequence parallelism and
#:   selective recompute, no flash attention); the NeMo / Megatron-Bridge performance summaries
#:   that the later presets read publish Hopper and Blackwell runs only. It has no MoE layers:
#:   a MoE model gets ``megatron-lm`` (Megatron-LM main, which runs on sm_70 / sm_80).
#: - Hopper and Blackwell (sm_90, sm_100, sm_103): ``bridge-26.02``, Megatron-Bridge 26.02, the
#:   newest shipped preset, whose performance recipes were measured on H100, B200, GB200, GB300.
#:
#: A GPU without a CUDA compute capability (AMD MI300X) gets ``megatron-lm``, Megatron-LM main,
#: which the ROCm fork of Megatron-LM follows.
DEFAULT_FRAMEWORKS: tuple[tuple[tuple[int, int], tuple[str, ...]], ...] = (
    ((7, 0), ("megatron-2022", "megatron-lm")), ((9, 0), ("bridge-26.02",)))
DEFAULT_FRAMEWORK_NO_CUDA = ("megatron-lm",)


def default_framework(gpu: GPUSpec, model: ModelSpec | None = None) -> tuple[FrameworkSpec, str]:
    """The release a plan of ``model`` on ``gpu`` is for when none is named, and why (one
    phrase): :data:`DEFAULT_FRAMEWORKS`."""
    cc = gpu.compute_capability_tuple
    if cc is None:
        names, why = DEFAULT_FRAMEWORK_NO_CUDA, f"default for {gpu.name} (no CUDA compute capability)"
    else:
        fit = [n for least, n in DEFAULT_FRAMEWORKS if cc >= least]
        names = fit[-1] if fit else DEFAULT_FRAMEWORKS[0][1]
        why = (f"default for compute capability {gpu.compute_capability}: the newest shipped "
               f"release with published runs on {gpu.name}'s generation")
    for name in names:
        fw = load_framework(name)
        if model is None or not (model.is_moe and _off(fw.capabilities.moe)):
            return fw, why + ("" if name == names[0] else " that runs mixture-of-experts models")
    return load_framework(names[-1]), why


def apply_framework(training: TrainingSpec, fw: FrameworkSpec | None,
                    precision: str | None = None) -> TrainingSpec:
    """``training`` with the stack's switches set for a run at ``precision`` (default: the
    training's own; single overrides are applied after this)."""
    if fw is None:
        return training
    return training.model_copy(update=fw.training_switches(precision or training.precision))


def framework_pins(fw: FrameworkSpec) -> dict[str, list]:
    """Allowed values per search dimension (intersected with the user's pins by the space)."""
    pins: dict[str, list] = {
        "zero_stage": sorted(fw.zero_stages),
        "schedule": [s for s in SCHEDULE if s in fw.schedules],
        "recompute": [r for r in RECOMPUTE if r in fw.recompute],
    }
    if not fw.context_parallel:
        pins["cp"] = [1]
    if fw.capabilities.cp_comm_types is not None:
        pins["cp_comm"] = [n for n in CP_COMM if n in fw.capabilities.cp_comm_types.value]
    else:  # a stack that does not list its types runs the ring (every cp release does)
        pins["cp_comm"] = ["p2p"]
    if fw.sequence_parallel == "off":
        pins["sequence_parallel"] = [False]
    if "interleaved" not in fw.schedules:
        pins["vp"] = [1]
    return pins


def zero_pp_allowed(fw: FrameworkSpec | None, zero: np.ndarray, pp: np.ndarray,
                    tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
    """Bool mask: the stack runs this (ZeRO stage, pp) pair and its sequence-parallel rule."""
    if fw is None:
        return np.ones(np.shape(zero), dtype=bool)
    ok = (pp == 1) | (zero <= fw.max_zero_stage_with_pp)
    if fw.sequence_parallel == "required":
        ok &= (tp == 1) | sp
    return ok


# --------------------------------------------------------------------------------------------
# Capabilities: what a release runs, as masks over a search space and one-line refusals
# --------------------------------------------------------------------------------------------
#: Least CUDA compute capability of each low-precision recipe (Transformer Engine
#: ``transformer_engine/pytorch/fp8.py`` / ``quantization.py``: ``check_fp8_support`` 8.9 (Ada;
#: 9.0 Hopper), ``check_fp8_block_scaling_support`` 9.0, ``check_mxfp8_support`` and
#: ``check_nvfp4_support`` 10.0, "blackwell and above").
RECIPE_MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "fp8-delayed": (8, 9), "fp8-cs": (8, 9), "fp8-block": (9, 0), "mxfp8": (10, 0),
    "nvfp4": (10, 0)}


def _off(cap: Supported | None) -> bool:
    return cap is not None and not cap.value


def _rules(fw: FrameworkSpec, model: ModelSpec) -> list[tuple[Capability, Any, Any]]:
    """(capability, mask over decoded arrays, text of a refused scalar configuration) for each
    capability of ``fw`` that constrains the parallel dimensions of ``model``."""
    c = fw.capabilities
    L = model.num_layers
    rules: list[tuple[Capability, Any, Any]] = []
    if c.cp_comm_types is not None:
        names = c.cp_comm_types.value
        rules.append((c.cp_comm_types,
                      lambda a: (np.asarray(a["cp"]) == 1) | np.isin(_cp_comm_names(a), names),
                      lambda a: (f"cp_comm '{_cp_comm_names(a)[()]}' (cp {a['cp']}): it runs "
                                 f"{', '.join(names)}")))
    if _off(c.uneven_interleaved):
        rules.append((c.uneven_interleaved,
                      lambda a: (a["vp"] == 1) | (L % (a["pp"] * a["vp"]) == 0),
                      lambda a: (f"the interleaved schedule with unequal stages ({L} layers on "
                                 f"pp {a['pp']} x vp {a['vp']})")))
    if not model.is_moe:
        return rules
    etp = c.expert_tensor_parallel
    if etp is not None and etp.value == "tp":
        rules.append((etp, lambda a: a["etp"] == a["tp"],
                      lambda a: (f"expert tensor parallelism other than tp (etp {a['etp']}, "
                                 f"tp {a['tp']}): its experts are split by tp")))
    elif etp is not None and etp.value == "1-or-tp":
        # etp = 1 only with expert parallelism (with ep = 1 the option has no effect: etp = tp)
        rules.append((etp, lambda a: (a["etp"] == a["tp"]) | ((a["etp"] == 1) & (a["ep"] > 1)),
                      lambda a: (f"etp {a['etp']} with tp {a['tp']} and ep {a['ep']}: expert "
                                 "tensor parallelism is tp, or 1 with ep > 1")))
    if c.expert_parallel_spans_cp_tp is not None and c.expert_parallel_spans_cp_tp.value:
        rules.append((c.expert_parallel_spans_cp_tp,
                      lambda a: (a["ep"] == 1) | ((a["ep"] * a["etp"]) % (a["cp"] * a["tp"]) == 0),
                      lambda a: (f"ep {a['ep']} with cp {a['cp']}, tp {a['tp']}, etp "
                                 f"{a['etp']}: ep must be a multiple of cp * tp / etp")))
    if _off(c.moe_context_parallel):
        rules.append((c.moe_context_parallel, lambda a: a["cp"] == 1,
                      lambda a: f"context parallelism in a MoE model (cp {a['cp']})"))
    if _off(c.moe_parallel_folding):
        # initialize_model_parallel before folding: "data_parallel_size ... is not divisible
        # by expert_model_parallel_size" (ep is carved out of dp, perfmodel.moe.expert_layout)
        rules.append((c.moe_parallel_folding,
                      lambda a: (np.asarray(a["dp"]) % a["ep"] == 0) if "dp" in a else (
                          np.ones(np.shape(a["ep"]), dtype=bool)),
                      lambda a: (f"ep {a['ep']} that does not divide dp {a.get('dp')}: before "
                                 "MoE parallel folding expert parallelism is carved out of "
                                 "data parallelism")))
    return rules


def _cp_comm_names(a: dict[str, Any]) -> np.ndarray:
    """The ``cp_comm`` names of decoded arrays (codes of :data:`CP_COMM`) or of one
    configuration (a name); p2p where none is given."""
    v = np.asarray(a.get("cp_comm", "p2p"))
    return np.asarray(CP_COMM)[v] if v.dtype.kind in "iu" else v


def explicit_layout_allowed(fw: FrameworkSpec | None) -> bool:
    """Whether the search may use the balanced explicit pipeline layout: no framework named
    (the plain planner), or a release whose ``[capabilities.pipeline_layout]`` is true. Unlike
    the other capabilities an entry left out does not allow it (the option is opt-in per
    release: NeMo 24.x, Megatron-Core 0.8 / 0.9, predates it)."""
    if fw is None:
        return True
    cap = fw.capabilities.pipeline_layout
    return cap is not None and bool(cap.value)


def capability_mask(fw: FrameworkSpec | None, model: ModelSpec,
                    a: dict[str, np.ndarray]) -> np.ndarray:
    """Bool mask over decoded configurations (arrays ``tp pp vp cp ep etp``; a dense model's
    ``etp`` already equal to tp): True where the framework's release runs it."""
    ok = np.ones(np.shape(a["tp"]), dtype=bool)
    if fw is None:
        return ok
    for _, mask, _ in _rules(fw, model):
        ok &= mask(a)
    return ok


def capability_refusals(fw: FrameworkSpec | None, model: ModelSpec,
                        cfg: dict[str, Any]) -> list[str]:
    """One line per capability of ``fw`` that one configuration (ints ``tp pp vp cp ep etp``)
    needs and the release lacks, naming the framework, its release, the setting and the source."""
    if fw is None:
        return []
    cfg = dict(cfg)
    if not model.is_moe:
        cfg["etp"] = cfg["tp"]
    a = {k: np.asarray(v) for k, v in cfg.items()}
    return [f"framework {fw.label} cannot run {text(cfg)}; source: {cap.source}"
            for cap, mask, text in _rules(fw, model) if not bool(mask(a))]


def _refuse(fw: FrameworkSpec, what: str, cap: Capability) -> SpecError:
    return SpecError(f"framework {fw.label} cannot run {what}; source: {cap.source}")


def check_training_supported(fw: FrameworkSpec | None, model: ModelSpec, training: TrainingSpec,
                             gpu: GPUSpec, selective: bool = True) -> None:
    """Raise a one-line SpecError when the training setup needs what the GPU or the release
    lacks: a low-precision recipe below its compute capability
    (:data:`RECIPE_MIN_COMPUTE_CAPABILITY`), a precision the release has no switch for, MoE at
    all, a token dispatcher / flex backend / CUDA-graph part it lacks, or selective-recompute
    modules it cannot name (``selective``: the search includes selective recompute)."""
    recipe = training.precision_name
    need = RECIPE_MIN_COMPUTE_CAPABILITY.get(recipe)
    have = gpu.compute_capability_tuple
    if need is not None and have is not None and have < need:
        raise SpecError(
            f"precision {recipe} needs compute capability {need[0]}.{need[1]} or higher "
            f"(Transformer Engine's check for the recipe): gpu '{gpu.name}' is "
            f"{gpu.compute_capability}")
    if fw is None:
        return
    if recipe not in fw.precisions:
        raise SpecError(f"framework {fw.label} cannot run precision {recipe}: it runs "
                        f"{', '.join(fw.precisions)}")
    c = fw.capabilities
    if model.is_moe and _off(c.moe):
        raise _refuse(fw, f"a mixture-of-experts model ({model.name}, {model.num_experts} "
                          "experts)", c.moe)
    if model.is_moe and c.moe_token_dispatchers is not None and (
            training.moe_token_dispatcher not in c.moe_token_dispatchers.value):
        raise _refuse(fw, f"moe_token_dispatcher = {training.moe_token_dispatcher} (it has "
                          f"{', '.join(c.moe_token_dispatchers.value)})", c.moe_token_dispatchers)
    if model.is_moe and training.moe_token_dispatcher == "flex" and (
            c.moe_flex_backends is not None) and (
            training.moe_flex_backend not in c.moe_flex_backends.value):
        raise _refuse(fw, f"moe_flex_backend = {training.moe_flex_backend} (it has "
                          f"{', '.join(c.moe_flex_backends.value) or 'none'})", c.moe_flex_backends)
    if c.cuda_graph_scopes is not None and not (
            set(training.cuda_graph_scope) <= set(c.cuda_graph_scopes.value)):
        raise _refuse(fw, f"cuda_graph_scope = {list(training.cuda_graph_scope)} (it captures "
                          f"{', '.join(c.cuda_graph_scopes.value) or 'no partial CUDA graphs'})",
                      c.cuda_graph_scopes)
    if selective and c.recompute_modules is not None and not (
            set(training.recompute_modules) <= set(c.recompute_modules.value)):
        raise _refuse(fw, f"selective recompute of {', '.join(training.recompute_modules)} "
                          f"(it recomputes {', '.join(c.recompute_modules.value)})",
                      c.recompute_modules)


def with_switches_of(fw: FrameworkSpec, training: TrainingSpec) -> FrameworkSpec:
    """``fw``'s capabilities with ``training``'s own switches: a published recipe's release
    constrains the search while what the recipe set (overlaps, dispatcher, gradient dtype, ...)
    stays as the recipe set it."""
    keep = {k: getattr(training, k) for k in (
        "overlap_grad_reduce", "overlap_tp_comm", "overlap_p2p_comm", "flash_attention",
        "zero3_gather", "grad_reduce_in_fp32", "fp8_params", "cross_entropy",
        "moe_token_dispatcher", "moe_flex_backend", "moe_router_fusion", "cuda_graph_scope")}
    return fw.model_copy(update={**keep, "fp16_grads_in_fp16": False})
