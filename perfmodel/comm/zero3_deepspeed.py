"""DeepSpeed ZeRO-3 as it ran in 2021: per-parameter collectives, one sub-module prefetched,
a host synchronisation before every sub-module (``TrainingSpec.zero3_gather = "tensor"``).

What the 2021 releases (DeepSpeed 0.3.13 - 0.4.x, the ZeRO-3 baseline of Narayanan et al.
2021, SC21, Sec. 5.3 / Table 2) did, from their source:

* ``partition_parameters.py``: every parameter is gathered by its own ``all_gather`` (a list
  of ``world_size`` partitions) and its gradient reduced by its own ``reduce_scatter``; a
  parameter with fewer than ``stage3_param_persistence_threshold`` (1e5) elements is
  persistent (never partitioned): the biases and norms of a transformer layer, so only its
  weight matrices move (:func:`gathered_weights_numel`).
* ``stage3.py`` ``pre_sub_module_forward_function`` / ``..._backward_function``: before each
  sub-module, ``fetch_sub_module`` gathers (or waits for) its parameters and ends in
  ``_synchronize_communication`` (``comm_stream.synchronize(); torch.cuda.synchronize()``);
  then ``prefetch_next_sub_modules`` launches the gather of the next parameters in the
  recorded trace, at least one whole tensor (``get_params_to_prefetch`` stops once the
  ``stage3_prefetch_bucket_size`` is reached, and one weight of these models exceeds it). So a
  sub-module's compute overlaps only the gather of the next weight, and the step is the sum
  over sub-modules of ``max(compute, next gather)`` (:func:`pass_exposed_s`).
* gradient reduce-scatters run on the reduction stream after the sub-module's backward, and
  the next sub-module's ``torch.cuda.synchronize()`` waits for them: exposed in full.
* ``release_sub_module`` keeps a parameter gathered when the trace reuses it within
  ``stage3_max_reuse_distance`` (1e9) elements: with full recompute, a layer's recomputed
  forward runs right before its backward, so the last weights of the layer stay gathered for
  the backward (:func:`kept_for_backward`); without recompute the backward regathers all.
* ``torch.distributed.all_gather`` / ``reduce_scatter`` over the whole data-parallel world:
  the six Table 2 rows (GPT 175B / 530B on 384-2240 A100) are met at the bus bandwidth of one
  rail, one HDR NIC per GPU (25 GB/s, the cluster's scale-out tier), and its 8 us latency: a
  free fit of both to the six rows gives 24.6 GB/s and 7.8 us. The multi-rail ring that
  Megatron's own all-reduces reach (8 x 25 GB/s per node, :mod:`perfmodel.parallel.topology`) would
  predict the 530B rows 15-17 % fast and cannot give the measured floor (doubling the GPUs
  at a fixed global batch leaves the step time unchanged, 768 -> 1536 and 1120 -> 2240 GPUs).
  Modelled as :func:`rail_bandwidth_bytes_per_s`.

Not modelled: the embedding / output weight (under 0.5 % of these models' parameters) and
the first step's trace recording.

References
----------
microsoft/DeepSpeed ``deepspeed/runtime/zero/stage3.py`` (``PartitionedParameterCoordinator``,
``PrefetchCoordinator``, ``persistence_threshold``) and ``partition_parameters.py``
(``_allgather_param``, ``_reduce_scatter_gradient``), releases of March-June 2021;
DeepSpeed config docs (``stage3_max_reuse_distance`` 1e9, ``stage3_param_persistence_threshold``
1e5, ``stage3_prefetch_bucket_size`` 5e7); Narayanan et al. 2021, SC21, Sec. 5.3, Table 2.
"""

from __future__ import annotations

import numpy as np

from perfmodel.comm.comm_volume import param_bytes_per_elem
from perfmodel.core.codes import Recompute
from perfmodel.hardware import collectives as coll
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.topology import GroupPlacement
from perfmodel.spec.specs import ModelSpec, TrainingSpec

__all__ = [
    "MAX_REUSE_DISTANCE_NUMEL",
    "PERSISTENCE_THRESHOLD_NUMEL",
    "collective_times_s",
    "exposed_times_s",
    "gathered_weights_numel",
    "kept_for_backward",
    "link_times_s",
    "pass_exposed_s",
    "rail_bandwidth_bytes_per_s",
]

#: ``stage3_param_persistence_threshold``: smaller parameters stay whole on every GPU.
PERSISTENCE_THRESHOLD_NUMEL = 1e5
#: ``stage3_max_reuse_distance``: a parameter reused within this many elements stays gathered.
MAX_REUSE_DISTANCE_NUMEL = 1e9


def gathered_weights_numel(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Elements of each partitioned weight of one layer on one tensor-parallel rank, in forward
    order (QKV, attention output, MLP input (gate and up fused, Megatron layout), MLP output),
    shape ``(configs, 4)``; weights under :data:`PERSISTENCE_THRESHOLD_NUMEL` count 0."""
    h = float(model.hidden_size)
    hd = float(model.head_size)
    qkv = h * (model.num_attention_heads * hd + 2 * model.kv_heads * hd)
    proj = model.num_attention_heads * hd * h
    ffn = float(model.ffn_hidden_size)
    fc1 = h * ffn * (2.0 if model.gated_mlp else 1.0)
    fc2 = ffn * h
    w = np.array([qkv, proj, fc1, fc2])[None, :] / batch.tp.astype(np.float64)[:, None]
    return np.where(w >= PERSISTENCE_THRESHOLD_NUMEL, w, 0.0)


def kept_for_backward(numel: np.ndarray, batch: ConfigBatch) -> np.ndarray:
    """Bool ``(configs, 4)``: the weight stays gathered from the recomputed forward to its
    backward: under full recompute, when the weights used in between (those after it in the
    layer) hold fewer than :data:`MAX_REUSE_DISTANCE_NUMEL` elements. Without recompute the
    forward and the backward of a layer are the whole rest of the model apart: none is kept."""
    after = np.cumsum(numel[:, ::-1], axis=1)[:, ::-1] - numel
    full = (batch.recompute == Recompute.FULL)[:, None]
    return full & (after < MAX_REUSE_DISTANCE_NUMEL) & (numel > 0)


def rail_bandwidth_bytes_per_s(group: GroupPlacement) -> np.ndarray:
    """Bus bandwidth of DeepSpeed 2021's ZeRO-3 collectives [bytes/s]: one GPU's own port of the
    outermost tier the group crosses (one rail), not the multi-rail ring (module docstring)."""
    return np.where(group.inter_size > 1, group.inter_bw_bytes_per_s, group.bw_bytes_per_s)


def collective_times_s(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                       group: GroupPlacement) -> tuple[np.ndarray, np.ndarray]:
    """``(gather_s, reduce_scatter_s)``, each ``(configs, 4)``: one ring all-gather of each
    weight and one ring reduce-scatter of its gradient (16-bit: DeepSpeed's fp16 / bf16 ZeRO
    keeps and reduces gradients in the model dtype) over the data-parallel group, at
    :func:`rail_bandwidth_bytes_per_s` and the group's latency, each with NCCL's fixed cost
    (:func:`perfmodel.hardware.collectives.collective_base_s`). A weight of 0 elements costs 0."""
    numel = gathered_weights_numel(model, batch)
    nbytes = numel * param_bytes_per_elem(training)
    n = group.size[:, None]
    bw = rail_bandwidth_bytes_per_s(group)[:, None]
    lat = group.latency_s[:, None]
    base = coll.collective_base_s(n)  # NCCL's fixed cost of each call
    gather = np.where(numel > 0, coll.all_gather_time(nbytes, n, bw, lat) + base, 0.0)
    rs = np.where(numel > 0, coll.reduce_scatter_time(nbytes, n, bw, lat) + base, 0.0)
    return gather, rs


def _passes(batch: ConfigBatch) -> np.ndarray:
    """Forward-like passes per micro-batch that gather every weight: 2 with full recompute
    (forward, recomputed forward), else 1."""
    return np.where(batch.recompute == Recompute.FULL, 2.0, 1.0)


def link_times_s(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                 group: GroupPlacement, layers: np.ndarray) -> dict[str, np.ndarray]:
    """Per step, the link time of the parameter gathers (``gather_s``: forward, recomputed
    forward and the backward's regathers) and of the gradient reduce-scatters
    (``reduce_scatter_s``) of ``layers`` layers, every micro-batch."""
    g, r = collective_times_s(model, training, batch, group)
    kept = kept_for_backward(gathered_weights_numel(model, batch), batch)
    m = batch.num_microbatches.astype(np.float64)
    per_mb = _passes(batch) * g.sum(axis=1) + np.where(kept, 0.0, g).sum(axis=1)
    return {"gather_s": m * layers * per_mb, "reduce_scatter_s": m * layers * r.sum(axis=1)}


def pass_exposed_s(compute_s: np.ndarray, next_gather_s: np.ndarray) -> np.ndarray:
    """Exposed gather time of one pass through one layer [s]: each sub-module's compute
    (``compute_s``, ``(configs, k)``) overlaps the gather of the next weight
    (``next_gather_s``, same shape); what the gather takes beyond the compute is exposed:
    ``sum_j max(0, g_next_j - c_j)``."""
    return np.maximum(next_gather_s - compute_s, 0.0).sum(axis=1)


def exposed_times_s(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                    group: GroupPlacement, layer_fwd_s: np.ndarray, layer_bwd_s: np.ndarray,
                    layer_recompute_s: np.ndarray, layers: np.ndarray
                    ) -> dict[str, np.ndarray]:
    """Per step, what DeepSpeed 2021's ZeRO-3 adds to the compute of ``layers`` layers [s]:
    ``gather_exposed_s`` (gathers beyond the compute they overlap, every pass) and
    ``reduce_scatter_s`` (the gradient reduce-scatters, exposed in full).

    A layer's forward (and recomputed forward, and backward) time is split over its four
    weight sub-modules by their share of the layer's GEMM FLOPs (proportional to their
    elements); in the forward the next weight is the next in forward order (the last one's:
    the next layer's QKV), in the backward the next in reverse order, and a weight kept for the
    backward (:func:`kept_for_backward`) is not gathered again.
    """
    g, r = collective_times_s(model, training, batch, group)
    numel = gathered_weights_numel(model, batch)
    share = numel / np.maximum(numel.sum(axis=1, keepdims=True), 1e-30)
    kept = kept_for_backward(numel, batch)
    g_fwd_next = np.roll(g, -1, axis=1)
    g_bwd = np.where(kept, 0.0, g)
    g_bwd_next = np.roll(g_bwd, 1, axis=1)  # backward runs fc2, fc1, proj, qkv
    fwd = pass_exposed_s(layer_fwd_s[:, None] * share, g_fwd_next)
    rec = np.where(batch.recompute == Recompute.FULL,
                   pass_exposed_s(layer_recompute_s[:, None] * share, g_fwd_next), 0.0)
    bwd = pass_exposed_s(layer_bwd_s[:, None] * share, g_bwd_next)
    m = batch.num_microbatches.astype(np.float64)
    return {"gather_exposed_s": m * layers * (fwd + rec + bwd),
            "reduce_scatter_s": m * layers * r.sum(axis=1)}
