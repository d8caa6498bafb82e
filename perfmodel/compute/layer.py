"""Compute time of one transformer layer (and the embedding, logits and optimizer) per GPU.

Each layer is the sum of its kernels, never one global efficiency:

* GEMMs (qkv with GQA, attention output projection, MLP fc1 (+gate) and fc2), each forward,
  data-gradient and weight-gradient, with the shape this GPU runs (tokens / cp rows, features /
  tp columns): ``time = 2*m*n*k / (peak(dtype) * efficiency(m, n, k, layout))``, efficiency from
  the GPU's calibration (:mod:`perfmodel.hardware.calibration`).
* Flash attention (causal, GQA shares K/V heads: the work follows the query heads), timed by the
  calibrated ``t0(s) + flops / rate(s)``.
* Memory-bound kernels (norms, activations, dropout, residual adds, casts, cross-entropy), each
  ``max(KERNEL_MIN_S, bytes / achieved bandwidth of its kind)``.

``kernels="fused"`` models Megatron-LM / Transformer Engine: bf16 weights and activations, bias
folded into the GEMM epilogue, fused bias+GELU, fused bias+dropout+add, fused (RMS/Layer)Norm,
weight-gradient accumulation fused into the fp32 main gradient, sequence parallelism splitting
the norm/dropout region by tp; CPU launch cost is hidden behind the GPU.

``kernels="eager"`` models plain PyTorch eager under ``torch.autocast`` with fp32 weights (the
calibration script's ``e2e`` and ``e2e_llama`` models): an fp32 residual stream, fp32 norms, a
bf16 cast of every weight and of every GEMM input each forward (and their fp32 casts back in the
backward), separate bias-gradient reductions, fp32 RoPE, GQA repeats, fp32 logits and
cross-entropy, one named function per kernel family in :mod:`perfmodel.compute.eager` (checked against a
recorded step, ``harness/eager_inventory.py``); each kernel also costs CPU
dispatch time (:data:`CPU_FWD_LAUNCH_S`, :data:`CPU_BWD_LAUNCH_S`, :data:`CHECKPOINT_CPU_S`), and
a phase takes ``max(GPU time, CPU time)`` (the CPU runs ahead of the GPU when it can).

Precision: ``bf16``/``fp16`` GEMMs at the 16-bit tensor peak; ``fp8``/``fp4`` GEMMs at that
peak times :data:`LOW_PRECISION_GEMM_RATIO` (plus the quantisation casts), or, for per-tensor fp8
with a measured ``gemm_fp8.csv`` of the GPU's generation, at the measured fp8 / bf16 time ratio of
their shape (:func:`fp8_table_gemm_time_s`); ``fp32`` GEMMs at the
TF32 tensor peak with fused kernels (Megatron in NGC containers allows TF32) and at the fp32
CUDA-core peak in eager PyTorch (``torch.backends.cuda.matmul.allow_tf32`` is False by default).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodel.comm import cp_a2a, cp_ring
from perfmodel.comm.comm_volume import cp_a2a_buffers, cp_kv_chunk_bytes
from perfmodel.compute import attention_kernels, mamba, quantise
from perfmodel.compute import eager as eager_kernels
from perfmodel.core.codes import CpComm, Recompute
from perfmodel.core.errors import SpecError
from perfmodel.hardware.calibration import KERNEL_MIN_S, Calibration, calibration_for
from perfmodel.hardware.kernel_tables import gemm_table, with_gemm_table
from perfmodel.hardware.overlap import gpu_generation
from perfmodel.moe import dispatch as moe_dispatch
from perfmodel.moe import experts as moe
from perfmodel.moe.experts import expert_params_per_gpu
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import GPUSpec, ModelSpec, TrainingSpec

__all__ = [
    "CHECKPOINT_CPU_S",
    "COMPOSE_P",
    "CPU_BWD_LAUNCH_S",
    "CPU_FWD_LAUNCH_S",
    "FP8_TABLE_RECIPES",
    "LOW_PRECISION_GEMM_RATIO",
    "LOW_PRECISION_RECIPES",
    "LOW_PRECISION_REF_REDUCTION",
    "LOW_PRECISION_TILE_K0",
    "MAIN_GRAD_COPY_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_PARAM",
    "PER_TENSOR_OVERFLOW_CHECK_BYTES_PER_PARAM",
    "SUSTAINED_GEMM_FRACTION",
    "UNSCALE_BYTES_PER_PARAM",
    "GemmPrecision",
    "LowPrecisionRecipe",
    "compute_times",
    "fp8_table_applies",
    "fp8_table_gemm_time_s",
    "full_iteration_graphed",
    "gemm_precision",
    "gemm_time_s",
    "graph_launch_cost_s",
    "grouped_gemm_time_s",
    "launch_cost_s",
    "layer_gemms",
    "low_precision_tile_factor",
    "mlp_activation_share",
    "optimizer_bytes_per_param",
    "optimizer_params_per_gpu",
    "quantise_bytes",
    "recipe_of",
    "recompute_added_s",
    "sustained_gemm_fraction",
    "unfused_cross_entropy",
    "unfused_grad_accumulation_bytes",
]

# Eager PyTorch CPU cost per launched kernel (Python module call, autocast and autograd record
# in the forward; the C++ autograd engine in the backward, incl. the view and AccumulateGrad
# nodes around each kernel) and per checkpointed layer (the non-reentrant checkpoint's
# saved-tensor hooks and RNG state). Kernel counts per layer are those of the recorded step
# (harness/eager_inventory.py, tests/perfmodel/compute/test_eager.py). Fitted on
# hardware_specs/calibration/h200/e2e_dev.csv (grid search with COMPOSE_P; leave-one-model-out
# cross-validated MAPE 5.4 %, docs/compute.md), where the small-model steps wait for the CPU.
CPU_FWD_LAUNCH_S = 17e-6
CPU_BWD_LAUNCH_S = 38e-6
CHECKPOINT_CPU_S = 1.5e-3

COMPOSE_P = 8.0
"""Exponent of the smooth maximum ``(gpu^p + cpu^p)^(1/p)`` of a phase's device and launch
times. The CPU runs ahead of the GPU (kernels queue on the stream), so a phase takes about the
larger of the two, not their sum; equal times cost 2^(1/8) = 1.09x, the device idling while the
CPU launches a run of short kernels between long ones. p in (4, 8, inf) chosen with the
constants above: cross-validated MAPE 5.96 / 5.38 / 5.36 %, worst in-sample row 9.3 / 9.7 /
10.9 % (p = 4 was the previous choice)."""

LOW_PRECISION_GEMM_RATIO = 0.85
"""fp8 GEMM efficiency (tensor-wise scaled, or MXFP8 on Blackwell) relative to the bf16
efficiency at the same shape, against the 2x higher fp8 peak. Fitted on the dev split's FP8 rows
(benchmarks/fit_time_model.py; docs/compute.md)."""

LOW_PRECISION_TILE_K0 = 350.0
"""Per-tile fixed work of a Hopper fp8 GEMM in units of its reduction length at the fp8 rate:
the tile's prologue (pipeline fill), bf16 epilogue (output store) and scale handling take what
they take at bf16 while the main loop runs twice as fast, so short reductions gain less than
long ones. Fitted to the published per-tensor fp8 sweep of tile-lang on H800 (M = N = 8192,
K = 2048 / 4096 / 8192 / 16384: 1343 / 1467 / 1507 / 1541 TFLOP/s,
``benchmarks/published_fp8_gemm_h800.csv``; ``t ~ K + k0`` gives k0 = 352, rate 1574 TFLOP/s).
DeepGEMM's block-scaled table implies ~800 (its CUDA-core promotion adds to the fixed part).
Hopper only: the sources are Hopper kernels; Blackwell's MMA accumulates in tensor memory and
its kernels overlap the epilogue with the next tile. Scored by ``benchmarks/fp8_shape_probe.py``
(docs/compute.md): dense MAPE 3.54 -> 3.45 %, H100 fp8 rows 4.34 -> 4.08 %, MoE
low-precision rows 11.36 -> 11.32 %, leave-one-group-out CV 3.46 -> 3.44 %."""

LOW_PRECISION_REF_REDUCTION = 8192.0
"""Reduction length at which :data:`LOW_PRECISION_GEMM_RATIO` holds unchanged under
:func:`low_precision_tile_factor` (the ratio was fitted with one value for every shape; 8192 is
the hidden size / token count most fitted rows' GEMMs reduce over)."""


def low_precision_tile_factor(m, n, k, layout: str, gpu: GPUSpec):
    """Time factor of a low-precision GEMM for its per-tile fixed cost (Hopper):
    ``(1 + k0 / K) / (1 + k0 / K_ref)`` with ``K`` the reduction length of the layout (``fwd``:
    ``k``, ``dgrad``: ``n``, ``wgrad``: ``m``, the shape given as the forward GEMM's, as
    :func:`gemm_time_s`), ``k0`` :data:`LOW_PRECISION_TILE_K0`, ``K_ref``
    :data:`LOW_PRECISION_REF_REDUCTION`; 1 on other GPUs.

    Example: Llama 3 70B's attention projection at tp 4 (k = 2048) forward on an H100:
    (1 + 350/2048) / (1 + 350/8192) = 1.1709 / 1.0427 = 1.123.

    References
    ----------
    tile-lang ``benchmark/matmul_fp8/README.md`` (H800 per-tensor fp8, K sweep); DeepGEMM
    README "Normal GEMMs for dense models" (H800, block-scaled); CUTLASS sm90 warp-specialized
    GEMM (prologue / mainloop / epilogue per tile).
    """
    if gpu_generation(gpu) != "hopper":
        return 1.0
    red = {"fwd": k, "dgrad": n, "wgrad": m}[layout]
    red = np.maximum(np.asarray(red, dtype=np.float64), 1.0)
    return ((1.0 + LOW_PRECISION_TILE_K0 / red)
            / (1.0 + LOW_PRECISION_TILE_K0 / LOW_PRECISION_REF_REDUCTION))


SUSTAINED_GEMM_FRACTION = {
    "volta": 1.0,
    "ampere": 1.0,
    "hopper": 0.84,
    "blackwell": 0.83,
    "cdna3": 1.0,
    "other": 1.0,
}
"""GEMM throughput of a whole node training at its power limit, as a fraction of the one-GPU
matmul ceiling (MAMF) its kernel efficiency is transferred from, per GPU generation; applied with
fused (multi-GPU framework) kernels on parts without a measured calibration of their own. Hopper and Blackwell
are fitted on the dev split (benchmarks/fit_time_model.py: NeMo / Megatron-Bridge rows; B200,
GB200 and GB300 carry their own fitted ``sustained_gemm_fraction`` in their spec files, the
generation's value is B200's, for other Blackwell parts); Ampere stays 1 (the Megatron-LM A100 rows are matched with Bekman's MAMF as measured). A 700 W H100
running dense GEMMs on all 8 GPUs of a node holds lower clocks than a single-GPU benchmark."""


def sustained_gemm_fraction(gpu: GPUSpec) -> float:
    """The GPU spec's ``sustained_gemm_fraction`` when given, else
    :data:`SUSTAINED_GEMM_FRACTION` of its generation."""
    own = getattr(gpu, "sustained_gemm_fraction", None)
    return float(own) if own is not None else SUSTAINED_GEMM_FRACTION[gpu_generation(gpu)]


def sustained_calibration(gpu: GPUSpec, calibration=None, kernels: str = "fused",
                          precision: str | None = None) -> Calibration:
    """The GPU's calibration as its layer GEMMs are priced.

    A GPU measured by its own calibration (or given one, e.g. under an efficiency profile)
    keeps it. A GPU whose efficiency is transferred from another GPU's one-GPU measurement (the
    shipped H200 tables scaled by datasheet; checked by the calibration's ``source``) takes, in
    this order: the published GEMM table of its part and ``precision``
    (:func:`perfmodel.hardware.kernel_tables.gemm_table`: a kernel measurement, used as
    measured, times an efficiency profile's correction only), else, with the fused multi-GPU
    kernels, :func:`sustained_gemm_fraction` applied to the transferred efficiency.
    """
    base = calibration_for(gpu)
    cal = base if calibration is None else calibration_for(gpu, calibration)
    if "scaled to" not in cal.source:
        return cal
    table = None if precision is None else gemm_table(gpu, precision)
    if table is not None:
        return with_gemm_table(cal, table, cal.gemm_scale / base.gemm_scale)
    if kernels != "fused":
        return cal
    if calibration is None:
        return calibration_for(gpu, None, gemm_scale=sustained_gemm_fraction(gpu))
    f = sustained_gemm_fraction(gpu)
    if f != 1.0:  # the interpolators do not depend on gemm_scale: share them
        return replace(cal, gemm_scale=cal.gemm_scale * f)
    return cal


@dataclass(frozen=True)
class LowPrecisionRecipe:
    """How a Transformer Engine low-precision recipe quantises one GEMM operand.

    Attributes
    ----------
    amax_passes : extra reads of the 16-bit tensor before the cast (current scaling needs the
        tensor's amax first; delayed scaling takes it from the history of earlier steps, and
        block scalings compute the block amax inside the cast kernel)
    copies : quantised copies written per tensor (row-wise for the forward GEMM and column-wise,
        i.e. transposed, for the other pass: Hopper fp8 GEMMs take only TN layouts, MX formats
        scale along the reduction axis, so both directions are quantised)
    bytes_per_elem : bytes of one quantised element incl. its share of block scales
    gemm_ratio : GEMM efficiency relative to bf16 at the same shape, against the low-precision peak

    References
    ----------
    Transformer Engine ``transformer_engine/common/recipe/__init__.py`` (DelayedScaling,
    Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling) and its fused
    ``cast_transpose`` kernels; OCP Microscaling Formats (MX) v1.0 spec (32-element blocks, e8m0
    scales); NVIDIA NVFP4 blog (2025: 16-element blocks with e4m3 scales, per-tensor fp32 scale).
    """

    amax_passes: float
    copies: float
    bytes_per_elem: float
    gemm_ratio: float


#: The recipes of ``--precision``. gemm_ratio: fp8-delayed / fp8-cs share the fitted
#: :data:`LOW_PRECISION_GEMM_RATIO`; mxfp8 (Blackwell's block-scaled MMA, 32-element e8m0
#: scales) runs at 0.906 of that, fitted on the 7 pairs of Megatron-Bridge rows that differ only
#: in the recipe (same release, GPU and layout: FP8-MX measured 4.7 % slower than FP8-CS on
#: average; benchmarks/fit_time_model.py); fp8-block on Hopper scales 128-wide blocks in the GEMM main loop (CUTLASS /
#: DeepGEMM style), assumed 10 % slower; nvfp4 assumed 20 % below fp8's ratio against its 2x
#: higher peak (no published nvfp4 row in the dev split: an assumption, see docs/compute.md).
LOW_PRECISION_RECIPES = {
    "fp8-delayed": LowPrecisionRecipe(0.0, 2.0, 1.0, 1.0),
    "fp8-cs": LowPrecisionRecipe(1.0, 2.0, 1.0, 1.0),
    "fp8-block": LowPrecisionRecipe(0.0, 2.0, 1.0 + 4 / 128, 0.9),
    "mxfp8": LowPrecisionRecipe(0.0, 2.0, 1.0 + 1 / 32, 0.906),
    "nvfp4": LowPrecisionRecipe(1.0, 2.0, 0.5 + 1 / 16, 0.8),
}


def recipe_of(training: TrainingSpec) -> LowPrecisionRecipe | None:
    """The training's low-precision recipe (None for fp32 / bf16 / fp16)."""
    if training.precision not in ("fp8", "fp4"):
        return None
    name = training.low_precision_recipe or ("nvfp4" if training.precision == "fp4"
                                              else "fp8-delayed")
    return LOW_PRECISION_RECIPES[name]


def quantise_bytes(elements, recipe: LowPrecisionRecipe, act_bytes: float = 2.0):
    """HBM bytes to quantise ``elements`` 16-bit values for a low-precision GEMM [bytes]:
    ``elements * (act_bytes * (1 + amax_passes) + copies * bytes_per_elem)``.

    Example: fp8 current scaling of 1e6 bf16 values reads them twice (amax, cast) and writes a
    row-wise and a column-wise fp8 copy: 1e6 * (2*2 + 2*1) = 6e6 bytes.
    """
    e = np.asarray(elements, dtype=np.float64)
    return e * (act_bytes * (1.0 + recipe.amax_passes) + recipe.copies * recipe.bytes_per_elem)

OPTIMIZER_BYTES_PER_PARAM = {
    # bytes read + written per parameter by the optimizer step
    ("adam", "eager"): 28,  # fp32 p, m, v read+write (24) + fp32 grad read (4): memops.csv
    ("adamw", "eager"): 28,
    ("sgd", "eager"): 20,  # p, momentum read+write (16) + grad read (4)
    ("adam", "fused"): 34,  # 28 + bf16 param copy written (2) + grad-norm read of main grad (4)
    ("adamw", "fused"): 34,
    ("sgd", "fused"): 26,
}

MAIN_GRAD_COPY_BYTES_PER_PARAM = 6.0
"""16-bit gradients copied into the optimizer's fp32 main gradients before the step (read 2,
write 4 bytes): Megatron-LM ``_copy_model_grads_to_main_grads`` (megatron/core/optimizer/
optimizer.py; 2020: ``FP16_Optimizer._model_grads_to_master_grads``, megatron/fp16/fp16.py).
Only when the gradient buffer is 16-bit (``grad_reduce_in_fp32`` off); with an fp32 main-grad
buffer the weight-gradient GEMMs accumulate into it directly."""

def unfused_grad_accumulation_bytes(weight_elements, grad_reduce_in_fp32: bool):
    """Bytes moved per micro-batch by the gradient staging that ``gradient_accumulation_fusion``
    off leaves to a separate kernel under FSDP, for ``weight_elements`` weights on this GPU.

    Fused (Megatron-Core's default, TE ``fuse_wgrad_accumulation``): the weight-gradient GEMM
    writes into ``main_grad`` in its epilogue. Unfused: the GEMM writes a 16-bit ``param.grad``
    and Megatron-FSDP's post-backward hook stages it into the main-grad buffer before the
    reduce-scatter (``megatron_fsdp`` post-backward gradient processing: ``torch._foreach_copy_``
    of the gradients into ``get_main_grad()`` when the buffer holds no accumulated value, as
    under ``optim_grads_params``, which reduce-scatters every micro-batch): read 2 bytes, write
    the main gradient's 2 (bf16 buffer, ``grad_reduce_in_fp32`` off) or 4 (fp32). The GEMM's own
    2-byte write replaces the fused epilogue's and is not counted.

    Example: 1e9 weights, bf16 main gradients -> 4e9 bytes; fp32 -> 6e9."""
    g_b = 4.0 if grad_reduce_in_fp32 else 2.0
    return np.asarray(weight_elements, dtype=np.float64) * (2.0 + g_b)


UNSCALE_BYTES_PER_PARAM = 8.0
"""fp16 loss scaling: the fp32 main gradients read and written once to divide by the loss scale
and check for inf/nan (Megatron-LM ``_unscale_main_grads_and_check_for_nan``; 2020:
``FP16_Optimizer._downscale_master``). bf16 and fp8 recipes do not scale the loss."""

PER_TENSOR_OVERFLOW_CHECK_BYTES_PER_PARAM = 10.0
"""Megatron-LM 2020's apex-style dynamic loss scaler checks each fp16 gradient with
``float(x.float().sum())`` (megatron/fp16/loss_scaler.py ``_has_inf_or_nan``): a cast that reads
2 and writes 4 bytes, then a sum that reads the 4 again."""


def optimizer_bytes_per_param(training: TrainingSpec, kernels: str = "fused") -> float:
    """HBM bytes the optimizer step moves per parameter of this GPU's shard:
    :data:`OPTIMIZER_BYTES_PER_PARAM` plus, with fused (framework) kernels, the copy of 16-bit
    gradients into fp32 main gradients, fp16's unscale and Megatron-LM 2020's per-tensor
    overflow check.

    Example: Megatron-LM 2020 fp16 Adam (fp16 gradients, per-tensor check):
    34 + 6 + 8 + 10 = 58 bytes; a bf16 NeMo recipe with a bf16 gradient buffer: 34 + 6 = 40.
    """
    b = float(OPTIMIZER_BYTES_PER_PARAM[(training.optimizer, kernels)])
    if kernels != "fused" or training.precision == "fp32":
        return b
    if not training.grad_reduce_in_fp32:
        b += MAIN_GRAD_COPY_BYTES_PER_PARAM
    if training.precision == "fp16":
        b += UNSCALE_BYTES_PER_PARAM
        if training.fp16_overflow_check == "per-tensor":
            b += PER_TENSOR_OVERFLOW_CHECK_BYTES_PER_PARAM
    return b




FP8_TABLE_RECIPES = ("fp8-delayed", "fp8-cs")
"""Recipes a measured ``gemm_fp8.csv`` prices (per-tensor scales, as ``torch._scaled_mm`` times
them there); block-scaled and fp4 recipes keep the fitted ratio."""


def fp8_table_applies(training: TrainingSpec, gpu: GPUSpec, cal: Calibration) -> bool:
    """Whether the layer GEMMs of ``training`` on ``gpu`` are priced by the calibration's
    measured fp8 table (:func:`fp8_table_gemm_time_s`): fp8 with a per-tensor recipe
    (:data:`FP8_TABLE_RECIPES`), a table present, measured on the GPU's generation."""
    if training.precision != "fp8" or getattr(cal, "gemm_fp8_points", None) is None:
        return False
    table_recipes = [LOW_PRECISION_RECIPES[r] for r in FP8_TABLE_RECIPES]
    return (any(recipe_of(training) is r for r in table_recipes)
            and gpu_generation(gpu) == cal.gemm_fp8_generation)


def fp8_table_gemm_time_s(cal: Calibration, m, n, k, layout: str, peak16_flops: float,
                          groups=None):
    """Time [s] of a per-tensor-scaled fp8 GEMM from the measured fp8 / bf16 time ratio at its
    shape: ``r(m, n, k, layout) * t_bf16``, ``t_bf16`` the bf16 GEMM time of the calibration
    (:func:`gemm_time_s` at the 16-bit peak ``peak16_flops``, or :func:`grouped_gemm_time_s` of
    ``groups`` problems), floored at one kernel. In place of :data:`LOW_PRECISION_GEMM_RATIO`
    and :func:`low_precision_tile_factor`; a transferred calibration's bf16 time carries the
    transfer (MAMF, sustained fraction) and ``r`` is the measured part's.

    Example: measured ratio 0.6 where the bf16 GEMM takes 1.0 ms: 0.6 ms.

    References
    ----------
    Ratio: :meth:`perfmodel.hardware.calibration.Calibration.fp8_time_ratio` (``gemm_fp8.csv``,
    ``benchmarks/calibrate_gpu.py --parts fp8``).
    """
    inv_r = 1.0 / cal.fp8_time_ratio(m, n, k, layout)  # an efficiency factor on the bf16 peak
    if groups is None:
        return gemm_time_s(cal, m, n, k, layout, peak16_flops, inv_r)
    return grouped_gemm_time_s(cal, groups, m, n, k, layout, peak16_flops, inv_r)


def gemm_time_s(cal: Calibration, m, n, k, layout: str, peak_flops: float, ratio: float = 1.0):
    """Time [s] of one ``m x k`` by ``k x n`` GEMM: ``2*m*n*k / (peak * efficiency)``.

    References
    ----------
    Efficiency measured per shape (``gemm.csv``), see
    :meth:`perfmodel.hardware.calibration.Calibration.gemm_efficiency`.
    """
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    eff = cal.gemm_efficiency(m, n, k, layout) * ratio
    t = 2.0 * m * n * k / (peak_flops * eff)
    return np.where(m * n * k > 0, np.maximum(t, KERNEL_MIN_S), 0.0)


def layer_gemms(model: ModelSpec, tokens, tp, ep=1, etp=None, expert_rows=None
                ) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, float]]:
    """The weight GEMMs of one layer on one GPU: ``(name, m, n, k, count)`` with ``m`` tokens,
    ``n`` output and ``k`` input features after the tensor-parallel split (column-parallel qkv
    and fc1 split ``n``, row-parallel proj and fc2 split ``k``; Shoeybi et al. 2019, Sec. 3).

    K/V heads are split by tp when tp divides them, else replicated (one head per GPU). A gated
    MLP runs gate and up as one GEMM of ``2f/tp`` columns (Megatron's fused fc1).

    MLA (DeepSeek-V2/V3, Megatron ``MLASelfAttention``): the q and kv down projections are
    replicated over tp (``parallel_mode="duplicated"``), the up projections column-parallel, the
    output row-parallel. MoE models: the layer is the average of the layer pattern, so counts
    are fractions: the dense MLP in ``1 - phi`` of the layers; in the MoE layers (``phi``) the
    router (``T/tp`` rows, the sequence-parallel slice), the shared experts (tp-split like a
    dense MLP) and ``E/ep`` routed experts (names ``expert_*``, run as one grouped GEMM) of
    ``expert_rows`` rows each and ``1/etp`` of the expert FFN (:mod:`perfmodel.moe.experts`).
    """
    tp = np.asarray(tp, dtype=np.float64)
    T = np.asarray(tokens, dtype=np.float64)
    h, d, nh, kv, f = (model.hidden_size, model.head_size, model.num_attention_heads,
                       model.kv_heads, model.ffn_hidden_size)
    hh = np.full_like(tp, h)
    mats1 = 2 if model.gated_mlp else 1
    if model.is_mla:
        r, dq, dv = model.kv_lora_rank, model.qk_head_size, model.v_head_size
        attn = []
        if model.q_lora_rank:
            attn += [("q_down", T, np.full_like(tp, model.q_lora_rank), hh, 1.0),
                     ("q_up", T, nh * dq / tp, np.full_like(tp, model.q_lora_rank), 1.0)]
        else:
            attn += [("q", T, nh * dq / tp, hh, 1.0)]
        attn += [("kv_down", T, np.full_like(tp, r + model.qk_rope_head_dim), hh, 1.0),
                 ("kv_up", T, nh * (d + dv) / tp, np.full_like(tp, r), 1.0),
                 ("proj", T, hh, nh * dv / tp, 1.0)]
    else:
        kv_per_gpu = np.maximum(kv / tp, 1.0)
        attn = [("qkv", T, (nh / tp + 2 * kv_per_gpu) * d, hh, 1),
                ("proj", T, hh, nh * d / tp, 1)]
    if model.is_hybrid:  # attention in a share of the layers, Mamba2 GEMMs (perfmodel.compute.mamba)
        a = model.attention_layer_fraction
        attn = [(g[0], g[1], g[2], g[3], a * g[4]) for g in attn if a > 0]
        attn += mamba.mamba_gemms(model, T, tp)
    if not model.is_moe:
        fd = model.dense_mlp_fraction if model.is_hybrid else 1
        return attn + [("fc1", T, f * mats1 / tp, hh, fd), ("fc2", T, hh, f / tp, fd)]
    phi = model.moe_layer_fraction
    etp = tp if etp is None else np.asarray(etp, dtype=np.float64)
    ep = np.asarray(ep, dtype=np.float64)
    fe, fs = model.expert_ffn_size, model.shared_ffn_size
    rows = T * model.moe_top_k / model.num_experts if expert_rows is None else expert_rows
    out = list(attn)
    fd = model.dense_mlp_fraction
    if fd > 0:
        out += [("fc1", T, f * mats1 / tp, hh, fd), ("fc2", T, hh, f / tp, fd)]
    out.append(("router", T / tp, np.full_like(tp, model.num_experts), hh, phi))
    if fs:
        out += [("shared_fc1", T, fs * mats1 / tp, hh, phi), ("shared_fc2", T, hh, fs / tp, phi)]
    e_local = phi * model.num_experts / ep
    out += [("expert_fc1", rows, fe * mats1 / etp, hh, e_local),
            ("expert_fc2", rows, hh, fe / etp, e_local)]
    return out


def grouped_gemm_time_s(cal: Calibration, groups, m, n, k, layout: str, peak_flops: float,
                        ratio: float = 1.0):
    """Time [s] of a grouped GEMM of ``groups`` equal ``m x k`` by ``k x n`` problems in one
    kernel (Transformer Engine / CUTLASS grouped GEMM, Megatron ``TEGroupedMLP``): each at the
    calibrated efficiency of its own (small) ``m``, one launch floor for the whole group.

    References
    ----------
    Megatron-Core ``moe/experts.py``; efficiency as :func:`gemm_time_s`.
    """
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    eff = cal.gemm_efficiency(m, n, k, layout) * ratio
    g = np.asarray(groups, dtype=np.float64)
    t = g * 2.0 * m * n * k / (peak_flops * eff)
    # no local experts (a dense layer of an MoE model, perfmodel.memory.stage_layout.moe_variants): no kernel
    return np.where((m * n * k > 0) & (g > 0), np.maximum(t, KERNEL_MIN_S), 0.0)


def optimizer_params_per_gpu(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Parameters whose optimizer state this GPU updates (the first pipeline stage, which also
    holds the embedding): ``(L/pp * layer + embedding [+ final norm + output layer if pp=1]) / tp``,
    divided by dp under ZeRO stage >= 1 (Rajbhandari et al. 2020, Sec. 5.1)."""

    tp = batch.tp.astype(np.float64)
    pp = batch.pp.astype(np.float64)
    dp = batch.dp.astype(np.float64)
    dense_layer = model.layer_params() - model.routed_expert_params_per_layer()
    params = model.num_layers / pp * dense_layer + model.embedding_params()
    params = params + np.where(pp == 1, model.norm_params() + model.output_params(), 0.0)
    params = params / tp
    # routed experts: split by ep*etp, sharded over expert-dp (the ZeRO analogue of dp here)
    experts = expert_params_per_gpu(model, batch)
    edp = batch.expert_dp.astype(np.float64)
    return np.where(batch.zero_stage >= 1, params / dp + experts / edp, params + experts)


class _Phase:
    """Accumulates GPU time and kernel launches of one phase (layer forward, backward...)."""

    def __init__(self, cal: Calibration, n: int):
        self.cal = cal
        self.gpu_s = np.zeros(n)
        self.launches = np.zeros(n)

    def mem(self, op: str, nbytes, count=1) -> None:
        """``count`` memory-bound kernels of kind ``op`` moving ``nbytes`` each."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        t = np.maximum(nbytes / self.cal.membw_bytes_per_s(op), KERNEL_MIN_S)
        self.gpu_s = self.gpu_s + count * np.where(nbytes > 0, t, 0.0)
        self.launches = self.launches + count * np.where(nbytes > 0, 1.0, 0.0)

    def terms(self, terms) -> None:
        """The kernel families of :mod:`perfmodel.compute.eager`, each at its memops bandwidth."""
        for t in terms:
            self.mem(t.op, t.nbytes / t.kernels, t.kernels)

    def add(self, t_s, launches=1) -> None:
        self.gpu_s = self.gpu_s + t_s
        self.launches = self.launches + launches

    def cpu_s(self, cpu_per_launch_s: float, cpu_extra_s=0.0) -> np.ndarray:
        return self.launches * cpu_per_launch_s + cpu_extra_s

    def time_s(self, cpu_per_launch_s: float, cpu_extra_s=0.0) -> np.ndarray:
        """The slower of the device and the launching thread, see :func:`_overlap_s`."""
        return _overlap_s(self.gpu_s, self.cpu_s(cpu_per_launch_s, cpu_extra_s))



def fused_cross_entropy(fwd: _Phase, bwd: _Phase, logits, act_b: float) -> None:
    """Transformer Engine's fused cross-entropy on ``logits`` 16-bit values (tokens x vocab
    columns on this GPU; Megatron-Core ``cross_entropy_fusion_impl="te"``): the forward's online
    softmax reads the logits once (running max and sum per row; the loss is per row), the
    backward reads them again and writes the gradient in place: ``act_b`` bytes per value
    forward, ``2*act_b`` backward (against 34 + 22 bytes of the unfused fp32 path).

    Example: 8192 tokens x 32064 columns in bf16 move 0.53 GB forward and 1.05 GB backward.

    References
    ----------
    Transformer Engine ``transformer_engine/pytorch/triton/cross_entropy.py``
    (``online_softmax_kernel``, ``cross_entropy_forward_kernel``, ``cross_entropy_backward_kernel``).
    """
    fwd.mem("copy", act_b * np.asarray(logits, dtype=np.float64))
    fwd.add(KERNEL_MIN_S)  # the per-row loss kernel
    bwd.mem("copy", 2 * act_b * np.asarray(logits, dtype=np.float64))


def _overlap_s(gpu_s, cpu_s):
    """Time of a phase whose kernels take ``gpu_s`` on the device and ``cpu_s`` to launch:
    ``(gpu^p + cpu^p)^(1/p)``, a smooth maximum (p = :data:`COMPOSE_P`)."""
    if not np.isfinite(COMPOSE_P):
        return np.maximum(gpu_s, cpu_s)
    hi = np.maximum(np.maximum(gpu_s, cpu_s), 1e-30)
    return hi * ((gpu_s / hi) ** COMPOSE_P + (cpu_s / hi) ** COMPOSE_P) ** (1.0 / COMPOSE_P)


_SHAPE_FIELDS = ("tp", "cp", "cp_comm", "micro_batch_size", "sequence_parallel", "recompute", "ep",
                 "etp", "cp_a2a")
#: The fields the optimizer step reads (:func:`optimizer_params_per_gpu`: the largest stage's
#: parameters, ZeRO sharding over dp x cp and expert-dp); the gradient compression only so that
#: the key is the one the memory model's states use (one distinct-row pass for both).
_OPTIMIZER_FIELDS = ("tp", "cp", "dp", "pp", "vp", "first_stage_layers", "last_stage_layers",
                     "embedding_as_layer", "loss_as_layer", "grad_compression", "topk_ratio",
                     "zero_stage", "ep", "etp")


UNFUSED_ROPE_KERNELS = 6
"""Elementwise kernels of an unfused rotary embedding of q and k (split halves, two products
with cos / sin, negate, cat, add: Megatron ``_apply_rotary_pos_emb_bshd`` without
``apply_rope_fusion``), as counted for the eager path."""


def unfused_activation_kernels(model: ModelSpec, pass_: str) -> tuple[int, float]:
    """(kernels, values moved per MLP intermediate column and token) of the MLP's bias + activation
    run as separate PyTorch ops. Gated (GLU): the fc1 bias add (reads and writes the ``2f`` fc1
    output: 4), then on the halves gate clamp (2), linear clamp (2), the activation's scale,
    sigmoid and product (2 + 2 + 3, quick-GELU ``x*sigmoid(1.702x)``), the linear offset add (2)
    and the gate product (3): 8 kernels, 20 values per column, against the fused kernel's 3.
    Without a gate: bias add (2) and activation (2). The backward runs autograd's kernels of
    each op, taken as twice the forward's (16 kernels, 40 values). Source: Megatron-Core
    ``mlp.py`` (``glu`` with ``activation_func_clamp_value``, ``glu_linear_offset`` when
    ``bias_activation_fusion`` is off); Megatron-Bridge ``GPTOSSProvider``."""
    n_k, vals = (8, 20.0) if model.gated_mlp else (2, 4.0)
    return (n_k, vals) if pass_ == "fwd" else (2 * n_k, 2.0 * vals)


def mlp_activation_share(model: ModelSpec, module: str) -> float:
    """Fraction of the average layer's MLP activation work (:func:`perfmodel.moe.experts.effective_ffn_size`
    columns per token) that one selectively recomputed MLP sub-module repeats: ``moe_act`` the
    routed experts' ``phi * k * imb * f_expert``, ``shared_experts`` the shared experts'
    ``phi * f_shared``, ``mlp`` the dense layers' ``(1 - phi) * f`` (all of it for a dense
    model), each over the effective size. Example: DeepSeek-V3 (3 of 61 layers dense, f 18432,
    8 x 2048 routed, 2048 shared): effective f = 3/61*18432 + 58/61*(16384 + 2048) = 18432, so
    ``moe_act`` 0.845, ``shared_experts`` 0.106, ``mlp`` 0.049.

    References
    ----------
    Megatron-Core ``transformer/transformer_config.py`` (``recompute_modules``: "moe_act":
    recompute the MoE MLP activation function; "mlp": the dense MLP submodule;
    "shared_experts": the shared experts in the MoE layer).
    """
    f_eff = moe.effective_ffn_size(model)
    if not model.is_moe:
        return 1.0 if module == "mlp" else 0.0
    phi = model.moe_layer_fraction
    part = {"moe_act": phi * model.moe_top_k * model.load_imbalance * model.expert_ffn_size,
            "shared_experts": phi * model.shared_ffn_size,
            "mlp": model.dense_mlp_fraction * model.ffn_hidden_size}[module]
    return part / f_eff


def compute_times(
    model: ModelSpec,
    training: TrainingSpec,
    gpu: GPUSpec,
    batch: ConfigBatch,
    *,
    kernels: str = "fused",
    calibration: Calibration | str | None = None,
) -> dict[str, np.ndarray]:
    """Compute times per micro-batch per GPU (and the optimizer step per step).

    The per-layer terms depend only on the configuration's shape fields (tp, cp, micro-batch,
    sequence parallel, recompute), which take few distinct values in a search batch: they are
    computed once per distinct shape and spread back (see :func:`_compute_times`).

    Parameters
    ----------
    model, training, gpu : specs.
    batch : configurations (uses tp, cp, micro_batch_size, sequence_parallel, recompute,
        zero_stage, dp, pp).
    kernels : ``"fused"`` (Megatron-LM / Transformer Engine) or ``"eager"`` (plain PyTorch
        eager under autocast with fp32 weights).
    calibration : a Calibration, a calibration folder measured on ``gpu``, or None for the
        GPU's shipped one (else the H200 tables scaled to the GPU's datasheet).

    Returns
    -------
    dict of arrays [s]: ``layer_fwd_s``, ``layer_bwd_s`` (one layer, recompute not included),
    ``layer_recompute_s``, ``embed_fwd_s``, ``embed_bwd_s``, ``logits_fwd_s``,
    ``logits_bwd_s`` (incl. the loss), ``optimizer_s`` (per step); ``attn_fwd_s``,
    ``attn_bwd_s``: the attention core of one layer on the device, part of the layer times
    (what hides the context-parallel ring, :mod:`perfmodel.comm.cp_ring`).

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 3 (GEMMs per layer); Korthikanti et al. 2022, Sec. 4-5
    (sequence parallelism, selective and full recompute); Dao 2023 (FlashAttention-2).
    """
    if len(batch) > 256:
        sub_batch, codes = batch.unique_by(_SHAPE_FIELDS)  # exact (no hash collisions)
        if len(sub_batch) < len(batch):
            sub = _compute_times(model, training, gpu, sub_batch, kernels, calibration)
            out = {k: v.take(codes, axis=0) for k, v in sub.items()}
            out["optimizer_s"] = batch.per_distinct(_OPTIMIZER_FIELDS, lambda b: {
                "s": _optimizer_s(model, training, gpu, b, kernels, calibration)})["s"]
            return out
    return _compute_times(model, training, gpu, batch, kernels, calibration)


def _optimizer_s(model, training, gpu, batch, kernels, calibration) -> np.ndarray:
    """Optimizer step over this GPU's parameter shard: bytes over the achieved fused-AdamW
    bandwidth [s]."""
    cal = calibration_for(gpu, calibration)
    params = optimizer_params_per_gpu(model, batch)
    opt_bytes = optimizer_bytes_per_param(training, kernels) * params
    t = opt_bytes / cal.membw_bytes_per_s("adamw")
    recipe = recipe_of(training)
    if recipe is not None and kernels == "fused":
        # the updated bf16 weights are quantised once per step (TE caches the fp8 weights over
        # the micro-batches: is_first_microbatch); with fp8 parameter gather on the shard only
        t = t + quantise_bytes(params, recipe) / cal.membw_bytes_per_s("copy")
    return t


@dataclass(frozen=True)
class GemmPrecision:
    """The rates and element sizes one precision runs a layer at (:func:`gemm_precision`).

    ``peak`` [FLOP/s] and ``ratio`` (efficiency factor) of the layers' linear GEMMs;
    ``peak16`` / ``ratio16`` of what stays 16-bit (attention core, logit layer); ``act_b``,
    ``res_b``, ``w_b`` [bytes] per activation, residual-stream and stored-weight element;
    ``attn_slowdown`` of fp32 attention; ``autocast`` (eager under ``torch.autocast``);
    ``lowp`` (fp8 / fp4 with fused kernels: quantisation casts); ``recipe`` (or None);
    ``fp8_table``: the low-precision GEMMs take the measured fp8 table (:func:`fp8_table_applies`).
    """

    peak: float
    ratio: float
    act_b: float
    res_b: float
    peak16: float
    ratio16: float
    attn_slowdown: float
    autocast: bool
    w_b: float
    lowp: bool
    recipe: LowPrecisionRecipe | None
    fp8_table: bool = False


def gemm_precision(training: TrainingSpec, gpu: GPUSpec, cal: Calibration, eager: bool
                   ) -> GemmPrecision:
    """GEMM peak, efficiency ratio and bytes per element of ``training.precision``.

    fp32 runs its GEMMs on TF32 tensor cores with fused kernels (Megatron in NGC containers
    allows TF32) and on the fp32 CUDA cores in eager PyTorch (``allow_tf32`` False); fp8 / fp4
    at their peak times :data:`LOW_PRECISION_GEMM_RATIO` and the recipe's ``gemm_ratio``; only
    the linear GEMMs run in low precision, the attention core, softmax, norms and the logit
    layer stay 16-bit (Transformer Engine / Megatron-Core layout). FlashAttention has no fp32
    kernel: fp32 attention (SDPA's memory-efficient kernel) is taken at the fraction of the
    fp32-math peak FA2 reaches of bf16 (``attn_slowdown``, an assumption). Eager under autocast
    keeps fp32 embeddings, residual stream and weights (4 bytes).
    """
    prec = training.precision
    recipe = None
    if prec == "fp32":
        peak = gpu.peak_flops("fp32" if eager else "tf32")
        ratio, act_b, res_b = 1.0, 4.0, 4.0
    elif prec in ("fp8", "fp4"):
        peak = gpu.peak_flops(prec)
        recipe = recipe_of(training)
        ratio, act_b, res_b = LOW_PRECISION_GEMM_RATIO * recipe.gemm_ratio, 2.0, 2.0
    else:
        peak = gpu.peak_flops(prec)
        ratio, act_b, res_b = 1.0, 2.0, 2.0
    peak16, ratio16 = (gpu.peak_flops("bf16"), 1.0) if prec in ("fp8", "fp4") else (peak, ratio)
    attn_slowdown = max(1.0, cal.peak_flops_bf16 / peak) if prec == "fp32" else 1.0
    autocast = eager and prec != "fp32"
    if autocast:
        res_b = 4.0  # fp32 embeddings and residual stream; LayerNorm runs in fp32 under autocast
    w_b = 4.0 if eager else 2.0  # bytes per stored weight element
    lowp = prec in ("fp8", "fp4") and not eager
    return GemmPrecision(peak, ratio, act_b, res_b, peak16, ratio16, attn_slowdown, autocast,
                         w_b, lowp, recipe, recipe is not None and fp8_table_applies(training,
                                                                                     gpu, cal))


@dataclass(frozen=True)
class _LayerContext:
    """Everything the kernels of one layer read: the specs, the calibration, the precision
    (:class:`GemmPrecision`, ``pr``) and the shapes on this GPU: ``T`` tokens in the
    tensor-parallel region (GEMM rows, ``mb*s/cp``), ``Tn`` in the norm / dropout region
    (``T/tp`` with sequence parallelism), ``nh_gpu`` heads, ``f_gpu`` MLP activation columns
    of the average layer (:func:`perfmodel.moe.experts.effective_ffn_size` / tp), ``act_cols`` fc1
    output columns, ``gemms`` (:func:`layer_gemms`)."""

    model: ModelSpec
    training: TrainingSpec
    gpu: GPUSpec
    batch: ConfigBatch
    cal: Calibration
    eager: bool
    pr: GemmPrecision
    tp: np.ndarray
    cp: np.ndarray
    mb: np.ndarray
    s: float
    h: int
    d: int
    nh_gpu: np.ndarray
    T: np.ndarray
    Tn: np.ndarray
    f_gpu: np.ndarray
    act_cols: np.ndarray
    gemms: list
    host_exposed_s: np.ndarray


def _layer_context(model, training, gpu, batch, cal, eager) -> _LayerContext:
    """The shapes of one layer on this GPU (see :class:`_LayerContext`)."""
    tp = batch.tp.astype(np.float64)
    cp = batch.cp.astype(np.float64)
    mb = batch.micro_batch_size.astype(np.float64)
    s = float(training.seq_len)
    T = mb * s / cp  # tokens in the tensor-parallel region (GEMM rows)
    f = moe.effective_ffn_size(model)  # MLP activation size of the average layer
    f_gpu = f / tp
    return _LayerContext(
        model=model, training=training, gpu=gpu, batch=batch, cal=cal, eager=eager,
        pr=gemm_precision(training, gpu, cal, eager), tp=tp, cp=cp, mb=mb, s=s,
        h=model.hidden_size, d=model.head_size, nh_gpu=model.num_attention_heads / tp, T=T,
        Tn=np.where(batch.sequence_parallel, T / tp, T),  # tokens in the norm / dropout region
        f_gpu=f_gpu, act_cols=f_gpu * (2 if model.gated_mlp else 1),  # fc1 output columns
        gemms=layer_gemms(model, T, tp, batch.ep, batch.etp,
                          moe.expert_rows_per_gpu(model, training, batch)),
        host_exposed_s=moe.moe_host_exposed_s(model, batch, training))


def _gemm_phase(c: _LayerContext, ph: _Phase, layouts: tuple[str, ...],
                skip: tuple[str, ...] = ()) -> None:
    """The layer's linear GEMMs in each of ``layouts`` (``fwd``, ``dgrad``, ``wgrad``), less
    ``skip``; the routed experts as one grouped GEMM over the local experts (Transformer
    Engine's GroupedLinear, ``general_grouped_gemm``, launches one cuBLAS GEMM per local expert:
    ``count`` launches on the host; on the device they run on several streams at once,
    :func:`perfmodel.moe.experts.grouped_gemm_slowdown`)."""
    pr = c.pr
    for name, m_, n_, k_, count in c.gemms:
        if name in skip:
            continue
        # the MoE router stays 16-bit under fp8 / fp4 (quantise.BF16_GEMMS)
        bf16 = pr.lowp and name in quantise.BF16_GEMMS
        peak, ratio = (pr.peak16, pr.ratio16) if bf16 else (pr.peak, pr.ratio)
        low = pr.recipe is not None and not bf16  # runs at the fp8 / fp4 rate
        for lay in layouts:
            if low and pr.fp8_table:  # measured fp8 / bf16 ratio at this shape
                groups = count if name.startswith("expert_") else None
                t = fp8_table_gemm_time_s(c.cal, m_, n_, k_, lay, pr.peak16, groups)
                ph.add(t * moe.grouped_gemm_slowdown(c.model, c.batch) if groups is not None
                       else count * t, count)
                continue
            tile = low_precision_tile_factor(m_, n_, k_, lay, c.gpu) if low else 1.0
            if name.startswith("expert_"):
                ph.add(grouped_gemm_time_s(c.cal, count, m_, n_, k_, lay, peak, ratio)
                       * moe.grouped_gemm_slowdown(c.model, c.batch) * tile, count)
            else:
                ph.add(count * gemm_time_s(c.cal, m_, n_, k_, lay, peak, ratio) * tile, count)


def _moe_kernels(c: _LayerContext, ph: _Phase, pass_: str) -> None:
    """Router softmax / top-k and token permute / unpermute of the MoE layers (averaged
    over the layers): the router reads and writes ``T/tp x E`` fp32 scores; permute and
    unpermute each read ``T/tp`` tokens and write their ``k`` routed copies (or back).
    Megatron-Core ``moe_utils.permute`` / ``unpermute``, ``router.topk_softmax_with_capacity``."""
    model, training, act_b, h = c.model, c.training, c.pr.act_b, c.h
    if not model.is_moe:
        return
    phi = model.moe_layer_fraction
    t_sp = c.T / c.tp
    ph.mem("softmax", phi * 2 * 4.0 * t_sp * model.num_experts, 2 if pass_ == "bwd" else 1)
    n_perm = moe_dispatch.permute_copy_kernels(training)
    ph.mem("copy", phi * (1 + model.moe_top_k) * act_b * t_sp * h * 2 / n_perm, n_perm)
    if c.eager:
        return
    # after the dispatcher's device-to-host sync the GPU waits for the host work that
    # follows it (per local expert) and for the router / preprocess launches before it
    # (the per-expert part also without a sync: moe.moe_host_exposed_s)
    ph.add(phi * (c.host_exposed_s + moe_dispatch.static_host_s(model, training, pass_,
                                                                c.pr.lowp)), 0)
    # the experts' fc2 bias, scaled by the probabilities outside the grouped GEMM
    nb, nk = moe.expert_output_bias_traffic(model, training, c.batch, act_b, pass_)
    ph.mem("add", phi * nb / np.maximum(nk, 1.0), phi * nk)


def _attention(c: _LayerContext, ph: _Phase, pass_: str) -> None:
    """The attention core of one layer. Flash attention: the calibrated causal kernel time
    over cp (cuDNN's; slower by :func:`perfmodel.compute.attention_kernels.flash_attn2_slowdown` where
    the recipe runs the flash-attn 2 package), at least the SFU's one exp per score in the
    fused forward (FA-4,
    :func:`perfmodel.compute.attention_kernels.attention_exp_floor_s`), sliding-window layers visiting
    only their band's key tiles. Unfused attention (Megatron-LM before flash attention,
    Narayanan et al. 2021 Sec. 4.2; Korthikanti et al. 2022 Sec. 4.1): two batched GEMMs, QK^T
    (sq x s x d) and softmax(.)V (sq x d x s), with the b*a*s^2 score tensor written and read
    by the fused scale-mask-softmax kernel and by attention dropout (mask of 1 byte/score)."""
    model, cal, pr, s, mb, nh_gpu, cp = c.model, c.cal, c.pr, c.s, c.mb, c.nh_gpu, c.cp
    act_b = pr.act_b
    if c.training.flash_attention:
        d_attn = (model.qk_head_size + model.v_head_size) / 2  # MLA: 192 and 128
        t = cal.attention_time_s(mb * nh_gpu, s, d_attn, pass_, causal=True) / cp
        if not c.eager:  # the kernel Transformer Engine selects (eager: PyTorch SDPA's cuDNN)
            t = t * attention_kernels.flash_attn2_slowdown(
                cal, c.gpu, c.training.attention_backend, d_attn, pass_)
        if pass_ == "fwd" and not c.eager:  # one exp per score: the SFU floor (FA-4)
            t = np.maximum(t, attention_kernels.attention_exp_floor_s(c.gpu, mb * nh_gpu, s)
                           / cp)
        t = t * attention_kernels.window_layer_factor(model, s)
        if model.is_hybrid:  # attention in a share of the layers only
            t = t * model.attention_layer_fraction
        ph.add(t * pr.attn_slowdown, 1 if pass_ == "fwd" else 3)
        return
    sq = s / cp
    bh = mb * nh_gpu
    scores = bh * sq * s
    layouts = ("fwd",) if pass_ == "fwd" else ("dgrad", "wgrad")
    for lay in layouts:
        ph.add(gemm_time_s(cal, bh * sq, s, c.d, lay, pr.peak16, pr.ratio16))
        ph.add(gemm_time_s(cal, bh * sq, c.d, s, lay, pr.peak16, pr.ratio16))
    if pass_ == "fwd":
        ph.mem("softmax", 2 * act_b * scores)
        ph.mem("dropout", (2 * act_b + 1) * scores)
    else:
        ph.mem("dropout", (2 * act_b + 1) * scores)
        ph.mem("softmax", 3 * act_b * scores)


def _cp_ring_kernels(c: _LayerContext, ph: _Phase, pass_: str) -> None:
    """The context-parallel exchange's own memory-bound kernels around the attention, Transformer
    Engine attention with cp > 1 only; in the attention layers of a hybrid model: the ring's
    half-tensor copies, fp32 merges of the partial outputs and dQ / dK / dV sums
    (:func:`perfmodel.comm.cp_ring.ring_bookkeeping`, over ``cp / cp_a2a`` steps for
    ``cp_comm = "a2a+p2p"``); rows with ``"a2a"`` (Ulysses) and ``"a2a+p2p"`` the all-to-all's
    reshape copies (:func:`perfmodel.comm.cp_a2a.a2a_reshape_bytes`); ``"allgather"`` rows the
    reorders of the gathered tensors instead of the ring's (:func:`_cp_allgather_kernels`).
    """
    if c.eager or not c.training.flash_attention or not np.any(c.cp > 1):
        return

    model = c.model
    rows = c.mb * c.s / c.cp * c.nh_gpu
    ring_steps = c.cp // c.batch.cp_a2a  # cp_a2a is 1 but for a2a+p2p rows
    copy_b, add_b, kernels = cp_ring.ring_bookkeeping(
        ring_steps, rows * model.qk_head_size, rows * model.v_head_size,
        cp_kv_chunk_bytes(model, c.training, c.batch), c.pr.act_b, model.v_head_size, pass_)
    a = model.attention_layer_fraction if model.is_hybrid else 1.0
    a2a = c.batch.cp_comm == CpComm.A2A
    exchange = a2a | (c.batch.cp_comm == CpComm.A2A_P2P)
    if np.any(exchange):  # Ulysses rows: no ring; hierarchical ones: the ring of cp / cp_a2a
        copy_b, add_b, kernels = (np.where(a2a, 0.0, x) for x in (copy_b, add_b, kernels))
        a2a_b, a2a_k = cp_a2a.a2a_reshape_bytes(cp_a2a_buffers(model, c.training, c.batch),
                                                c.cp, pass_)
        a2a_k = np.where(exchange, a2a_k, 0.0)
        ph.mem("copy", np.where(exchange, a2a_b, 0.0) / np.maximum(a2a_k, 1.0), a * a2a_k)
    ag = c.batch.cp_comm == CpComm.ALLGATHER
    if np.any(ag):
        copy_b, add_b, kernels = (np.where(ag, 0.0, x) for x in (copy_b, add_b, kernels))
        _cp_allgather_kernels(c, ph, pass_, ag, a)
    half = np.maximum(kernels, 1.0) / 2  # launches, split between the copies and the sums
    ph.mem("copy", copy_b / half, a * half)
    ph.mem("add", add_b / half, a * half)


def _cp_allgather_kernels(c: _LayerContext, ph: _Phase, pass_: str, ag: np.ndarray,
                          a: float) -> None:
    """The K/V all-gather attention's memory-bound kernels (rows ``ag``): forward, K and V made
    contiguous before the gather (read + write their chunk) and the gathered K and V reordered
    into sequence order (``index_select``: read + write ``cp`` chunks); backward, the same
    gather preparation and reorder, the two steps' dK / dV added into the full-sequence buffers
    (read + read + write of what each step covers, ``cp`` chunks in all) and reordered back
    before the reduce-scatter (``cp`` chunks) (Transformer Engine
    ``AttnFuncWithCPAndKVAllGather``)."""
    kv = cp_kv_chunk_bytes(c.model, c.training, c.batch)
    cp = c.cp.astype(np.float64)
    copies = 2.0 * kv + 2.0 * cp * kv
    n = 4.0
    if pass_ != "fwd":
        copies = copies + 2.0 * cp * kv
        ph.mem("add", np.where(ag, 3.0 * cp * kv, 0.0) / 4.0, a * np.where(ag, 4.0, 0.0))
        n = 6.0
    ph.mem("copy", np.where(ag, copies, 0.0) / n, a * np.where(ag, n, 0.0))


def _mlp_activation(c: _LayerContext, ph: _Phase, pass_: str, share: float = 1.0) -> None:
    """The MLP's bias + activation (``share`` of it): one fused kernel reading the fc1 output
    and writing the activation, ``(act_cols + f) * act_b * T`` bytes forward,
    ``(2*act_cols + f) * act_b * T`` backward (Megatron-Core ``bias_gelu`` / ``bias_swiglu``
    fusions); separate PyTorch ops otherwise (:func:`unfused_activation_kernels`)."""
    act_b, T, f_gpu = c.pr.act_b, c.T, c.f_gpu
    if c.model.fused_elementwise:
        cols = c.act_cols + f_gpu if pass_ == "fwd" else 2 * c.act_cols + f_gpu
        ph.mem("gelu", share * cols * act_b * T)
    else:
        n_k, vals = unfused_activation_kernels(c.model, pass_)
        ph.mem("gelu", share * vals / n_k * f_gpu * act_b * T, n_k)


def _rope_kernels(c: _LayerContext, ph: _Phase) -> None:
    """RoPE on q and k (read + write, 2 elements per value): one fused kernel, or
    :data:`UNFUSED_ROPE_KERNELS` separate ops (Megatron ``apply_rope_fusion``)."""
    model = c.model
    a = model.attention_layer_fraction if getattr(model, "is_hybrid", False) else 1.0
    if model.position_embedding == "rope" and a > 0:  # hybrid: in the attention layers only
        ph.mem("copy", 2 * c.pr.act_b * c.T * (c.nh_gpu + model.kv_heads / c.tp) * c.d * a,
               1 if model.fused_elementwise else UNFUSED_ROPE_KERNELS)


def _selective_module_forward(c: _LayerContext, ph: _Phase, module: str) -> None:
    """Forward work one module of selective recomputation repeats before the backward
    (Megatron-Core ``recompute_modules``): ``core_attn`` the attention core; ``layernorm``
    the two norms; ``moe_act`` / ``mlp`` / ``shared_experts`` their share of the MLP
    activation (:func:`mlp_activation_share`), ``mlp`` and ``shared_experts`` also their
    GEMMs (normal checkpointing reruns the submodule); ``mla_up_proj`` the MLA q / kv up
    projections and the RoPE applied to their outputs. References: Megatron-Core
    ``transformer/transformer_config.py`` (``recompute_modules``), ``transformer_layer.py``
    and ``moe/experts.py`` (``CheckpointWithoutOutput`` around the norms and activation)."""
    model, act_b, T = c.model, c.pr.act_b, c.T
    if module == "core_attn":
        _attention(c, ph, "fwd")
        _cp_ring_kernels(c, ph, "fwd")
    elif module == "layernorm":
        ph.mem("layernorm", 2 * act_b * c.Tn * c.h, model.norms_per_layer)
    elif module in ("moe_act", "mlp", "shared_experts"):
        share = mlp_activation_share(model, module)
        if share <= 0:
            return
        _mlp_activation(c, ph, "fwd", share)
        names = {"mlp": ("fc1", "fc2"), "shared_experts": ("shared_fc1", "shared_fc2"),
                 "moe_act": ()}[module]
        _gemm_phase(c, ph, ("fwd",), skip=tuple(g[0] for g in c.gemms if g[0] not in names))
    elif module == "mla_up_proj" and model.is_mla:
        _gemm_phase(c, ph, ("fwd",), skip=tuple(g[0] for g in c.gemms
                                                if g[0] not in ("q_up", "kv_up")))
        ph.mem("copy", 2 * act_b * T * (c.nh_gpu + 1) * model.qk_rope_head_dim)


def _mamba_kernels(c: _LayerContext, ph: _Phase, pass_: str) -> None:
    """The Mamba2 layers' conv1d, SSD scan and gated norm (:func:`perfmodel.compute.mamba.mamba_kernels`;
    nothing for a transformer)."""
    if c.model.is_hybrid:
        mamba.mamba_kernels(c.model, c.training, c.cal, ph, c.T, c.tp, c.pr.act_b, c.pr.peak16,
                            pass_, c.mb)


def _graph_saved_launches(c: _LayerContext, ph: _Phase, pass_: str) -> None:
    """The host launches an ``attn`` CUDA graph takes off a layer pass (fused kernels only:
    :func:`perfmodel.moe.dispatch.graph_saved_launches`)."""
    if not c.eager:
        ph.add(0.0, -moe_dispatch.graph_saved_launches(c.model, c.training, pass_, c.pr.lowp))


def _quantise_casts(c: _LayerContext, ph: _Phase, pass_: str) -> None:
    """The layer's low-precision quantisation casts in ``pass_`` where Transformer Engine runs
    them (:func:`perfmodel.compute.quantise.layer_quantise_terms`: sequence-parallel operands cast on
    their local rows, delayed scaling's cast inside the norm, transposes only on TN-only GPUs),
    as ``copy``-bandwidth kernels. A hybrid's average layer is its GEMM list weighted by the
    shares of the layers (:func:`layer_gemms`: attention, Mamba2 ``in_proj`` / ``out_proj``,
    MLP, MoE), each operand cast like the transformer's."""
    name = c.training.low_precision_recipe or "fp8-delayed"
    nbytes, kernels = quantise.layer_quantise_terms(c.gemms, name, c.pr.recipe, c.pr.act_b, c.gpu,
                                                    c.tp, c.batch.sequence_parallel, pass_)
    ph.mem("copy", nbytes / np.maximum(kernels, 1.0), kernels)


def _layer_forward(c: _LayerContext, ph: _Phase, early_stop: bool = False) -> None:
    """One layer's forward: GEMMs, attention and the memory-bound kernels. ``early_stop``:
    torch.utils.checkpoint (non-reentrant) stops the recomputation once the last saved tensor
    (fc2's input) exists, so fc2 and the last residual add are skipped. Eager: fp32 norms and
    residual stream, autocast casts, RoPE / GQA / SwiGLU (:func:`perfmodel.compute.eager.layer_terms`);
    fused: ln1 + ln2, bias + dropout + add x2, bias + activation, RoPE, and with fp8 / fp4 the
    quantisation of the four GEMM inputs (the recipe's amax / cast / transpose)."""
    pr, T, Tn, h, act_b = c.pr, c.T, c.Tn, c.h, c.pr.act_b
    _gemm_phase(c, ph, ("fwd",), skip=("fc2",) if early_stop else ())
    _attention(c, ph, "fwd")
    _cp_ring_kernels(c, ph, "fwd")
    if c.eager:
        ph.terms(eager_kernels.layer_terms(c.model, T, Tn, c.tp, c.f_gpu, c.gemms[0][2], c.s,
                                           act_b, pr.res_b, pr.w_b, pr.autocast, "fwd",
                                           early_stop))
        return
    blocks = c.model.norms_per_layer
    ph.mem("layernorm", 2 * act_b * Tn * h, blocks)  # fused ln1, ln2
    ph.mem("dropout", (3 * act_b + 1) * Tn * h, blocks)  # fused bias + dropout + add, x2
    _mlp_activation(c, ph, "fwd")
    _rope_kernels(c, ph)
    _mamba_kernels(c, ph, "fwd")
    if pr.lowp:
        _quantise_casts(c, ph, "fwd")


def _layer_backward(c: _LayerContext, ph: _Phase) -> None:
    """One layer's backward: dgrad and wgrad GEMMs, attention backward, MoE kernels and the
    memory-bound kernels. Fused: ln backward, dropout backward, residual gradient sums,
    bias + activation backward (or the separate ops and, with biases, the bias gradients'
    column sums), RoPE, and with fp8 / fp4 the quantisation of the four output gradients."""
    pr, T, Tn, h, act_b, model = c.pr, c.T, c.Tn, c.h, c.pr.act_b, c.model
    _gemm_phase(c, ph, ("dgrad", "wgrad"))
    _attention(c, ph, "bwd")
    _cp_ring_kernels(c, ph, "bwd")
    _moe_kernels(c, ph, "bwd")
    _graph_saved_launches(c, ph, "bwd")
    if c.eager:
        ph.terms(eager_kernels.layer_terms(model, T, Tn, c.tp, c.f_gpu, c.gemms[0][2], c.s,
                                           act_b, pr.res_b, pr.w_b, pr.autocast, "bwd"))
        return
    blocks = model.norms_per_layer
    ph.mem("layernorm", 3 * act_b * Tn * h, blocks)  # fused ln backward
    ph.mem("dropout", (2 * act_b + 1) * Tn * h, blocks)  # dropout backward
    ph.mem("add", 3 * act_b * Tn * h, blocks)  # residual gradient sums
    _mlp_activation(c, ph, "bwd")
    _mamba_kernels(c, ph, "bwd")
    if not model.fused_elementwise and model.linear_bias and not pr.lowp:
        # bias gradients: column sums of the output gradients
        ph.mem("add", act_b * T * (c.gemms[0][2] + h + c.act_cols + h) / 4, 4)
    _rope_kernels(c, ph)
    if pr.lowp:  # quantise the GEMMs' output gradients
        _quantise_casts(c, ph, "bwd")
    if not c.training.fsdp_gradient_accumulation_fusion:  # param.grad copied into main_grad
        w = sum(count * n_ * k_ for _, _, n_, k_, count in c.gemms)
        w = np.where(c.batch.zero_stage >= 3, w, 0.0)  # only the FSDP configurations
        ph.mem("copy", unfused_grad_accumulation_bytes(w, c.training.grad_reduce_in_fp32))


def launch_cost_s(gpu: GPUSpec) -> tuple[float, float]:
    """Host dispatch cost per kernel, forward and backward [s]: the part's own figure when its
    spec gives one (``launch_overhead_us``, e.g. the ``local`` CPU cluster calibrated by the
    harness), else :data:`CPU_FWD_LAUNCH_S` / :data:`CPU_BWD_LAUNCH_S` fitted on the H200."""
    if gpu.launch_overhead_us is not None:
        return gpu.launch_overhead_us * 1e-6, gpu.launch_overhead_us * 1e-6
    return CPU_FWD_LAUNCH_S, CPU_BWD_LAUNCH_S


def full_iteration_graphed(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether the step runs as one full-iteration CUDA graph: ``cuda_graph_full_iteration``
    and nothing in the step stops the host. Megatron-Core's ``FullCudaGraphWrapper``
    (``--cuda-graph-impl local --cuda-graph-scope full_iteration``) captures the forward and
    backward of all micro-batches once and replays them with one launch, which needs static
    shapes: a dropless MoE layer syncs the token counts to the host
    (:func:`perfmodel.moe.dispatch.dispatch_syncs`), so only token-drop MoE with the expert
    inputs padded to capacity is captured (Megatron-Bridge's 25.09 Qwen3 recipes pair
    ``cuda_graph_scope="full_iteration"`` with ``apply_moe_token_drop``: capacity factor 1.0,
    ``moe_pad_expert_input_to_capacity=True``). Dense models: always.

    Example: Qwen3-30B on 8 B200, 25.09 (token drop, padded, full-iteration graphs) -> True;
    the same with dropless routing -> False."""
    return training.cuda_graph_full_iteration and not moe_dispatch.dispatch_syncs(model, training)


def graph_launch_cost_s(gpu: GPUSpec, model: ModelSpec, training: TrainingSpec
                        ) -> tuple[float, float]:
    """Host dispatch cost per kernel, forward and backward [s], as the step launches them:
    :func:`launch_cost_s`, or 0 for both where the step is one replayed CUDA graph
    (:func:`full_iteration_graphed`: the host launches the graph, not its kernels; the
    kernels' device time, and the per-expert time in series with it,
    :func:`perfmodel.moe.experts.moe_host_exposed_s`, stay)."""
    if full_iteration_graphed(model, training):
        return 0.0, 0.0
    return launch_cost_s(gpu)


def recompute_added_s(rec_gpu_s, rec_cpu_s, bwd_gpu_s, bwd_cpu_s, layer_bwd_s) -> np.ndarray:
    """What a layer's recompute adds to its backward [s]: the recompute runs right before the
    backward and CPU and GPU overlap across both, so the pair is composed together
    (:func:`_overlap_s` of the summed device and host times) less the backward alone."""
    return _overlap_s(rec_gpu_s + bwd_gpu_s, rec_cpu_s + bwd_cpu_s) - layer_bwd_s


def _embedding_phases(c: _LayerContext) -> tuple[_Phase, _Phase]:
    """The embedding on the first stage, forward and backward: token rows gathered (and
    learned position rows added), dropout with fused kernels; the backward zeroes the
    vocab-parallel table gradient, sorts and scatter-adds the token gradients in fp32
    (eager: fp32 params; fused: main grad) and, eager with tied embeddings, sums the logit
    layer's weight gradient into it."""
    model, pr, T, h = c.model, c.pr, c.T, c.h
    res_b, act_b = pr.res_b, pr.act_b
    V = float(model.vocab_size)
    learned = model.position_embedding == "learned"
    ef, eb = _Phase(c.cal, len(c.batch)), _Phase(c.cal, len(c.batch))
    ef.mem("copy", 2 * res_b * T * h)  # token rows gathered
    if learned:
        ef.mem("copy", 2 * res_b * T * h)  # position rows
        ef.mem("add", 3 * res_b * T * h)
    if not c.eager:
        ef.mem("dropout", (2 * act_b + 1) * c.Tn * h)
    g_b = 4.0  # gradients of embeddings accumulate in fp32 (eager: fp32 params; fused: main grad)
    eb.mem("copy", g_b * V * h / c.tp)  # zero the (vocab-parallel) table gradient
    eb.mem("add", (res_b + 2 * g_b) * T * h, 3)  # sort + scatter-add of the token gradients
    if learned:
        eb.mem("add", (res_b + 2 * g_b) * T * h, 2)
    if model.tied_embeddings and c.eager:
        eb.mem("add", 3 * g_b * V * h / c.tp)  # sum with the logit layer's weight gradient
    return ef, eb


def unfused_cross_entropy(fwd: _Phase, bwd: _Phase, tokens, cols, act_b: float) -> None:
    """Megatron's vocab-parallel cross-entropy as unfused PyTorch ops on fp32 logits
    (``tokens x cols`` values on this GPU): forward cast (a+4), max (4), subtract (8), exp (8),
    sum (4), normalise in place (8) bytes per value; backward softmax - one-hot (8), scale by
    the loss gradient (8), cast (4+a). Source: Megatron-Core
    ``tensor_parallel/cross_entropy.py`` (``VocabParallelCrossEntropy``).

    Example: 4096 tokens x 25216 columns, bf16 (a = 2): 34 bytes per value forward (3.5 GB
    over 6 kernels), 22 backward (2.3 GB over 3), as :func:`fused_cross_entropy` compares."""
    fwd.mem("copy", (act_b + 4) * tokens * cols)
    fwd.mem("copy", 28 * tokens * cols / 5, 5)
    bwd.mem("copy", 16 * tokens * cols / 2, 2)
    bwd.mem("copy", (4 + act_b) * tokens * cols)


def _logits_phases(c: _LayerContext) -> tuple[_Phase, _Phase]:
    """Logits and loss on the last stage, forward and backward: final norm, the 16-bit output
    GEMM (fwd, dgrad, wgrad) and the cross-entropy (eager: autocast casts, ``logits.float()``,
    fp32 log_softmax + nll_loss, :func:`perfmodel.compute.eager.cross_entropy`; fused:
    :func:`fused_cross_entropy` or :func:`unfused_cross_entropy`)."""
    pr, T, h, cal = c.pr, c.T, c.h, c.cal
    act_b = pr.act_b
    Vg = float(c.model.vocab_size) / c.tp
    lf, lb = _Phase(cal, len(c.batch)), _Phase(cal, len(c.batch))
    lf.add(gemm_time_s(cal, T, Vg, h, "fwd", pr.peak16, pr.ratio16))
    lb.add(gemm_time_s(cal, T, Vg, h, "dgrad", pr.peak16, pr.ratio16))
    lb.add(gemm_time_s(cal, T, Vg, h, "wgrad", pr.peak16, pr.ratio16))
    if c.eager:
        lf.terms(eager_kernels.cross_entropy(T, Vg, h, pr.res_b, act_b, pr.w_b, pr.autocast,
                                             "fwd"))
        lf.add(KERNEL_MIN_S)  # nll_loss
        lb.terms(eager_kernels.cross_entropy(T, Vg, h, pr.res_b, act_b, pr.w_b, pr.autocast,
                                             "bwd"))
        return lf, lb
    lf.mem("layernorm", 2 * act_b * c.Tn * h)
    if c.training.cross_entropy == "fused":
        fused_cross_entropy(lf, lb, T * Vg, act_b)
    else:
        unfused_cross_entropy(lf, lb, T, Vg, act_b)
    lb.mem("layernorm", 3 * act_b * c.Tn * h)
    return lf, lb


def _compute_times(model, training, gpu, batch, kernels, calibration) -> dict[str, np.ndarray]:
    """:func:`compute_times` for every configuration of ``batch``, without de-duplication.

    The recipe: the precision and shapes (:func:`gemm_precision`, :func:`_layer_context`);
    the layer forward (:func:`_layer_forward`, :func:`_moe_kernels`, less the launches CUDA
    graphs save), backward (:func:`_layer_backward`), full and selective recompute
    (:func:`_selective_module_forward`), each phase the smooth max of device and host time
    (:func:`launch_cost_s`, :func:`recompute_added_s`); the embedding
    (:func:`_embedding_phases`), logits and loss (:func:`_logits_phases`), the optimizer.
    """
    if kernels not in ("fused", "eager"):
        raise ValueError(f"kernels {kernels!r}: expected 'fused' or 'eager'")
    if kernels == "eager" and model.is_hybrid:
        raise SpecError(f"model '{model.name}': hybrid Mamba2 layers are modelled with fused "
                        "kernels only (kernels='fused')")
    cal = sustained_calibration(gpu, calibration, kernels, training.precision)
    eager = kernels == "eager"
    n = len(batch)
    c = _layer_context(model, training, gpu, batch, cal, eager)

    # ---- layer forward (CUDA graphs replay the parts of cuda_graph_scope as one launch each)
    fwd = _Phase(cal, n)
    _layer_forward(c, fwd)
    _moe_kernels(c, fwd, "fwd")
    _graph_saved_launches(c, fwd, "fwd")
    # ---- layer backward
    bwd = _Phase(cal, n)
    _layer_backward(c, bwd)
    # ---- recompute: full (the whole forward, stopping early in eager) and selective modules
    rec_full = _Phase(cal, n)
    _layer_forward(c, rec_full, early_stop=eager)
    _moe_kernels(c, rec_full, "fwd")
    rec_sel = _Phase(cal, n)
    for module in training.recompute_modules:
        _selective_module_forward(c, rec_sel, module)

    cpu_f, cpu_b = graph_launch_cost_s(gpu, model, training)
    layer_fwd_s = fwd.time_s(cpu_f)
    layer_bwd_s = bwd.time_s(cpu_b)
    full_s = recompute_added_s(rec_full.gpu_s, rec_full.cpu_s(cpu_f, CHECKPOINT_CPU_S),
                               bwd.gpu_s, bwd.cpu_s(cpu_b), layer_bwd_s)
    sel_s = recompute_added_s(rec_sel.gpu_s, rec_sel.cpu_s(cpu_f), bwd.gpu_s, bwd.cpu_s(cpu_b),
                              layer_bwd_s)
    rc = batch.recompute
    layer_recompute_s = np.where(
        rc == Recompute.FULL, full_s, np.where(rc == Recompute.SELECTIVE, sel_s, 0.0)
    )

    ef, eb = _embedding_phases(c)  # first stage
    lf, lb = _logits_phases(c)  # last stage
    optimizer_s = _optimizer_s(model, training, gpu, batch, kernels, cal)
    attn_f, attn_b = _Phase(cal, n), _Phase(cal, n)  # the attention core alone (device time)
    _attention(c, attn_f, "fwd")
    _attention(c, attn_b, "bwd")

    return {
        "layer_fwd_s": layer_fwd_s,
        "layer_bwd_s": layer_bwd_s,
        "layer_recompute_s": layer_recompute_s,
        "embed_fwd_s": ef.time_s(cpu_f),
        "embed_bwd_s": eb.time_s(cpu_b),
        "logits_fwd_s": lf.time_s(cpu_f),
        "logits_bwd_s": lb.time_s(cpu_b),
        "optimizer_s": optimizer_s,
        "attn_fwd_s": attn_f.gpu_s,
        "attn_bwd_s": attn_b.gpu_s,
    }
