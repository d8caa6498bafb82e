"""Hybrid Mamba2 / attention / MLP / MoE stacks (Nemotron-H, Nemotron-3): FLOPs and kernel
times of the Mamba2 layers (shapes and pattern checks: :mod:`perfmodel.spec.hybrid`;
activations: :mod:`perfmodel.memory.hybrid`).

A hybrid model is a list of single-mixer layers, one letter each (Megatron-Core
``MambaModel``, ``--hybrid-override-pattern``; ``mamba_hybrid_layer_allocation.Symbols``):
``M`` a Mamba2 layer (``MambaLayer``: pre-norm fused into ``in_proj``, ``MambaMixer``), ``*``
an attention-only layer, ``-`` an MLP-only layer, ``E`` an MoE-only layer; each has one pre-norm
and one residual add. The cost models keep their "average layer" (as for MoE): attention is in
:attr:`ModelSpec.attention_layer_fraction` of the layers, the dense MLP in
:attr:`ModelSpec.dense_mlp_fraction`, MoE in ``moe_layer_fraction``, Mamba2 in
:attr:`ModelSpec.mamba_layer_fraction`; a transformer is attention 1, Mamba 0.

One Mamba2 layer (Megatron-Core ``ssm/mamba_mixer.py`` ``MambaMixer``, mem-eff training path
``mamba_split_conv1d_scan_combined`` of ``mamba_ssm``), ``d_inner = H * P`` (heads x head dim):

* ``in_proj``: column-parallel GEMM ``h -> 2*d_inner + 2*G*N + H`` (z, x, B, C, dt), no bias;
* ``conv1d``: depthwise causal conv of width K over ``x, B, C`` (``d_inner + 2*G*N`` channels),
  with bias, SiLU;
* the SSD chunked scan (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060, Sec. 6: the
  chunk-wise algorithm with chunk ``Q``), gated by ``silu(z)``, parameters ``A_log``, ``D``,
  ``dt_bias`` (``H`` each);
* a grouped RMSNorm over ``d_inner`` (``ExtendedRMSNorm``), then ``out_proj`` (row-parallel
  ``d_inner -> h``).

Tensor parallelism splits heads and groups (``MambaMixer`` asserts ``H % tp == 0`` and
``G % tp == 0``). Context parallelism (Megatron-Core ``MambaContextParallel``, an all-to-all
from sequence to head sharding around the scan) is not modelled: the search refuses cp > 1 for
hybrid models (:func:`perfmodel.spec.hybrid.unsupported_parallelism`).
"""

from __future__ import annotations

import numpy as np

from perfmodel.hardware.calibration import KERNEL_MIN_S
from perfmodel.spec.hybrid import (
    mamba_conv_dim,
    mamba_d_inner,
    mamba_heads,
    mamba_in_proj_size,
)

__all__ = [
    "SSD_BANDWIDTH_EFFICIENCY",
    "SSD_BWD_COUNTS",
    "SSD_MMA_EFFICIENCY",
    "mamba_gemms",
    "mamba_kernels",
    "mamba_matmul_flops_per_token",
    "megatron_mamba_flops_per_token",
    "ssd_bwd_flops_per_token",
    "ssd_bytes_per_token",
    "ssd_flops_per_token",
]


SSD_MMA_EFFICIENCY = 0.25
"""Share of the 16-bit tensor peak the SSD kernels' chunk matmuls (Q x N by N x P blocks, Triton)
reach. An assumption, not fitted: Dao & Gu 2024 (Sec. 7.3, Fig. 10) report the SSD kernel 2-8x
faster than Mamba-1's scan and on par with FlashAttention-2 at 2K tokens; for the Nemotron shapes
the scan is bound by its HBM traffic (:func:`ssd_bytes_per_token`), so this term rarely binds."""

SSD_BANDWIDTH_EFFICIENCY = 0.50
"""Share of the calibrated copy bandwidth that ``mamba_ssm``'s Triton SSD kernels reach on the
traffic :func:`ssd_bytes_per_token` counts (the chunk-wise kernels re-read ``C B^T``, ``B`` and
``C`` per head and stream small ``Q x N`` / ``N x P`` tiles; "mostly bottlenecked by memory
bandwidth and latency", Astra, Dao, Hoque, "Accelerating Mamba2 with Kernel Fusion", PyTorch blog,
Feb 2026). Measured, not fitted on the training rows: vLLM PR #27299 (cyang49, 2025-10-25, one
H100, RishiAstra's ``ssm_benchmark.py``) times ``mamba_ssm``'s five forward kernels
(``_mamba_chunk_scan_combined_fwd``, the "Original" column) at granite-4.0-h-small dims (128
heads x 64, 1 group, state 128, chunk 256, no ``z``) at 1.262e7 tokens/s over 8192 tokens and
1.292e7 over 16384; the 118,272 bytes a token that :func:`ssd_bytes_per_token` counts for that
shape would take 39.9 ns at the H100's calibrated copy bandwidth (2.96 TB/s), 2.51e7 tokens/s:
0.50 / 0.52 of it (``tests/perfmodel/compute/test_mamba.py``). The backward kernels
(``_mamba_chunk_scan_combined_bwd``, the same Triton family, with atomics) are taken at the same
share, an assumption: no published time of them at a known shape was found."""

#: Backward of the SSD scan (``mamba_ssm`` ``_mamba_chunk_scan_combined_bwd``): it recomputes
#: the chunk cumsum, ``C B^T``, the chunk states and the state passing (the forward less the
#: chunk scan), then runs eleven gradient kernels (``_chunk_scan_bwd_dz``, ``_dstates``,
#: ``_state_passing_bwd``, ``_chunk_scan_chunk_state_bwd_dx``, ``_chunk_state_bwd_db``,
#: ``_chunk_scan_bwd_dC``, ``_chunk_scan_bwd_dcb``, two ``_bmm_chunk_bwd``,
#: ``_chunk_scan_bwd_ddAcs_stable``, ``_chunk_cumsum_bwd``). Counted from their operands:
#: 16-bit token tensors read or written ``16 di + 12 GN`` values per token, fp32 chunk-state
#: passes 11 (4 forward), fp32 ``C B^T``-sized blocks 6 (2 forward); matmul FLOPs
#: ``3*2QNG + 3*2QPH + 5*2NPH`` (:func:`ssd_bwd_flops_per_token`; forward
#: :func:`ssd_flops_per_token`).
SSD_BWD_COUNTS = {"di": 16.0, "gn": 12.0, "state_passes": 11.0, "cb_passes": 6.0}


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------
def mamba_matmul_flops_per_token(model) -> float:
    """Forward FLOPs per token of one Mamba2 layer's weight GEMMs: ``2*h*(2di + 2GN + H)``
    (in_proj) + ``2*di*h`` (out_proj)."""
    h = model.hidden_size
    return 2.0 * h * mamba_in_proj_size(model) + 2.0 * mamba_d_inner(model) * h


def ssd_flops_per_token(model) -> float:
    """Forward FLOPs per token of one Mamba2 layer's SSD chunked scan (chunk ``Q``, state
    ``N``, head dim ``P``, ``H`` heads, ``G`` groups): intra-chunk scores ``C B^T`` (``2QNG``),
    scores times x (``2QPH``), chunk states ``B^T x`` (``2NPH``), state passing between chunks
    (``2NPH/Q``) and states to outputs ``C h`` (``2NPH``). The kernels compute whole Q x Q
    blocks (the causal mask is applied inside), so the intra-chunk terms are not halved.

    Example (Nemotron-3 Nano, Q 128): 262,144 + 1,048,576 + 1,048,576 + 8,192 + 1,048,576 =
    3,416,064 FLOPs per token.

    References
    ----------
    Dao & Gu 2024, arXiv:2405.21060, Sec. 6 (SSD algorithm: diagonal blocks, chunk states,
    state passing, off-diagonal outputs) and Sec. 6.3 (cost ``O(TN^2)`` FLOPs).
    """
    Q, N, P = model.mamba_chunk_size, model.mamba_state_dim, model.mamba_head_dim
    H, G = mamba_heads(model), model.mamba_num_groups
    return 2.0 * Q * N * G + 2.0 * Q * P * H + 2.0 * N * P * H + 2.0 * N * P * H / Q + (
        2.0 * N * P * H)


def megatron_mamba_flops_per_token(model) -> float:
    """Forward FLOPs per token of one Mamba layer as Megatron-LM counts them for its reported
    TFLOP/s (``training.py`` ``num_floating_point_operations`` -> ``hybrid_flops`` ->
    ``mamba_layer_flops``): ``2h(2 d_in + 2GN + H) + 7 d_in N + 2 d_in h`` with ``d_in = 2h``
    (the expand-2 default even where ``mamba_num_heads`` sets ``d_inner = H*P`` otherwise)."""
    h, N, G, H = model.hidden_size, model.mamba_state_dim, model.mamba_num_groups, mamba_heads(
        model)
    d_in = 2 * h
    return 2.0 * h * (2 * d_in + 2 * G * N + H) + 7.0 * d_in * N + 2.0 * d_in * h


# --------------------------------------------------------------------------------------------
# Kernel times
# --------------------------------------------------------------------------------------------
def mamba_gemms(model, tokens, tp) -> list:
    """The Mamba2 layers' weight GEMMs on one GPU, in :func:`perfmodel.compute.layer.layer_gemms`'
    ``(name, m, n, k, count)`` form, ``count`` the Mamba2 share of the layers: ``in_proj``
    column-parallel (``n = (2di + 2GN + H)/tp``), ``out_proj`` row-parallel (``k = di/tp``)."""
    tp = np.asarray(tp, dtype=np.float64)
    T = np.asarray(tokens, dtype=np.float64)
    m = model.mamba_layer_fraction
    hh = np.full_like(tp, model.hidden_size)
    return [("mamba_in_proj", T, mamba_in_proj_size(model) / tp, hh, m),
            ("mamba_out_proj", T, hh, mamba_d_inner(model) / tp, m)]


def ssd_bytes_per_token(model, tp, act_b: float, pass_: str = "fwd", z_in_scan: bool = True):
    """HBM bytes per token of one Mamba2 layer's SSD scan on one GPU (heads and groups split by
    tp). Forward, over its five kernels (``mamba_ssm`` ``_mamba_chunk_scan_combined_fwd``:
    chunk cumsum, chunk state, state passing, ``C B^T``, chunk scan): 16-bit reads of x (twice),
    B and C (three times, ``6GN`` in all), z and writes of the gated output and of the ungated
    ``out_x`` it saves (``5 di``); fp32 chunk states written, read and rewritten by the state
    passing and read by the scan (4 passes of ``H P N / Q`` values), and the fp32 ``C B^T``
    block written and read (``2 G Q``). Backward: the recompute and gradient kernels of
    :data:`SSD_BWD_COUNTS`. ``z_in_scan`` False: no gate inside the scan (``z=None``, as vLLM
    calls it; Megatron's training path gates inside it), the forward reads no z and writes no
    ``out_x`` (``3 di``).

    Example (Nemotron-3 Nano, tp 1, bf16): forward 2*(5*4096 + 6*1024) + 4*(4*64*64*128/128 +
    2*8*128) = 126,976 bytes per token; backward 2*(16*4096 + 12*1024) + 4*(11*4096 + 6*1024)
    = 360,448."""
    tp = np.asarray(tp, dtype=np.float64)
    Q, N, P = model.mamba_chunk_size, model.mamba_state_dim, model.mamba_head_dim
    di, H, G = mamba_d_inner(model) / tp, mamba_heads(model) / tp, model.mamba_num_groups / tp
    state = 4.0 * H * P * N / Q  # one fp32 pass over the chunk states, per token
    cb = 4.0 * G * Q  # one fp32 pass over the C B^T blocks, per token
    if pass_ == "fwd":
        return act_b * ((5.0 if z_in_scan else 3.0) * di + 6.0 * G * N) + 4.0 * state + 2.0 * cb
    k = SSD_BWD_COUNTS
    return act_b * (k["di"] * di + k["gn"] * G * N) + k["state_passes"] * state + (
        k["cb_passes"] * cb)


def ssd_bwd_flops_per_token(model) -> float:
    """Backward matmul FLOPs per token of the SSD scan (:data:`SSD_BWD_COUNTS`): recomputed
    ``C B^T`` and chunk states, then ``dC B``-type products: ``3*2QNG + 3*2QPH + 5*2NPH``.

    Example (Nemotron-3 Nano): 786,432 + 3,145,728 + 5,242,880 = 9,175,040 (2.7x forward)."""
    Q, N, P = model.mamba_chunk_size, model.mamba_state_dim, model.mamba_head_dim
    H, G = mamba_heads(model), model.mamba_num_groups
    return 3 * 2.0 * Q * N * G + 3 * 2.0 * Q * P * H + 5 * 2.0 * N * P * H


def _roofline_s(cal, flops, nbytes, peak16: float):
    """A memory-bound kernel with tensor-core matmuls inside: the slower of its traffic at
    :data:`SSD_BANDWIDTH_EFFICIENCY` of the calibrated copy bandwidth and its FLOPs at
    :data:`SSD_MMA_EFFICIENCY` of the 16-bit peak."""
    bw = cal.membw_bytes_per_s("copy") * SSD_BANDWIDTH_EFFICIENCY
    t = np.maximum(np.asarray(nbytes, dtype=np.float64) / bw,
                   np.asarray(flops, dtype=np.float64) / (peak16 * SSD_MMA_EFFICIENCY))
    return np.maximum(t, KERNEL_MIN_S)


#: Kernels a Mamba2 layer launches besides its two GEMMs, forward and backward: causal conv1d,
#: the five SSD kernels, the grouped RMSNorm; backward: conv1d recompute + backward, eight SSD
#: backward kernels (``_mamba_chunk_scan_combined_bwd``), the norm backward.
MAMBA_KERNELS = {"fwd": 7, "bwd": 11}


def mamba_kernels(model, training, cal, ph, T, tp, act_b: float, peak16: float,
                  pass_: str, mb=1) -> None:
    """The Mamba2 layers' non-GEMM kernels (their share ``m`` of the average layer) added to
    the phase ``ph``: causal conv1d (forward reads and writes the ``conv_dim/tp`` channels; the
    backward recomputes it, ``mamba_ssm`` ``checkpoint_lvl=1``, and reads the output gradient
    and input to write the input gradient: 5 passes), the SSD scan
    (:func:`ssd_flops_per_token`, :func:`ssd_bytes_per_token`, as a roofline
    :func:`_roofline_s`), the grouped RMSNorm over ``d_inner/tp`` (2 passes forward, 3
    backward), and with micro-batches ``mb`` > 1 the layout copies of the in_proj and scan
    outputs (``MambaMixer._ssm_training``: ``rearrange("l b d -> b l d").contiguous()`` and back;
    free at ``b = 1``). No-op for a transformer. With ``cuda_graph_scope`` ``mamba`` the
    launches are replayed from a graph (one launch).

    References
    ----------
    ``mamba_ssm`` ``ops/triton/ssd_combined.py`` (``MambaSplitConv1dScanCombinedFn``),
    ``causal_conv1d``; Megatron-Core ``ssm/mamba_mixer.py`` (``_ssm_training``).
    """
    m = model.mamba_layer_fraction
    if m == 0:
        return
    tp = np.asarray(tp, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    conv = mamba_conv_dim(model) / tp
    di = mamba_d_inner(model) / tp
    fwd = pass_ == "fwd"
    ph.mem("copy", m * (2.0 if fwd else 5.0) * act_b * T * conv)
    flops = (ssd_flops_per_token(model) if fwd else ssd_bwd_flops_per_token(model)) / tp
    ph.add(m * _roofline_s(cal, flops * T, ssd_bytes_per_token(model, tp, act_b, pass_) * T,
                           peak16), 0)
    ph.mem("layernorm", m * (2.0 if fwd else 3.0) * act_b * T * di)
    # Megatron-Core's (l, b, d) <-> (b, l, d) layout changes of the in_proj output and of the
    # scan output (rearrange(...).contiguous()), real copies when the micro-batch exceeds 1
    # (and their gradients' copies in the backward)
    mb_copy = np.where(np.asarray(mb) > 1, 1.0, 0.0)
    ph.mem("copy", m * mb_copy * act_b * T * (mamba_in_proj_size(model) / tp + di), 2)
    graphed = "mamba" in getattr(training, "cuda_graph_scope", ())
    ph.add(0.0, m * (1 if graphed else MAMBA_KERNELS[pass_] - 2))  # conv + norm counted above


