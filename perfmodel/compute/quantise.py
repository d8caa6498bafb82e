"""Where Transformer Engine quantises the operands of a layer's low-precision GEMMs, and what it
costs in HBM traffic and kernels.

Per GEMM of :func:`perfmodel.compute.layer.layer_gemms` (``m x k`` input, ``m x n`` output):

* forward: the input ``m x k``; backward: the output gradient ``m x n``. Each needs a
  row-wise copy (forward / data-gradient GEMM) and a column-wise copy (weight-gradient GEMM).
* **Where**: with sequence parallelism the inputs of the column-parallel GEMMs after a norm
  (qkv, fc1, the shared experts' fc1, MLA's up projections) and the output gradients of
  the row-parallel GEMMs (proj, fc2) live on ``m / tp`` rows of the sequence-parallel region.
  TE quantises them there and all-gathers the fp8 data (``gather_along_first_dim(...,
  quantizer=...)`` in ``module/layernorm_linear.py`` / ``linear.py``; TE 1.x: the norm writes fp8
  into the userbuffer, ``fp8_transpose`` of the gathered tensor for the weight gradient).
* **Norm fusion**: under delayed scaling the RMSNorm / LayerNorm kernel writes the fp8 output
  itself (``pytorch/csrc/extensions/normalization.cpp``: "Always used fused kernel for FP8
  delayed scaling"), no separate cast; current scaling runs the norm in 16 bit, then
  ``nvte_compute_amax`` and ``nvte_quantize_v2``; MXFP8 likewise (its fused norm needs
  ``NVTE_NORM_FWD_USE_CUDNN``, off by default).
* **Column-wise copy**: tensor-scaled fp8 (delayed, current) on a GPU whose cuBLAS fp8 GEMMs
  take only TN layouts (Hopper, Ada) writes the transpose: in the fused ``cast_transpose`` when
  the cast is unfused and not gathered (one more byte written), else as ``fp8_transpose`` of
  the gathered fp8 tensor (one byte read and one written per element over all ``m`` rows).
  Blackwell (sm100) runs non-TN fp8 GEMMs and keeps no transpose
  (``Float8Quantizer::create_tensor``: ``with_transpose = columnwise_usage &&
  !nvte_is_non_tn_fp8_gemm_supported()``, ``pytorch/csrc/quantizer.cpp``). Block-scaled
  recipes (fp8-block, MXFP8, NVFP4) scale along the reduction axis, so the column-wise copy is
  its own quantisation of the 16-bit values, written by the same kernel.
* **What stays 16-bit**: the MoE router (Megatron-Core ``TopKRouter.gating`` is a
  ``torch`` linear in the router dtype, not a TE module) is neither quantised nor run at the
  fp8 rate; the attention core and the output layer never are (:func:`perfmodel.compute.layer.
  gemm_precision`).
"""

from __future__ import annotations

import numpy as np

from perfmodel.hardware.overlap import gpu_generation
from perfmodel.spec.specs import GPUSpec

__all__ = [
    "AMAX_REDUCED_RECIPES",
    "BF16_GEMMS",
    "NORM_FED_GEMMS",
    "NORM_FUSED_RECIPES",
    "ROW_PARALLEL_GEMMS",
    "TENSOR_SCALED_RECIPES",
    "amax_reduction_s",
    "layer_quantise_terms",
    "operand_quantise",
    "transpose_copy_needed",
]

#: GEMMs whose input is a norm's output (column-parallel; TELayerNormColumnParallelLinear). MLA's
#: down projections are plain TELinear modules after a separate TENorm (Megatron-Core
#: ``gpt_layer_specs``: ``linear_q_down_proj`` / ``linear_kv_down_proj``), so each casts its input.
#: The Mamba2 ``in_proj`` is one too (Megatron-Core ``mamba_layer_specs``: ``MambaMixerSubmodules(
#: in_proj=TELayerNormColumnParallelLinear, out_proj=TERowParallelLinear)``).
NORM_FED_GEMMS = frozenset({"qkv", "q", "q_up", "kv_up", "fc1", "shared_fc1", "mamba_in_proj"})
#: Row-parallel GEMMs whose output gradient arrives on the sequence-parallel rows.
ROW_PARALLEL_GEMMS = frozenset({"proj", "fc2", "shared_fc2", "mamba_out_proj"})
#: GEMMs Megatron-Core runs in 16 bit under an fp8 recipe (not Transformer Engine modules).
BF16_GEMMS = frozenset({"router"})
#: Recipes with one per-tensor scale (the column-wise copy is a transpose of the fp8 data).
TENSOR_SCALED_RECIPES = frozenset({"fp8-delayed", "fp8-cs"})
#: Recipes whose norm kernel writes the quantised output itself.
NORM_FUSED_RECIPES = frozenset({"fp8-delayed"})
#: Recipes that reduce an amax history across the fp8 group at every autocast exit and first-
#: module backward (:func:`amax_reduction_s`): delayed scaling only (current and block scalings
#: take each tensor's amax when they cast it).
AMAX_REDUCED_RECIPES = frozenset({"fp8-delayed"})


def amax_reduction_s(num_microbatches, model_chunks, all_reduce_s, kernel_s) -> np.ndarray:
    """Step time [s] of fp8 delayed scaling's amax reductions on one pipeline rank:
    ``2 * m * vp * (all_reduce_s + 2 * kernel_s)``.

    Megatron-Core wraps each model chunk's ``TransformerBlock.forward`` in one
    ``fp8_autocast(fp8_group=get_amax_reduction_group(with_context_parallel=True))`` (the
    tensor x data x context parallel ranks of the stage). Transformer Engine, delayed scaling:
    at the outermost autocast exit ``FP8GlobalStateManager.reduce_and_update_fp8_tensors
    (forward=True)`` concatenates the chunk's amaxes (``torch.cat``), all-reduces them with
    ``ReduceOp.MAX`` over that group (``async_op=False``: the compute stream waits) and runs the
    fused amax-history / scale update; the backward does the same once per chunk, in the first
    module's backward (``reduce_and_update_bwd_fp8_tensors``). So per micro-batch and model
    chunk two latency-bound all-reduces of a few hundred bytes (``all_reduce_s``, the caller's
    price on the group) and two small kernels each (``kernel_s``), in series with the chunk's
    work: ``m`` micro-batches x ``vp`` chunks x 2 passes on every rank.

    Example: Grok-1 on 512 H100 (tp 4, cp 2, dp 8: a 64-GPU group over 8 nodes, about 90 us a
    reduction), m = 128, vp = 8, 2 us kernels: 2 * 128 * 8 * (90 + 4) us = 0.1925 s.

Source: Transformer Engine ``pytorch/fp8.py`` (``FP8GlobalStateManager.fp8_autocast_exit`` ->
``reduce_and_update_fp8_tensors``, ``reduce_tensor_across_group_op_max``), ``module/base.py`` /
``linear.py`` backward (``reduce_and_update_bwd_fp8_tensors``); Megatron-Core
``transformer/transformer_block.py`` (``fp8_autocast`` around the block,
``parallel_state.get_amax_reduction_group``).
    """
    m = np.asarray(num_microbatches, dtype=np.float64)
    vp = np.asarray(model_chunks, dtype=np.float64)
    per = np.asarray(all_reduce_s, dtype=np.float64) + 2.0 * float(kernel_s)
    return 2.0 * m * vp * per


def transpose_copy_needed(gpu: GPUSpec) -> bool:
    """Whether a tensor-scaled fp8 GEMM operand needs a transposed copy: True on GPUs whose
    cuBLAS fp8 GEMMs take only the TN layout (everything before Blackwell), False on Blackwell
    (TE ``is_non_tn_fp8_gemm_supported``: compute capability 10.x, :func:`gpu_generation`)."""
    return gpu_generation(gpu) != "blackwell"


def operand_quantise(rows_local, rows_gemm, cols, recipe_name: str, recipe, act_b: float,
                     tn_only: bool, norm_fed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(HBM bytes, kernels) to quantise one GEMM operand of ``rows_local x cols`` 16-bit values
    (``rows_gemm`` rows after the tensor-parallel all-gather) for its row-wise and column-wise
    uses under ``recipe`` (:class:`perfmodel.compute.layer.LowPrecisionRecipe`).

    * row-wise: nothing when the norm writes it (``norm_fed`` under a norm-fused recipe), else
      ``act_b * (1 + amax_passes)`` read and ``bytes_per_elem`` written per local element
      (one kernel, plus the amax kernel of current scaling);
    * column-wise: block-scaled, ``bytes_per_elem`` more written by the same kernel; tensor-
      scaled on a TN-only GPU, 1 more byte written by the fused cast-transpose when the cast is
      unfused and the operand not gathered, else a transpose kernel reading and writing 1 byte
      per element over ``rows_gemm`` rows; nothing on Blackwell.

    Example: Llama 3 70B's fc1 input on an H100 at tp 4 with sequence parallelism (2048 local
    of 8192 rows, 8192 columns), delayed scaling: the norm writes it, the transpose of the
    gathered tensor moves 8192 * 8192 * 2 = 134 MB in 1 kernel; current scaling adds the
    amax and cast of the local rows, 2048 * 8192 * (2 * 2 + 1) = 84 MB in 2 kernels.

Source: Transformer Engine ``pytorch/csrc/extensions/normalization.cpp`` (the norm's fp8
output), ``pytorch/csrc/quantizer.cpp`` (``with_transpose``), ``module/layernorm_linear.py`` /
``linear.py`` (quantise, then gather); the module docstring says which does what.
    """
    local = np.asarray(rows_local, dtype=np.float64) * cols
    full = np.asarray(rows_gemm, dtype=np.float64) * cols
    tensor_scaled = recipe_name in TENSOR_SCALED_RECIPES
    fused_in_norm = norm_fed and recipe_name in NORM_FUSED_RECIPES
    nbytes = np.zeros_like(local + full)
    kernels = np.zeros_like(nbytes)
    if not fused_in_norm:
        nbytes = nbytes + local * (act_b * (1.0 + recipe.amax_passes) + recipe.bytes_per_elem)
        kernels = kernels + 1.0 + (1.0 if recipe.amax_passes > 0 else 0.0)
    if not tensor_scaled:  # (no block-scaled recipe is norm-fused: NORM_FUSED_RECIPES)
        nbytes = nbytes + local * recipe.bytes_per_elem * (recipe.copies - 1.0)
    elif tn_only:
        gathered = full > local
        transpose = fused_in_norm | gathered
        nbytes = nbytes + np.where(transpose, 2.0 * full, local)
        kernels = kernels + np.where(transpose, 1.0, 0.0)
    return nbytes, kernels


def layer_quantise_terms(gemms, recipe_name: str, recipe, act_b: float, gpu: GPUSpec, tp,
                         sequence_parallel, pass_: str) -> tuple[np.ndarray, np.ndarray]:
    """(HBM bytes, kernels) of one layer's quantisation casts in ``pass_`` (``fwd``: every low-
    precision GEMM's input ``m x k``; ``bwd``: its output gradient ``m x n``), summed over
    ``gemms`` (``(name, m, n, k, count)``, :func:`perfmodel.compute.layer.layer_gemms`) by
    :func:`operand_quantise`; the 16-bit :data:`BF16_GEMMS` are skipped. Sequence-parallel
    operands (norm-fed inputs forward, row-parallel output gradients backward) are quantised on
    ``m / tp`` rows and gathered.

    Example: a dense layer with fp8 delayed scaling at tp 1 on an H100 (T tokens, hidden h,
    fc2 input f): forward qkv and fc1 inputs are written by the norms and transposed
    (2 * 2 T h bytes, 2 kernels), proj and fc2 inputs cast-transposed (4 bytes per element).

Source: as :func:`operand_quantise`; the sequence-parallel operands are Megatron-Core's
(``tensor_parallel/layers.py``: column-parallel inputs gathered, row-parallel outputs
reduce-scattered).
    """
    tp = np.asarray(tp, dtype=np.float64)
    sp = np.asarray(sequence_parallel, dtype=bool) & (tp > 1)
    tn_only = transpose_copy_needed(gpu)
    total_b, total_k = 0.0, 0.0
    for name, m, n, k, count in gemms:
        if name in BF16_GEMMS:
            continue
        m = np.asarray(m, dtype=np.float64)
        if pass_ == "fwd":
            cols, split, norm_fed = k, name in NORM_FED_GEMMS, name in NORM_FED_GEMMS
        else:
            cols, split, norm_fed = n, name in ROW_PARALLEL_GEMMS, False
        rows_local = np.where(sp & split, m / tp, m)
        b, kn = operand_quantise(rows_local, m, np.asarray(cols, dtype=np.float64), recipe_name,
                                 recipe, act_b, tn_only, norm_fed)
        count = np.asarray(count, dtype=np.float64)
        total_b = total_b + count * b
        # the routed experts' operands are quantised by one multi-tensor kernel
        # (GroupedLinear: tex.split_quantize), the others one kernel (set) per GEMM
        total_k = total_k + np.where(count > 0, kn, 0.0) * (np.minimum(count, 1.0)
                                                            if name.startswith("expert_")
                                                            else count)
    return np.asarray(total_b, dtype=np.float64), np.asarray(total_k, dtype=np.float64)
