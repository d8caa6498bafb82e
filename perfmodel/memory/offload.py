"""CPU activation offloading (Megatron-Core ``--cpu-offloading --cpu-offloading-num-layers N``).

Megatron-Core wraps each transformer layer's forward in Transformer Engine's CPU-offload context
(``transformer_block.py``: ``get_cpu_offload_context(cpu_offloading, cpu_offloading_num_layers,
num_layers, ...)``; TE ``cpu_offload.py``). The tensors the first ``N`` layers save for the
backward are copied to pinned host memory on a side stream while the next layer computes
(double-buffered: one offloaded layer's tensors are on the GPU while they copy), and copied back
one layer ahead during the backward. Megatron asserts ``N < num_layers``; Megatron-Bridge's
performance scripts disable it with pipeline parallelism. Weights, gradients and optimizer
states stay where they are.

Cost model: memory keeps ``L - N`` layers' activations plus one staging layer; time adds, per
offloaded layer and micro-batch, what the copy (one layer's activations over the host link)
leaves exposed behind the next layer's forward and the previous layer's backward.
"""

from __future__ import annotations

import numpy as np

from perfmodel.spec.specs import GPUSpec

#: Offloaded layers whose tensors are on the GPU at once while they copy (TE's double buffer).
OFFLOAD_STAGING_LAYERS = 1.0

#: Host link per direction [GB/s]: GB200/GB300 NVLink-C2C 900 GB/s bidirectional (NVIDIA GB200
#: NVL72 datasheet) = 450 per direction; PCIe Gen5 x16 as measured on the H200
#: (hardware_specs/calibration/h200/pcie.csv: 55.2-55.4 GB/s pinned, 1 GiB); PCIe Gen4 x16 half.
HOST_LINK_GBYTE_PER_S = {"gb200": 450.0, "gb300": 450.0, "gen5": 55.2, "gen4": 27.6}


def host_link_bytes_per_s(gpu: GPUSpec) -> float:
    """Device-host copy bandwidth per direction [B/s] of the GPU's host link (see
    :data:`HOST_LINK_GBYTE_PER_S`): NVLink-C2C on Grace-Blackwell, PCIe Gen5 on Hopper and
    B200, PCIe Gen4 on Ampere and older."""
    n = gpu.name.lower()
    for k in ("gb200", "gb300"):
        if k in n:
            return HOST_LINK_GBYTE_PER_S[k] * 1e9
    gen4 = any(k in n for k in ("a100", "v100", "a10", "a40", "t4"))
    return HOST_LINK_GBYTE_PER_S["gen4" if gen4 else "gen5"] * 1e9


def offloaded_layers(requested, layers) -> np.ndarray:
    """Layers of a stage whose activations go to the host: ``min(N, layers - 1)`` (Megatron's
    ``cpu_offloading_num_layers < num_layers``), never negative."""
    layers = np.asarray(layers, dtype=np.float64)
    return np.clip(np.minimum(float(requested), layers - 1.0), 0.0, None)


def resident_activation_layers(layers, requested) -> np.ndarray:
    """Layers' worth of activations a stage keeps on the GPU: ``L - N + min(N, 1)``.

    Example: 80 layers, N = 40: 41; N = 0: 80."""
    layers = np.asarray(layers, dtype=np.float64)
    n = offloaded_layers(requested, layers)
    return layers - n + np.minimum(n, OFFLOAD_STAGING_LAYERS)


def exposed_offload_s(requested, layers, layer_act_bytes, layer_fwd_s, layer_bwd_s,
                      link_bytes_per_s) -> np.ndarray:
    """Exposed copy time of one micro-batch through a stage [s]: per offloaded layer, the
    device-to-host copy beyond the next layer's forward plus the host-to-device copy beyond
    the backward it prefetches behind, ``N (max(0, c - t_f) + max(0, c - t_b))`` with
    ``c = layer activations / link``.

    Example: N = 2, 1 GB per layer at 100 GB/s (c = 10 ms), t_f = 4 ms, t_b = 8 ms:
    2 (6 + 2) ms = 16 ms."""
    n = offloaded_layers(requested, layers)
    c = np.asarray(layer_act_bytes, dtype=np.float64) / link_bytes_per_s
    return n * (np.maximum(c - layer_fwd_s, 0.0) + np.maximum(c - layer_bwd_s, 0.0))
