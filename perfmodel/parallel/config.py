"""Parallel configurations: one point (:class:`ParallelConfig`) and a batch (:class:`ConfigBatch`).

The cost models take a :class:`ConfigBatch`, a struct of numpy arrays (one entry per
configuration), so a search evaluates millions of configurations in one call. Categorical fields
are integer codes (see ``RECOMPUTE``, ``SCHEDULE``, ``COMPRESSION``).

Group layout (Megatron-LM's default order, innermost first): tp, cp, dp, pp. Rank
``r = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank))``, so a tensor-parallel group is ``tp``
consecutive GPUs, a context-parallel group strides by ``tp``, a data-parallel group by ``tp*cp``,
a pipeline group by ``tp*cp*dp``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Annotated

import numpy as np
from pydantic import Field, model_serializer, model_validator

from perfmodel.core.codes import (
    COMPRESSION,
    CP_COMM,
    RECOMPUTE,
    SCHEDULE,
    CompressionName,
    CpComm,
    CpCommName,
    RecomputeName,
    ScheduleName,
)
from perfmodel.core.errors import SpecError
from perfmodel.parallel.layers import balanced_layer_counts, megatron_layout, stage_layer_counts
from perfmodel.spec.hybrid import unsupported_parallelism
from perfmodel.spec.specs import ClusterSpec, ModelSpec, Spec, TrainingSpec

PosInt = Annotated[int, Field(gt=0)]


class ParallelConfig(Spec):
    """One parallel configuration.

    ``num_microbatches`` is derived from the global batch (``B / (dp * micro_batch_size)``) by
    :func:`resolve_config`; give it only to check it. ``vp`` > 1 means the interleaved schedule
    with ``vp`` model chunks per pipeline rank. ``grad_compression`` applies to the data-parallel
    gradient exchange (``topk_ratio`` is the kept fraction for ``topk``).
    """

    dp: PosInt = 1
    tp: PosInt = 1
    pp: PosInt = 1
    vp: PosInt = 1
    cp: PosInt = 1
    zero_stage: Annotated[int, Field(ge=0, le=3)] = 0
    micro_batch_size: PosInt = 1
    num_microbatches: PosInt | None = None
    recompute: RecomputeName = "none"
    sequence_parallel: bool = False
    schedule: ScheduleName = "1f1b"
    grad_compression: CompressionName = "none"
    topk_ratio: Annotated[float, Field(gt=0, le=1)] = 0.01
    ep: PosInt = 1
    etp: PosInt | None = None
    # how the cp ranks exchange attention (Megatron-Core cp_comm_type): "p2p" the ring,
    # "a2a" Ulysses (perfmodel.comm.cp_a2a), "allgather" K/V gathered before attention
    # (perfmodel.comm.cp_allgather), "a2a+p2p" both, hierarchically
    # (perfmodel.comm.cp_hierarchical); no effect at cp = 1
    cp_comm: CpCommName = "p2p"
    # cp_comm "a2a+p2p": the size of the inner (all-to-all) group, the first of Megatron's
    # --hierarchical-context-parallel-sizes (the ring runs over cp / cp_a2a); None: the
    # largest that fits the NVLink domain (hierarchical_a2a_size, filled by resolve_config
    # with a cluster); left out of the dumped fields while None
    cp_a2a: PosInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _etp_follows_tp(cls, data):
        """``etp`` left out (or None) is ``tp``: Megatron's default expert tensor parallel size."""
        if isinstance(data, dict) and data.get("etp") is None:
            data = {**data, "etp": data.get("tp", 1)}
        return data

    # Pipeline layer layout (Megatron-LM): layers of the first / last pipeline rank (None or 0:
    # even split of the rest), and the embedding / the loss counted as one layer each. Filled in
    # by resolve_config when pp*vp does not divide the layers (perfmodel.parallel.layers.megatron_layout).
    first_stage_layers: Annotated[int, Field(ge=0)] | None = None
    last_stage_layers: Annotated[int, Field(ge=0)] | None = None
    embedding_as_layer: bool = False
    loss_as_layer: bool = False
    # Per-stage layout chosen by the dynamic-programming searcher (search/dp.py); None = the
    # layout above. ``stage_layers[s]``: transformer layers on pipeline rank s (all its vp
    # chunks, ``stage_layers[s] / vp`` per chunk; Megatron's ``--pipeline-model-parallel-layout``).
    # ``stage_recompute_layers[s]``: of those, how many recompute fully (needs
    # recompute="full"; Megatron's ``--recompute-method block --recompute-num-layers N``, N per
    # chunk, the first N layers of each chunk).
    stage_layers: tuple[PosInt, ...] | None = None
    stage_recompute_layers: tuple[Annotated[int, Field(ge=0)], ...] | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        d = handler(self)
        if isinstance(d, dict) and d.get("cp_a2a") is None:
            d.pop("cp_a2a", None)
        return d

    @model_validator(mode="after")
    def _consistent(self) -> ParallelConfig:
        _check_stage_layout(self)
        if self.cp_a2a is not None and (self.cp_comm != "a2a+p2p" or self.cp % self.cp_a2a
                                        or not 1 < self.cp_a2a < self.cp):
            raise ValueError(
                f"cp_a2a ({self.cp_a2a}) applies to cp_comm 'a2a+p2p' only, and must divide cp "
                f"({self.cp}) with 1 < cp_a2a < cp (got cp_comm '{self.cp_comm}')")
        if self.vp > 1 and self.schedule != "interleaved":
            raise ValueError(
                f"vp ({self.vp}) > 1 needs schedule 'interleaved' (got schedule '{self.schedule}')"
            )
        if self.schedule == "interleaved" and self.vp < 2:
            raise ValueError(f"schedule 'interleaved' needs vp >= 2 (got vp={self.vp})")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1 (got tp=1)")
        if self.pp == 1 and self.schedule in ("interleaved", "zb"):
            raise ValueError(f"schedule '{self.schedule}' needs pp > 1 (got pp=1)")
        return self

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallel size; Megatron's default is tp (``--expert-tensor-parallel-size``)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data parallel size: the stage's GPUs over ``ep * etp`` (MoE parallel folding)."""
        return self.dp * self.cp * self.tp // (self.ep * self.expert_tp)


def check_expert_parallel(c: ParallelConfig, model: ModelSpec, cluster: ClusterSpec | None = None,
                          *, allow_tp_across_nodes: bool = False) -> None:
    """Megatron-Core MoE parallel folding: the experts of a pipeline stage are laid out as
    ``etp x ep x expert-dp`` on the same ``tp x cp x dp`` GPUs the attention uses. Raises
    :class:`SpecError` naming the operands (Megatron ``parallel_state.initialize_model_parallel``
    and ``arguments.py`` checks)."""
    etp = c.expert_tp
    if not model.is_moe:  # etp has no experts to split: it is ignored (set to tp)
        if c.ep != 1:
            raise SpecError(
                f"ep ({c.ep}) applies to MoE models; '{model.name}' is dense (num_experts = 1)"
            )
        return
    if model.num_experts % c.ep:
        raise SpecError(f"ep ({c.ep}) must divide num_experts ({model.num_experts})")
    if model.expert_ffn_size % etp:
        raise SpecError(f"etp ({etp}) must divide the expert FFN size ({model.expert_ffn_size})")
    stage = c.tp * c.cp * c.dp
    if stage % (c.ep * etp):
        raise SpecError(
            f"ep*etp ({c.ep}*{etp}={c.ep * etp}) must divide tp*cp*dp "
            f"({c.tp}*{c.cp}*{c.dp}={stage}), the GPUs of one pipeline stage"
        )
    if c.tp > 1 and not c.sequence_parallel:
        raise SpecError(
            f"MoE with tp ({c.tp}) > 1 needs sequence_parallel (Megatron-LM requires it)"
        )
    if cluster is not None and etp > cluster.scale_up_size and not allow_tp_across_nodes:
        raise SpecError(
            f"etp ({etp}) must fit in the scale-up domain ({cluster.scale_up_size} GPUs) "
            f"of cluster '{cluster.name}'"
        )


def _check_stage_layout(c: ParallelConfig) -> None:
    """Structural checks of a per-stage layout (the model-dependent sum in resolve_config)."""
    if c.stage_layers is None:
        if c.stage_recompute_layers is not None:
            raise ValueError("stage_recompute_layers needs stage_layers")
        return
    if len(c.stage_layers) != c.pp:
        raise ValueError(
            f"stage_layers has {len(c.stage_layers)} entries, expected pp ({c.pp})"
        )
    if c.first_stage_layers or c.last_stage_layers or c.embedding_as_layer or c.loss_as_layer:
        raise ValueError("stage_layers cannot be combined with first_stage_layers, "
                         "last_stage_layers, embedding_as_layer or loss_as_layer")
    # a rank's layers need not be a multiple of vp: Megatron-Core's
    # --pipeline-model-parallel-layout names each chunk (the models split a rank's layers over its
    # chunks as evenly as possible, the heavier first: perfmodel.parallel.layers.balanced_chunk_layers)
    if c.vp > 1 and any(n < c.vp for n in c.stage_layers):
        raise ValueError(
            f"stage_layers {list(c.stage_layers)}: every entry must be at least vp ({c.vp}), "
            "one layer a chunk"
        )
    r = c.stage_recompute_layers
    if r is None:
        return
    if len(r) != c.pp:
        raise ValueError(f"stage_recompute_layers has {len(r)} entries, expected pp ({c.pp})")
    if c.recompute != "full":
        raise ValueError(
            f"stage_recompute_layers needs recompute 'full' (got recompute '{c.recompute}')"
        )
    if any(k > n for k, n in zip(r, c.stage_layers, strict=True)):
        raise ValueError(
            f"stage_recompute_layers {list(r)} exceeds stage_layers {list(c.stage_layers)}"
        )
    if c.vp > 1 and any(k % c.vp for k in r):
        raise ValueError(
            f"stage_recompute_layers {list(r)}: every entry must be a multiple of vp ({c.vp})"
        )


def resolve_config(
    config: ParallelConfig,
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec | None = None,
    *,
    allow_idle_gpus: bool = False,
    allow_tp_across_nodes: bool = False,
) -> ParallelConfig:
    """Check a configuration against the model, training setup and cluster; fill in
    ``num_microbatches``. Raises :class:`SpecError` naming the operands that disagree."""
    c = config
    m = model
    if m.num_attention_heads % c.tp:
        raise SpecError(f"tp ({c.tp}) must divide num_attention_heads ({m.num_attention_heads})")
    if m.kv_heads % c.tp and c.tp % m.kv_heads:
        raise SpecError(
            f"tp ({c.tp}) and num_kv_heads ({m.kv_heads}) must divide one another"
        )
    if c.stage_layers is not None:
        if sum(c.stage_layers) != m.num_layers:
            raise SpecError(
                f"stage_layers {list(c.stage_layers)} sum to {sum(c.stage_layers)}, expected "
                f"num_layers ({m.num_layers})"
            )
    else:
        c = _with_layer_layout(c, m.num_layers)
    if training.seq_len % (2 * c.cp if c.cp > 1 else 1):
        raise SpecError(f"2*cp ({2 * c.cp}) must divide seq_len ({training.seq_len})")
    if c.cp > 1 and c.cp_comm == "a2a":
        _check_a2a_heads(c, m)
    if c.cp > 1 and c.cp_comm == "a2a+p2p":
        c = _with_hierarchical_sizes(c, m, cluster)
    if c.sequence_parallel and training.seq_len % c.tp:
        raise SpecError(f"tp ({c.tp}) must divide seq_len ({training.seq_len}) for sequence_parallel")
    per_step = c.dp * c.micro_batch_size
    if training.global_batch_size % per_step:
        raise SpecError(
            f"dp*micro_batch_size ({c.dp}*{c.micro_batch_size}={per_step}) must divide "
            f"global_batch_size ({training.global_batch_size})"
        )
    nmb = training.global_batch_size // per_step
    if c.num_microbatches is not None and c.num_microbatches != nmb:
        raise SpecError(
            f"num_microbatches ({c.num_microbatches}) must equal global_batch_size / "
            f"(dp*micro_batch_size) = {training.global_batch_size}/{per_step} = {nmb}"
        )
    if c.schedule == "interleaved" and nmb % c.pp:
        raise SpecError(
            f"interleaved schedule: pp ({c.pp}) must divide num_microbatches ({nmb})"
        )
    if cluster is not None:
        n = cluster.total_gpus
        if c.gpus != n and not (allow_idle_gpus and c.gpus < n):
            raise SpecError(
                f"dp*tp*pp*cp ({c.dp}*{c.tp}*{c.pp}*{c.cp}={c.gpus}) must equal the cluster's "
                f"GPU count ({n})"
            )
        if c.tp > cluster.scale_up_size and not allow_tp_across_nodes:
            raise SpecError(
                f"tp ({c.tp}) must fit in the scale-up domain ({cluster.scale_up_size} GPUs) "
                f"of cluster '{cluster.name}'"
            )
    check_expert_parallel(c, m, cluster, allow_tp_across_nodes=allow_tp_across_nodes)
    if m.is_hybrid:  # Mamba2 layers: tp splits heads and groups; cp not modelled

        why = str(unsupported_parallelism(m, c.tp, c.cp)[()])
        if why:
            raise SpecError(f"model '{m.name}' (tp {c.tp}, cp {c.cp}): {why}")
    etp = c.expert_tp if m.is_moe else c.tp
    return c.model_copy(update={"num_microbatches": nmb, "etp": etp})


def a2a_heads_ok(num_heads, kv_heads, tp, cp) -> np.ndarray:
    """Whether Ulysses context parallelism (``cp_comm = "a2a"``) can split the heads of one
    tensor-parallel rank over ``cp``: ``cp`` divides its query heads ``heads / tp`` and its K/V
    heads ``max(kv_heads / tp, 1)`` (a rank holds at least one K/V head; Transformer Engine
    ``AttnFuncWithCPAndQKVOA2A.forward``: "cp_comm_type='a2a' requires num_heads % cp_size == 0
    for Q, K, V"). True at cp = 1."""
    tp = np.asarray(tp, dtype=np.int64)
    cp = np.asarray(cp, dtype=np.int64)
    q = np.asarray(num_heads, dtype=np.int64) // np.maximum(tp, 1)
    kv = np.maximum(np.asarray(kv_heads, dtype=np.int64) // np.maximum(tp, 1), 1)
    return (cp <= 1) | ((q % cp == 0) & (kv % cp == 0))


def hierarchical_a2a_size(num_heads, kv_heads, tp, cp, scale_up_size: int) -> np.ndarray:
    """The inner (all-to-all) size ``A`` of hierarchical context parallelism (``cp_comm =
    "a2a+p2p"``): the largest divisor of ``cp`` whose group of ``A`` consecutive cp ranks
    (``tp * A`` GPUs: the cp group strides by tp) fits the NVLink domain of ``scale_up_size``
    GPUs and splits a tensor-parallel rank's heads (:func:`a2a_heads_ok`); the ring runs over
    the ``cp / A`` groups. Megatron-Core builds the inner groups from consecutive ranks of the
    cp group (``parallel_state.create_hierarchical_groups``, level 1 first) and intends the
    all-to-all for NVLink, the ring for the network (``TransformerConfig.cp_comm_type``:
    "A2A communications in low-level CP groups (e.g., via NVLink)").

    The hierarchy is real only for ``1 < A < cp``: at ``A = cp`` it is Ulysses, at ``A = 1``
    the ring (Transformer Engine ``attn_forward_func_with_cp`` falls back to them).

    Example: cp 16, tp 2 on 8-GPU nodes, 32 query / 8 K/V heads: A = 4 (tp * 4 = 8 GPUs),
    ring over 4.
    """
    tp = np.asarray(tp, dtype=np.int64)
    cp = np.asarray(cp, dtype=np.int64)
    best = np.ones(np.broadcast(tp, cp).shape, dtype=np.int64)
    for a in range(2, int(np.max(cp, initial=1)) + 1):
        ok = (cp % a == 0) & (tp * a <= scale_up_size) & a2a_heads_ok(num_heads, kv_heads, tp, a)
        best = np.where(ok, a, best)
    return best


def with_hierarchical_sizes(batch: ConfigBatch, model: ModelSpec, scale_up_size: int
                            ) -> ConfigBatch:
    """The batch with the a2a size of its ``a2a+p2p`` rows that name none (``cp_a2a`` 1):
    :func:`hierarchical_a2a_size` on the NVLink domain of ``scale_up_size`` GPUs; the batch
    itself when no row needs one."""
    fill = (batch.cp_comm == CpComm.A2A_P2P) & (batch.cp > 1) & (batch.cp_a2a <= 1)
    if not np.any(fill):
        return batch
    a = hierarchical_a2a_size(model.num_attention_heads, model.kv_heads, batch.tp, batch.cp,
                              scale_up_size)
    return replace(batch, cp_a2a=np.where(fill, a, batch.cp_a2a))


def _with_hierarchical_sizes(c: ParallelConfig, m: ModelSpec, cluster: ClusterSpec | None
                             ) -> ParallelConfig:
    """The config with its hierarchical a2a size: the one it names (its heads checked), else
    :func:`hierarchical_a2a_size` on the cluster's NVLink domain."""
    if c.cp_a2a is None:
        if cluster is None:
            raise SpecError(f"cp_comm 'a2a+p2p' (cp {c.cp}): give cp_a2a, the all-to-all part "
                            "of the hierarchical cp sizes, or a cluster to choose it")
        a = int(hierarchical_a2a_size(m.num_attention_heads, m.kv_heads, c.tp, c.cp,
                                      cluster.scale_up_size))
        if not 1 < a < c.cp:
            raise SpecError(
                f"cp_comm 'a2a+p2p' (cp {c.cp}, tp {c.tp}): no all-to-all group of 1 < A < cp "
                f"fits the {cluster.scale_up_size}-GPU NVLink domain and divides the heads "
                f"({m.num_attention_heads // c.tp} query, {max(m.kv_heads // c.tp, 1)} K/V a "
                f"tensor-parallel rank); use 'a2a' or 'p2p'")
        return c.model_copy(update={"cp_a2a": a})
    if not bool(a2a_heads_ok(m.num_attention_heads, m.kv_heads, c.tp, c.cp_a2a)):
        raise SpecError(
            f"cp_comm 'a2a+p2p': cp_a2a ({c.cp_a2a}) must divide the attention heads "
            f"({m.num_attention_heads // c.tp}) and the K/V heads ({max(m.kv_heads // c.tp, 1)}) "
            f"of a tensor-parallel rank")
    return c


def _check_a2a_heads(c: ParallelConfig, m: ModelSpec) -> None:
    if not bool(a2a_heads_ok(m.num_attention_heads, m.kv_heads, c.tp, c.cp)):
        q, kv = m.num_attention_heads // c.tp, max(m.kv_heads // c.tp, 1)
        raise SpecError(
            f"cp_comm 'a2a': cp ({c.cp}) must divide the attention heads ({q}) and the K/V "
            f"heads ({kv}) of a tensor-parallel rank (num_attention_heads "
            f"{m.num_attention_heads}, num_kv_heads {m.kv_heads}, tp {c.tp})")


def _with_layer_layout(c: ParallelConfig, num_layers: int) -> ParallelConfig:
    """The config with a Megatron-LM layer layout: the one it names, checked, or, when it names
    none and ``pp*vp`` does not divide the layers, :func:`perfmodel.parallel.layers.megatron_layout`."""

    first, last = c.first_stage_layers or 0, c.last_stage_layers or 0
    named = first or last or c.embedding_as_layer or c.loss_as_layer
    if named:
        if c.pp == 1:
            raise SpecError(
                "first_stage_layers, last_stage_layers, embedding_as_layer and loss_as_layer "
                "need pp > 1 (got pp=1)"
            )
        counts = stage_layer_counts(num_layers, c.pp, c.vp, first, last, c.embedding_as_layer,
                                    c.loss_as_layer)
        if not bool(counts["valid"]):
            raise SpecError(
                f"no Megatron-LM layout of num_layers ({num_layers}) on pp ({c.pp}) x vp "
                f"({c.vp}) with first_stage_layers ({first}), last_stage_layers ({last}), "
                f"embedding_as_layer ({c.embedding_as_layer}), loss_as_layer ({c.loss_as_layer}): "
                "the rest must split evenly over the other ranks and each rank's layers over its "
                "vp chunks, and first/last cannot be combined with embedding/loss accounting"
            )
        return c
    if num_layers % (c.pp * c.vp) == 0:
        return c
    lay = megatron_layout(num_layers, c.pp, c.vp, explicit=True)
    if not bool(lay["valid"][0]):
        raise SpecError(
            f"pp*vp ({c.pp}*{c.vp}={c.pp * c.vp}) does not divide num_layers ({num_layers}) and "
            "no Megatron-LM layout fits (first/last-stage layer counts, the embedding and the "
            "loss counted as layers, or a balanced --pipeline-model-parallel-layout, which needs "
            "pp*vp <= num_layers)"
        )
    if bool(lay["explicit"][0]):
        # the balanced explicit layout (--pipeline-model-parallel-layout): no field names it;
        # ConfigBatch.layer_counts and emit.launch derive it from (pp, vp) as here
        return c
    return c.model_copy(update={
        "first_stage_layers": int(lay["first"][0]) or None,
        "last_stage_layers": int(lay["last"][0]) or None,
        "embedding_as_layer": bool(lay["embedding_as_layer"][0]),
        "loss_as_layer": bool(lay["loss_as_layer"][0]),
    })


@dataclass(frozen=True)
class ConfigBatch:
    """Struct of arrays: one entry per configuration (all arrays the same length).

    Categorical fields are integer codes: ``recompute`` indexes :data:`RECOMPUTE`, ``schedule``
    :data:`SCHEDULE`, ``grad_compression`` :data:`COMPRESSION`, ``cp_comm`` :data:`CP_COMM`.
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    vp: np.ndarray
    cp: np.ndarray
    zero_stage: np.ndarray
    micro_batch_size: np.ndarray
    num_microbatches: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    schedule: np.ndarray
    grad_compression: np.ndarray
    topk_ratio: np.ndarray
    # expert parallel sizes; None fills ep = 1 and etp = tp (Megatron's default)
    ep: np.ndarray | None = None
    etp: np.ndarray | None = None
    # context-parallel communication (codes of CP_COMM); None fills p2p (the ring)
    cp_comm: np.ndarray | None = None
    # the all-to-all (inner) size of cp_comm "a2a+p2p" (ParallelConfig.cp_a2a); 1 elsewhere;
    # None fills 1
    cp_a2a: np.ndarray | None = None
    # layer layout (see ParallelConfig); None fills zeros / False (the even split)
    first_stage_layers: np.ndarray | None = None
    last_stage_layers: np.ndarray | None = None
    embedding_as_layer: np.ndarray | None = None
    loss_as_layer: np.ndarray | None = None
    # Per-stage layouts (ParallelConfig.stage_layers / stage_recompute_layers) as ``(n, S)``
    # int64 matrices, S >= max pp: ``stage_layers`` row of zeros = no per-stage layout;
    # ``stage_recompute_layers`` row of -1 = not given. None: no row has one.
    stage_layers: np.ndarray | None = None
    stage_recompute_layers: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = np.shape(self.dp)[0] if np.ndim(self.dp) else 1
        for name in _LAYOUT_FIELDS:
            if getattr(self, name) is None:
                object.__setattr__(self, name, _as_code_array(name, _LAYOUT_DEFAULTS[name], n))
        if self.ep is None:
            object.__setattr__(self, "ep", _as_code_array("ep", 1, n))
        if self.cp_comm is None:
            object.__setattr__(self, "cp_comm", _as_code_array("cp_comm", 0, n))
        if self.cp_a2a is None:
            object.__setattr__(self, "cp_a2a", _as_code_array("cp_a2a", 1, n))
        if self.etp is None:
            object.__setattr__(self, "etp", np.array(self.tp, copy=True))

    def layer_counts(self, num_layers: int) -> dict[str, np.ndarray]:
        """Layers per pipeline rank and chunk of every configuration
        (:func:`perfmodel.parallel.layers.stage_layer_counts`).

        Computed once per batch and layer count (time, memory and communication all read it):
        the arrays are shared and read-only."""
        cache = self.__dict__.setdefault("_layer_counts_cache", {})
        if num_layers not in cache:
            out = {k: v.view() for k, v in self._layer_counts(num_layers).items()}
            for v in out.values():
                v.setflags(write=False)
            cache[num_layers] = out
        return dict(cache[num_layers])

    def _layer_counts(self, num_layers: int) -> dict[str, np.ndarray]:
        if len(self) > 256:  # a search batch: each distinct layout once, spread back
            sub, codes = self.unique_by(_LAYOUT_KEY_FIELDS)
            if 2 * len(sub) < len(self):
                return {k: v.take(codes, axis=0)
                        for k, v in sub._layer_counts(num_layers).items()}
        first, last = self.first_stage_layers, self.last_stage_layers
        emb, loss = self.embedding_as_layer, self.loss_as_layer
        # rows that name no layout and whose pp*vp does not divide the layers: the default
        # Megatron-LM layout (what resolve_config fills in for a ParallelConfig)
        unnamed = (first == 0) & (last == 0) & ~emb & ~loss
        fill = unnamed & (num_layers % (self.pp * self.vp) != 0)
        explicit = None
        if np.any(fill):
            lay = megatron_layout(num_layers, self.pp[fill], self.vp[fill], explicit=True)
            first, last, emb, loss = (x.copy() for x in (first, last, emb, loss))
            first[fill], last[fill] = lay["first"], lay["last"]
            emb[fill], loss[fill] = lay["embedding_as_layer"], lay["loss_as_layer"]
            if np.any(lay["explicit"]):
                explicit = np.zeros(len(self), dtype=bool)
                explicit[np.flatnonzero(fill)[lay["explicit"]]] = True
        out = stage_layer_counts(num_layers, self.pp, self.vp, first, last, emb, loss)
        if explicit is not None:  # the balanced explicit layout (--pipeline-model-parallel-layout)

            bal = balanced_layer_counts(num_layers, self.pp[explicit], self.vp[explicit])
            out = {k: v.copy() for k, v in out.items()}
            for k, v in bal.items():
                out[k][explicit] = v
        return out

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    @property
    def gpus(self) -> np.ndarray:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_dp(self) -> np.ndarray:
        """Expert data parallel size ``tp*cp*dp / (ep*etp)`` (at least 1)."""
        return np.maximum(self.dp * self.cp * self.tp // (self.ep * self.etp), 1)

    @classmethod
    def from_arrays(cls, **arrays) -> ConfigBatch:
        """Build from arrays (or scalars, broadcast); missing fields take ParallelConfig defaults.

        String values for categorical fields are converted to codes. ``etp`` defaults to ``tp``
        (Megatron's default expert tensor parallel size).
        """
        n = max((np.size(v) for k, v in arrays.items() if k not in _STAGE_FIELDS), default=1)
        defaults = ParallelConfig()
        out = {}
        etp_missing = arrays.get("etp") is None
        for f in fields(cls):
            v = arrays.pop(f.name, None)
            if f.name in _STAGE_FIELDS:
                out[f.name] = _stage_matrix(v, n, fill=0 if f.name == "stage_layers" else -1)
                continue
            if f.name == "num_microbatches" and v is None:
                v = 1
            if f.name == "etp" and etp_missing:
                v = out["tp"]
            if f.name == "cp_a2a":
                v = 1 if v is None else np.where(np.equal(np.asarray(v, dtype=object), None),
                                                 1, v).astype(np.int64)
            if f.name in _LAYOUT_FIELDS:
                v = _LAYOUT_DEFAULTS[f.name] if v is None else np.where(
                    np.equal(np.asarray(v, dtype=object), None), _LAYOUT_DEFAULTS[f.name], v)
            if v is None:
                v = getattr(defaults, f.name)
            out[f.name] = _as_code_array(f.name, v, n)
        if arrays:
            raise TypeError(f"unknown ConfigBatch fields: {sorted(arrays)}")
        return cls(**out)

    @classmethod
    def from_configs(cls, configs: list[ParallelConfig]) -> ConfigBatch:
        """Batch of resolved configs (``num_microbatches`` must be set)."""
        cols = {f.name: [getattr(c, f.name) for c in configs] for f in fields(cls)}
        cols["etp"] = [c.expert_tp for c in configs]
        if any(v is None for v in cols["num_microbatches"]):
            raise ValueError("resolve configs (num_microbatches) before batching them")
        return cls.from_arrays(**cols)

    def take(self, idx) -> ConfigBatch:
        """Sub-batch at the given indices or boolean mask."""
        return ConfigBatch(**{f.name: _take(getattr(self, f.name), idx) for f in fields(self)})

    @property
    def has_layout(self) -> np.ndarray:
        """Rows with a per-stage layout (``stage_layers`` given)."""
        if self.stage_layers is None:
            return np.zeros(len(self), dtype=bool)
        return self.stage_layers.sum(axis=1) > 0

    def unique_by(self, names: tuple[str, ...]) -> tuple[ConfigBatch, np.ndarray]:
        """The distinct configurations by the fields ``names`` (first occurrences) and, for
        every configuration, the index of its representative: ``f(batch) == f(sub)[codes]`` for
        any cost ``f`` that reads only those fields. Exact (mixed-radix key of per-field codes).
        Computed once per batch and set of ``names`` (the order of the fields does not change
        the codes; shared, ``codes`` read-only)."""
        cache = self.__dict__.setdefault("_unique_cache", {})
        key = frozenset(names)
        if key not in cache:
            sub, codes = self._unique_by(tuple(names))
            codes.setflags(write=False)
            cache[key] = (sub, codes)
        return cache[key]

    def per_distinct(self, names: tuple[str, ...], fn) -> dict[str, np.ndarray]:
        """``fn(batch)`` (per-configuration arrays, or dicts, tuples or dataclasses of them:
        :func:`spread_rows`) computed once per distinct
        configuration by the fields ``names`` and spread back (:meth:`unique_by`): exact for
        an elementwise ``fn`` that reads only those fields. Small batches, and batches whose
        rows are mostly distinct, are computed as they are."""
        if len(self) > 256:
            sub, codes = self.unique_by(names)
            if 2 * len(sub) < len(self):
                return spread_rows(fn(sub), codes, len(sub))
        return fn(self)

    def _unique_by(self, names: tuple[str, ...]) -> tuple[ConfigBatch, np.ndarray]:
        finer = self._finer_unique(names)
        if finer is not None:  # coarsen distinct rows already found: exact, and far fewer
            sub, codes = finer
            coarse, sub_codes = sub.unique_by(names)
            return coarse, sub_codes.take(codes)
        # A mixed-radix key of per-field codes, started from the codes of the most of these
        # fields already coded (a key of unique_by, or one re-coded on the way to one: any
        # coding of a subset gives the same rows) and re-coded to its distinct values whenever
        # it would outgrow a dense table of ``limit`` entries: linear time, no sort.
        limit = max(4 * len(self), 1024)
        coded = self.__dict__.setdefault("_subset_codes", {})
        done = max((k for k in coded if k <= set(names)), key=len, default=frozenset())
        radix, key = coded.get(done, (1, None))  # radix: distinct values key can take so far
        for name in names:
            v, span = (1, 1) if name in done else self._field_codes(name, limit)
            done = done | {name}
            if span == 1:  # coded already, or one value: the key stays as it is
                continue
            if key is None:
                key, radix = v, span
                continue
            if radix * span > limit:  # re-code the key (stays <= len(self))
                key, radix = _recode_dense(key, radix)
                coded[done - {name}] = (radix, key)
            key = key * span
            key += v  # (a new array: the codes it started from stay as they are)
            radix *= span
            if radix > limit:  # still too wide for a table: sort
                key, uniq = _factorize(key)
                radix = len(uniq)
        key = np.zeros(len(self), dtype=np.int64) if key is None else key
        codes, first = _factorize_dense(key, radix)
        coded[done] = (len(first), codes)
        return self.take(first), codes

    def _finer_unique(self, names: tuple[str, ...]) -> tuple[ConfigBatch, np.ndarray] | None:
        """The fewest distinct rows already found (:meth:`unique_by`) by a superset of
        ``names``, or None. The first occurrence of a row by ``names`` is the first occurrence
        of its row by the superset, so the distinct rows of those rows by ``names`` are this
        batch's, in the same order of first occurrence."""
        wanted = set(names)
        found = [v for k, v in self.__dict__.get("_unique_cache", {}).items() if wanted <= k]
        return min(found, key=lambda v: len(v[0]), default=None)

    def _field_codes(self, name: str, limit: int) -> tuple[np.ndarray, int]:
        """One field as int64 codes in ``[0, span)`` and ``span`` (small integers: the value
        less the smallest; else the distinct values in order of first occurrence). Computed
        once per batch and field."""
        cache = self.__dict__.setdefault("_field_code_cache", {})
        if name not in cache:
            v = np.asarray(getattr(self, name))
            v = v.view(np.int8) if v.dtype.kind == "b" else v
            lo, hi = (v.min(), v.max()) if len(v) else (0, 0)
            span = int(hi) - int(lo) + 1 if v.dtype.kind in "iu" else 0
            if lo == hi:  # one value (of any type)
                cache[name] = (np.zeros(len(v), dtype=np.int64), 1)
            elif 0 < span <= limit:  # (the field itself where it is already its codes)
                cache[name] = (v if lo == 0 and v.dtype == np.int64
                               else np.subtract(v, lo, dtype=np.int64), span)
            else:  # not small integers: code the values
                codes_v, uniq_v = _factorize(v)
                cache[name] = (codes_v, max(len(uniq_v), 1))
        return cache[name]

    def config(self, i: int) -> ParallelConfig:
        """The i-th configuration as a ParallelConfig."""
        d = {f.name: getattr(self, f.name)[i].item() for f in fields(self)
             if f.name not in _STAGE_FIELDS}
        pp = int(d["pp"])
        lay, rec = self.stage_layers, self.stage_recompute_layers
        has = lay is not None and lay[i].sum() > 0
        d["stage_layers"] = tuple(int(x) for x in lay[i, :pp]) if has else None
        has_r = has and rec is not None and rec[i, 0] >= 0
        d["stage_recompute_layers"] = tuple(int(x) for x in rec[i, :pp]) if has_r else None
        d["recompute"] = RECOMPUTE[d["recompute"]]
        d["schedule"] = SCHEDULE[d["schedule"]]
        d["grad_compression"] = COMPRESSION[d["grad_compression"]]
        d["cp_comm"] = CP_COMM[d["cp_comm"]]
        hier = d["cp_comm"] == "a2a+p2p" and d["cp"] > 1 and d["cp_a2a"] > 1
        d["cp_a2a"] = d["cp_a2a"] if hier else None
        d["sequence_parallel"] = bool(d["sequence_parallel"])
        d["embedding_as_layer"] = bool(d["embedding_as_layer"])
        d["loss_as_layer"] = bool(d["loss_as_layer"])
        d["first_stage_layers"] = d["first_stage_layers"] or None
        d["last_stage_layers"] = d["last_stage_layers"] or None
        return ParallelConfig.model_construct(**d)

    def to_dict(self, i: int) -> dict:
        return self.config(i).model_dump()


_LAYOUT_FIELDS = ("first_stage_layers", "last_stage_layers", "embedding_as_layer", "loss_as_layer")
_LAYOUT_DEFAULTS = {"first_stage_layers": 0, "last_stage_layers": 0, "embedding_as_layer": False,
                    "loss_as_layer": False}
_STAGE_FIELDS = ("stage_layers", "stage_recompute_layers")
#: The fields :meth:`ConfigBatch.layer_counts` reads (with the model's layer count).
_LAYOUT_KEY_FIELDS = ("pp", "vp", *_LAYOUT_FIELDS)


def _factorize(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of ``v`` in order of first occurrence, and the distinct values (as
    ``pandas.factorize``): ``uniq[codes] == v``."""
    uniq, first, inv = np.unique(v, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[inv.reshape(-1)], uniq[order]


def spread_rows(value, codes: np.ndarray, n_sub: int, _seen: dict | None = None):
    """``value`` computed on ``n_sub`` distinct rows, spread back to every row (``codes``: each
    row's distinct row): arrays whose first axis has ``n_sub`` entries are taken at ``codes``
    (an array met twice is taken once: the spread values alias as the computed ones did);
    dicts, tuples and dataclasses are spread field by field; anything else (scalars, specs)
    is returned as it is."""
    seen = {} if _seen is None else _seen
    if isinstance(value, np.ndarray):
        if not (value.ndim and value.shape[0] == n_sub):
            return value
        if id(value) not in seen:
            seen[id(value)] = (value, value.take(codes, axis=0))
        return seen[id(value)][1]
    if isinstance(value, dict):
        return {k: spread_rows(v, codes, n_sub, seen) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(spread_rows(v, codes, n_sub, seen) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: spread_rows(getattr(value, f.name), codes, n_sub, seen)
                                 for f in fields(value) if f.init})
    return value


def _recode_dense(key: np.ndarray, radix: int) -> tuple[np.ndarray, int]:
    """Integer keys in ``[0, radix)`` re-coded to ``[0, distinct)`` (in the order of the key
    values, not of first occurrence: for the prefix of a longer key) and ``distinct``."""
    seen = np.zeros(radix, dtype=bool)
    seen[key] = True
    rank = np.cumsum(seen, dtype=np.int64) - 1
    return rank[key], int(rank[-1]) + 1


def _factorize_dense(key: np.ndarray, radix: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_factorize` of integer keys in ``[0, radix)`` by a table of ``radix`` entries
    (linear time): the codes in order of first occurrence and each code's first row."""
    n = len(key)
    first_of_key = np.full(radix, n, dtype=np.int64)
    first_of_key[key[::-1]] = np.arange(n - 1, -1, -1)  # the last write (first row) wins
    present = np.flatnonzero(first_of_key < n)
    first = np.sort(first_of_key[present])
    rank = np.empty(radix, dtype=np.int64)
    rank[key[first]] = np.arange(len(first))
    return rank[key], first


def _take(v, idx):
    return None if v is None else v[idx]


def _stage_matrix(v, n: int, fill: int) -> np.ndarray | None:
    """An ``(n, S)`` int64 layout matrix from None, a matrix, or a list of tuples / None."""
    if v is None:
        return None
    if isinstance(v, np.ndarray) and v.ndim == 2:
        out = v.astype(np.int64)
        return np.broadcast_to(out, (n, out.shape[1])).copy() if out.shape[0] != n else out.copy()
    rows = list(v)
    if all(r is None for r in rows):
        return None
    width = max(len(r) for r in rows if r is not None)
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for i, r in enumerate(rows):
        if r is not None:
            out[i, :len(r)] = r
    return out


_CODES = {"recompute": RECOMPUTE, "schedule": SCHEDULE, "grad_compression": COMPRESSION,
          "cp_comm": CP_COMM}


def _as_code_array(name: str, v, n: int) -> np.ndarray:
    if name in _CODES:
        table = _CODES[name]
        arr = np.asarray(v)
        if arr.dtype.kind in "US" or arr.dtype == object:

            def _code(s, table=table, name=name):
                if s not in table:
                    raise SpecError(f"{name} = {s!r}: expected one of {list(table)}")
                return table.index(s)

            arr = np.vectorize(_code, otypes=[np.int64])(arr) if arr.size else arr.astype(
                np.int64
            )
        arr = arr.astype(np.int64)
    elif name in ("sequence_parallel", "embedding_as_layer", "loss_as_layer"):
        arr = np.asarray(v, dtype=bool)
    elif name == "topk_ratio":
        arr = np.asarray(v, dtype=np.float64)
    else:
        arr = np.asarray(v, dtype=np.int64)
    if arr.ndim == 0 or arr.shape[0] != n:
        return np.broadcast_to(arr, (n,)).copy()
    return arr.copy()
