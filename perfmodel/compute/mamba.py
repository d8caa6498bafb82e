"""Hybrid Mamba2 / attention / MLP / MoE stacks (Nemotron-H, Nemotron-3): parameters, FLOPs,
kernel times and activations of the Mamba2 layers, and the pattern checks.

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
hybrid models (:func:`unsupported_parallelism`).
"""

from __future__ import annotations

import numpy as np

from perfmodel.memory.breakdown import activation_operands

__all__ = [
    "SSD_BANDWIDTH_EFFICIENCY",
    "SSD_BWD_COUNTS",
    "SSD_MMA_EFFICIENCY",
    "check_hybrid",
    "hf_hybrid_fields",
    "hybrid_layer_activation_bytes",
    "hybrid_layer_params",
    "mamba_activation_bytes",
    "mamba_conv_dim",
    "mamba_d_inner",
    "mamba_gemms",
    "mamba_heads",
    "mamba_in_proj_size",
    "mamba_kernels",
    "mamba_matmul_flops_per_token",
    "mamba_params_per_layer",
    "megatron_mamba_flops_per_token",
    "ssd_bwd_flops_per_token",
    "ssd_bytes_per_token",
    "ssd_flops_per_token",
    "unsupported_parallelism",
]

LETTERS = "M*-E"

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
# Pattern and shapes
# --------------------------------------------------------------------------------------------
def check_hybrid(model) -> None:
    """Raise ValueError (a one-line message naming field and value) for an inconsistent hybrid
    spec: unknown letters, a pattern length other than ``num_layers``, MoE letters without
    experts (or experts without MoE letters), the transformer-only MoE layout fields, or Mamba2
    dims whose heads do not divide into groups (``MambaMixer`` asserts)."""
    p = model.hybrid_override_pattern
    bad = [(i, c) for i, c in enumerate(p) if c not in LETTERS]
    if bad:
        i, c = bad[0]
        raise ValueError(f"hybrid_override_pattern {p!r}: letter {c!r} at position {i} is not "
                         f"one of M (Mamba2), * (attention), - (MLP), E (MoE)")
    if len(p) != model.num_layers:
        raise ValueError(f"hybrid_override_pattern has {len(p)} letters, num_layers "
                         f"({model.num_layers}) must equal it")
    n_e = p.count("E")
    if n_e and model.num_experts <= 1:
        raise ValueError(f"hybrid_override_pattern has {n_e} MoE layers ('E'): give "
                         f"num_experts > 1 (got {model.num_experts})")
    if model.num_experts > 1 and not n_e:
        raise ValueError(f"num_experts ({model.num_experts}) > 1 but hybrid_override_pattern "
                         "has no MoE layer ('E')")
    if model.moe_dense_layers or model.moe_layer_freq != 1:
        raise ValueError(f"moe_dense_layers ({model.moe_dense_layers}) and moe_layer_freq "
                         f"({model.moe_layer_freq}) do not apply to a hybrid pattern: place "
                         "the 'E' letters")
    if "M" in p:
        if model.mamba_num_heads is None and (model.mamba_expand * model.hidden_size
                                              % model.mamba_head_dim):
            raise ValueError(f"mamba_head_dim ({model.mamba_head_dim}) must divide "
                             f"mamba_expand * hidden_size ({model.mamba_expand} * "
                             f"{model.hidden_size}) unless mamba_num_heads is given")
        heads = mamba_heads(model)
        if heads % model.mamba_num_groups:
            raise ValueError(f"mamba_num_groups ({model.mamba_num_groups}) must divide "
                             f"mamba_num_heads ({heads})")


def mamba_heads(model) -> int:
    """Mamba2 heads ``H``: ``mamba_num_heads``, else ``expand * h / head_dim``."""
    if model.mamba_num_heads is not None:
        return model.mamba_num_heads
    return model.mamba_expand * model.hidden_size // model.mamba_head_dim


def mamba_d_inner(model) -> int:
    """``d_inner = H * P`` (``MambaMixer``: heads given override ``expand * d_model``)."""
    return mamba_heads(model) * model.mamba_head_dim


def mamba_in_proj_size(model) -> int:
    """Output features of ``in_proj``: ``2*d_inner + 2*G*N + H`` (z, x, B, C, dt; Megatron-Core
    ``ssm/mamba_mixer.py`` ``MambaMixer.__init__``)."""
    return (2 * mamba_d_inner(model) + 2 * model.mamba_num_groups * model.mamba_state_dim
            + mamba_heads(model))


def mamba_conv_dim(model) -> int:
    """Channels of the causal conv1d: ``d_inner + 2*G*N`` (x, B, C; Megatron-Core
    ``ssm/mamba_mixer.py`` ``conv_dim``)."""
    return mamba_d_inner(model) + 2 * model.mamba_num_groups * model.mamba_state_dim


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------
def mamba_params_per_layer(model) -> int:
    """Parameters of one Mamba2 mixer (its pre-norm not included):
    ``h*(2di + 2GN + H)`` in_proj + ``conv_dim*(K + 1)`` conv1d weight and bias + ``3H``
    (dt_bias, A_log, D) + ``di`` grouped RMSNorm + ``di*h`` out_proj.

    Example (Nemotron-3 Nano: h 2688, H 64, P 64, G 8, N 128, K 4): 27,697,152 + 30,720 + 192
    + 4,096 + 11,010,048 = 38,742,208.

    References
    ----------
    Megatron-Core ``ssm/mamba_mixer.py`` (``MambaMixer.__init__``: ``in_proj``,
    ``conv1d_weight`` / ``conv1d_bias``, ``dt_bias``, ``A_log``, ``D`` without
    ``D_has_hdim``, ``norm``, ``out_proj``; ``bias=False``, ``conv_bias=True``).
    """
    h, di, H = model.hidden_size, mamba_d_inner(model), mamba_heads(model)
    in_proj = h * mamba_in_proj_size(model)
    conv = mamba_conv_dim(model) * (model.mamba_conv_kernel + 1)
    return in_proj + conv + 3 * H + di + di * h


def hybrid_layer_params(model) -> float:
    """Parameters of the average layer of a hybrid pattern: ``(n_* attention + n_- MLP + n_E
    MoE block + n_M Mamba2 mixer) / L`` plus one pre-norm per layer (an integer when it
    divides)."""
    n = model.hybrid_layer_counts
    total = n["M"] * (mamba_params_per_layer(model) if n["M"] else 0)
    total += n["*"] * (model.attention_params_per_layer() if n["*"] else 0)
    total += n["-"] * model.mlp_params_per_layer()
    total += n["E"] * (model.moe_layer_params() if n["E"] else 0)
    avg = total / model.num_layers
    avg = int(avg) if float(avg).is_integer() else avg
    return avg + model.norm_params()


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
    from perfmodel.hardware.calibration import KERNEL_MIN_S

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


# --------------------------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------------------------
def mamba_activation_bytes(model, seq_len, micro_batch_size, *, tp=1, sequence_parallel=False,
                           bytes_per_value: float = 2.0, gemm_input_bytes=None, dropout=True):
    """Activation bytes one Mamba2 mixer keeps for the backward, per micro-batch and GPU (its
    pre-norm input not included): the ``in_proj`` input (``gi*sbh/r``), the ``in_proj``
    output ``zxBCdt`` and the ungated scan output ``out_x`` the fused kernel saves
    (``e*sb*(2di + 2GN + H + di)/t``), the gated output the RMSNorm saves (``e*sb*di/t``), the
    ``out_proj`` input (``gi*sb*di/t``) and the 1-byte dropout mask after it.

    Example (Nemotron-3 Nano, s 8192, b 1, tp 1, bf16, no dropout): 8192 * (2*2688 +
    2*(10304 + 4096) + 2*4096 + 2*4096) = 414,187,520 bytes.

    References
    ----------
    ``mamba_ssm`` ``MambaSplitConv1dScanCombinedFn.forward`` (``ctx.save_for_backward(zxbcdt,
    conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, ...)``; the conv output and chunk states
    are recomputed); Megatron-Core ``MambaMixer._ssm_training`` (``self.norm(y)``, ``out_proj``).
    """
    t, r, sb, e, gi = activation_operands(tp, sequence_parallel, seq_len, micro_batch_size,
                                          bytes_per_value, gemm_input_bytes)
    h, di = float(model.hidden_size), float(mamba_d_inner(model))
    mask = np.where(np.asarray(dropout, dtype=bool), 1.0, 0.0)
    return (gi * sb * h / r + e * sb * (mamba_in_proj_size(model) + di) / t + e * sb * di / t
            + gi * sb * di / t + mask * sb * h / r)


def hybrid_layer_activation_bytes(model, layer_bytes, seq_len, micro_batch_size, *, tp,
                                  sequence_parallel, recompute, bytes_per_value: float,
                                  gemm_input_bytes, dropout, ffn_hidden_size):
    """Activation bytes of the average layer of a hybrid pattern, per micro-batch and GPU, from
    the transformer layer's terms: ``layer_bytes(f)`` is
    :func:`perfmodel.memory.breakdown.layer_activation_bytes` at FFN size ``f`` (the configuration's
    recompute mode). With ``n`` one norm input (``e*sbh/r``), ``g`` an MLP's fc1 input and ``k``
    its dropout mask (``gi*sbh/r``, ``sbh/r``): the attention block is ``X(0) - 2n - g - k``,
    the MLP activations ``X(f) - X(0)``, so the average layer keeps ``n + a*(attention block) +
    (mlp share)*(g + k) + (X(f) - X(0)) + m*(Mamba2 mixer)``, with ``a`` the attention, ``m``
    the Mamba2 share of the layers and the effective FFN ``f`` over all layers
    (:func:`perfmodel.moe.experts.effective_ffn_size`). Full recompute keeps the layer input only."""
    _t, r, sb, e, gi = activation_operands(tp, sequence_parallel, seq_len, micro_batch_size,
                                           bytes_per_value, gemm_input_bytes)
    h = float(model.hidden_size)
    mask = np.where(np.asarray(dropout, dtype=bool), 1.0, 0.0)
    n, g, k = e * sb * h / r, gi * sb * h / r, mask * sb * h / r
    x0, xf = layer_bytes(0.0), layer_bytes(ffn_hidden_size)
    a, m = model.attention_layer_fraction, model.mamba_layer_fraction
    mlp_share = model.dense_mlp_fraction + model.moe_layer_fraction
    mamba = mamba_activation_bytes(model, seq_len, micro_batch_size, tp=tp,
                                   sequence_parallel=sequence_parallel, bytes_per_value=e,
                                   gemm_input_bytes=gemm_input_bytes, dropout=dropout)
    kept = n + a * (x0 - 2 * n - g - k) + mlp_share * (g + k) + (xf - x0) + m * mamba
    return np.where(np.asarray(recompute) == 2, n, kept)


# --------------------------------------------------------------------------------------------
# Parallelism
# --------------------------------------------------------------------------------------------
def unsupported_parallelism(model, tp, cp):
    """Per configuration, why a hybrid model cannot run it ('' when it can): tp must divide the
    Mamba2 heads and groups (``MambaMixer`` asserts ``nheads % tp == 0``, ``ngroups % tp ==
    0``); cp > 1 is not modelled (Megatron-Core's ``MambaContextParallel`` all-to-all is not
    priced here). Vectorised over ``tp`` / ``cp`` arrays; '' everywhere for a transformer."""
    tp = np.asarray(tp)
    cp = np.asarray(cp)
    out = np.full(np.broadcast(tp, cp).shape, "", dtype=object)
    if not model.is_hybrid or "M" not in model.hybrid_override_pattern:
        return out
    H, G = mamba_heads(model), model.mamba_num_groups
    bad_tp = (H % tp != 0) | (G % tp != 0)
    out = np.where(bad_tp, f"tp must divide mamba_num_heads ({H}) and mamba_num_groups ({G})",
                   out)
    return np.where(cp > 1, "cp > 1 with Mamba2 layers: Megatron-Core's MambaContextParallel "
                    "all-to-all is not modelled", out)


# --------------------------------------------------------------------------------------------
# Hugging Face config.json (NemotronHConfig)
# --------------------------------------------------------------------------------------------
_HF_HYBRID_INT_KEYS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                       "conv_kernel", "expand", "chunk_size",
                       "moe_shared_expert_intermediate_size", "n_routed_experts")


def hf_hybrid_fields(data: dict, name: str) -> dict:
    """Hybrid fields of a Hugging Face ``NemotronHConfig`` (Nemotron-H, Nemotron-3):
    ``hybrid_override_pattern``, ``mamba_num_heads``, ``mamba_head_dim``, ``ssm_state_size``,
    ``n_groups``, ``conv_kernel``, ``expand``, ``chunk_size``; the MLP activation
    ``mlp_hidden_act`` (``relu2``); no position embedding (NoPE attention); RMSNorm; MoE
    ``moe_shared_expert_intermediate_size`` (one shared expert of that size). Wrong JSON types
    raise SpecError naming the key; ``moe_latent_size`` (latent MoE) is refused."""
    from perfmodel.spec.specs import SpecError

    for key in _HF_HYBRID_INT_KEYS:
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SpecError(f"{name}: {key} = {v!r}: expected an integer")
    pattern = data["hybrid_override_pattern"]
    if not isinstance(pattern, str):
        raise SpecError(f"{name}: hybrid_override_pattern = {pattern!r}: expected a string")
    if data.get("moe_latent_size"):
        raise SpecError(f"{name}: moe_latent_size = {data['moe_latent_size']!r}: latent MoE "
                        "(Nemotron-3 Super / Ultra: routed experts in a projected space) is not "
                        "modelled")
    keys = {"mamba_num_heads": "mamba_num_heads", "mamba_head_dim": "mamba_head_dim",
            "ssm_state_size": "mamba_state_dim", "n_groups": "mamba_num_groups",
            "conv_kernel": "mamba_conv_kernel", "expand": "mamba_expand",
            "chunk_size": "mamba_chunk_size"}
    # NemotronHRMSNorm everywhere (the config names its epsilon norm_eps, not rms_norm_eps)
    out = {"hybrid_override_pattern": pattern, "position_embedding": "none", "norm": "rmsnorm"}
    out.update({ours: int(data[k]) for k, ours in keys.items() if data.get(k) is not None})
    act = data.get("mlp_hidden_act")
    if act is not None:
        if act not in ("relu2", "silu", "gelu"):
            raise SpecError(f"{name}: mlp_hidden_act = {act!r}: expected relu2, silu or gelu")
        # NemotronHMLP is up -> act -> down, never gated: two matrices for any activation
        out["activation"] = "relu2" if act == "relu2" else "gelu"
    shared = data.get("moe_shared_expert_intermediate_size")
    if shared and "E" in pattern:
        out["num_shared_experts"] = 1
        out["moe_shared_ffn_hidden_size"] = int(shared)
    return out
