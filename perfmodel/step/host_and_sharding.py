"""Per-layer and per-step inputs of :func:`perfmodel.step.evaluate.evaluate` changed by hybrid
sharding (:mod:`perfmodel.comm.hsdp`) and by offload to the host
(:mod:`perfmodel.memory.optimizer_offload`): the ZeRO-3 gathers and gradient reduction on the
HSDP groups, the weight shard fetched from the host before each gather (``params``), and the
optimizer step over the larger HSDP shard and on the host CPU (``optimizer``). Without
``hsdp_shard`` or ``offload`` the inputs come back unchanged (the same dicts)."""

from __future__ import annotations

import numpy as np

from perfmodel.comm.comm_volume import dp_ops, param_bytes_per_elem
from perfmodel.comm.hsdp import hsdp_link_times_s, shard_degree
from perfmodel.compute.layer import optimizer_params_per_gpu
from perfmodel.memory import optimizer_offload as ooff
from perfmodel.memory.hsdp import hsdp_state_factor
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = ["with_sharding_and_offload"]


def with_sharding_and_offload(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                              b: ConfigBatch, ct: dict, comm: dict, bwd_window_s
                              ) -> tuple[dict, dict]:
    """``(ct, comm)`` with the HSDP collectives, the parameter fetches and the offloaded
    optimizer step in place [s]; ``bwd_window_s`` is the last micro-batch's backward on the
    slowest stage, the window that hides the gradients' device-to-host copy."""
    off = set(training.offload)
    if not training.hsdp_shard and not off & {"optimizer", "params"}:
        return ct, comm
    ct, comm = dict(ct), dict(comm)
    z3 = (b.zero_stage == 3) & (training.zero3_gather == "layer")
    factor = hsdp_state_factor(b.dp, b.zero_stage, training.hsdp_shard)
    if training.hsdp_shard:  # 1. gathers and gradient reduction on the HSDP groups
        hs = hsdp_link_times_s(model, training, cluster, b, training.hsdp_shard)
        comm["zero3_gather_s"] = np.where(z3, hs["zero3_gather_s"], comm["zero3_gather_s"])
        comm["dp_grad_s"] = np.where(z3, hs["grad_s"], comm["dp_grad_s"])
        ct["optimizer_s"] = ct["optimizer_s"] * factor
    link = ooff.host_link_of(cluster)
    if "params" in off:  # 2. ZeRO-Infinity: the weight shard comes up before each gather
        gather = dp_ops(model, training, b)["zero3_param_all_gather"]
        shard_cp = shard_degree(b.dp, training.hsdp_shard) * b.cp
        fetch_s = ooff.param_fetch_s(gather.count, gather.buffer_bytes / shard_cp, link)
        comm["zero3_gather_s"] = comm["zero3_gather_s"] + np.where(b.zero_stage == 3, fetch_s,
                                                                   0.0)
    if "optimizer" in off:  # 3. the optimizer step's host share on the CPU
        frac = training.optimizer_offload_fraction
        host_params = optimizer_params_per_gpu(model, b) * factor * frac
        grad_bytes = 4.0 if (training.grad_reduce_in_fp32 or training.precision == "fp32") else 2.0
        ct["optimizer_s"] = ooff.offload_optimizer_step_s(
            ct["optimizer_s"], host_params, frac, grad_bytes, param_bytes_per_elem(training),
            link, ooff.cpu_adam_params_per_s(cluster), bwd_window_s,
            training.overlap_grad_reduce)
    return ct, comm
