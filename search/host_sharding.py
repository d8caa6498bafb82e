"""The plan options of hybrid sharding, offload and MoE routing imbalance, and their search.

``moe_imbalance``, ``hsdp_shard``, ``offload`` and ``optimizer_offload_fraction`` go into the
training setup (:func:`training_with_options`). Left out, two of them are searched where the
framework preset says its stack runs them (``[capabilities]`` ``hsdp`` and ``offload``,
:mod:`perfmodel.spec.frameworks`): the plan is run again with each HSDP shard group of
:func:`hsdp_candidates` and the best is kept (:func:`search_hsdp`); when nothing fits, it is run
again with the stack's optimizer / parameter offload (:func:`search_offload`). When an
alternative wins, what was tried is listed in ``result.setup["searched"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmodel.core import units
from perfmodel.spec.specs import ModelSpec, TrainingSpec, load_training

__all__ = ["hsdp_candidates", "search_hsdp", "search_offload", "training_with_options"]

#: HSDP shard groups tried, in data-parallel ranks: one node of 8 GPUs and four nodes (with
#: tp = 1), the shard sizes torchtitan's and FSDP2's HSDP examples use (one node, or a few).
HSDP_SHARDS = (8, 32)


def _names(v: Any) -> tuple[str, ...]:
    """Offload names as plain strings (the command line gives str Enums; one name alone is
    taken as a list of one; ``none`` names nothing: no offload, and none searched)."""
    if isinstance(v, str):
        v = [v]
    return tuple(n for n in (str(getattr(x, "value", x)) for x in v) if n != "none")


def training_with_options(t: TrainingSpec, model: ModelSpec, request: Any) -> TrainingSpec:
    """``t`` with the request's ``moe_imbalance``, ``hsdp_shard``, ``offload`` and
    ``optimizer_offload_fraction`` (``activations`` offload: ``L - 1`` layers, Megatron's
    largest ``--cpu-offloading-num-layers``, each stage keeping at least its last, unless
    ``cpu_offload_layers`` is set); ``t`` itself when none is given."""
    over: dict[str, Any] = {}
    for k in ("moe_imbalance", "hsdp_shard", "optimizer_offload_fraction"):
        if getattr(request, k) is not None:
            over[k] = getattr(request, k)
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


def search_hsdp(request: Any, result: Any, gpus: int, run: Callable[[Any], Any]) -> Any:
    """The better of ``result`` (full sharding) and the plan with each HSDP shard group of
    :func:`hsdp_candidates` on ``gpus`` GPUs, by the request's objective. When a shard group
    wins, every plan tried is a line of ``setup["searched"]`` and the last says which won;
    otherwise ``result`` comes back as it was."""
    lines = [_line("HSDP off (ZeRO-3 shards over all of dp)", result)]
    best, best_score, won = result, _score(result), None
    for s in hsdp_candidates(gpus):
        alt = run(request.model_copy(update={"hsdp_shard": s}))
        lines.append(_line(f"HSDP shard {s} (replicated across dp / {s})", alt))
        if _score(alt) < best_score:
            best, best_score, won = alt, _score(alt), s
    if won is not None:  # a plan that HSDP does not improve reports what it always did
        lines.append(f"HSDP wins: shard {won}")
        best.setup["searched"] = [*result.setup.get("searched", []), *lines]
    return best


def search_offload(request: Any, result: Any, kinds: tuple[str, ...],
                   run: Callable[[Any], Any]) -> Any:
    """When nothing fits, the plan with the stack's optimizer and parameter offload
    (``kinds``, its capability); ``result`` itself when something fits or offload does not
    help."""
    use = [k for k in ("optimizer", "params") if k in kinds]
    if result.rows or not use:
        return result
    alt = run(request.model_copy(update={"offload": use}))
    if not alt.rows:
        return result
    alt.setup["searched"] = [f"nothing fits without offload; with --offload "
                             f"{' --offload '.join(use)}: " + _line("", alt)[2:]]
    return alt
