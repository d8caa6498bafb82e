"""Hybrid sharded data parallelism (HSDP): ZeRO-3 inside shard groups, replicas across them.

torchtitan (``ParallelDims``: ``dp_replicate * dp_shard = dp``; ``parallelize_llama`` applies
FSDP2 ``fully_shard`` over the 2-D ``("dp_replicate", "dp_shard")`` mesh), PyTorch FSDP2 HSDP,
DeepSpeed ZeRO++ hpZ and Megatron-FSDP shard parameters, gradients and optimizer states over a
group of ``s`` data-parallel ranks and replicate them over ``dp / s`` such groups. Per step:

- parameter all-gathers run within the shard group (``s * cp`` ranks ``tp`` apart, usually one
  node), as ZeRO-3's but on the tier that group spans (:mod:`perfmodel.parallel.topology`);
- gradients are reduce-scattered within the shard group, then each rank's ``1 / (s cp)`` shard is
  all-reduced across the replicas (``dp / s`` ranks ``tp cp s`` apart), per backward
  (FSDP2 ``FSDPParamGroup.post_backward``: reduce-scatter, then all-reduce on the replicate
  process group).

With ``s = dp`` the replica group has one member and the terms are ZeRO-3's.
"""

from __future__ import annotations

import numpy as np

from perfmodel.comm.comm_time import op_time
from perfmodel.comm.comm_volume import CollectiveOp, dp_ops
from perfmodel.hardware import collectives as coll
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.topology import GroupPlacement, group_placement
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = ["hsdp_groups", "hsdp_link_times_s", "shard_degree"]


def shard_degree(dp, shard: int) -> np.ndarray:
    """Data-parallel ranks per shard group: ``gcd(N, dp)`` for a requested ``N`` (so that the
    shard degree divides dp, as torchtitan's ``dp_replicate * dp_shard = dp`` requires), ``dp``
    when ``N`` is 0 (plain ZeRO-3 / FSDP).

    Example: dp = 32, N = 8: 8; dp = 4, N = 8: 4; N = 0: 32."""
    dp = np.asarray(dp, dtype=np.int64)
    if shard <= 0:
        return dp
    return np.gcd(dp, int(shard))


def hsdp_groups(cluster: ClusterSpec, batch: ConfigBatch, shard: int
                ) -> tuple[GroupPlacement, GroupPlacement]:
    """Placement of the shard group (``s cp`` GPUs, stride ``tp``: the first ranks of the
    ``dp x cp`` group, rank order tp-cp-dp-pp) and of the replica group (``dp / s`` GPUs,
    stride ``tp cp s``), as ``(shard, replicate)``."""
    s = shard_degree(batch.dp, shard)
    tp, cp = batch.tp.astype(np.int64), batch.cp.astype(np.int64)
    g_shard = group_placement(cluster, s * cp, tp)
    g_rep = group_placement(cluster, batch.dp.astype(np.int64) // s, tp * cp * s)
    return g_shard, g_rep


def hsdp_link_times_s(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                      batch: ConfigBatch, shard: int) -> dict[str, np.ndarray]:
    """Link times of one step's ZeRO-3 collectives under HSDP [s]: ``zero3_gather_s`` (the
    parameter all-gathers of :func:`perfmodel.comm.comm_volume.dp_ops`, one per layer and pass,
    within the shard group) and ``grad_s`` (reduce-scatter within, all-reduce of the shard
    across the replicas, per micro-batch).

    Example (one count, no latency): 1 GB of parameters, shard group of 8 at 100 GB/s, 4
    replicas at 25 GB/s: gather 7/8 * 10 ms = 8.75 ms; gradient 8.75 ms + all-reduce of
    125 MB over 4 ranks, 2 * 3/4 * 5 ms = 7.5 ms.
    """
    ops = dp_ops(model, training, batch)
    g_shard, g_rep = hsdp_groups(cluster, batch, shard)
    gather, rs = ops["zero3_param_all_gather"], ops["grad_reduce_scatter"]
    gather_s = op_time(gather._replace(group_size=g_shard.size), g_shard)
    gathers_per_pass = model.num_layers / batch.pp  # one gather per layer (FSDP2)
    ring_latency_s = coll.all_gather_time(0.0, g_shard.size, g_shard.bw_bytes_per_s,
                                          g_shard.latency_s) + coll.collective_base_s(g_shard.size)
    gather_s = gather_s + gather.count * np.maximum(gathers_per_pass - 1, 0) * ring_latency_s
    shard_bytes = rs.buffer_bytes / np.maximum(g_shard.size, 1.0)
    ar = CollectiveOp("all_reduce", shard_bytes, rs.count, g_rep.size)
    grad_s = op_time(rs._replace(group_size=g_shard.size), g_shard) + np.where(
        g_rep.size > 1, op_time(ar, g_rep), 0.0)
    return {"zero3_gather_s": gather_s, "grad_s": grad_s}
