"""Checkpoints: their size, what they cost the training, how often to take them, and the work
an interruption loses.

Size. A checkpoint holds one copy of the model's weights and optimizer states (fp32 master
weights and moments for mixed-precision Adam), however the plan shards them: the shards of
every rank together, replicas written once. So its size is the model's parameters times the
bytes per parameter of the weights and optimizer states of the precision and optimizer
(:func:`perfmodel.memory.breakdown.state_bytes_per_param`: 2 + 12 = 14 bytes for bf16 Adam); gradients
are not saved. This does not depend on the layout.

Cost. Two modes:

* ``sync``: training stops while the checkpoint is written to shared storage, at the storage
  tier's aggregate write bandwidth (``storage_write_gbyte_per_s`` in the cluster file).
* ``async`` (in-memory staging: Megatron-Core's ``--async-save``, PyTorch DCP ``async_save``):
  only the copy of each GPU's own states to pinned host memory blocks the training; the write
  to storage runs behind the next steps and must end before the next checkpoint starts. The
  staged bytes per GPU are its weights and optimizer states as the plan holds them (the memory
  breakdown's ``weights`` + ``optimizer``), replicas included: DCP stages the whole local state
  dict before it deduplicates the writes.

Interval. Young (1974) and Daly (2006) give the interval between checkpoints that minimises
the expected wall time for a checkpoint cost ``delta`` and a mean time between failures ``M``.

Lost work. An unexpected interruption loses on average half an interval of work (and, async,
the checkpoint still being written), then pays the restart: job relaunch plus checkpoint load.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "HOST_COPY_BYTES_PER_S",
    "MODES",
    "RELAUNCH_S",
    "STORAGE_WRITE_BYTES_PER_S_PER_NODE",
    "blocking_checkpoint_s",
    "checkpoint_bytes",
    "daly_interval_s",
    "expected_wall_s",
    "lost_work_s",
    "restart_s",
    "young_interval_s",
]

#: Checkpoint modes: ``sync`` (training waits for the storage write) or ``async`` (only the
#: copy to host memory blocks).
MODES = ("sync", "async")

#: Default storage write bandwidth per node [bytes/s] when the cluster file gives no storage
#: tier: Meta's Tectonic file system sustained 2 TB/s for the 2,048-node (16K-GPU) Llama 3
#: cluster (arXiv:2407.21783, Sec. 3.3.1; 7 TB/s peak): about 1 GB/s per node. The only
#: published storage figure of a large training cluster found; read bandwidth is taken equal.
STORAGE_WRITE_BYTES_PER_S_PER_NODE = 1e9

#: Rate of the blocking copy of a GPU's states to pinned host memory in async mode [bytes/s
#: per GPU]. Engineering assumption: PCIe Gen5 x16 carries 64 GB/s each way (PCI-SIG), and
#: with every GPU of a node copying at once through shared switch uplinks and host memory,
#: about 25 GB/s each is reached (40% of the line rate). NVLink-C2C hosts (GH200, GB200) are
#: faster; set ``host_copy_bytes_per_s`` for them.
HOST_COPY_BYTES_PER_S = 25e9

#: Job relaunch after an interruption, without the checkpoint load [s]: detecting the fault,
#: draining and rescheduling nodes, starting the processes and the communicators. Engineering
#: assumption, 10 minutes: MegaScale (Jiang et al. 2024, NSDI, Sec. 4) reports that recovery
#: on 10K+ GPUs took tens of minutes before their fast-restart work; the Llama 3 paper's "over
#: 90% effective training time" with 466 interruptions in 54 days (Sec. 3.3.4) bounds the whole
#: cost of one interruption (relaunch + load + lost work) at about 17 minutes.
RELAUNCH_S = 600.0


def checkpoint_bytes(params, weight_bytes_per_param, optimizer_bytes_per_param):
    """Bytes of one checkpoint: one copy of the weights and optimizer states.

    Parameters
    ----------
    params : array_like
        Model parameters [count].
    weight_bytes_per_param, optimizer_bytes_per_param : array_like
        [bytes per parameter] (bf16 Adam: 2 and 12, fp32 master weights + m + v).

    Returns
    -------
    ndarray
        [bytes]. Llama 3.1 405B in bf16 with Adam: 405.85e9 x 14 = 5.68e12.

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 3.1 (2 + 12 bytes of weights and optimizer states);
    Megatron-Core ``dist_checkpointing`` saves the model and optimizer state dicts, no gradients.
    """
    return np.asarray(params, dtype=float) * (
        np.asarray(weight_bytes_per_param, dtype=float)
        + np.asarray(optimizer_bytes_per_param, dtype=float))


def blocking_checkpoint_s(mode, checkpoint_bytes_, storage_write_bytes_per_s,
                          staged_bytes_per_gpu, host_copy_bytes_per_s=HOST_COPY_BYTES_PER_S):
    """Time a checkpoint stops the training [s].

    Parameters
    ----------
    mode : {"sync", "async"}
    checkpoint_bytes_ : array_like
        Whole checkpoint [bytes] (:func:`checkpoint_bytes`).
    storage_write_bytes_per_s : array_like
        Aggregate write bandwidth of the storage tier [bytes/s].
    staged_bytes_per_gpu : array_like
        Weights + optimizer states one GPU holds [bytes] (async only).
    host_copy_bytes_per_s : array_like
        Device-to-host copy rate per GPU [bytes/s] (async only).

    Returns
    -------
    ndarray
        ``sync``: checkpoint / storage bandwidth; ``async``: staged bytes / host copy rate
        (all GPUs copy at once).

    References
    ----------
    Megatron-Core ``dist_checkpointing/strategies/async_utils.py`` (the D2H copy blocks, the
    write runs in a background process); PyTorch ``torch.distributed.checkpoint.async_save``.
    """
    if mode == "sync":
        return np.asarray(checkpoint_bytes_, dtype=float) / np.asarray(
            storage_write_bytes_per_s, dtype=float)
    if mode == "async":
        return np.asarray(staged_bytes_per_gpu, dtype=float) / np.asarray(
            host_copy_bytes_per_s, dtype=float)
    raise ValueError(f"checkpoint mode = {mode!r}: expected one of {', '.join(MODES)}")


def young_interval_s(checkpoint_s, mtbf_s):
    """Young's first-order optimum of the compute time between checkpoints:
    ``sqrt(2 * delta * M)``.

    Parameters
    ----------
    checkpoint_s : array_like
        Blocking cost of one checkpoint ``delta`` [s].
    mtbf_s : array_like
        The job's mean time between failures ``M`` [s].

    Returns
    -------
    ndarray
        [s]. delta = 60 s, M = 3 h: sqrt(2 x 60 x 10,800) = 1,138 s.

    References
    ----------
    J. W. Young, "A first order approximation to the optimum checkpoint interval", Commun. ACM
    17(9), 1974, Eq. (5).
    """
    return np.sqrt(2.0 * np.asarray(checkpoint_s, dtype=float) * np.asarray(mtbf_s, dtype=float))


def daly_interval_s(checkpoint_s, mtbf_s):
    """Daly's higher-order optimum of the compute time between checkpoints.

    ``sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta`` for
    ``delta < 2M``, else ``M``.

    Parameters
    ----------
    checkpoint_s : array_like
        Blocking cost of one checkpoint ``delta`` [s].
    mtbf_s : array_like
        The job's mean time between failures ``M`` [s].

    Returns
    -------
    ndarray
        [s]. delta = 60 s, M = 3 h: x = 60 / 21,600; 1,138.4 (1 + 0.01757 + 0.00031) - 60
        = 1,098.8 s.

    References
    ----------
    J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
    Future Generation Computer Systems 22(3), 2006, Eq. (37).
    """
    d = np.asarray(checkpoint_s, dtype=float)
    m = np.asarray(mtbf_s, dtype=float)
    x = d / (2.0 * m)
    tau = np.sqrt(2.0 * d * m) * (1.0 + np.sqrt(x) / 3.0 + x / 9.0) - d
    return np.where(d < 2.0 * m, tau, m)


def restart_s(checkpoint_bytes_, storage_read_bytes_per_s, relaunch_s=RELAUNCH_S):
    """Time from an interruption until the job computes again: relaunch plus checkpoint load.

    Parameters
    ----------
    checkpoint_bytes_ : array_like
        [bytes].
    storage_read_bytes_per_s : array_like
        Aggregate read bandwidth of the storage tier [bytes/s].
    relaunch_s : array_like
        Fault detection, rescheduling, process and communicator start [s] (:data:`RELAUNCH_S`).

    Returns
    -------
    ndarray
        [s].
    """
    return np.asarray(relaunch_s, dtype=float) + np.asarray(
        checkpoint_bytes_, dtype=float) / np.asarray(storage_read_bytes_per_s, dtype=float)


def lost_work_s(interval_s, checkpoint_s, persist_s=0.0):
    """Work an unexpected interruption loses on average [s]: half an interval (with its
    checkpoint) since the last checkpoint, plus, in async mode, the checkpoint still being
    written to storage (``persist_s``), which cannot be restarted from.

    Parameters
    ----------
    interval_s : array_like
        Compute time between checkpoints [s].
    checkpoint_s : array_like
        Blocking checkpoint cost [s].
    persist_s : array_like
        Background write time of the async checkpoint [s] (0 for sync).

    Returns
    -------
    ndarray
        ``(interval + checkpoint) / 2 + persist`` [s].

    References
    ----------
    Young 1974 (failures uniform over the interval: half of it lost on average); Daly 2006,
    Sec. 3.
    """
    return (0.5 * (np.asarray(interval_s, dtype=float) + np.asarray(checkpoint_s, dtype=float))
            + np.asarray(persist_s, dtype=float))


def expected_wall_s(useful_s, interval_s, checkpoint_s, restart_s_, lost_s,
                    interruptions_per_s_, unexpected_fraction):
    """Expected wall time of a run that needs ``useful_s`` of failure-free training.

    The checkpoints stretch the training by ``1 + delta / tau``; interruptions arrive at rate
    ``lambda`` over the whole wall time and each costs the restart, and the unexpected ones the
    lost work as well: ``W = T (1 + delta / tau) + lambda W (R + f_u L)``, so
    ``W = T (1 + delta / tau) / (1 - lambda (R + f_u L))``; infinite when the interruptions
    come faster than the run recovers (no progress).

    Parameters
    ----------
    useful_s : array_like
        Failure-free training time: steps x step time [s].
    interval_s, checkpoint_s : array_like
        ``tau`` and ``delta`` [s].
    restart_s_, lost_s : array_like
        ``R`` and ``L`` per interruption [s].
    interruptions_per_s_ : array_like
        ``lambda``: the job's interruption rate [1/s].
    unexpected_fraction : array_like
        ``f_u``: share of interruptions that lose work.

    Returns
    -------
    ndarray
        [s]. T = 1e6 s, tau = 1,000 s, delta = 10 s, R = 600 s, L = 505 s, f_u = 1,
        lambda = 1 / 10,800 s: 1.01e6 / (1 - 1,105 / 10,800) = 1.1251e6 s.

    References
    ----------
    Young 1974 and Daly 2006 (first-order model of checkpoint/restart); the wall-time form with
    failures during the whole run as in Daly 2006, Eq. (9) to first order.
    """
    t = np.asarray(useful_s, dtype=float)
    stretch = 1.0 + np.asarray(checkpoint_s, dtype=float) / np.asarray(interval_s, dtype=float)
    per = np.asarray(restart_s_, dtype=float) + np.asarray(
        unexpected_fraction, dtype=float) * np.asarray(lost_s, dtype=float)
    busy = np.asarray(interruptions_per_s_, dtype=float) * per  # share of wall time lost
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(busy < 1.0, t * stretch / (1.0 - busy), np.inf)
