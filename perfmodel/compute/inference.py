"""Batch-1 inference latency of a model (or a contiguous block of its layers) on one device.

Used by the real-time placement planner (:mod:`realtime.placement`). At batch 1 an inference is
either compute bound (FLOPs / sustained FLOP/s) or memory bound (every weight and activation byte
moves through the memory system once), whichever is slower: the roofline bound. On top of that
come fixed per-layer costs (kernel launches, synchronisation), which dominate small control
models on a GPU.

All functions are pure and broadcast over numpy arrays (models x devices at once). SI units:
FLOP, bytes, seconds, FLOP/s, bytes/s.

Assumptions (stated, not measured here): layers are uniform, so a block of ``k`` of ``L`` layers
costs ``k / L`` of the model's FLOPs, weight bytes and activation bytes; the activation handed
from one layer to the next is ``activation_bytes / L``. Efficiencies are per device and must be
calibrated (see ``docs/realtime.md`` for the values shipped with exercise 9.6).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "block_latency_s",
    "boundary_activation_bytes",
    "resident_bytes",
    "roofline_latency_s",
    "split_latency_s",
    "transfer_s",
]


def roofline_latency_s(
    flops: ArrayLike,
    bytes_moved: ArrayLike,
    peak_flops: ArrayLike,
    mem_bw_bytes_per_s: ArrayLike,
    *,
    compute_efficiency: ArrayLike = 1.0,
    memory_efficiency: ArrayLike = 1.0,
    num_layers: ArrayLike = 0,
    launch_overhead_s: ArrayLike = 0.0,
) -> np.ndarray:
    """Roofline latency of one batch-1 inference plus a fixed cost per layer.

    ``t = max(flops / (peak_flops * compute_efficiency),
    bytes_moved / (mem_bw_bytes_per_s * memory_efficiency)) + num_layers * launch_overhead_s``

    Parameters
    ----------
    flops : FLOP of one inference [FLOP].
    bytes_moved : bytes read and written from device memory by one inference [bytes]
        (weights + activations at batch 1).
    peak_flops : dense peak of the device at the model's dtype [FLOP/s].
    mem_bw_bytes_per_s : device memory bandwidth [bytes/s].
    compute_efficiency, memory_efficiency : achieved fraction of the peaks, in (0, 1].
    num_layers : layers executed (each pays ``launch_overhead_s``).
    launch_overhead_s : fixed cost per layer [s] (kernel launches; small under CUDA Graphs).

    Returns
    -------
    np.ndarray : latency [s], broadcast over the inputs.

    References
    ----------
    Williams, Waterman, Patterson, "Roofline: an insightful visual performance model for multicore
    architectures", CACM 52(4), 2009, eq. (1): attainable = min(peak, bandwidth x intensity).
    """
    compute_s = np.asarray(flops, float) / (
        np.asarray(peak_flops, float) * np.asarray(compute_efficiency, float)
    )
    memory_s = np.asarray(bytes_moved, float) / (
        np.asarray(mem_bw_bytes_per_s, float) * np.asarray(memory_efficiency, float)
    )
    overhead_s = np.asarray(num_layers, float) * np.asarray(launch_overhead_s, float)
    return np.maximum(compute_s, memory_s) + overhead_s


def block_latency_s(
    flops: ArrayLike,
    weight_bytes: ArrayLike,
    activation_bytes: ArrayLike,
    num_layers: ArrayLike,
    block_layers: ArrayLike,
    peak_flops: ArrayLike,
    mem_bw_bytes_per_s: ArrayLike,
    *,
    compute_efficiency: ArrayLike = 1.0,
    memory_efficiency: ArrayLike = 1.0,
    launch_overhead_s: ArrayLike = 0.0,
) -> np.ndarray:
    """Latency [s] of ``block_layers`` of a model's ``num_layers`` uniform layers on one device.

    The block gets the fraction ``f = block_layers / num_layers`` of the whole model's FLOPs and
    of its weight + activation bytes; ``block_layers = num_layers`` is the whole model.

    References
    ----------
    Roofline (Williams et al., CACM 2009, eq. 1) applied to a layer range, as in pipeline
    partitioning of inference (Narayanan et al., "PipeDream", SOSP 2019, sec. 3.1: stage cost =
    sum of its layers' costs).
    """
    frac = np.asarray(block_layers, float) / np.asarray(num_layers, float)
    bytes_moved = (np.asarray(weight_bytes, float) + np.asarray(activation_bytes, float)) * frac
    return roofline_latency_s(
        np.asarray(flops, float) * frac,
        bytes_moved,
        peak_flops,
        mem_bw_bytes_per_s,
        compute_efficiency=compute_efficiency,
        memory_efficiency=memory_efficiency,
        num_layers=block_layers,
        launch_overhead_s=launch_overhead_s,
    )


def boundary_activation_bytes(activation_bytes: ArrayLike, num_layers: ArrayLike) -> np.ndarray:
    """Bytes of the activation handed from one layer to the next: ``activation_bytes / L``.

    ``activation_bytes`` is the total written by all layers of one batch-1 inference; with uniform
    layers each layer writes (and hands on) an equal share.
    """
    return np.asarray(activation_bytes, float) / np.asarray(num_layers, float)


def transfer_s(
    nbytes: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Point-to-point transfer time [s]: ``latency_s + nbytes / bw_bytes_per_s`` (alpha-beta).

    References
    ----------
    Hockney, "The communication challenge for MPP", Parallel Computing 20(3), 1994 (alpha-beta).
    """
    return np.asarray(latency_s, float) + np.asarray(nbytes, float) / np.asarray(
        bw_bytes_per_s, float
    )


def split_latency_s(
    first_block_s: ArrayLike, second_block_s: ArrayLike, link_s: ArrayLike
) -> np.ndarray:
    """End-to-end latency [s] of one inference split by layers over two devices.

    At batch 1 there is nothing to overlap: ``t = t_first + t_link + t_second``.

    References
    ----------
    Huang et al., "GPipe", NeurIPS 2019, sec. 2.2 with one micro-batch (no pipelining possible);
    Narayanan et al., "PipeDream", SOSP 2019, sec. 3.1 (stage time + activation transfer).
    """
    return (
        np.asarray(first_block_s, float)
        + np.asarray(link_s, float)
        + np.asarray(second_block_s, float)
    )


def resident_bytes(
    weight_bytes: ArrayLike,
    activation_bytes: ArrayLike,
    num_layers: ArrayLike,
    block_layers: ArrayLike,
) -> np.ndarray:
    """Device memory [bytes] held by a block of layers under a fixed (static) memory pool.

    Weights of the block stay resident; activations use a fixed double buffer of two layer
    boundaries (input and output of the running layer), allocated once at start-up.
    ``resident = weight_bytes * k / L + 2 * activation_bytes / L``.

    References
    ----------
    TensorRT's static activation memory (one pre-sized workspace per engine, NVIDIA TensorRT
    Developer Guide, "Memory"); the ping-pong buffer is the usual layer-by-layer inference plan.
    """
    frac = np.asarray(block_layers, float) / np.asarray(num_layers, float)
    return np.asarray(weight_bytes, float) * frac + 2.0 * boundary_activation_bytes(
        activation_bytes, num_layers
    )
