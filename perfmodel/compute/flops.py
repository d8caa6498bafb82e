"""FLOP counts of a training step, under the conventions the published runs use.

Conventions (see ``validation/README.md`` of the shared data):

* **Megatron 96-formula** (Narayanan et al. 2021, Sec. 5.1):
  ``96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))``. Counts the extra forward of full recompute, so a
  "% of peak" computed with it is a hardware-FLOP utilisation.
* **Model FLOPs** (Korthikanti et al. 2022, Eq. 7): ``72*B*L*s*h^2*(1 + s/(6h) + V/(12*h*L))``,
  no recompute.
* **Hardware FLOPs with selective recompute** (Korthikanti et al. 2022, Eq. 8):
  ``72*B*L*s*h^2*(1 + s/(3h) + V/(12*h*L))``.
* **General count** (:func:`model_flops_per_step`), used for MFU: 2 FLOPs per multiply-add of
  every weight matrix (q, k, v with GQA, output projection, the MLP's 2 or 3 matrices times the
  MoE top-k, the logit layer), plus the attention scores and weighted sum ``4*s*heads*head_dim``
  per token per layer, all times 3 (forward, data gradient, weight gradient). Attention is
  counted **non-causal** by default (the full ``s x s`` square, as NeMo / Megatron report it);
  ``causal=True`` halves the attention term. Embedding lookups, norms, biases, activations and
  softmax are not counted. For a GPT model this reproduces Eq. 7 exactly. Hybrid Mamba2
  models (:mod:`perfmodel.compute.mamba`): attention in its share of the layers, the Mamba2 in_proj /
  out_proj GEMMs and the SSD scan's chunk matmuls (Dao & Gu 2024, Sec. 6) in theirs; the
  conv1d and norms are not counted. (Megatron-LM's ``hybrid_flops``, which the published
  TFLOP/s use, takes ``d_in = 2h`` and a ``7 d_in N`` scan: ``perfmodel.compute.framework_flops``.)
"""

from __future__ import annotations

import numpy as np

from perfmodel.compute.mamba import mamba_matmul_flops_per_token, ssd_flops_per_token
from perfmodel.core.codes import Recompute
from perfmodel.spec.specs import ModelSpec, TrainingSpec

__all__ = [
    "hardware_flops_per_step",
    "korthikanti_model_flops",
    "korthikanti_selective_hardware_flops",
    "layer_attention_flops_per_token",
    "layer_matmul_flops_per_token",
    "logits_flops_per_token",
    "megatron_96_flops",
    "model_flops_per_step",
]



def megatron_96_flops(batch_size, seq_len, num_layers, hidden_size, vocab_size):
    """FLOPs per iteration, Megatron's 96-formula (counts full-recompute forward).

    ``F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))``

    References
    ----------
    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM" (SC21), Sec. 5.1 / Appendix.
    """
    B, s, l, h, V = (np.asarray(x, dtype=np.float64) for x in
                     (batch_size, seq_len, num_layers, hidden_size, vocab_size))
    return 96.0 * B * s * l * h**2 * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def korthikanti_model_flops(batch_size, seq_len, num_layers, hidden_size, vocab_size):
    """Model FLOPs per iteration (no recompute): ``72*B*L*s*h^2*(1 + s/(6h) + V/(12hL))``.

    References
    ----------
    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    Eq. 7.
    """
    B, s, L, h, V = (np.asarray(x, dtype=np.float64) for x in
                     (batch_size, seq_len, num_layers, hidden_size, vocab_size))
    return 72.0 * B * L * s * h**2 * (1.0 + s / (6.0 * h) + V / (12.0 * h * L))


def korthikanti_selective_hardware_flops(batch_size, seq_len, num_layers, hidden_size, vocab_size):
    """Hardware FLOPs per iteration with selective recompute:
    ``72*B*L*s*h^2*(1 + s/(3h) + V/(12hL))``.

    The ``s/(3h)`` term doubles the attention term of Eq. 7 (three more forward-sized attention
    passes, where recomputing the attention core forward adds one); the published HFU values
    (Megatron-LM README: 22B 43.7 %, 175B 52.8 %) use it, so we keep it for comparisons.
    :func:`hardware_flops_per_step` counts the one extra forward instead.

    References
    ----------
    Korthikanti et al. 2022, Eq. 8.
    """
    B, s, L, h, V = (np.asarray(x, dtype=np.float64) for x in
                     (batch_size, seq_len, num_layers, hidden_size, vocab_size))
    return 72.0 * B * L * s * h**2 * (1.0 + s / (3.0 * h) + V / (12.0 * h * L))


def layer_matmul_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one layer's weight GEMMs [FLOP].

    ``2*h*(heads*d + 2*kv*d) + 2*heads*d*h + top_k * 2*h*f*(3 if gated else 2)``
    (the MoE router, ``2*h*E``, is added when ``num_experts > 1``).

    References
    ----------
    Narayanan et al. 2021, Sec. 5.1 (``24*h^2`` per token for GPT); Ainslie et al. 2023 (GQA).
    """
    h, d, nh, kv, f = (model.hidden_size, model.head_size, model.num_attention_heads,
                       model.kv_heads, model.ffn_hidden_size)
    mats = 3 if model.gated_mlp else 2
    if model.is_mla:  # MLA projections: 2 FLOPs per weight (DeepSeek-V2 Sec. 2.1)
        attn = 2.0 * model.mla_params_per_layer()
    else:
        qkv = 2.0 * h * (nh + 2 * kv) * d  # fused q, k, v projection
        proj = 2.0 * nh * d * h  # attention output projection
        attn = qkv + proj
    if model.is_hybrid:  # attention and Mamba2 in their shares of the layers (perfmodel.compute.mamba)

        attn = model.attention_layer_fraction * attn + model.mamba_layer_fraction * (
            mamba_matmul_flops_per_token(model))
        if not model.is_moe:
            return attn + model.dense_mlp_fraction * 2.0 * h * f * mats
    if not model.is_moe:
        return attn + 2.0 * h * f * mats  # fc1 (+gate), fc2
    # MoE: active experts only (top-k routed + shared) and the router, in the MoE layers;
    # the dense MLP in the others (averaged over the layers).
    phi = model.moe_layer_fraction
    moe = 2.0 * h * mats * (model.moe_top_k * model.expert_ffn_size + model.shared_ffn_size)
    router = 2.0 * h * model.num_experts
    return attn + phi * (moe + router) + model.dense_mlp_fraction * 2.0 * h * f * mats


def layer_attention_flops_per_token(model: ModelSpec, seq_len, causal: bool = False):
    """Forward FLOPs per token of one layer's attention scores and weighted sum [FLOP]:
    ``4*s*heads*head_dim`` (``QK^T`` and ``PV``), halved when ``causal``.

    References
    ----------
    Narayanan et al. 2021, Sec. 5.1 (the ``s/(6h)`` term); Dao 2023 (FlashAttention-2) Sec. 4.1
    (causal halves the work).
    """
    s = np.asarray(seq_len, dtype=np.float64)
    # QK^T over the q/k head size, PV over the value head size (equal without MLA)
    dims = model.qk_head_size + model.v_head_size
    out = 2.0 * s * model.num_attention_heads * dims * (0.5 if causal else 1.0)
    if model.is_hybrid:  # attention in its share of the layers, plus the Mamba2 SSD scan

        out = model.attention_layer_fraction * out + model.mamba_layer_fraction * (
            ssd_flops_per_token(model) + 0.0 * s)
    return out


def logits_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the logit layer: ``2*h*V``."""
    return 2.0 * model.hidden_size * model.vocab_size


def model_flops_per_step(model: ModelSpec, training: TrainingSpec, causal: bool = False) -> float:
    """Model FLOPs of one optimizer step (global batch), no recompute.

    ``3 * tokens * (L * (matmul + attention) + logits)`` per token forward FLOPs (see the module
    docstring for what is counted). Non-causal attention by default (NeMo's convention).

    References
    ----------
    Korthikanti et al. 2022, Eq. 7 (equal for GPT models); Kaplan et al. 2020, Sec. 2.1 (6N).
    """
    s = training.seq_len
    per_token = (
        model.num_layers * (layer_matmul_flops_per_token(model)
                            + layer_attention_flops_per_token(model, s, causal))
        + logits_flops_per_token(model)
    )
    return float(3.0 * training.tokens_per_step * per_token)


def hardware_flops_per_step(
    model: ModelSpec, training: TrainingSpec, recompute, causal: bool = False
) -> np.ndarray:
    """FLOPs the GPUs execute per step: model FLOPs plus recomputed forward work.

    ``recompute`` (array of codes, 0 none / 1 selective / 2 full): full adds one forward of every
    layer (not of the logit layer), selective adds one forward of the attention core
    (``4*s*heads*d`` per token per layer). Same convention as the 96-formula for full recompute;
    for selective, see :func:`korthikanti_selective_hardware_flops` for the paper's Eq. 8.

    References
    ----------
    Narayanan et al. 2021, Sec. 5.1; Korthikanti et al. 2022, Sec. 5.
    """
    rc = np.asarray(recompute)
    tokens = float(training.tokens_per_step)
    L = model.num_layers
    attn = layer_attention_flops_per_token(model, training.seq_len, causal)
    layer = layer_matmul_flops_per_token(model) + attn
    extra = np.where(rc == Recompute.FULL, L * layer,
                     np.where(rc == Recompute.SELECTIVE, L * attn, 0.0))
    return model_flops_per_step(model, training, causal) + tokens * extra
