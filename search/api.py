"""Python API: ``plan(...)`` searches parallel configurations, ``evaluate_config(...)`` predicts one.

>>> from search import plan
>>> r = plan("gpt3-175b", "dgx-a100-80g", global_batch_size=1536, tp=8)   # doctest: +SKIP
>>> r.best[["dp", "tp", "pp", "step_time_s", "mfu", "peak_memory_bytes"]]  # doctest: +SKIP

Model and cluster are preset names, spec file paths or spec objects. Every parallel dimension
left out is searched; one given as a value is pinned, one given as a list (or range) is searched
over those values. All user errors raise :class:`perfmodel.spec.specs.SpecError` with a one-line
message.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfmodel.core.codes import CP_COMM, RECOMPUTE, SCHEDULE
from perfmodel.core.errors import SpecError
from perfmodel.hardware.profile import load_profile
from perfmodel.memory.breakdown import SEARCH_MEMORY_HEADROOM
from perfmodel.parallel.config import ParallelConfig, resolve_config
from perfmodel.spec.frameworks import apply_framework, default_framework, load_framework
from perfmodel.spec.specs import (
    ClusterSpec,
    ModelSpec,
    TrainingSpec,
    format_validation_error,
    load_cluster,
    load_model,
    load_training,
    path_exists,
    read_toml,
    spec_path,
)
from perfmodel.step.evaluate import evaluate as step_evaluate
from perfmodel.step.profiled import evaluate_profiled as profile_evaluate
from search import host_sharding
from search.request import (
    DEFAULT_CLUSTER,
    DEFAULT_MODEL,
    FIXED_OPTIONS,
    KERNELS,
    MAX_TOP,
    STRATEGIES,
    PlanRequest,
)
from search.result import SearchResult
from search.space import MAX_GRID_CONFIGURATIONS, SEARCH_DIMS, Problem, SearchSpace, make_space
from search.strategies.grid import GridSearch, evaluate_single
from search.train import attach_train, run_settings_for

try:  # a dependency; the planner stays usable without it
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_MODEL",
    "DEFAULT_SEQ_LEN_CAP",
    "DEFAULT_TOKENS_PER_STEP",
    "MAX_TOP",
    "RECIPE_SWITCHES",
    "STRATEGIES",
    "STRATEGY_CLASSES",
    "TRAINING_SWITCHES",
    "PlanRequest",
    "evaluate_config",
    "make_problem",
    "plan",
    "plan_request",
    "problem_of",
    "strategy_class",
]

#: The embedded default's training setup (``plan`` with no arguments, see
#: :data:`search.request.DEFAULT_MODEL`): global batch 1536, sequence 2048.
DEFAULT_GLOBAL_BATCH = 1536
DEFAULT_SEQ_LEN = 2048

#: Training-setup switches that :func:`plan` takes one by one (they override ``training`` and
#: the ``framework``'s values); see :class:`perfmodel.spec.specs.TrainingSpec`.
TRAINING_SWITCHES = ("flash_attention", "overlap_grad_reduce", "overlap_tp_comm",
                     "overlap_p2p_comm", "zero3_gather")
#: A recipe's own settings that :func:`plan` takes one by one too (they override ``training``
#: and the ``framework``'s values); ``result.setup["assumed"]`` names one the caller left out
#: only where a framework or training file set it (or it is one of :data:`SETUP_DEFAULTS`).
RECIPE_SWITCHES = ("attention_backend", "recompute_modules", "cpu_offload_layers",
                   "overlap_moe_comm", "moe_pad_expert_input_to_capacity",
                   "cuda_graph_full_iteration")

#: When neither the caller nor the model preset gives a sequence length, the model's declared
#: context (``max_seq_len``, ``max_position_embeddings`` of a HF config) is used up to this cap:
#: 8192 tokens is Llama 3's pre-training length (arXiv:2407.21783, Sec. 3.4.1); 32K-128K
#: contexts are reached by a short long-context extension, not by the pre-training step.
DEFAULT_SEQ_LEN_CAP = 8192

#: Training-setup values that move the answer beyond the overlap switches: the gradient
#: buffer's dtype, the attention kernel, the loss kernel, fp8 weights, the modules selective
#: recompute repeats (these two are options too, :data:`RECIPE_SWITCHES`). The report names each
#: with where it came from (an option, the framework preset, the training file, or the
#: TrainingSpec default).
SETUP_DEFAULTS = ("grad_reduce_in_fp32", "attention_backend", "cross_entropy", "fp8_params",
                  "recompute_modules")

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
    if _user_set_threads() or threadpool_limits is None:
        yield
        return
    with threadpool_limits(limits=1):
        yield


def _default_evaluator() -> Callable[..., Any]:
    """The evaluation path of a request without an ``evaluator``: ``perfmodel.step.evaluate.evaluate``."""
    return step_evaluate


#: The search strategies by name (:data:`search.request.STRATEGIES`): ``module:class``, imported
#: when a request names it (NSGA-II brings pymoo, which the other strategies do not need).
STRATEGY_CLASSES = {"grid": "search.strategies.grid:GridSearch",
                    "dp": "search.strategies.dp:DPSearch",
                    "ga": "search.strategies.evolutionary:GeneticSearch",
                    "nsga2": "search.strategies.nsga2:NSGA2Search"}


def strategy_class(name: str) -> type:
    """The strategy class registered as ``name`` in :data:`STRATEGY_CLASSES`."""
    module, cls = STRATEGY_CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def _strategy(strategy: Any, top: int, max_configurations: int | None = None) -> Any:
    """The strategy object of a name (``grid`` with its size limit, :func:`grid_limit`), or
    ``strategy`` itself when it is an object with ``run``."""
    if not isinstance(strategy, str):
        return strategy  # any object with run(problem, seed, progress)
    name = getattr(strategy, "value", strategy)
    if name == "grid":
        return GridSearch(top=top, max_configurations=grid_limit(max_configurations))
    if name in STRATEGY_CLASSES:
        return strategy_class(name)(top=top)
    raise SpecError(f"strategy = {strategy!r}: expected one of {', '.join(STRATEGIES)}")


def grid_limit(max_configurations: int | None) -> int | None:
    """The grid's size limit of a request's ``max_configurations``: None the default
    (:data:`search.space.MAX_GRID_CONFIGURATIONS`), 0 no limit (None), else the number."""
    if max_configurations is None:
        return MAX_GRID_CONFIGURATIONS
    return None if int(max_configurations) == 0 else int(max_configurations)


def _training_data(training: Any) -> tuple[Any, set[str], str]:
    """(spec or dict, the keys it sets, where it came from) of the ``training`` argument."""
    if training is None:
        return None, set(), ""
    if isinstance(training, TrainingSpec):
        return training, set(TrainingSpec.model_fields), "training spec"
    if isinstance(training, dict):
        return dict(training), set(training), "training dict"
    path = spec_path(training, "training")
    if not path_exists(path):
        raise SpecError(f"training file '{path}' does not exist")
    data = read_toml(path)
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
        ModelSpec, TrainingSpec, ClusterSpec, dict[str, str], Any]:
    """The three specs, where each training value the caller did not give comes from, and the
    framework (``None``: the default release of the cluster's GPU,
    :func:`perfmodel.spec.frameworks.default_framework`, whose switches then leave what the
    training file sets as it is; ``why["framework"]`` says it was the default)."""
    try:
        m = load_model(model)
        c = load_cluster(cluster, gpus)
        data, keys, src = _training_data(training)
        implicit = framework is None
        fw = load_framework(framework) if not implicit else None
        why: dict[str, str] = {}
        if implicit:
            fw, reason = default_framework(c.gpu, m)
            if reason:
                why["framework"] = reason
        given = {k: v for k, v in overrides.items() if v is not None}
        if not isinstance(data, TrainingSpec):
            for k in ("seq_len", "global_batch_size"):
                if k not in given and k in keys:
                    given[k] = data[k]
        fill, defaulted = training_defaults(m, given)
        if isinstance(data, TrainingSpec):
            fill, defaulted = {}, {}
        why.update(defaulted)
        _sources(why, keys, src, overrides, fw, implicit)
        # the stack's switches first, then the caller's single overrides win
        base = load_training(data if isinstance(data, TrainingSpec) else {**fill, **(data or {})})
        t = apply_framework(base, fw, overrides.get("precision"))
        if implicit:  # a default stack does not override what the training file says
            t = t.model_copy(update={k: getattr(base, k) for k in keys
                                     if k in fw.training_switches()})
        t = load_training(t, **overrides)
    except ValidationError as err:  # pydantic errors raised outside the loaders
        raise SpecError(format_validation_error(err)) from None
    return m, t, c, why, fw


def _sources(why: dict[str, str], keys: set[str], src: str, overrides: dict[str, Any],
             fw: Any, implicit: bool) -> None:
    """Fill ``why`` with where each training value the caller did not give comes from."""
    for k in keys & {"seq_len", "global_batch_size", "precision", "optimizer"}:
        if overrides.get(k) is None:
            why[k] = src
    for k in ("precision", "optimizer"):
        if k not in why and overrides.get(k) is None:
            why[k] = "tool default"
    fw_keys = set() if fw is None else set(fw.training_switches())
    if implicit:
        fw_keys -= keys
    for k in (*TRAINING_SWITCHES, *SETUP_DEFAULTS, *RECIPE_SWITCHES):
        if overrides.get(k) is None:
            why[k] = (f"framework {fw.name}" if k in fw_keys else
                      src if k in keys else "tool default")
            if why[k] == "tool default" and k not in (*TRAINING_SWITCHES, *SETUP_DEFAULTS):
                del why[k]  # a recipe setting nobody set: the report does not list it


def make_problem(model: Any, cluster: Any, training: Any = None, **options: Any) -> Problem:
    """The search problem of :func:`plan`'s arguments (see :class:`PlanRequest`)."""
    return problem_of(PlanRequest(model=model, cluster=cluster, training=training, **options))


make_problem.__signature__ = PlanRequest.signature()  # type: ignore[attr-defined]


def problem_of(request: PlanRequest) -> Problem:
    """Load the specs, build the space and bind the evaluation path of a request."""
    r = request
    prof = load_profile(r.profile)
    m, t, c, why, fw = _specs(r.model, r.cluster, r.training, r.gpus, {
        k: getattr(r, k) for k in ("global_batch_size", "seq_len", "precision", "optimizer",
                                   *TRAINING_SWITCHES, *RECIPE_SWITCHES)}, r.framework)
    if host_sharding.imbalance_defaulted(t, m, r.moe_imbalance):
        why["moe_imbalance"] = ("published learned-routing imbalance (busiest expert / mean; "
                                "--moe-imbalance 1 for force-balanced benchmarks)")
    t = host_sharding.training_with_options(t, m, r)
    # the DP's layouts need not divide the layers evenly
    uneven_layers = r.uneven_layers or getattr(r.strategy, "value", r.strategy) == "dp"
    try:
        space = make_space(m, t, c, allow_idle_gpus=r.allow_idle_gpus,
                           allow_tp_across_nodes=r.allow_tp_across_nodes,
                           uneven_layers=uneven_layers, framework=fw,
                           stage_layers=r.stage_layers,
                           stage_recompute_layers=r.stage_recompute_layers, **r.fixed())
    except SpecError as err:
        if r.framework is not None or "framework" not in str(err):
            raise
        raise SpecError(f"{err} ({fw.name} is {c.gpu.name}'s default release: name another "
                        "with --framework, e.g. --framework ideal for the what-if stack)"
                        ) from None
    kernels = getattr(r.kernels, "value", r.kernels)
    if kernels not in KERNELS:
        raise SpecError(f"kernels = {kernels!r}: expected fused or eager")
    headroom = (SEARCH_MEMORY_HEADROOM if r.memory_headroom is None
                else float(r.memory_headroom))
    evaluator = r.evaluator or _default_evaluator()
    if prof is not None and not prof.is_neutral:
        evaluator = functools.partial(profile_evaluate, profile=prof, evaluator=evaluator)
    objective = getattr(r.objective, "value", r.objective)
    pareto = getattr(r.pareto_objectives, "value", r.pareto_objectives) or (
        "time-to-train-cost" if objective == "time-to-train" else "step-memory-gpus")
    return Problem(space, evaluator, objective, kernels,
                   r.calibration, memory_headroom=headroom,
                   max_step_time_s=r.max_step_time_s, max_memory_bytes=r.max_memory_bytes,
                   assumed=why, profile=None if prof is None else prof.name,
                   efficiency_profile=prof,
                   run=run_settings_for(space, r.train_tokens, r.train_steps, r.gpu_hour_price,
                                        r.checkpoint_mode), pareto=pareto)


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

    v["recompute"] = RECOMPUTE[v["recompute"]]
    v["schedule"] = SCHEDULE[v["schedule"]]
    v["cp_comm"] = CP_COMM[v["cp_comm"]]
    v["sequence_parallel"] = bool(v["sequence_parallel"])
    if space.num_microbatches is not None:
        v["num_microbatches"] = int(space.num_microbatches[0])
    v["stage_layers"] = space.stage_layers
    v["stage_recompute_layers"] = space.stage_recompute_layers
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


def plan(model: Any, cluster: Any, training: Any = None, **options: Any) -> SearchResult:
    """Search the parallel configurations of ``model`` on ``cluster`` and rank them.

    Parameters
    ----------
    model, cluster, training, **options
        The fields of :class:`search.request.PlanRequest` (one description each; the
        ``plan`` command line has one option per field): the model and cluster (preset names,
        spec files or specs), the training setup and its single overrides, the pinned or
        restricted parallel dimensions (a value pins, a list / range restricts; all pinned:
        the one configuration is evaluated, as :func:`evaluate_config`), the strategy,
        objective, seed and constraints, and the evaluation (kernels, calibration, profile,
        ``evaluator``, ``progress``).

    Returns
    -------
    SearchResult
        ``.best``, ``.top``, ``.pareto`` (DataFrames), ``.rows`` (JSON), ``.diagnostics``,
        ``.evaluated``, ``.feasible``, ``.seconds``. When nothing fits in memory,
        ``result.fits_any`` is False and ``result.why_nothing_fits()`` says why.

    Raises
    ------
    SpecError
        Unknown preset, invalid spec or option, or no configuration satisfying the
        constraints (the message names the operands).
    """
    return plan_request(PlanRequest(model=model, cluster=cluster, training=training, **options))


plan.__signature__ = PlanRequest.signature()  # type: ignore[attr-defined]


def plan_request(request: PlanRequest) -> SearchResult:
    """:func:`plan` of a :class:`PlanRequest`, with hybrid sharding and offload searched
    where the framework runs them and the request leaves them out
    (:mod:`search.host_sharding`)."""
    result = _plan_request_one(request)
    fw = None if request.framework is None else load_framework(request.framework)
    caps = None if fw is None else fw.capabilities
    if caps is not None and request.hsdp_shard is None and caps.hsdp is not None and (
            caps.hsdp.value):
        gpus = load_cluster(request.cluster, request.gpus).total_gpus
        result = host_sharding.search_hsdp(request, result, gpus, _plan_request_one)
    if caps is not None and request.offload is None and caps.offload is not None:
        shard = result.setup.get("training_switches", {}).get("hsdp_shard")
        base = request if shard is None else request.model_copy(update={"hsdp_shard": shard})
        result = host_sharding.search_offload(base, result, caps.offload.value,
                                              _plan_request_one)
    return result


def _plan_request_one(request: PlanRequest) -> SearchResult:
    """:func:`plan` of a :class:`PlanRequest` as given (nothing more searched)."""
    problem = problem_of(request)
    space = problem.space
    threads = nullcontext() if request.evaluator is not None else search_threads()
    if all(len(space.values[d]) == 1 for d in space.dims):
        _check_single(space)
        with threads:
            return attach_train(_annotate(evaluate_single(problem), problem), problem)
    if space.stage_layers is not None and getattr(request.strategy, "value",
                                                  request.strategy) == "dp":
        raise SpecError("stage_layers pins the per-stage layout that strategy dp searches: "
                        "use strategy grid, or leave stage_layers out")
    with threads:
        result = _annotate(_strategy(request.strategy, request.top, request.max_configurations).run(
            problem, request.seed, request.progress), problem)
    if result.evaluated == 0:
        if result.strategy == "grid":
            raise SpecError(space.explain_empty())
        raise SpecError(
            f"{result.strategy} found no valid configuration; run the grid strategy to see why"
        )
    return attach_train(result, problem)


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
    return result


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
    plan_options = [k for k in PlanRequest.model_fields
                    if k not in (*FIXED_OPTIONS, "model", "cluster", "training")]
    unknown = sorted(set(options) - set(plan_options))
    if unknown:
        known = [*SEARCH_DIMS, "num_microbatches", *plan_options]
        close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
        raise SpecError(
            f"unknown option {unknown[0]!r}"
            + (f": did you mean {close[0]!r}?" if close else
               f": expected a configuration field ({', '.join(SEARCH_DIMS)}, "
               "num_microbatches) or an option of search.plan")
        )
    if options.get("stage_layers") is not None and pinned["pp"] is None:
        pinned["pp"] = len(options["stage_layers"])  # a per-stage layout pins pp
    if options.get("stage_recompute_layers") is not None and pinned["recompute"] is None:
        pinned["recompute"] = "full"
    for d in SEARCH_DIMS:
        if pinned[d] is None and d != "dp":
            pinned[d] = getattr(defaults, d)
    if pinned["etp"] is None:
        pinned["etp"] = pinned["tp"]  # Megatron's default expert tensor parallel size
    if not schedule_given and pinned["vp"] > 1:
        pinned["schedule"] = "interleaved"
    return plan(model, cluster, training, num_microbatches=nmb, **options, **pinned)
