"""The training stack a user will launch (``--framework``): its switches and what it can run.

A framework preset (``hardware_specs/frameworks/*.toml``) names a stack and release
(``megatron-2022``, ``nemo-24.09``, ``bridge-25.x``, ``deepspeed``, ``torchtitan``, ...). It sets
that stack's training switches together (communication overlaps, flash attention) and states what
it can run (ZeRO stages, ZeRO with pipelines, schedules, recompute modes, sequence / context
parallelism, uneven pipeline stages), so that a search keeps to configurations the stack accepts.

Each preset file cites the framework source or paper its values come from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from perfmodel.config import RECOMPUTE, SCHEDULE
from perfmodel.specs import Spec, SpecError, TrainingSpec, _build, _resolve

__all__ = ["PRECISION_RECIPES", "FrameworkSpec", "apply_framework", "framework_pins", "load_framework",
           "zero_pp_allowed"]

ScheduleName = Literal["gpipe", "1f1b", "interleaved", "zb"]
RecomputeName = Literal["none", "selective", "full"]
#: Precision recipes a launch config can name (``search.emit`` maps each to the stack's switch):
#: plain ``fp8`` is delayed scaling (Transformer Engine's and Megatron's default), ``fp4`` NVFP4.
PrecisionRecipe = Literal["fp32", "bf16", "fp16", "fp8-cs", "fp8-delayed", "fp8-block", "mxfp8",
                          "nvfp4"]
PRECISION_RECIPES: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8-cs", "fp8-delayed",
                                      "fp8-block", "mxfp8", "nvfp4")


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
    cuda_graph_scope: tuple[Literal["attn", "moe_router", "moe_preprocess"], ...] | None = Field(
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
        default=PRECISION_RECIPES, min_length=1,
        description="precision recipes the stack's launch config can switch on")

    def training_switches(self, precision: str | None = None) -> dict[str, Any]:
        """The TrainingSpec fields this stack fixes (for a run at ``precision``, when given:
        :attr:`fp16_grads_in_fp16` turns the fp32 gradient reduction off for fp16)."""
        out = {k: getattr(self, k) for k in ("overlap_grad_reduce", "overlap_tp_comm",
                                              "overlap_p2p_comm", "flash_attention",
                                              "zero3_gather", "grad_reduce_in_fp32",
                                              "fp8_params", "cross_entropy")}
        if precision == "fp16" and self.fp16_grads_in_fp16:
            out["grad_reduce_in_fp32"] = False
        # MoE dispatcher switches (perfmodel.moe_dispatch) and the attention kernel, where the
        # preset states them
        for k in ("moe_token_dispatcher", "moe_flex_backend", "moe_router_fusion",
                  "cuda_graph_scope", "attention_backend"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
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
    data, src = _resolve("framework", name)
    return _build(FrameworkSpec, data, src)


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
