"""The search space of parallel configurations, and the problem every strategy solves.

A :class:`SearchSpace` holds, for each searched dimension, the list of candidate values; a
configuration is a vector of indices into those lists (the *genes*), and the whole space is the
Cartesian product, numbered by ``np.ravel_multi_index``. Decoding a block of indices into a
:class:`~perfmodel.parallel.config.ConfigBatch` and checking every structural constraint are whole-array
numpy operations, so the grid search enumerates millions of configurations without a Python loop
per configuration, and the evolutionary strategies use the very same integer encoding.

When the GPU count is exact (the default), ``dp`` is not a gene: it is derived as
``gpus / (tp * pp * cp)``; with ``allow_idle_gpus`` it becomes a free dimension and the
constraint is ``dp * tp * pp * cp <= gpus``.

A :class:`Problem` couples a space with the one vectorized evaluation path
(``perfmodel.step.evaluate.evaluate`` or an injected function with the same signature) and the objective.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from perfmodel.compute.layer import optimizer_params_per_gpu
from perfmodel.core.codes import CP_COMM, RECOMPUTE, SCHEDULE, CpComm, Recompute, Schedule
from perfmodel.core.errors import SpecError
from perfmodel.memory.breakdown import usable_hbm_bytes
from perfmodel.memory.optimizer_offload import cpu_adam_params_per_s, cpu_adam_s
from perfmodel.parallel.config import (
    ConfigBatch,
    ParallelConfig,
    a2a_heads_ok,
    hierarchical_a2a_size,
    resolve_config,
)
from perfmodel.parallel.layers import megatron_layout
from perfmodel.run import train_run, train_run_bounds
from perfmodel.spec.frameworks import (
    FrameworkSpec,
    capability_mask,
    capability_refusals,
    check_training_supported,
    explicit_layout_allowed,
    framework_pins,
    zero_pp_allowed,
)
from perfmodel.spec.hybrid import unsupported_parallelism
from perfmodel.spec.specs import (
    ClusterSpec,
    ModelSpec,
    TrainingSpec,
    format_validation_error,
)

__all__ = [
    "ALIASES",
    "OBJECTIVES",
    "OFFLOAD_KINDS",
    "OFFLOAD_SETS",
    "PARETO_OBJECTIVES",
    "PARETO_SETS",
    "SEARCH_DIMS",
    "Problem",
    "Scored",
    "SearchSpace",
    "divisors",
    "make_space",
]

#: Every dimension a space can search, in gene order (dp is a gene only with idle GPUs).
SEARCH_DIMS = (
    "tp",
    "pp",
    "cp",
    "dp",
    "vp",
    "zero_stage",
    "micro_batch_size",
    "recompute",
    "sequence_parallel",
    "schedule",
    "ep",
    "etp",
    "cp_comm",
)
#: Single objectives: what "best" minimises.
OBJECTIVES = ("time", "memory", "cost", "time-to-train")
#: Objectives of the multi-objective (Pareto) view, all minimised.
PARETO_OBJECTIVES = ("step_time_s", "peak_memory_bytes", "gpus")
#: The Pareto views by name (a plan's ``pareto_objectives``): the step's (step time, peak
#: memory, GPUs), or the whole run's (expected wall time with failures and checkpoints [s],
#: cost = GPU-hours x price, GPU-hours without a price: the same front), which needs the run's
#: length (:class:`perfmodel.run.RunSettings`).
PARETO_SETS = {"step-memory-gpus": PARETO_OBJECTIVES,
               "time-to-train-cost": ("train_wall_s", "train_cost")}

#: The offload sets a plan may search (``search.host_sharding``), in the order tried: the
#: optimizer states (ZeRO-Offload, Megatron's ``--optimizer-cpu-offload``), the activations
#: (Megatron / TE ``--cpu-offloading``), then the optimizer states and the parameters
#: (ZeRO-Infinity's ``offload_param``, ZeRO-3 only). ``Scored.freeable_bytes`` holds, per
#: configuration, an upper bound of what each kind of :data:`OFFLOAD_KINDS` frees.
OFFLOAD_SETS = (("optimizer",), ("activations",), ("optimizer", "params"))
OFFLOAD_KINDS = ("optimizer", "params", "activations")

#: Short names of dimensions: ``zero=1`` pins ``zero_stage``.
ALIASES = {"zero": "zero_stage", "micro_batch": "micro_batch_size", "mbs": "micro_batch_size",
            "sp": "sequence_parallel"}
_CATEGORICAL = {"recompute": RECOMPUTE, "schedule": SCHEDULE, "cp_comm": CP_COMM}

#: Constraint names, in the order they are checked (and reported when nothing is left).
#: Constraints that depend only on the (tp, pp, cp, dp, vp) prefix of the gene vector.
_PREFIX_CONSTRAINTS = ("gpus", "tp_heads", "tp_kv_heads", "tp_domain", "layers", "cp_seq",
                       "hybrid")

PREFIX_BLOCK = 2**20
"""Prefixes checked per numpy call in :meth:`SearchSpace.iter_chunks` (about 100 MB)."""

MAX_GRID_CONFIGURATIONS = 20_000_000
"""Most configurations the grid search evaluates unless told to go on (about 10 minutes on one
core): past it, the search is refused in one line that says how to narrow it."""

CONSTRAINTS = (
    "gpus",
    "tp_heads",
    "tp_kv_heads",
    "tp_domain",
    "layers",
    "cp_seq",
    "hybrid",
    "sequence_parallel",
    "cp_heads",
    "batch",
    "schedule",
    "expert",
    "framework",
)


def _hybrid_ok(model: ModelSpec, tp: np.ndarray, cp: np.ndarray) -> np.ndarray:
    """The tp / cp a hybrid Mamba2 model runs (:func:`perfmodel.compute.mamba.unsupported_parallelism`;
    everything for a transformer)."""
    if not model.is_hybrid:
        return np.ones(np.shape(tp), dtype=bool)

    return unsupported_parallelism(model, tp, cp) == ""


def divisors(n: int, upto: int | None = None) -> np.ndarray:
    """All positive divisors of ``n`` (those <= ``upto`` when given), ascending.

    Trial division by 1..sqrt(n) in blocks of 2^20 candidates (a divisor d > sqrt(n) is n // d
    of a small one), so memory stays a few MiB for any ``n``; with ``upto`` only the small
    divisors <= upto and the cofactors <= upto are tried (``n = 10**15``, ``upto = 2**20``:
    2^20 candidates).
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"divisors: n = {n}: expected a positive integer")
    root = math.isqrt(n)
    cap = root if upto is None else min(root, int(upto))
    small_parts, large_parts = [], []
    block = 1 << 20
    for lo in range(1, cap + 1, block):  # divisors d <= cap
        d = np.arange(lo, min(lo + block, cap + 1), dtype=object if n >= 2**63 else np.int64)
        small_parts.append(d[n % d == 0])
    # cofactors n // d with d <= root; with upto, only d >= n / upto can give n // d <= upto
    lo_d = 1 if upto is None else max(1, -(-n // int(upto)))
    for lo in range(lo_d, root + 1, block):
        d = np.arange(lo, min(lo + block, root + 1), dtype=object if n >= 2**63 else np.int64)
        large_parts.append(n // d[n % d == 0])
    vals = {int(x) for part in small_parts + large_parts for x in part}
    if upto is not None:
        vals = {v for v in vals if v <= upto}
    return np.asarray(sorted(vals), dtype=np.int64)


def _powers_of_two(cap: int) -> np.ndarray:
    return 2 ** np.arange(0, int(np.floor(np.log2(max(cap, 1)))) + 1)


@dataclass(frozen=True, eq=False)
class SearchSpace:
    """Candidate values per dimension plus the model, training setup and cluster they apply to.

    Build it with :func:`make_space`. ``values[d]`` is a sorted int64 array (codes for
    ``recompute`` and ``schedule``, 0/1 for ``sequence_parallel``).
    """

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    values: Mapping[str, np.ndarray] = field(repr=False)
    allow_idle_gpus: bool = False
    allow_tp_across_nodes: bool = False
    uneven_layers: bool = True
    num_microbatches: np.ndarray | None = field(default=None, repr=False)
    framework: FrameworkSpec | None = None
    # a per-stage layout the caller pinned (ParallelConfig.stage_layers /
    # stage_recompute_layers): every configuration of the space takes it
    stage_layers: tuple[int, ...] | None = None
    stage_recompute_layers: tuple[int, ...] | None = None

    @property
    def explicit_layout(self) -> bool:
        """Whether a ``pp*vp`` that no Megatron-LM first/last or embedding/loss layout fits may
        take the balanced explicit layout (``--pipeline-model-parallel-layout``,
        :func:`perfmodel.parallel.layers.balanced_stage_layers`): uneven layers allowed and the
        release runs it (:func:`perfmodel.spec.frameworks.explicit_layout_allowed`)."""
        return self.uneven_layers and explicit_layout_allowed(self.framework)

    @property
    def gpus(self) -> int:
        return self.cluster.total_gpus

    @property
    def dims(self) -> tuple[str, ...]:
        """Gene order: the searched dimensions (dp only when idle GPUs are allowed, cp_comm
        only when more than one is offered: a single one is filled in by :meth:`batch`)."""
        return tuple(d for d in SEARCH_DIMS if (d != "dp" or self.allow_idle_gpus)
                     and (d != "cp_comm" or len(self.values[d]) > 1))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.values[d]) for d in self.dims)

    @property
    def size(self) -> int:
        """Number of gene vectors (raw, before constraints)."""
        return math.prod(self.shape)

    def fixed(self) -> bool:
        """True when every dimension has exactly one candidate."""
        return all(len(v) == 1 for v in self.values.values())

    # ----------------------------------------------------------------------------------------
    def decode_flat(self, flat: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Decode flat indices into value arrays; return (arrays, violations per config)."""
        genes = np.unravel_index(np.asarray(flat, dtype=np.int64), self.shape)
        return self._decode_columns(genes)

    def decode(self, genes: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Decode an ``(n, len(dims))`` gene matrix.

        Returns the field arrays (``dp`` derived when the GPU count is exact, and
        ``num_microbatches``) and the number of violated constraints per configuration
        (0 = structurally valid; memory is checked by the evaluation).
        """
        genes = np.asarray(genes, dtype=np.int64)
        return self._decode_columns(tuple(genes[:, j] for j in range(genes.shape[1])))

    def _decode_columns(self, cols) -> tuple[dict[str, np.ndarray], np.ndarray]:
        a = {d: self.values[d][g] for d, g in zip(self.dims, cols, strict=True)}
        masks = self._constraint_masks(a)
        violations = np.zeros(a["tp"].shape, dtype=np.int8)
        for name in (*CONSTRAINTS, "canonical"):
            violations += ~masks[name]
        return a, violations

    def _constraint_masks(self, a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate every constraint (bool arrays, True = satisfied); fills a['dp'], a['nmb']."""
        m, t = self.model, self.training
        n_gpus = self.gpus
        tp, pp, cp, vp = a["tp"], a["pp"], a["cp"], a["vp"]
        if "cp_comm" not in a:  # one offered: not a gene
            a["cp_comm"] = np.full(np.shape(tp), self.values["cp_comm"][0], dtype=np.int64)
        # a2a+p2p: the all-to-all part as large as the NVLink domain and the heads allow
        # (perfmodel.parallel.config.hierarchical_a2a_size); 1 for the other types
        hier = a["cp_comm"] == CpComm.A2A_P2P
        a["cp_a2a"] = (np.where(hier, hierarchical_a2a_size(
            m.num_attention_heads, m.kv_heads, tp, cp, self.cluster.scale_up_size), 1)
            if np.any(hier) else np.ones(np.shape(tp), dtype=np.int64))
        model_par = tp * pp * cp
        if self.allow_idle_gpus:
            dp = a["dp"]
            gpus_ok = dp * model_par <= n_gpus
        else:
            dp = np.maximum(n_gpus // model_par, 1)
            gpus_ok = (n_gpus % model_par == 0) & np.isin(dp, self.values["dp"])
        a["dp"] = dp
        per_step = dp * a["micro_batch_size"]
        nmb = t.global_batch_size // per_step
        a["num_microbatches"] = np.maximum(nmb, 1)
        sched, sp, zero = a["schedule"], a["sequence_parallel"].astype(bool), a["zero_stage"]
        if self.stage_layers is not None:  # the pinned layout: pp ranks of >= vp layers
            layers_ok = (pp == len(self.stage_layers)) & (vp <= min(self.stage_layers))
        elif self.uneven_layers:
            layers_ok = m.num_layers % (pp * vp) == 0
            if not np.all(layers_ok):
                layers_ok = layers_ok | megatron_layout(
                    m.num_layers, pp, vp, explicit=self.explicit_layout)["valid"]
        else:
            layers_ok = m.num_layers % (pp * vp) == 0
        interleaved = sched == Schedule.INTERLEAVED
        batch_ok = t.global_batch_size % per_step == 0
        if self.num_microbatches is not None:
            batch_ok &= np.isin(nmb, self.num_microbatches)
        masks = {
            "gpus": gpus_ok,
            "tp_heads": m.num_attention_heads % tp == 0,
            "tp_kv_heads": (m.kv_heads % tp == 0) | (tp % m.kv_heads == 0),
            "tp_domain": (tp <= self.cluster.scale_up_size) | self.allow_tp_across_nodes,
            "layers": layers_ok,
            "cp_seq": (cp == 1) | (t.seq_len % (2 * cp) == 0),
            # Mamba2 layers: tp divides heads and groups, no cp (perfmodel.compute.mamba)
            "hybrid": _hybrid_ok(m, tp, cp),
            "sequence_parallel": ~sp | ((tp > 1) & (t.seq_len % tp == 0)),
            # Ulysses: cp divides a tensor-parallel rank's query and K/V heads; hierarchical
            # (a2a+p2p): an all-to-all group of 1 < A < cp that divides them fits the node
            "cp_heads": ((a["cp_comm"] != CpComm.A2A)
                         | a2a_heads_ok(m.num_attention_heads, m.kv_heads, tp, cp))
            & ((a["cp_comm"] != CpComm.A2A_P2P) | (cp == 1)
               | ((a["cp_a2a"] > 1) & (a["cp_a2a"] < cp))),
            "batch": batch_ok,
            # vp > 1 <=> interleaved; interleaved/zb need pp > 1; interleaved needs pp | nmb
            "schedule": ((vp > 1) == interleaved)
            & ((pp > 1) | ((sched != Schedule.INTERLEAVED) & (sched != Schedule.ZB)))
            & (~interleaved | (nmb % pp == 0)),
            # what the chosen training stack runs (--framework): ZeRO with pipelines, SP rule
            "framework": zero_pp_allowed(self.framework, zero, pp, tp, sp),
        }
        masks["expert"] = self._expert_mask(a, tp, cp, dp, sp)
        # what the stack's release runs (its [capabilities]: etp rule, cp with MoE, ...)
        masks["framework"] &= capability_mask(self.framework, m, a)
        # Drop exact duplicates: with pp = 1 the schedule does not matter (keep 1f1b), with
        # dp = 1 the ZeRO stage does not (keep the smallest stage offered).
        canonical = np.ones(tp.shape, dtype=bool)
        sched_vals = self.values["schedule"]
        if Schedule.ONE_F_ONE_B in sched_vals:
            canonical &= ~((pp == 1) & (sched == Schedule.GPIPE))
        zmin = self.values["zero_stage"].min()
        canonical &= ~((dp == 1) & (zero > zmin))
        # with cp = 1 the cp communication does not matter: keep the first offered
        canonical &= (cp > 1) | (a["cp_comm"] == self.values["cp_comm"][0])
        masks["canonical"] = canonical
        return masks

    def _expert_mask(self, a, tp, cp, dp, sp) -> np.ndarray:
        """MoE parallel folding (see :func:`perfmodel.parallel.config.check_expert_parallel`): ``ep*etp``
        divides the stage's ``tp*cp*dp`` GPUs, etp fits the scale-up domain, tp > 1 has
        sequence parallelism. A dense model has ep = 1 and etp = tp (set here)."""
        if not self.model.is_moe:
            a["etp"] = tp
            return a["ep"] == 1
        ep, etp = a["ep"], a["etp"]
        ok = ((tp * cp * dp) % (ep * etp) == 0) & (self.model.num_experts % ep == 0)
        ok &= self.model.expert_ffn_size % etp == 0
        ok &= (etp <= self.cluster.scale_up_size) | self.allow_tp_across_nodes
        return ok & ((tp == 1) | sp)

    def repair(self, genes: np.ndarray) -> np.ndarray:
        """Move gene vectors to the canonical neighbour that the schedule rules allow.

        With ``pp = 1`` the schedule becomes 1f1b and vp 1; with ``pp > 1`` the schedule
        follows vp (``vp > 1`` -> interleaved, ``vp = 1`` and interleaved -> 1f1b); with
        ``tp = 1`` sequence parallelism is off. Only values that are candidates are used.
        These rules join the feasible islands that a pure penalty leaves apart, so the
        evolutionary strategies reach corners such as ``tp = 8, pp = 1``.
        """
        g = np.array(genes, dtype=np.int64, copy=True)
        col = {d: j for j, d in enumerate(self.dims)}
        val = {d: self.values[d][g[:, j]] for d, j in col.items()}

        def index_of(d: str, v: int) -> int:
            hit = np.flatnonzero(self.values[d] == v)
            return int(hit[0]) if hit.size else -1

        def setto(d: str, mask: np.ndarray, v: int) -> None:
            i = index_of(d, v)
            if i >= 0:
                g[mask, col[d]] = i

        pp1 = val["pp"] == 1
        setto("schedule", pp1, Schedule.ONE_F_ONE_B)
        setto("vp", pp1, 1)
        vp_many = ~pp1 & (val["vp"] > 1)
        setto("schedule", vp_many, Schedule.INTERLEAVED)
        setto("schedule", ~pp1 & (val["vp"] == 1) & (val["schedule"] == Schedule.INTERLEAVED),
              Schedule.ONE_F_ONE_B)
        setto("sequence_parallel", val["tp"] == 1, 0)
        return g

    def batch(self, a: dict[str, np.ndarray], idx: np.ndarray | None = None) -> ConfigBatch:
        """ConfigBatch of the decoded arrays (optionally only at ``idx``)."""
        cols = {
            k: (v if idx is None else v[idx])
            for k, v in a.items()
            if k in SEARCH_DIMS or k in ("num_microbatches", "cp_a2a")
        }
        if "cp_comm" not in cols:  # one offered: not a gene
            cols["cp_comm"] = self.values["cp_comm"][0]
        if self.stage_layers is not None:  # the pinned per-stage layout
            n = np.size(cols["pp"])
            cols["stage_layers"] = np.tile(np.asarray(self.stage_layers, dtype=np.int64), (n, 1))
            rec = self.stage_recompute_layers
            if rec is not None:
                cols["stage_recompute_layers"] = np.tile(np.asarray(rec, dtype=np.int64), (n, 1))
            return ConfigBatch.from_arrays(**cols)
        # Megatron-LM's layout where pp*vp does not divide the layers
        uneven = self.model.num_layers % (cols["pp"] * cols["vp"]) != 0
        if np.any(uneven):
            lay = megatron_layout(self.model.num_layers, cols["pp"], cols["vp"],
                                  explicit=self.explicit_layout)
            cols["first_stage_layers"] = np.where(uneven, lay["first"], 0)
            cols["last_stage_layers"] = np.where(uneven, lay["last"], 0)
            cols["embedding_as_layer"] = uneven & lay["embedding_as_layer"]
            cols["loss_as_layer"] = uneven & lay["loss_as_layer"]
            # the balanced explicit layout (lay["explicit"]) names no field: ConfigBatch's
            # layer_counts gives its ranks' counts
        return ConfigBatch.from_arrays(**cols)

    def iter_chunks(self, chunk_size: int = 2**18, prune: bool = True) -> Iterator[np.ndarray]:
        """Blocks of flat indices (ascending). ``prune=False``: the whole space. Otherwise every
        configuration whose
        ``(tp, pp, cp[, dp], vp)`` prefix passes the constraints that depend on the prefix alone
        (GPU count, heads, scale-up domain, layers, sequence split). The prefix genes come
        first in the gene order, so each valid prefix is one contiguous range of flat indices;
        the invalid ranges (most of the raw space) are skipped without being decoded, and so
        are the cp_comm after the first of a prefix with cp = 1 (duplicates). The prefixes
        themselves are checked :data:`PREFIX_BLOCK` at a time: memory stays bounded whatever
        the space."""
        if not prune:
            for start in range(0, self.size, chunk_size):
                yield np.arange(start, min(start + chunk_size, self.size), dtype=np.int64)
            return
        block = self._suffix_size()
        per_chunk = max(1, chunk_size // block)
        offsets = np.arange(block, dtype=np.int64)
        # cp = 1: only the first cp_comm (the last gene) is canonical, the others are skipped
        first_comm = offsets % self._cp_comm_count() == 0
        for starts, cp1 in self._valid_prefix_starts():
            for i in range(0, starts.size, per_chunk):
                idx = starts[i:i + per_chunk, None] + offsets
                keep = ~cp1[i:i + per_chunk, None] | first_comm
                yield idx[keep] if not keep.all() else idx.ravel()

    def _suffix_size(self) -> int:
        """Configurations per ``(tp, pp, cp[, dp], vp)`` prefix."""
        return math.prod(self.shape[self.dims.index("vp") + 1:])

    def _cp_comm_count(self) -> int:
        """The cp_comm values when cp_comm is a gene (the last), else 1."""
        return len(self.values["cp_comm"]) if self.dims[-1] == "cp_comm" else 1

    def _valid_prefix_starts(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """First flat index of each prefix that passes the prefix constraints, ascending, in
        arrays of at most :data:`PREFIX_BLOCK` prefixes checked, with whether its cp is 1."""
        k = self.dims.index("vp") + 1
        block = self._suffix_size()
        n_prefix = math.prod(self.shape[:k])
        for p0 in range(0, n_prefix, PREFIX_BLOCK):
            genes = np.unravel_index(
                np.arange(p0, min(p0 + PREFIX_BLOCK, n_prefix), dtype=np.int64), self.shape[:k])
            zeros = np.zeros(genes[0].size, dtype=np.int64)
            a = {d: self.values[d][g] for d, g in
                 zip(self.dims, [*genes] + [zeros] * (len(self.dims) - k), strict=True)}
            masks = self._constraint_masks(a)
            ok = np.logical_and.reduce([masks[n] for n in _PREFIX_CONSTRAINTS])
            starts = (np.flatnonzero(ok).astype(np.int64) + p0) * block
            if starts.size:
                yield starts, a["cp"][ok] == 1

    def pruned_size(self) -> int:
        """Configurations :meth:`iter_chunks` yields (the space after the prefix pruning and
        the duplicate cp_comm of cp = 1)."""
        block = self._suffix_size()
        return sum(int((~cp1).sum()) * block + int(cp1.sum()) * (block // self._cp_comm_count())
                   for _, cp1 in self._valid_prefix_starts())

    def encode(self, config: ParallelConfig) -> int | None:
        """Flat index of a configuration, or None if one of its values is not a candidate."""
        idx = []
        for d in self.dims:
            v = getattr(config, d)
            if d == "etp":  # None (= tp); a dense model's single placeholder candidate
                v = config.expert_tp if self.model.is_moe else self.values[d][0]
            if d in _CATEGORICAL:
                v = _CATEGORICAL[d].index(v)
            hit = np.flatnonzero(self.values[d] == int(v))
            if hit.size == 0:
                return None
            idx.append(int(hit[0]))
        return int(np.ravel_multi_index(idx, self.shape))

    def explain_empty(self) -> str:
        """One line saying why no configuration satisfies the constraints.

        Applies the constraints in order to the whole space and reports the first that leaves
        nothing, with the operands of a rejected example (from :func:`resolve_config`).
        """
        alive_count: dict[str, int] = {}
        first_bad: dict[str, dict[str, Any]] = {}
        for flat in self.iter_chunks(prune=False):
            a, _ = self.decode_flat(flat)
            masks = self._constraint_masks(a)
            ok = np.ones(flat.shape, dtype=bool)
            for name in (*CONSTRAINTS, "canonical"):
                before = ok
                ok = ok & masks[name]
                alive_count[name] = alive_count.get(name, 0) + int(ok.sum())
                bad = np.flatnonzero(before & ~masks[name])
                if bad.size and name not in first_bad:
                    first_bad[name] = {k: v[bad[0]] for k, v in a.items()}
        for name in (*CONSTRAINTS, "canonical"):
            if alive_count.get(name, 0) == 0:
                example = first_bad.get(name)
                why = self._why(example) if example is not None else name
                return f"no parallel configuration satisfies the constraints: {why}"
        return "no parallel configuration satisfies the constraints"

    def _why(self, ex: dict[str, Any]) -> str:
        cfg = {k: ex[k].item() for k in SEARCH_DIMS if k in ex}
        cfg["recompute"] = RECOMPUTE[cfg["recompute"]]
        cfg["schedule"] = SCHEDULE[cfg["schedule"]]
        cfg["cp_comm"] = CP_COMM[cfg.get("cp_comm", self.values["cp_comm"][0])]
        cfg["sequence_parallel"] = bool(cfg["sequence_parallel"])
        if not self.allow_idle_gpus and cfg["dp"] not in self.values["dp"]:
            cfg["dp"] = int(self.values["dp"][0])  # the pinned dp that the GPU count rejects
        try:
            pc = ParallelConfig(**cfg)
            resolve_config(
                pc,
                self.model,
                self.training,
                self.cluster,
                allow_idle_gpus=self.allow_idle_gpus,
                allow_tp_across_nodes=self.allow_tp_across_nodes,
            )
        except ValidationError as err:
            return format_validation_error(err)
        except SpecError as err:
            return str(err)
        if self.num_microbatches is not None:
            return f"num_microbatches must be one of {self.num_microbatches.tolist()}"
        refused = self.framework_refusals(cfg)
        if refused:
            return refused[0]
        return ", ".join(f"{k}={v}" for k, v in cfg.items()) + " is invalid"

    def framework_refusals(self, cfg: Mapping[str, Any]) -> list[str]:
        """Why the framework does not run one configuration (ints; empty: it does)."""
        fw = self.framework
        if fw is None:
            return []
        out = []
        if cfg["pp"] > 1 and cfg["zero_stage"] > fw.max_zero_stage_with_pp:
            out.append(f"framework {fw.name} runs ZeRO stage <= {fw.max_zero_stage_with_pp} "
                       f"with pipeline parallelism (zero_stage {cfg['zero_stage']}, pp "
                       f"{cfg['pp']})")
        if fw.sequence_parallel == "required" and cfg["tp"] > 1 and not cfg["sequence_parallel"]:
            out.append(f"framework {fw.name} always uses sequence parallelism with tp > 1 "
                       f"(tp {cfg['tp']})")
        if not self.explicit_layout:
            L, pp, vp = self.model.num_layers, int(cfg["pp"]), int(cfg["vp"])
            if L % (pp * vp) and not bool(megatron_layout(L, pp, vp)["valid"][0]):
                out.append(f"framework {fw.name} ({fw.release}) has no explicit pipeline layout "
                           f"(--pipeline-model-parallel-layout, Megatron-Core >= 0.13) for "
                           f"{L} layers on pp {pp} x vp {vp}")
        return out + capability_refusals(fw, self.model, cfg)


# --------------------------------------------------------------------------------------------
def _candidates(d: str, model: ModelSpec, training: TrainingSpec, n_gpus: int, scale_up: int,
                *, allow_idle_gpus: bool, allow_tp_across_nodes: bool, uneven_layers: bool,
                max_micro_batch_size: int, max_vp: int, max_cp: int,
                explicit_layout: bool = False) -> np.ndarray:
    """Default candidate values of one dimension (constraints then prune combinations)."""
    if d == "tp":
        v = divisors(model.num_attention_heads)
        return v[v <= (n_gpus if allow_tp_across_nodes else min(scale_up, n_gpus))]
    if d == "pp":
        v = divisors(model.num_layers)
        if uneven_layers:
            v = np.union1d(v, divisors(n_gpus, upto=model.num_layers))
        return v[v <= n_gpus]
    if d == "cp":
        v = _powers_of_two(min(max_cp, n_gpus))
        return v[(v == 1) | (training.seq_len % (2 * v) == 0)]
    if d == "dp":
        if allow_idle_gpus:
            return divisors(training.global_batch_size, upto=n_gpus)
        return divisors(n_gpus)
    if d == "vp":
        v = divisors(model.num_layers)
        if uneven_layers:  # 126 layers on pp=8, vp=8 (the embedding and loss counted as layers)
            v = np.union1d(v, divisors(model.num_layers + 2))
        return v[v <= max_vp]
    if d == "zero_stage":
        return np.arange(4)
    if d == "micro_batch_size":
        v = _powers_of_two(max_micro_batch_size)
        return v[v <= training.global_batch_size]
    if d == "recompute":
        return np.arange(len(RECOMPUTE))
    if d == "sequence_parallel":
        return np.array([0, 1])
    if d == "schedule":
        return np.arange(len(SCHEDULE))
    if d == "ep":  # expert parallel: divisors of the expert count (1 for a dense model)
        v = divisors(model.num_experts)
        return v[v <= n_gpus]
    if d == "cp_comm":  # all; the framework's capabilities keep what its release runs
        return np.array([CpComm.P2P, CpComm.A2A, CpComm.ALLGATHER, CpComm.A2A_P2P])
    if d == "etp":  # expert tensor parallel: powers of two inside the scale-up domain
        if not model.is_moe:
            return np.array([1])
        v = _powers_of_two(min(scale_up, n_gpus, 8) if not allow_tp_across_nodes else n_gpus)
        return v[model.expert_ffn_size % v == 0]
    raise KeyError(d)


def _fixed_values(d: str, value: Any) -> np.ndarray:
    """User-pinned value(s) of a dimension as a sorted unique int64 array (validated)."""
    items = list(value) if isinstance(value, (list, tuple, range, set, np.ndarray)) else [value]
    if not items:
        raise SpecError(f"{d}: empty list of values")
    out = []
    for v in items:
        v = getattr(v, "value", v)  # str Enums from the CLI
        if d in _CATEGORICAL:
            table = _CATEGORICAL[d]
            if v not in table:
                raise SpecError(f"{d} = {v!r}: expected one of {', '.join(table)}")
            out.append(table.index(v))
        elif d == "sequence_parallel":
            if not isinstance(v, (bool, np.bool_)) and v not in (0, 1):
                raise SpecError(f"sequence_parallel = {v!r}: expected true or false")
            out.append(int(bool(v)))
        else:
            if isinstance(v, bool) or not float(v).is_integer():
                raise SpecError(f"{d} = {v!r}: expected an integer")
            v = int(v)
            lo = 0 if d == "zero_stage" else 1
            if v < lo or (d == "zero_stage" and v > 3):
                expect = "0, 1, 2 or 3" if d == "zero_stage" else "a positive integer"
                raise SpecError(f"{d} = {v}: expected {expect}")
            out.append(v)
    return np.unique(np.asarray(out, dtype=np.int64))


def make_space(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    *,
    allow_idle_gpus: bool = False,
    allow_tp_across_nodes: bool = False,
    uneven_layers: bool = True,
    max_micro_batch_size: int = 16,
    max_vp: int = 16,
    max_cp: int = 16,
    framework: FrameworkSpec | None = None,
    stage_layers: Any = None,
    stage_recompute_layers: Any = None,
    **fixed: Any,
) -> SearchSpace:
    """The search space for ``model`` trained as ``training`` on ``cluster``.

    Parameters
    ----------
    model, training, cluster
        Validated specs (the cluster already scaled to the GPU count).
    allow_idle_gpus
        Accept ``dp*tp*pp*cp <= gpus`` instead of ``== gpus`` (dp becomes a searched dimension).
    allow_tp_across_nodes
        Let tp exceed the scale-up (NVLink) domain.
    uneven_layers
        Accept ``pp*vp`` that does not divide the layer count, with Megatron-LM's uneven layout
        (:func:`perfmodel.parallel.layers.megatron_layout`: the embedding and the loss counted as
        layers, or lighter first/last stages). On by default; off: even splits only.
    max_micro_batch_size, max_vp, max_cp
        Caps of the default candidate lists (micro-batch sizes and cp are powers of two; vp
        divides the layer count).
    **fixed
        Pin a dimension to one value (``tp=8``) or a list / range of values
        (``pp=[4, 8, 16]``). Names: dp tp pp vp cp zero_stage (or zero) micro_batch_size
        (or micro_batch) recompute sequence_parallel schedule ep etp cp_comm num_microbatches.
        ``None`` means "search it".
    framework
        Keep to what this training stack runs (:func:`perfmodel.spec.frameworks.framework_pins`,
        intersected with the pins); ZeRO-with-pipeline and sequence-parallel rules become the
        ``framework`` constraint.
    stage_layers, stage_recompute_layers
        A per-stage layout every configuration takes (:class:`ParallelConfig`'s fields of
        those names): pins ``pp`` to its length; recompute counts pin recompute to full.

    Returns
    -------
    SearchSpace
    """
    fixed = {ALIASES.get(k, k): v for k, v in fixed.items() if v is not None}
    layout = _pinned_layout(model, fixed, stage_layers, stage_recompute_layers)
    if layout[0] is not None and framework is not None and not framework.uneven_pipeline and (
            len(set(layout[0])) > 1):
        raise SpecError(f"framework {framework.label} splits layers evenly only: it cannot run "
                        f"stage_layers {list(layout[0])}")
    nmb = fixed.pop("num_microbatches", None)
    _strict_flags(allow_idle_gpus=allow_idle_gpus, allow_tp_across_nodes=allow_tp_across_nodes,
                  uneven_layers=uneven_layers)
    unknown = sorted(set(fixed) - set(SEARCH_DIMS))
    if unknown:
        raise SpecError(
            f"unknown parallel dimension {unknown[0]!r}: expected one of "
            f"{', '.join(SEARCH_DIMS)}, num_microbatches"
        )
    n_gpus = cluster.total_gpus
    if framework is not None and not framework.uneven_pipeline:
        uneven_layers = False  # the stack splits layers evenly only
    values = {}
    for d in SEARCH_DIMS:
        if d in fixed:
            values[d] = _fixed_values(d, fixed[d])
        else:
            values[d] = _candidates(
                d, model, training, n_gpus, cluster.scale_up_size,
                allow_idle_gpus=allow_idle_gpus, allow_tp_across_nodes=allow_tp_across_nodes,
                uneven_layers=uneven_layers, max_micro_batch_size=max_micro_batch_size,
                max_vp=max_vp, max_cp=max_cp,
                explicit_layout=uneven_layers and explicit_layout_allowed(framework),
            )
        if framework is not None and d in (pins := framework_pins(framework)):
            allowed = _fixed_values(d, pins[d])
            narrowed = np.intersect1d(values[d], allowed)
            if narrowed.size == 0:
                shown = [_CATEGORICAL[d][i] if d in _CATEGORICAL else int(i) for i in values[d]]
                raise SpecError(
                    f"framework {framework.name} does not run {d} = "
                    f"{shown[0] if len(shown) == 1 else shown}: it runs "
                    f"{', '.join(str(x) for x in pins[d])}")
            values[d] = narrowed
        values[d].setflags(write=False)
    # the GPU and the stack's release run the training setup (precision recipe, dispatcher, ...)
    check_training_supported(framework, model, training, cluster.gpu,
                             selective=Recompute.SELECTIVE in values["recompute"])
    # A vp pinned above 1 implies the interleaved schedule, and sp is only meaningful with tp>1:
    # narrow the free dimensions rather than make the user say so.
    if "schedule" not in fixed and values["vp"].min() > 1:
        values["schedule"] = np.array([Schedule.INTERLEAVED])
    if "vp" not in fixed and "schedule" in fixed and Schedule.INTERLEAVED not in values["schedule"]:
        values["vp"] = np.array([1])
    if "cp_comm" not in fixed and values["cp"].max() == 1:  # no cp group: nothing to choose
        values["cp_comm"] = values["cp_comm"][:1]
    return SearchSpace(
        model=model,
        training=training,
        cluster=cluster,
        values=values,
        allow_idle_gpus=allow_idle_gpus,
        allow_tp_across_nodes=allow_tp_across_nodes,
        uneven_layers=uneven_layers,
        num_microbatches=None if nmb is None else _fixed_values("num_microbatches", nmb),
        framework=framework,
        stage_layers=layout[0],
        stage_recompute_layers=layout[1],
    )


def _pinned_layout(model: ModelSpec, fixed: dict[str, Any], stage_layers: Any,
                   stage_recompute_layers: Any) -> tuple[Any, Any]:
    """The per-stage layout as tuples; pins ``pp`` (and recompute full with recompute counts)
    in ``fixed``, or a one-line SpecError naming what disagrees."""
    if stage_layers is None:
        return None, None
    lay = tuple(int(x) for x in stage_layers)
    if sum(lay) != model.num_layers:
        raise SpecError(f"stage_layers {list(lay)} sum to {sum(lay)}, expected the "
                        f"{model.num_layers} layers of {model.name}")
    pp = fixed.setdefault("pp", len(lay))
    if list(np.atleast_1d(pp)) != [len(lay)]:
        raise SpecError(f"stage_layers {list(lay)} has {len(lay)} entries: pp = {pp} must be "
                        f"{len(lay)}")
    if stage_recompute_layers is None:
        return lay, None
    rec = tuple(int(x) for x in stage_recompute_layers)
    if any(r > n for r, n in zip(rec, lay, strict=True)):
        raise SpecError(f"stage_recompute_layers {list(rec)} exceeds stage_layers {list(lay)}")
    if fixed.setdefault("recompute", "full") not in ("full", ["full"], ("full",)):
        raise SpecError(f"stage_recompute_layers {list(rec)} needs recompute 'full' (got "
                        f"recompute {fixed['recompute']!r})")
    return lay, rec


# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scored:
    """What a strategy sees of a block of configurations (one entry per flat index).

    ``score`` is the single objective (inf where invalid or not fitting); ``F`` the Pareto
    objectives (``objectives``: the problem's :data:`PARETO_SETS` entry, one column each, inf
    where invalid; left out: :data:`PARETO_OBJECTIVES`). ``excess_bytes`` (peak over the usable
    HBM) and ``freeable_bytes`` (n x :data:`OFFLOAD_KINDS`: optimizer states + gradients,
    weights, activations, what each offload kind can free at most) say which configurations
    that do not fit an offload set could let in, and ``host_optimizer_s`` what optimizer offload
    adds to their step at least (None where the evaluator does not say).
    """

    flat: np.ndarray
    violations: np.ndarray
    fits: np.ndarray
    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    gpus: np.ndarray
    score: np.ndarray
    objectives: np.ndarray | None = None
    excess_bytes: np.ndarray | None = None
    freeable_bytes: np.ndarray | None = None
    host_optimizer_s: np.ndarray | None = None

    @property
    def valid(self) -> np.ndarray:
        return self.violations == 0

    @property
    def ok(self) -> np.ndarray:
        """Valid, fits in memory and meets the problem's limits (finite score)."""
        return self.valid & self.fits & np.isfinite(self.score)

    @property
    def F(self) -> np.ndarray:
        if self.objectives is not None:
            return self.objectives
        # the step's view (step time, peak memory, GPUs), built when asked for
        return np.stack([self.step_time_s, self.peak_memory_bytes, self.gpus.astype(float)], 1)

    def take(self, idx: np.ndarray) -> Scored:
        return Scored(**{k: None if getattr(self, k) is None else getattr(self, k)[idx]
                         for k in self.__dataclass_fields__})

    @staticmethod
    def concat(parts: list[Scored]) -> Scored:
        """One block of several, in order (``objectives`` kept where every part has them)."""
        def cat(k: str) -> np.ndarray | None:
            vals = [getattr(p, k) for p in parts]
            return None if any(v is None for v in vals) else np.concatenate(vals)
        return Scored(**{k: cat(k) for k in Scored.__dataclass_fields__})


def objective_score(objective: str, step_time_s, peak_memory_bytes, gpus) -> np.ndarray:
    """The single objective to minimise.

    ``time``: step time [s]; ``memory``: peak memory per GPU [bytes]; ``cost``: GPU-seconds per
    step (``step_time_s * gpus``), which ranks like cost per token since the tokens per step
    are fixed.
    """
    if objective == "time":
        return np.asarray(step_time_s, dtype=float)
    if objective == "memory":
        return np.asarray(peak_memory_bytes, dtype=float)
    if objective == "cost":
        return np.asarray(step_time_s, dtype=float) * gpus
    raise SpecError(f"objective = {objective!r}: expected one of {', '.join(OBJECTIVES)}")


@dataclass(frozen=True, eq=False)
class Problem:
    """A space, the evaluation function and the objective: what every strategy's ``run`` takes.

    ``evaluator(model, training, cluster, batch, *, kernels=..., calibration=...)`` returns an
    object with arrays ``step_time_s``, ``fits`` and a dict ``memory_bytes`` holding ``peak``
    (the contract of ``perfmodel.step.evaluate.evaluate``).
    """

    space: SearchSpace
    evaluator: Callable[..., Any]
    objective: str = "time"
    kernels: str = "fused"
    calibration: Any = None
    #: fraction of HBM kept free: a configuration fits when its peak is at most the usable HBM
    #: (HBM less the non-allocator reserve less this headroom, perfmodel.memory.breakdown.usable_hbm_bytes)
    memory_headroom: float = 0.0
    #: constraints on the objective: configurations slower / larger than these do not count
    max_step_time_s: float | None = None
    max_memory_bytes: float | None = None
    #: where each training value the caller left out came from (reported, not used)
    assumed: Mapping[str, str] = field(default_factory=dict)
    profile: str | None = None  # name of the efficiency profile bound into the evaluator
    #: that profile itself (perfmodel.hardware.profile.EfficiencyProfile): its runs'
    #: leave-one-out residuals give the intervals (search.intervals.interval_for)
    efficiency_profile: Any = None
    #: the whole run (perfmodel.run.RunSettings): steps, checkpoint, failures, power, price;
    #: needed by the objective ``time-to-train``, reported when given
    run: Any = None
    #: the Pareto view (a key of :data:`PARETO_SETS`)
    pareto: str = "step-memory-gpus"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SpecError(
                f"objective = {self.objective!r}: expected one of {', '.join(OBJECTIVES)}"
            )
        if self.objective == "time-to-train" and self.run is None:
            raise SpecError("objective = 'time-to-train' needs the run's length: give "
                            "train_tokens or train_steps")
        if self.pareto not in PARETO_SETS:
            raise SpecError(f"pareto_objectives = {self.pareto!r}: expected one of "
                            f"{', '.join(PARETO_SETS)}")
        if self.pareto == "time-to-train-cost" and self.run is None:
            raise SpecError("pareto_objectives = 'time-to-train-cost' needs the run's length: "
                            "give train_tokens or train_steps")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise SpecError(
                f"memory_headroom = {self.memory_headroom!r}: expected a fraction in [0, 1)"
            )
        for name in ("max_step_time_s", "max_memory_bytes"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise SpecError(f"{name} = {v!r}: expected a positive number")

    @property
    def usable_bytes(self) -> float:
        """HBM a configuration may fill: capacity less the reserve less the headroom."""

        return float(usable_hbm_bytes(self.space.cluster.gpu, self.memory_headroom))

    def evaluate_batch(self, batch: ConfigBatch) -> Any:
        """The evaluator's full result (a StepResult) for a batch."""
        kw: dict[str, Any] = {"kernels": self.kernels}
        if self.calibration is not None:
            kw["calibration"] = self.calibration
        s = self.space
        res = self.evaluator(s.model, s.training, s.cluster, batch, **kw)
        if self.memory_headroom > 0:  # the headroom only tightens the evaluator's fit check
            fits = np.asarray(res.fits, dtype=bool) & (
                np.asarray(res.memory_bytes["peak"]) <= self.usable_bytes)
            try:
                res = dataclasses.replace(res, fits=fits)
            except TypeError:
                res.fits = fits
        return res

    @property
    def n_objectives(self) -> int:
        """Columns of the Pareto view (``Scored.F``)."""
        return len(PARETO_SETS[self.pareto])

    def train_of(self, res: Any, step_time_s, gpus, step_bounds_s: Any = None) -> Any:
        """The whole run (:func:`perfmodel.run.train_run`) of evaluated configurations
        (``res``: their StepResult): step time, GPUs, staged weights + optimizer bytes and the
        compute share of the step; with ``step_bounds_s`` (the step time's low and high
        [s]), the run figures' bounds too (:func:`perfmodel.run.train_run_bounds`)."""
        step = np.asarray(step_time_s, dtype=float)
        mem = getattr(res, "memory_bytes", {})
        staged = np.asarray(mem.get("weights", 0.0)) + np.asarray(mem.get("optimizer", 0.0))
        compute = np.asarray(getattr(res, "time_s", {}).get("compute", step))
        if step_bounds_s is not None:
            return train_run_bounds(self.run, step, *step_bounds_s, gpus, staged, compute / step)
        return train_run(self.run, step, gpus, staged, compute / step)

    def objective_values(self, res: Any, step_time_s, peak_bytes, gpus) -> np.ndarray:
        """The single objective of evaluated configurations (``res``: their StepResult). The
        objective ``time-to-train`` is the expected wall time of the whole run, failures and
        checkpoints included (:func:`perfmodel.run.train_run`)."""
        return self.values(res, step_time_s, peak_bytes, gpus)[0]

    def values(self, res: Any, step_time_s, peak_bytes, gpus) -> tuple[np.ndarray, np.ndarray]:
        """(single objective, Pareto objectives: n x :attr:`n_objectives`) of evaluated
        configurations; the whole run is computed once, for both when both need it."""
        run = None
        if self.objective == "time-to-train" or self.pareto == "time-to-train-cost":
            run = self.train_of(res, step_time_s, gpus)
        score = (run.wall_s if self.objective == "time-to-train" else
                 objective_score(self.objective, step_time_s, peak_bytes, gpus))
        if self.pareto == "time-to-train-cost":
            cost = run.gpu_hours * (1.0 if self.run.gpu_hour_price is None
                                    else self.run.gpu_hour_price)
            return score, np.stack([run.wall_s, cost], 1)
        return score, np.stack([np.asarray(step_time_s, dtype=float),
                                np.asarray(peak_bytes, dtype=float),
                                np.asarray(gpus).astype(float)], 1)

    def within_limits(self, step_time_s: np.ndarray, peak_bytes: np.ndarray) -> np.ndarray:
        """Whether each configuration meets ``max_step_time_s`` and ``max_memory_bytes``."""
        ok = np.ones(np.shape(step_time_s), dtype=bool)
        if self.max_step_time_s is not None:
            ok &= np.asarray(step_time_s) <= self.max_step_time_s
        if self.max_memory_bytes is not None:
            ok &= np.asarray(peak_bytes) <= self.max_memory_bytes
        return ok

    def score_flat(self, flat: np.ndarray) -> Scored:
        """Decode flat indices, evaluate the structurally valid ones, score all of them."""
        flat = np.asarray(flat, dtype=np.int64)
        a, violations = self.space.decode_flat(flat)
        return self._score(flat, a, violations)

    def score_genes(self, genes: np.ndarray) -> Scored:
        genes = np.asarray(genes, dtype=np.int64)
        a, violations = self.space.decode(genes)
        flat = np.ravel_multi_index(tuple(genes.T), self.space.shape).astype(np.int64)
        return self._score(flat, a, violations)

    def _score(self, flat, a, violations, res: Any = None) -> Scored:
        """Score decoded configurations (``res``: their evaluation when already done, every
        one valid)."""
        n = flat.shape[0]
        valid = np.flatnonzero(violations == 0)
        step = np.full(n, np.inf)
        peak = np.full(n, np.inf)
        fits = np.zeros(n, dtype=bool)
        gpus = a["dp"] * a["tp"] * a["pp"] * a["cp"]
        score = np.full(n, np.inf)
        F = np.full((n, self.n_objectives), np.inf)  # the run's view; the step's: from Scored
        freeable = np.zeros((n, len(OFFLOAD_KINDS)))
        host = np.zeros(n)
        if valid.size:
            batch = self.space.batch(a, valid)
            if res is None:
                res = self.evaluate_batch(batch)
            step[valid] = res.step_time_s
            peak[valid] = res.memory_bytes["peak"]
            fits[valid] = res.fits
            score[valid], F[valid] = self.values(res, step[valid], peak[valid], gpus[valid])
            freeable[valid] = freeable_bytes(res.memory_bytes)
            host[valid] = self.host_optimizer_floor_s(batch, res)
        score = np.where((violations == 0) & fits & self.within_limits(step, peak), score, np.inf)
        return Scored(flat, violations, fits, step, peak, gpus, score,
                      F if self.pareto == "time-to-train-cost" else None,
                      peak - self.usable_bytes, freeable, host)

    def host_optimizer_floor_s(self, batch: ConfigBatch, res: Any) -> np.ndarray:
        """What optimizer offload adds to each configuration's step at least [s]: the CPU Adam
        step of the parameters this GPU updates
        (:func:`perfmodel.compute.layer.optimizer_params_per_gpu`,
        :func:`perfmodel.memory.optimizer_offload.cpu_adam_s`) less the GPU optimizer step it
        replaces; 0 where the training offloads only a share or the evaluator gives no
        optimizer term."""
        gpu_s = getattr(res, "time_s", {}).get("optimizer")
        if gpu_s is None or self.space.training.optimizer_offload_fraction != 1.0:
            return np.zeros(len(batch))
        host_s = cpu_adam_s(optimizer_params_per_gpu(self.space.model, batch),
                            cpu_adam_params_per_s(self.space.cluster))
        return np.maximum(host_s - np.asarray(gpu_s, dtype=float), 0.0)


def freeable_bytes(memory_bytes: Mapping[str, Any]) -> np.ndarray:
    """What each kind of :data:`OFFLOAD_KINDS` can free at most per GPU [bytes], n x 3: the
    optimizer states and the gradients (``optimizer``), the weights (``params``), the
    activations (``activations``); inf where the evaluator does not give the term (so that no
    offload is ruled out)."""
    peak = np.asarray(memory_bytes["peak"], dtype=float)

    def term(*keys: str) -> np.ndarray:
        if any(k not in memory_bytes for k in keys):
            return np.full(peak.shape, np.inf)
        return sum(np.asarray(memory_bytes[k], dtype=float) for k in keys)

    return np.stack([term("optimizer", "gradients"), term("weights"), term("activations")], 1)


def check_search_size(space: SearchSpace, limit: int | None = MAX_GRID_CONFIGURATIONS) -> int:
    """Configurations a full enumeration of ``space`` evaluates (after the prefix pruning);
    :class:`SpecError` (one line, with how to narrow the search) when over ``limit`` (None:
    no limit)."""
    n = space.pruned_size()
    if limit is not None and n > limit:
        pinned = [d for d in ("tp", "pp", "cp", "vp") if len(space.values[d]) == 1]
        free = [d for d in ("tp", "pp", "cp", "vp", "micro_batch_size") if d not in pinned]
        raise SpecError(
            f"the grid would evaluate {n:.3g} configurations (limit {limit:.3g}): narrow the "
            f"search: pin {', '.join('--' + d.replace('_size', '').replace('_', '-') for d in free)}"
            f", give fewer --gpus{' or drop --allow-idle-gpus' if space.allow_idle_gpus else ''}, "
            "use --strategy nsga2 or ga (they sample the space), or lift the limit with "
            "--max-configurations N (0: none)"
        )
    return n


def _strict_flags(**flags: Any) -> None:
    """:class:`SpecError` for a switch that is not True or False (``allow_idle_gpus='no'`` was
    taken as True)."""
    for name, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            raise SpecError(f"{name} = {v!r}: expected True or False")
