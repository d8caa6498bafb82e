"""Placement of parallel groups on a tiered interconnect: which tier each group crosses, and at
what per-GPU bandwidth and latency its collectives run.

Layout (Megatron-LM's default, see :mod:`perfmodel.parallel.config`): rank
``r = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank))``. A group of ``g`` GPUs with rank stride
``s`` occupies one aligned block of ``g*s`` consecutive ranks, so it lies inside one domain of a
tier with domain size ``D`` exactly when ``g*s`` divides ``D`` (otherwise at least one group
straddles a domain boundary, and since the groups run in lock-step the slowest sets the pace).

Bandwidth of a group's ring (all-reduce, all-gather, reduce-scatter, tree):
    the traffic between two tier-``(t-1)`` domains crosses tier ``t``; a tier-``(t-1)`` domain holds
    ``m_{t-1}`` members of the group, each with its own tier-``t`` port (rail-optimised NICs, one per
    GPU), so the ring's boundary hop runs at ``m_{t-1} * B_t / oversubscription_t``. The ring runs at
    the minimum of that over the tiers it uses (``m_{-1} = 1``: a GPU's own NVLink port). For a
    group with one member per node this is just the slowest tier's per-GPU bandwidth; for a
    16-GPU data-parallel group on two DGX A100 nodes it is ``min(300, 8 * 25) = 200`` GB/s, the
    ~190 GB/s bus bandwidth nccl-tests report for multi-node all-reduce on such machines.
Point-to-point sends (pipeline stages, ring attention) use one GPU's port of the outermost tier
crossed, ``B_T / oversubscription_T``.
Latency: the latency of the outermost tier crossed (a conservative per-step ``alpha``).
Measured bus bandwidth: where the outermost tier a group crosses carries an nccl-tests table
(``LinkTier.busbw_gbyte_per_s``), the group's collectives run at the measured ``busbw`` of its
size instead (:func:`measured_busbw_bytes_per_s`, :attr:`GroupPlacement.busbw_bytes_per_s`).

References
----------
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC21, Sec. 3.3 (tensor parallel inside a node, pipeline across) and Sec. 4.1
(rail-optimised 8 x HDR per DGX A100); NCCL ``src/graph/tuning.cc`` (inter-node ring bus bandwidth =
channels x per-NIC speed); NVIDIA DGX SuperPOD reference architecture (rail-optimised fat tree).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.core import units
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ClusterSpec

__all__ = ["MEASURED_COLLECTIVES", "GroupPlacement", "group_placement",
           "measured_busbw_bytes_per_s", "nested_group_placement", "parallel_group_tiers",
           "parallel_groups", "tier_arrays"]

MEASURED_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""Collectives a tier's nccl-tests table may name: the columns of
:attr:`GroupPlacement.busbw_bytes_per_s`, in this order."""


@dataclass(frozen=True)
class GroupPlacement:
    """Where one kind of parallel group sits, for each configuration of a batch (arrays).

    Attributes
    ----------
    size : group size ``g`` [GPUs]
    stride : rank stride ``s`` between consecutive members
    tier : index of the outermost tier the group crosses (0 = innermost); -1 when ``g <= 1``
    bw_bytes_per_s : per-GPU bandwidth of a flat ring / tree over the whole group [bytes/s]
    latency_s : per-step latency of a flat ring / tree [s]
    p2p_bw_bytes_per_s : bandwidth of one send between neighbouring members [bytes/s]
    intra_size : members per innermost (scale-up) domain, for hierarchical all-reduce
    inter_size : number of innermost domains the group spans (``ceil(g / intra_size)``)
    intra_bw_bytes_per_s, intra_latency_s : ring inside a domain [bytes/s], [s]
    inter_bw_bytes_per_s, inter_latency_s : ring across domains, one member per domain [bytes/s], [s]
    busbw_bytes_per_s : measured nccl-tests bus bandwidth of the group [bytes/s], shape
        ``(n, 4)``, one column per :data:`MEASURED_COLLECTIVES`; NaN where the group's tier has
        no table (:func:`measured_busbw_bytes_per_s`)
    """

    size: np.ndarray
    stride: np.ndarray
    tier: np.ndarray
    bw_bytes_per_s: np.ndarray
    latency_s: np.ndarray
    p2p_bw_bytes_per_s: np.ndarray
    intra_size: np.ndarray
    inter_size: np.ndarray
    intra_bw_bytes_per_s: np.ndarray
    intra_latency_s: np.ndarray
    inter_bw_bytes_per_s: np.ndarray
    inter_latency_s: np.ndarray
    busbw_bytes_per_s: np.ndarray

    def measured_bw_bytes_per_s(self, collective: str) -> np.ndarray:
        """Measured bus bandwidth of ``collective`` [bytes/s], NaN where none is given."""
        return self.busbw_bytes_per_s[..., MEASURED_COLLECTIVES.index(collective)]

    def bw_for(self, collective: str) -> np.ndarray:
        """Per-GPU bandwidth [bytes/s] ``collective`` runs at on this group: the measured bus
        bandwidth where the tier has one, else the analytic ring bandwidth."""
        m = self.measured_bw_bytes_per_s(collective)
        return np.where(np.isfinite(m), m, self.bw_bytes_per_s)


def measured_busbw_bytes_per_s(cluster: ClusterSpec, collective: str, tier: ArrayLike,
                               size: ArrayLike) -> np.ndarray:
    """Measured bus bandwidth [bytes/s] of ``collective`` on groups of ``size`` GPUs whose
    outermost tier is ``tier`` (arrays); NaN where that tier has no table, or ``size < 2``.

    The tier's ``busbw_gbyte_per_s`` row of the collective (else its ``all_reduce`` row: nccl-tests
    defines bus bandwidth so that it compares across collectives) is interpolated linearly in
    ``log2(size)`` between the measured group sizes and held constant outside them.

    Example: ``all_reduce = {2: 20.0, 8: 12.0}`` gives 16.0 GB/s at 4 GPUs, 12.0 at 16.

    References
    ----------
    NCCL-tests ``doc/PERFORMANCE.md``, "Bus bandwidth": ``busbw = algbw * 2(n-1)/n`` for
    all-reduce, ``algbw * (n-1)/n`` for all-gather and reduce-scatter, "a number comparable to
    the hardware peak bandwidth, independently of the number of ranks used".
    """
    tier = np.asarray(tier, dtype=np.int64)
    size = np.asarray(size, dtype=np.float64)
    out = np.full(np.broadcast(tier, size).shape, np.nan)
    for t, link in enumerate(cluster.tiers):
        table = link.busbw_gbyte_per_s or {}
        row = table.get(collective, table.get("all_reduce"))
        if not row:
            continue
        ns = sorted(row)
        gb = np.interp(np.log2(np.maximum(size, 1.0)), np.log2(ns), [row[n] for n in ns])
        out = np.where((tier == t) & (size >= 2), gb * units.GIGA, out)
    return out


def _busbw_columns(cluster: ClusterSpec, tier: np.ndarray, size: np.ndarray) -> np.ndarray:
    """:func:`measured_busbw_bytes_per_s` of every :data:`MEASURED_COLLECTIVES`, shape
    ``(n, 4)`` (all NaN, cheaply, when no tier has a table)."""
    if not any(t.busbw_gbyte_per_s for t in cluster.tiers):
        return np.full((*np.shape(size), len(MEASURED_COLLECTIVES)), np.nan)
    return np.stack([measured_busbw_bytes_per_s(cluster, c, tier, size)
                     for c in MEASURED_COLLECTIVES], axis=-1)


def tier_arrays(cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Domain sizes [GPUs], effective per-GPU bandwidths (bandwidth / oversubscription)
    [bytes/s] and latencies [s] of the cluster's tiers, innermost first."""
    sizes = np.array(cluster.tier_domain_sizes(), dtype=np.float64)
    bws = np.array([t.effective_bw_bytes_per_s for t in cluster.tiers], dtype=np.float64)
    lats = np.array([t.latency_s for t in cluster.tiers], dtype=np.float64)
    return sizes, bws, lats


def _flat(
    g: np.ndarray, s: np.ndarray, sizes: np.ndarray, bws: np.ndarray, lats: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Flat placement of groups (g, s) [int64 arrays]: (tier, ring bw, latency, p2p bw, members
    per innermost domain)."""
    return _flat_levels(((g, s),), sizes, bws, lats)


def _members_in_domain(levels, d: int) -> np.ndarray:
    """Members of a nested group inside one aligned domain of ``d`` consecutive ranks (the
    fewest, where they are uneven): ``prod_i clip(d // s_i, 1, g_i)``."""
    m = np.ones(np.shape(levels[0][0]), dtype=np.int64)
    for g, s in levels:
        m = m * np.clip(d // s, 1, g)
    return m


def _flat_levels(levels, sizes: np.ndarray, bws: np.ndarray, lats: np.ndarray
                 ) -> tuple[np.ndarray, ...]:
    """Flat placement of nested groups ``levels = ((g_1, s_1), (g_2, s_2), ...)`` [int64
    arrays, innermost first, ``s_{i+1} >= g_i * s_i``]: a member for every index combination,
    rank ``sum_i idx_i * s_i``. (tier, ring bw, latency, p2p bw, members per innermost domain)."""
    g = np.ones(np.shape(levels[0][0]), dtype=np.int64)
    block = np.ones_like(g)  # the aligned block of ranks the group spans
    for gi, si in levels:
        g = g * gi
        block = np.maximum(block, np.where(gi > 1, gi * si, 1))
    n_tiers = len(sizes)
    tier = np.full(g.shape, n_tiers - 1, dtype=np.int64)
    found = np.zeros(g.shape, dtype=bool)
    bw = np.full(g.shape, np.inf)
    m_prev = np.ones(g.shape, dtype=np.int64)
    m0 = g
    for t in range(n_tiers):
        d = int(sizes[t])
        # inside one tier-t domain: the aligned block of the group's ranks divides the domain
        inside = (d % block == 0) if t < n_tiers - 1 else np.ones(g.shape, dtype=bool)
        # members of the group inside one tier-t domain (the fewest, where they are uneven)
        m_t = np.where(inside, g, _members_in_domain(levels, d))
        if t == 0:
            m0 = m_t
        used = (m_t > m_prev) & ~found  # traffic crosses tier-t links
        bw = np.where(used, np.minimum(bw, m_prev * bws[t]), bw)
        tier = np.where(inside & ~found, t, tier)
        found |= inside
        m_prev = m_t
    tier = np.where(g <= 1, -1, tier)
    t_idx = np.maximum(tier, 0)
    bw = np.where(np.isfinite(bw), bw, bws[0])
    return tier, bw, lats[t_idx], bws[t_idx], m0


def group_placement(cluster: ClusterSpec, size: ArrayLike, stride: ArrayLike) -> GroupPlacement:
    """Placement of groups of ``size`` GPUs whose members are ``stride`` ranks apart.

    Parameters
    ----------
    cluster : the cluster (tiers innermost first)
    size : group size ``g`` [GPUs], array
    stride : rank stride ``s``, array (1 for tensor parallel, ``tp`` for context parallel, ...)

    Returns
    -------
    GroupPlacement with arrays of the broadcast shape.

    References
    ----------
    Module docstring; Narayanan et al. 2021, Sec. 3.3 and 4.1.
    """
    return nested_group_placement(cluster, ((size, stride),))


def nested_group_placement(cluster: ClusterSpec,
                           levels: tuple[tuple[ArrayLike, ArrayLike], ...]) -> GroupPlacement:
    """Placement of groups that are the product of nested strided levels, innermost first:
    ``levels = ((g_1, s_1), (g_2, s_2), ...)`` with ``s_{i+1} >= g_i * s_i``; the members are
    the ranks ``sum_i idx_i * s_i`` (``0 <= idx_i < g_i``), ``prod_i g_i`` GPUs. One level is
    :func:`group_placement`. Example: Megatron-Core 0.9's expert-data-parallel group with
    context parallelism is ``cp`` ranks ``tp`` apart times ``dp/ep`` ranks ``tp*cp*ep`` apart
    (:mod:`perfmodel.moe.expert_layout`).

    A tier-``t`` domain of ``D`` consecutive ranks holds ``prod_i clip(D // s_i, 1, g_i)``
    members (all of them when ``D`` is a multiple of the outermost level's block
    ``g_n * s_n``); ring bandwidth, tier and latency follow as for one level (module
    docstring). The hierarchical all-reduce's inter-domain ring keeps one member per innermost
    domain: level ``i`` becomes ``ceil(g_i / m_i)`` members ``s_i * m_i`` apart, ``m_i`` its
    members inside one innermost domain.
    """
    arrs = np.broadcast_arrays(*[np.asarray(np.rint(x), dtype=np.int64)
                                 for level in levels for x in level])
    lv = tuple((np.maximum(arrs[2 * i], 1), np.maximum(arrs[2 * i + 1], 1))
               for i in range(len(levels)))
    sizes, bws, lats = tier_arrays(cluster)
    tier, bw, lat, p2p_bw, m0 = _flat_levels(lv, sizes, bws, lats)
    g = np.prod(np.stack([gi for gi, _ in lv]), axis=0)
    # hierarchical: ring inside each innermost domain, then across domains (one member each)
    d0 = int(sizes[0])
    inside0 = m0 == g
    m_lv = [np.where(inside0, gi, np.clip(d0 // si, 1, gi)) for gi, si in lv]
    inter_lv = tuple((-(-gi // mi), si * mi) for (gi, si), mi in zip(lv, m_lv, strict=True))
    inter = np.prod(np.stack([gi for gi, _ in inter_lv]), axis=0)
    _, inter_bw, inter_lat, _, _ = _flat_levels(inter_lv, sizes, bws, lats)
    return GroupPlacement(
        size=g.astype(np.float64),
        stride=lv[0][1].astype(np.float64),
        tier=tier,
        bw_bytes_per_s=bw,
        latency_s=lat,
        p2p_bw_bytes_per_s=p2p_bw,
        intra_size=m0.astype(np.float64),
        inter_size=inter.astype(np.float64),
        intra_bw_bytes_per_s=np.full(g.shape, bws[0]),
        intra_latency_s=np.full(g.shape, lats[0]),
        inter_bw_bytes_per_s=inter_bw,
        inter_latency_s=inter_lat,
        busbw_bytes_per_s=_busbw_columns(cluster, tier, g.astype(np.float64)),
    )


def _spread_groups(cluster: ClusterSpec, batch: ConfigBatch, sub_batch: ConfigBatch,
                   codes: np.ndarray, names: tuple[str, ...] | None) -> dict[str, GroupPlacement]:
    """:func:`parallel_groups` of ``batch`` from its distinct rows ``sub_batch``
    (``batch == sub_batch[codes]``), each group spread back once per batch and cluster
    (communication time, the shared links and the data-parallel terms all ask for them): the
    arrays are shared and read-only."""
    cache = batch.__dict__.setdefault("_group_cache", {})
    keys = tuple(("tp", "cp", "dp", "dp_cp", "pp") if names is None else names)
    missing = [k for k in keys if cache.get(k, (None,))[0] is not cluster]
    if missing:
        for k, g in parallel_groups(cluster, sub_batch, tuple(missing)).items():
            spread = {f.name: getattr(g, f.name).take(codes, axis=0) for f in fields(g)}
            for v in spread.values():
                v.setflags(write=False)
            cache[k] = (cluster, GroupPlacement(**spread))
    return {k: cache[k][1] for k in keys}


def parallel_group_tiers(cluster: ClusterSpec, batch: ConfigBatch, names: tuple[str, ...]
                         ) -> dict[str, np.ndarray]:
    """The ``tier`` of :func:`parallel_groups`' groups ``names`` alone: a search batch places
    each distinct (tp, cp, dp, pp) once and spreads back its tier only (read-only arrays)."""
    if len(batch) <= 256:
        return {k: g.tier for k, g in parallel_groups(cluster, batch, names).items()}
    sub_batch, codes = batch.unique_by(("tp", "cp", "dp", "pp"))
    cache = batch.__dict__.setdefault("_tier_cache", {})
    for k in names:
        if cache.get(k, (None,))[0] is not cluster:
            tier = parallel_groups(cluster, sub_batch, (k,))[k].tier.take(codes, axis=0)
            tier.setflags(write=False)
            cache[k] = (cluster, tier)
    return {k: cache[k][1] for k in names}


def parallel_groups(
    cluster: ClusterSpec, batch: ConfigBatch, names: tuple[str, ...] | None = None
) -> dict[str, GroupPlacement]:
    """Placement of every parallel group of each configuration (layout tp, cp, dp, pp).

    ``names`` restricts the result to some of the keys below (saves time on large batches).

    Returns
    -------
    dict with keys
        ``tp`` (size tp, stride 1), ``cp`` (size cp, stride tp), ``dp`` (size dp, stride tp*cp),
        ``dp_cp`` (size dp*cp, stride tp: the group that reduces gradients, since context-parallel
        ranks hold the same weights), ``pp`` (size pp, stride tp*cp*dp).

    References
    ----------
    Megatron-LM ``megatron/core/parallel_state.py`` (rank generator order ``tp-cp-ep-dp-pp``;
    gradients reduced over the data-parallel-with-context-parallel group).
    """
    tp, cp, dp, pp = batch.tp, batch.cp, batch.dp, batch.pp
    if len(tp) > 256:
        # A search batch has few distinct (tp, cp, dp, pp): place each once, spread back.
        sub_batch, codes = batch.unique_by(("tp", "cp", "dp", "pp"))  # exact (no hash collisions)
        if len(sub_batch) < len(tp):
            return _spread_groups(cluster, batch, sub_batch, codes, names)
    layout = {  # (size, stride)
        "tp": (tp, 1),
        "cp": (cp, tp),
        "dp": (dp, tp * cp),
        "dp_cp": (dp * cp, tp),
        "pp": (pp, tp * cp * dp),
    }
    keys = layout if names is None else names
    return {k: group_placement(cluster, *layout[k]) for k in keys}
