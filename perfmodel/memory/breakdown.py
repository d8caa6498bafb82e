"""Memory per GPU: model states by ZeRO stage, activations by recompute mode, pipeline in-flight
micro-batches, buffers, and whether a configuration fits the GPU's HBM.

All functions are pure and vectorized over numpy arrays (one entry per configuration); every
quantity is in bytes. Two kernel families are modelled:

* ``kernels="fused"``: Megatron-LM / Transformer Engine. 16-bit weights, fp32 main gradients in a
  contiguous buffer, fp32 master weights and Adam moments in the optimizer, fused kernels, flash
  attention; everything is allocated for the whole step, so the peak is a plain sum.
* ``kernels="eager"``: plain PyTorch eager as in ``hardware_specs/calibration/h200/e2e_dev.csv``:
  fp32 weights under ``torch.autocast(bfloat16)``, fp32 gradients created during the backward
  (``zero_grad(set_to_none=True)``), fused fp32 AdamW, logits cast to fp32 for the loss. The peak
  is the largest of three moments of the step (forward end, loss backward, backward end); the
  activation bytes are the tensors autograd saves, counted one by one (see
  :func:`eager_layer_activation_bytes`).

References
----------
Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC20), Sec. 3.1 and 5, Table 1. Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", Sec. 4, Table 2. Megatron-LM ``theoretical_memory_usage.py``.
Narayanan et al. 2021 (SC21), Sec. 2.2. Dao et al. 2022 (FlashAttention: O(s) extra memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from perfmodel.comm.comm_volume import cp_kv_chunk_bytes
from perfmodel.comm.cp_allgather import allgather_buffer_bytes
from perfmodel.core.codes import CpComm, Recompute, Schedule
from perfmodel.core.units import GIB, MIB
from perfmodel.memory.hybrid import hybrid_layer_activation_bytes
from perfmodel.memory.offload import resident_activation_layers
from perfmodel.memory.operands import activation_operands
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch
from perfmodel.pipeline.schedules import inflight_microbatches, schedule_code
from perfmodel.spec.specs import ClusterSpec, GPUSpec, ModelSpec, TrainingSpec

__all__ = [
    "ALLOCATOR_ALLOWANCE_FRACTION",
    "BUCKET_PARAMS",
    "LIBRARY_WORKSPACE_BYTES",
    "NON_ALLOCATOR_RESERVE_BYTES",
    "ZERO3_LIVE_LAYERS",
    "activation_operands",
    "allocator_allowance_bytes",
    "eager_accumulating_gradients",
    "eager_layer_activation_bytes",
    "eager_pipeline_held_output_bytes",
    "eager_pipeline_receive_bytes",
    "eager_zero_bubble_gradient_bytes",
    "embedding_activation_bytes",
    "even_memory_breakdown",
    "expert_state_bytes",
    "final_layer_activation_bytes",
    "fp8_gemm_input_bytes",
    "fp8_weight_cache_bytes",
    "fsdp2_zero2_sharded_weight_bytes",
    "fused_peak_stage",
    "gradient_bucket_bytes",
    "is_gpu",
    "kernel_state_bytes_per_param",
    "layer_activation_bytes",
    "library_workspace_bytes",
    "loss_buffer_bytes",
    "loss_inflight_microbatches",
    "loss_logit_bytes",
    "model_state_bytes",
    "moe_layer_activation_bytes",
    "optimizer_grad_copy_bytes",
    "optimizer_grad_copy_excess_bytes",
    "rank_state_bytes",
    "selective_recompute_freed_bytes",
    "single_stage_activation_bytes",
    "stage_activation_bytes",
    "stage_dense_layers",
    "stage_expert_params",
    "stage_fp8_weight_cache_bytes",
    "stage_inflight_microbatches",
    "stage_layer_activation_bytes",
    "stage_params",
    "state_bytes_per_param",
    "torch_zb_retained_microbatches",
    "usable_hbm_bytes",
    "zero3_gathered_bytes",
    "zero_state_bytes",
]

Kernels = Literal["fused", "eager"]

# ---------------------------------------------------------------------------------------------
# Constants (each one physical, documented in docs/memory.md)
# ---------------------------------------------------------------------------------------------
LIBRARY_WORKSPACE_BYTES = 2 * 32 * MIB
"""cuBLAS workspaces taken from the caching allocator: 32 MiB per (handle, stream) on Hopper
(PyTorch ``CublasHandlePool.cpp``, the size cuBLAS recommends for sm90), one for the forward
thread and one for the autograd backward thread. The e2e runs leave 0.07-0.2 GiB unexplained
above the counted tensors, which this covers for the small models."""

ALLOCATOR_ALLOWANCE_FRACTION = 0.03
"""Allowance for allocator fragmentation, as a fraction of the counted bytes. On the e2e runs
``max_memory_reserved / max_memory_allocated`` is 1.01-1.19 (median 1.09); the caching allocator
frees its cached blocks and retries before it raises OOM, so only part of that is unavoidable.
Included in ``other`` and ``peak``; ``peak_allocated`` leaves it out."""

NON_ALLOCATOR_RESERVE_BYTES = 1.2 * GIB
"""HBM the allocator cannot use: what the driver keeps back plus the CUDA context. H200: the spec
says 141 GiB, PyTorch sees 139.8 GiB (calibration/h200/env.json)."""

BUCKET_PARAMS = 40_000_000
"""Gradient bucket size [parameters]: Megatron-LM's default ``--ddp-bucket-size`` (40 M)."""

ZERO3_LIVE_LAYERS = 2
"""Layers whose full (all-gathered) parameters are live at once under ZeRO-3: the one computing
and the one being prefetched (DeepSpeed / FSDP prefetch one module ahead)."""

_EAGER_LOGITS_PEAK_VALUES = 14  # bytes per logit at the loss backward, see memory_breakdown


# ---------------------------------------------------------------------------------------------
# Model states
# ---------------------------------------------------------------------------------------------
def state_bytes_per_param(
    precision: str, optimizer: str = "adam", *, fp32_main_grads: bool = False
) -> tuple[float, float, float]:
    """Bytes per parameter of (weights, gradients, optimizer states).

    * ``fp32``: 4 + 4 + K with K = 8 for Adam (m, v) and 4 for SGD (momentum).
    * ``bf16`` / ``fp16`` mixed precision: 2 + 2 + K with K = 12 for Adam (fp32 master weights,
      m, v; the ZeRO paper's K) and 8 for SGD (fp32 master weights, momentum).
    * ``fp8`` / ``fp4`` as Transformer Engine trains them: the GEMMs run in fp8, but the weights
      are kept in bf16 and the master weights and moments in fp32, so the states are those of
      bf16 mixed precision (the fp8 weight copies TE caches are a buffer, see
      :func:`memory_breakdown`).

    ``fp32_main_grads``: gradients accumulated in fp32 (Megatron-LM's main-grad buffer, always
    used with bf16), 4 bytes instead of 2.

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 3.1 (mixed-precision Adam: 2 + 2 + 12 = 16 bytes);
    Megatron-LM ``theoretical_memory_usage.py`` (18 bytes per parameter with fp32 main grads).
    """
    opt = optimizer.lower()
    if opt in ("adam", "adamw"):
        k_fp32, k_mixed = 8.0, 12.0
    elif opt == "sgd":
        k_fp32, k_mixed = 4.0, 8.0
    else:
        raise ValueError(f"optimizer = {optimizer!r}: expected adam, adamw or sgd")
    prec = precision.lower()
    if prec == "fp32":
        return 4.0, 4.0, k_fp32
    if prec in ("bf16", "fp16", "fp8", "fp4"):
        return 2.0, (4.0 if fp32_main_grads else 2.0), k_mixed
    raise ValueError(f"precision = {precision!r}: expected fp32, bf16, fp16, fp8 or fp4")


def zero_state_bytes(params, dp, zero_stage, weight_bytes, grad_bytes, optimizer_bytes):
    """Per-GPU weights, gradients and optimizer bytes after ZeRO sharding over ``dp`` ranks.

    Stage 1 shards the optimizer states, stage 2 also the gradients, stage 3 also the weights
    (Megatron-LM's distributed optimizer is stage 1).

    Parameters
    ----------
    params : parameters held by this GPU before ZeRO (after tp/pp splitting) [count]
    dp : data-parallel ranks sharing the states
    zero_stage : 0, 1, 2 or 3
    weight_bytes, grad_bytes, optimizer_bytes : bytes per parameter

    Returns
    -------
    (weights_bytes, gradients_bytes, optimizer_bytes), arrays.

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 5.1-5.3 and Table 1: P_os (4 + K/N_d) Psi,
    P_os+g (2 + 14/N_d) Psi, P_os+g+p 16 Psi / N_d for mixed-precision Adam.
    """
    psi = np.asarray(params, dtype=np.float64)
    n = np.asarray(dp, dtype=np.float64)
    z = np.asarray(zero_stage)
    w = psi * weight_bytes / np.where(z >= 3, n, 1.0)
    g = psi * grad_bytes / np.where(z >= 2, n, 1.0)
    o = psi * optimizer_bytes / np.where(z >= 1, n, 1.0)
    return w, g, o


def model_state_bytes(
    params,
    dp,
    zero_stage,
    precision: str,
    optimizer: str = "adam",
    *,
    fp32_main_grads: bool = False,
) -> np.ndarray:
    """Model-state bytes per GPU (weights + gradients + optimizer states) under ZeRO.

    A calculator for notebooks and exercises: ``params`` are the parameters one data-parallel
    replica holds (the whole model without tp/pp). No activations, buffers or fragmentation.

    Examples
    --------
    ZeRO paper, Table 1 (7.5 B parameters, N_d = 64, ZeRO-2): 16.64 GB.

    >>> float(model_state_bytes(7.5e9, 64, 2, "bf16")) / 1e9
    16.640625

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 3.1, 5 and Table 1.
    """
    _check_zero_args(dp, zero_stage)
    w, g, o = state_bytes_per_param(precision, optimizer, fp32_main_grads=fp32_main_grads)
    ws, gs, os_ = zero_state_bytes(params, dp, zero_stage, w, g, o)
    return ws + gs + os_


def _check_zero_args(dp, zero_stage) -> None:
    """ValueError for a ZeRO stage outside 0-3 (stage 4 was priced as stage 3) or dp < 1."""
    z = np.asarray(zero_stage)
    if not np.all(np.isin(z, (0, 1, 2, 3))):
        bad = z[~np.isin(z, (0, 1, 2, 3))].ravel()[0]
        raise ValueError(f"zero_stage = {bad!r}: expected 0, 1, 2 or 3")
    n = np.asarray(dp, dtype=np.float64)
    if not np.all(n >= 1):
        raise ValueError(f"dp = {n[~(n >= 1)].ravel()[0]!r}: expected at least 1")


# ---------------------------------------------------------------------------------------------
# Activations of one transformer layer
# ---------------------------------------------------------------------------------------------
def layer_activation_bytes(
    seq_len,
    micro_batch_size,
    hidden_size,
    num_heads,
    *,
    tp=1,
    sequence_parallel=False,
    recompute=0,
    flash=False,
    dropout=True,
    ffn_hidden_size=None,
    num_kv_heads=None,
    head_dim=None,
    gated_mlp: bool = False,
    bytes_per_value: float = 2.0,
    gemm_input_bytes: float | None = None,
) -> np.ndarray:
    """Activation bytes one transformer layer keeps for the backward, per micro-batch and GPU.

    Korthikanti et al.'s Table 2, term by term, generalised: ``flash`` (no ``a s^2`` score
    storage; the softmax log-sum-exp, 4 bytes per head and token, instead), ``dropout`` (1-byte
    masks, and the attention-dropout output), grouped-query attention (K and V of
    ``num_kv_heads * head_dim``), a gated MLP (SwiGLU: the two up-projection outputs and their
    product, ``3 s b f``), any FFN size. ``seq_len`` is the sequence length this GPU holds (divide
    by cp first). Defaults (no flash, dropout, MHA, FFN = 4h, 2-byte values) give Table 2:
    ``sbh(34 + 5as/h)``, ``sbh(10 + 24/t + 5as/(ht))`` with tp, ``sbh/t (34 + 5as/h)`` with
    tp + sp, ``sbh(10 + 24/t)`` and ``34 sbh/t`` with selective recompute, ``2sbh`` with full
    recompute (``2sbh/t`` with sp: Megatron-LM keeps the sequence-sharded layer input).

    Parameters
    ----------
    seq_len, micro_batch_size, hidden_size, num_heads : s, b, h, a
    tp : t; sequence_parallel : shard the non-tensor-parallel parts by t as well
    recompute : 0 none, 1 selective (scores recomputed), 2 full (layer input only)
    ffn_hidden_size : f (default 4h); num_kv_heads : g (default a); head_dim : d (default h/a)
    bytes_per_value : bytes of a stored activation value (2 for 16-bit, 4 for fp32)
    gemm_input_bytes : bytes of a saved GEMM input (QKV, projection, fc1, fc2) when it is kept
        in another dtype, as Transformer Engine keeps fp8 casts (:func:`fp8_gemm_input_bytes`);
        the projection's input is then saved twice (the attention output O for the attention
        backward, its fp8 cast for the GEMM). Default: ``bytes_per_value``.

    References
    ----------
    Korthikanti et al. 2022, Sec. 4.1-4.2 (Eq. 1-2) and Table 2; Dao et al. 2022
    (FlashAttention stores O and the log-sum-exp, not the s x s scores).
    """
    s = np.asarray(seq_len, dtype=np.float64)
    b = np.asarray(micro_batch_size, dtype=np.float64)
    h = np.asarray(hidden_size, dtype=np.float64)
    a = np.asarray(num_heads, dtype=np.float64)
    t = np.asarray(tp, dtype=np.float64)
    f = 4.0 * h if ffn_hidden_size is None else np.asarray(ffn_hidden_size, dtype=np.float64)
    g = a if num_kv_heads is None else np.asarray(num_kv_heads, dtype=np.float64)
    d = h / a if head_dim is None else np.asarray(head_dim, dtype=np.float64)
    e = float(bytes_per_value)
    drop = np.asarray(dropout, dtype=bool)
    flash = np.asarray(flash, dtype=bool)
    rc = np.asarray(recompute)
    r = np.where(np.asarray(sequence_parallel, dtype=bool), t, 1.0)  # divisor of the sp parts
    sb = s * b
    mask = np.where(drop, 1.0, 0.0)  # 1-byte dropout mask per value

    # Attention block (Korthikanti Eq. 1 terms).
    norm_inputs = 2 * e * sb * h / r  # inputs of the two LayerNorms: 4sbh
    gi = e if gemm_input_bytes is None else float(gemm_input_bytes)
    qkv_input = gi * sb * h / r  # input of the QKV GEMM: 2sbh
    q = e * sb * a * d / t  # Q: 2sbh/t
    kv = 2 * e * sb * g * d / t  # K and V: 4sbh/t (MHA)
    proj_input = e * sb * a * d / t  # attention output = input of the output projection
    proj_input = proj_input + (0.0 if gi == e else gi * sb * a * d / t)  # + its fp8 cast
    attn_mask = mask * sb * h / r  # dropout mask after the projection: sbh
    scores = (e + mask + e * mask) * a * s * s * b / t  # softmax out, dropout mask, dropout out
    lse = 4.0 * a * sb / t  # flash: fp32 log-sum-exp per head and token
    score_terms = np.where(flash, lse, np.where(rc == Recompute.SELECTIVE, 0.0, scores))
    attention = qkv_input + q + kv + proj_input + attn_mask + score_terms

    # MLP block (Korthikanti Eq. 2 terms): fc1 input, activation input(s), fc2 input, mask.
    fc1_input = gi * sb * h / r
    # activation input(s) (gelu: sbf, swiglu: 2sbf values) and the fc2 input (sbf values)
    act_values = (np.where(gated_mlp, 2.0, 1.0) * e + gi) * sb * f / t
    mlp = fc1_input + act_values + mask * sb * h / r

    none = norm_inputs + attention + mlp
    full = e * sb * h / r  # layer input only
    return np.where(rc == Recompute.FULL, full, none)


def selective_recompute_freed_bytes(
    model: ModelSpec,
    recompute_modules,
    seq_len,
    micro_batch_size,
    *,
    tp=1,
    sequence_parallel=False,
    bytes_per_value: float = 2.0,
    gemm_input_bytes: float | None = None,
) -> np.ndarray:
    """Activation bytes per layer (the average layer, as :func:`layer_activation_bytes` counts
    them) that Megatron-Core's selective recomputation of ``recompute_modules`` does not keep
    for the backward, per micro-batch and GPU. Megatron-Core wraps each module in
    ``tensor_parallel.CheckpointWithoutOutput``: the module's output is freed once the next op
    has consumed it (``discard_output_and_register_recompute``) and recomputed before that op's
    backward, so exactly the saved copies of that output go:

    * ``layernorm``: the norm outputs Megatron keeps as separate tensors: the MoE layers'
      pre-MLP norm (a ``TENorm`` of its own, whose output the router and the dispatcher read:
      the ``fc1 input`` term, ``phi * gi * s b h / r``) and, for MLA, the input norm (its output
      feeds two down projections: the ``QKV input`` term). A dense layer's norms are fused into
      Transformer Engine's ``LayerNormLinear`` (no separate output to free): 0.
    * ``moe_act``: the routed experts' activation output, the fc2 input
      (``phi * k * imb * f_expert`` values per token over tp) in 16-bit training. Under fp8 / fp4
      ``GroupedLinear`` saves its own quantised copy of that input, which the checkpoint does
      not free: 0.
    * ``mla_up_proj``: the MLA up projections' outputs after RoPE, the Q, K and V that flash
      attention saves (the ``Q`` and ``K, V`` terms, ``e * s b (a + 2 g) d / t``).
    * ``core_attn`` (with flash attention the attention core saves only its inputs and the
      log-sum-exp, counted already; the scores of unfused attention are dropped by
      :func:`layer_activation_bytes` itself), ``mlp``, ``shared_experts``: 0 here.

    Parameters
    ----------
    model : the model (MoE and MLA shape)
    recompute_modules : names (``TrainingSpec.recompute_modules``)
    seq_len : tokens of a sequence on this GPU (s / cp); micro_batch_size : b
    tp, sequence_parallel : as in :func:`layer_activation_bytes`
    bytes_per_value, gemm_input_bytes : as in :func:`layer_activation_bytes` (``gi``)

    References
    ----------
    Megatron-Core ``transformer/transformer_config.py`` (``recompute_modules``),
    ``transformer/transformer_layer.py`` (``recompute_input_layernorm`` /
    ``recompute_pre_mlp_layernorm``), ``transformer/moe/experts.py`` (``activation_checkpoint``
    around the weighted SwiGLU), ``transformer/multi_latent_attention.py``
    (``recompute_up_proj``: ``qkv_up_checkpoint``), ``tensor_parallel/random.py``
    (``CheckpointWithoutOutput``); ``gpt_layer_specs.py`` (MoE layers' ``pre_mlp_layernorm`` a
    ``TENorm``, dense layers' fused into ``TELayerNormColumnParallelLinear``).
    """
    t, r, sb, e, gi = activation_operands(tp, sequence_parallel, seq_len, micro_batch_size,
                                          bytes_per_value, gemm_input_bytes)
    h = float(model.hidden_size)
    phi = model.moe_layer_fraction if model.is_moe else 0.0
    mods = set(recompute_modules)
    freed = 0.0 * sb * t
    if "layernorm" in mods:
        freed = freed + phi * gi * sb * h / r  # MoE layers' pre-MLP norm output
        if model.is_mla:
            freed = freed + gi * sb * h / r  # MLA's separate input norm output
    if "moe_act" in mods and gi == e:
        f_routed = model.moe_top_k * model.load_imbalance * model.expert_ffn_size
        freed = freed + phi * e * sb * f_routed / t
    if "mla_up_proj" in mods and model.is_mla:
        a, g, d = model.num_attention_heads, model.kv_heads, model.head_size
        freed = freed + e * sb * (a + 2.0 * g) * d / t
    return freed


def eager_layer_activation_bytes(
    seq_len,
    micro_batch_size,
    hidden_size,
    num_heads,
    *,
    tp=1,
    sequence_parallel=False,
    recompute=0,
    ffn_hidden_size=None,
    num_kv_heads=None,
    head_dim=None,
    gated_mlp: bool = False,
    norm: str = "layernorm",
    autocast: bool = True,
    dropout=False,
    rope: bool = False,
) -> np.ndarray:
    """Bytes autograd saves for one pre-norm block in PyTorch eager under ``autocast(bf16)``.

    Counted tensor by tensor for the block of ``calibration/calibrate_gpu.py`` (flash SDPA, no
    dropout, fp32 weights; CUDA autocast runs LayerNorm in fp32 and GEMMs in bf16). With
    ``autocast=False`` everything is fp32. For a GPT block (MHA, FFN = 4h) this is
    ``36 sbh + 16 sb + 4 a s b`` bytes:

    ======================================  ==============  ===========================
    saved tensor                            saved by        bytes
    ======================================  ==============  ===========================
    block input x (fp32 residual stream)    LayerNorm 1     4 sbh
    mean and rstd (fp32)                    LayerNorm 1     8 sb
    bf16 cast of LayerNorm-1 output         QKV GEMM        2 sbh
    QKV output (Q, K, V are views of it)    SDPA            2 sb(a + 2g)d = 6 sbh
    attention output O                      SDPA, proj      2 sbh
    log-sum-exp (fp32)                      SDPA            4 asb
    x + proj(O) (fp32)                      LayerNorm 2     4 sbh (+ 8 sb stats)
    bf16 cast of LayerNorm-2 output         fc1 GEMM        2 sbh
    fc1 output                              GELU            2 sbf = 8 sbh
    GELU output                             fc2 GEMM        2 sbf = 8 sbh
    ======================================  ==============  ===========================

    SwiGLU saves the gate/up output (4 sbf), the SiLU output (2 sbf) and the product (2 sbf);
    grouped-query attention with Hugging Face's ``repeat_kv`` also saves the repeated K and V.
    RMSNorm keeps only rstd (4 sb). Full recompute keeps the fp32 block input (4 sbh).
    ``rope``: rotary embeddings applied in eager (``x*cos + rotate_half(x)*sin``, as
    ``harness/model.py`` and Hugging Face Llama do) make new Q and K tensors, which SDPA saves
    in place of the QKV views, while V (a view) keeps the whole QKV output alive:
    ``e sb (a + g) d / t`` more (the multiplications save only the cos/sin tables).

    References
    ----------
    PyTorch autocast op lists (CUDA: ``layer_norm`` fp32, ``linear``/SDPA lower precision);
    derivatives.yaml (what each backward saves); Dao et al. 2022 (FlashAttention saves O, lse).
    """
    s = np.asarray(seq_len, dtype=np.float64)
    b = np.asarray(micro_batch_size, dtype=np.float64)
    h = np.asarray(hidden_size, dtype=np.float64)
    a = np.asarray(num_heads, dtype=np.float64)
    t = np.asarray(tp, dtype=np.float64)
    f = 4.0 * h if ffn_hidden_size is None else np.asarray(ffn_hidden_size, dtype=np.float64)
    g = a if num_kv_heads is None else np.asarray(num_kv_heads, dtype=np.float64)
    d = h / a if head_dim is None else np.asarray(head_dim, dtype=np.float64)
    r = np.where(np.asarray(sequence_parallel, dtype=bool), t, 1.0)
    e = 2.0 if autocast else 4.0  # GEMM inputs / outputs
    sb = s * b
    stats = (8.0 if norm == "layernorm" else 4.0) * sb / r  # mean + rstd, or rstd

    residuals = 2 * (4.0 * sb * h / r + stats)  # the two norm inputs (fp32) and their stats
    # GEMM inputs (QKV, fc1): with sequence parallelism DTensor saves the all-gathered,
    # full-sequence input (Megatron-LM saves the shard and gathers it again in the backward)
    norm_casts = 2 * e * sb * h if autocast else 2 * 4.0 * sb * h
    qkv_out = e * sb * (a + 2 * g) * d / t
    repeat_kv = np.where(g < a, 2 * e * sb * a * d / t, 0.0)
    attn_out = e * sb * a * d / t + 4.0 * a * sb / t
    mlp = np.where(gated_mlp, 4.0, 2.0) * e * sb * f / t
    masks = np.where(np.asarray(dropout, dtype=bool), 2.0 * sb * h / r, 0.0)
    rotated = e * sb * (a + g) * d / t if rope else 0.0  # roped Q and K saved by SDPA
    none = residuals + norm_casts + qkv_out + repeat_kv + attn_out + mlp + masks + rotated
    return np.where(np.asarray(recompute) == Recompute.FULL, 4.0 * sb * h / r, none)


def optimizer_grad_copy_bytes(precision: str, grad_reduce_in_fp32: bool) -> float:
    """Bytes per parameter (before optimizer sharding) of the fp32 gradient the optimizer steps
    on when the gradient buffer is 16-bit: Megatron-LM copies each (shard of a) bf16 main grad
    into an fp32 ``.grad`` of its fp32 master parameter (``_copy_model_grads_to_main_grads``);
    with an fp32 buffer it uses the buffer itself.

    References
    ----------
    Megatron-LM ``optimizer/optimizer.py`` (``Float16OptimizerWithFloat16Params``) and
    ``optimizer/distrib_optimizer.py`` (``_copy_model_grads_to_main_grads``).
    """
    return 0.0 if precision == "fp32" or grad_reduce_in_fp32 else 4.0


def fp8_gemm_input_bytes(precision: str) -> float | None:
    """Bytes per saved GEMM input under Transformer Engine's fp8 / fp4 recipes: 1 (TE casts the
    input of every fp8 GEMM once and saves that cast for the weight-gradient GEMM:
    ``LayerNormLinear`` its fp8 ``ln_out``, ``Linear`` its fp8 ``inputmat``, ``LayerNormMLP``
    the fp8 activation output); None (the activation dtype) otherwise.

    References
    ----------
    Transformer Engine ``pytorch/module/{linear,layernorm_linear,layernorm_mlp}.py``
    (``ctx.save_for_backward`` of the fp8 casts); Micikevicius et al. 2022 (fp8 formats).
    """
    return 1.0 if precision in ("fp8", "fp4") else None


def fp8_weight_cache_bytes(
    precision: str, layers, gemm_params_per_layer, zero_stage, shard, fp8_params: bool = False
):
    """Transformer Engine's cached low-precision weights on one GPU [bytes]: fp8 keeps an fp8 copy
    of every GEMM weight and its transpose across the micro-batches of a step (2 bytes per GEMM
    parameter; ``is_first_microbatch`` caching; Hopper's fp8 GEMM needs both layouts), fp4 one
    byte. With fp8 model parameters (``fp8_params``) the weight itself is the fp8 copy and only
    the transpose is cached (1 byte). Under ZeRO-3 only the gathered layers
    (:data:`ZERO3_LIVE_LAYERS`) have such copies.

    References
    ----------
    Transformer Engine ``pytorch/module/base.py`` (``get_weight_workspace``, fp8 workspaces);
    Megatron-LM ``TELinear`` (``is_first_microbatch``).
    """
    if precision not in ("fp8", "fp4"):
        return 0.0
    per = 2.0 if precision == "fp8" else 1.0  # low-precision copy + its transpose
    if fp8_params:
        per = per - 1.0
    z = np.asarray(zero_stage)
    live = np.where((z >= 3) & (np.asarray(shard) > 1),
                    np.minimum(ZERO3_LIVE_LAYERS, layers), layers)
    return per * live * gemm_params_per_layer


def _fp8_expert_bytes(precision, n_stage_experts, n_layer_experts, zero_stage, expert_dp,
                      fp8_params):
    """Transformer Engine's low-precision copies of a rank's routed experts
    (:func:`fp8_weight_cache_bytes` with the rank's MoE layers, sharded over expert-dp under
    ZeRO-3)."""
    per = np.where(n_layer_experts > 0, n_layer_experts, 1.0)
    return fp8_weight_cache_bytes(precision, n_stage_experts / per, n_layer_experts, zero_stage,
                                  expert_dp, fp8_params)


def stage_expert_params(model: ModelSpec, batch: ConfigBatch, layers, dense_layers=0.0
                        ) -> np.ndarray:
    """Routed-expert parameters one GPU holds on a pipeline rank of ``layers`` transformer
    layers, ``dense_layers`` of them dense [count]: the rank's MoE layers (its other layers in
    the model's MoE proportion, ``num_moe_layers / (L - moe_dense_layers)``) times
    ``E * expert / (ep * etp)``.

    Megatron-Core builds each rank's own layers (``TransformerBlock`` with
    ``get_transformer_layer_offset``; ``moe_layer_freq`` / ``first_k_dense_replace`` pick which
    are MoE), so a rank's expert weights, gradients and optimizer shards follow its MoE layers,
    not the model's average: DeepSeek-V3's three dense layers lighten rank 0 only, and the ranks
    with more layers in an uneven split hold more experts. With ``pp = 1`` this is the whole
    model's routed experts over ``ep * etp`` (:func:`perfmodel.moe.experts.expert_params_per_gpu`).

    References
    ----------
    Megatron-Core ``transformer/transformer_block.py`` (``get_num_layers_to_build``),
    ``models/gpt/moe_module_specs.py`` / ``gpt_layer_specs.py`` (``moe_layer_pattern``),
    ``transformer/moe/experts.py`` (``num_local_experts = E / ep``).
    """
    if not model.is_moe:
        return np.zeros(len(batch))
    other = model.num_layers - model.moe_dense_layers
    moe_share = model.num_moe_layers / other if other > 0 else 0.0
    moe_layers = np.maximum(np.asarray(layers, dtype=np.float64) - dense_layers, 0.0) * moe_share
    per_layer = model.num_experts * model.expert_params()
    return moe_layers * per_layer / (batch.ep * batch.etp).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Parameters per GPU on the first and last pipeline stage
# ---------------------------------------------------------------------------------------------
def stage_params(
    model: ModelSpec, tp, pp, layers_first=None, layers_last=None, layers_middle=None
) -> dict[str, np.ndarray]:
    """Parameters one GPU holds on the first and the last pipeline stage [count].

    Transformer layers are split evenly over ``pp`` stages (or as ``layers_first`` /
    ``layers_last`` / ``layers_middle`` say: Megatron-LM's uneven layouts,
    :func:`perfmodel.parallel.layers.stage_layer_counts`); their GEMM weights are split by
    ``tp`` (Megatron column/row parallel), the norms replicated. The word embedding is
    vocabulary-parallel (``V h / t``) on the first stage, a learned position table replicated on
    it; the final norm and the output layer (``V h / t``) on the last stage. With tied embeddings
    and ``pp > 1`` the last stage holds its own copy of the word embedding for the output layer
    (Megatron-LM), with ``pp = 1`` the one table serves both.

    Returns a dict of arrays: ``first``, ``last``, ``middle`` (stage totals; ``middle`` a rank
    between the two), ``layer`` (one layer), ``gemm_layer`` (GEMM weights + biases of one layer),
    ``embedding``, ``output`` (output layer including a tied copy), ``layers_per_stage`` (the even
    share), ``layers_first``, ``layers_last``, ``layers_middle``.

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 2-3; Megatron-LM ``theoretical_memory_usage.py``
    (embedding on the first stage, output layer on the last).
    """
    t = np.asarray(tp, dtype=np.float64)
    p = np.asarray(pp, dtype=np.float64)
    h, v = model.hidden_size, model.vocab_size
    norms = model.norms_per_layer * model.norm_params()
    # routed MoE experts are split by ep*etp, not tp: see perfmodel.moe.experts.expert_params_per_gpu
    gemm = model.layer_params() - norms - model.routed_expert_params_per_layer()
    layer = gemm / t + norms  # GEMM weights split by t, norms replicated
    pos = model.embedding_params() - v * h  # learned position table (0 for RoPE)
    embedding = v * h / t + pos
    untied = model.output_params() > 0
    output = np.where(untied | (p > 1), v * h / t, 0.0)  # own table on the last stage
    n_layers = model.num_layers / p
    l1 = n_layers if layers_first is None else np.asarray(layers_first, dtype=np.float64)
    l2 = n_layers if layers_last is None else np.asarray(layers_last, dtype=np.float64)
    lm = n_layers if layers_middle is None else np.asarray(layers_middle, dtype=np.float64)
    first = l1 * layer + embedding
    last = l2 * layer + model.norm_params() + output
    single = model.num_layers * layer + embedding + model.norm_params() + output
    return {
        "first": np.where(p > 1, first, single),
        "last": np.where(p > 1, last, single),
        "middle": np.where(p > 1, lm * layer, single),
        "layers_first": np.where(p > 1, l1, model.num_layers) + 0.0 * t,
        "layers_last": np.where(p > 1, l2, model.num_layers) + 0.0 * t,
        "layers_middle": np.where(p > 1, lm, model.num_layers) + 0.0 * t,
        "layer": layer + 0.0 * p,
        "gemm_layer": gemm / t + 0.0 * p,
        "embedding": embedding + 0.0 * p,
        "output": output + 0.0 * t,
        "layers_per_stage": n_layers + 0.0 * t,
    }


def is_gpu(gpu: GPUSpec) -> bool:
    """Whether the part is a GPU with a CUDA-style runtime (vendor other than ``"cpu"``).

    The GPU-only allowances (:data:`LIBRARY_WORKSPACE_BYTES`, :data:`ALLOCATOR_ALLOWANCE_FRACTION`,
    :data:`NON_ALLOCATOR_RESERVE_BYTES`) do not exist for CPU processes (the harness's ``local``
    cluster, vendor ``"cpu"``): no cuBLAS workspaces, no caching allocator, no driver reserve."""
    return gpu.vendor.lower() != "cpu"


DEFAULT_MEMORY_HEADROOM = 0.0
"""Fraction of HBM the fit check keeps free by default in :func:`memory_breakdown` (none: the
model's peak already carries the allocator allowance). The search (``search.plan``, ``plan``)
keeps :data:`SEARCH_MEMORY_HEADROOM` free unless told otherwise."""

SEARCH_MEMORY_HEADROOM = 0.0
"""Default ``memory_headroom`` of the search (``plan --memory-headroom``)."""


def torch_zb_retained_microbatches(p, m) -> np.ndarray:
    """Micro-batches whose whole backward graph a stage of torch's
    ``ScheduleInterleavedZeroBubble`` holds at its peak: ``min(p, m)`` on every stage.

    torch's input-gradient pass (``stage_backward_input``) runs autograd with
    ``retain_graph=True`` and the weight pass (``stage_backward_weight``) frees the graph, so a
    micro-batch holds its activations from F to W, not to B. In torch's order
    (``_get_1f1b_rank_ops`` with ``enable_zero_bubble``: ``p - 1 - s`` warm-up forwards, then
    F, B and, from the ``s``-th steady step on, W of the micro-batch ``s`` behind) stage ``s``
    has ``p - s + j - max(0, j - s)`` graphs after the forward of steady step ``j``: ``p`` once
    ``j >= s``. The last stage holds ``p`` (1F1B: 1), and as many micro-batches' output
    gradients (B done, W not).

    Example: p = 2, m = 4: 2; p = 4, m = 2: 2.
    """
    return np.minimum(np.asarray(p, dtype=np.float64), np.asarray(m, dtype=np.float64))


def loss_logit_bytes(cross_entropy: str) -> tuple[float, float]:
    """Bytes per logit (per vocabulary entry of a token on this GPU) the fused-kernel loss holds:
    ``(kept for the backward, transient)``.

    * ``"fp32"``: Megatron-Core's vocab-parallel cross-entropy (``cross_entropy_fusion_impl=
      'native'`` or unfused) casts the 16-bit logits to fp32 and saves the fp32 softmax
      (``exp_logits``) for the backward: 4 kept, plus the 16-bit logits of the micro-batch being
      computed, 2 transient (Megatron-LM ``theoretical_memory_usage.py`` counts the same).
    * ``"fused"``: Transformer Engine's ``parallel_cross_entropy`` (Megatron-Core
      ``cross_entropy_fusion_impl='te'``, set by Megatron-Bridge's performance recipes,
      ``_benchmark_common``) computes the loss in one kernel and writes the gradient into the
      16-bit logits in place: those 2 bytes are all it keeps, nothing transient.

    Example: ``"fp32"`` -> (4, 2); ``"fused"`` -> (2, 0).
    """
    if cross_entropy == "fused":
        return 2.0, 0.0
    return 4.0, 2.0


def loss_inflight_microbatches(schedule, m, inflight_last) -> np.ndarray:
    """Micro-batches whose final-norm input, output-layer input and fp32 logits the last stage
    holds at its peak (vectorised).

    Only the last *virtual* stage (model chunk ``v - 1`` of the last rank) computes the loss, and
    it holds those tensors from its forward to its backward. 1F1B, ZB-H1 and interleaved 1F1B run
    the last chunk's backward right after its forward (Megatron-LM ``schedules.py``: the last
    rank's warm-up, ``(v - 1) p`` forwards, covers chunks ``0 .. v-2``; each steady-state
    iteration then runs forward ``k`` and backward ``k - warmup``, the same micro-batch of chunk
    ``v - 1``), so one micro-batch; GPipe holds all of its in-flight ones. The interleaved
    in-flight count of the rank (``(v - 1) p + 1`` chunks, mostly earlier chunks) does not hold
    logits.

    Example: interleaved, p = 8, v = 12: 1 (not ``ceil(89 / 12) = 8``); GPipe m = 16: 16.
    """
    code = schedule_code(schedule)
    infl = np.ceil(np.asarray(inflight_last, dtype=np.float64))
    return np.where(code == Schedule.GPIPE, infl, np.minimum(infl, 1.0) + 0.0 * np.asarray(m))


def usable_hbm_bytes(gpu: GPUSpec, headroom: float = 0.0) -> float:
    """HBM a configuration may fill: the spec's capacity less
    :data:`NON_ALLOCATOR_RESERVE_BYTES` (H200: 141 -> 139.8 GiB; all of it for a CPU process),
    less ``headroom`` (a fraction of the capacity kept free)."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom = {headroom!r}: expected a fraction in [0, 1)")
    return gpu.hbm_bytes * (1.0 - headroom) - (NON_ALLOCATOR_RESERVE_BYTES if is_gpu(gpu) else 0.0)


# ---------------------------------------------------------------------------------------------
# Terms of memory_breakdown: model states
# ---------------------------------------------------------------------------------------------
def kernel_state_bytes_per_param(training: TrainingSpec, eager: bool
                                 ) -> tuple[float, float, float, float, bool]:
    """Bytes per parameter of (weights, gradients, optimizer states, the optimizer step's fp32
    gradient copy) as the kernel family keeps them, and whether the weights are fp8.

    * eager PyTorch: fp32 weights (autocast casts them per use) and fp32 gradients,
      :func:`state_bytes_per_param` of ``fp32``; no gradient copy.
    * fused (Megatron-LM): 16-bit weights, main gradients in fp32 unless reduced in bf16
      (``grad_reduce_in_fp32``), fp32 master weights and moments; fp8 model parameters
      (``fp8_params`` with fp8 / fp4) replace the bf16 weights by 1-byte ones; the fp32 copy of
      a 16-bit gradient buffer is :func:`optimizer_grad_copy_bytes`.

    Example: bf16 Adam, fp32 grad reduce: fused (2, 4, 12, 0, False), eager (4, 4, 8, 0, False).

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 3.1; Megatron-LM ``theoretical_memory_usage.py``
    (18 bytes per parameter with fp32 main grads), ``--fp8-param-gather``.
    """
    if eager:
        w, g, o = state_bytes_per_param("fp32", training.optimizer)
        return w, g, o, 0.0, False
    precision = training.precision
    w, g, o = state_bytes_per_param(
        precision, training.optimizer, fp32_main_grads=training.grad_reduce_in_fp32
    )
    copy_b = optimizer_grad_copy_bytes(precision, training.grad_reduce_in_fp32)
    fp8_params = training.fp8_params and precision in ("fp8", "fp4")
    if fp8_params:
        w = 1.0
    return w, g, o, copy_b, fp8_params


def stage_dense_layers(model: ModelSpec, pp, first_chunk0_layers) -> tuple[np.ndarray, np.ndarray]:
    """Dense (non-MoE) leading layers on the first and the last pipeline rank [layers].

    Megatron-Core's ``first_k_dense_replace`` / ``moe_layer_freq`` make the model's first
    ``moe_dense_layers`` layers dense; with ``pp > 1`` they sit on rank 0, in its first model
    chunk (``first_chunk0_layers`` layers, :meth:`ConfigBatch.layer_counts`), the last rank has
    none; with ``pp = 1`` the one rank holds all of them.

    Example: DeepSeek-V3 (3 dense layers), pp = 8 with 8 layers on chunk 0: (3, 0); pp = 1: (3, 3).

    References
    ----------
    Megatron-Core ``transformer/transformer_block.py`` (``get_transformer_layer_offset``),
    ``models/gpt/gpt_layer_specs.py`` (``moe_layer_pattern``).
    """
    n_dense = float(model.moe_dense_layers)
    first = np.where(pp > 1, np.minimum(n_dense, first_chunk0_layers), n_dense)
    last = np.where(pp > 1, 0.0, n_dense)
    return first, last


def expert_state_bytes(expert_params, expert_dp, zero_stage, weight_bytes_per_param,
                       grad_bytes_per_param, optimizer_bytes_per_param):
    """Per-GPU (weights, gradients, optimizer) bytes of a rank's routed experts: ZeRO sharding
    (:func:`zero_state_bytes`) over the expert-data-parallel group, not ``dp * cp`` (Megatron-Core
    builds a distributed optimizer per expert-data-parallel group).

    References
    ----------
    Megatron-Core ``distributed/distributed_data_parallel.py`` (``expert_data_parallel_group``),
    ``optimizer/__init__.py`` (separate optimizer for expert parameters).
    """
    return zero_state_bytes(expert_params, expert_dp, zero_stage, weight_bytes_per_param,
                            grad_bytes_per_param, optimizer_bytes_per_param)


def fsdp2_zero2_sharded_weight_bytes(params, dp, cp, zero_stage, weight_bytes_per_param):
    """Eager ZeRO-2 as FSDP2 runs it (``reshard_after_forward=False``): the sharded parameters
    (the optimizer's) stay next to the unsharded ones the GPU computes with [bytes]:
    ``params * weight_bytes / (dp cp)`` when ``zero_stage == 2`` and ``dp cp > 1``, else 0.

    Example: 1e9 parameters, fp32, dp = 8, cp = 1: 0.5e9 bytes.

    References
    ----------
    PyTorch ``torch/distributed/fsdp/_fully_shard`` (``reshard_after_forward``).
    """
    z2 = (np.asarray(zero_stage) == 2) & (dp * cp > 1)
    return np.where(z2, params * weight_bytes_per_param / (dp * cp), 0.0)


def rank_state_bytes(params, expert_params, shard, expert_dp, zero_stage,
                     weight_bytes_per_param, grad_bytes_per_param, optimizer_bytes_per_param):
    """(weights, gradients, optimizer) bytes of one pipeline rank on one GPU: its dense
    parameters sharded over the ``shard = dp * cp`` ranks that hold the same ones
    (:func:`zero_state_bytes`; Megatron-LM shards the distributed optimizer over the
    data-parallel group including context parallelism) plus its routed experts over expert-dp
    (:func:`expert_state_bytes`).

    Example: 1e9 + 0 parameters, bf16 Adam (2, 2, 12), ZeRO-1 over 8: (2e9, 2e9, 1.5e9).
    """
    dense = zero_state_bytes(params, shard, zero_stage, weight_bytes_per_param,
                             grad_bytes_per_param, optimizer_bytes_per_param)
    experts = expert_state_bytes(expert_params, expert_dp, zero_stage, weight_bytes_per_param,
                                 grad_bytes_per_param, optimizer_bytes_per_param)
    return dense[0] + experts[0], dense[1] + experts[1], dense[2] + experts[2]


# ---------------------------------------------------------------------------------------------
# Terms of memory_breakdown: activations
# ---------------------------------------------------------------------------------------------
def stage_layer_activation_bytes(model: ModelSpec, training: TrainingSpec, seq_len,
                                 micro_batch_size, tp, sequence_parallel, recompute, *,
                                 eager: bool, flash_attention: bool, dropout: bool):
    """Activation bytes of one (average) transformer layer per micro-batch and GPU, as the
    kernel family saves them: ``(kept, full, bytes_per_value, gemm_input_bytes)``.

    ``kept`` under the configuration's recompute mode, ``full`` without recompute (what the layer
    being recomputed holds). Fused: Korthikanti et al.'s terms (:func:`layer_activation_bytes`,
    fp8 GEMM inputs :func:`fp8_gemm_input_bytes`), less what selective recomputation of
    ``training.recompute_modules`` frees (:func:`selective_recompute_freed_bytes`). Eager: the
    tensors autograd saves (:func:`eager_layer_activation_bytes`). The FFN is the MoE layers'
    effective one (:func:`perfmodel.moe.experts.effective_ffn_size`; ``ffn_hidden_size`` when dense).
    ``bytes_per_value``: 4 for fp32 training, else 2; ``gemm_input_bytes`` None for eager.

    References
    ----------
    Korthikanti et al. 2022, Sec. 4 and Table 2; Megatron-Core ``recompute_modules``;
    PyTorch autocast op lists and derivatives.yaml (eager).
    """
    precision = training.precision
    h, a = float(model.hidden_size), model.num_attention_heads
    kw = {
        "tp": tp,
        "sequence_parallel": sequence_parallel,
        "ffn_hidden_size": moe.effective_ffn_size(model),  # ffn_hidden_size when dense
        "num_kv_heads": model.kv_heads,
        "head_dim": model.head_size,
        "gated_mlp": model.gated_mlp,
    }
    s, b, rc = seq_len, micro_batch_size, recompute
    if eager:
        autocast = precision != "fp32"
        rope = model.position_embedding == "rope"
        kept, full = (eager_layer_activation_bytes(
            s, b, h, a, recompute=mode, norm=model.norm, autocast=autocast, dropout=dropout,
            rope=rope, **kw
        ) for mode in (rc, 0))
        return kept, full, (2.0 if autocast else 4.0), None
    e = 4.0 if precision == "fp32" else 2.0
    gi = fp8_gemm_input_bytes(precision)
    kept, full = (layer_activation_bytes(
        s, b, h, a, recompute=mode, flash=flash_attention, dropout=dropout,
        bytes_per_value=e, gemm_input_bytes=gi, **kw
    ) for mode in (rc, 0))
    if model.is_hybrid:  # attention / MLP / Mamba2 shares of the layers (perfmodel.compute.mamba)

        def _hybrid(mode):
            def x(f):
                return layer_activation_bytes(
                    s, b, h, a, recompute=np.where(np.asarray(mode) == Recompute.FULL, 0, mode),
                    flash=flash_attention, dropout=dropout, bytes_per_value=e,
                    gemm_input_bytes=gi, **{**kw, "ffn_hidden_size": f})
            return hybrid_layer_activation_bytes(
                model, x, s, b, tp=tp, sequence_parallel=sequence_parallel, recompute=mode,
                bytes_per_value=e, gemm_input_bytes=gi, dropout=dropout,
                ffn_hidden_size=kw["ffn_hidden_size"])
        kept, full = _hybrid(rc), _hybrid(0)
    freed = selective_recompute_freed_bytes(
        model, training.recompute_modules, s, b, tp=tp, sequence_parallel=sequence_parallel,
        bytes_per_value=e, gemm_input_bytes=gi)
    kept = kept - np.where(rc == Recompute.SELECTIVE, freed, 0.0)
    return kept, full, e, gi


def moe_layer_activation_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                               recompute, bytes_per_value, gemm_input_bytes):
    """What a MoE layer adds to one (average) layer's activations per micro-batch [bytes]:
    ``(kept, full)``. The dispatched tokens, the expert outputs before the combine and the
    router scores (:func:`perfmodel.moe.experts.moe_activation_extra_bytes`), kept unless the layer is
    fully recomputed; 0 for a dense model.

    References
    ----------
    Megatron-Core ``transformer/moe/token_dispatcher.py``, ``moe_layer.py``.
    """
    extra = moe.moe_activation_extra_bytes(model, training, batch, bytes_per_value,
                                           gemm_input_bytes)
    return np.where(np.asarray(recompute) == Recompute.FULL, 0.0, extra), extra


def stage_inflight_microbatches(training: TrainingSpec, batch: ConfigBatch, pp, m, schedule, vp,
                                *, eager: bool) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batches whose activations the first and the last pipeline rank hold at their peak
    [micro-batches]: :func:`perfmodel.pipeline.schedules.inflight_microbatches` (GPipe ``m``, 1F1B and
    ZB-H1 ``min(p - i, m)``, interleaved Megatron's warm-up count), plus the extra micro-batch
    (pp = 1) or chunk of the MoE all-to-all overlap's combined 1F1B
    (:func:`perfmodel.moe.experts.a2a_overlap_extra_inflight`, fused only; at most ``m``); eager torch
    zero bubble: the last rank retains :func:`torch_zb_retained_microbatches` whole graphs.

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 2.2; Megatron-LM ``schedules.py``
    (``combined_1f1b``); torch ``ScheduleInterleavedZeroBubble``.
    """
    infl_first = inflight_microbatches(pp, m, schedule, vp, stage=0)
    infl_last = inflight_microbatches(pp, m, schedule, vp, stage=pp - 1)
    a2a_extra = 0.0 if eager else moe.a2a_overlap_extra_inflight(training, batch)
    infl_first = np.minimum(infl_first + a2a_extra, np.maximum(m, infl_first))
    infl_last = np.minimum(infl_last + a2a_extra, np.maximum(m, infl_last))
    if eager:
        infl_last = np.where(schedule_code(schedule) == Schedule.ZB,
                             torch_zb_retained_microbatches(pp, m), infl_last)
    return infl_first, infl_last


def embedding_activation_bytes(tokens, hidden_size, sp_divisor, dropout: bool, *, eager: bool):
    """Activations the embedding keeps per micro-batch on the first rank [bytes], ``tokens`` =
    ``s b`` on this GPU. Fused: int64 token ids (8 bytes per token) and the embedding dropout's
    1-byte mask (``s b h / r``, sequence-sharded with sp). Eager: int64 token and position
    indices (16 bytes per token).

    Example: s b = 4096, h = 4096, r = 1, dropout: 8 * 4096 + 4096 * 4096 = 16,809,984.

    References
    ----------
    Megatron-LM ``theoretical_memory_usage.py`` (embedding dropout mask); PyTorch ``embedding``
    (saves the indices).
    """
    if eager:
        return 8.0 * tokens * 2
    drop = 1.0 if dropout else 0.0
    return 8.0 * tokens + drop * tokens * hidden_size / sp_divisor


def final_layer_activation_bytes(tokens, hidden_size, sp_divisor, bytes_per_value, *,
                                 eager: bool):
    """Activations of the final norm and the output layer's input per micro-batch on the last
    rank [bytes]. Fused: the final-norm input and the output-layer input, ``2 e s b h / r``
    (Korthikanti et al.'s ``4 s b h``). Eager: the final LayerNorm's fp32 input and stats
    (``(4 s b h + 8 s b) / r``) and the 16-bit cast of its output, gathered over the sequence
    with sp (``e s b h``).

    Example: fused, s b = 1, h = 1, e = 2, r = 1: 4.

    References
    ----------
    Korthikanti et al. 2022, Sec. 4.3 (output layer); Megatron-LM ``theoretical_memory_usage.py``.
    """
    if eager:
        return (4.0 * tokens * hidden_size + 8.0 * tokens) / sp_divisor + (
            bytes_per_value * tokens * hidden_size)
    return 2 * bytes_per_value * tokens * hidden_size / sp_divisor


def loss_buffer_bytes(training: TrainingSpec, logits, *, eager: bool):
    """Logit buffers of the loss per micro-batch on the last rank [bytes]:
    ``(held for the backward, transient)``, ``logits`` = ``s b V / t`` values on this GPU.
    Fused: :func:`loss_logit_bytes` of ``training.cross_entropy``. Eager: nothing held here (the
    loss's saved tensors are in :func:`_eager_moments`), 2 bytes per logit transient (the
    16-bit logits being computed).

    Example: fused, fp32 cross-entropy, 1e6 logits: (4e6, 2e6).
    """
    if eager:
        return 0.0 * logits, 2.0 * logits
    held_b, transient_b = loss_logit_bytes(training.cross_entropy)
    return held_b * logits, transient_b * logits


def stage_activation_bytes(inflight, layers, offload_layers, layer_bytes, recompute_bytes,
                           end_bytes):
    """Activations of one pipeline rank [bytes]: ``inflight`` micro-batches times the layers
    kept on the GPU (:func:`perfmodel.memory.offload.resident_activation_layers`, ``L - N + 1`` with
    ``N`` layers offloaded to the CPU) times one layer's ``layer_bytes``, plus the layer being
    recomputed (``recompute_bytes``), plus the embedding / loss tensors (``end_bytes``).

    Example: 2 in flight, 4 layers, no offload, 10 bytes a layer, 0, 3: 83.
    """
    return inflight * resident_activation_layers(layers, offload_layers) * layer_bytes + (
        recompute_bytes) + end_bytes


def single_stage_activation_bytes(first_bytes, last_bytes, loss_bytes, pp):
    """Activations of the first and the last rank with the loss's on the first rank when it is
    the only one (``pp = 1``: one rank holds the embedding, every layer and the loss) [bytes].

    Example: first 10, last 20, loss 3, pp = 1: (13, 13); pp = 2: (10, 20).
    """
    single = np.asarray(pp) == 1
    first = np.where(single, first_bytes + loss_bytes, first_bytes)
    return first, np.where(single, first, last_bytes)


# ---------------------------------------------------------------------------------------------
# Terms of memory_breakdown: other buffers
# ---------------------------------------------------------------------------------------------
def library_workspace_bytes(gpu: GPUSpec, like) -> np.ndarray:
    """cuBLAS workspaces from the caching allocator [bytes]: :data:`LIBRARY_WORKSPACE_BYTES` on a
    GPU, 0 for a CPU process (:func:`is_gpu`), shaped like ``like``.

    References
    ----------
    PyTorch ``aten/src/ATen/cuda/CublasHandlePool.cpp`` (32 MiB per handle and stream on sm90).
    """
    return (LIBRARY_WORKSPACE_BYTES if is_gpu(gpu) else 0.0) + 0.0 * like


def gradient_bucket_bytes(params, zero_stage, shard, grad_bytes_per_param, *, eager: bool
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Gradient buffers outside the gradients themselves [bytes], and where a persistent
    gradient buffer replaces the gradients (bool mask).

    * Fused (Megatron-LM): ZeRO-2/3 reduce-scatter two buckets of :data:`BUCKET_PARAMS`
      (``--ddp-bucket-size``; at most the stage's ``params``); ZeRO-0/1 reduce in the contiguous
      main-grad buffer itself, counted as the gradients: 0; so does a ``shard`` of 1 (nothing to
      reduce-scatter: ZeRO-2 on one rank is ZeRO-1). Mask: none.
    * Eager: torch DDP copies every gradient into its buckets (``gradient_as_bucket_view=False``):
      ``params`` gradients; FSDP2 ZeRO-2 with units of :data:`BUCKET_PARAMS` reduce-scatters one
      unit's unsharded gradients while the next's are produced (two units, at most the stage);
      ZeRO-3's unsharded gradients are in the live units (:func:`zero3_gathered_bytes`): 0;
      ZeRO-1 (Megatron's distributed optimizer) accumulates into one persistent contiguous
      ``main_grad`` buffer, live the whole step, which replaces the gradients (mask).

    Example: fused, ZeRO-2, 1e9 parameters, 4-byte gradients: 2 * 40e6 * 4 = 3.2e8.

    References
    ----------
    Megatron-LM ``distributed/param_and_grad_buffer.py`` (buckets), ``--ddp-bucket-size``;
    PyTorch ``DistributedDataParallel`` (``bucket_cap_mb``, ``gradient_as_bucket_view``), FSDP2.
    """
    z = np.asarray(zero_stage)
    bucket = np.where((z >= 2) & (shard > 1),
                      2.0 * np.minimum(BUCKET_PARAMS, params) * grad_bytes_per_param, 0.0)
    replaces = np.zeros(np.shape(bucket), dtype=bool)
    if eager:
        bucket = np.where((z == 0) & (shard > 1), params * grad_bytes_per_param, bucket)
        bucket = np.where(
            (z == 2) & (shard > 1), np.minimum(2.0 * BUCKET_PARAMS, params) * grad_bytes_per_param,
            bucket
        )
        bucket = np.where((z >= 3) & (shard > 1), 0.0, bucket)
        replaces = (z == 1) & (shard > 1)
        bucket = np.where(replaces, params * grad_bytes_per_param, bucket)
    return bucket, replaces


def zero3_gathered_bytes(stage: dict, expert_params_per_layer, vp, zero_stage, shard,
                         state_bytes_per_param, *, eager: bool) -> tuple[np.ndarray, np.ndarray]:
    """ZeRO-3's all-gathered weights and their unsharded gradients on the first and the last
    rank [bytes]; ``state_bytes_per_param`` = weight + gradient bytes per parameter, ``stage``
    :func:`stage_params`' dict. 0 unless ZeRO-3 with ``shard > 1``.

    * Fused (DeepSpeed / FSDP prefetch one module ahead): :data:`ZERO3_LIVE_LAYERS` layers
      (dense part and one MoE layer's experts), the same on both ranks.
    * Eager: FSDP units of :data:`BUCKET_PARAMS`, two live, at most the model chunk (each
      interleaved chunk is a module of its own; the first chunk holds the embedding, the last
      the output layer).

    Example: fused, 1e8 parameters a layer, no experts, 2 + 4 bytes: 2 * 1e8 * 6 = 1.2e9.

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 5.3; DeepSpeed ``stage3_prefetch_bucket_size``;
    PyTorch FSDP2 ``fully_shard`` (one unit prefetched).
    """
    on = (np.asarray(zero_stage) >= 3) & (shard > 1)
    if not eager:
        z3 = np.where(on, (stage["layer"] + expert_params_per_layer) * state_bytes_per_param
                      * ZERO3_LIVE_LAYERS, 0.0)
        return z3, z3
    out = []
    for params, layers in ((stage["first"], stage["layers_first"]),
                           (stage["last"], stage["layers_last"])):
        other_chunks = (vp - 1) / vp * layers * stage["layer"]
        out.append(np.where(on, np.minimum(2.0 * BUCKET_PARAMS, params - other_chunks)
                            * state_bytes_per_param, 0.0))
    return out[0], out[1]


def stage_fp8_weight_cache_bytes(precision: str, layers, expert_params, gemm_params_per_layer,
                                 expert_params_per_layer, zero_stage, shard, expert_dp,
                                 fp8_params: bool):
    """Transformer Engine's cached low-precision weights of one rank [bytes]: the dense GEMMs'
    (:func:`fp8_weight_cache_bytes`) and the routed experts' (sharded over expert-dp under
    ZeRO-3). Fused kernels only.

    References
    ----------
    Transformer Engine ``pytorch/module/base.py`` (fp8 weight workspaces); Megatron-LM
    ``TELinear`` / ``TEGroupedLinear`` (``is_first_microbatch``).
    """
    return fp8_weight_cache_bytes(precision, layers, gemm_params_per_layer, zero_stage, shard,
                                  fp8_params) + _fp8_expert_bytes(
        precision, expert_params, expert_params_per_layer, zero_stage, expert_dp, fp8_params)


def eager_pipeline_receive_bytes(tokens, hidden_size, sp_divisor, pp, m, vp, inflight_first,
                                 inflight_last) -> tuple[np.ndarray, np.ndarray]:
    """torch.distributed.pipelining's preallocated receive buffers on the first and the last
    rank [bytes]: one per micro-batch and local stage for the step (activations forward, their
    gradients backward; the fp32 residual stream, ``4 s b h / r``), less the in-flight ones,
    which are the stage inputs counted in the activations. 0 with ``pp = 1``. Megatron-LM
    allocates them per transfer instead (fused: none).

    Example: pp = 2, vp = 1, m = 4, 1 in flight on the first rank: (4 + 0) * 4 s b h.

    References
    ----------
    PyTorch ``torch/distributed/pipelining/stage.py`` (``_prepare_forward_infra``,
    ``_prepare_backward_infra``: one buffer per chunk).
    """
    p2p = 4.0 * tokens * hidden_size / sp_divisor
    grad_first, fwd_first = m * vp, np.maximum(m - inflight_first / vp, 0.0) * (vp - 1)
    grad_last, fwd_last = m * (vp - 1), np.maximum(m * vp - inflight_last, 0.0)
    return (np.where(pp > 1, (grad_first + fwd_first) * p2p, 0.0),
            np.where(pp > 1, (grad_last + fwd_last) * p2p, 0.0))


def eager_pipeline_held_output_bytes(precision: str, pp, m, logits):
    """The earlier micro-batches' outputs (the logits) torch's pipeline schedule keeps on the
    last rank until the step ends [bytes]: ``(m - 1)`` times 2 bytes per logit (4 in fp32);
    0 with ``pp = 1``.

    Example: m = 4, bf16, 1e6 logits: 6e6.

    References
    ----------
    PyTorch ``torch/distributed/pipelining`` (``PipelineStage.output_chunks``, merged and
    returned by ``step``).
    """
    held_logit = 2.0 if precision != "fp32" else 4.0
    return np.where(pp > 1, (m - 1.0) * held_logit * logits, 0.0)


# ---------------------------------------------------------------------------------------------
# Terms of memory_breakdown: the peak
# ---------------------------------------------------------------------------------------------
def fused_peak_stage(first, last, middle, pp, last_transient_bytes):
    """Fused kernels hold every term for the whole step, so a GPU's peak is the plain sum on the
    rank that needs most: ``first``, ``last``, ``middle`` are that rank's (weights, gradients,
    optimizer, activations, other) [bytes] for rank 0, the last rank and a middle rank (rank 1,
    which in an uneven layout with lighter end stages holds more layers; it counts with
    ``pp > 2``); ``last_transient_bytes`` (one micro-batch's 16-bit logits being computed,
    :func:`loss_buffer_bytes`) are the last rank's activations too.

    Returns the peak rank's five terms and ``peak_stage`` (0 first, 1 last, 2 middle; ties go to
    the first, then the last rank).

    Example: totals 10 (first), 12 (last), 11 (middle), pp = 4: the last rank, stage 1.
    """
    w2, g2, o2, act_last, other_last = last
    total_first = sum(first)
    total_last = w2 + g2 + o2 + act_last + other_last + last_transient_bytes
    last = (w2, g2, o2, act_last + last_transient_bytes, other_last)
    total_mid = np.where(pp > 2, sum(middle), 0.0)
    first_peak = total_first >= total_last
    terms = [np.where(first_peak, x1, x2) for x1, x2 in zip(first, last)]
    mid_peak = total_mid > np.maximum(total_first, total_last)
    terms = [np.where(mid_peak, xm, x) for xm, x in zip(middle, terms)]
    return (*terms, np.where(mid_peak, 2, np.where(first_peak, 0, 1)))


def eager_zero_bubble_gradient_bytes(model: ModelSpec, precision: str, tokens, tp, sp_divisor, pp,
                                     m, schedule, layers_last, logits) -> np.ndarray:
    """Output gradients the last rank keeps under torch's zero bubble (ZB-H1) split backward
    [bytes], 0 for other schedules.

    The input-gradient pass (B) keeps, for the deferred weight-gradient pass (W), the output
    gradient dY of every GEMM of the stage next to its input X: QKV and fc1 column-parallel
    (sequence-gathered, split by t), the row-parallel o and fc2 outputs before their reduction
    (full h, partial sums); and the gradient at every node where a weight's path leaves the
    input's (``get_param_groups`` intermediates): the two norms (fp32 under autocast,
    sequence-sharded with sp) and, on the last stage, the final norm and the output layer (one
    value per logit). It keeps them for every micro-batch whose B ran and whose W has not
    (:func:`torch_zb_retained_microbatches`), each retained graph with the loss's saved fp32
    logits and log-softmax (8 bytes per logit; the one being computed is in the moments), plus
    the B pass's working set on the fused QKV gradient (two fused-size tensors live). torch runs
    stage 0's whole backward at its W step, so the first rank keeps none.

    References
    ----------
    Qi et al. 2024 (Zero Bubble Pipeline Parallelism), Sec. 2; torch
    ``torch/distributed/pipelining/_backward.py`` (``stage_backward_input``,
    ``get_param_groups``); Megatron-LM ``WeightGradStore``.
    """
    h = float(model.hidden_size)
    f_cols = float(model.ffn_hidden_size) * (2.0 if model.gated_mlp else 1.0)
    qkv_cols = (model.num_attention_heads + 2.0 * model.kv_heads) * model.head_size
    e_gemm = 2.0 if precision != "fp32" else 4.0
    dy_layer = e_gemm * tokens * ((qkv_cols + f_cols) / tp + 2.0 * h)
    dy_norm = 4.0 * tokens * h / sp_divisor
    dy_layer = dy_layer + 2.0 * dy_norm
    n_zb = torch_zb_retained_microbatches(pp, m)
    return np.where(
        schedule_code(schedule) == Schedule.ZB,
        n_zb * (layers_last * dy_layer + dy_norm + e_gemm * logits)
        + 2.0 * e_gemm * tokens * qkv_cols / tp + (n_zb - 1.0) * 8.0 * logits,
        0.0,
    )


def eager_accumulating_gradients(schedule, m, inflight_first, inflight_last):
    """Whether the first and the last rank hold earlier micro-batches' gradients next to later
    micro-batches' activations (bool masks): once a micro-batch's backward has run, its
    gradients (ZeRO-2/3: their reduce-scattered shards) stay, so with more micro-batches than in
    flight (at least one) on a schedule other than GPipe.

    Example: 1F1B, m = 8, 2 in flight: True; GPipe: False.
    """
    code = schedule_code(schedule)
    return ((code != 0) & (m > np.maximum(inflight_first, 1.0)),
            (code != 0) & (m > np.maximum(inflight_last, 1.0)))


def optimizer_grad_copy_excess_bytes(copy_bytes_per_param, zero_stage, shard, params,
                                     activation_bytes):
    """What the optimizer step's fp32 gradient copy (:func:`optimizer_grad_copy_bytes`; sharded
    over ``shard`` ranks under ZeRO >= 1) adds to the peak [bytes]: it lives when the
    activations are freed, so only its excess over them, ``max(copy - activations, 0)``.

    Example: 4 bytes, ZeRO-1, shard 8, 8e9 parameters, 1e9 activation bytes: 3e9.

    References
    ----------
    Megatron-LM ``optimizer/distrib_optimizer.py`` (``_copy_model_grads_to_main_grads``).
    """
    copy_opt = np.where(np.asarray(zero_stage) >= 1, copy_bytes_per_param / shard,
                        copy_bytes_per_param) * params
    return np.maximum(copy_opt - activation_bytes, 0.0)


def allocator_allowance_bytes(gpu: GPUSpec, churn_bytes):
    """Allocator fragmentation allowance [bytes]: :data:`ALLOCATOR_ALLOWANCE_FRACTION` of what is
    allocated and freed during the step (``churn_bytes``), 0 for a CPU process. Megatron-LM
    allocates weights, gradients and optimizer states once, in contiguous buffers
    (``_ParamAndGradBuffer``, the distributed optimizer's shards), so only activations and
    buffers churn; eager PyTorch allocates every tensor on its own (churn = all allocated).

    Example: H100, 10 GiB churn: 0.3 GiB.

    References
    ----------
    PyTorch ``c10/cuda/CUDACachingAllocator.cpp``; calibration/h200 e2e runs
    (``max_memory_reserved / max_memory_allocated`` 1.01-1.19).
    """
    return (ALLOCATOR_ALLOWANCE_FRACTION if is_gpu(gpu) else 0.0) * churn_bytes


# ---------------------------------------------------------------------------------------------
# The whole GPU
# ---------------------------------------------------------------------------------------------
def even_memory_breakdown(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    batch: ConfigBatch,
    *,
    kernels: Kernels = "fused",
    flash_attention: bool = True,
    dropout: bool | None = None,
    headroom: float = DEFAULT_MEMORY_HEADROOM,
) -> dict[str, np.ndarray]:
    """Peak memory per GPU, on the pipeline stage that needs most, and whether it fits.

    Terms, in this order, each a named function:

    1. Parameters per GPU on the first, last and a middle stage (:func:`stage_params`), and each
       rank's routed experts (:func:`stage_dense_layers`, :func:`stage_expert_params`).
    2. Model states by ZeRO stage (:func:`kernel_state_bytes_per_param`,
       :func:`rank_state_bytes`: :func:`zero_state_bytes` over the ``dp * cp`` ranks that hold
       the same parameters, as Megatron-LM shards the distributed optimizer over the
       data-parallel group including context parallelism; :func:`expert_state_bytes` over
       expert-dp; eager FSDP2 ZeRO-2 :func:`fsdp2_zero2_sharded_weight_bytes`).
    3. Activations: one layer (:func:`stage_layer_activation_bytes`: Korthikanti's
       :func:`layer_activation_bytes` less :func:`selective_recompute_freed_bytes` or, eager,
       :func:`eager_layer_activation_bytes`; MoE :func:`moe_layer_activation_bytes`) times the
       layers of a stage times the micro-batches in flight (:func:`stage_activation_bytes`,
       :func:`stage_inflight_microbatches`: GPipe ``m``, 1F1B and ZB-H1 ``min(p - i, m)``,
       interleaved Megatron's warm-up count, whose stage-0 value is ``p`` times
       ``1 + (p-1)/(p v)``). Full recompute adds one layer's whole activations (the layer being
       recomputed). Plus the embedding (:func:`embedding_activation_bytes`: token ids, dropout
       mask) per in-flight micro-batch on the first stage, and the final norm, output-layer
       input (:func:`final_layer_activation_bytes`) and the loss's logits
       (:func:`loss_buffer_bytes`, :func:`loss_inflight_microbatches`) on the last stage, with
       one micro-batch's 16-bit logits in flight (:func:`single_stage_activation_bytes` with
       ``pp = 1``).
    4. Other: cuBLAS workspaces (:func:`library_workspace_bytes`), gradient buckets
       (:func:`gradient_bucket_bytes`: ZeRO-2/3 two buckets of :data:`BUCKET_PARAMS`; eager DDP
       a bucket copy of every gradient), ZeRO-3 all-gathered weights and gradients of
       :data:`ZERO3_LIVE_LAYERS` layers (:func:`zero3_gathered_bytes`), Transformer Engine's
       cached fp8 weights and their transposes (:func:`stage_fp8_weight_cache_bytes`: fp8/fp4
       2 bytes per GEMM weight), MoE dispatch buffers
       (:func:`perfmodel.moe.experts.moe_dispatch_buffer_bytes`), eager torch pipelining's buffers
       (:func:`eager_pipeline_receive_bytes`, :func:`eager_pipeline_held_output_bytes`).
    5. The peak (:func:`fused_peak_stage`; eager :func:`_eager_moments` with
       :func:`eager_zero_bubble_gradient_bytes` and :func:`eager_accumulating_gradients`), the
       optimizer step's gradient copy (:func:`optimizer_grad_copy_excess_bytes`) and the
       allocator allowance (:func:`allocator_allowance_bytes`,
       :data:`ALLOCATOR_ALLOWANCE_FRACTION` of what churns).

    The body applies these as steps, one private function each, on the operands of
    :class:`_MemoryContext`: :func:`_stage_param_counts`, :func:`_stage_model_state_bytes`,
    :func:`_stage_activation_bytes`, :func:`_stage_other_bytes` (with
    :func:`_without_bucketed_gradients`), :func:`_fused_peak_terms_bytes` or
    :func:`_eager_peak_terms_bytes`, and :func:`_peak_and_fit_bytes`.

    Fused kernels hold all of this at once. Eager PyTorch creates the gradients during the
    backward and keeps bf16 autocast copies of the GEMM weights while they are saved, so its
    peak is the largest of three moments (see docs/memory.md): the loss forward (all
    activations, bf16 weights, 16-bit logits, fp32 logits and log-softmax output: 10 bytes per
    logit), the loss backward (the same plus the loss gradient and log-softmax gradient; fp32
    logits freed: 14 bytes per logit), and the end of the backward (all fp32 gradients, the
    16-bit logits still referenced, and the dense gradient of a tied embedding before it is
    added to the output layer's). Eager also counts what plain PyTorch's parallel APIs hold
    (docs/memory.md, checked against the harness): gradients of earlier micro-batches during
    later ones, torch pipelining's per-micro-batch receive buffers and kept outputs, the
    zero-bubble input-gradient pass's GEMM output gradients, FSDP2 ZeRO-2's sharded plus
    unsharded weights, DTensor sequence parallelism's gathered GEMM inputs.

    Parameters
    ----------
    model, training, cluster : specs (``cluster.gpu.hbm_bytes`` decides ``fits``)
    batch : configurations (``num_microbatches`` as resolved)
    kernels : "fused" (Megatron-LM / Transformer Engine) or "eager" (plain PyTorch)
    flash_attention : fused kernels only (eager always uses flash SDPA)
    dropout : dropout masks; default ``None`` means on for GPT-style models with learned
        positions (GPT-2/3, dropout 0.1) and off for RoPE models (Llama-style recipes), always
        off for eager

    Returns
    -------
    dict of arrays [bytes per GPU]: ``weights``, ``gradients``, ``optimizer``, ``activations``,
    ``other``, ``peak``, ``peak_allocated`` (``peak`` without the allocator allowance),
    ``allocator_allowance``, ``peak_stage`` (0 first, 1 last stage, 2 a middle stage),
    ``usable`` (HBM less the reserve less ``headroom``, :func:`usable_hbm_bytes`) and bool
    ``fits`` (``peak <= usable``).

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Table 1; Korthikanti et al. 2022, Table 2 and Sec. 4.2.3;
    Megatron-LM ``theoretical_memory_usage.py``; Narayanan et al. 2021, Sec. 2.2.
    """
    if kernels not in ("fused", "eager"):
        raise ValueError(f"kernels = {kernels!r}: expected 'fused' or 'eager'")
    eager = kernels == "eager"
    ctx = _memory_context(model, training, cluster.gpu, batch, eager, flash_attention, dropout)
    # 1. Parameters per GPU on the first, last and a middle rank, routed experts apart.
    # 2. Weights, gradients and optimizer states by ZeRO stage.
    params, states = batch.per_distinct(_STATE_FIELDS, lambda b: _params_and_states(
        _memory_context(model, training, cluster.gpu, b, eager, flash_attention, ctx.dropout)))
    # 3. Activations: the layers kept, the layer being recomputed, the embedding and the loss.
    acts = _stage_activation_bytes(ctx, params)
    # 4. Other buffers; gradients that live in eager DDP's bucket copy are counted there.
    other = _stage_other_bytes(ctx, params, states, acts)
    states = _without_bucketed_gradients(states, other.grads_in_buffer)
    # 5. The peak: the rank (fused) or the moment of the step (eager) that needs most.
    peak_terms = (_eager_peak_terms_bytes if eager else _fused_peak_terms_bytes)(
        ctx, params, states, acts, other)
    # 6. The allocator allowance, and whether the peak fits the usable HBM.
    return _peak_and_fit_bytes(ctx, peak_terms, headroom)


# ---------------------------------------------------------------------------------------------
# The steps of memory_breakdown
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _MemoryContext:
    """What every step of :func:`memory_breakdown` reads: the specs, the kernel family and, as
    float64 arrays (one entry per configuration), the parallel sizes ``tp pp vp cp dp``, the
    micro-batch size ``mbs`` and count ``m``; the codes ``zero``, ``rc`` (recompute), ``sched``;
    ``sp`` (bool), ``sp_div`` (divisor of the sequence-sharded parts: tp with sequence
    parallelism, else 1), ``shard`` (``dp * cp`` ranks sharing one copy of the stage's
    parameters), ``seq`` (tokens per sequence on this GPU), ``tokens`` (per micro-batch on this
    GPU), ``logits`` (per micro-batch, vocab-parallel [values]) and ``h`` (hidden size)."""

    model: ModelSpec
    training: TrainingSpec
    gpu: GPUSpec
    batch: ConfigBatch
    eager: bool
    flash_attention: bool
    dropout: bool
    tp: np.ndarray
    pp: np.ndarray
    vp: np.ndarray
    cp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    m: np.ndarray
    zero: np.ndarray
    rc: np.ndarray
    sched: np.ndarray
    sp: np.ndarray
    sp_div: np.ndarray
    shard: np.ndarray
    seq: np.ndarray
    tokens: np.ndarray
    logits: np.ndarray
    h: float
    precision: str


def _memory_context(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, batch: ConfigBatch,
                    eager: bool, flash_attention: bool, dropout: bool | None) -> _MemoryContext:
    """The operands of :class:`_MemoryContext`. ``dropout=None``: on for GPT-style models with
    learned positions, off for RoPE models and for eager (see :func:`memory_breakdown`)."""
    c = batch
    tp, pp, vp, cp, dp, mbs, m = (np.asarray(x, dtype=np.float64) for x in (
        c.tp, c.pp, c.vp, c.cp, c.dp, c.micro_batch_size, c.num_microbatches))
    sp = np.asarray(c.sequence_parallel, dtype=bool)
    seq = training.seq_len / cp  # tokens per sequence on this GPU
    tokens = seq * mbs  # tokens per micro-batch on this GPU
    if dropout is None:
        dropout = (not eager) and model.position_embedding == "learned"
    return _MemoryContext(
        model=model, training=training, gpu=gpu, batch=c, eager=eager,
        flash_attention=flash_attention, dropout=dropout,
        tp=tp, pp=pp, vp=vp, cp=cp, dp=dp, mbs=mbs, m=m,
        zero=np.asarray(c.zero_stage), rc=np.asarray(c.recompute), sched=np.asarray(c.schedule),
        sp=sp,
        sp_div=np.where(sp, tp, 1.0),  # divisor of the sequence-sharded parts
        shard=dp * cp,  # ranks sharing one copy of the stage's parameters
        seq=seq, tokens=tokens,
        logits=tokens * float(model.vocab_size) / tp,  # per micro-batch (vocab-parallel)
        h=float(model.hidden_size), precision=training.precision,
    )


@dataclass(frozen=True)
class _RankParamCounts:
    """Parameters per GPU [count] and transformer layers of the first, last and a middle rank:
    ``stage`` is :func:`stage_params`' dict; ``experts_*`` the rank's routed expert parameters
    (:func:`stage_expert_params`), ``experts_layer`` one MoE layer's share."""

    stage: dict
    params_first: np.ndarray
    params_last: np.ndarray
    params_mid: np.ndarray
    layers_first: np.ndarray
    layers_last: np.ndarray
    layers_mid: np.ndarray
    experts_first: np.ndarray
    experts_last: np.ndarray
    experts_mid: np.ndarray
    experts_layer: np.ndarray


#: The fields steps 1 and 2 of :func:`memory_breakdown` read (the layer layout, tp, the ZeRO
#: stage and the groups that shard the states).
_STATE_FIELDS = ("tp", "cp", "dp", "pp", "vp", "first_stage_layers", "last_stage_layers",
                 "embedding_as_layer", "loss_as_layer", "grad_compression", "topk_ratio",
                 "zero_stage", "ep", "etp")  # (gradient compression: a prefix shared with
# perfmodel.comm.comm_time's data-parallel key, whose distinct rows ConfigBatch.unique_by
# starts from)
#: The fields one layer's activations read (:func:`stage_layer_activation_bytes`: tp, cp, the
#: micro-batch, sp, recompute), with ep and etp: the key of one layer's compute
#: (perfmodel.compute.layer), whose distinct rows are then found once for both.
_LAYER_SHAPE_FIELDS = ("tp", "cp", "micro_batch_size", "sequence_parallel", "recompute", "ep",
                       "etp")


def _params_and_states(ctx: _MemoryContext) -> tuple[_RankParamCounts, _RankStateBytes]:
    """Steps 1 and 2 of :func:`memory_breakdown` (:func:`_stage_param_counts`,
    :func:`_stage_model_state_bytes`), computed once per distinct :data:`_STATE_FIELDS`."""
    params = _stage_param_counts(ctx)
    return params, _stage_model_state_bytes(ctx, params)


def _layer_activation_terms(ctx: _MemoryContext) -> dict:
    """:func:`stage_layer_activation_bytes` of ``ctx``: ``kept``, ``full`` [bytes], ``e``,
    ``gi`` [bytes per value]; the embedding's (``embed``), the final layer's (``final``) and
    the loss's logits (``logits_held``, ``logits_transient``) per micro-batch [bytes]
    (:func:`embedding_activation_bytes`, :func:`final_layer_activation_bytes`,
    :func:`loss_buffer_bytes`): all of them read tp, cp, the micro-batch and sp only."""
    kept, full, e, gi = stage_layer_activation_bytes(
        ctx.model, ctx.training, ctx.seq, ctx.mbs, ctx.tp, ctx.sp, ctx.rc, eager=ctx.eager,
        flash_attention=ctx.flash_attention, dropout=ctx.dropout)
    held, transient = loss_buffer_bytes(ctx.training, ctx.logits, eager=ctx.eager)
    return {"kept": kept, "full": full, "e": e, "gi": gi,
            "embed": embedding_activation_bytes(ctx.tokens, ctx.h, ctx.sp_div, ctx.dropout,
                                                eager=ctx.eager),
            "final": final_layer_activation_bytes(ctx.tokens, ctx.h, ctx.sp_div, e,
                                                  eager=ctx.eager),
            "logits_held": held, "logits_transient": transient}


#: The fields the in-flight micro-batches read (the schedule, and the MoE all-to-all
#: overlap's switch: :func:`perfmodel.moe.experts.a2a_overlap_applies`).
_INFLIGHT_FIELDS = ("pp", "vp", "num_microbatches", "schedule", "ep", "recompute")


def _inflight_terms(ctx: _MemoryContext) -> dict:
    """In-flight micro-batches of the first, last and a middle rank (``first``, ``last``:
    :func:`stage_inflight_microbatches`; ``mid``: rank 1, fused, with the all-to-all overlap's
    extra) and the loss's (``loss``: :func:`loss_inflight_microbatches`, fused)."""
    first, last = stage_inflight_microbatches(ctx.training, ctx.batch, ctx.pp, ctx.m, ctx.sched,
                                              ctx.vp, eager=ctx.eager)
    mid = inflight_microbatches(ctx.pp, ctx.m, ctx.sched, ctx.vp, stage=1) + (
        moe.a2a_overlap_extra_inflight(ctx.training, ctx.batch))
    return {"first": first, "last": last, "mid": mid,
            "loss": loss_inflight_microbatches(ctx.sched, ctx.m, last)}


def _stage_param_counts(ctx: _MemoryContext) -> _RankParamCounts:
    """Step 1 of :func:`memory_breakdown`: parameters per GPU [count], with Megatron-LM's layer
    layout (uneven first/last stages, or the embedding and the loss counted as layers:
    :func:`perfmodel.parallel.layers.stage_layer_counts`), and each rank's routed experts
    (:func:`stage_dense_layers`, :func:`stage_expert_params`).

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 2-3; Megatron-LM ``theoretical_memory_usage.py``.
    """
    model, c = ctx.model, ctx.batch
    lc = c.layer_counts(model.num_layers)
    stage = stage_params(model, ctx.tp, ctx.pp, lc["first"], lc["last"], lc["middle"])
    layers_first, layers_last, layers_mid = (
        stage["layers_first"], stage["layers_last"], stage["layers_middle"])
    dense_first, dense_last = stage_dense_layers(model, ctx.pp, lc["first_chunk0"])
    return _RankParamCounts(
        stage=stage,
        params_first=stage["first"], params_last=stage["last"], params_mid=stage["middle"],
        layers_first=layers_first, layers_last=layers_last, layers_mid=layers_mid,
        experts_first=stage_expert_params(model, c, layers_first, dense_first),
        experts_last=stage_expert_params(model, c, layers_last, dense_last),
        experts_mid=stage_expert_params(model, c, layers_mid, 0.0),
        experts_layer=stage_expert_params(model, c, 1.0),  # one MoE layer's share
    )


@dataclass(frozen=True)
class _RankStateBytes:
    """Model states of the first, last and a middle rank, ``(weights, gradients, optimizer)``
    [bytes] (the middle rank's without eager FSDP2's sharded weights: fused kernels only);
    the bytes per parameter of :func:`kernel_state_bytes_per_param` (``w_bpp``, ``g_bpp``,
    ``o_bpp``, ``copy_bpp``, ``fp8_params``) and ``state``, the ZeRO operands of
    :func:`rank_state_bytes` after the parameter counts."""

    w_bpp: float
    g_bpp: float
    o_bpp: float
    copy_bpp: float
    fp8_params: bool
    state: tuple
    first: tuple
    last: tuple
    middle: tuple


def _stage_model_state_bytes(ctx: _MemoryContext, par: _RankParamCounts) -> _RankStateBytes:
    """Step 2 of :func:`memory_breakdown`: weights, gradients and optimizer states by ZeRO stage
    [bytes per parameter -> bytes] (:func:`kernel_state_bytes_per_param`,
    :func:`rank_state_bytes`: :func:`zero_state_bytes` over the ``dp * cp`` ranks that hold the
    same parameters, :func:`expert_state_bytes` over expert-dp; eager FSDP2 ZeRO-2 adds
    :func:`fsdp2_zero2_sharded_weight_bytes`).

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 5 and Table 1; Megatron-LM
    ``theoretical_memory_usage.py``.
    """
    w_bpp, g_bpp, o_bpp, copy_bpp, fp8_params = kernel_state_bytes_per_param(ctx.training,
                                                                             ctx.eager)
    state = (ctx.shard, ctx.batch.expert_dp, ctx.zero, w_bpp, g_bpp, o_bpp)
    w1, g1, o1 = rank_state_bytes(par.params_first, par.experts_first, *state)
    w2, g2, o2 = rank_state_bytes(par.params_last, par.experts_last, *state)
    if ctx.eager:
        w1 = w1 + fsdp2_zero2_sharded_weight_bytes(par.params_first, ctx.dp, ctx.cp, ctx.zero,
                                                   w_bpp)
        w2 = w2 + fsdp2_zero2_sharded_weight_bytes(par.params_last, ctx.dp, ctx.cp, ctx.zero,
                                                   w_bpp)
    return _RankStateBytes(w_bpp=w_bpp, g_bpp=g_bpp, o_bpp=o_bpp, copy_bpp=copy_bpp,
                            fp8_params=fp8_params, state=state, first=(w1, g1, o1),
                            last=(w2, g2, o2),
                            middle=rank_state_bytes(par.params_mid, par.experts_mid, *state))


def _without_bucketed_gradients(states: _RankStateBytes, grads_in_buffer) -> _RankStateBytes:
    """The model states with the gradients set to 0 where they live in the gradient bucket
    buffer (eager DDP's bucket copy of every gradient, :func:`gradient_bucket_bytes`), which
    :func:`_stage_other_bytes` counts instead [bytes]."""
    (w1, g1, o1), (w2, g2, o2) = states.first, states.last
    g1, g2 = np.where(grads_in_buffer, 0.0, g1), np.where(grads_in_buffer, 0.0, g2)
    return replace(states, first=(w1, g1, o1), last=(w2, g2, o2))


@dataclass(frozen=True)
class _StageActivationBytes:
    """Activations of the first and last rank (``first``, ``last``) [bytes] and the operands the
    later steps reuse: one layer's kept (``layer_bytes``) and whole (``layer_full_bytes``)
    activations, the layer being recomputed (``recompute_bytes``), the bytes per saved value
    ``e`` and per GEMM input ``gi``, the in-flight micro-batches of the first and last rank,
    the layers offloaded to the CPU (``n_offload``) and one micro-batch's transient 16-bit
    logits (``logits_transient_bytes``)."""

    layer_bytes: np.ndarray
    layer_full_bytes: np.ndarray
    recompute_bytes: np.ndarray
    e: float
    gi: float | None
    infl_first: np.ndarray
    infl_last: np.ndarray
    infl_mid: np.ndarray
    n_offload: int
    logits_transient_bytes: np.ndarray
    first: np.ndarray
    last: np.ndarray


def _stage_activation_bytes(ctx: _MemoryContext, par: _RankParamCounts
                            ) -> _StageActivationBytes:
    """Step 3 of :func:`memory_breakdown`: activations [bytes]. One layer (kept under the
    recompute mode, plus MoE extras: :func:`stage_layer_activation_bytes`,
    :func:`moe_layer_activation_bytes`), the layer being recomputed (fused), times the layers of
    a stage kept on the GPU times the micro-batches in flight
    (:func:`stage_inflight_microbatches`, :func:`stage_activation_bytes`), plus the embedding's
    (:func:`embedding_activation_bytes`) and the loss's tensors
    (:func:`final_layer_activation_bytes`, :func:`loss_buffer_bytes`,
    :func:`loss_inflight_microbatches`).

    References
    ----------
    Korthikanti et al. 2022, Table 2 and Sec. 4.2.3; Narayanan et al. 2021, Sec. 2.2.
    """
    model, training, c, eager, rc = ctx.model, ctx.training, ctx.batch, ctx.eager, ctx.rc
    one = c.per_distinct(_LAYER_SHAPE_FIELDS, lambda b: _layer_activation_terms(_memory_context(
        model, training, ctx.gpu, b, eager, ctx.flash_attention, ctx.dropout)))
    layer_bytes, layer_full_bytes, e, gi = one["kept"], one["full"], one["e"], one["gi"]
    moe_kept_bytes, moe_full_bytes = moe_layer_activation_bytes(model, training, c, rc, e, gi)
    layer_bytes = layer_bytes + moe_kept_bytes
    layer_full_bytes = layer_full_bytes + moe_full_bytes
    recompute_bytes = np.where(rc == Recompute.FULL, 0.0 if eager else layer_full_bytes, 0.0)
    infl = c.per_distinct(_INFLIGHT_FIELDS, lambda b: _inflight_terms(_memory_context(
        model, training, ctx.gpu, b, eager, ctx.flash_attention, ctx.dropout)))
    infl_first, infl_last = infl["first"], infl["last"]
    embed_bytes, final_bytes = one["embed"], one["final"]
    logits_held_bytes, logits_transient_bytes = one["logits_held"], one["logits_transient"]
    n_offload = 0 if eager else training.cpu_offload_layers  # CPU activation offloading
    mb_loss = np.ceil(infl_last) if eager else infl["loss"]
    loss_bytes = mb_loss * (final_bytes + logits_held_bytes)
    act_first, act_last = single_stage_activation_bytes(
        stage_activation_bytes(infl_first, par.layers_first, n_offload, layer_bytes,
                               recompute_bytes, np.ceil(infl_first) * embed_bytes),
        stage_activation_bytes(infl_last, par.layers_last, n_offload, layer_bytes,
                               recompute_bytes, loss_bytes),
        loss_bytes, ctx.pp)
    return _StageActivationBytes(
        layer_bytes=layer_bytes, layer_full_bytes=layer_full_bytes,
        recompute_bytes=recompute_bytes, e=e, gi=gi, infl_first=infl_first,
        infl_last=infl_last, infl_mid=infl["mid"], n_offload=n_offload,
        logits_transient_bytes=logits_transient_bytes, first=act_first, last=act_last)


@dataclass(frozen=True)
class _StageOtherBytes:
    """Other buffers of the first and last rank (``first``, ``last``) [bytes], whether the
    gradients live in the bucket buffer (``grads_in_buffer``), and the parts a middle rank
    shares: ``base`` (workspaces and buckets), ``zero3_first`` (ZeRO-3 gathers), ``fp8`` (the
    operands of :func:`stage_fp8_weight_cache_bytes` after the layer and expert counts),
    ``dispatch`` (MoE dispatch buffers)."""

    grads_in_buffer: np.ndarray
    base: np.ndarray
    zero3_first: np.ndarray
    fp8: tuple
    dispatch: np.ndarray
    first: np.ndarray
    last: np.ndarray


def cp_gather_buffer_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                           ) -> np.ndarray:
    """The K/V all-gather attention's transient buffers of the layer being computed, rows with
    ``cp_comm = "allgather"`` (:func:`perfmodel.comm.cp_allgather.allgather_buffer_bytes`:
    the gathered K/V and the full-sequence dK/dV, in the attention layers only); 0 elsewhere."""
    ag = batch.cp_comm == CpComm.ALLGATHER
    if not np.any(ag) or (model.is_hybrid and model.attention_layer_fraction <= 0):
        return np.zeros(len(batch))
    return np.where(ag, allgather_buffer_bytes(batch.cp, cp_kv_chunk_bytes(model, training,
                                                                           batch)), 0.0)


def _stage_other_bytes(ctx: _MemoryContext, par: _RankParamCounts, states: _RankStateBytes,
                       acts: _StageActivationBytes) -> _StageOtherBytes:
    """Step 4 of :func:`memory_breakdown`: other buffers [bytes]. Workspaces
    (:func:`library_workspace_bytes`), gradient buckets (:func:`gradient_bucket_bytes`), ZeRO-3
    gathers (:func:`zero3_gathered_bytes`), fp8 weight caches
    (:func:`stage_fp8_weight_cache_bytes`), MoE dispatch buffers
    (:func:`perfmodel.moe.experts.moe_dispatch_buffer_bytes`) and the K/V all-gather's
    (:func:`cp_gather_buffer_bytes`), eager torch pipelining's receive buffers
    and outputs (:func:`eager_pipeline_receive_bytes`,
    :func:`eager_pipeline_held_output_bytes`).

    References
    ----------
    docs/memory.md; Megatron-LM ``--ddp-bucket-size`` (:data:`BUCKET_PARAMS`); DeepSpeed /
    FSDP prefetch (:data:`ZERO3_LIVE_LAYERS`).
    """
    eager, zero, shard, precision = ctx.eager, ctx.zero, ctx.shard, ctx.precision
    bucket_bytes, grads_in_buffer = gradient_bucket_bytes(par.params_first, zero, shard,
                                                          states.g_bpp, eager=eager)
    zero3_first, zero3_last = zero3_gathered_bytes(par.stage, par.experts_layer, ctx.vp, zero,
                                                   shard, states.w_bpp + states.g_bpp,
                                                   eager=eager)
    fp8 = (par.stage["gemm_layer"], par.experts_layer, zero, shard, ctx.batch.expert_dp,
           states.fp8_params)
    fp8_first = 0.0 if eager else stage_fp8_weight_cache_bytes(precision, par.layers_first,
                                                                par.experts_first, *fp8)
    fp8_last = 0.0 if eager else stage_fp8_weight_cache_bytes(precision, par.layers_last,
                                                               par.experts_last, *fp8)
    dispatch_bytes = moe.moe_dispatch_buffer_bytes(ctx.model, ctx.training, ctx.batch, acts.e)
    dispatch_bytes = dispatch_bytes + cp_gather_buffer_bytes(ctx.model, ctx.training, ctx.batch)
    base_other = library_workspace_bytes(ctx.gpu, ctx.tp) + bucket_bytes
    other_first = base_other + zero3_first + fp8_first + dispatch_bytes
    other_last = base_other + zero3_last + fp8_last + dispatch_bytes
    if eager:
        p2p_first, p2p_last = eager_pipeline_receive_bytes(ctx.tokens, ctx.h, ctx.sp_div, ctx.pp,
                                                           ctx.m, ctx.vp, acts.infl_first,
                                                           acts.infl_last)
        other_first = other_first + p2p_first
        other_last = other_last + p2p_last
        other_last = other_last + eager_pipeline_held_output_bytes(precision, ctx.pp, ctx.m,
                                                                   ctx.logits)
    return _StageOtherBytes(grads_in_buffer=grads_in_buffer, base=base_other,
                            zero3_first=zero3_first, fp8=fp8, dispatch=dispatch_bytes,
                            first=other_first, last=other_last)


def _middle_rank_bytes(ctx: _MemoryContext, par: _RankParamCounts, states: _RankStateBytes,
                       acts: _StageActivationBytes, other: _StageOtherBytes) -> tuple:
    """Fused kernels: a middle rank's (weights, gradients, optimizer, activations, other)
    [bytes], rank 1 (:func:`fused_peak_stage`), with its in-flight micro-batches
    (:func:`perfmodel.pipeline.schedules.inflight_microbatches`, plus
    :func:`perfmodel.moe.experts.a2a_overlap_extra_inflight`).

    References
    ----------
    Narayanan et al. 2021, Sec. 2.2.
    """
    infl_mid = acts.infl_mid
    return (
        *states.middle,
        stage_activation_bytes(infl_mid, par.layers_mid, acts.n_offload, acts.layer_bytes,
                               acts.recompute_bytes, 0.0),
        other.base + other.zero3_first + stage_fp8_weight_cache_bytes(
            ctx.precision, par.layers_mid, par.experts_mid, *other.fp8) + other.dispatch,
    )


def _fused_peak_terms_bytes(ctx: _MemoryContext, par: _RankParamCounts,
                            states: _RankStateBytes, acts: _StageActivationBytes,
                            other: _StageOtherBytes) -> tuple:
    """Step 5 of :func:`memory_breakdown`, fused kernels: everything is held at once, so the
    peak is the plain sum on the rank needing most, first, last or a middle rank
    (:func:`fused_peak_stage`), plus the optimizer step's gradient copy
    (:func:`optimizer_grad_copy_excess_bytes`). Returns (weights, gradients, optimizer,
    activations, other) [bytes] and ``peak_stage``.

    References
    ----------
    Megatron-LM ``theoretical_memory_usage.py``; docs/memory.md.
    """
    first = (*states.first, acts.first, other.first)
    last = (*states.last, acts.last, other.last)
    middle = _middle_rank_bytes(ctx, par, states, acts, other)
    weights, grads, opt, act, oth, peak_stage = fused_peak_stage(
        first, last, middle, ctx.pp, acts.logits_transient_bytes)
    peak_params = np.where(peak_stage == 1, par.params_last,
                           np.where(peak_stage == 2, par.params_mid, par.params_first))
    opt = opt + optimizer_grad_copy_excess_bytes(states.copy_bpp, ctx.zero, ctx.shard,
                                                 peak_params, act)
    return weights, grads, opt, act, oth, peak_stage


def _eager_peak_terms_bytes(ctx: _MemoryContext, par: _RankParamCounts,
                            states: _RankStateBytes, acts: _StageActivationBytes,
                            other: _StageOtherBytes) -> tuple:
    """Step 5 of :func:`memory_breakdown`, eager PyTorch: the largest moment of the step
    (:func:`_eager_moments`) on the first or last rank, with the zero-bubble GEMM output
    gradients (:func:`eager_zero_bubble_gradient_bytes`) and the gradients of earlier
    micro-batches (:func:`eager_accumulating_gradients`). Returns (weights, gradients,
    optimizer, activations, other) [bytes] and ``peak_stage``.

    References
    ----------
    docs/memory.md (the eager moments, checked against the harness).
    """
    first = (*states.first, acts.first, other.first)
    last = (*states.last, acts.last, other.last)
    zb_last = eager_zero_bubble_gradient_bytes(ctx.model, ctx.precision, ctx.tokens, ctx.tp,
                                               ctx.sp_div, ctx.pp, ctx.m, ctx.sched,
                                               par.layers_last, ctx.logits)
    return _eager_moments(
        ctx.model, par.stage, ctx.rc, ctx.pp, ctx.tp, ctx.logits,
        (par.layers_first, par.layers_last), acts.layer_full_bytes, states.g_bpp, first, last,
        autocast=ctx.precision != "fp32", zb_last=zb_last,
        accumulating=eager_accumulating_gradients(ctx.sched, ctx.m, acts.infl_first,
                                                  acts.infl_last))


def _peak_and_fit_bytes(ctx: _MemoryContext, peak_terms: tuple, headroom: float
                        ) -> dict[str, np.ndarray]:
    """Step 6 of :func:`memory_breakdown`: the allocator allowance
    (:func:`allocator_allowance_bytes`, :data:`ALLOCATOR_ALLOWANCE_FRACTION` of what churns:
    all allocated bytes for eager, activations and buffers for fused), the peak [bytes] and
    whether it fits the usable HBM (:func:`usable_hbm_bytes`); :func:`memory_breakdown`'s dict.

    References
    ----------
    PyTorch ``c10/cuda/CUDACachingAllocator.cpp``; calibration/h200 e2e runs.
    """
    weights, grads, opt, acts, other, peak_stage = peak_terms
    allocated = weights + grads + opt + acts + other
    allowance = allocator_allowance_bytes(ctx.gpu, allocated if ctx.eager else acts + other)
    peak = allocated + allowance
    usable = usable_hbm_bytes(ctx.gpu, headroom)
    return {
        "weights": weights,
        "gradients": grads,
        "optimizer": opt,
        "activations": acts,
        "other": other + allowance,
        "peak": peak,
        "peak_allocated": allocated,
        "allocator_allowance": allowance,
        "peak_stage": peak_stage,
        "usable": np.full(np.shape(peak), usable),
        "fits": peak <= usable,
    }


def _eager_moments(
    model,
    sp_,
    rc,
    pp,
    tp,
    logit,
    layers,
    layer_full,
    grad_bytes,
    first,
    last,
    autocast=True,
    zb_last=0.0,
    accumulating=(False, False),
):
    """Eager PyTorch: the largest moment of a step, on the first or last stage.

    Moments: forward end (loss forward), loss backward, the first recomputed layer's backward
    (full recompute only), backward end.

    Returns weights (fp32 + live bf16 autocast copies), gradients, optimizer, activations,
    other, and the stage index of the peak. Without autocast (fp32 training) there are no
    16-bit weight copies and the logits are the fp32 logits themselves (4 bytes per logit,
    not 2 + 4).
    """
    cast = 1.0 if autocast else 0.0
    held = 2.0 if autocast else 4.0  # the logits tensor the step keeps referencing [B/logit]
    lo16 = 2.0 if autocast else 0.0  # separate 16-bit logits next to the fp32 ones
    h, v = float(model.hidden_size), float(model.vocab_size)
    full = rc == Recompute.FULL
    layers_first, layers_last = layers
    head_gemm = v * h / tp  # the output layer's GEMM weight (a cast of a tied embedding)
    tied_single = (model.output_params() == 0) & (pp == 1)
    out = {}
    for name, (w, g, o, act, oth), has_head, has_embed, zb, acc, n_layers in (
        ("first", first, pp == 1, True, 0.0, accumulating[0], layers_first),
        ("last", last, True, pp == 1, zb_last, accumulating[1], layers_last),
    ):
        gemm_layers = n_layers * sp_["gemm_layer"]
        head = np.where(has_head, head_gemm, 0.0)
        bf16_all = cast * 2.0 * (gemm_layers + head)  # autocast weight cache, forward end
        bf16_saved = np.where(full, cast * 2.0 * head, bf16_all)  # still saved at the loss backward
        logits_fwd = np.where(has_head, (8.0 + lo16) * logit, 0.0)
        logits_bwd = np.where(has_head, (_EAGER_LOGITS_PEAK_VALUES - 2.0 + lo16) * logit, 0.0)
        # end of backward: all gradients, the 16-bit logits still referenced by the step's
        # local variable, the dense gradient of a tied embedding before accumulation
        end_extra = np.where(has_head, held * logit, 0.0) + np.where(
            tied_single & has_embed, 4.0 * v * h / tp, 0.0
        )
        # gradient accumulation: once a micro-batch's backward has run (m larger than the
        # micro-batches in flight, not GPipe), its gradients (ZeRO-2/3: their reduce-scattered
        # shards) stay next to the next micro-batches' activations
        g_acc = np.where(acc, g, 0.0)
        fwd = (w + bf16_all, g_acc, o, act + logits_fwd, oth)
        # zero bubble: the end of the stage's input-gradient pass, all activations and the
        # loss buffers still saved for the weight pass, plus the GEMM output gradients
        bwd = (w + bf16_saved, g_acc, o, act + logits_bwd + zb, oth)
        # full recompute, backward of the stage's last layer: its recomputed activations and
        # bf16 weights next to the checkpoints, the output layer's gradient, the 16-bit logits
        recomp = (
            w + cast * 2.0 * (sp_["gemm_layer"] + head),
            np.where(acc, g, np.where(has_head, grad_bytes * head, 0.0)),
            o,
            np.where(full, act + layer_full + np.where(has_head, held * logit, 0.0), 0.0),
            oth,
        )
        end = (w + 0.0, g, o, end_extra, oth)
        moments = (fwd, bwd, recomp, end)
        totals = np.stack([sum(x) for x in moments])
        k = np.argmax(totals, axis=0)
        out[name] = [np.choose(k, [mo[i] for mo in moments]) for i in range(5)]
        out[name + "_total"] = np.max(totals, axis=0)
    first_peak = out["first_total"] >= out["last_total"]
    res = [np.where(first_peak, x1, x2) for x1, x2 in zip(out["first"], out["last"])]
    return (*res, np.where(first_peak, 0, 1))


