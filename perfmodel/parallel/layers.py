"""Layers per pipeline stage: Megatron-LM's layouts (layers per pipeline rank and per model
chunk, uneven first / last stages, the embedding and loss counted as layers), balanced splits,
and the bottleneck-minimising partition of exercise 9.4.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import numpy as np

from perfmodel.core.codes import Recompute

if TYPE_CHECKING:  # pragma: no cover
    from perfmodel.parallel.config import ConfigBatch
    from perfmodel.spec.specs import ModelSpec

__all__ = [
    "balanced_chunk_layers",
    "balanced_layer_counts",
    "balanced_stage_layers",
    "layout_chunk_times",
    "megatron_layout",
    "moe_layer_mask",
    "moe_variants",
    "partition_layers",
    "stage_counts",
    "stage_layer_counts",
    "stage_layer_table",
    "stage_moe_layers",
    "stage_times_s",
    "typed_layer_costs",
    "uniform_recompute",
    "without_layout",
]



def _finite_nonneg(name: str, x) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected numbers") from None
    bad = ~np.isfinite(a) | (a < 0)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{i}] = {a[i]}: expected a finite number >= 0")
    return a


def partition_layers(
    layer_costs,
    stages: int,
    memory=None,
    memory_cap: float | None = None,
) -> tuple[np.ndarray, float]:
    """Split layers into ``stages`` contiguous, non-empty stages minimising the slowest stage.

    The throughput of a pipeline is set by its slowest stage (the steady state runs one
    micro-batch per ``max_s t_s``), so the objective is the bottleneck ``max_s sum(stage s)``,
    not the sum of stage costs (which is the same for every split). Dynamic programming:

    ``D[j][i] = min_{k<i} max(D[j-1][k], C[i] - C[k])``, ``D[1][i] = C[i]``,

    with ``C`` the prefix sums of ``layer_costs``, over ``k`` whose stage ``k..i-1`` fits
    ``memory_cap`` (sum of per-layer ``memory``). With non-negative costs the inner minimum
    is found by bisection, so time is O(stages * L log L) and memory O(stages * L).

    Parameters
    ----------
    layer_costs : per-layer time (or FLOP) of one micro-batch, length L >= stages.
    stages : number of pipeline stages.
    memory : per-layer memory [bytes] (optional).
    memory_cap : the most memory one stage may hold [bytes] (optional; needs ``memory``).

    Returns
    -------
    (boundaries, bottleneck) : int array of ``stages + 1`` layer indices, stage ``s`` holding
    layers ``boundaries[s]:boundaries[s+1]``; and the slowest stage's cost.

    Raises
    ------
    ValueError when there are fewer layers than stages, a cost or memory is negative or not
    finite, or no split fits ``memory_cap``.

    References
    ----------
    Bokhari 1988, "Partitioning problems in parallel, pipelined, and distributed computing"
    (chains-on-chains bottleneck partitioning); Narayanan et al. 2019 (PipeDream), Sec. 3.1.
    """
    costs = _finite_nonneg("layer_costs", layer_costs)
    n = costs.shape[0]
    if isinstance(stages, bool) or not float(stages).is_integer():
        raise ValueError(f"stages = {stages!r}: expected a whole number >= 1")
    stages = int(stages)
    if stages < 1 or n < stages:
        raise ValueError(f"need 1 <= stages <= layers (got stages={stages}, layers={n})")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    idx = np.arange(n + 1)
    if memory is not None and memory_cap is not None:
        mem = _finite_nonneg("memory", memory)
        if mem.shape[0] != n:
            raise ValueError(f"memory has {mem.shape[0]} layers, layer_costs {n}")
        cap = float(memory_cap)
        if not np.isfinite(cap) or cap < 0:
            raise ValueError(f"memory_cap = {memory_cap!r}: expected a finite number >= 0")
        mprefix = np.concatenate([[0.0], np.cumsum(mem)])
        # the first k whose stage k..i-1 fits the cap (prefix sums are nondecreasing)
        k_lo = np.searchsorted(mprefix, mprefix - cap * (1 + 1e-12), side="left")
    else:
        k_lo = np.zeros(n + 1, dtype=np.int64)

    # D[j][i] = min_k max(D[j-1][k], C[i] - C[k]). For non-negative costs D[j-1][k] is
    # nondecreasing in k where finite and C[i] - C[k] nonincreasing, so the best k is where
    # D[j-1][k] + C[k] first reaches C[i]: one searchsorted per stage count, vectorised over i.
    # Memory O(stages * L) (the tables below), time O(stages * L log L).
    best = np.full((stages + 1, n + 1), np.inf)
    arg = np.zeros((stages + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for j in range(1, stages + 1):
        prev = best[j - 1]
        finite = np.isfinite(prev)
        hi_prev = int(np.flatnonzero(finite)[-1]) if finite.any() else -1
        lo = np.maximum(k_lo, j - 1)
        hi = np.minimum(idx - 1, hi_prev)
        ok = lo <= hi
        h = np.where(finite, prev + prefix, np.inf)  # nondecreasing on [j-1, hi_prev]
        cross = np.searchsorted(h[j - 1:hi_prev + 1], prefix, side="left") + (j - 1)
        cands = np.stack([np.clip(cross - 1, lo, hi), np.clip(cross, lo, hi), lo])
        kk = np.where(ok, cands, 0)
        vals = np.maximum(prev[kk], prefix[None, :] - prefix[kk])
        vals = np.where(ok[None, :], vals, np.inf)
        pick = np.argmin(vals, axis=0)
        arg[j] = kk[pick, idx]
        best[j] = vals[pick, idx]
    bottleneck = float(best[stages, n])
    if not np.isfinite(bottleneck):
        raise ValueError(
            f"no split of {n} layers into {stages} stages fits memory_cap={memory_cap} "
            f"(largest layer memory {float(np.max(memory))})"
        )
    bounds = [n]
    for j in range(stages, 0, -1):
        bounds.append(int(arg[j, bounds[-1]]))
    return np.array(bounds[::-1], dtype=np.int64), bottleneck


def stage_layer_counts(
    num_layers,
    pp,
    vp=1,
    first=0,
    last=0,
    embedding_as_layer=False,
    loss_as_layer=False,
) -> dict[str, np.ndarray]:
    """Transformer layers per pipeline rank and per model chunk, as Megatron-LM builds them
    (vectorized; the one place time, memory, the Gantt chart and ``--emit`` get them from).

    Three layouts, Megatron-core ``get_num_layers_to_build`` / ``get_transformer_layer_offset``
    (``megatron/core/transformer/transformer_block.py``, ``transformer_layer.py``):

    * even (``first = last = 0``, no accounting): ``L / p`` layers per rank, ``L / (p v)`` per
      chunk;
    * uneven first / last stage (``--decoder-first-pipeline-num-layers first``,
      ``--decoder-last-pipeline-num-layers last``; 0 = not set): rank 0 holds ``first``, rank
      ``p-1`` holds ``last``, the other ranks share the rest evenly; each rank's layers are split
      evenly over its ``v`` chunks;
    * embedding / loss counted as layers (``--account-for-embedding-in-pipeline-split``,
      ``--account-for-loss-in-pipeline-split``): ``L' = L + e + l`` split evenly, ``L'/(p v)``
      per chunk, less one layer in virtual stage 0 (rank 0, chunk 0) for the embedding and one
      in the last virtual stage (rank ``p-1``, chunk ``v-1``) for the loss.

    Parameters
    ----------
    num_layers : L, transformer layers of the model.
    pp, vp : pipeline ranks and model chunks per rank, array-like int.
    first, last : layers of the first / last pipeline rank (0 = even split of the rest).
    embedding_as_layer, loss_as_layer : count the embedding / the loss as a layer.

    Returns
    -------
    dict of arrays: ``first``, ``middle``, ``last`` (layers on rank 0, on each middle rank, on
    rank ``p-1``; all equal for ``p = 1``), ``max_rank`` (most layers on any rank),
    ``first_chunk0`` (layers of virtual stage 0), ``first_chunk`` (rank 0's other chunks),
    ``middle_chunk``, ``last_chunk`` (rank ``p-1``'s chunks but its last), ``last_chunk_end``
    (the last virtual stage), and bool ``valid``: Megatron-LM accepts the layout (its
    divisibility asserts hold, no chunk is left without layers, and first/last are not combined
    with embedding/loss accounting, which Megatron refuses).
    """
    L = np.asarray(num_layers, dtype=np.int64)
    p = np.asarray(pp, dtype=np.int64)
    v = np.asarray(vp, dtype=np.int64)
    f = np.asarray(first, dtype=np.int64)
    la = np.asarray(last, dtype=np.int64)
    e = np.asarray(embedding_as_layer, dtype=bool).astype(np.int64)
    lo = np.asarray(loss_as_layer, dtype=bool).astype(np.int64)
    L, p, v, f, la, e, lo = np.broadcast_arrays(L, p, v, f, la, e, lo)
    multi = p > 1
    f = np.where(multi, f, 0)
    la = np.where(multi, la, 0)
    e = np.where(multi, e, 0)
    lo = np.where(multi, lo, 0)
    set_f, set_l = f > 0, la > 0
    uneven = set_f | set_l
    # uneven first/last: the middle ranks share what is left
    rest = L - f - la
    mid_ranks = p - set_f - set_l
    per_mid = np.where(mid_ranks > 0, rest // np.maximum(mid_ranks, 1), 0)
    ok_uneven = np.where(mid_ranks > 0, rest % np.maximum(mid_ranks, 1) == 0, rest == 0)
    ok_uneven &= (rest >= 0) & ~((e + lo) > 0)
    # embedding / loss accounting (or the plain even split)
    lp = L + e + lo
    per_rank = lp // p
    ok_even = lp % p == 0
    r_first = np.where(uneven, np.where(set_f, f, per_mid), per_rank - e)
    r_last = np.where(uneven, np.where(set_l, la, per_mid), per_rank - lo)
    r_mid = np.where(uneven, per_mid, per_rank)
    # chunks: each rank's (accounted) layers split evenly over v
    acc_first = np.where(uneven, r_first, per_rank)
    acc_last = np.where(uneven, r_last, per_rank)
    ok_chunks = (acc_first % v == 0) & (acc_last % v == 0) & (r_mid % v == 0)
    c_first, c_mid, c_last = acc_first // v, r_mid // v, acc_last // v
    chunk0 = c_first - np.where(uneven, 0, e)
    chunk_end = c_last - np.where(uneven, 0, lo)
    single = ~multi
    r_first = np.where(single, L, r_first)
    r_last = np.where(single, L, r_last)
    r_mid = np.where(single, L, r_mid)
    valid = np.where(uneven, ok_uneven, ok_even) & ok_chunks
    # every chunk holds a layer, except a chunk that holds the embedding or the loss
    valid &= (c_mid >= 1) | (p <= 2)
    valid &= (np.where(v > 1, c_first, chunk0) >= 1) & (np.where(v > 1, c_last, chunk_end) >= 1)
    valid &= (chunk0 >= 0) & (chunk_end >= 0)
    valid &= np.where(single, L % v == 0, True)
    max_rank = np.maximum(np.maximum(r_first, r_last), np.where(p > 2, r_mid, 0))
    return {
        "first": r_first,
        "middle": np.where(p > 2, r_mid, r_first),
        "last": r_last,
        "max_rank": max_rank,
        "first_chunk0": np.where(single, L // np.maximum(v, 1), chunk0),
        "first_chunk": np.where(single, L // np.maximum(v, 1), c_first),
        "middle_chunk": np.where(single, L // np.maximum(v, 1), c_mid),
        "last_chunk": np.where(single, L // np.maximum(v, 1), c_last),
        "last_chunk_end": np.where(single, L // np.maximum(v, 1), chunk_end),
        "valid": valid,
    }


def stage_layer_table(
    num_layers: int,
    pp: int,
    vp: int = 1,
    first: int = 0,
    last: int = 0,
    embedding_as_layer: bool = False,
    loss_as_layer: bool = False,
) -> np.ndarray:
    """Layers of every model chunk of one configuration, shape ``(pp, vp)``: entry ``[r, c]``
    is virtual stage ``c * pp + r`` (chunk ``c`` of rank ``r``), from :func:`stage_layer_counts`;
    where the configuration names no layout and ``pp*vp`` does not divide the layers,
    :func:`megatron_layout`'s (the balanced explicit one included).

    >>> stage_layer_table(126, 8, 8, embedding_as_layer=True, loss_as_layer=True)[[0, 7]]
    array([[1, 2, 2, 2, 2, 2, 2, 2],
           [2, 2, 2, 2, 2, 2, 2, 1]])
    """
    named = first or last or embedding_as_layer or loss_as_layer
    if not named and num_layers % (pp * vp) and pp > 1:  # the layout the tool gives (pp, vp)
        lay = {k: x[0] for k, x in megatron_layout(num_layers, pp, vp, explicit=True).items()}
        if lay["explicit"]:
            ranks = balanced_stage_layers(num_layers, pp, vp)[0, :pp]
            chunks = balanced_chunk_layers(ranks, vp)
            return np.array([[chunks[c * pp + r] for c in range(vp)] for r in range(pp)],
                            dtype=np.int64)
        first, last = int(lay["first"]), int(lay["last"])
        embedding_as_layer = bool(lay["embedding_as_layer"])
        loss_as_layer = bool(lay["loss_as_layer"])
    c = {k: int(np.asarray(x).ravel()[0]) for k, x in stage_layer_counts(
        num_layers, pp, vp, first, last, embedding_as_layer, loss_as_layer).items()}
    if not c["valid"]:
        raise ValueError(
            f"no Megatron-LM layout of {num_layers} layers on pp={pp}, vp={vp} with first={first}, "
            f"last={last}, embedding_as_layer={embedding_as_layer}, loss_as_layer={loss_as_layer}"
        )
    t = np.full((pp, vp), c["middle_chunk"], dtype=np.int64)
    t[0, :] = c["first_chunk"]
    t[pp - 1, :] = c["last_chunk"]
    t[0, 0] = c["first_chunk0"]
    t[pp - 1, vp - 1] = c["last_chunk_end"]
    if pp == 1:
        t[0, :] = num_layers // vp
    return t


def balanced_stage_layers(num_layers: int, pp, vp=1) -> np.ndarray:
    """Decoder layers per pipeline rank of the balanced explicit layout (vectorized over
    ``pp``, ``vp``): the ``L`` layers over the ``p v`` model chunks with counts differing by at
    most one, the ``r = L mod (p v)`` heavier chunks (``q + 1`` layers, ``q = L // (p v)``)
    first in model order, as Megatron-Bridge's DeepSeek-V3 ``layout_map`` puts its full chunks
    first and the lighter one (with the MTP layers and the loss) last
    (``recipes/deepseek/deepseek_v3.py``). Chunk ``c`` runs on rank ``c % p``
    (Megatron-Core ``PipelineParallelLayerLayout``: ``layout[vpp_rank * pp + pp_rank]``), so
    rank ``s`` holds ``v q + n_s`` layers, ``n_s = clip(ceil((r - s) / p), 0, v)`` of its
    chunks being heavier.

    Returns an ``(n, max pp)`` int64 matrix (ranks beyond a row's pp hold 0).

    >>> balanced_stage_layers(61, 8, 4)
    array([[8, 8, 8, 8, 8, 7, 7, 7]])
    """
    p = np.atleast_1d(np.asarray(pp, dtype=np.int64))
    v = np.atleast_1d(np.asarray(vp, dtype=np.int64))
    p, v = np.broadcast_arrays(p, v)
    chunks = p * v
    q, r = num_layers // chunks, num_layers % chunks
    s = np.arange(int(p.max()) if p.size else 1)[None, :]
    pc, vc, qc, rc = (x[:, None] for x in (p, v, q, r))
    heavy = np.clip(-((s - rc) // pc), 0, vc)  # ceil((r - s) / p), clipped to [0, v]
    return np.where(s < pc, vc * qc + heavy, 0).astype(np.int64)


def balanced_layer_counts(num_layers: int, pp, vp=1) -> dict[str, np.ndarray]:
    """:func:`stage_layer_counts`'s fields for the balanced explicit layout (vectorized): rank
    0 (the most layers, the embedding), the middle rank with the most, rank ``p-1`` (the
    fewest, the loss), and the chunk sizes of those ranks (``q + 1`` where a rank holds a
    heavier chunk). The time and memory models price the slowest rank from these, as for the
    other layouts.

    >>> {k: int(v[0]) for k, v in balanced_layer_counts(61, 8, 4).items() if k != "valid"}
    ... # doctest: +NORMALIZE_WHITESPACE
    {'first': 8, 'middle': 8, 'last': 7, 'max_rank': 8, 'first_chunk0': 2, 'first_chunk': 2,
     'middle_chunk': 2, 'last_chunk': 2, 'last_chunk_end': 1}
    """
    p = np.atleast_1d(np.asarray(pp, dtype=np.int64))
    v = np.atleast_1d(np.asarray(vp, dtype=np.int64))
    p, v = np.broadcast_arrays(p, v)
    ranks = balanced_stage_layers(num_layers, p, v)
    rows = np.arange(p.shape[0])
    q, r = num_layers // (p * v), num_layers % (p * v)
    last = ranks[rows, p - 1]
    heavy = (r > 0).astype(np.int64)
    heavy_last = (-((p - 1 - r) // p) > 0).astype(np.int64)  # rank p-1 holds a heavier chunk
    mid = np.where(p > 2, ranks[:, 1] if ranks.shape[1] > 1 else ranks[:, 0], ranks[:, 0])
    return {"first": ranks[:, 0], "middle": mid, "last": last, "max_rank": ranks.max(axis=1),
            "first_chunk0": q + heavy, "first_chunk": q + heavy,
            "middle_chunk": q + heavy, "last_chunk": q + heavy_last,
            "last_chunk_end": q.copy(),
            "valid": (p * v <= num_layers) & (p > 1)}


def balanced_chunk_layers(rank_layers, vp: int) -> list[int]:
    """Decoder layers of each of the ``pp*vp`` model chunks, in model order (chunk ``c`` on rank
    ``c % pp``), of per-rank counts split over each rank's ``vp`` chunks as evenly as possible,
    the heavier chunks first: the chunks of :func:`balanced_stage_layers` (and, for counts that
    are multiples of ``vp``, the even split of each rank).

    >>> balanced_chunk_layers([8, 8, 8, 8, 8, 7, 7, 7], 4)[-4:]
    [2, 1, 1, 1]
    """
    ranks = [int(n) for n in rank_layers]
    pp = len(ranks)
    return [ranks[c % pp] // vp + (1 if c // pp < ranks[c % pp] % vp else 0)
            for c in range(pp * vp)]


def megatron_layout(num_layers: int, pp, vp=1, explicit: bool = False) -> dict[str, np.ndarray]:
    """The layout the tool gives ``(pp, vp)`` when the user does not name one (vectorized).

    In this order, the first that Megatron-LM accepts (:func:`stage_layer_counts`):

    1. the even split (``L`` divisible by ``p v``);
    2. the embedding and the loss counted as layers (``(L + 2) / (p v)`` whole), as NVIDIA's
       Llama 3.1 405B recipes run 126 layers on ``p v = 64`` (and on ``p = 8, v = 4``);
    3. the loss counted alone, then the embedding alone (``L + 1``);
    4. lighter first and last stages (``--decoder-first/last-pipeline-num-layers``): the middle
       ranks take ``k`` layers (a multiple of ``v``, the smallest ``k >= L/p``), the first and
       last share the rest, the first the smaller half (the embedding is cheaper than the loss);
    5. with ``explicit`` (a release with ``--pipeline-model-parallel-layout``, Megatron-Core >=
       0.13): the balanced explicit layout (:func:`balanced_stage_layers`), where every chunk
       holds at least one layer (``L >= p v``).

    Returns arrays ``first``, ``last`` (0 = not set), ``embedding_as_layer``, ``loss_as_layer``,
    ``explicit`` (option 5: per-rank counts from :func:`balanced_stage_layers`) and ``valid``
    (some layout exists).
    """
    p = np.atleast_1d(np.asarray(pp, dtype=np.int64))
    v = np.atleast_1d(np.asarray(vp, dtype=np.int64))
    p, v = np.broadcast_arrays(p, v)
    n = p.shape[0]
    first = np.zeros(n, dtype=np.int64)
    last = np.zeros(n, dtype=np.int64)
    emb = np.zeros(n, dtype=bool)
    loss = np.zeros(n, dtype=bool)
    found = np.zeros(n, dtype=bool)
    width = int(v.max()) + 1 if n else 1
    keys, inv = np.unique(p * width + v, return_inverse=True)  # one search per (pp, vp)
    inv = np.asarray(inv).ravel()
    for j, key in enumerate(keys):
        pj, vj = divmod(int(key), width)
        choice = _layout_for(int(num_layers), pj, vj)
        if choice is None:
            continue
        sel = inv == j
        first[sel], last[sel], emb[sel], loss[sel] = choice
        found[sel] = True
    bal = np.zeros(n, dtype=bool)
    if explicit:
        bal = ~found & (p > 1) & (p * v <= num_layers)
        found = found | bal
    return {"first": first, "last": last, "embedding_as_layer": emb, "loss_as_layer": loss,
            "explicit": bal, "valid": found}


@functools.lru_cache(maxsize=4096)
def _layout_for(L: int, p: int, v: int) -> tuple[int, int, bool, bool] | None:
    def ok(f=0, la=0, e=False, lo=False) -> bool:
        return bool(stage_layer_counts(L, p, v, f, la, e, lo)["valid"])

    if ok():
        return 0, 0, False, False
    if p == 1:
        return None
    for e, lo in ((True, True), (False, True), (True, False)):
        if ok(e=e, lo=lo):
            return 0, 0, e, lo
    if p == 2:
        for f in range(v * ((L // 2) // v), 0, -v):
            if ok(f, L - f):
                return f, L - f, False, False
        return None
    k = v * -(-L // (p * v))  # middle ranks: the smallest multiple of v >= L/p
    while k >= v:
        rest = L - (p - 2) * k
        if rest >= 2 * v:
            f = v * ((rest // 2) // v)
            if f >= v and ok(f, rest - f):
                return f, rest - f, False, False
        k -= v
    return None


def layout_chunk_times(
    table,
    layer_fwd_s: float,
    layer_bwd_s: float,
    embed_fwd_s: float = 0.0,
    embed_bwd_s: float = 0.0,
    logits_fwd_s: float = 0.0,
    logits_bwd_s: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward time of every model chunk, shape ``(pp, vp)`` [s], for
    :func:`simulate` (and so the Gantt chart) of an uneven layout: ``table`` from
    :func:`stage_layer_table` times the per-layer times, the embedding on virtual stage 0, the
    logits and loss on the last virtual stage."""
    t = np.asarray(table, dtype=np.float64)
    fwd = t * layer_fwd_s
    bwd = t * layer_bwd_s
    fwd[0, 0] += embed_fwd_s
    bwd[0, 0] += embed_bwd_s
    fwd[-1, -1] += logits_fwd_s
    bwd[-1, -1] += logits_bwd_s
    return fwd, bwd


def without_layout(batch: ConfigBatch, recompute: str | None = None) -> ConfigBatch:
    """The batch with its layouts dropped; ``recompute="keep"`` sets the mode of the layers
    that keep their activations (selective stays selective, full becomes none),
    ``recompute="full"`` makes every layer recompute."""
    rc = batch.recompute
    if recompute == "keep":
        rc = np.where(rc == Recompute.SELECTIVE, Recompute.SELECTIVE, 0)
    elif recompute == "full":
        rc = np.full_like(rc, Recompute.FULL)
    return dataclasses.replace(batch, recompute=rc, stage_layers=None,
                               stage_recompute_layers=None)


def stage_counts(model: ModelSpec, batch: ConfigBatch) -> tuple[np.ndarray, np.ndarray]:
    """``(layers, recomputed)``: ``(n, S)`` int matrices of each stage's layers and fully
    recomputed layers (S = the largest pp; stages beyond a row's pp hold 0). Rows without a
    layout get Megatron-LM's layout of their other fields (:meth:`ConfigBatch.layer_counts`:
    even, or uneven first / last ranks) and recompute all their layers under
    ``recompute="full"``, none otherwise."""
    n = len(batch)
    pp = batch.pp.astype(np.int64)
    width = int(pp.max()) if n else 1
    if batch.stage_layers is not None:
        width = max(width, batch.stage_layers.shape[1])
    s = np.arange(width)[None, :]
    L = model.num_layers
    lc = batch.layer_counts(L)
    pcol = pp[:, None]
    even = np.where(s == 0, lc["first"][:, None],
                    np.where(s == pcol - 1, lc["last"][:, None], lc["middle"][:, None]))
    even = np.where(s < pcol, even, 0).astype(np.int64)
    layers = even
    if batch.stage_layers is not None:
        lay = np.zeros((n, width), dtype=np.int64)
        lay[:, :batch.stage_layers.shape[1]] = batch.stage_layers
        layers = np.where(batch.has_layout[:, None], lay, even)
    full = (batch.recompute == Recompute.FULL)[:, None]
    rec = np.where(full, layers, 0)
    if batch.stage_recompute_layers is not None:
        given = np.full((n, width), -1, dtype=np.int64)
        given[:, :batch.stage_recompute_layers.shape[1]] = batch.stage_recompute_layers
        rec = np.where(given[:, :1] >= 0, np.maximum(given, 0), rec)
    return layers, np.where(s < pp[:, None], rec, 0)


# --------------------------------------------------------------------------------------------
# Mixture of experts: which layers are MoE, and the two layer types
# --------------------------------------------------------------------------------------------
def moe_layer_mask(model: ModelSpec) -> np.ndarray:
    """``(L,)`` bool: which transformer layers are MoE. After ``moe_dense_layers`` dense
    leading layers (DeepSeek ``first_k_dense_replace``), every ``moe_layer_freq``-th layer
    (``k-1, 2k-1, ...`` of the rest, Llama 4's ``interleave_moe_layer_step``); all False for a
    dense model. Its count is :attr:`ModelSpec.num_moe_layers`.

    References
    ----------
    Hugging Face ``modeling_deepseek_v3.py`` (``layer_idx >= first_k_dense_replace``),
    ``modeling_llama4.py`` (``(layer_idx + 1) % interleave_moe_layer_step == 0``);
    Megatron-Core ``gpt_layer_specs.py`` (``moe_layer_pattern``).
    """
    L = model.num_layers
    if not model.is_moe:
        return np.zeros(L, dtype=bool)
    if model.is_hybrid:  # the 'E' letters of the hybrid pattern (perfmodel.compute.mamba)
        return np.array([c == "E" for c in model.hybrid_override_pattern], dtype=bool)
    i = np.arange(L)
    d, k = model.moe_dense_layers, model.moe_layer_freq
    return (i >= d) & ((i - d) % k == k - 1)


def stage_moe_layers(model: ModelSpec, batch: ConfigBatch, layers) -> np.ndarray:
    """MoE layers on each pipeline rank of a layout, ``(n, S)`` like ``layers`` (the rank's
    layers over all its chunks). With ``vp`` chunks, chunk ``c`` of rank ``s`` is virtual
    stage ``c*pp + s`` (Megatron-LM's interleaved order, ``--pipeline-model-parallel-layout``)
    holding ``layers[s] // vp`` consecutive layers, one more in its first ``layers[s] % vp``
    chunks (:func:`perfmodel.parallel.layers.balanced_chunk_layers`); the MoE layers among them are
    counted on :func:`moe_layer_mask`."""
    layers = np.asarray(layers, dtype=np.int64)
    n = layers.shape[0]
    if not model.is_moe:
        return np.zeros_like(layers)
    # the count depends on (pp, vp, layers) alone: compute it once per distinct row
    key = np.concatenate([batch.pp.astype(np.int64)[:, None], batch.vp.astype(np.int64)[:, None],
                          layers], axis=1)
    uniq, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    if uniq.shape[0] < n:
        sub = batch.take(first)
        return _stage_moe_layers(model, sub, layers[first])[np.asarray(inv).ravel()]
    return _stage_moe_layers(model, batch, layers)


def _stage_moe_layers(model: ModelSpec, batch: ConfigBatch, layers: np.ndarray) -> np.ndarray:
    n, width = layers.shape
    mask = moe_layer_mask(model)
    L = mask.size
    cum = np.concatenate([[0], np.cumsum(mask)])
    vp = batch.vp.astype(np.int64)[:, None]
    s = np.arange(width)[None, :]
    live = s < batch.pp[:, None]
    out = np.zeros((n, width), dtype=np.int64)
    offset = np.zeros((n, 1), dtype=np.int64)  # layers of the chunks before, in model order
    for c in range(int(vp.max()) if n else 0):
        per_chunk = np.where(live & (c < vp), layers // vp + (c < layers % vp), 0)
        before = np.cumsum(per_chunk, axis=1) - per_chunk  # this chunk's ranks before
        start = np.clip(offset + before, 0, L)
        end = np.clip(start + per_chunk, 0, L)
        out += cum[end] - cum[start]
        offset = offset + per_chunk.sum(axis=1, keepdims=True)
    return out


def typed_layer_costs(model: ModelSpec) -> bool:
    """Whether pipeline stages price a dense and an MoE layer apart (:func:`moe_variants`): MoE
    transformers. A hybrid Mamba2 pattern (:mod:`perfmodel.compute.mamba`) prices every stage with its
    average layer (the letter mix of each stage is not used)."""
    return model.is_moe and not model.is_hybrid


def moe_variants(model: ModelSpec) -> tuple[ModelSpec, ModelSpec]:
    """``(dense, moe)``: the model with every layer dense, and with every layer MoE. Every
    per-layer term of the cost model (:mod:`perfmodel.compute.layer`, :mod:`perfmodel.comm.comm_time`,
    :mod:`perfmodel.memory.breakdown`, :mod:`perfmodel.moe.experts`) averages the two layer types by
    :attr:`ModelSpec.moe_layer_fraction`; on these variants it gives one layer of each type,
    the same terms, nothing re-derived."""
    L = model.num_layers
    dense = model.model_copy(update={"moe_dense_layers": L, "moe_layer_freq": 1})
    moe_ = model.model_copy(update={"moe_dense_layers": 0, "moe_layer_freq": 1})
    return dense, moe_


def uniform_recompute(batch: ConfigBatch) -> bool:
    """No row names a per-stage recompute count (``stage_recompute_layers``)."""
    r = batch.stage_recompute_layers
    return r is None or bool(np.all(r[:, 0] < 0))


def stage_times_s(layers, recomputed, layer_keep_s, layer_full_s, embed_s, logits_s, pp,
                  moe_layers=None, moe_keep_s=None, moe_full_s=None):
    """Forward + backward time of one micro-batch on each stage [s], ``(n, S)``.

    ``layer_keep_s`` / ``layer_full_s``: one layer without / with full recompute (per config);
    the embedding is on stage 0, the logits and loss on stage ``pp - 1``; stages beyond ``pp``
    are 0. With ``moe_layers`` (MoE layers per stage, :func:`stage_moe_layers`) the layer
    times are the dense layer's and ``moe_keep_s`` / ``moe_full_s`` the MoE layer's; the
    recomputed layers are of the stage's mix of the two types.
    """
    s = np.arange(layers.shape[1])[None, :]
    pp = np.asarray(pp)[:, None]
    keep = np.asarray(layer_keep_s, dtype=np.float64)[:, None]
    extra = np.asarray(layer_full_s, dtype=np.float64)[:, None] - keep
    if moe_layers is None:
        t = layers * keep + recomputed * extra
    else:
        n_m = np.asarray(moe_layers, dtype=np.float64)
        m_keep = np.asarray(moe_keep_s, dtype=np.float64)[:, None]
        m_extra = np.asarray(moe_full_s, dtype=np.float64)[:, None] - m_keep
        frac = np.where(layers > 0, n_m / np.maximum(layers, 1), 0.0)
        t = ((layers - n_m) * keep + n_m * m_keep
             + recomputed * ((1.0 - frac) * extra + frac * m_extra))
    t = t + np.where(s == 0, np.asarray(embed_s)[:, None], 0.0)
    t = t + np.where(s == pp - 1, np.asarray(logits_s)[:, None], 0.0)
    return np.where(s < pp, t, 0.0)
