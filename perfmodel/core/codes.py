"""The categorical codes of a parallel configuration, defined once.

A :class:`~perfmodel.parallel.config.ConfigBatch` stores each categorical field as the index of
its name in these tuples, so the cost terms compare integer arrays with the members of the
``IntEnum`` classes (``batch.recompute == Recompute.FULL``); the ``Literal`` types are the names
the specs and the command line accept.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Literal

__all__ = [
    "COMPRESSION",
    "CP_COMM",
    "RECOMPUTE",
    "SCHEDULE",
    "Compression",
    "CompressionName",
    "CpComm",
    "CpCommName",
    "Recompute",
    "RecomputeName",
    "Schedule",
    "ScheduleName",
]

RECOMPUTE = ("none", "selective", "full")
SCHEDULE = ("gpipe", "1f1b", "interleaved", "zb")
COMPRESSION = ("none", "topk", "int8", "1bit")
CP_COMM = ("p2p", "a2a", "allgather", "a2a+p2p")

RecomputeName = Literal["none", "selective", "full"]
ScheduleName = Literal["gpipe", "1f1b", "interleaved", "zb"]
CompressionName = Literal["none", "topk", "int8", "1bit"]
CpCommName = Literal["p2p", "a2a", "allgather", "a2a+p2p"]


class Recompute(IntEnum):
    """Activation recomputation: the code of each name of :data:`RECOMPUTE`."""

    NONE = 0
    SELECTIVE = 1  # the attention core (Korthikanti et al. 2022, Sec. 5)
    FULL = 2  # every layer's forward again in the backward pass


class Schedule(IntEnum):
    """Pipeline schedule: the code of each name of :data:`SCHEDULE`."""

    GPIPE = 0
    ONE_F_ONE_B = 1  # "1f1b"
    INTERLEAVED = 2
    ZB = 3  # zero bubble


class Compression(IntEnum):
    """Gradient compression: the code of each name of :data:`COMPRESSION`."""

    NONE = 0
    TOPK = 1
    INT8 = 2
    ONE_BIT = 3  # "1bit"


class CpComm(IntEnum):
    """Context-parallel communication: the code of each name of :data:`CP_COMM` (Megatron-Core
    ``cp_comm_type``)."""

    P2P = 0  # ring attention: K/V chunks passed around the cp group (perfmodel.comm.cp_ring)
    A2A = 1  # Ulysses: Q, K, V and the output exchanged by head (perfmodel.comm.cp_a2a)
    ALLGATHER = 2  # K/V all-gathered before attention (perfmodel.comm.cp_allgather)
    A2A_P2P = 3  # hierarchical: a2a inside the inner group, the ring across the outer one
    # (perfmodel.comm.cp_hierarchical)
