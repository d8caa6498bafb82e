"""Memory of hybrid sharding (HSDP): ZeRO-3 states sharded over a group of ``s`` data-parallel
ranks instead of all ``dp`` (:mod:`perfmodel.comm.hsdp` for the communication).

Each rank holds ``1 / (s cp)`` instead of ``1 / (dp cp)`` of the weights, gradients and optimizer
states: those three terms grow by ``dp / s`` on ZeRO-3 rows; activations and buffers do not change
(torchtitan ``parallelize_llama``: ``fully_shard`` on the ``(dp_replicate, dp_shard)`` mesh shards
over ``dp_shard`` only). The routed experts' states, sharded over expert-dp, are scaled the same way
(an approximation: torchtitan shards them over its own ``dp_shard_mod_ep`` mesh).
"""

from __future__ import annotations

import numpy as np

from perfmodel.comm.hsdp import shard_degree
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import TrainingSpec

__all__ = ["hsdp_state_factor", "with_hsdp_memory", "with_peak_change"]

_STATES = ("weights", "gradients", "optimizer")


def hsdp_state_factor(dp, zero_stage, shard: int) -> np.ndarray:
    """Growth of the per-GPU model states under HSDP: ``dp / s`` on ZeRO-3 rows, else 1.

    Example: dp = 32, shard 8, ZeRO-3: 4.0; ZeRO-1: 1.0; shard 0: 1.0."""
    dp = np.asarray(dp, dtype=np.int64)
    s = shard_degree(dp, shard)
    return np.where(np.asarray(zero_stage) == 3, dp / s, 1.0).astype(np.float64)


def with_hsdp_memory(mem: dict[str, np.ndarray], training: TrainingSpec, batch: ConfigBatch
                     ) -> dict[str, np.ndarray]:
    """:func:`perfmodel.memory.recipe.memory_breakdown`'s dict with the ZeRO-3 states of the
    HSDP shard group (:func:`hsdp_state_factor`), peak and fit updated; ``mem`` itself when
    ``training.hsdp_shard`` is 0."""
    if not training.hsdp_shard:
        return mem
    f = hsdp_state_factor(batch.dp, batch.zero_stage, training.hsdp_shard)
    out = dict(mem)
    added = np.zeros_like(np.asarray(mem["peak"], dtype=np.float64))
    for k in _STATES:
        out[k] = np.asarray(mem[k], dtype=np.float64) * f
        added = added + out[k] - mem[k]
    return with_peak_change(out, added)


def with_peak_change(out: dict[str, np.ndarray], added) -> dict[str, np.ndarray]:
    """``out`` with ``added`` [bytes] on its peak (and allocated peak) and the fit re-checked."""
    out["peak"] = np.asarray(out["peak"], dtype=np.float64) + added
    if "peak_allocated" in out:
        out["peak_allocated"] = np.asarray(out["peak_allocated"], dtype=np.float64) + added
    if "usable" in out:
        out["fits"] = out["peak"] <= out["usable"]
    return out
