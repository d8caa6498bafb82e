"""The categorical codes of a parallel configuration, defined once.

A :class:`~perfmodel.parallel.config.ConfigBatch` stores each categorical field as the index of
its name in these tuples (``recompute == 2`` is full recompute), so the cost terms compare
integer arrays; the ``Literal`` types are the names the specs and the command line accept.
"""

from __future__ import annotations

from typing import Literal

RECOMPUTE = ("none", "selective", "full")
SCHEDULE = ("gpipe", "1f1b", "interleaved", "zb")
COMPRESSION = ("none", "topk", "int8", "1bit")

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved", "zb"]
Compression = Literal["none", "topk", "int8", "1bit"]
