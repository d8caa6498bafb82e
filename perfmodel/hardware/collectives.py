"""Collective communication costs with the alpha-beta (latency + bytes / bandwidth) model.

Every function is a pure ``numpy`` function that broadcasts over its array arguments, so one call
prices millions of (message size, group size, link) combinations. Conventions (NCCL's):

* ``size_bytes`` is the full buffer size per GPU: the all-reduce input, the all-gather *output*,
  the reduce-scatter *input* (``S`` in NCCL-tests ``PERFORMANCE.md``).
* ``bw_bytes_per_s`` is the per-GPU unidirectional link bandwidth the ring runs at (the "bus
  bandwidth" a perfect implementation reaches); ``latency_s`` the per-step latency ``alpha``.
* A group of ``n <= 1`` GPUs costs nothing (0 s, 0 bytes).

Algorithms for all-reduce (the only collective where NCCL chooses between several):

``ring``
    reduce-scatter then all-gather around a ring: ``2(n-1) alpha + 2(n-1)/n * S / B``.
``tree``
    NCCL's double binary tree (two complementary trees, each carrying half the data, pipelined):
    latency ``2 ceil(log2 n) alpha`` (reduce up, broadcast down), bandwidth term ``2 S / B``
    (NCCL's tuning model converts bus to algorithm bandwidth with a ratio of 1/2 for trees, versus
    ``n / (2(n-1))`` for rings), so trees win on latency and rings on bandwidth.
``hierarchical``
    reduce-scatter inside each scale-up domain (``n_intra`` GPUs), all-reduce of the ``S/n_intra``
    shard across the ``n_inter`` domains (the faster of ring and tree), all-gather inside.
``auto``
    element-wise minimum over the three, so "small messages want tree, large want ring" comes out
    of the numbers instead of a size threshold.

References
----------
NCCL-tests ``doc/PERFORMANCE.md`` (bus-bandwidth factors); NCCL ``src/graph/tuning.cc``
(``nsteps``, tree/ring ratio, ``log2i(nNodes)`` tree latency); Thakur, Rabenseifner & Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), Sec. 4 (ring /
reduce-scatter + all-gather cost ``2(p-1)/p * n * beta``); Sanders, Speck & Traeff 2009, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan" (double binary tree); Jeaugey 2019,
"Massively Scale Your Deep Learning Training with NCCL 2.4" (NVIDIA blog, trees in NCCL).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "NCCL_BASE_LATENCY_S",
    "all_gather_bytes_per_gpu",
    "all_gather_time",
    "all_reduce_bytes_per_gpu",
    "all_reduce_time",
    "all_to_all_time",
    "broadcast_time",
    "bus_bandwidth_factor",
    "bytes_per_gpu",
    "collective_base_s",
    "collective_time",
    "hierarchical_all_reduce_time",
    "p2p_time",
    "reduce_scatter_bytes_per_gpu",
    "reduce_scatter_time",
    "ring_all_reduce_time",
    "tree_all_reduce_time",
]

ALGORITHMS = ("ring", "tree", "hierarchical", "auto")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "p2p")

Algorithm = Literal["ring", "tree", "hierarchical", "auto"]
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "p2p"]


def _f(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


NCCL_BASE_LATENCY_S = 8.4e-6
"""Fixed cost of one NCCL collective [s], paid once per call on top of its per-step latencies
``alpha`` and its bytes: the kernel launch and the protocol's setup. NCCL's own cost model
prices every ring and tree collective as ``baseLat + nsteps * hwLat + bytes / bw`` with
``baseLat`` = 8.4 us for the Simple protocol (6.6 us LL, 14 us LL128) that messages of more
than a few hundred KiB use, whatever the link (NCCL ``src/graph/tuning.cc``, ``baseLat``,
2.18-2.23); the per-step ``hwLat`` (NVLink ring Simple 3.4 us, PCIe 5.7 us, network 14 us) is
the tier's ``latency_us``. It matters for collectives issued per layer: a tensor-parallel
all-reduce of 8 GPUs on NVLink pays 8.4 + 14 x 3 = 50 us before its bytes."""

MIN_BW_BYTES_PER_S = 1e3
"""Slowest link the calculators accept [bytes/s] (1 kB/s; a serial line is faster). A smaller
value is a unit mistake (1e-300 gave a 300-digit step time), so it raises instead."""


def _bw(x: ArrayLike) -> np.ndarray:
    """A bandwidth [bytes/s]: at least :data:`MIN_BW_BYTES_PER_S` (inf allowed), else ValueError."""
    b = _f(x)
    if not np.all(b >= MIN_BW_BYTES_PER_S):  # also catches NaN
        bad = b[~(b >= MIN_BW_BYTES_PER_S)].ravel()[0]
        raise ValueError(
            f"bw_bytes_per_s = {bad!r}: expected at least {MIN_BW_BYTES_PER_S:g} bytes/s"
        )
    return b


def _lat(x: ArrayLike) -> np.ndarray:
    """A latency [s]: finite and >= 0, else ValueError (a negative latency gave negative time)."""
    a = _f(x)
    if not np.all((a >= 0.0) & np.isfinite(a)):
        bad = a[~((a >= 0.0) & np.isfinite(a))].ravel()[0]
        raise ValueError(f"latency_s = {bad!r}: expected a finite value >= 0")
    return a


def _size(x: ArrayLike) -> np.ndarray:
    """A message size [bytes]: >= 0 (inf allowed for masked points), else ValueError."""
    a = _f(x)
    if not np.all(a >= 0.0):
        bad = a[~(a >= 0.0)].ravel()[0]
        raise ValueError(f"size_bytes = {bad!r}: expected a value >= 0")
    return a


# --------------------------------------------------------------------------------------------
# Bytes: what each GPU sends (= receives) for one collective
# --------------------------------------------------------------------------------------------
def collective_base_s(n: ArrayLike, count: ArrayLike = 1.0) -> np.ndarray:
    """Fixed cost [s] of ``count`` NCCL collectives over groups of ``n`` GPUs:
    ``count * NCCL_BASE_LATENCY_S`` (0 where ``n <= 1``: no collective is issued).

    Example: the 4 all-reduces of a tensor-parallel layer (forward and backward) pay
    4 x 8.4 = 33.6 us; with sequence parallelism (all-gather + reduce-scatter) 8 x 8.4 = 67.2 us.

    References
    ----------
    NCCL ``src/graph/tuning.cc`` (``baseLat``), see :data:`NCCL_BASE_LATENCY_S`.
    """
    n = _f(n)
    return np.where(n > 1, _f(count) * NCCL_BASE_LATENCY_S, 0.0)


def bus_bandwidth_factor(collective: Collective, n: ArrayLike) -> np.ndarray:
    """Bus-bandwidth factor: bytes each GPU sends per byte of buffer, for the bandwidth-optimal
    algorithm (``busbw = algbw * factor``).

    all-reduce ``2(n-1)/n``; all-gather, reduce-scatter and all-to-all ``(n-1)/n``; broadcast and
    p2p ``1``. Zero for ``n <= 1``.

    Parameters
    ----------
    collective : one of :data:`COLLECTIVES`
    n : group size [GPUs]

    References
    ----------
    NCCL-tests ``doc/PERFORMANCE.md``, section "Bus bandwidth" (all-reduce ``2(n-1)/n``,
    reduce-scatter / all-gather ``(n-1)/n``, broadcast 1); all-to-all as in NCCL-tests'
    ``alltoall.cu`` (``(n-1)/n``).
    """
    n = _f(n)
    safe = np.maximum(n, 1.0)
    if collective == "all_reduce":
        f = 2.0 * (safe - 1.0) / safe
    elif collective in ("all_gather", "reduce_scatter", "all_to_all"):
        f = (safe - 1.0) / safe
    elif collective in ("broadcast", "p2p"):
        f = np.ones_like(safe)
    else:
        raise ValueError(f"collective '{collective}' is not one of {COLLECTIVES}")
    return np.where(n > 1, f, 0.0)


def bytes_per_gpu(collective: Collective, size_bytes: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Bytes each GPU sends for one ``collective`` on a buffer of ``size_bytes`` [bytes] over
    ``n`` GPUs (ring algorithms): ``bus_bandwidth_factor(collective, n) * size_bytes``.

    References
    ----------
    NCCL-tests ``doc/PERFORMANCE.md``; Thakur et al. 2005, Sec. 4.
    """
    return bus_bandwidth_factor(collective, n) * _f(size_bytes)


def all_reduce_bytes_per_gpu(size_bytes: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Ring all-reduce: each GPU sends ``2(n-1)/n * size_bytes`` [bytes] (NCCL-tests
    ``PERFORMANCE.md``). Equals reduce-scatter plus all-gather of the same buffer."""
    return bytes_per_gpu("all_reduce", size_bytes, n)


def all_gather_bytes_per_gpu(size_bytes: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Ring all-gather of an output buffer of ``size_bytes``: ``(n-1)/n * size_bytes`` sent per GPU
    (NCCL-tests ``PERFORMANCE.md``)."""
    return bytes_per_gpu("all_gather", size_bytes, n)


def reduce_scatter_bytes_per_gpu(size_bytes: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Ring reduce-scatter of an input buffer of ``size_bytes``: ``(n-1)/n * size_bytes`` sent per
    GPU (NCCL-tests ``PERFORMANCE.md``)."""
    return bytes_per_gpu("reduce_scatter", size_bytes, n)


# --------------------------------------------------------------------------------------------
# All-reduce algorithms
# --------------------------------------------------------------------------------------------
def ring_all_reduce_time(
    size_bytes: ArrayLike, n: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Ring all-reduce [s]: ``2(n-1) * alpha + 2(n-1)/n * S / B``.

    Parameters
    ----------
    size_bytes : buffer size per GPU ``S`` [bytes]
    n : group size [GPUs]
    bw_bytes_per_s : per-GPU ring bandwidth ``B`` [bytes/s]
    latency_s : per-step latency ``alpha`` [s]

    References
    ----------
    Thakur et al. 2005, Sec. 4.4 (reduce-scatter + all-gather); NCCL ``tuning.cc``
    (``nsteps = 2(nRanks-1)``); NCCL-tests ``PERFORMANCE.md``.
    """
    n = _f(n)
    steps = 2.0 * np.maximum(n - 1.0, 0.0)
    t = steps * _lat(latency_s) + all_reduce_bytes_per_gpu(_size(size_bytes), n) / _bw(bw_bytes_per_s)
    return np.where(n > 1, t, 0.0)


def tree_all_reduce_time(
    size_bytes: ArrayLike, n: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Double-binary-tree all-reduce [s]: ``2 ceil(log2 n) * alpha + 2 S / B``.

    A reduce up the tree then a broadcast down it: ``ceil(log2 n)`` hops each way. The two
    complementary trees each carry half the buffer and every GPU is an inner node of at most one
    of them, so the pipelined bandwidth term is ``2 S / B`` (not ``log n * S / B`` as the seed
    chapter's ``O(log N * M)`` suggests, which describes a single non-pipelined tree).

    References
    ----------
    Sanders, Speck & Traeff 2009 (two-tree algorithms, Sec. 3); NCCL ``src/graph/tuning.cc``
    (tree algorithm bandwidth = bus bandwidth * 0.5; latency ``2 * log2i(nNodes) * interLat``);
    Jeaugey 2019 (NVIDIA blog, "Massively Scale ... with NCCL 2.4").
    """
    n = _f(n)
    depth = np.ceil(np.log2(np.maximum(n, 1.0)))
    t = 2.0 * depth * _lat(latency_s) + 2.0 * _size(size_bytes) / _bw(bw_bytes_per_s)
    return np.where(n > 1, t, 0.0)


def hierarchical_all_reduce_time(
    size_bytes: ArrayLike,
    n_intra: ArrayLike,
    n_inter: ArrayLike,
    intra_bw_bytes_per_s: ArrayLike,
    inter_bw_bytes_per_s: ArrayLike,
    intra_latency_s: ArrayLike = 0.0,
    inter_latency_s: ArrayLike = 0.0,
) -> np.ndarray:
    """Hierarchical all-reduce [s] over ``n_intra * n_inter`` GPUs.

    1. reduce-scatter of ``S`` inside each domain (ring over ``n_intra`` GPUs at the intra bw);
    2. all-reduce of the ``S / n_intra`` shard across the ``n_inter`` domains, ``n_intra`` such
       all-reduces running in parallel, each GPU on its own inter-domain link (the faster of ring
       and tree);
    3. all-gather of ``S`` inside each domain.

    With ``n_inter == 1`` this is exactly the ring all-reduce over ``n_intra`` GPUs.

    References
    ----------
    Jia et al. 2018, "Highly Scalable Deep Learning Training System with Mixed-Precision"
    (hierarchical all-reduce, Sec. 4.2); Goyal et al. 2017, "Accurate, Large Minibatch SGD"
    (Sec. 4: intra-node reduce, inter-node all-reduce, intra-node broadcast). The seed chapter's
    ``hierarchical_all_reduce`` uses all-reduce + broadcast inside the node, which moves
    ``n_intra`` times more data across domains than the reduce-scatter form used here.
    """
    size = _size(size_bytes)
    n_intra = _f(n_intra)
    n_inter = _f(n_inter)
    shard = size / np.maximum(n_intra, 1.0)
    rs = reduce_scatter_time(size, n_intra, intra_bw_bytes_per_s, intra_latency_s)
    ar = np.minimum(
        ring_all_reduce_time(shard, n_inter, inter_bw_bytes_per_s, inter_latency_s),
        tree_all_reduce_time(shard, n_inter, inter_bw_bytes_per_s, inter_latency_s),
    )
    ag = all_gather_time(size, n_intra, intra_bw_bytes_per_s, intra_latency_s)
    return rs + ar + ag


def all_reduce_time(
    size_bytes: ArrayLike,
    n: ArrayLike,
    bw_bytes_per_s: ArrayLike,
    latency_s: ArrayLike = 0.0,
    algorithm: Algorithm = "ring",
    *,
    domain_size: ArrayLike | None = None,
    inter_bw_bytes_per_s: ArrayLike | None = None,
    inter_latency_s: ArrayLike | None = None,
) -> np.ndarray:
    """All-reduce time [s] of a ``size_bytes`` buffer over ``n`` GPUs (the notebook calculator).

    Parameters
    ----------
    size_bytes : buffer size per GPU [bytes] (NCCL convention: the whole gradient, not a shard)
    n : group size [GPUs]
    bw_bytes_per_s : per-GPU unidirectional bandwidth [bytes/s] of the ring / tree; for
        ``hierarchical`` the bandwidth inside a domain
    latency_s : per-step latency [s] (inside a domain for ``hierarchical``)
    algorithm : ``ring`` | ``tree`` | ``hierarchical`` | ``auto`` (fastest of the three)
    domain_size : group members per scale-up domain (``hierarchical`` / ``auto``); default ``n``
        (everything in one domain, where hierarchical equals ring)
    inter_bw_bytes_per_s, inter_latency_s : per-GPU bandwidth [bytes/s] and latency [s] between
        domains; default the intra values

    Returns
    -------
    numpy.ndarray of seconds, broadcast over the inputs (0 where ``n <= 1``).

    Examples
    --------
    Exercise 9.1: 175e9 fp16 parameters, 8 GPUs on a 100 GB/s ring:
    ``all_reduce_time(350e9, 8, 100e9) == 2 * 7/8 * 350e9 / 100e9 == 6.125`` s.

    References
    ----------
    See :func:`ring_all_reduce_time`, :func:`tree_all_reduce_time`,
    :func:`hierarchical_all_reduce_time`.
    """
    if algorithm == "ring":
        return ring_all_reduce_time(size_bytes, n, bw_bytes_per_s, latency_s)
    if algorithm == "tree":
        return tree_all_reduce_time(size_bytes, n, bw_bytes_per_s, latency_s)
    if algorithm not in ("hierarchical", "auto"):
        raise ValueError(f"algorithm '{algorithm}' is not one of {ALGORITHMS}")
    n_arr = _f(n)
    d = n_arr if domain_size is None else np.clip(_f(domain_size), 1.0, np.maximum(n_arr, 1.0))
    n_inter = np.ceil(np.maximum(n_arr, 1.0) / d)
    inter_bw = bw_bytes_per_s if inter_bw_bytes_per_s is None else inter_bw_bytes_per_s
    inter_lat = latency_s if inter_latency_s is None else inter_latency_s
    hier = hierarchical_all_reduce_time(
        size_bytes, d, n_inter, bw_bytes_per_s, inter_bw, latency_s, inter_lat
    )
    if algorithm == "hierarchical":
        return hier
    # auto: a flat ring or tree spanning several domains runs at the slower of the two links.
    spans = n_inter > 1
    flat_bw = np.where(spans, np.minimum(_bw(bw_bytes_per_s), _bw(inter_bw)), _bw(bw_bytes_per_s))
    flat_lat = np.where(spans, np.maximum(_lat(latency_s), _lat(inter_lat)), _lat(latency_s))
    return np.minimum.reduce(
        [
            ring_all_reduce_time(size_bytes, n_arr, flat_bw, flat_lat),
            tree_all_reduce_time(size_bytes, n_arr, flat_bw, flat_lat),
            hier,
        ]
    )


# --------------------------------------------------------------------------------------------
# Other collectives (ring / pairwise algorithms, as NCCL runs them)
# --------------------------------------------------------------------------------------------
def all_gather_time(
    size_bytes: ArrayLike, n: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Ring all-gather [s] producing a ``size_bytes`` output: ``(n-1) alpha + (n-1)/n * S / B``.

    References
    ----------
    Thakur et al. 2005, Sec. 4.1 (ring all-gather); NCCL-tests ``PERFORMANCE.md``.
    """
    n = _f(n)
    sent = all_gather_bytes_per_gpu(_size(size_bytes), n)
    t = np.maximum(n - 1.0, 0.0) * _lat(latency_s) + sent / _bw(bw_bytes_per_s)
    return np.where(n > 1, t, 0.0)


def reduce_scatter_time(
    size_bytes: ArrayLike, n: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Ring reduce-scatter [s] of a ``size_bytes`` input: ``(n-1) alpha + (n-1)/n * S / B``.

    References
    ----------
    Thakur et al. 2005, Sec. 4.3; NCCL-tests ``PERFORMANCE.md``.
    """
    n = _f(n)
    sent = reduce_scatter_bytes_per_gpu(_size(size_bytes), n)
    t = np.maximum(n - 1.0, 0.0) * _lat(latency_s) + sent / _bw(bw_bytes_per_s)
    return np.where(n > 1, t, 0.0)


def broadcast_time(
    size_bytes: ArrayLike, n: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Pipelined ring (chain) broadcast [s]: ``(n-1) alpha + S / B`` (bus factor 1).

    References
    ----------
    NCCL-tests ``PERFORMANCE.md`` (broadcast busbw = algbw); NCCL ``tuning.cc``
    (``nsteps = nRanks`` for broadcast, latency per step).
    """
    n = _f(n)
    t = np.maximum(n - 1.0, 0.0) * _lat(latency_s) + _size(size_bytes) / _bw(bw_bytes_per_s)
    return np.where(n > 1, t, 0.0)


def all_to_all_time(
    size_bytes: ArrayLike, n: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Pairwise all-to-all [s] of a ``size_bytes`` buffer (``S/n`` to each peer):
    ``(n-1) alpha + (n-1)/n * S / B``.

    References
    ----------
    Thakur et al. 2005, Sec. 3.6 (pairwise exchange); NCCL-tests ``alltoall.cu`` (bus factor
    ``(n-1)/n``).
    """
    n = _f(n)
    sent = bytes_per_gpu("all_to_all", _size(size_bytes), n)
    t = np.maximum(n - 1.0, 0.0) * _lat(latency_s) + sent / _bw(bw_bytes_per_s)
    return np.where(n > 1, t, 0.0)


def p2p_time(
    size_bytes: ArrayLike, bw_bytes_per_s: ArrayLike, latency_s: ArrayLike = 0.0
) -> np.ndarray:
    """Point-to-point send/recv [s]: ``alpha + S / B``; 0 for an empty message.

    References
    ----------
    Hockney 1994, "The communication challenge for MPP" (the alpha-beta model).
    """
    size = _size(size_bytes)
    return np.where(size > 0, _lat(latency_s) + size / _bw(bw_bytes_per_s), 0.0)


def collective_time(
    collective: Collective,
    size_bytes: ArrayLike,
    n: ArrayLike,
    bw_bytes_per_s: ArrayLike,
    latency_s: ArrayLike = 0.0,
    algorithm: Algorithm = "ring",
) -> np.ndarray:
    """Time [s] of any collective in :data:`COLLECTIVES` (``algorithm`` only for all-reduce;
    ``n`` is ignored for p2p). See the per-collective functions for formulas and references."""
    if collective == "all_reduce":
        return all_reduce_time(size_bytes, n, bw_bytes_per_s, latency_s, algorithm)
    if collective == "p2p":
        return p2p_time(size_bytes, bw_bytes_per_s, latency_s) * np.ones_like(_f(n))
    fn = {
        "all_gather": all_gather_time,
        "reduce_scatter": reduce_scatter_time,
        "broadcast": broadcast_time,
        "all_to_all": all_to_all_time,
    }.get(collective)
    if fn is None:
        raise ValueError(f"collective '{collective}' is not one of {COLLECTIVES}")
    return fn(size_bytes, n, bw_bytes_per_s, latency_s)
