"""Context parallelism by all-to-all (Ulysses): Q, K, V and the output exchanged by head.

DeepSpeed-Ulysses (Jacobs et al. 2023, Sec. 3) and Transformer Engine's
``AttnFuncWithCPAndQKVOA2A`` (Megatron-Core ``cp_comm_type = "a2a"``) keep the sequence split
over the ``cp`` ranks outside attention, as the ring does, and switch to a split by head for
the attention core:

* **forward**: an all-to-all of Q, K and V (``flash_attn_a2a_communicate`` with
  ``a2a_input_names=["q", "k", "v"]``: three ``all_to_all_single`` calls, "gather s and split
  h") turns each rank's ``s/cp`` tokens of all its heads into all ``s`` tokens of ``1/cp`` of
  its heads; one attention kernel runs over the whole sequence; an all-to-all of the output
  (``["out"]``) turns it back.
* **backward**, the mirror: an all-to-all of dO (``["dout"]``), the attention backward, an
  all-to-all of dQ, dK, dV (``["dq", "dk", "dv"]``). Full recompute (or selective recompute of
  the attention core) re-runs the forward's two.

Each all-to-all sends ``(cp-1)/cp`` of its buffer from every rank (Jacobs et al. 2023, Sec.
3.2: "communication volume per link of ``M/P``"), priced on the cp group's placement by
:func:`perfmodel.moe.experts.all_to_all_tiered_time` (the members in the GPU's NVLink domain
over NVLink, the others through its own port of the outer tier). The exchanges sit between
the projections and the attention kernel that need their result: nothing hides them (unlike
the ring's sends under the attention blocks, :mod:`perfmodel.comm.cp_ring`).

The attention kernel does the same work as the ring's steps together (``1/cp`` of the heads
over ``s`` tokens, causal, versus ``s/cp`` queries of every head over ``s`` keys): the step
model prices it once, as the full causal kernel over ``cp``, for both. The ring's bookkeeping
kernels (fp32 merges of partial outputs, half-tensor copies) do not run; the all-to-all has
its own reshapes instead (:func:`a2a_reshape_bytes`). Activation memory is the ring's: the
saved Q, K, V and output hold the same elements split by head instead of by token.

Constraint: ``cp`` divides the query heads and the K/V heads of a tensor-parallel rank
(:func:`perfmodel.parallel.config.a2a_heads_ok`).

References
----------
Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme
Long Sequence Transformer Models", Sec. 3 (arXiv:2309.14509); NVIDIA/TransformerEngine
``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``
(``AttnFuncWithCPAndQKVOA2A``, ``flash_attn_a2a_communicate``); deepspeedai/DeepSpeed
``deepspeed/sequence/layer.py`` (``DistributedAttention``: ``_SeqAllToAll`` of query, key and
value before the local attention and of the context after it).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["a2a_buffer_bytes", "a2a_layer_s", "a2a_reshape_bytes"]


def a2a_buffer_bytes(tokens: ArrayLike, q_heads: ArrayLike, kv_heads: ArrayLike,
                     qk_head_dim: float, v_head_dim: float, act_b: float
                     ) -> dict[str, np.ndarray]:
    """The buffers one rank sends through the all-to-alls of one attention layer [bytes]
    (before the split by head: this rank's ``tokens = b * s/cp`` of its tensor-parallel heads).

    Returns ``q``, ``k``, ``v`` (``tokens * heads * head dim * act_b``; K and V over the K/V
    heads ``kv_heads``) and ``out`` (the query heads at the V head dimension). The backward's
    dQ, dK, dV and dO are the same sizes.

    Example: 4096 tokens, 8 query and 2 K/V heads of 128, bf16: Q 8 MiB, K = V 2 MiB,
    out 8 MiB.
    """
    t = np.asarray(tokens, dtype=np.float64)
    q = np.asarray(q_heads, dtype=np.float64)
    kv = np.asarray(kv_heads, dtype=np.float64)
    a = float(act_b)
    return {"q": t * q * qk_head_dim * a, "k": t * kv * qk_head_dim * a,
            "v": t * kv * v_head_dim * a, "out": t * q * v_head_dim * a}


def a2a_layer_s(cp: ArrayLike, qkv_a2a_s: ArrayLike, out_a2a_s: ArrayLike,
                recompute_forward: ArrayLike, attention_fraction: float = 1.0) -> np.ndarray:
    """Exposed all-to-all time of one (average) layer and micro-batch [s]; 0 at cp = 1.

    ``qkv_a2a_s``: the all-to-alls of Q, K and V together (the backward's dQ, dK, dV take the
    same); ``out_a2a_s``: that of the output (and of dO); ``recompute_forward``: whether the
    backward re-runs the forward's two; ``attention_fraction``: the share of layers with
    attention. Forward ``qkv + out``, backward ``out + qkv``, none hidden (Jacobs et al. 2023,
    Sec. 3: the all-to-alls surround the attention computation that needs their result).

    Example: cp 4, 1.5 ms for Q, K, V and 1 ms for the output, no recompute: 2 x 2.5 = 5 ms.
    """
    cp = np.asarray(cp, dtype=np.float64)
    one = np.asarray(qkv_a2a_s, dtype=np.float64) + np.asarray(out_a2a_s, dtype=np.float64)
    passes = 2.0 + np.where(np.asarray(recompute_forward, dtype=bool), 1.0, 0.0)
    return np.where(cp > 1, float(attention_fraction) * passes * one, 0.0)


def a2a_reshape_bytes(buffers: dict[str, ArrayLike], cp: ArrayLike, pass_: str
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Memory-bound copies around the all-to-alls of one attention layer, as ``(bytes,
    kernels)`` (0 at cp = 1): ``flash_attn_a2a_communicate`` makes each tensor contiguous with
    its head groups first before sending (``x.movedim(head_dim, 0).contiguous()``) and reorders
    what it receives (``reorder_seq_chunks_for_a2a_before_attn`` / ``..._after_attn``, an
    ``index_select``): two copies (read + write) of each of the four tensors, forward (Q, K, V,
    out) and backward (dO, dQ, dK, dV) alike.

    Example: buffers of 8, 2, 2 and 8 MiB: 4 x 20 = 80 MiB in 8 kernels.
    """
    del pass_  # the backward mirrors the forward
    cp = np.asarray(cp, dtype=np.float64)
    total = sum(np.asarray(buffers[k], dtype=np.float64) for k in ("q", "k", "v", "out"))
    on = cp > 1
    return np.where(on, 2.0 * 2.0 * total, 0.0), np.where(on, 8.0, 0.0)
