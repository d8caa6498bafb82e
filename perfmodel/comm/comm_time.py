"""Communication times: the volumes of :mod:`perfmodel.comm.comm_volume` priced on the cluster's
tiers (:mod:`perfmodel.parallel.topology`) with the collective models of :mod:`perfmodel.hardware.collectives`.

These are link times (the time the collective takes if nothing else runs); how much of each is
hidden behind computation is decided by the step model. For the data-parallel gradient reduction
this module gives the bucketed-overlap model, :func:`exposed_dp_time_s`.

References
----------
See :mod:`perfmodel.hardware.collectives`, :mod:`perfmodel.parallel.topology`, :mod:`perfmodel.comm.comm_volume`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.comm import zero3_deepspeed
from perfmodel.comm.comm_volume import (
    CollectiveOp,
    activation_bytes_per_elem,
    cp_a2a_buffers,
    cp_kv_chunk_bytes,
    cp_sends_per_layer,
    dp_ops,
    expert_dp_ops,
    params_per_gpu,
    pp_activation_bytes,
    tp_activation_bytes,
    tp_collectives_per_layer,
    zero_op_counts,
)
from perfmodel.core.codes import CpComm, Recompute
from perfmodel.hardware import collectives as coll
from perfmodel.moe import expert_layout
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.topology import GroupPlacement, group_placement, parallel_groups
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = [
    "DDP_BUCKET_MIN_PARAMS",
    "all_reduce_auto_time",
    "collective_once_s",
    "comm_times",
    "dp_num_buckets",
    "exposed_dp_time_s",
    "link_busy_s",
    "op_time",
    "shared_link_excess_s",
    "stream_busy_in_window_s",
    "window_share_s",
]

DDP_BUCKET_MIN_PARAMS = 40_000_000  # Megatron-core DDP default bucket: max(40M, 1M * dp) params


def all_reduce_auto_time(size_bytes: ArrayLike, group: GroupPlacement) -> np.ndarray:
    """All-reduce time [s] on a placed group: fastest of flat ring, flat tree and hierarchical;
    where the group's tier carries a measured nccl-tests bus bandwidth, the ring at that bus
    bandwidth instead (the measurement already is NCCL's choice of algorithm on those links).

    References
    ----------
    :func:`perfmodel.hardware.collectives.all_reduce_time` (``algorithm="auto"``); NCCL-tests
    ``doc/PERFORMANCE.md`` (``busbw = algbw * 2(n-1)/n``, so ``t = 2(n-1)/n * S / busbw``).
    """
    measured = group.measured_bw_bytes_per_s("all_reduce")
    if np.isfinite(measured).any():
        at_busbw = coll.ring_all_reduce_time(size_bytes, group.size, group.bw_for("all_reduce"),
                                             group.latency_s)
        return np.where(np.isfinite(measured), at_busbw, _all_reduce_analytic_s(size_bytes, group))
    return _all_reduce_analytic_s(size_bytes, group)


def _all_reduce_analytic_s(size_bytes: ArrayLike, group: GroupPlacement) -> np.ndarray:
    """Fastest of flat ring, flat tree and hierarchical all-reduce on the analytic bandwidths."""
    ring = coll.ring_all_reduce_time(size_bytes, group.size, group.bw_bytes_per_s, group.latency_s)
    tree = coll.tree_all_reduce_time(size_bytes, group.size, group.bw_bytes_per_s, group.latency_s)
    hier = coll.hierarchical_all_reduce_time(
        size_bytes,
        group.intra_size,
        group.inter_size,
        group.intra_bw_bytes_per_s,
        group.inter_bw_bytes_per_s,
        group.intra_latency_s,
        group.inter_latency_s,
    )
    return np.minimum(np.minimum(ring, tree), hier)


def collective_once_s(op: CollectiveOp, group: GroupPlacement) -> np.ndarray:
    """Time [s] of one collective of ``op.buffer_bytes`` on ``group`` (all-reduce: the
    fastest algorithm; all-gather / reduce-scatter: ring at the group's bandwidth, or at the
    measured bus bandwidth, :meth:`GroupPlacement.bw_for`), with NCCL's fixed cost of the call
    (:func:`perfmodel.hardware.collectives.collective_base_s`); ``op.count`` is not read."""
    if op.collective == "all_reduce":
        one = all_reduce_auto_time(op.buffer_bytes, group)
    else:
        one = coll.collective_time(
            op.collective, op.buffer_bytes, group.size, group.bw_for(op.collective),
            group.latency_s
        )
    return one + coll.collective_base_s(group.size)  # NCCL's fixed cost of each call


def op_time(op: CollectiveOp, group: GroupPlacement) -> np.ndarray:
    """Time [s] of ``op.count`` collectives of ``op.buffer_bytes`` on ``group``
    (:func:`collective_once_s` each)."""
    return np.where(op.count > 0, op.count * collective_once_s(op, group), 0.0)


def comm_times(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, batch: ConfigBatch
) -> dict[str, np.ndarray]:
    """Link times of every communication of a configuration [s].

    Returns
    -------
    dict of arrays
        ``tp_layer_fwd_s``, ``tp_layer_bwd_s``: tensor-parallel collectives of one layer and one
        micro-batch (the backward includes the recomputed forward's under full recomputation);
        ``cp_layer_fwd_s``, ``cp_layer_bwd_s``: ring-attention K/V exchanges of one layer and one
        micro-batch (link time of the ``cp - 1`` ring sends; backward incl. recompute; what the
        attention hides of them: :mod:`perfmodel.comm.cp_ring`); ``cp_kv_send_s``: one K/V chunk
        sent to the next ring rank, ``cp_kv_dkv_send_s``: K/V and dK/dV together (0 at cp = 1);
        ``cp_qkv_a2a_s``, ``cp_out_a2a_s``: the Ulysses all-to-alls of Q, K, V and of the
        output, rows with ``cp_comm = "a2a"`` (:mod:`perfmodel.comm.cp_a2a`; the
        ``cp_layer_*`` link times are then theirs) and ``"a2a+p2p"`` (on the inner group;
        the ring's sends then run on the outer group, :mod:`perfmodel.comm.cp_hierarchical`);
        ``cp_kv_gather_s``, ``cp_dkv_scatter_s``: the all-gathers of K and V and the
        reduce-scatters of dK and dV, rows with ``cp_comm = "allgather"``
        (:mod:`perfmodel.comm.cp_allgather`);
        ``pp_p2p_s``: one activation send of one micro-batch between adjacent stages;
        ``dp_grad_s``: per step, the gradient all-reduce, or reduce-scatter(s) + parameter
        all-gather under ZeRO-1/2, or the reduce-scatters under ZeRO-3;
        ``zero3_gather_s``: per step, ZeRO-3 parameter all-gathers (forward and backward of every
        micro-batch).

    References
    ----------
    Module docstrings of :mod:`perfmodel.comm.comm_volume` (what is sent) and
    :mod:`perfmodel.parallel.topology` (at what bandwidth).
    """
    # Each term is computed once per distinct value of the fields it reads
    # (:meth:`ConfigBatch.per_distinct`; search batches repeat them many times over), in the
    # order below: MoE, one layer's TP and CP, the pipeline send, the data-parallel reduction.
    ep = (batch.per_distinct(_COMM_FIELDS, lambda b: moe_comm_times(model, training, cluster, b))
          if model.is_moe else moe_comm_times(model, training, cluster, batch))
    layer = batch.per_distinct(_LAYER_COMM_FIELDS,
                               lambda b: _layer_comm_times(model, training, cluster, b))
    pp = batch.per_distinct(_PP_COMM_FIELDS, lambda b: _pp_comm_times(model, training, cluster, b))
    if training.zero3_gather == "tensor":
        dp = batch.per_distinct(_COMM_FIELDS, lambda b: _dp_comm_times(model, training, cluster, b))
    else:
        dp = _dp_comm_times_from_counts(model, training, cluster, batch)
    return {**ep, **layer, **pp, **dp}


def _layer_comm_times(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                      batch: ConfigBatch) -> dict[str, np.ndarray]:
    """The tensor- and context-parallel link times of one layer and one micro-batch [s]
    (:func:`comm_times`' ``tp_*`` and ``cp_*`` terms; reads :data:`_LAYER_COMM_FIELDS`)."""
    groups = parallel_groups(cluster, batch, ("tp", "cp"))
    g_tp, g_cp = groups["tp"], groups["cp"]
    # tensor parallel: all-reduce, or all-gather + reduce-scatter with sequence parallelism
    act = tp_activation_bytes(model, training, batch)
    ar = all_reduce_auto_time(act, g_tp)
    ag_rs = coll.all_gather_time(act, g_tp.size, g_tp.bw_for("all_gather"), g_tp.latency_s) + (
        coll.reduce_scatter_time(act, g_tp.size, g_tp.bw_for("reduce_scatter"), g_tp.latency_s)
    )
    # each collective also pays NCCL's fixed cost (launch and setup), on the critical path of
    # every layer when not overlapped: one all-reduce, or an all-gather and a reduce-scatter
    ar = ar + coll.collective_base_s(g_tp.size)
    ag_rs = ag_rs + coll.collective_base_s(g_tp.size, 2.0)
    tp_one = np.where(batch.sequence_parallel, ag_rs, ar)
    tp_fwd_n, tp_bwd_n = tp_collectives_per_layer(batch, model)

    # context parallel: ring sends of the K/V chunk to the next rank (the backward's middle
    # steps send K/V and the accumulated dK/dV together: two chunks, perfmodel.comm.cp_ring)
    kv_bytes = cp_kv_chunk_bytes(model, training, batch)
    kv_send = coll.p2p_time(kv_bytes, g_cp.p2p_bw_bytes_per_s, g_cp.latency_s)
    kv_dkv_send = coll.p2p_time(2.0 * kv_bytes, g_cp.p2p_bw_bytes_per_s, g_cp.latency_s)
    kv_send, kv_dkv_send = _hierarchical_ring_sends(model, training, cluster, batch, kv_send,
                                                    kv_dkv_send)
    cp_fwd_n, cp_bwd_n = cp_sends_per_layer(batch)
    return {
        "tp_layer_fwd_s": tp_fwd_n * tp_one,
        "tp_layer_bwd_s": tp_bwd_n * tp_one,
        **_cp_link_times(model, training, cluster, batch, g_cp, kv_send, cp_fwd_n, cp_bwd_n),
        "cp_kv_send_s": np.where(batch.cp > 1, kv_send, 0.0),
        "cp_kv_dkv_send_s": np.where(batch.cp > 1, kv_dkv_send, 0.0),
    }


def _pp_comm_times(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                   batch: ConfigBatch) -> dict[str, np.ndarray]:
    """``pp_p2p_s``: one send between neighbouring pipeline stages [s] (reads
    :data:`_PP_COMM_FIELDS`)."""
    g_pp = parallel_groups(cluster, batch, ("pp",))["pp"]
    pp_send = coll.p2p_time(
        pp_activation_bytes(model, training, batch), g_pp.p2p_bw_bytes_per_s, g_pp.latency_s
    )
    return {"pp_p2p_s": np.where(batch.pp > 1, pp_send, 0.0)}


def _dp_comm_times(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                   batch: ConfigBatch) -> dict[str, np.ndarray]:
    """``dp_grad_s`` and ``zero3_gather_s`` [s] of :func:`comm_times` with DeepSpeed's ZeRO-3 of
    2021 (``zero3_gather = "tensor"``): :func:`_dp_comm_times_from_counts`, where ZeRO-3 runs
    one gather and one reduce-scatter per weight matrix on one rail instead
    (:mod:`perfmodel.comm.zero3_deepspeed`; every field of :data:`_COMM_FIELDS`)."""
    out = _dp_comm_times_from_counts(model, training, cluster, batch)
    g_dp = parallel_groups(cluster, batch, ("dp_cp",))["dp_cp"]
    ds = zero3_deepspeed.link_times_s(model, training, batch, g_dp, model.num_layers / batch.pp)
    z3 = batch.zero_stage == 3
    rs = op_time(dp_ops(model, training, batch)["grad_reduce_scatter"], g_dp)
    return {"dp_grad_s": np.where(z3, out["dp_grad_s"] - rs + ds["reduce_scatter_s"],
                                  out["dp_grad_s"]),
            "zero3_gather_s": np.where(z3, ds["gather_s"], out["zero3_gather_s"])}


def _dp_once_times(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                   batch: ConfigBatch) -> dict[str, np.ndarray]:
    """One collective of each data-parallel kind (:func:`dp_ops`) on the dp x cp group [s], and
    the ring's latency ``ring_latency_s`` (reads :data:`_DP_ONCE_FIELDS`: the counts are
    :func:`zero_op_counts`')."""
    g_dp = parallel_groups(cluster, batch, ("dp_cp",))["dp_cp"]
    out = {k: collective_once_s(op, g_dp) for k, op in dp_ops(model, training, batch).items()}
    out["ring_latency_s"] = coll.all_gather_time(0.0, g_dp.size, g_dp.bw_bytes_per_s,
                                                 g_dp.latency_s) + coll.collective_base_s(g_dp.size)
    return out


def _dp_comm_times_from_counts(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                               batch: ConfigBatch) -> dict[str, np.ndarray]:
    """``dp_grad_s`` and ``zero3_gather_s`` [s] of :func:`comm_times`, data parallel over the
    dp x cp group, as counts x one collective: the collective once per distinct buffer and group
    (:func:`_dp_once_times`), the counts (:func:`zero_op_counts`) per configuration. ZeRO-3
    gathers are issued per layer (FSDP2): each extra collective pays the ring's latency
    ``(n-1)*alpha`` and NCCL's fixed cost once more."""
    once = batch.per_distinct(_DP_ONCE_FIELDS,
                              lambda b: _dp_once_times(model, training, cluster, b))
    counts = zero_op_counts(batch)

    def times(k):  # op_time, from the spread single collective
        return np.where(counts[k] > 0, counts[k] * once[k], 0.0)

    dp_grad = sum(times(k) for k in counts if k != "zero3_param_all_gather")
    gathers_per_pass = model.num_layers / batch.pp
    zero3 = times("zero3_param_all_gather") + counts["zero3_param_all_gather"] * np.maximum(
        gathers_per_pass - 1, 0) * (once["ring_latency_s"])
    return {"dp_grad_s": np.asarray(dp_grad, dtype=np.float64), "zero3_gather_s": zero3}


def _cp_link_times(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                   batch: ConfigBatch, g_cp: GroupPlacement, kv_send: np.ndarray,
                   cp_fwd_n: np.ndarray, cp_bwd_n: np.ndarray) -> dict[str, np.ndarray]:
    """Context-parallel link times of one layer and micro-batch [s]: ``cp_layer_fwd_s`` /
    ``cp_layer_bwd_s`` (the ring's sends, or the collectives of the other ``cp_comm`` types;
    backward incl. a recomputed forward), ``cp_qkv_a2a_s`` / ``cp_out_a2a_s``: the all-to-alls
    of Q, K, V together and of the output (Ulysses rows on the cp group, hierarchical rows on
    their inner group; :func:`perfmodel.moe.experts.all_to_all_tiered_time`,
    :mod:`perfmodel.comm.cp_a2a`), ``cp_kv_gather_s`` / ``cp_dkv_scatter_s``: the all-gathers
    of K and V and the reduce-scatters of dK and dV of the all-gather rows
    (:mod:`perfmodel.comm.cp_allgather`); 0 elsewhere and at cp = 1. Hierarchical rows also
    replace ``cp_kv_send_s`` / ``cp_kv_dkv_send_s`` with the ring's sends on their outer group
    (:mod:`perfmodel.comm.cp_hierarchical`)."""
    zero = np.zeros(len(batch))
    out = {"cp_layer_fwd_s": cp_fwd_n * kv_send, "cp_layer_bwd_s": cp_bwd_n * kv_send,
           "cp_qkv_a2a_s": zero, "cp_out_a2a_s": zero, "cp_kv_gather_s": zero,
           "cp_dkv_scatter_s": zero}
    on = batch.cp > 1
    rerun = np.where(batch.recompute == Recompute.FULL, 1.0, 0.0)
    a2a = (batch.cp_comm == CpComm.A2A) & on
    hier = (batch.cp_comm == CpComm.A2A_P2P) & on
    if np.any(a2a | hier):
        # the all-to-all group: the cp group, or the hierarchy's inner cp_a2a ranks (stride tp)
        g_a2a = group_placement(cluster, np.where(hier, batch.cp_a2a, batch.cp), batch.tp)
        buf = cp_a2a_buffers(model, training, batch)
        qkv = sum(moe.all_to_all_tiered_time(buf[k], g_a2a) for k in ("q", "k", "v"))
        one = moe.all_to_all_tiered_time(buf["out"], g_a2a)
        both = a2a | hier
        ring_f = np.where(hier, out["cp_layer_fwd_s"], 0.0)
        ring_b = np.where(hier, out["cp_layer_bwd_s"], 0.0)
        out["cp_layer_fwd_s"] = np.where(both, qkv + one + ring_f, out["cp_layer_fwd_s"])
        out["cp_layer_bwd_s"] = np.where(both, (1.0 + rerun) * (qkv + one) + ring_b,
                                         out["cp_layer_bwd_s"])
        out["cp_qkv_a2a_s"] = np.where(both, qkv, 0.0)
        out["cp_out_a2a_s"] = np.where(both, one, 0.0)
    ag = (batch.cp_comm == CpComm.ALLGATHER) & on
    if np.any(ag):
        full = batch.cp * cp_kv_chunk_bytes(model, training, batch)  # K and V, whole sequence
        gather = (coll.all_gather_time(full, g_cp.size, g_cp.bw_for("all_gather"), g_cp.latency_s)
                  + coll.collective_base_s(g_cp.size, 2.0))  # K, then V
        scatter = (coll.reduce_scatter_time(full, g_cp.size, g_cp.bw_for("reduce_scatter"),
                                            g_cp.latency_s)
                   + coll.collective_base_s(g_cp.size, 2.0))  # dK, then dV
        out["cp_layer_fwd_s"] = np.where(ag, gather, out["cp_layer_fwd_s"])
        out["cp_layer_bwd_s"] = np.where(ag, (1.0 + rerun) * gather + scatter,
                                         out["cp_layer_bwd_s"])
        out["cp_kv_gather_s"] = np.where(ag, gather, 0.0)
        out["cp_dkv_scatter_s"] = np.where(ag, scatter, 0.0)
    return out


def _hierarchical_ring_sends(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                             batch: ConfigBatch, kv_send: np.ndarray, kv_dkv_send: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
    """The ring's K/V and K/V + dK/dV sends [s], on the outer group of the hierarchical rows
    (``cp / cp_a2a`` ranks, stride ``tp * cp_a2a``: the same chunk bytes, the K/V heads split
    over the inner group as the tokens gather in it), ``kv_send`` / ``kv_dkv_send`` elsewhere."""
    hier = (batch.cp_comm == CpComm.A2A_P2P) & (batch.cp > 1)
    if not np.any(hier):
        return kv_send, kv_dkv_send
    g = group_placement(cluster, batch.cp // batch.cp_a2a, batch.tp * batch.cp_a2a)
    kv_bytes = cp_kv_chunk_bytes(model, training, batch)
    one = coll.p2p_time(kv_bytes, g.p2p_bw_bytes_per_s, g.latency_s)
    two = coll.p2p_time(2.0 * kv_bytes, g.p2p_bw_bytes_per_s, g.latency_s)
    return np.where(hier, one, kv_send), np.where(hier, two, kv_dkv_send)


# --------------------------------------------------------------------------------------------
# Overlap of the data-parallel reduction with the backward pass
# --------------------------------------------------------------------------------------------
#: The configuration fields that communication times depend on.
_COMM_FIELDS = ("dp", "tp", "pp", "cp", "cp_comm", "zero_stage", "micro_batch_size",
                "num_microbatches", "recompute", "sequence_parallel", "grad_compression", "topk_ratio",
                "vp", "first_stage_layers", "last_stage_layers", "embedding_as_layer",
                "loss_as_layer", "ep", "etp")


# --------------------------------------------------------------------------------------------
# Overlap of the data-parallel reduction with the backward pass
# --------------------------------------------------------------------------------------------
#: The configuration fields that communication times depend on.
_COMM_FIELDS = ("dp", "tp", "pp", "cp", "cp_comm", "cp_a2a", "zero_stage", "micro_batch_size",
                "num_microbatches", "recompute", "sequence_parallel", "grad_compression",
                "topk_ratio",
                "vp", "first_stage_layers", "last_stage_layers", "embedding_as_layer",
                "loss_as_layer", "ep", "etp")
#: The fields one layer's tensor- and context-parallel link times read.
_LAYER_COMM_FIELDS = ("tp", "cp", "micro_batch_size", "sequence_parallel", "recompute", "ep",
                      "etp", "cp_comm", "cp_a2a")
#: The fields the pipeline send reads (its group: pp with stride tp*cp*dp).
_PP_COMM_FIELDS = ("tp", "cp", "dp", "pp", "micro_batch_size", "sequence_parallel")
# (keys share their leading fields where they can: ConfigBatch.unique_by starts from the
# distinct rows of a prefix it has already computed)
#: The fields one data-parallel collective reads: the buffer (the largest stage's parameters
#: per GPU and the gradient compression) and the dp x cp group.
_DP_ONCE_FIELDS = ("tp", "cp", "dp", "pp", "vp", "first_stage_layers", "last_stage_layers",
                   "embedding_as_layer", "loss_as_layer", "grad_compression", "topk_ratio")


def moe_comm_times(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                   batch: ConfigBatch) -> dict[str, np.ndarray]:
    """Link times of the MoE communication [s] (zeros for a dense model).

    ``ep_layer_fwd_s``, ``ep_layer_bwd_s``: token dispatch + combine of one MoE layer and one
    micro-batch (backward incl. recompute), priced on the tier the expert-parallel group spans
    (:func:`perfmodel.moe.experts.all_to_all_tiered_time`: inside a node, an NVL72 domain, or across
    InfiniBand); ``expert_dp_grad_s``, ``expert_zero3_gather_s``: per step, the routed experts'
    gradient reduction and ZeRO gathers over the expert-data-parallel group (size
    ``tp*cp*dp/(ep*etp)``), on the same links as the dense ones. The groups sit where the
    release puts them (:func:`perfmodel.moe.expert_layout.expert_groups`:
    ``training.moe_parallel_folding``); before folding the all-to-all dispatcher also
    exchanges the sequence-parallel slices over tp (:func:`perfmodel.moe.expert_layout.
    sp2hp_all_to_all_bytes`).

    References
    ----------
    :mod:`perfmodel.moe.experts`; :mod:`perfmodel.moe.expert_layout` (Megatron-Core expert rank order
    ``tp-ep-dp-pp`` with etp, or ``tp-cp-ep-dp-pp`` before MoE parallel folding).
    """
    n = len(batch)
    zeros = np.zeros(n)
    if not model.is_moe:
        return {"ep_layer_fwd_s": zeros, "ep_layer_bwd_s": zeros, "expert_dp_grad_s": zeros,
                "expert_zero3_gather_s": zeros}

    folding = training.moe_parallel_folding
    groups = expert_layout.expert_groups(cluster, batch, folding)
    bpv = activation_bytes_per_elem(training)
    one = moe.dispatch_time_per_layer(model, training, batch, groups, bpv)
    if not folding and training.moe_token_dispatcher == "alltoall":
        sp2hp = expert_layout.sp2hp_all_to_all_bytes(moe.tokens_per_gpu(training, batch),
                                                     model.hidden_size, bpv, batch, folding)
        one = one + moe.all_to_all_tiered_time(sp2hp, groups["etp"])
    fwd_n, bwd_n = moe.a2a_per_layer(batch)
    g_edp = groups["expert_dp"]
    ops = expert_dp_ops(model, training, batch)
    grad = sum(op_time(ops[k], g_edp) for k in ops if k != "zero3_param_all_gather")
    return {
        "ep_layer_fwd_s": fwd_n * one,
        "ep_layer_bwd_s": bwd_n * one,
        "expert_dp_grad_s": np.where(batch.expert_dp > 1, grad, 0.0),
        "expert_zero3_gather_s": np.where(batch.expert_dp > 1,
                                          op_time(ops["zero3_param_all_gather"], g_edp), 0.0),
    }


def dp_num_buckets(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Gradient buckets of one GPU under Megatron-core DDP's default bucket size
    ``max(40e6, 1e6 * dp)`` parameters: ``ceil(params_per_gpu / bucket)`` (at least 1).

    References
    ----------
    Megatron-LM ``megatron/core/distributed/distributed_data_parallel_config.py``
    (``bucket_size`` docstring).
    """
    bucket = np.maximum(DDP_BUCKET_MIN_PARAMS, 1e6 * batch.dp * batch.cp)
    return np.maximum(np.ceil(params_per_gpu(model, batch) / bucket), 1.0)


def exposed_dp_time_s(
    dp_comm_s: ArrayLike,
    backward_s: ArrayLike,
    num_buckets: ArrayLike = 8,
    overlap: bool | ArrayLike = True,
) -> np.ndarray:
    """Part of the data-parallel gradient communication not hidden behind the backward [s].

    The gradient is reduced in ``k`` equal buckets of ``C/k`` seconds; bucket ``i`` is ready after
    ``i/k`` of the backward ``B`` (gradients appear at a uniform rate) and the link runs one bucket
    at a time. The last bucket finishes at ``max(B + C/k, B/k + C)``, so the exposed time is::

        exposed = max(C/k, C - B (k-1)/k)        (overlap)
        exposed = C                                (no overlap)

    and the total ``B + exposed`` tends to the seed's ideal ``max(B, C)`` as ``k`` grows; the last
    bucket (``C/k``) can never be hidden, and when ``C > B`` the excess is exposed too.

    Parameters
    ----------
    dp_comm_s : link time ``C`` of the step's gradient reduction [s]
    backward_s : backward compute ``B`` it may overlap with (with pipelining: the backward of the
        last micro-batch of this stage, since gradients are final only then) [s]
    num_buckets : ``k`` >= 1 (see :func:`dp_num_buckets`)
    overlap : False for a reduction issued after the backward (``overlap_grad_reduce=False``)

    References
    ----------
    Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
    VLDB, Sec. 3.2.3 (bucketing, overlap with backward); Megatron-core ``overlap_grad_reduce``;
    the seed chapter's 9.1.3 (``T = max(T_compute, T_comm)``, the ideal limit).
    """
    c = np.asarray(dp_comm_s, dtype=np.float64)
    b = np.asarray(backward_s, dtype=np.float64)
    k = np.maximum(np.asarray(num_buckets, dtype=np.float64), 1.0)
    hidden = np.maximum(c / k, c - b * (k - 1.0) / k)
    return np.where(np.asarray(overlap, dtype=bool), hidden, c)


# --------------------------------------------------------------------------------------------
# Shared links: every stream one GPU sends over a tier in the same step shares that tier's port
# --------------------------------------------------------------------------------------------
def link_busy_s(streams: dict[str, tuple[ArrayLike, ArrayLike]], num_tiers: int) -> np.ndarray:
    """Busy time of each tier's per-GPU port over one step [s], shape ``(num_tiers, n)``.

    ``streams`` maps a name to ``(busy_s, tier)``: the link time of everything that stream sends
    per step per GPU (already priced at the per-GPU share of the tier it crosses: rails, the
    node's NICs shared by its GPUs, oversubscription, see :mod:`perfmodel.parallel.topology`) and the index
    of that tier (-1: a group of one GPU, nothing sent). Streams on the same tier add up: two
    collectives on one NIC (or one NVLink port) never both run at the full rate, so the port is
    busy for the sum of their times.

    References
    ----------
    Calculon (Isaev et al. 2023, SC23), Sec. 3.4 (one network per tier, its time the sum of the
    collectives placed on it); NCCL runs concurrent communicators on separate channels that share
    the same NICs (NCCL ``src/graph/connect.cc``).
    """
    rows = []
    for t in range(num_tiers):
        total = 0.0
        for busy, tier in streams.values():
            busy = np.asarray(busy, dtype=np.float64)
            total = total + np.where(np.asarray(tier) == t, busy, 0.0)
        rows.append(np.broadcast_to(np.asarray(total, dtype=np.float64), np.shape(busy)))
    return np.stack(rows) if rows else np.zeros((0,))


def stream_busy_in_window_s(
    own_s: ArrayLike, tier_busy_s: ArrayLike, window_s: ArrayLike, span_s: ArrayLike
) -> np.ndarray:
    """Link time a stream effectively needs inside its overlap window [s], when its tier also
    carries other streams spread evenly over the step: its own time plus the other streams'
    share of the window, ``own + min((tier_busy - own) * window / span, window)``.

    Example: the gradient reduce-scatter (``own`` 0.7 s) may overlap only the last backward
    (``window`` 0.5 s of a ``span`` of 3 s); ZeRO-3 gathers on the same NIC (2.7 s over the step)
    take 2.7 * 0.5 / 3 = 0.45 s of that window, so the reduction needs 1.15 s of link time there.

    The other streams' share is capped at the window itself (:func:`window_share_s`): they
    cannot hold the link longer than the window lasts. The cap is what keeps the step monotone
    in the span: ``span + (share of the window)`` never falls when the span grows, so a faster
    term that shortens the span never adds more to this stream than it took off the span.
    ``span_s`` is the time the other streams spread over (the makespan with whatever of them
    it could not hide, :func:`perfmodel.step.evaluate._dp_terms_s`).
    """
    own = np.asarray(own_s, dtype=np.float64)
    other = np.maximum(np.asarray(tier_busy_s, dtype=np.float64) - own, 0.0)
    return own + window_share_s(other, window_s, span_s)


def window_share_s(spread_s: ArrayLike, window_s: ArrayLike, span_s: ArrayLike) -> np.ndarray:
    """The part of ``spread_s`` seconds of link time, spread evenly over a ``span_s``, that falls
    in a ``window_s`` of it [s]: ``min(spread * window / span, window)``.

    Monotone in the span: ``span + share`` never decreases as the span grows (for ``spread <
    span`` its derivative is ``1 - spread * window / span^2 >= 1 - window / span >= 0``; past
    that the share is the whole window, constant). So a shorter span (a faster link or kernel
    elsewhere) crowds the window by at most what the span shrank: exposure may grow when a
    hiding window shrinks, never by more than it shrank.

    Example: 2.7 s of gathers spread over a 3 s step fill 0.45 s of a 0.5 s window; over a
    2 s step they would fill the whole 0.5 s window (not 0.675 s).
    """
    window = np.maximum(np.asarray(window_s, dtype=np.float64), 0.0)
    span = np.maximum(np.asarray(span_s, dtype=np.float64), 1e-30)
    frac = np.clip(window / span, 0.0, 1.0)
    return np.minimum(np.asarray(spread_s, dtype=np.float64) * frac, window)


def shared_link_excess_s(tier_busy_s: np.ndarray, step_s: ArrayLike,
                         unoverlappable_s: ArrayLike = 0.0) -> np.ndarray:
    """Time the step must grow so that every tier can carry its traffic [s]:
    ``max(0, max_t busy_t + unoverlappable - step)``.

    A port busy for ``busy_t`` seconds needs at least that long; work that no communication can
    overlap (the optimizer step, after the last gradient arrives) comes on top. The exposed terms
    computed stream by stream assume each stream has the link to itself; this term is the rest
    when they do not fit together.
    """
    step = np.asarray(step_s, dtype=np.float64)
    if tier_busy_s.size == 0:
        return np.zeros_like(step)
    need = tier_busy_s.max(axis=0) + np.asarray(unoverlappable_s, dtype=np.float64)
    return np.maximum(need - step, 0.0)
