"""Hierarchical context parallelism (``cp_comm = "a2a+p2p"``): Ulysses all-to-all inside an
inner group of ``A`` cp ranks, ring attention across the ``P = cp / A`` inner groups.

Megatron-Core splits the cp group by ``--hierarchical-context-parallel-sizes A P``
(``parallel_state.create_hierarchical_groups``: the inner groups are ``A`` consecutive cp
ranks, the outer ones stride by ``A``) and passes both groups to Transformer Engine, whose
``AttnFuncWithCPAndKVP2P`` runs the a2a part around the ring:

* **forward**: ``flash_attn_a2a_communicate`` of Q, K, V over the inner group ("communicate
  for the 'a2a' part of 'a2a+p2p'"): each rank now holds ``s/P`` tokens of ``1/A`` of its
  heads; the ring of :mod:`perfmodel.comm.cp_ring` over the outer group, ``P`` steps of ``1/P``
  of the attention each, sends of the same K/V chunk bytes as the flat ring at ``cp``
  (``s/P`` tokens of ``1/A`` of the K/V heads); the output's all-to-all back.
* **backward**: the all-to-all of dO, the ring's backward over the outer group, the
  all-to-all of dQ, dK, dV.

So the exposed time is the Ulysses all-to-alls of an ``A``-rank group
(:func:`perfmodel.comm.cp_a2a.a2a_layer_s`) plus what the ring of ``P`` leaves exposed under
its blocks (:func:`perfmodel.comm.cp_ring.ring_layer_s`), each priced on its own group's tier:
the all-to-all on NVLink where the inner group fits the node, the ring's sends across it.
Heads need to split over ``A`` only (:func:`perfmodel.parallel.config.a2a_heads_ok` at
``A``); Transformer Engine falls back to plain ``"a2a"`` / ``"p2p"`` when ``P`` / ``A`` is 1.

References
----------
NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py`` @ d0067d0da6cb01811b8072a7d304f0e00344ce2b (``AttnFuncWithCPAndKVP2P``:
``cp_group_a2a``, ``cp_size_a2a``; ``attn_forward_func_with_cp``); NVIDIA/Megatron-LM
@ d98e8a64ddf34856e74b24714e3bedb2f5a39553 ``megatron/core/parallel_state.py``
(``create_hierarchical_groups``), ``megatron/core/model_parallel_config.py``
(``hierarchical_context_parallel_sizes``: "the first value of the list indicates the group size
of the a2a communication type, and the second value indicates the group size of the p2p
communication type"), ``megatron/core/extensions/transformer_engine.py``
(``TEDotProductAttention``: ``cp_comm_type == "a2a+p2p"``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.comm import cp_a2a, cp_ring

__all__ = ["hierarchical_layer_s", "ring_size"]


def ring_size(cp: ArrayLike, cp_a2a_size: ArrayLike) -> np.ndarray:
    """The outer (ring) size ``P = cp / A`` of hierarchical context parallelism (at least 1).

    Example: cp 16, A 4: P = 4.
    """
    cp = np.asarray(cp, dtype=np.float64)
    a = np.maximum(np.asarray(cp_a2a_size, dtype=np.float64), 1.0)
    return np.maximum(cp / a, 1.0)


def hierarchical_layer_s(cp: ArrayLike, cp_a2a_size: ArrayLike, attn_fwd_s: ArrayLike,
                         attn_bwd_s: ArrayLike, kv_send_s: ArrayLike, kv_dkv_send_s: ArrayLike,
                         qkv_a2a_s: ArrayLike, out_a2a_s: ArrayLike,
                         recompute_forward: ArrayLike, slowdown: float,
                         attention_fraction: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Exposed communication of one (average) layer and the slowdown of the attention that
    hides the ring's sends [s], as ``(cp_comm_s, cp_overlap_s)``; both 0 at cp = 1.

    ``cp_a2a_size``: the inner group ``A``; ``kv_send_s`` / ``kv_dkv_send_s``: one ring send
    (K/V; K/V with dK/dV) on the outer group; ``qkv_a2a_s`` / ``out_a2a_s``: the all-to-alls
    of Q, K, V together and of the output on the inner group; the rest as
    :func:`perfmodel.comm.cp_ring.ring_layer_s`. ``a2a_layer_s(A) + ring_layer_s(cp / A)``.

    Example: cp 8, A 4 (ring of 2), attention 4 ms forward and 8 ms backward (blocks of 2 and
    4 ms), 3 ms sends, all-to-alls of 0.5 ms (Q, K, V) and 0.25 ms (output), no recompute, no
    slowdown: the ring leaves 3 - 2 = 1 ms of its one forward send exposed, none of its two
    backward sends; the all-to-alls 2 x 0.75 = 1.5 ms: 2.5 ms.
    """
    cp = np.asarray(cp, dtype=np.float64)
    p = ring_size(cp, cp_a2a_size)
    ring_exp, ring_slow = cp_ring.ring_layer_s(p, attn_fwd_s, attn_bwd_s, kv_send_s,
                                               kv_dkv_send_s, recompute_forward, slowdown,
                                               attention_fraction)
    a2a = cp_a2a.a2a_layer_s(cp_a2a_size, qkv_a2a_s, out_a2a_s, recompute_forward,
                             attention_fraction)
    on = cp > 1
    return np.where(on, ring_exp + a2a, 0.0), np.where(on, ring_slow, 0.0)
