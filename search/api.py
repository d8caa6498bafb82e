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

import functools
import inspect
import numbers
import os
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from perfmodel.config import ParallelConfig, resolve_config
from perfmodel.frameworks import FrameworkSpec, apply_framework, load_framework
from perfmodel.profile import evaluate as profile_evaluate
from perfmodel.profile import load_profile
from perfmodel.specs import (
    ClusterSpec,
    ModelSpec,
    SpecError,
    TrainingSpec,
    _read_toml,
    format_validation_error,
    load_cluster,
    load_model,
    load_training,
)
from search.grid import GridSearch, Progress
from search.result import SearchResult
from search.space import SEARCH_DIMS, Problem, SearchSpace, make_space
from search.train import attach_train, run_settings_for

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_MODEL",
    "DEFAULT_SEQ_LEN_CAP",
    "DEFAULT_TOKENS_PER_STEP",
    "MAX_TOP",
    "STRATEGIES",
    "TRAINING_SWITCHES",
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
STRATEGIES = ("grid", "dp", "nsga2", "ga")

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
#: Training-setup switches that :func:`plan` takes one by one (they override ``training`` and
#: the ``framework``'s values); see :class:`perfmodel.specs.TrainingSpec`.
TRAINING_SWITCHES = ("flash_attention", "overlap_grad_reduce", "overlap_tp_comm",
                     "overlap_p2p_comm", "zero3_gather")

#: When neither the caller nor the model preset gives a sequence length, the model's declared
#: context (``max_seq_len``, ``max_position_embeddings`` of a HF config) is used up to this cap:
#: 8192 tokens is Llama 3's pre-training length (arXiv:2407.21783, Sec. 3.4.1); 32K-128K
#: contexts are reached by a short long-context extension, not by the pre-training step.
DEFAULT_SEQ_LEN_CAP = 8192

#: When neither the caller nor the model preset gives a global batch, it is this many tokens
#: per step divided by the sequence length: GPT-3 175B's batch, 1536 x 2048 tokens (Brown et
#: al. 2020, Table 2.1: 3.2M tokens; Narayanan et al. 2021, Table 1).
DEFAULT_TOKENS_PER_STEP = DEFAULT_GLOBAL_BATCH * DEFAULT_SEQ_LEN


def _user_set_threads() -> bool:
    """Whether the user chose the BLAS / OpenMP thread count in the environment."""
    return any(os.environ.get(k) for k in (
        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"))


@contextmanager
def search_threads():
    """One BLAS / OpenMP thread inside a search, unless the user set a thread count.

    The search evaluates many small arrays; OpenBLAS threads spin-wait between calls, and on a
    machine whose cores other jobs use, that turned a 0.2 s search into 21 s
    (``OPENBLAS_NUM_THREADS=1``: 0.2-1.4 s). threadpoolctl limits the already loaded libraries.
    """
    if _user_set_threads():
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency; keep the planner usable without it
        yield
        return
    with threadpool_limits(limits=1):
        yield


def _default_evaluator() -> Callable[..., Any]:
    from perfmodel.step import evaluate

    return evaluate


def _strategy(strategy: Any, top: int) -> Any:
    if not isinstance(strategy, str):
        return strategy  # any object with run(problem, seed, progress)
    name = getattr(strategy, "value", strategy)
    if name == "grid":
        return GridSearch(top=top)
    if name == "dp":
        from search.dp import DPSearch

        return DPSearch(top=top)
    if name == "ga":
        from search.evolutionary import GeneticSearch

        return GeneticSearch(top=top)
    if name == "nsga2":
        from search.nsga2 import NSGA2Search

        return NSGA2Search(top=top)
    raise SpecError(f"strategy = {strategy!r}: expected one of {', '.join(STRATEGIES)}")


def _training_data(training: Any) -> tuple[Any, set[str], str]:
    """(spec or dict, the keys it sets, where it came from) of the ``training`` argument."""
    if training is None:
        return None, set(), ""
    if isinstance(training, TrainingSpec):
        return training, set(TrainingSpec.model_fields), "training spec"
    if isinstance(training, dict):
        return dict(training), set(training), "training dict"
    path = Path(getattr(training, "value", training))
    if not path.exists():
        raise SpecError(f"training file '{path}' does not exist")
    data = _read_toml(path)
    return data, set(data), f"training file {path}"


def training_defaults(m: ModelSpec, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Sequence length and global batch for what the caller left out, with where they come
    from: the model preset's published training setup, else the model's declared context (capped
    at :data:`DEFAULT_SEQ_LEN_CAP`) and :data:`DEFAULT_TOKENS_PER_STEP` tokens per step."""
    out: dict[str, Any] = {}
    why: dict[str, str] = {}
    pub = m.published_training
    seq = given.get("seq_len")
    if seq is None:
        if pub is not None:
            seq = out["seq_len"] = pub.seq_len
            why["seq_len"] = f"{m.name}'s published training setup ({pub.source})"
        else:
            seq = out["seq_len"] = min(m.max_seq_len, DEFAULT_SEQ_LEN_CAP)
            why["seq_len"] = (f"{m.name}'s context length {m.max_seq_len}" if
                              m.max_seq_len <= DEFAULT_SEQ_LEN_CAP else
                              f"{m.name}'s context length {m.max_seq_len:,} capped at "
                              f"{DEFAULT_SEQ_LEN_CAP} (the default cap)")
    if given.get("global_batch_size") is None:
        if pub is not None and pub.seq_len == seq:
            out["global_batch_size"] = pub.global_batch_size
            why["global_batch_size"] = f"{m.name}'s published training setup ({pub.source})"
        else:
            out["global_batch_size"] = max(1, round(DEFAULT_TOKENS_PER_STEP / seq))
            why["global_batch_size"] = (f"default {DEFAULT_TOKENS_PER_STEP:,} tokens per step "
                                        f"(GPT-3's batch) / {seq} tokens")
    return out, why


def _specs(model, cluster, training, gpus, overrides, framework=None) -> tuple[
        ModelSpec, TrainingSpec, ClusterSpec, dict[str, str]]:
    """The three specs, and where each training value the caller did not give comes from."""
    try:
        m = load_model(model)
        c = load_cluster(cluster, gpus)
        data, keys, src = _training_data(training)
        given = {k: v for k, v in overrides.items() if v is not None}
        if not isinstance(data, TrainingSpec):
            for k in ("seq_len", "global_batch_size"):
                if k not in given and k in keys:
                    given[k] = data[k]
        fill, why = training_defaults(m, given)
        if isinstance(data, TrainingSpec):
            fill, why = {}, {}
        for k in keys & {"seq_len", "global_batch_size", "precision", "optimizer"}:
            if overrides.get(k) is None:
                why[k] = src
        for k in ("precision", "optimizer"):
            if k not in why and overrides.get(k) is None:
                why[k] = "tool default"
        for k in TRAINING_SWITCHES:
            if overrides.get(k) is None:
                why[k] = (f"framework {framework.name}" if framework is not None else
                          src if k in keys else "tool default")
        # the stack's switches first, then the caller's single overrides win
        base = load_training(data if isinstance(data, TrainingSpec) else {**fill, **(data or {})})
        t = apply_framework(base, framework, overrides.get("precision"))
        t = load_training(t, **overrides)
    except ValidationError as err:  # pydantic errors raised outside the loaders
        raise SpecError(format_validation_error(err)) from None
    return m, t, c, why


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
    flash_attention: bool | None = None,
    overlap_grad_reduce: bool | None = None,
    overlap_tp_comm: bool | None = None,
    overlap_p2p_comm: bool | None = None,
    zero3_gather: str | None = None,
    profile: Any = None,
    train_tokens: float | None = None,
    train_steps: int | None = None,
    gpu_hour_price: float | None = None,
    checkpoint_mode: str | None = None,
    **fixed: Any,
) -> Problem:
    """Load the specs, build the space and bind the evaluation path (see :func:`plan`)."""
    _check_arguments(gpus=gpus, global_batch_size=global_batch_size, seq_len=seq_len,
                     precision=precision, optimizer=optimizer, objective=objective,
                     kernels=kernels, **fixed)
    fw = None if framework is None else load_framework(framework)
    prof = load_profile(profile)
    m, t, c, why = _specs(model, cluster, training, gpus, {
        "global_batch_size": global_batch_size, "seq_len": seq_len, "precision": precision,
        "optimizer": optimizer, "flash_attention": flash_attention,
        "overlap_grad_reduce": overlap_grad_reduce, "overlap_tp_comm": overlap_tp_comm,
        "overlap_p2p_comm": overlap_p2p_comm, "zero3_gather": zero3_gather}, fw)
    space = make_space(m, t, c, allow_idle_gpus=allow_idle_gpus,
                       allow_tp_across_nodes=allow_tp_across_nodes,
                       uneven_layers=uneven_layers, framework=fw, **fixed)
    kernels = getattr(kernels, "value", kernels)
    if kernels not in ("fused", "eager"):
        raise SpecError(f"kernels = {kernels!r}: expected fused or eager")
    from perfmodel.memory import SEARCH_MEMORY_HEADROOM

    headroom = SEARCH_MEMORY_HEADROOM if memory_headroom is None else float(memory_headroom)
    evaluator = evaluator or _default_evaluator()
    if prof is not None and not prof.is_neutral:
        evaluator = functools.partial(profile_evaluate, profile=prof, evaluator=evaluator)
    return Problem(space, evaluator, getattr(objective, "value", objective), kernels,
                   calibration, memory_headroom=headroom,
                   max_step_time_s=max_step_time_s, max_memory_bytes=max_memory_bytes,
                   assumed=why, profile=None if prof is None else prof.name,
                   run=run_settings_for(space, train_tokens, train_steps, gpu_hour_price,
                                        checkpoint_mode))


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
    refused = space.framework_refusals(v)
    if refused:  # what the stack's release cannot run (--framework)
        raise SpecError(refused[0])


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
    flash_attention: bool | None = None,
    overlap_grad_reduce: bool | None = None,
    overlap_tp_comm: bool | None = None,
    overlap_p2p_comm: bool | None = None,
    zero3_gather: str | None = None,
    profile: Any = None,
    train_tokens: float | None = None,
    train_steps: int | None = None,
    gpu_hour_price: float | None = None,
    checkpoint_mode: str | None = None,
    **fixed: Any,
) -> SearchResult:
    """Search the parallel configurations of ``model`` on ``cluster`` and rank them.

    Parameters
    ----------
    model, cluster
        Preset names (``"gpt3-175b"``, ``"dgx-a100-80g"``), spec file paths, or specs.
    training
        A TrainingSpec, dict or TOML path; ``global_batch_size``, ``seq_len``, ``precision``,
        ``optimizer`` and the switches below override its fields. What neither gives comes from
        the model preset's published training setup, else from the model's context length
        (capped at :data:`DEFAULT_SEQ_LEN_CAP`) and :data:`DEFAULT_TOKENS_PER_STEP`;
        ``result.setup["assumed"]`` says where each value came from.
    gpus
        Scale the cluster to this many GPUs.
    strategy
        ``"grid"`` (exhaustive), ``"dp"`` (the grid's outer choices with per-stage layer
        counts and block recompute chosen by dynamic programming, :mod:`search.dp`; implies
        ``uneven_layers``), ``"nsga2"`` (multi-objective, pymoo), ``"ga"`` (genetic), or a
        strategy object with ``run(problem, seed, progress)``.
    objective
        ``"time"`` (step time), ``"memory"`` (peak memory per GPU), ``"cost"``
        (GPU-seconds per step) or ``"time-to-train"`` (expected wall time of the whole run,
        failures and checkpoints included; needs ``train_tokens`` or ``train_steps``).
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
    flash_attention, overlap_grad_reduce, overlap_tp_comm, overlap_p2p_comm, zero3_gather
        Single training switches (:class:`perfmodel.specs.TrainingSpec`); ``None`` keeps the
        framework's (or the training spec's) value.
    profile
        An efficiency profile fitted to measured runs (``plan calibrate``): a shipped name
        (``"nemo-24.09"``), a TOML path or an :class:`perfmodel.profile.EfficiencyProfile`;
        it scales kernel rates and link bandwidths and adds a per-step host time (see
        ``perfmodel.profile``). None: the uncalibrated model.
    train_tokens, train_steps, gpu_hour_price, checkpoint_mode
        The whole run (give one of the two lengths): ``result.train`` then holds its days,
        GPU-hours, energy, cost, expected interruptions, checkpoint interval and goodput for
        each configuration of ``top`` (:class:`perfmodel.run.TrainRun`, ``.to_dict()`` for the
        best, ``.to_dataframe()``); ``gpu_hour_price`` overrides the cluster file's;
        ``checkpoint_mode`` ``"sync"`` (default) or ``"async"`` (:mod:`perfmodel.run`).
        ``objective="time-to-train"`` ranks by the run's expected wall time.
    **fixed
        Pin parallel dimensions: ``dp tp pp vp cp zero_stage micro_batch_size recompute
        sequence_parallel schedule ep etp num_microbatches`` (ep, etp: expert parallel and
        expert tensor parallel, searched for MoE models); a value pins, a list / range restricts.
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
    if getattr(strategy, "value", strategy) == "dp":
        uneven_layers = True  # the DP's layouts need not divide the layers evenly
    problem = make_problem(
        model, cluster, training, gpus=gpus, global_batch_size=global_batch_size,
        seq_len=seq_len, precision=precision, optimizer=optimizer, objective=objective,
        kernels=kernels, allow_idle_gpus=allow_idle_gpus,
        allow_tp_across_nodes=allow_tp_across_nodes, uneven_layers=uneven_layers,
        calibration=calibration, evaluator=evaluator, memory_headroom=memory_headroom,
        max_step_time_s=max_step_time_s, max_memory_bytes=max_memory_bytes,
        framework=framework, profile=profile,
        flash_attention=flash_attention, overlap_grad_reduce=overlap_grad_reduce,
        overlap_tp_comm=overlap_tp_comm, overlap_p2p_comm=overlap_p2p_comm,
        zero3_gather=zero3_gather, train_tokens=train_tokens, train_steps=train_steps,
        gpu_hour_price=gpu_hour_price, checkpoint_mode=checkpoint_mode, **fixed,
    )
    space = problem.space
    threads = nullcontext() if evaluator is not None else search_threads()
    if all(len(space.values[d]) == 1 for d in space.dims):
        _check_single(space)
        with threads:
            return _annotate(GridSearch(top=1, name="single").run(problem), problem)
    if top < 1:
        raise SpecError(f"top = {top}: expected a positive integer")
    with threads:
        result = _annotate(_strategy(strategy, top).run(problem, seed, progress), problem)
    if result.evaluated == 0:
        if result.strategy == "grid":
            raise SpecError(space.explain_empty())
        raise SpecError(
            f"{result.strategy} found no valid configuration; run the grid strategy to see why"
        )
    return result


def _annotate(result: SearchResult, problem: Problem) -> SearchResult:
    """Add to ``result.setup`` where the defaulted training values came from, and warnings
    about the setup itself (``setup["warnings"]``, one line each)."""
    space = problem.space
    result.setup["assumed"] = dict(problem.assumed)
    warn = []
    m = space.model
    if m.num_experts > 1 and "ep" not in SEARCH_DIMS:
        warn.append(f"{m.name} is a mixture-of-experts model ({m.num_experts} experts, top-"
                    f"{m.moe_top_k}); expert parallelism is not modelled yet, so it is planned "
                    "as a dense model holding every expert on each GPU")
    result.setup["warnings"] = warn
    return attach_train(result, problem)


def evaluate_config(
    model: str | Path | ModelSpec,
    cluster: str | Path | ClusterSpec,
    training: str | Path | TrainingSpec | dict | None = None,
    **options: Any,
) -> SearchResult:
    """Predict one configuration: fields of :class:`ParallelConfig` (missing ones take its
    defaults, ``dp`` defaults to ``gpus / (tp*pp*cp)``), and every other option of
    :func:`plan` (``gpus``, ``global_batch_size``, ``framework``, the training switches,
    ``uneven_layers``, ``kernels``, ...).

    Returns a :class:`SearchResult` whose ``rows[0]`` (also ``to_json()['best']``) is the
    prediction; when it does not fit, ``fits_any`` is False, ``smallest`` holds it and
    ``best`` / ``top`` still show it (with ``fits`` False).
    """
    defaults = ParallelConfig()
    pinned = {d: options.pop(d, None) for d in SEARCH_DIMS}
    schedule_given = pinned["schedule"] is not None
    for alias, d in (("zero", "zero_stage"), ("micro_batch", "micro_batch_size")):
        if alias in options:
            pinned[d] = options.pop(alias)
    nmb = options.pop("num_microbatches", None)
    plan_options = [k for k, p in inspect.signature(plan).parameters.items()
                    if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(plan_options))
    if unknown:
        import difflib

        known = [*SEARCH_DIMS, "num_microbatches", *plan_options]
        close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
        raise SpecError(
            f"unknown option {unknown[0]!r}"
            + (f": did you mean {close[0]!r}?" if close else
               f": expected a configuration field ({', '.join(SEARCH_DIMS)}, "
               "num_microbatches) or an option of search.plan")
        )
    for d in SEARCH_DIMS:
        if pinned[d] is None and d != "dp":
            pinned[d] = getattr(defaults, d)
    if pinned["etp"] is None:
        pinned["etp"] = pinned["tp"]  # Megatron's default expert tensor parallel size
    if not schedule_given and pinned["vp"] > 1:
        pinned["schedule"] = "interleaved"
    return plan(model, cluster, training, num_microbatches=nmb, **options, **pinned)
