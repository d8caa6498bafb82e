"""Context parallelism by K/V all-gather: each rank gathers the whole sequence's K and V before
its attention and reduce-scatters dK, dV after the backward.

Transformer Engine's ``AttnFuncWithCPAndKVAllGather`` (Megatron-Core ``cp_comm_type =
"all_gather"``; its docstring: "KV all-gather between CP ranks is exposed", after Llama 3,
Sec. 3.3.2):

* **forward**: ``gather_along_first_dim(k)`` then ``(v)`` over the cp group (synchronous:
  ``async_op=False`` on the current stream), reordered into sequence order
  (``index_select`` by ``get_seq_chunk_ids_for_reordering_before_attn``); then the rank's two
  query chunks (the load-balanced split, chunks ``r`` and ``2cp - 1 - r``) attend to the
  gathered K/V prefix they see, on two streams. The streams overlap the two attention steps
  with each other, not with the gather: nothing hides it. Only the local K and V are saved
  for the backward.
* **backward**: K and V are gathered again, the two steps' dK / dV accumulate into full-
  sequence ``dk`` / ``dv`` buffers (``torch.zeros((k_shape[0] * cp_size, ...))``), reordered
  back and reduce-scattered (``reduce_scatter_along_first_dim``, synchronous) to the owners.
  Full recompute (and selective recompute of the attention core) re-runs the forward's two
  gathers.

Every collective carries ``(cp - 1)/cp`` of the full-sequence K (or V) of one layer; Megatron-
Core ``TransformerConfig.cp_comm_type``: "The all-gather is not async, and cannot be
overlapped". The attention does the ring's work (``s/cp`` queries of every head against the
keys before them), priced once by the step model for all types.

Memory: the gathered K and V of the layer being computed, and in the backward the full-
sequence dK and dV beside them (:func:`allgather_buffer_bytes`), transient (one layer at a
time).

References
----------
NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py`` @ d0067d0da6cb01811b8072a7d304f0e00344ce2b (``AttnFuncWithCPAndKVAllGather``,
``attn_forward_func_with_cp``) and ``transformer_engine/pytorch/distributed.py``
(``gather_along_first_dim``, ``reduce_scatter_along_first_dim``); NVIDIA/Megatron-LM
``megatron/core/transformer/transformer_config.py`` @ d98e8a64ddf34856e74b24714e3bedb2f5a39553
(``cp_comm_type``); Llama Team 2024, "The Llama 3 Herd of Models", Sec. 3.3.2
(arXiv:2407.21783).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["allgather_buffer_bytes", "allgather_layer_s"]


def allgather_layer_s(cp: ArrayLike, kv_gather_s: ArrayLike, dkv_scatter_s: ArrayLike,
                      recompute_forward: ArrayLike, attention_fraction: float = 1.0
                      ) -> np.ndarray:
    """Exposed all-gather time of one (average) layer and micro-batch [s]; 0 at cp = 1.

    ``kv_gather_s``: the all-gathers of K and V together; ``dkv_scatter_s``: the reduce-
    scatters of dK and dV together; ``recompute_forward``: whether the backward re-runs the
    forward's gathers; ``attention_fraction``: the share of layers with attention. Forward
    ``gather``, backward ``gather + scatter``, none hidden.

    Example: cp 4, 1 ms to gather K and V, 1.2 ms to reduce-scatter dK and dV, no recompute:
    1 + 1 + 1.2 = 3.2 ms; with full recompute 4.2 ms.
    """
    cp = np.asarray(cp, dtype=np.float64)
    gather = np.asarray(kv_gather_s, dtype=np.float64)
    scatter = np.asarray(dkv_scatter_s, dtype=np.float64)
    passes = 2.0 + np.where(np.asarray(recompute_forward, dtype=bool), 1.0, 0.0)
    return np.where(cp > 1, float(attention_fraction) * (passes * gather + scatter), 0.0)


def allgather_buffer_bytes(cp: ArrayLike, kv_chunk_bytes: ArrayLike) -> np.ndarray:
    """Transient buffers of the all-gather attention of one layer on one GPU [bytes]: the
    gathered K and V (``cp`` chunks of this rank's K/V, ``kv_chunk_bytes`` = K and V of its
    ``b * s/cp`` tokens) and, in the backward, the full-sequence dK and dV beside them:
    ``2 * cp * kv_chunk_bytes``; 0 at cp = 1. (The forward's reordering copies hold at most
    one more gathered tensor for a moment: below the backward's.)

    Example: cp 8, 4 MiB of K/V a rank: 2 x 8 x 4 = 64 MiB.
    """
    cp = np.asarray(cp, dtype=np.float64)
    return np.where(cp > 1, 2.0 * cp * np.asarray(kv_chunk_bytes, dtype=np.float64), 0.0)
