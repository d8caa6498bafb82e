"""Activations of hybrid Mamba2 stacks: what one Mamba2 mixer keeps for the backward, and the
average layer of a hybrid pattern built from the transformer layer's terms."""

from __future__ import annotations

import numpy as np

from perfmodel.memory.operands import activation_operands
from perfmodel.spec.hybrid import mamba_d_inner, mamba_in_proj_size


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
