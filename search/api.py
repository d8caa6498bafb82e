"""Python API: ``plan(...)`` searches parallel configurations, ``evaluate_config(...)`` predicts one.

>>> from search import plan
>>> r = plan("gpt3-175b", "dgx-a100-80g", global_batch_size=1536, tp=8)   # doctest: +SKIP
>>> r.best[["dp", "tp", "pp", "step_time_s", "mfu", "peak_memory_bytes"]]  # doctest: +SKIP

Model and cluster are preset names, spec file paths or spec objects. Every parallel dimension
left out is searched; one given as a value is pinned, one given as a list (or range) is searched
over those values. All user errors raise :class:`perfmodel.specs.SpecError` with a one-line
message.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from perfmodel.config import ParallelConfig, resolve_config
from perfmodel.frameworks import FrameworkSpec, apply_framework, load_framework
from perfmodel.specs import (
    ClusterSpec,
    ModelSpec,
    SpecError,
    TrainingSpec,
    format_validation_error,
    load_cluster,
    load_model,
    load_training,
)
from search.grid import GridSearch, Progress
from search.result import SearchResult
from search.space import SEARCH_DIMS, Problem, SearchSpace, make_space

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_MODEL",
    "MAX_TOP",
    "STRATEGIES",
    "evaluate_config",
    "make_problem",
    "plan",
]

#: The embedded default (``plan`` with no arguments): GPT-3 175B on 1024 A100-80GB, global
#: batch 1536, sequence 2048, bf16 (the setting of Narayanan et al. 2021, Table 1).
DEFAULT_MODEL = "gpt3-175b"
DEFAULT_CLUSTER = "dgx-a100-80g"
DEFAULT_GPUS = 1024
DEFAULT_GLOBAL_BATCH = 1536
DEFAULT_SEQ_LEN = 2048

#: Strategy names accepted by :func:`plan`.
STRATEGIES = ("grid", "nsga2", "ga")

#: Most rows ``plan(top=...)`` returns: a billion-row request took 51 s and printed 15.5 MB.
MAX_TOP = 10_000

#: Largest count (GPUs, batch, sequence, a pinned parallel degree) taken at the API edge: any
#: count is held in int64 arrays, and products of a few of them must not overflow.
MAX_COUNT = 2**31 - 1

#: Seeds are 32-bit (numpy's and pymoo's generators take any non-negative int below 2**32).
MAX_SEED = 2**32 - 1


def _int_arg(name: str, v: Any, lo: int, hi: int) -> int:
    """``v`` as an int in ``[lo, hi]`` or a one-line SpecError naming the argument."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise SpecError(f"{name} = {v!r}: expected an integer in [{lo}, {hi}]")
    if not lo <= int(v) <= hi:
        raise SpecError(f"{name} = {int(v)}: expected an integer in [{lo}, {hi}]")
    return int(v)


def _check_arguments(*, gpus=None, global_batch_size=None, seq_len=None, precision=None,
                     optimizer=None, objective="time", kernels="fused", strategy="grid", top=10,
                     seed=0, **fixed: Any) -> None:
    """Refuse bad API arguments with one line (``SpecError``), before any work: wrong types
    (``gpus='64'``, ``top=2.5``, ``strategy=123``), out-of-range values (``seed=-1``) and counts
    beyond int64-safe arithmetic (``tp=10**19``)."""
    for name, v in (("gpus", gpus), ("global_batch_size", global_batch_size),
                    ("seq_len", seq_len)):
        if v is not None:
            _int_arg(name, v, 1, MAX_COUNT)
    for name, v in (("precision", precision), ("optimizer", optimizer),
                    ("objective", objective), ("kernels", kernels)):
        if (v is not None or name in ("objective", "kernels")) and not isinstance(
                getattr(v, "value", v), str):
            raise SpecError(f"{name} = {v!r}: expected a string")
    _int_arg("top", top, 1, MAX_TOP)
    _int_arg("seed", seed, 0, MAX_SEED)
    if not isinstance(getattr(strategy, "value", strategy), str) and (
        not callable(getattr(strategy, "run", None))
    ):
        raise SpecError(
            f"strategy = {strategy!r}: expected one of {', '.join(STRATEGIES)} or an object "
            "with run(problem, seed, progress)"
        )
    for name, value in fixed.items():
        if value is None or name in ("sequence_parallel", "sp", "recompute", "schedule"):
            continue  # names and flags: checked against their tables by the space
        items = (list(value) if isinstance(value, (list, tuple, range, set, np.ndarray))
                 else [value])
        for v in items:
            lo = 0 if name in ("zero_stage", "zero") else 1
            _int_arg(name, v, lo, MAX_COUNT)


def _default_evaluator() -> Callable[..., Any]:
    from perfmodel.step import evaluate

    return evaluate


def _strategy(strategy: Any, top: int) -> Any:
    if not isinstance(strategy, str):
        return strategy  # any object with run(problem, seed, progress)
    name = getattr(strategy, "value", strategy)
    if name == "grid":
        return GridSearch(top=top)
    if name == "ga":
        from search.evolutionary import GeneticSearch

        return GeneticSearch(top=top)
    if name == "nsga2":
        from search.nsga2 import NSGA2Search

        return NSGA2Search(top=top)
    raise SpecError(f"strategy = {strategy!r}: expected one of {', '.join(STRATEGIES)}")


def _specs(model, cluster, training, gpus, overrides, framework=None) -> tuple[
        ModelSpec, TrainingSpec, ClusterSpec]:
    try:
        m = load_model(model)
        c = load_cluster(cluster, gpus)
        # the stack's switches first, then the caller's single overrides win
        t = apply_framework(load_training(training), framework)
        t = load_training(t, **overrides)
    except ValidationError as err:  # pydantic errors raised outside the loaders
        raise SpecError(format_validation_error(err)) from None
    return m, t, c


def make_problem(
    model: str | Path | ModelSpec,
    cluster: str | Path | ClusterSpec,
    training: str | Path | TrainingSpec | dict | None = None,
    *,
    gpus: int | None = None,
    global_batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    objective: str = "time",
    kernels: str = "fused",
    allow_idle_gpus: bool = False,
    allow_tp_across_nodes: bool = False,
    uneven_layers: bool = True,
    calibration: Any = None,
    evaluator: Callable[..., Any] | None = None,
    memory_headroom: float | None = None,
    max_step_time_s: float | None = None,
    max_memory_bytes: float | None = None,
    framework: str | Path | FrameworkSpec | None = None,
    **fixed: Any,
) -> Problem:
    """Load the specs, build the space and bind the evaluation path (see :func:`plan`)."""
    _check_arguments(gpus=gpus, global_batch_size=global_batch_size, seq_len=seq_len,
                     precision=precision, optimizer=optimizer, objective=objective,
                     kernels=kernels, **fixed)
    fw = None if framework is None else load_framework(framework)
    m, t, c = _specs(model, cluster, training, gpus, {
        "global_batch_size": global_batch_size, "seq_len": seq_len, "precision": precision,
        "optimizer": optimizer}, fw)
    space = make_space(m, t, c, allow_idle_gpus=allow_idle_gpus,
                       allow_tp_across_nodes=allow_tp_across_nodes,
                       uneven_layers=uneven_layers, framework=fw, **fixed)
    kernels = getattr(kernels, "value", kernels)
    if kernels not in ("fused", "eager"):
        raise SpecError(f"kernels = {kernels!r}: expected fused or eager")
    from perfmodel.memory import SEARCH_MEMORY_HEADROOM

    headroom = SEARCH_MEMORY_HEADROOM if memory_headroom is None else float(memory_headroom)
    return Problem(space, evaluator or _default_evaluator(), getattr(objective, "value", objective),
                   kernels, calibration, memory_headroom=headroom,
                   max_step_time_s=max_step_time_s, max_memory_bytes=max_memory_bytes)


def _check_single(space: SearchSpace) -> None:
    """Raise the exact one-line SpecError for a fully pinned configuration that is invalid."""
    v = {d: space.values[d][0].item() for d in SEARCH_DIMS}
    n = space.gpus
    if not space.allow_idle_gpus and len(space.values["dp"]) != 1:
        model_par = v["tp"] * v["pp"] * v["cp"]
        if n % model_par:
            raise SpecError(
                f"tp*pp*cp ({v['tp']}*{v['pp']}*{v['cp']}={model_par}) must divide the "
                f"cluster's GPU count ({n})"
            )
        v["dp"] = n // model_par
    from perfmodel.config import RECOMPUTE, SCHEDULE

    v["recompute"] = RECOMPUTE[v["recompute"]]
    v["schedule"] = SCHEDULE[v["schedule"]]
    v["sequence_parallel"] = bool(v["sequence_parallel"])
    if space.num_microbatches is not None:
        v["num_microbatches"] = int(space.num_microbatches[0])
    try:
        pc = ParallelConfig(**v)
    except ValidationError as err:
        raise SpecError(format_validation_error(err)) from None
    resolve_config(pc, space.model, space.training, space.cluster,
                   allow_idle_gpus=space.allow_idle_gpus,
                   allow_tp_across_nodes=space.allow_tp_across_nodes)


def plan(
    model: str | Path | ModelSpec,
    cluster: str | Path | ClusterSpec,
    training: str | Path | TrainingSpec | dict | None = None,
    *,
    gpus: int | None = None,
    global_batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    strategy: str | Any = "grid",
    objective: str = "time",
    top: int = 10,
    seed: int = 0,
    kernels: str = "fused",
    allow_idle_gpus: bool = False,
    allow_tp_across_nodes: bool = False,
    uneven_layers: bool = True,
    calibration: Any = None,
    evaluator: Callable[..., Any] | None = None,
    progress: Progress | None = None,
    memory_headroom: float | None = None,
    max_step_time_s: float | None = None,
    max_memory_bytes: float | None = None,
    framework: str | Path | FrameworkSpec | None = None,
    **fixed: Any,
) -> SearchResult:
    """Search the parallel configurations of ``model`` on ``cluster`` and rank them.

    Parameters
    ----------
    model, cluster
        Preset names (``"gpt3-175b"``, ``"dgx-a100-80g"``), spec file paths, or specs.
    training
        A TrainingSpec, dict or TOML path; ``global_batch_size``, ``seq_len``, ``precision``,
        ``optimizer`` override its fields.
    gpus
        Scale the cluster to this many GPUs.
    strategy
        ``"grid"`` (exhaustive), ``"nsga2"`` (multi-objective, pymoo), ``"ga"`` (genetic), or
        a strategy object with ``run(problem, seed, progress)``.
    objective
        ``"time"`` (step time), ``"memory"`` (peak memory per GPU) or ``"cost"``
        (GPU-seconds per step).
    top
        Number of configurations in ``result.top``.
    seed
        Seed of the stochastic strategies (same seed, same answer).
    kernels
        ``"fused"`` or ``"eager"`` (see ``perfmodel.step.evaluate``).
    allow_idle_gpus, allow_tp_across_nodes, uneven_layers
        Relax the constraints ``dp*tp*pp*cp == gpus`` and ``tp <= scale-up domain``;
        ``uneven_layers`` (default on) admits ``pp*vp`` that does not divide the layers with
        Megatron-LM's uneven layout (``perfmodel.pipeline.megatron_layout``); off: even splits
        only.
    memory_headroom
        Fraction of HBM kept free (default ``perfmodel.memory.SEARCH_MEMORY_HEADROOM``): a
        configuration fits when its peak is at most HBM less the reserve less this.
    max_step_time_s, max_memory_bytes
        Constraints: configurations slower or larger than these do not count (for example
        ``objective="memory", max_step_time_s=20``).
    evaluator
        Replace ``perfmodel.step.evaluate`` (same signature), e.g. in tests.
    progress
        ``progress(done, total)`` callback.
    framework
        The training stack to be launched (preset name such as ``"megatron-2022"``,
        ``"nemo-24.09"``, ``"deepspeed"``, ``"torchtitan"``, a TOML path or a FrameworkSpec):
        sets its switches (overlaps, flash attention) on the training setup, before the single
        overrides above, and keeps the search to what it runs (see ``perfmodel.frameworks``).
    **fixed
        Pin parallel dimensions: ``dp tp pp vp cp zero_stage micro_batch_size recompute
        sequence_parallel schedule num_microbatches``; a value pins, a list / range restricts.
        With all of them pinned, the one configuration is evaluated (as
        :func:`evaluate_config`).

    Returns
    -------
    SearchResult
        ``.best``, ``.top``, ``.pareto`` (DataFrames), ``.rows`` (JSON), ``.diagnostics``,
        ``.evaluated``, ``.feasible``, ``.seconds``. When nothing fits in memory,
        ``result.fits_any`` is False and ``result.why_nothing_fits()`` says why.

    Raises
    ------
    SpecError
        Unknown preset, invalid spec, or no configuration satisfying the constraints (the
        message names the operands).
    """
    _check_arguments(strategy=strategy, top=top, seed=seed)
    problem = make_problem(
        model, cluster, training, gpus=gpus, global_batch_size=global_batch_size,
        seq_len=seq_len, precision=precision, optimizer=optimizer, objective=objective,
        kernels=kernels, allow_idle_gpus=allow_idle_gpus,
        allow_tp_across_nodes=allow_tp_across_nodes, uneven_layers=uneven_layers,
        calibration=calibration, evaluator=evaluator, memory_headroom=memory_headroom,
        max_step_time_s=max_step_time_s, max_memory_bytes=max_memory_bytes,
        framework=framework, **fixed,
    )
    space = problem.space
    if all(len(space.values[d]) == 1 for d in space.dims):
        _check_single(space)
        return GridSearch(top=1, name="single").run(problem)
    result = _strategy(strategy, top).run(problem, seed, progress)
    if result.evaluated == 0:
        if result.strategy == "grid":
            raise SpecError(space.explain_empty())
        raise SpecError(
            f"{result.strategy} found no valid configuration; run the grid strategy to see why"
        )
    return result


def evaluate_config(
    model: str | Path | ModelSpec,
    cluster: str | Path | ClusterSpec,
    training: str | Path | TrainingSpec | dict | None = None,
    *,
    gpus: int | None = None,
    global_batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    kernels: str = "fused",
    allow_idle_gpus: bool = False,
    allow_tp_across_nodes: bool = False,
    calibration: Any = None,
    evaluator: Callable[..., Any] | None = None,
    memory_headroom: float | None = None,
    framework: str | Path | FrameworkSpec | None = None,
    **config: Any,
) -> SearchResult:
    """Predict one configuration (fields of :class:`ParallelConfig`; missing ones take its
    defaults, ``dp`` defaults to ``gpus / (tp*pp*cp)``).

    Returns a :class:`SearchResult` whose ``rows[0]`` (also ``to_json()['best']``) is the
    prediction; when it does not fit, ``fits_any`` is False and ``smallest`` holds it.
    """
    defaults = ParallelConfig()
    pinned = {d: config.pop(d, None) for d in SEARCH_DIMS}
    schedule_given = pinned["schedule"] is not None
    for alias, d in (("zero", "zero_stage"), ("micro_batch", "micro_batch_size")):
        if alias in config:
            pinned[d] = config.pop(alias)
    nmb = config.pop("num_microbatches", None)
    if config:
        raise SpecError(
            f"unknown configuration field {min(config)!r}: expected one of "
            f"{', '.join(SEARCH_DIMS)}, num_microbatches"
        )
    for d in SEARCH_DIMS:
        if pinned[d] is None and d != "dp":
            pinned[d] = getattr(defaults, d)
    if not schedule_given and pinned["vp"] > 1:
        pinned["schedule"] = "interleaved"
    return plan(
        model, cluster, training, gpus=gpus, global_batch_size=global_batch_size,
        seq_len=seq_len, precision=precision, optimizer=optimizer, kernels=kernels,
        allow_idle_gpus=allow_idle_gpus, allow_tp_across_nodes=allow_tp_across_nodes,
        calibration=calibration, evaluator=evaluator, num_microbatches=nmb,
        memory_headroom=memory_headroom, framework=framework,
        **pinned,
    )
