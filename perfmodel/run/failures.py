"""Job interruptions of a synchronous training run: a rate per GPU-hour, scaled by the job.

A synchronous data/tensor/pipeline-parallel job stops whenever any of its GPUs, hosts, NICs or
switches fails (one failed rank stalls every collective), so a job's interruption rate is the
per-GPU rate times its GPU count. Rates published for large runs, per GPU-hour:

* Llama 3 405B (Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4, Table 5): 466 job interruptions
  in a 54-day snapshot on 16,384 H100 (47 planned, 419 unexpected, 78% of those confirmed or
  suspected hardware): 466 / (16,384 x 54 x 24 h) = 2.19e-5. The default here.
* BLOOM 176B (BigScience Workshop 2022, arXiv:2211.05100, Sec. 3.5): "on average 1-2 GPU
  failures per week" on 384 A100 (48 nodes) over 3.5 months: 1.5 / (384 x 168 h) = 2.3e-5.
* OPT-175B (Zhang et al. 2022, arXiv:2205.01068, Sec. 2.5, and its logbook): at least 35 manual
  restarts and over 100 hosts cycled out in about 2 months on 992 A100:
  35 / (992 x 1,440 h) = 2.5e-5 (manual restarts only; the hosts cycled give about 7e-5).
* Meta's research clusters (Kokolis et al. 2024, arXiv:2410.21680, Sec. 4): about 6.5 failures
  per 1,000 node-days (RSC-1, 8-GPU nodes): 6.5 / (1,000 x 24 h x 8) = 3.4e-5.
* MegaScale (Jiang et al. 2024, NSDI, Sec. 4 and 6) counts failures and their recovery on
  12,288 GPUs without a rate per GPU-hour; it is cited for the recovery cost
  (:mod:`perfmodel.run.checkpoint`).

The sources agree within a factor of about 1.5; a cluster file may set its own rate
(``interruptions_per_gpu_hour`` in the cluster spec).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "INTERRUPTIONS_PER_GPU_HOUR",
    "LLAMA3_INTERRUPTIONS",
    "LLAMA3_SNAPSHOT_DAYS",
    "LLAMA3_SNAPSHOT_GPUS",
    "LLAMA3_UNEXPECTED",
    "UNEXPECTED_FRACTION",
    "expected_interruptions",
    "interruptions_per_node_hour",
    "interruptions_per_s",
    "rate_per_gpu_hour",
]

#: Llama 3 405B pre-training snapshot (arXiv:2407.21783, Sec. 3.3.4): interruptions, of which
#: unexpected, over how many days, on how many H100.
LLAMA3_INTERRUPTIONS = 466
LLAMA3_UNEXPECTED = 419
LLAMA3_SNAPSHOT_DAYS = 54
LLAMA3_SNAPSHOT_GPUS = 16_384

SECONDS_PER_HOUR = 3600.0


def rate_per_gpu_hour(interruptions, gpus, days):
    """Interruptions per GPU-hour observed on a run: ``interruptions / (gpus * days * 24)``.

    Parameters
    ----------
    interruptions : array_like
        Job interruptions counted [count].
    gpus : array_like
        GPUs of the job [count].
    days : array_like
        Length of the observation [days].

    Returns
    -------
    ndarray
        Rate [interruptions per GPU-hour].

    References
    ----------
    Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4 (466 in 54 days on 16,384 GPUs: 2.19e-5).
    """
    return np.asarray(interruptions, dtype=float) / (
        np.asarray(gpus, dtype=float) * np.asarray(days, dtype=float) * 24.0)


#: Default interruption rate per GPU-hour: Llama 3 405B's 54-day snapshot (all 466
#: interruptions, planned ones included: 2.19e-5). BLOOM (2.3e-5), OPT-175B (2.5e-5) and
#: Meta's research clusters (3.4e-5) agree within a factor of 1.6 (module docstring).
INTERRUPTIONS_PER_GPU_HOUR = float(rate_per_gpu_hour(
    LLAMA3_INTERRUPTIONS, LLAMA3_SNAPSHOT_GPUS, LLAMA3_SNAPSHOT_DAYS))

#: Share of interruptions that are unexpected (failures that lose the work since the last
#: checkpoint); the rest are planned maintenance, taken right after a checkpoint, which cost the
#: restart only. Llama 3: 419 of 466 (arXiv:2407.21783, Sec. 3.3.4).
UNEXPECTED_FRACTION = LLAMA3_UNEXPECTED / LLAMA3_INTERRUPTIONS


def interruptions_per_node_hour(rate_per_gpu_hour_, gpus_per_node):
    """The per-GPU rate as a rate per node-hour: ``rate * gpus_per_node``.

    Parameters
    ----------
    rate_per_gpu_hour_ : array_like
        [interruptions per GPU-hour].
    gpus_per_node : array_like
        [count].

    Returns
    -------
    ndarray
        [interruptions per node-hour]; the default on 8-GPU nodes is 1.76e-4 (Kokolis et al.
        2024 count about 6.5 per 1,000 node-days, 2.7e-4 per node-hour).
    """
    return np.asarray(rate_per_gpu_hour_, dtype=float) * np.asarray(gpus_per_node, dtype=float)


def interruptions_per_s(rate_per_gpu_hour_, gpus):
    """A job's interruption rate [1/s]: the per-GPU rate times its GPUs (any one stops it).

    Parameters
    ----------
    rate_per_gpu_hour_ : array_like
        [interruptions per GPU-hour].
    gpus : array_like
        GPUs of the job [count].

    Returns
    -------
    ndarray
        [interruptions per second of wall time]; its inverse is the job's mean time between
        interruptions.
    """
    return (np.asarray(rate_per_gpu_hour_, dtype=float) * np.asarray(gpus, dtype=float)
            / SECONDS_PER_HOUR)


def expected_interruptions(rate_per_gpu_hour_, gpus, wall_s):
    """Expected interruptions of a job: ``rate * gpus * hours``.

    Parameters
    ----------
    rate_per_gpu_hour_ : array_like
        [interruptions per GPU-hour].
    gpus : array_like
        [count].
    wall_s : array_like
        Wall-clock time of the job [s].

    Returns
    -------
    ndarray
        [count] (a Poisson mean).

    References
    ----------
    Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4: at the default rate, 16,384 GPUs for 54
    days give back the 466 counted (the rate's own definition).
    """
    return interruptions_per_s(rate_per_gpu_hour_, gpus) * np.asarray(wall_s, dtype=float)
