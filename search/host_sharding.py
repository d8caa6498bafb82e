"""The plan options of hybrid sharding, offload and MoE routing imbalance, and their search.

``moe_imbalance``, ``hsdp_shard``, ``offload`` and ``optimizer_offload_fraction`` go into the
training setup (:func:`training_with_options`). Left out, two of them are searched where the
framework preset says its stack runs them (``[capabilities]`` ``hsdp`` and ``offload``,
:mod:`perfmodel.spec.frameworks`): the plan is run again with each HSDP shard group of
:func:`hsdp_candidates` and the best is kept (:func:`search_hsdp`), and with each offload set
the stack runs unless offload cannot win (:func:`search_offload`). What was tried is listed in
``result.setup["searched"]``: HSDP's always, offload's when it wins or nothing fits without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmodel.core import units
from perfmodel.moe.imbalance import TYPICAL_IMBALANCE
from perfmodel.spec.specs import ModelSpec, TrainingSpec, load_training
from search.space import OFFLOAD_SETS

__all__ = [
    "OFFLOAD_SETS",
    "hsdp_candidates",
    "imbalance_defaulted",
    "offload_cannot_win",
    "offload_sets",
    "search_hsdp",
    "search_offload",
    "training_with_options",
]

#: HSDP shard groups tried, in data-parallel ranks: one node of 8 GPUs and four nodes (with
#: tp = 1), the shard sizes torchtitan's and FSDP2's HSDP examples use (one node, or a few).
HSDP_SHARDS = (8, 32)


def _names(v: Any) -> tuple[str, ...]:
    """Offload names as plain strings (the command line gives str Enums; one name alone is
    taken as a list of one; ``none`` names nothing: no offload, and none searched)."""
    if isinstance(v, str):
        v = [v]
    return tuple(n for n in (str(getattr(x, "value", x)) for x in v) if n != "none")


def imbalance_defaulted(t: TrainingSpec, model: ModelSpec, requested: float | None) -> bool:
    """Whether the plan takes the published routing imbalance
    (:data:`perfmodel.moe.imbalance.TYPICAL_IMBALANCE`): a dropless MoE model (no capacity
    factor) that states no imbalance of its own, and neither the request nor the training
    setup sets one. Benchmarks that force balanced routing are planned with
    ``--moe-imbalance 1`` (``requested``: the request's value)."""
    return (model.is_moe and model.moe_load_imbalance is None
            and model.moe_capacity_factor is None and t.moe_imbalance is None
            and requested is None)


def training_with_options(t: TrainingSpec, model: ModelSpec, request: Any) -> TrainingSpec:
    """``t`` with the request's ``moe_imbalance``, ``hsdp_shard``, ``offload`` and
    ``optimizer_offload_fraction`` (``activations`` offload: ``L - 1`` layers, Megatron's
    largest ``--cpu-offloading-num-layers``, each stage keeping at least its last, unless
    ``cpu_offload_layers`` is set); the published routing imbalance where
    :func:`imbalance_defaulted`; ``t`` itself when none of these applies."""
    over: dict[str, Any] = {}
    for k in ("moe_imbalance", "hsdp_shard", "optimizer_offload_fraction"):
        if getattr(request, k) is not None:
            over[k] = getattr(request, k)
    if imbalance_defaulted(t, model, request.moe_imbalance):
        over["moe_imbalance"] = TYPICAL_IMBALANCE
    if request.offload is not None:
        over["offload"] = _names(request.offload)
        if "activations" in over["offload"] and not t.cpu_offload_layers:
            over["cpu_offload_layers"] = max(model.num_layers - 1, 0)  # Megatron: N < L
    return load_training(t, **over) if over else t


def hsdp_candidates(gpus: int) -> list[int]:
    """Shard groups (data-parallel ranks) the search tries: :data:`HSDP_SHARDS` below the
    GPU count."""
    return [s for s in HSDP_SHARDS if s < gpus]


def _score(result: Any) -> float:
    """The objective value of a result's best row (inf when nothing fits)."""
    if not result.rows:
        return float("inf")
    r = result.rows[0]
    key = {"memory": ("memory_bytes", "peak")}.get(result.objective)
    if key is not None:
        return float(r[key[0]][key[1]])
    if result.objective == "gpu_seconds":
        return float(r["step_time_s"]) * float(r["gpus"])
    return float(r["step_time_s"])


def _line(label: str, result: Any) -> str:
    if not result.rows:
        return f"{label}: nothing fits"
    r = result.rows[0]
    return (f"{label}: {units.fmt_seconds(r['step_time_s'])} per step, peak "
            f"{units.fmt_bytes(r['memory_bytes']['peak'])}")


def _step(result: Any) -> str:
    """The best row's step time, or that nothing fits."""
    if not result.rows:
        return "nothing fits"
    return f"{units.fmt_seconds(result.rows[0]['step_time_s'])} per step"


def search_hsdp(request: Any, result: Any, gpus: int, run: Callable[[Any], Any]) -> Any:
    """The better of ``result`` (full sharding) and the plan with each HSDP shard group of
    :func:`hsdp_candidates` on ``gpus`` GPUs, by the request's objective, with what was tried
    in ``setup["searched"]``: when a shard group wins, a line per plan and the last says which
    won and the two step times; otherwise one line with the two step times (``result`` as it
    was otherwise)."""
    lines = [_line("HSDP off (ZeRO-3 shards over all of dp)", result)]
    best, best_score, won = result, _score(result), None
    tried, best_alt = [], None
    for s in hsdp_candidates(gpus):
        alt = run(request.model_copy(update={"hsdp_shard": s}))
        lines.append(_line(f"HSDP shard {s} (replicated across dp / {s})", alt))
        tried.append(s)
        if best_alt is None or _score(alt) < _score(best_alt[1]):
            best_alt = (s, alt)
        if _score(alt) < best_score:
            best, best_score, won = alt, _score(alt), s
    if best_alt is None:  # no shard group below the GPU count: nothing was searched
        return result
    if won is not None:
        lines.append(f"HSDP wins: shard {won}, {_step(best)} against {_step(result)} with "
                     "ZeRO-3 shards over all of dp")
        best.setup["searched"] = [*result.setup.get("searched", []), *lines]
        return best
    result.setup["searched"] = [*result.setup.get("searched", []),
                                _hsdp_lost(tried, result, *best_alt)]
    return result


def _hsdp_lost(tried: list[int], result: Any, shard: int, alt: Any) -> str:
    """The one line of an HSDP search that did not win: the two step times (and, where they
    are equal, that the best plan does not use ZeRO-3, which HSDP changes)."""
    head = f"HSDP shard {', '.join(map(str, tried))} searched, not picked: "
    if _step(result) != _step(alt):
        return (f"{head}{_step(result)} without it against {_step(alt)} at best with it "
                f"(shard {shard})")
    zero = result.rows[0]["config"]["zero_stage"] if result.rows else 3
    why = "" if zero == 3 else f" (the best plan is ZeRO-{zero}, which HSDP does not change)"
    return f"{head}no gain, {_step(result)} with or without it{why}"


#: Offload kinds searched whenever the stack runs them; the others only while nothing fits.
#: Activation offload is left out: its overlap with compute has no measured run in the
#: validation data, and searched everywhere it made the picks 5-20 % faster than the vendors'
#: tuned MoE recipes on H100 and GB200 / GB300 (recipes that do not offload), the sign of an
#: optimistic term rather than a better layout.
GENERAL_OFFLOAD = frozenset({"optimizer", "params"})


def offload_sets(kinds: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The sets of :data:`OFFLOAD_SETS` whose every kind is in ``kinds`` (the stack's
    capability)."""
    return [s for s in OFFLOAD_SETS if set(s) <= set(kinds)]


def offload_cannot_win(result: Any, kinds: tuple[str, ...] | None = None,
                       to_beat: Any = None) -> bool:
    """Whether offload (the set ``kinds``; None: any) cannot beat ``result`` by its objective:
    something fits and no configuration that memory alone kept out, and that this offload
    could let in (``result.unfit_floor``, :meth:`search.pareto.Tally.unfit_floor`), was
    better: its best step time for ``time`` and ``time-to-train``, GPU-seconds per step for
    ``cost``. Offload only frees memory and adds host copies and the host optimizer step to a
    configuration, so it wins only by letting in one that did not fit. ``to_beat``: a better
    plan found since (with another offload set) whose best row is the one to beat. The
    ``memory`` objective, which offload lowers directly, and a strategy that does not report
    the floor are always searched."""
    floor = getattr(result, "unfit_floor", None) or {}
    key = {"time": "time", "time-to-train": "time", "cost": "cost"}.get(result.objective)
    if not result.rows or key not in floor:
        return False
    if kinds is not None and "sets" in floor:
        floor = floor["sets"].get("+".join(kinds), floor)
    r = (to_beat if to_beat is not None and to_beat.rows else result).rows[0]
    best = float(r["step_time_s"]) * (float(r["gpus"]) if key == "cost" else 1.0)
    return floor[key] >= best


def _offload_flags(kinds: tuple[str, ...]) -> str:
    return "--offload " + " --offload ".join(kinds)


def search_offload(request: Any, result: Any, kinds: tuple[str, ...],
                   run: Callable[[Any], Any]) -> Any:
    """The better of ``result`` (no offload) and the plan with each offload set the stack runs
    (:func:`offload_sets` of ``kinds``), by the request's objective. A set is skipped where it
    cannot win (:func:`offload_cannot_win`: no faster configuration that memory kept out could
    fit with it); a set of two kinds is tried only while nothing
    fits or its first kind alone won (more offload frees more memory); activation offload only
    while nothing fits (:data:`GENERAL_OFFLOAD`). When offload wins,
    or nothing fits without it, every plan tried is a line of ``setup["searched"]``; otherwise
    ``result`` comes back as it was."""
    sets = [k for k in offload_sets(kinds) if not offload_cannot_win(result, k)
            and (not result.rows or set(k) <= GENERAL_OFFLOAD)]
    if not sets:
        return result
    lines = [_line("offload off", result)]
    best, best_score, won = result, _score(result), None
    for kinds_i in sets:
        if len(kinds_i) > 1 and best.rows and won != kinds_i[:1]:
            continue  # more offload on top: only while nothing fits or its first kind won
        if won is not None and offload_cannot_win(result, kinds_i, best):
            continue
        alt = run(request.model_copy(update={"offload": list(kinds_i)}))
        lines.append(_line(_offload_flags(kinds_i), alt))
        if _score(alt) < best_score:
            best, best_score, won = alt, _score(alt), kinds_i
    if won is None and result.rows:  # a plan that offload does not improve: as it was
        return result
    head = [] if result.rows else ["nothing fits without offload"]
    tail = [f"offload wins: {_offload_flags(won)}"] if won is not None else []
    best.setup["searched"] = [*result.setup.get("searched", []), *head, *lines, *tail]
    return best
