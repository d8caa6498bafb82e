"""Optimizer-state and parameter offload to host memory: what leaves HBM and what the step pays.

- ``optimizer``: DeepSpeed ZeRO-Offload (``zero_optimization.offload_optimizer``, Ren et al.
  2021, Sec. 4) and Megatron-Core ``--optimizer-cpu-offload --optimizer-offload-fraction f``
  (``HybridDeviceOptimizer``, ``megatron/core/optimizer/cpu_offloading``): a share ``f`` of the
  fp32 master weights and Adam moments lives in host memory and is updated there by a vectorised
  CPU Adam. Per step, the shard's gradients go to the host (device-to-host, overlapped with the
  backward when the framework overlaps its gradient traffic: DeepSpeed ``overlap_comm`` copies
  each bucket as it is reduced), the CPU runs Adam, and the updated 16-bit weights come back
  (host-to-device, exposed before the next forward). Megatron steps the GPU part
  ``(1 - f)`` of the states at the same time (its GPU and CPU optimizers run in parallel).
- ``params``: ZeRO-Infinity ``offload_param`` (Rajbhandari et al. 2021, Sec. 5; ZeRO-3 only):
  the 16-bit weight shard lives on the host and every ZeRO-3 gather first copies it up.

Host link: PCIe Gen5 x16 (~55 GB/s per direction measured, shared by the GPUs of a switch) or
GB200 NVLink-C2C (450 GB/s per direction): ``ClusterSpec.host_link_gbyte_per_s``, else
:func:`perfmodel.memory.offload.host_link_bytes_per_s`. Offload never adds HBM: the resident terms
only shrink (the gradient buckets stay; Megatron keeps its main grads on the GPU).
"""

from __future__ import annotations

import numpy as np

from perfmodel.memory.hsdp import with_peak_change
from perfmodel.memory.offload import host_link_bytes_per_s
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ClusterSpec, TrainingSpec

__all__ = ["CPU_ADAM_PARAMS_PER_S_PER_CORE", "CPU_CORES_PER_GPU", "cpu_adam_params_per_s",
           "cpu_adam_s", "host_link_of", "offload_optimizer_step_s", "offloaded_memory",
           "param_fetch_s"]

#: Parameters one core updates per second with DeepSpeed's AVX CPU-Adam: 10 B parameters in
#: 2.57 s on a DGX-2's two 24-core Xeon Platinum 8168 (Ren et al. 2021, ZeRO-Offload, Table 3,
#: CPU-Adam column): 10e9 / 2.57 / 48 = 8.1e7.
CPU_ADAM_PARAMS_PER_S_PER_CORE = 8.1e7
#: Host cores per GPU when the cluster file does not say: a DGX H100's 2 x 56-core Xeon 8480C for
#: 8 GPUs (DGX H100 datasheet); a DGX A100 has 16 (2 x 64-core EPYC 7742), a DGX-2 3.
CPU_CORES_PER_GPU = 14


def host_link_of(cluster: ClusterSpec) -> float:
    """Device-host bandwidth per GPU and direction [B/s]: the cluster's
    ``host_link_gbyte_per_s``, else the GPU's host link (:func:`host_link_bytes_per_s`)."""
    if cluster.host_link_gbyte_per_s is not None:
        return cluster.host_link_gbyte_per_s * 1e9
    return host_link_bytes_per_s(cluster.gpu)


def cpu_adam_params_per_s(cluster: ClusterSpec) -> float:
    """Parameters per second the host's CPU Adam updates for one GPU [1/s]: the node's cores
    (``cpu_cores_per_node``, else :data:`CPU_CORES_PER_GPU` per GPU) split over its GPUs, at
    ``cpu_adam_params_per_s_per_core`` (else :data:`CPU_ADAM_PARAMS_PER_S_PER_CORE`) each.

    Example: 48 cores, 1 GPU, 8.1e7 per core: 3.9e9 per s."""
    cores = cluster.cpu_cores_per_node or CPU_CORES_PER_GPU * cluster.gpus_per_node
    per_core = cluster.cpu_adam_params_per_s_per_core or CPU_ADAM_PARAMS_PER_S_PER_CORE
    return cores / cluster.gpus_per_node * per_core


def cpu_adam_s(host_params, params_per_s: float) -> np.ndarray:
    """CPU Adam step of ``host_params`` parameters [s] (Ren et al. 2021, Sec. 5.1).

    Example: 10e9 parameters at 3.9e9 per s: 2.57 s."""
    return np.asarray(host_params, dtype=np.float64) / params_per_s


def offload_optimizer_step_s(gpu_optimizer_s, host_params, fraction: float, grad_bytes: float,
                             param_bytes: float, link_bytes_per_s: float, params_per_s: float,
                             d2h_window_s, overlapped: bool) -> np.ndarray:
    """Optimizer step with a share ``fraction`` of the states on the host [s]:
    ``max((1 - f) t_gpu, d2h_exposed + cpu_adam + h2d)``, with ``d2h = host_params grad_bytes /
    link`` hidden behind ``d2h_window_s`` (the last backward) when ``overlapped``, and
    ``h2d = host_params param_bytes / link`` (ZeRO-Offload's schedule, Ren et al. 2021, Fig. 5;
    Megatron's HybridDeviceOptimizer runs the GPU share beside it).

    Example: 1e9 host parameters, 4 B gradients, 2 B weights, 50 GB/s, 4e9 per s, window 0.1 s,
    overlapped, t_gpu = 0.02, f = 1: d2h 80 ms (hidden), Adam 250 ms, h2d 40 ms: 0.29 s."""
    p = np.asarray(host_params, dtype=np.float64)
    d2h_s = p * grad_bytes / link_bytes_per_s
    d2h_exposed_s = np.maximum(d2h_s - d2h_window_s, 0.0) if overlapped else d2h_s
    host_s = d2h_exposed_s + cpu_adam_s(p, params_per_s) + p * param_bytes / link_bytes_per_s
    return np.maximum((1.0 - fraction) * np.asarray(gpu_optimizer_s, dtype=np.float64), host_s)


def param_fetch_s(gathers, shard_bytes, link_bytes_per_s: float) -> np.ndarray:
    """Host-to-device copies of the offloaded 16-bit weight shard before the ZeRO-3 gathers of a
    step [s] (ZeRO-Infinity ``offload_param``, Rajbhandari et al. 2021, Sec. 5): one per gather.

    Example: 3 gathers of a 1 GB shard at 50 GB/s: 60 ms."""
    return (np.asarray(gathers, dtype=np.float64) * np.asarray(shard_bytes, dtype=np.float64)
            / link_bytes_per_s)


def offloaded_memory(mem: dict[str, np.ndarray], training: TrainingSpec, batch: ConfigBatch
                     ) -> dict[str, np.ndarray]:
    """:func:`perfmodel.memory.recipe.memory_breakdown`'s dict with the offloaded states off
    the GPU: ``optimizer`` times ``1 - fraction``, and so the sharded ``gradients`` of ZeRO-2/3
    rows (ZeRO-Offload moves each reduced gradient partition to the host, Ren et al. 2021,
    Sec. 4.1; Megatron's distributed optimizer, ZeRO-1, keeps its main-grad buffer on the GPU);
    ``weights`` 0 on ZeRO-3 rows with
    ``params`` offload (the gathered layers stay in the buffers); peak and fit updated.
    ``mem`` itself without optimizer or parameter offload."""
    off = set(training.offload)
    if not off & {"optimizer", "params"}:
        return mem
    out = dict(mem)
    removed = np.zeros_like(np.asarray(mem["peak"], dtype=np.float64))
    if "optimizer" in off:
        keep = 1.0 - training.optimizer_offload_fraction
        opt = np.asarray(mem["optimizer"], dtype=np.float64)
        out["optimizer"] = opt * keep
        g = np.asarray(mem["gradients"], dtype=np.float64)
        out["gradients"] = np.where(np.asarray(batch.zero_stage) >= 2, g * keep, g)
        removed = removed + opt - out["optimizer"] + g - out["gradients"]
    if "params" in off:
        w = np.asarray(mem["weights"], dtype=np.float64)
        out["weights"] = np.where(np.asarray(batch.zero_stage) == 3, 0.0, w)
        removed = removed + w - out["weights"]
    return with_peak_change(out, -removed)
