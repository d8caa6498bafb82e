"""Memory per GPU, the recipe callers use: the even split of :mod:`perfmodel.memory.breakdown`
or, for rows with per-stage layouts, :mod:`perfmodel.memory.stage_layout`; and the largest
micro-batch that fits."""

from __future__ import annotations

import numpy as np

from perfmodel.memory.breakdown import DEFAULT_MEMORY_HEADROOM, Kernels, even_memory_breakdown
from perfmodel.memory.hsdp import with_hsdp_memory
from perfmodel.memory.optimizer_offload import offloaded_memory
from perfmodel.memory.stage_layout import layout_memory_breakdown
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = ["max_micro_batch_size", "memory_breakdown"]


def memory_breakdown(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    batch: ConfigBatch,
    *,
    kernels: Kernels = "fused",
    flash_attention: bool = True,
    dropout: bool | None = None,
    headroom: float = DEFAULT_MEMORY_HEADROOM,
) -> dict[str, np.ndarray]:
    """Peak memory per GPU, on the pipeline stage that needs most, and whether it fits: the
    even split's terms (:func:`perfmodel.memory.breakdown.even_memory_breakdown`, where the
    terms and their sources are listed) or, when any row carries a per-stage layout
    (``stage_layers``, the dynamic-programming search's), every stage's
    (:func:`perfmodel.memory.stage_layout.layout_memory_breakdown`); then the ZeRO-3 states of
    an HSDP shard group (:func:`perfmodel.memory.hsdp.with_hsdp_memory`) and what offload
    keeps on the host (:func:`perfmodel.memory.optimizer_offload.offloaded_memory`)."""
    mem = _states_memory_breakdown(model, training, cluster, batch, kernels=kernels,
                                   flash_attention=flash_attention, dropout=dropout,
                                   headroom=headroom)
    # hybrid sharding, then what offload takes to the host (both: mem itself when off)
    return offloaded_memory(with_hsdp_memory(mem, training, batch), training, batch)


def _states_memory_breakdown(model, training, cluster, batch, *, kernels, flash_attention,
                             dropout, headroom) -> dict[str, np.ndarray]:
    """:func:`memory_breakdown` before hybrid sharding and offload."""
    if kernels not in ("fused", "eager"):
        raise ValueError(f"kernels = {kernels!r}: expected 'fused' or 'eager'")
    if batch.stage_layers is not None and np.any(batch.has_layout):  # search/dp.py layouts
        if kernels == "eager":
            raise ValueError("per-stage layouts (stage_layers) are modelled for fused kernels")
        return layout_memory_breakdown(model, training, cluster, batch,
                                       flash_attention=flash_attention, dropout=dropout,
                                       headroom=headroom)
    return even_memory_breakdown(model, training, cluster, batch, kernels=kernels,
                                 flash_attention=flash_attention, dropout=dropout,
                                 headroom=headroom)


# ---------------------------------------------------------------------------------------------
# Adaptive micro-batch size (seed 9.3.4)
# ---------------------------------------------------------------------------------------------
def max_micro_batch_size(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    batch: ConfigBatch,
    *,
    kernels: Kernels = "fused",
    limit: int = 1024,
    keep_global_batch: bool = True,
) -> np.ndarray:
    """Largest micro-batch size that fits each configuration's memory (0: not even 1 fits).

    The other fields of each configuration stay; with ``keep_global_batch`` the number of
    micro-batches follows the micro-batch size (``m = ceil(B / (dp b))``, which matters for
    GPipe and for 1F1B when ``m < p``). Peak memory never falls as ``b`` grows, so a binary
    search over ``[1, limit]``, each step one vectorized :func:`memory_breakdown`, finds it.

    References
    ----------
    Seed chapter 9.3.4 (adaptive micro-batch size): ``M* = argmax M/(M+P-1)`` subject to
    ``M S_micro <= Memory``; that bound counts only GPipe's activations, see docs/memory.md.
    """
    n = len(batch)
    lo = np.zeros(n, dtype=np.int64)  # largest size known to fit
    hi = np.full(n, int(limit) + 1, dtype=np.int64)  # smallest size known not to fit
    dp = np.asarray(batch.dp, dtype=np.int64)
    fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        mid = np.where(hi - lo > 1, mid, np.maximum(lo, 1))
        f = dict(fields, micro_batch_size=mid)
        if keep_global_batch:
            f["num_microbatches"] = np.maximum(1, -(-training.global_batch_size // (dp * mid)))
        fits = memory_breakdown(model, training, cluster, ConfigBatch(**f), kernels=kernels)["fits"]
        active = hi - lo > 1
        lo = np.where(active & fits, mid, lo)
        hi = np.where(active & ~fits, mid, hi)
    return lo
