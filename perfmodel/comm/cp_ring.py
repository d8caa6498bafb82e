"""Context-parallel ring attention: what the K/V exchange leaves exposed after the attention
kernels hide it.

Transformer Engine's ``AttnFuncWithCPAndKVP2P`` (``cp_comm_type = "p2p"``, the Megatron-Core
default: ``TEDotProductAttention`` passes ``"p2p"`` when ``cp_comm_type`` is None, and no
Megatron-Bridge / NeMo performance recipe of the validation rows sets another) splits one
layer's attention into ``cp`` steps and overlaps each step's point-to-point exchange with the
attention kernel of the current step ("Split attention compute into multiple steps, and overlap
current-step compute with next-step communication", its docstring):

* **forward**, ``for i in range(cp_size + 1)``: step ``i`` waits for K/V chunk ``i``, posts the
  send / receive of chunk ``i + 1`` (``flash_attn_p2p_communicate``) and runs block ``i``; the
  ``cp - 1`` sends each run under one block, the last block has no send behind it. Blocks
  alternate between two streams (``flash_attn_streams``, "to resolve wave quantization"), so a
  block waits for its K/V only, not for the previous block.
* **backward**, ``for i in range(cp_size)``: step ``i`` posts its send, runs the block's
  backward and waits for the send before the dK/dV correction. Step 0 sends K/V, the middle
  steps K/V and the accumulated dK/dV in one buffer (twice the bytes), the last step dK/dV:
  ``cp`` sends, ``2(cp - 1)`` chunks, each under one block's backward.
* **load-balanced causal split**: the sequence is cut in ``2 cp`` chunks and rank ``r`` holds
  chunks ``r`` and ``2cp - 1 - r`` (``get_seq_chunk_ids_for_reordering_before_attn``). Step 0 is
  the diagonal tile (both local chunks, causal); a step with K/V from an earlier rank
  (``i <= rank``) attends all local queries to the first K/V half, one from a later rank the
  second query half to all K/V (``fused_attn_fwd`` with ``max_seqlen_kv // 2`` or the second
  half of ``q``, no mask). Every step is half of an ``(s/cp)^2`` square, the same work as the
  causal diagonal, so each step is ``1/cp`` of the layer's attention on this GPU.

Per step the exposed time is ``max(0, send - block)``; what runs under the block slows it by the
overlap slowdown of NCCL kernels holding SMs (:func:`perfmodel.hardware.overlap.overlap_slowdown_s`).
The ring also adds memory-bound bookkeeping that one attention kernel does not have: contiguous
copies of the half tensors, the per-step merge of the partial outputs (fp32) and the
accumulation of dQ, dK, dV (:func:`ring_bookkeeping`, priced with the layer's kernels).

The other ``cp_comm_type`` values have modules of their own: ``"all_gather"`` gathers the whole
K/V before attention (:mod:`perfmodel.comm.cp_allgather`), ``"a2a"`` (Ulysses) exchanges Q, K, V
and the output by head before and after attention (:mod:`perfmodel.comm.cp_a2a`), and
``"a2a+p2p"`` runs this ring over the outer level of a hierarchical group
(:mod:`perfmodel.comm.cp_hierarchical`).

References
----------
NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py`` (``AttnFuncWithCPAndKVP2P``; ``transformer_engine/pytorch/attention.py``
in releases before 2.0); NVIDIA/Megatron-LM ``megatron/core/extensions/transformer_engine.py``
(``TEDotProductAttention``: ``cp_comm_type``) and ``megatron/core/transformer/
transformer_config.py`` (``cp_comm_type``); Liu et al. 2023, "Ring Attention with Blockwise
Transformers", Sec. 3 (a send hides under a block when the block is at least as long).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.hardware import overlap

__all__ = ["ring_backward_s", "ring_bookkeeping", "ring_forward_s", "ring_layer_s"]


def _steps(cp: ArrayLike) -> np.ndarray:
    return np.asarray(cp, dtype=np.float64)


def ring_forward_s(cp: ArrayLike, kv_send_s: ArrayLike, block_s: ArrayLike
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The forward ring of one attention layer [s], as ``(exposed, hidden)``: ``cp - 1`` K/V
    sends, each under one block of ``block_s``; exposed ``(cp-1) * max(0, send - block)``,
    hidden ``(cp-1) * min(send, block)``.

    Example: cp 4, a 2 ms send under 1.5 ms blocks leaves 3 x 0.5 = 1.5 ms exposed and hides
    3 x 1.5 = 4.5 ms.
    """
    n = np.maximum(_steps(cp) - 1.0, 0.0)
    send = np.asarray(kv_send_s, dtype=np.float64)
    block = np.asarray(block_s, dtype=np.float64)
    return n * np.maximum(send - block, 0.0), n * np.minimum(send, block)


def ring_backward_s(cp: ArrayLike, kv_send_s: ArrayLike, kv_dkv_send_s: ArrayLike,
                    block_s: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The backward ring of one attention layer [s], as ``(exposed, hidden)``: ``cp`` sends,
    each under one block's backward of ``block_s``: K/V at step 0, dK/dV at the last step (one
    chunk each, ``kv_send_s``), K/V and dK/dV together at the ``cp - 2`` steps between
    (``kv_dkv_send_s``). 0 at cp = 1.

    Example: cp 4, 1 ms and 1.9 ms sends under 1.2 ms blocks: exposed 2 x 0 + 2 x 0.7 = 1.4 ms,
    hidden 2 x 1 + 2 x 1.2 = 4.4 ms.
    """
    cp = _steps(cp)
    ends = np.where(cp > 1, 2.0, 0.0)
    middle = np.maximum(cp - 2.0, 0.0)
    one = np.asarray(kv_send_s, dtype=np.float64)
    two = np.asarray(kv_dkv_send_s, dtype=np.float64)
    block = np.asarray(block_s, dtype=np.float64)
    exposed = ends * np.maximum(one - block, 0.0) + middle * np.maximum(two - block, 0.0)
    hidden = ends * np.minimum(one, block) + middle * np.minimum(two, block)
    return exposed, hidden


def ring_layer_s(cp: ArrayLike, attn_fwd_s: ArrayLike, attn_bwd_s: ArrayLike,
                 kv_send_s: ArrayLike, kv_dkv_send_s: ArrayLike, recompute_forward: ArrayLike,
                 slowdown: float, attention_fraction: float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Exposed ring exchange of one (average) layer and the slowdown of the attention that
    hides the rest [s], as ``(cp_comm_s, cp_overlap_s)``; both 0 at cp = 1.

    ``attn_fwd_s`` / ``attn_bwd_s``: the layer's attention core on this GPU (the step model's
    kernel times, :func:`perfmodel.compute.layer.compute_times`), ``1/cp`` of it per ring step;
    ``recompute_forward``: whether the backward re-runs the forward ring (full recompute);
    ``attention_fraction``: the share of layers with attention (hybrid models; the times are
    averages over all layers, the ring runs in the attention layers only).
    """
    cp = _steps(cp)
    a = float(attention_fraction)
    if a <= 0.0:
        zero = np.zeros_like(cp * np.asarray(attn_fwd_s, dtype=np.float64))
        return zero, zero
    steps = np.maximum(cp, 1.0)
    block_f = np.asarray(attn_fwd_s, dtype=np.float64) / a / steps
    block_b = np.asarray(attn_bwd_s, dtype=np.float64) / a / steps
    fwd_exp, fwd_hid = ring_forward_s(cp, kv_send_s, block_f)
    bwd_exp, bwd_hid = ring_backward_s(cp, kv_send_s, kv_dkv_send_s, block_b)
    passes = 1.0 + np.where(np.asarray(recompute_forward, dtype=bool), 1.0, 0.0)
    exposed = passes * fwd_exp + bwd_exp
    hidden = passes * fwd_hid + bwd_hid
    window = passes * (cp - 1.0) * block_f + cp * block_b  # the blocks with a send under them
    slow = overlap.overlap_slowdown_s(hidden, np.maximum(window, 0.0), slowdown)
    on = cp > 1
    return np.where(on, a * exposed, 0.0), np.where(on, a * slow, 0.0)


def ring_bookkeeping(cp: ArrayLike, q_elems: ArrayLike, out_elems: ArrayLike,
                     kv_bytes: ArrayLike, act_b: float, v_head_dim: float, pass_: str
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory-bound kernels the ring adds to one attention layer on its busiest rank, as
    ``(copy_bytes, add_bytes, kernels)`` (0 at cp = 1). ``q_elems`` / ``out_elems``: this
    GPU's query and output elements (``b * s/cp * heads/tp * head dim``), ``kv_bytes`` its K/V
    chunk, ``act_b`` bytes per 16-bit element, ``v_head_dim`` the output head dimension (rows of
    softmax statistics: ``out_elems / v_head_dim``); partial outputs are merged in fp32.

    Forward (``AttnFuncWithCPAndKVP2P.forward``, non-fp8, ``bshd`` / ``sbhd``), the last rank,
    whose ``cp - 1`` off-diagonal steps all use the first K/V half: each copies that half
    contiguous (``k_part.contiguous()``, read + write, ``kv_bytes``) and merges its output into
    the fp32 result (``flash_attn_fwd_out_correction``: read fp32 out, read the step's output,
    write, ``(8 + a) E``) and its softmax statistics (fp32, 12 bytes per query row and head);
    step 0 initialises the result (``(4 + a) E``) and the end casts it back (``(4 + a) E``).

    Backward (``AttnFuncWithCPAndKVP2P.backward``), rank 0, whose ``cp - 1`` steps before the
    diagonal use the second query half: each copies ``q``, ``out`` and ``dout`` halves contiguous
    (``a (Q + 2E)``); dQ (16-bit, ``dq_buffer``) gets a half copy at step 0, a half add at the
    ``cp - 2`` middle steps and a copy + add at the last (``a Q (1.5 cp + 0.5)``); dK/dV are
    added into the received buffer each step (``(3 cp - 1.5) kv_bytes``, read + read + write) after
    the initial copy of K/V into the send buffer (``2 kv_bytes``).

    Example: cp 2, ``Q = E = 1e6`` elements, ``kv_bytes = 1e6``, bf16, head dim 128: forward
    copies 1 MB, adds 12 + 10 MB + 12 x 1e6/128 B = 22.09 MB; backward copies 6 + 2 MB, adds
    7 + 4.5 MB.

    References
    ----------
    NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py`` (``AttnFuncWithCPAndKVP2P``, ``flash_attn_fwd_out_correction``,
    ``flash_attn_fwd_softmax_lse_correction``).
    """
    cp = _steps(cp)
    n = np.maximum(cp - 1.0, 0.0)
    q = np.asarray(q_elems, dtype=np.float64)
    e = np.asarray(out_elems, dtype=np.float64)
    kv = np.asarray(kv_bytes, dtype=np.float64)
    a = float(act_b)
    on = cp > 1
    if pass_ == "fwd":
        rows = e / float(v_head_dim)
        copy = n * kv
        add = 2.0 * (4.0 + a) * e + n * ((8.0 + a) * e + 12.0 * rows)
        kernels = 2.0 * n + cp + n + 1.0  # k, v halves; merges (step 0 incl.); statistics; cast
    else:
        copy = n * a * (q + 2.0 * e) + 2.0 * kv
        add = a * q * (1.5 * cp + 0.5) + (3.0 * cp - 1.5) * kv
        kernels = 3.0 * n + 1.0 + cp + 2.0 * cp  # halves; K/V copy; dQ; dK + dV
    return (np.where(on, copy, 0.0), np.where(on, add, 0.0), np.where(on, kernels, 0.0))
