"""Real-time placement of inference models with deadlines on heterogeneous devices.

The seed's section 9.4.4 (autonomous driving) and exercise 9.6 (embodied robot): a few models
(perception, prediction, planning, control), each with a latency bound, a priority and a period,
are placed on a handful of devices (GPUs, edge accelerators) so that every bound holds in the
worst case. The plan is made once, offline ("compile time"), and exactly:

1. Per-model execution time on each device at batch 1: the roofline of
   :mod:`perfmodel.compute.inference`, or a latency the user measured (``latency_table_ms``).
2. Options per model: each device whose memory holds it and which meets the bound alone; only when
   no single device does (too slow or too small), a split by layers over two linked devices, at
   the cut that minimises the standalone latency (block + activation transfer + block).
3. Branch and bound over the options, highest priority first (see :class:`_BranchAndBound`),
   bounded by :data:`MAX_NODES`. Each placement is checked with
   fixed-priority response-time analysis per device (models sharing a device preempt each other
   at layer boundaries), the memory of each device (static pools), and, when given, the
   end-to-end deadline of the critical path (perception -> prediction -> planning -> control).
4. Among feasible placements: the highest-priority model on a device of its own first (the seed's
   "control owns GPU 0"), then fewest splits, then the largest smallest relative slack.

Scheduling model and its sources
--------------------------------
Worst-case response time of model (or block) ``i`` on a device, fixed priorities, preemption at
layer boundaries (a lower-priority model finishes its current layer first: blocking ``B_i``):

``R_i = C_i + B_i + sum_{j in hp(i)} ceil((R_i + J_j) / T_j) * C_j``, iterated to a fixed point.

Joseph & Pandya, "Finding response times in a real-time system", Computer J. 29(5), 1986;
Audsley, Burns, Richardson, Tindell, Wellings, "Applying new scheduling theory to static priority
pre-emptive scheduling", Software Eng. J. 8(5), 1993, eq. (5) with blocking; release jitter
``J_j`` (the second block of a split model is released when the first block's output arrives):
Tindell & Clark, "Holistic schedulability analysis for distributed hard real-time systems",
Microprocessing and Microprogramming 40, 1994. Limited preemption at fixed points (layers):
Buttazzo, Bertogna, Yao, "Limited preemptive scheduling for real-time systems. A survey",
IEEE Trans. Ind. Informatics 9(1), 2013; charging the whole block as preemptible plus one
lower-priority layer of blocking is a safe (slightly pessimistic) bound when deadlines <= periods.

End-to-end latency of the chain: ``event`` activation (each stage starts on its predecessor's
output) gives ``sum R_i + transfers``; ``periodic`` activation (each stage runs on its own timer
and reads the newest output of its predecessor) gives ``sum (T_i + R_i) + transfers``.
Davare et al., "Period optimization for hard real-time distributed automotive systems", DAC 2007,
sec. 3 (worst-case end-to-end latency of a chain of periodic tasks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, ValidationError, model_validator

from hardware_specs import find_preset, list_presets
from perfmodel.compute import inference
from perfmodel.core import units
from perfmodel.core.errors import SpecError
from perfmodel.core.files import parse_json, parse_toml, read_text_bounded
from perfmodel.spec.specs import MAX_LAYERS, Spec, format_validation_error, path_exists, spec_path

__all__ = [
    "MAX_COMBINATIONS",
    "MAX_NODES",
    "ModelPlacement",
    "RealtimeChain",
    "RealtimeDevice",
    "RealtimeLink",
    "RealtimeModel",
    "RealtimePlan",
    "RealtimeSpec",
    "latency_matrix_s",
    "load_realtime",
    "plan_realtime",
    "response_time_s",
]

PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]

MAX_COMBINATIONS = 200_000
"""Kept for compatibility: the search is no longer a plain enumeration (see MAX_NODES)."""

MAX_NODES = 10_000
"""Most partial placements one branch-and-bound search visits (bounded work on any spec: about
2 s on a loaded CPU core for 32 models; exercise 9.6 needs 14)."""

DEGRADE_MAX_NODES = 5_000
"""Most partial placements each feasibility search of the degraded mode visits."""

DEGRADE_TOTAL_NODES = 30_000
"""Most partial placements the degraded mode visits in all; restoring dropped models stops
there (the drops found so far stand: they are feasible, maybe not minimal)."""


# --------------------------------------------------------------------------------------------
# Spec
# --------------------------------------------------------------------------------------------
class RealtimeDevice(Spec):
    """One accelerator. ``peak_tflops`` is the dense peak at the dtype the models run in (fp16 on
    a GPU, int8 "TOPS" on an edge TPU). Give memory as ``memory_gib`` or ``memory_mib``.
    ``launch_overhead_us`` is the fixed cost per layer (kernel launches)."""

    name: str
    kind: Literal["gpu", "tpu", "npu", "dla", "cpu", "other"] = "gpu"
    peak_tflops: PosFloat
    mem_bw_gbyte_per_s: PosFloat
    memory_gib: PosFloat | None = None
    memory_mib: PosFloat | None = None
    compute_efficiency: Fraction = 0.5
    memory_efficiency: Fraction = 0.8
    launch_overhead_us: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _one_memory(self) -> RealtimeDevice:
        if (self.memory_gib is None) == (self.memory_mib is None):
            raise ValueError(
                f"device '{self.name}': give exactly one of memory_gib or memory_mib "
                f"(got memory_gib={self.memory_gib}, memory_mib={self.memory_mib})"
            )
        return self

    @property
    def memory_bytes(self) -> float:
        if self.memory_gib is not None:
            return self.memory_gib * units.GIB
        return self.memory_mib * units.MIB

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * units.TERA

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_gbyte_per_s * units.GIGA

    @property
    def launch_overhead_s(self) -> float:
        return self.launch_overhead_us * units.US


class RealtimeLink(Spec):
    """A bidirectional link between two devices (per direction bandwidth)."""

    a: str
    b: str
    bw_gbyte_per_s: PosFloat
    latency_us: NonNegFloat = 0.0

    @property
    def bw_bytes_per_s(self) -> float:
        return self.bw_gbyte_per_s * units.GIGA

    @property
    def latency_s(self) -> float:
        return self.latency_us * units.US


MAX_MODELS = 256
"""Most models of one placement problem: the branch and bound goes one level per model (a
thousand overflowed Python's stack), and its work grows with the models' options."""


class RealtimeModel(Spec):
    """One model: batch-1 cost, latency bound, priority (larger = more important), period.

    ``activation_mib`` is the total activation written by one inference (all layers);
    ``output_mib`` is what the model hands to the next model of the chain.
    ``latency_table_ms`` maps device name -> measured batch-1 latency, overriding the roofline.
    ``period_ms`` defaults to the bound (implicit deadline)."""

    name: str
    gflops: PosFloat
    weights_mib: PosFloat
    activation_mib: NonNegFloat = 0.0
    layers: Annotated[int, Field(gt=0, le=MAX_LAYERS)]
    latency_ms: PosFloat
    priority: int
    period_ms: PosFloat | None = None
    output_mib: NonNegFloat = 0.0
    splittable: bool = True
    latency_table_ms: dict[str, PosFloat] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _deadline_within_period(self) -> RealtimeModel:
        if self.period_ms is not None and self.latency_ms > self.period_ms:
            raise ValueError(
                f"model '{self.name}': latency_ms ({self.latency_ms}) must not exceed "
                f"period_ms ({self.period_ms}) (constrained deadlines)"
            )
        return self

    @property
    def bound_s(self) -> float:
        return self.latency_ms * units.MS

    @property
    def period_s(self) -> float:
        return (self.period_ms if self.period_ms is not None else self.latency_ms) * units.MS


class RealtimeChain(Spec):
    """The critical path, first stage first, with its end-to-end deadline."""

    models: Annotated[list[str], Field(min_length=2)]
    deadline_ms: PosFloat
    activation: Literal["event", "periodic"] = "periodic"


class RealtimeSpec(Spec):
    """A real-time placement problem: devices, links between them, models, optional chain."""

    name: str = "realtime"
    description: str = ""
    devices: Annotated[list[RealtimeDevice], Field(min_length=1)]
    links: list[RealtimeLink] = Field(default_factory=list)
    models: Annotated[list[RealtimeModel], Field(min_length=1, max_length=MAX_MODELS)]
    chain: RealtimeChain | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RealtimeSpec:
        dev = [d.name for d in self.devices]
        mod = [m.name for m in self.models]
        for what, names in (("device", dev), ("model", mod)):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"duplicate {what} name(s): {', '.join(dup)}")
        prios = [m.priority for m in self.models]
        if len(set(prios)) != len(prios):
            raise ValueError(f"model priorities must be distinct (got {prios})")
        pairs = set()
        for ln in self.links:
            for end in (ln.a, ln.b):
                if end not in dev:
                    raise ValueError(f"link {ln.a}-{ln.b}: unknown device '{end}' (known: {dev})")
            if ln.a == ln.b:
                raise ValueError(f"link {ln.a}-{ln.b} joins a device to itself")
            key = frozenset((ln.a, ln.b))
            if key in pairs:
                raise ValueError(f"link {ln.a}-{ln.b} given twice")
            pairs.add(key)
        for m in self.models:
            for d in m.latency_table_ms:
                if d not in dev:
                    raise ValueError(
                        f"model '{m.name}': latency_table_ms names unknown device '{d}' (known: {dev})"
                    )
        if self.chain is not None:
            for n in self.chain.models:
                if n not in mod:
                    raise ValueError(f"chain: unknown model '{n}' (known: {mod})")
            if len(set(self.chain.models)) != len(self.chain.models):
                raise ValueError(f"chain lists a model twice: {self.chain.models}")
        return self


def load_realtime(spec: str | Path | dict | RealtimeSpec) -> RealtimeSpec:
    """Load a real-time spec from a TOML/JSON path, a preset name, a dict, or pass one through.

    Raises
    ------
    SpecError : one line naming the file, the field, the value and what was expected.
    """
    if isinstance(spec, RealtimeSpec):
        return spec
    if isinstance(spec, dict):
        data, source = spec, "realtime spec"
    else:
        p = spec_path(spec, "realtime spec")
        if not path_exists(p):
            preset = find_preset("realtime", str(spec)) if p.suffix == "" else None
            if preset is None:
                known = ", ".join(list_presets("realtime"))
                raise SpecError(f"realtime spec '{spec}' does not exist (presets: {known})")
            p = preset
        data, source = _read(p), str(p)
    try:
        return RealtimeSpec.model_validate(data, strict=True)
    except ValidationError as err:
        raise SpecError(format_validation_error(err, source, data, RealtimeSpec)) from None


def _read(path: Path) -> dict[str, Any]:
    """A real-time spec file's data: bounded, UTF-8, a JSON object or a TOML table."""
    if path.suffix == ".json":
        return parse_json(read_text_bounded(path, "JSON"), str(path))
    return parse_toml(read_text_bounded(path, "TOML"), str(path))


# --------------------------------------------------------------------------------------------
# Cost arrays (models x devices)
# --------------------------------------------------------------------------------------------
def _device_arrays(spec: RealtimeSpec) -> dict[str, np.ndarray]:
    ds = spec.devices
    return {
        "peak_flops": np.array([d.peak_flops for d in ds]),
        "bw": np.array([d.mem_bw_bytes_per_s for d in ds]),
        "eff_c": np.array([d.compute_efficiency for d in ds]),
        "eff_m": np.array([d.memory_efficiency for d in ds]),
        "launch_s": np.array([d.launch_overhead_s for d in ds]),
        "mem_bytes": np.array([d.memory_bytes for d in ds]),
    }


def _model_arrays(spec: RealtimeSpec) -> dict[str, np.ndarray]:
    ms = spec.models
    return {
        "flops": np.array([m.gflops * units.GIGA for m in ms]),
        "w_bytes": np.array([m.weights_mib * units.MIB for m in ms]),
        "a_bytes": np.array([m.activation_mib * units.MIB for m in ms]),
        "layers": np.array([m.layers for m in ms], float),
    }


def latency_matrix_s(spec: RealtimeSpec, block_layers: np.ndarray | None = None) -> np.ndarray:
    """Batch-1 execution time [s] of each model (rows) on each device (columns).

    ``block_layers`` (shape ``(models, devices)`` or broadcastable) runs only that many layers;
    default all. A measured ``latency_table_ms`` entry replaces the roofline, scaled by the
    fraction of layers run.
    """
    m, d = _model_arrays(spec), _device_arrays(spec)
    L = m["layers"][:, None]
    k = (
        L
        if block_layers is None
        else np.broadcast_to(np.asarray(block_layers, float), (L.size, d["bw"].size))
    )
    t = inference.block_latency_s(
        m["flops"][:, None], m["w_bytes"][:, None], m["a_bytes"][:, None], L, k,
        d["peak_flops"][None, :], d["bw"][None, :],
        compute_efficiency=d["eff_c"][None, :], memory_efficiency=d["eff_m"][None, :],
        launch_overhead_s=d["launch_s"][None, :],
    )  # fmt: skip
    table = np.full_like(t, np.nan)
    names = [x.name for x in spec.devices]
    for i, mod in enumerate(spec.models):
        for dev, ms in mod.latency_table_ms.items():
            table[i, names.index(dev)] = ms * units.MS
    return np.where(np.isnan(table), t, table * k / L)


def response_time_s(
    exec_s: float,
    blocking_s: float,
    higher: Sequence[tuple[float, float, float]],
    limit_s: float,
) -> float:
    """Worst-case response time [s] under fixed-priority preemptive scheduling with blocking.

    ``R = C + B + sum_j ceil((R + J_j) / T_j) * C_j`` over higher-priority ``(C_j, T_j, J_j)``,
    iterated from ``R = C + B`` to the fixed point; returns ``inf`` once ``R`` exceeds ``limit_s``.

    References
    ----------
    Joseph & Pandya, Computer J. 29(5), 1986; Audsley et al., Software Eng. J. 8(5), 1993, eq. (5);
    jitter term: Tindell & Clark, Microprocessing and Microprogramming 40, 1994, eq. (3).
    """
    r = exec_s + blocking_s
    while True:
        nxt = exec_s + blocking_s + sum(math.ceil((r + j) / t - 1e-12) * c for c, t, j in higher)
        if nxt > limit_s:
            return math.inf
        if nxt <= r + 1e-15:
            return nxt
        r = nxt


# --------------------------------------------------------------------------------------------
# Options and their evaluation
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Option:
    """Where one model runs: one device, or two blocks of layers on two linked devices."""

    devices: tuple[int, ...]
    layers: tuple[int, ...]
    exec_s: tuple[float, ...]
    resident_bytes: tuple[float, ...]
    link_s: float


@dataclass(frozen=True)
class _Constraint:
    kind: str  # "deadline" | "chain" | "memory"
    subject: str
    value: float
    limit: float

    @property
    def ratio(self) -> float:
        return self.value / self.limit

    def describe(self) -> str:
        if self.kind == "memory":
            return (
                f"memory of {self.subject}: {units.fmt_bytes(self.value)} used of "
                f"{units.fmt_bytes(self.limit)}"
            )
        what = f"model '{self.subject}'" if self.kind == "deadline" else "chain " + self.subject
        if math.isinf(self.value):
            return f"{what}: response exceeds its bound {units.fmt_seconds(self.limit)}"
        return (
            f"{what}: response {units.fmt_seconds(self.value)} vs bound "
            f"{units.fmt_seconds(self.limit)} (slack {units.fmt_seconds(self.limit - self.value)})"
        )


def _links(spec: RealtimeSpec) -> dict[tuple[int, int], RealtimeLink]:
    idx = {d.name: i for i, d in enumerate(spec.devices)}
    out = {}
    for ln in spec.links:
        out[(idx[ln.a], idx[ln.b])] = ln
        out[(idx[ln.b], idx[ln.a])] = ln
    return out


def _options(spec: RealtimeSpec) -> tuple[list[list[_Option]], list[str]]:
    """Candidate options per model and, for models with none, the reason (else "")."""
    m, d = _model_arrays(spec), _device_arrays(spec)
    full_s = latency_matrix_s(spec)
    full_mem = inference.resident_bytes(
        m["w_bytes"][:, None], m["a_bytes"][:, None], m["layers"][:, None], m["layers"][:, None]
    ) * np.ones_like(full_s)
    links = _links(spec)
    n_dev = len(spec.devices)
    options: list[list[_Option]] = []
    reasons: list[str] = []
    for i, mod in enumerate(spec.models):
        L = mod.layers
        ok = (full_s[i] <= mod.bound_s) & (full_mem[i] <= d["mem_bytes"])
        opts = [
            _Option((j,), (L,), (float(full_s[i, j]),), (float(full_mem[i, j]),), 0.0)
            for j in range(n_dev)
            if ok[j]
        ]
        if not opts and mod.splittable and L > 1:
            opts = _split_options(spec, i, links)
        options.append(opts)
        reasons.append("" if opts else _no_option_reason(spec, i, full_s[i], full_mem[i], links))
    return options, reasons


def _split_options(spec: RealtimeSpec, i: int, links: dict) -> list[_Option]:
    """Best cut (min standalone latency) for every ordered pair of linked devices."""
    mod, m, d = spec.models[i], _model_arrays(spec), _device_arrays(spec)
    L = mod.layers
    k = np.arange(1, L)  # layers on the first device
    per_dev = np.stack(
        [latency_matrix_s(spec, np.full((len(spec.models), len(spec.devices)), kk))[i] for kk in k]
    )  # (cuts, devices): time of the first kk layers on each device
    tail = np.stack(
        [
            latency_matrix_s(spec, np.full((len(spec.models), len(spec.devices)), L - kk))[i]
            for kk in k
        ]
    )
    mem_head = inference.resident_bytes(m["w_bytes"][i], m["a_bytes"][i], L, k)
    mem_tail = inference.resident_bytes(m["w_bytes"][i], m["a_bytes"][i], L, L - k)
    boundary = inference.boundary_activation_bytes(m["a_bytes"][i], L)
    out = []
    for (a, b), ln in sorted(links.items()):
        link_s = float(inference.transfer_s(boundary, ln.bw_bytes_per_s, ln.latency_s))
        total = inference.split_latency_s(per_dev[:, a], tail[:, b], link_s)
        fits = (mem_head <= d["mem_bytes"][a]) & (mem_tail <= d["mem_bytes"][b])
        total = np.where(fits, total, np.inf)
        # least latency (to the ns), then the most even memory use of the two devices
        mem_frac = np.maximum(mem_head / d["mem_bytes"][a], mem_tail / d["mem_bytes"][b])
        c = int(np.lexsort((mem_frac, np.round(total, 9)))[0])
        if total[c] <= mod.bound_s:
            out.append(
                _Option(
                    (a, b), (int(k[c]), int(L - k[c])),
                    (float(per_dev[c, a]), float(tail[c, b])),
                    (float(mem_head[c]), float(mem_tail[c])), link_s,
                )
            )  # fmt: skip
    return out


def _no_option_reason(spec: RealtimeSpec, i: int, full_s, full_mem, links) -> str:
    mod = spec.models[i]
    d = _device_arrays(spec)
    fits = full_mem <= d["mem_bytes"]
    names = [x.name for x in spec.devices]
    split = " or split over two linked devices" if mod.splittable and mod.layers > 1 else ""
    if not fits.any() and not (mod.splittable and links):
        j = int(np.argmax(d["mem_bytes"]))
        return (
            f"model '{mod.name}' needs {units.fmt_bytes(full_mem.min())} and fits no device "
            f"(largest: {names[j]}, {units.fmt_bytes(d['mem_bytes'][j])})"
        )
    fast = np.where(fits, full_s, np.inf)
    j = int(np.argmin(fast)) if np.isfinite(fast).any() else int(np.argmin(full_s))
    return (
        f"model '{mod.name}' cannot meet its bound {units.fmt_seconds(mod.bound_s)} on any device"
        f"{split}: fastest alone is {units.fmt_seconds(full_s[j])} on {names[j]}"
        + ("" if fits[j] else " (and it does not fit there)")
    )


def _evaluate(
    spec: RealtimeSpec, combo: Sequence[_Option]
) -> tuple[list[float], list[_Constraint]]:
    """Response time [s] of each model and every constraint for one placement."""
    n_dev = len(spec.devices)
    mods = spec.models
    # (model, block index) chunks on each device
    on_dev: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]
    used = np.zeros(n_dev)
    for i, opt in enumerate(combo):
        for b, dev in enumerate(opt.devices):
            on_dev[dev].append((i, b))
            used[dev] += opt.resident_bytes[b]
    cons: list[_Constraint] = [
        _Constraint("memory", spec.devices[j].name, float(used[j]), spec.devices[j].memory_bytes)
        for j in range(n_dev)
        if on_dev[j]
    ]
    jitter = {}  # (model, block) -> release jitter [s]
    resp = [math.inf] * len(mods)
    for i in sorted(range(len(mods)), key=lambda x: -mods[x].priority):
        opt, mod = combo[i], mods[i]
        t = 0.0
        for b, dev in enumerate(opt.devices):
            jitter[(i, b)] = t
            higher = [
                (combo[h].exec_s[hb], mods[h].period_s, jitter[(h, hb)])
                for h, hb in on_dev[dev]
                if mods[h].priority > mod.priority
            ]
            lower_layer_s = [
                combo[l].exec_s[lb] / combo[l].layers[lb]
                for l, lb in on_dev[dev]
                if mods[l].priority < mod.priority
            ]
            r = response_time_s(
                opt.exec_s[b], max(lower_layer_s, default=0.0), higher, 4 * mod.period_s
            )
            t += r + (opt.link_s if b == 0 and len(opt.devices) > 1 else 0.0)
        resp[i] = t
        cons.append(_Constraint("deadline", mod.name, t, mod.bound_s))
    if spec.chain is not None:
        cons.append(_chain_constraint(spec, combo, resp))
    return resp, cons


def _chain_latency_s(spec: RealtimeSpec, combo: Sequence[_Option], resp: Sequence[float]) -> float:
    """Worst-case end-to-end latency [s] of the chain (Davare et al., DAC 2007, sec. 3)."""
    ch = spec.chain
    idx = {m.name: i for i, m in enumerate(spec.models)}
    links = _links(spec)
    total = 0.0
    for pos, name in enumerate(ch.models):
        i = idx[name]
        total += resp[i] + (spec.models[i].period_s if ch.activation == "periodic" else 0.0)
        if pos + 1 < len(ch.models):
            src, dst = combo[i].devices[-1], combo[idx[ch.models[pos + 1]]].devices[0]
            if src != dst:
                ln = links.get((src, dst))
                nbytes = spec.models[i].output_mib * units.MIB
                total += (
                    math.inf
                    if ln is None
                    else float(inference.transfer_s(nbytes, ln.bw_bytes_per_s, ln.latency_s))
                )
    return total


def _chain_constraint(spec, combo, resp) -> _Constraint:
    label = " -> ".join(spec.chain.models)
    return _Constraint(
        "chain", label, _chain_latency_s(spec, combo, resp), spec.chain.deadline_ms * units.MS
    )


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelPlacement:
    """Where one model runs and its worst-case timing [s]."""

    model: str
    priority: int
    devices: tuple[str, ...]
    layers: tuple[int, ...]
    exec_s: float  # execution time alone (sum of blocks), no interference
    link_s: float  # activation transfer between the two blocks of a split
    response_s: float  # worst-case response time with interference and blocking
    bound_s: float
    slack_s: float
    exclusive: bool  # no other model shares its device(s)


@dataclass(frozen=True)
class RealtimePlan:
    """The placement found (or, when infeasible, the closest one) and why."""

    name: str
    feasible: bool
    placements: tuple[ModelPlacement, ...]
    chain: tuple[str, ...]
    chain_latency_s: float | None
    chain_deadline_s: float | None
    memory_used_bytes: dict[str, float]
    memory_capacity_bytes: dict[str, float]
    binding: str  # the tightest constraint (least relative slack), or the violated one
    reason: str  # why infeasible ("" when feasible)
    checklist: tuple[str, ...]
    drop_order: tuple[str, ...]  # degraded mode: drop these first (lowest priority first)
    degraded_drops: tuple[str, ...] | None  # when infeasible: the fewest drops that make it fit
    n_evaluated: int
    search_complete: bool = True  # False: the node bound (MAX_NODES) stopped the search

    def to_frame(self) -> pd.DataFrame:
        """One row per model, unit-named columns."""
        return pd.DataFrame(
            [
                {
                    "model": p.model,
                    "priority": p.priority,
                    "devices": "+".join(p.devices),
                    "layers": "+".join(str(x) for x in p.layers),
                    "exec_s": p.exec_s,
                    "link_s": p.link_s,
                    "response_s": p.response_s,
                    "bound_s": p.bound_s,
                    "slack_s": p.slack_s,
                    "exclusive": p.exclusive,
                }
                for p in self.placements
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (infinite times become None)."""

        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [clean(v) for v in x]
            return x

        return clean(asdict(self))


def _drop_order(spec: RealtimeSpec) -> tuple[str, ...]:
    """Degraded mode: models to shed on overload, lowest priority first; the most important one
    (the safety path, e.g. control) is never dropped."""
    return tuple(m.name for m in sorted(spec.models, key=lambda m: m.priority))[:-1]


def _checklist(spec: RealtimeSpec, used: dict[str, float]) -> tuple[str, ...]:
    pools = ", ".join(f"{d} {units.fmt_bytes(b)}" for d, b in used.items() if b > 0)
    prio = " > ".join(m.name for m in sorted(spec.models, key=lambda m: -m.priority))
    return (
        "static shapes: compile every model for batch 1 and one fixed input shape; no dynamic shapes",
        f"fixed memory pools: allocate once at start-up ({pools}); no allocation in the loop",
        (
            "no runtime autotuning: fix kernel/algorithm choices offline "
            "(e.g. torch.backends.cudnn.benchmark=False, torch.use_deterministic_algorithms(True))"
        ),
        (
            "precompiled kernels: build every engine ahead of time for its device "
            "(TensorRT engine / CUDA Graph on GPUs, Edge TPU compiler on TPUs)"
        ),
        f"priorities: map {prio} to stream/queue priorities; preemption at layer boundaries",
        "degraded mode: on overload drop "
        + (" then ".join(_drop_order(spec)) or "nothing")
        + f" (lowest priority first); never {max(spec.models, key=lambda m: m.priority).name}",
    )


def _search(spec: RealtimeSpec, goal: str = "best", max_nodes: int | None = None,
            stats: dict | None = None):
    """Branch-and-bound search; returns (combo, responses, constraints, feasible, n, reason).

    ``goal``: ``best`` (the preferred feasible placement, else the closest infeasible one),
    ``any`` (stop at the first feasible placement; used by the degraded mode). ``stats``
    receives ``nodes`` (partial placements visited) and ``complete`` (the bound was not hit).
    """
    stats = {} if stats is None else stats
    stats.update(nodes=0, complete=True)
    options, reasons = _options(spec)
    missing = [r for r in reasons if r]
    if missing:
        return None, None, [], False, 0, missing[0]
    bb = _BranchAndBound(spec, options, MAX_NODES if max_nodes is None else max_nodes)
    found = bb.run("any" if goal == "any" else "best")
    stats.update(nodes=bb.nodes, complete=not bb.stopped)
    if found is not None:
        return (*found, True, bb.leaves, "")
    if goal == "any":
        return None, None, [], False, bb.leaves, "no feasible placement found"
    proven = not bb.stopped
    combo, resp, cons = bb.run("closest")
    stats.update(nodes=stats["nodes"] + bb.nodes, complete=proven and not bb.stopped)
    bad = max(cons, key=lambda c: c.ratio)
    note = "" if proven and not bb.stopped else (
        f" (search stopped at its limit of {bb.max_nodes} partial placements: the closest "
        "found, not proven closest)")
    return (
        combo,
        resp,
        cons,
        False,
        bb.leaves,
        "no placement meets every constraint; closest violates " + bad.describe() + note,
    )


class _BranchAndBound:
    """Depth-first branch-and-bound over the options of each model, highest priority first.

    A model's response time depends only on the higher-priority models on its devices, which
    are placed before it; the lower-priority ones add at most one layer of blocking. So after
    each placement ``response without blocking / bound`` is a lower bound on that model's final
    ratio, and memory used only grows: a partial placement whose worst ratio already exceeds 1
    cannot be completed feasibly (pruned), and one whose lower-bound preference key is no better
    than the best complete placement found cannot improve on it (pruned). Complete placements
    are evaluated exactly by :func:`_evaluate`. The work is bounded by ``max_nodes`` partial
    placements (``stopped`` tells whether the bound was hit).

    References
    ----------
    Land & Doig, "An automatic method of solving discrete programming problems", Econometrica
    28(3), 1960 (branch and bound); Audsley et al. 1993 (response time depends only on hp(i)).
    """

    def __init__(self, spec: RealtimeSpec, options: list[list[_Option]], max_nodes: int):
        self.spec, self.options, self.max_nodes = spec, options, max_nodes
        self.order = sorted(range(len(spec.models)), key=lambda i: -spec.models[i].priority)
        self.cap = [d.memory_bytes for d in spec.devices]
        # Symmetry: devices equal in every field but the name, with no link and no measured
        # latency, are interchangeable; of several such devices still empty only the first is
        # tried (swapping two of them changes no time, memory or preference).
        linked = {x for ln in spec.links for x in (ln.a, ln.b)}
        tabled = {d for m in spec.models for d in m.latency_table_ms}
        self.sig = [
            None if d.name in linked or d.name in tabled
            else json.dumps(d.model_dump(exclude={"name"}), sort_keys=True)
            for d in spec.devices
        ]
        # Static lower bound of the models not yet placed: each at least its fastest option alone.
        alone = [min((sum(o.exec_s) + o.link_s) / spec.models[i].bound_s for o in options[i])
                 for i in self.order]
        self.rest_lb = [max(alone[k:], default=0.0) for k in range(1, len(alone) + 1)]
        self.nodes = 0
        self.leaves = 0
        self.stopped = False

    def run(self, goal: str):
        self.goal = goal
        self.best_key, self.best = None, None
        n_dev = len(self.spec.devices)
        self.combo: list[_Option | None] = [None] * len(self.spec.models)
        self.chunks: list[list[tuple[float, float, float]]] = [[] for _ in range(n_dev)]
        self.used = [0.0] * n_dev
        self.nodes, self.stopped = 0, False
        self._visit(0, 0.0, False, 0)
        return self.best

    def _place(self, i: int, opt: _Option) -> tuple[float, float]:
        """Lower-bound deadline ratio (no blocking) and memory ratio of model ``i`` at ``opt``."""
        mod = self.spec.models[i]
        t, mem = 0.0, 0.0
        for b, dev in enumerate(opt.devices):
            r = response_time_s(opt.exec_s[b], 0.0, self.chunks[dev], 4 * mod.period_s)
            t += r + (opt.link_s if b == 0 and len(opt.devices) > 1 else 0.0)
            mem = max(mem, (self.used[dev] + opt.resident_bytes[b]) / self.cap[dev])
        return t / mod.bound_s, mem

    def _visit(self, depth: int, worst: float, shared: bool, n_split: int) -> None:
        if depth == len(self.order):
            self._leaf()
            return
        i = self.order[depth]
        mod = self.spec.models[i]
        cand = []
        empty_seen: set[str] = set()
        for opt in self.options[i]:
            if len(opt.devices) == 1:
                dev = opt.devices[0]
                if self.sig[dev] is not None and not self.chunks[dev]:
                    if self.sig[dev] in empty_seen:
                        continue
                    empty_seen.add(self.sig[dev])
            dl, mem = self._place(i, opt)
            w = max(worst, dl, mem)
            sh = shared or (depth > 0 and bool(set(opt.devices) & set(self.combo[self.order[0]]
                                                                       .devices)))
            ns = n_split + (len(opt.devices) > 1)
            cand.append((w, sh, ns, opt))
        # Most promising first (stable: device order among equals), so that the first
        # complete placement is the greedy one and the bound prunes early.
        if self.goal == "best":
            cand.sort(key=lambda c: (c[1], c[2], c[0]))
        else:
            cand.sort(key=lambda c: c[0])
        for w, sh, ns, opt in cand:
            if self.stopped or (self.goal == "any" and self.best is not None):
                return
            if self.goal == "closest":
                if self.best_key is not None and w >= self.best_key[0]:
                    continue
            else:
                w_all = max(w, self.rest_lb[depth])
                if w_all > 1.0:
                    continue
                if self.best_key is not None and (sh, ns, w_all) >= self.best_key[:3]:
                    continue
            self.nodes += 1
            if self.nodes > self.max_nodes:
                self.stopped = True
                return
            self.combo[i] = opt
            t = 0.0
            for b, dev in enumerate(opt.devices):
                r = response_time_s(opt.exec_s[b], 0.0, self.chunks[dev], 4 * mod.period_s)
                self.chunks[dev].append((opt.exec_s[b], mod.period_s, t))
                self.used[dev] += opt.resident_bytes[b]
                t += r + (opt.link_s if b == 0 and len(opt.devices) > 1 else 0.0)
            self._visit(depth + 1, w, sh, ns)
            for b, dev in enumerate(opt.devices):
                self.chunks[dev].pop()
                self.used[dev] -= opt.resident_bytes[b]
            self.combo[i] = None

    def _leaf(self) -> None:
        combo = tuple(self.combo)
        self.leaves += 1
        resp, cons = _evaluate(self.spec, combo)
        worst = max(c.ratio for c in cons)
        devices = tuple(o.devices for o in combo)
        if self.goal == "closest":
            key = (worst, devices)
        else:
            if worst > 1.0:
                return
            top = self.order[0]
            shared = any(dev in o.devices for j, o in enumerate(combo) if j != top
                         for dev in combo[top].devices)
            key = (shared, sum(len(o.devices) > 1 for o in combo), worst, devices)
        if self.best_key is None or key < self.best_key:
            self.best_key, self.best = key, (combo, resp, cons)


def plan_realtime(spec: str | Path | dict | RealtimeSpec) -> RealtimePlan:
    """Place every model of ``spec`` so that all deadlines, memory and the chain hold.

    Returns the best feasible placement (see module docstring for the order of preference) or,
    when none exists, ``feasible=False`` with the reason and the closest placement found.
    """
    spec = load_realtime(spec)
    stats: dict = {}
    combo, resp, cons, feasible, n, reason = _search(spec, "best", None, stats)
    names = [d.name for d in spec.devices]
    cap = {d.name: d.memory_bytes for d in spec.devices}
    placements: list[ModelPlacement] = []
    used = {d: 0.0 for d in names}
    chain_s = None
    binding = reason
    if combo is not None:
        for i, (mod, opt) in enumerate(zip(spec.models, combo, strict=True)):
            others = {dev for j, o in enumerate(combo) if j != i for dev in o.devices}
            for b, dev in enumerate(opt.devices):
                used[names[dev]] += opt.resident_bytes[b]
            placements.append(
                ModelPlacement(
                    model=mod.name, priority=mod.priority,
                    devices=tuple(names[x] for x in opt.devices), layers=opt.layers,
                    exec_s=float(sum(opt.exec_s)), link_s=opt.link_s, response_s=resp[i],
                    bound_s=mod.bound_s, slack_s=mod.bound_s - resp[i],
                    exclusive=not (set(opt.devices) & others),
                )
            )  # fmt: skip
        if spec.chain is not None:
            chain_s = _chain_latency_s(spec, combo, resp)
        binding = max(cons, key=lambda c: c.ratio).describe()
    drops = None if feasible else _degrade(spec)
    return RealtimePlan(
        name=spec.name,
        feasible=feasible,
        placements=tuple(placements),
        chain=tuple(spec.chain.models) if spec.chain else (),
        chain_latency_s=chain_s,
        chain_deadline_s=spec.chain.deadline_ms * units.MS if spec.chain else None,
        memory_used_bytes=used,
        memory_capacity_bytes=cap,
        binding=binding,
        reason=reason,
        checklist=_checklist(spec, used),
        drop_order=_drop_order(spec),
        degraded_drops=drops,
        n_evaluated=n,
        search_complete=stats["complete"],
    )


def _degrade(spec: RealtimeSpec) -> tuple[str, ...] | None:
    """Models to drop (never the most important one) for a feasible placement; None when even
    the most important model alone cannot be placed.

    Degraded mode sheds models in the drop order (lowest priority first), so the search is over
    priorities, not over subsets: dropping more models never makes a feasible placement
    infeasible (less interference, blocking and memory; a chain missing a stage is no longer
    checked), so the shortest prefix of the drop order that suffices is found by bisection.
    Then each dropped model, most important first, is restored if the rest stays feasible.
    ``O(n)`` searches of at most ``DEGRADE_MAX_NODES`` partial placements each (exponential
    over subsets before: 16 models took over 120 s).
    """
    order = _drop_order(spec)
    spent = [0]

    def feasible(drop: Sequence[str]) -> bool:
        keep = [m for m in spec.models if m.name not in drop]
        names = {m.name for m in keep}
        chain = spec.chain if spec.chain and set(spec.chain.models) <= names else None
        sub = spec.model_copy(update={"models": keep, "chain": chain})
        stats: dict = {}
        ok = bool(_search(sub, "any", DEGRADE_MAX_NODES, stats)[3])
        spent[0] += stats["nodes"]
        return ok

    if not order or not feasible(order):
        return None
    lo, hi = 0, len(order)  # dropping order[:hi] is feasible; order[:lo] is not (lo = 0: given)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if feasible(order[:mid]):
            hi = mid
        else:
            lo = mid
    drop = list(order[:hi])
    for name in reversed(order[:hi]):
        if spent[0] > DEGRADE_TOTAL_NODES:
            break
        trial = [d for d in drop if d != name]
        if feasible(trial):
            drop = trial
    return tuple(drop)
