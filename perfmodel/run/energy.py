"""Energy and cost of a training run.

Power drawn for each GPU of the job is the GPU's own draw at its utilisation plus its share of
the node's other parts (CPUs, memory, NICs, fans, power-supply losses); the site's power usage
effectiveness (PUE) adds cooling and power distribution. Energy is that power over the wall
time of the run, restarts included (counted at training power: an upper bound, a few percent
of the run). Cost is GPU-hours times a price per GPU-hour.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "IDLE_POWER_FRACTION",
    "JOULES_PER_MWH",
    "NODE_OTHER_W_PER_GPU",
    "PUE",
    "cost",
    "energy_j",
    "gpu_hours",
    "gpu_power_w",
]

#: GPU power when it computes nothing (waiting in a collective, a pipeline bubble, idle), as a
#: fraction of its TDP. Engineering assumption, 0.15: an idle H100 SXM reports 70-120 W of its
#: 700 W in nvidia-smi, and a GPU spinning in an NCCL wait draws more than an idle one.
IDLE_POWER_FRACTION = 0.15

#: Power of a node's parts other than the GPUs, per GPU [W]: NVIDIA DGX H100 datasheet, system
#: power 10.2 kW maximum for 8 x 700 W GPUs: (10,200 - 5,600) / 8 = 575 W (two CPUs, 2 TB of
#: memory, 10 ConnectX-7 NICs, NVSwitches, fans, at their maximum).
NODE_OTHER_W_PER_GPU = 575.0

#: Power usage effectiveness of the site (facility power / IT power): 1.1, the trailing
#: twelve-month fleet average of Google's data centres (Google 2023 Environmental Report:
#: 1.10) and Meta's (Meta 2023 Sustainability Report: 1.08-1.09); the industry-wide average of
#: older sites is about 1.58 (Uptime Institute Global Data Center Survey 2023).
PUE = 1.1

JOULES_PER_MWH = 3.6e9


def gpu_power_w(tdp_w, busy_fraction, idle_fraction=IDLE_POWER_FRACTION):
    """Average power of one GPU over a step [W]: TDP while it computes, ``idle_fraction * TDP``
    while it waits: ``TDP * (idle + (1 - idle) * busy)``.

    Parameters
    ----------
    tdp_w : array_like
        Thermal design power of the board [W] (GPU spec ``tdp_w``).
    busy_fraction : array_like
        Share of the step the GPU computes (the step breakdown's compute time / step time).
    idle_fraction : array_like
        Power while waiting, as a fraction of TDP (:data:`IDLE_POWER_FRACTION`).

    Returns
    -------
    ndarray
        [W]. H100 (700 W), busy 0.8, idle 0.15: 700 (0.15 + 0.85 x 0.8) = 581 W.

    References
    ----------
    Llama Team 2024 (arXiv:2407.21783), model card: energy as GPU-hours x 700 W TDP; Patel et
    al. 2024 ("Characterizing power management opportunities for LLMs in the cloud", ASPLOS)
    measure training near TDP while computing.
    """
    tdp = np.asarray(tdp_w, dtype=float)
    idle = np.asarray(idle_fraction, dtype=float)
    busy = np.clip(np.asarray(busy_fraction, dtype=float), 0.0, 1.0)
    return tdp * (idle + (1.0 - idle) * busy)


def energy_j(gpus, wall_s, gpu_w, other_w_per_gpu=NODE_OTHER_W_PER_GPU, pue=PUE):
    """Facility energy of the run [J]: ``gpus * wall * (gpu_w + other_w) * PUE``.

    Parameters
    ----------
    gpus : array_like
        [count].
    wall_s : array_like
        Wall time of the run [s].
    gpu_w : array_like
        Average power of a GPU [W] (:func:`gpu_power_w`).
    other_w_per_gpu : array_like
        Node's other parts per GPU [W] (:data:`NODE_OTHER_W_PER_GPU`).
    pue : array_like
        Site PUE (:data:`PUE`).

    Returns
    -------
    ndarray
        [J]; divide by :data:`JOULES_PER_MWH` for MWh. 1,024 GPUs for 10 days at 581 W + 575 W
        and PUE 1.1: 1,024 x 864,000 x 1,156 x 1.1 = 1.125e12 J = 312.5 MWh.
    """
    return (np.asarray(gpus, dtype=float) * np.asarray(wall_s, dtype=float)
            * (np.asarray(gpu_w, dtype=float) + np.asarray(other_w_per_gpu, dtype=float))
            * np.asarray(pue, dtype=float))


def gpu_hours(gpus, wall_s):
    """GPU-hours the run holds: ``gpus * wall / 3600`` (the job keeps its GPUs through
    restarts)."""
    return np.asarray(gpus, dtype=float) * np.asarray(wall_s, dtype=float) / 3600.0


def cost(gpu_hours_, price_per_gpu_hour):
    """Cost of the run: GPU-hours times the price per GPU-hour (in the price's currency); NaN
    where no price is given."""
    price = np.nan if price_per_gpu_hour is None else price_per_gpu_hour
    return np.asarray(gpu_hours_, dtype=float) * np.asarray(price, dtype=float)
