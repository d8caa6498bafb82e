"""The model-FLOP formulas frameworks report TFLOP/s with, to turn a published TFLOP/s/GPU back
into a step time.

A benchmark that publishes only "model TFLOP/s per GPU" measured
``F(batch) / (step time * GPUs)`` with the framework's own ``F``; with that ``F`` the step time
is ``F(batch) / (TFLOP/s * GPUs)`` exactly. The planner's own FLOP count (:mod:`perfmodel.compute.flops`)
differs from each framework's (router, causal halving, MTP, sliding windows), so the framework's
formula is mirrored here term by term.

References
----------
Megatron-LM ``megatron/training/training.py`` ``num_floating_point_operations``: the 2024 form
(MCore v0.8 / v0.9: ``12*B*s*L*h^2*((1 + g/n + s/h)*q/h + f/h*k*gated + V/(2*L*h))``, full
non-causal attention, no shared experts, no MLA) and the 2025 ``transformer_flops`` (MoE layer
pattern, shared experts, MLA, MTP, causal core attention halved); Megatron-Bridge
``src/megatron/bridge/training/utils/flop_utils.py`` ``num_floating_point_operations`` (the same
2025 form). Narayanan et al. 2021, Appendix "Floating-point operations".
"""

from __future__ import annotations

from typing import Literal

from perfmodel.compute.mamba import megatron_mamba_flops_per_token
from perfmodel.spec.specs import ModelSpec

__all__ = ["megatron_flops_per_token", "megatron_hybrid_flops_per_token", "megatron_padded_vocab",
           "step_time_from_tflops"]


def megatron_padded_vocab(vocab_size: int, tp: int = 1, divisible_by: int = 128) -> int:
    """Vocabulary padded as Megatron pads it (``_vocab_size_with_padding``: up to a multiple of
    ``make_vocab_size_divisible_by * tp``); the logit term of the FLOP count uses it."""
    m = divisible_by * tp
    return -(-vocab_size // m) * m


def _last_layer_is_moe(model: ModelSpec) -> bool:
    if not model.is_moe:
        return False
    offset = model.num_layers - 1 - model.moe_dense_layers
    return offset >= 0 and offset % model.moe_layer_freq == model.moe_layer_freq - 1


def megatron_flops_per_token(model: ModelSpec, seq_len: int, *, tp: int = 1,
                             mtp_layers: int = 0,
                             form: Literal["2024", "2025"] = "2025") -> float:
    """Training FLOPs per token (forward + backward, ``3 x`` forward) as Megatron counts them.

    ``form="2025"`` mirrors Megatron-LM / Megatron-Bridge ``transformer_flops`` (late 2025 on):
    per token ``6*h*(3 f n_dense + (3 f_e k + 3 f_s) n_moe)`` (SwiGLU; ``2`` matrices without
    gating) over the dense / MoE layer pattern, the MTP layers counted as one more layer of the
    last layer's kind; attention ``6*(L+mtp)*(projections + s/2*heads*(d_qk + d_v))`` (causal:
    half the score and value products), with MLA's projections ``q_lora*(h + n*(d+d_r) + 1) +
    kv_lora*(h + n*(d + d_v) + 1) + h*d_r + n*d_v*h`` and GQA's ``h*(q + 2*kv) + q*h``; the MTP
    norms and ``eh`` projection ``6*mtp*(3h + 2h^2)``; logits ``6*h*V_pad*(1 + mtp)``. The
    router is not counted.

    ``form="2024"`` mirrors the MCore v0.8 / v0.9 formula: every layer alike,
    ``12*L*h^2*((1 + g/n + s/h)*q/h + f_e/h*k*gated) + 6*h*V_pad`` per token, with full
    (non-causal) attention, no shared experts, no MLA and no MTP (``gated`` = 3/2 for SwiGLU).
    """
    if model.is_hybrid:
        return megatron_hybrid_flops_per_token(model, seq_len, tp=tp, mtp_layers=mtp_layers)
    h, L, s = model.hidden_size, model.num_layers, float(seq_len)
    nh = model.num_attention_heads
    V = megatron_padded_vocab(model.vocab_size, tp)
    q_proj = model.head_size * nh
    g = model.kv_heads
    if form == "2024":
        if model.is_mla or mtp_layers:
            raise ValueError("the 2024 Megatron FLOP formula has no MLA or MTP terms")
        gated = 1.5 if model.gated_mlp else 1.0
        k = model.moe_top_k if model.is_moe else 1
        f = model.expert_ffn_size if model.is_moe else model.ffn_hidden_size
        return 12.0 * L * h * h * ((1.0 + g / nh + s / h) * q_proj / h + f / h * k * gated) + (
            6.0 * h * V)
    if form != "2025":
        raise ValueError(f"form {form!r}: expected '2024' or '2025'")
    mats = 3 if model.gated_mlp else 2
    n_moe = model.num_moe_layers
    n_dense = L - n_moe
    if _last_layer_is_moe(model):
        n_moe += mtp_layers
    else:
        n_dense += mtp_layers
    layers = L + mtp_layers
    mlp = 6.0 * h * (model.ffn_hidden_size * mats * n_dense + (
        model.expert_ffn_size * model.moe_top_k + model.shared_ffn_size) * mats * n_moe
        if model.is_moe else model.ffn_hidden_size * mats * (n_dense + n_moe))
    if model.is_mla:
        d, dr, dv = model.head_size, model.qk_rope_head_dim, model.v_head_size
        q_term = (model.q_lora_rank * (h + nh * (d + dr) + 1) if model.q_lora_rank
                  else h * nh * (d + dr))
        proj = q_term + model.kv_lora_rank * (h + nh * (d + dv) + 1) + h * dr + nh * dv * h
        core = s * nh * (d + dr) / 2.0 + s * nh * dv / 2.0
    else:
        kv_proj = model.head_size * g
        proj = h * (q_proj + 2 * kv_proj) + q_proj * h
        core = q_proj * s / 2.0 * 2.0
    attn = 6.0 * layers * (proj + core)
    mtp = 6.0 * mtp_layers * (3.0 * h + 2.0 * h * h)
    logits = 6.0 * h * V * (1 + mtp_layers)
    return mlp + attn + mtp + logits


def megatron_hybrid_flops_per_token(model: ModelSpec, seq_len: int, *, tp: int = 1,
                                    mtp_layers: int = 0) -> float:
    """Training FLOPs per token of a hybrid Mamba2 model as Megatron counts them
    (``num_floating_point_operations`` -> ``hybrid_flops``, ``3 x`` forward): per layer letter,
    attention ``4h p (h + h g/n + s/2)`` (``p = kv_channels * n / h``, causal half of the
    scores), MLP ``4 f h`` (x 3/2 gated), MoE ``4h (f_e k + f_s)`` (x 3/2 gated; no router),
    Mamba ``2h(2 d_in + 2GN + H) + 7 d_in N + 2 d_in h`` with ``d_in = 2h``
    (:func:`perfmodel.compute.mamba.megatron_mamba_flops_per_token`), logits ``2 h V_pad (1 + mtp)``.

    Example: Nemotron-3 Nano at s 8192 gives 22.3 GFLOP per token, which the Megatron-Bridge
    26.02.01 rows' TFLOP/s over tokens/s reproduce (798e12 / 35861 = 22.25e9).
    """

    h, s, nh, g = model.hidden_size, float(seq_len), model.num_attention_heads, model.kv_heads
    n = model.hybrid_layer_counts
    scale = 1.5 if model.gated_mlp else 1.0
    p = model.head_size * nh / h
    attn = 4.0 * h * p * (h + h * g / nh + s / 2.0)
    mlp = 4.0 * model.ffn_hidden_size * h * scale
    moe = 4.0 * h * (model.expert_ffn_size * model.moe_top_k + model.shared_ffn_size) * scale
    V = megatron_padded_vocab(model.vocab_size, tp)
    fwd = (n["*"] * attn + n["-"] * mlp + n["E"] * (moe if model.is_moe else 0.0)
           + n["M"] * megatron_mamba_flops_per_token(model) + 2.0 * h * V * (1 + mtp_layers))
    return 3.0 * fwd


def step_time_from_tflops(tflops_per_gpu: float, flops_per_token: float, global_batch: int,
                          seq_len: int, gpus: int) -> float:
    """Step time [s] a published model-TFLOP/s per GPU implies:
    ``GBS * s * F_token / (TFLOP/s * 1e12 * GPUs)`` (the framework logs
    ``F(batch) / (elapsed * world_size)``)."""
    return global_batch * seq_len * flops_per_token / (tflops_per_gpu * 1e12 * gpus)
