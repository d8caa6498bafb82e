"""What a plan is asked for: :class:`PlanRequest`, every option of ``plan`` declared once.

One field per option, with its help text (the field's description; a unit in brackets), its
default and its type. From this model:

- ``search.plan(model, cluster, training, **options)`` takes the fields as keywords (its
  signature is :meth:`PlanRequest.signature`) and builds the request;
- the ``plan`` command line builds one option per field (``cli.main``): ``--field-name`` of
  the field's type, choices from the one registry of each name (precisions from
  :data:`perfmodel.spec.specs.PRECISIONS`, recompute and schedule codes from :mod:`perfmodel.parallel.config`);
  a :class:`Cli` marker renames a flag, bounds a value or keeps a field off the command line;
- ``search.api.make_problem`` binds the search problem from the request.

Adding an option is adding a field here. The values are taken as given (no pydantic coercion:
``gpus=np.int64(8)`` stays a numpy integer, ``pp=range(1, 9)`` a range, a str Enum an Enum) and
checked by :func:`check_options`, whose errors are one-line :class:`SpecError` naming the field
and the value.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfmodel.core.codes import CP_COMM, RECOMPUTE, SCHEDULE
from perfmodel.core.errors import SpecError
from perfmodel.hardware.calibration import Calibration
from perfmodel.hardware.profile import EfficiencyProfile
from perfmodel.spec.frameworks import FrameworkSpec
from perfmodel.spec.specs import (
    MAX_GPUS,
    PRECISIONS,
    ClusterSpec,
    ModelSpec,
    RecomputeModule,
    TrainingSpec,
)
from search.space import ALIASES, OBJECTIVES, PARETO_SETS, SEARCH_DIMS
from search.strategies.grid import Progress

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_MODEL",
    "FIXED_OPTIONS",
    "KERNELS",
    "MAX_TOP",
    "STRATEGIES",
    "Cli",
    "PlanRequest",
    "check_options",
]

#: The embedded default (``plan`` with no arguments): GPT-3 175B on 1024 A100-80GB, global
#: batch 1536, sequence 2048, bf16 (the setting of Narayanan et al. 2021, Table 1).
DEFAULT_MODEL = "gpt3-175b"
DEFAULT_CLUSTER = "dgx-a100-80g"

#: Strategy names accepted by :func:`search.plan`.
STRATEGIES = ("grid", "dp", "nsga2", "ga")
#: Kernel sets the step model prices (``perfmodel.step.evaluate.evaluate``).
KERNELS = ("fused", "eager")

#: Most rows ``plan(top=...)`` returns: a billion-row request took 51 s and printed 15.5 MB.
MAX_TOP = 10_000
#: Largest count (GPUs, batch, sequence, a pinned parallel degree) taken at the API edge: any
#: count is held in int64 arrays, and products of a few of them must not overflow.
MAX_COUNT = 2**31 - 1
#: Seeds are 32-bit (numpy's and pymoo's generators take any non-negative int below 2**32).
MAX_SEED = 2**32 - 1

#: Options that pin (a value) or restrict (a list / range) a dimension of the search space.
FIXED_OPTIONS = (*SEARCH_DIMS, "num_microbatches")

# The names of each categorical option, from the one registry of each.
Precision = Literal[PRECISIONS]
Optimizer = Literal[get_args(TrainingSpec.model_fields["optimizer"].annotation)]
Zero3Gather = Literal[get_args(TrainingSpec.model_fields["zero3_gather"].annotation)]
AttentionBackend = Literal[get_args(TrainingSpec.model_fields["attention_backend"].annotation)]
OffloadKind = Literal["none", "optimizer", "params", "activations"]
Recompute = Literal[RECOMPUTE]
Schedule = Literal[SCHEDULE]
CpComm = Literal[CP_COMM]
Strategy = Literal[STRATEGIES]
Objective = Literal[OBJECTIVES]
ParetoObjectives = Literal[tuple(PARETO_SETS)]
Kernels = Literal[KERNELS]


@runtime_checkable
class SearchStrategy(Protocol):
    """A strategy object: ``run(problem, seed, progress) -> SearchResult``."""

    def run(self, problem: Any, seed: int, progress: Progress | None) -> Any: ...


@dataclass(frozen=True)
class Cli:
    """How a :class:`PlanRequest` field appears on the command line (no marker: ``--name``
    of the field's type, the first type of a union).

    ``flags``: the option's names (``"--global-batch"``, ``"--a/--b"`` for a switch);
    ``min`` / ``max``: the range the parser takes; ``limit``: (largest count, its unit), a
    larger value is refused with the limit named; ``quantity``: the value is text with a unit
    (``"20s"``, ``"70GiB"``) and this is the unit of a bare number (``"s"`` or ``"gib"``);
    ``show=False``: an API-only field (objects, callbacks, seeds); ``int_list``: the value is
    a comma-separated list of integers on the command line (``8,9,9,6``), a list in the API.
    """

    flags: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    limit: tuple[int, str] | None = None
    quantity: str | None = None
    show: bool = True
    int_list: bool = False


#: A count of GPUs on the command line: at most :data:`perfmodel.spec.specs.MAX_GPUS`.
_GPU_COUNT = Cli(limit=(MAX_GPUS, "GPUs"))


class PlanRequest(BaseModel):
    """Every option of a plan: what to plan (model, cluster, training setup), which
    configurations to search (pinned or restricted dimensions, relaxed constraints, limits),
    how to search (strategy, objective, seed) and how to price (kernels, calibration, profile).

    ``model``, ``cluster``: preset names (``"gpt3-175b"``, ``"dgx-a100-80g"``), spec file paths
    or specs. ``training``: a TrainingSpec, dict or TOML path; ``global_batch_size``,
    ``seq_len``, ``precision``, ``optimizer`` and the single switches override its fields. What
    neither gives comes from the model preset's published training setup, else from the model's
    context length (capped at ``search.api.DEFAULT_SEQ_LEN_CAP``) and
    ``search.api.DEFAULT_TOKENS_PER_STEP``; ``result.setup["assumed"]`` says where each value
    came from.

    ``strategy``: ``"grid"`` (exhaustive), ``"dp"`` (the grid's outer choices with per-stage
    layer counts and block recompute chosen by dynamic programming, :mod:`search.strategies.dp`; implies
    ``uneven_layers``), ``"nsga2"`` (multi-objective, pymoo), ``"ga"`` (genetic), or an object
    with ``run(problem, seed, progress)``.

    The parallel dimensions ``dp tp pp vp cp zero_stage micro_batch_size recompute
    sequence_parallel schedule ep etp cp_comm num_microbatches`` (aliases ``zero``,
    ``micro_batch``, ``mbs``, ``sp``): ``None`` searches it (``cp_comm``: the types the framework runs),
    a value pins it, a list / range restricts it; with all of them pinned, the one
    configuration is evaluated.

    ``framework``: the training stack to be launched (a preset such as ``"megatron-2022"``, a
    TOML path or a FrameworkSpec) sets its switches on the training setup, before the single
    overrides, and keeps the search to what it runs (``perfmodel.spec.frameworks``). ``profile``: an
    efficiency profile fitted to measured runs (a shipped name, a TOML path or an
    EfficiencyProfile) scales kernel rates and link bandwidths and adds a per-step host time.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    model: str | Path | ModelSpec = Field(
        DEFAULT_MODEL, description="model preset name or spec file (TOML, or a Hugging Face "
        "config.json)")
    cluster: str | Path | ClusterSpec = Field(
        DEFAULT_CLUSTER, description="cluster preset name or spec file")
    gpus: Annotated[int | None, _GPU_COUNT] = Field(
        None, description="scale the cluster to N GPUs")
    global_batch_size: Annotated[int | None, Cli(("--global-batch",),
                                                 limit=(2**24, "sequences"))] = Field(
        None, description="global batch [sequences]")
    seq_len: Annotated[int | None, Cli(limit=(2**24, "tokens"))] = Field(
        None, description="sequence length [tokens]")
    precision: Precision | None = Field(
        None, description="GEMM precision and low-precision recipe (default: the training "
        "setup's, bf16)")
    optimizer: Optimizer | None = Field(
        None, description="optimizer (default: the training setup's, adam)")
    dp: Annotated[int | Sequence[int] | None, _GPU_COUNT] = Field(
        None, description="data-parallel size (searched if omitted)")
    tp: Annotated[int | Sequence[int] | None, _GPU_COUNT] = Field(
        None, description="tensor-parallel size")
    pp: Annotated[int | Sequence[int] | None, _GPU_COUNT] = Field(
        None, description="pipeline-parallel stages")
    vp: Annotated[int | Sequence[int] | None, Cli(limit=(2**16, "virtual stages"))] = Field(
        None, description="virtual stages per pipeline rank")
    cp: Annotated[int | Sequence[int] | None, _GPU_COUNT] = Field(
        None, description="context-parallel size")
    zero_stage: Annotated[int | Sequence[int] | None, Cli(("--zero",), min=0, max=3)] = Field(
        None, description="ZeRO stage 0-3")
    micro_batch_size: Annotated[int | Sequence[int] | None, Cli(
        ("--micro-batch",), limit=(2**24, "sequences"))] = Field(
        None, description="micro-batch size [sequences]")
    recompute: Recompute | Sequence[Recompute] | None = Field(
        None, description="activation recompute (searched if omitted)")
    sequence_parallel: bool | Sequence[bool] | None = Field(
        None, description="Megatron sequence parallelism with tp > 1 (searched if omitted)")
    schedule: Schedule | Sequence[Schedule] | None = Field(
        None, description="pipeline schedule (searched if omitted)")
    ep: int | Sequence[int] | None = Field(
        None, description="expert-parallel size (MoE; searched if omitted)")
    etp: int | Sequence[int] | None = Field(
        None, description="expert tensor-parallel size (MoE)")
    cp_comm: CpComm | Sequence[CpComm] | None = Field(
        None, description="context-parallel communication: p2p (ring attention, the default), "
        "a2a (Ulysses all-to-all by head), allgather (K/V all-gathered before attention) or "
        "a2a+p2p (all-to-all inside the node, the ring across: its a2a size is the largest the "
        "NVLink domain and the heads allow); searched over what the framework runs if omitted")
    stage_layers: Annotated[Sequence[int] | None, Cli(("--stage-layers",), int_list=True)] = Field(
        None, description="transformer layers on each pipeline rank, e.g. 8,9,9,6 (pins pp to "
        "their count; Megatron-LM's --pipeline-model-parallel-layout)")
    stage_recompute_layers: Annotated[Sequence[int] | None, Cli(
        ("--stage-recompute",), int_list=True)] = Field(
        None, description="of --stage-layers, how many each rank recomputes fully, e.g. "
        "0,2,0,0 (implies recompute full)")
    strategy: Strategy | SearchStrategy = Field("grid", description="search strategy")
    objective: Objective = Field(
        "time", description="what 'best' minimises: step time, peak memory, GPU-seconds per "
        "step, or the run's expected wall time (time-to-train)")
    pareto_objectives: ParetoObjectives | None = Field(
        None, description="the Pareto front's objectives (NSGA-II's and every strategy's "
        "front): step-memory-gpus (step time, peak memory, GPUs) or time-to-train-cost (the "
        "run's expected wall time with failures and checkpoints, and its cost; needs "
        "--train-tokens or --train-steps) [default: time-to-train-cost with --objective "
        "time-to-train, else step-memory-gpus]")
    top: Annotated[int, Cli(min=1, limit=(MAX_TOP, "rows"))] = Field(
        10, description="configurations in the table")
    max_configurations: Annotated[int | None, Cli(min=0)] = Field(
        None, description="largest grid the search enumerates [default: 2e7]; 0: no limit "
        "(a progress bar shows how far a long search has come)")
    kernels: Kernels = Field("fused", description="fused (Megatron/TE) or eager PyTorch")
    calibration: Path | str | Calibration | None = Field(
        None, description="folder of your own GPU measurements (the format calibrate_gpu.py "
        "writes)")
    allow_idle_gpus: bool = Field(False, description="allow dp*tp*pp*cp below the GPU count")
    allow_tp_across_nodes: bool = Field(
        False, description="allow tensor parallelism beyond the scale-up (NVLink) domain")
    uneven_layers: Annotated[bool, Cli(("--uneven-layers/--even-layers-only",))] = Field(
        True, description="pp*vp that does not divide the layer count runs Megatron-LM's "
        "uneven layout (embedding and loss counted as layers, or lighter first/last stages)")
    memory_headroom: Annotated[float | None, Cli(min=0.0, max=0.9)] = Field(
        None, description="fraction of HBM kept free [default: 0: the peak already carries a "
        "3% allocator allowance of what is allocated during the step]")
    max_step_time_s: Annotated[float | None, Cli(("--max-step-time",), quantity="s")] = Field(
        None, description="only configurations at most this slow, e.g. 20s, 500ms")
    max_memory_bytes: Annotated[float | None, Cli(("--max-memory",), quantity="gib")] = Field(
        None, description="only configurations whose peak is at most this, e.g. 70GiB")
    framework: str | Path | FrameworkSpec | None = Field(
        None, description="the training stack you will launch (megatron-2020, megatron-2021, "
        "megatron-2022, "
        "nemo-24.07, nemo-24.09, bridge-25.09, bridge-25.x, bridge-26.02, deepspeed, "
        "deepspeed-2021, torchtitan, or a TOML file): sets its switches and keeps the search "
        "to what it runs")
    training: Path | str | TrainingSpec | dict | None = Field(
        None, description="training spec TOML (global_batch_size, seq_len, precision, "
        "optimizer, overlap switches, flash_attention); the options above and below override "
        "it")
    flash_attention: bool | None = Field(
        None, description="attention without storing the s^2 scores (default: the "
        "framework's)")
    overlap_grad_reduce: bool | None = Field(
        None, description="data-parallel reduce / ZeRO gathers overlap compute")
    overlap_tp_comm: bool | None = Field(
        None, description="TP collectives overlap the GEMMs (TE userbuffers)")
    overlap_p2p_comm: bool | None = Field(
        None, description="pipeline sends / receives overlap compute")
    zero3_gather: Zero3Gather | None = Field(
        None, description="ZeRO-3 gathers per layer (FSDP2) or per tensor (DeepSpeed 2021)")
    # a recipe's own settings of the training setup (perfmodel.spec.specs.TrainingSpec)
    attention_backend: AttentionBackend | None = Field(
        None, description="fused attention kernel: cudnn (Transformer Engine's default) or "
        "flash-attn-2 (NVTE_FUSED_ATTN=0 without flash-attn 3; default: the framework's)")
    recompute_modules: list[RecomputeModule] | None = Field(
        None, description="what selective recompute repeats (repeatable; Megatron-Core "
        "--recompute-modules; default core_attn)")
    cpu_offload_layers: Annotated[int | None, Cli(min=0, limit=(2**16, "layers"))] = Field(
        None, description="activations of N layers per pipeline stage offloaded to host "
        "memory (Megatron-Core --cpu-offloading-num-layers; default 0)")
    overlap_moe_comm: bool | None = Field(
        None, description="MoE all-to-all overlaps another micro-batch's compute "
        "(--overlap-moe-expert-parallel-comm; default off)")
    moe_pad_expert_input_to_capacity: bool | None = Field(
        None, description="token-dropping MoE pads the expert inputs to capacity "
        "(--moe-pad-expert-input-to-capacity; default off)")
    cuda_graph_full_iteration: bool | None = Field(
        None, description="the whole step replayed as one CUDA graph (--cuda-graph-scope "
        "full_iteration; default off)")
    # MoE routing imbalance, hybrid sharding and offload (perfmodel.moe.imbalance,
    # perfmodel.comm.hsdp, perfmodel.memory.optimizer_offload)
    moe_imbalance: Annotated[float | None, Cli(min=1.0)] = Field(
        None, description="MoE routing imbalance: tokens of the busiest expert over the mean "
        "(e.g. 1.25; capped at the capacity factor; default: the model's)")
    hsdp_shard: Annotated[int | None, Cli(min=0, limit=(MAX_GPUS, "GPUs"))] = Field(
        None, description="hybrid sharding: ZeRO-3 shard group of N data-parallel ranks, "
        "replicated across dp / N (0: shard over all of dp; default: searched where the "
        "framework runs HSDP)")
    offload: list[OffloadKind] | None = Field(
        None, description="offload to host memory: optimizer, params, activations "
        "(repeatable; none: nothing offloaded, nothing searched; default: searched where the "
        "framework runs it, kept where it wins)")
    optimizer_offload_fraction: Annotated[float | None, Cli(min=0.0, max=1.0)] = Field(
        None, description="share of the optimizer states on the host with --offload optimizer "
        "(default 1)")
    # the whole run (perfmodel.run): a run section in the report and `train` in --json
    train_tokens: Annotated[float | None, Cli(min=1.0)] = Field(
        None, description="tokens of the whole run, e.g. 15.6e12: time to train, GPU-hours, "
        "energy, cost, interruptions, checkpoints, goodput")
    train_steps: Annotated[int | None, Cli(min=1)] = Field(
        None, description="steps of the whole run (instead of --train-tokens)")
    gpu_hour_price: Annotated[float | None, Cli(min=0.0)] = Field(
        None, description="price of one GPU-hour for the run's cost (default: the cluster "
        "file's gpu_hour_price)")
    checkpoint_mode: Annotated[Literal["sync", "async"] | None, Cli(("--checkpoint",))] = Field(
        None, description="checkpoint mode of the run: sync (training waits for the storage "
        "write, the default) or async (only the copy to host memory blocks)")
    profile: str | Path | EfficiencyProfile | None = Field(
        None, description="efficiency profile: a shipped one (megatron-2021, megatron-2022, "
        "nemo-24.07, nemo-24.09, bridge-25.x) or a TOML file written by `plan calibrate`")
    num_microbatches: Annotated[int | Sequence[int] | None, Cli(show=False)] = Field(
        None, description="micro-batches per step (derived from the batch if omitted)")
    seed: Annotated[int, Cli(show=False)] = Field(
        0, description="seed of the stochastic strategies (same seed, same answer)")
    evaluator: Annotated[Callable[..., Any] | None, Cli(show=False)] = Field(
        None, description="replaces perfmodel.step.evaluate.evaluate (same signature), e.g. in tests")
    progress: Annotated[Progress | None, Cli(show=False)] = Field(
        None, description="progress(done, total) callback of a long search")

    def __init__(self, **options: Any) -> None:
        """Check ``options`` (one-line SpecError), resolve aliases (``zero``, ``mbs``, ...)."""
        check_options(options, type(self).model_fields)
        super().__init__(**{ALIASES.get(k, k): v for k, v in options.items()})

    @field_validator("*", mode="wrap")
    @classmethod
    def _as_given(cls, value: Any, handler: Any) -> Any:
        """Keep every value as given: :func:`check_options` checks them, nothing coerces."""
        return value

    @classmethod
    def signature(cls) -> inspect.Signature:
        """The keywords of ``search.plan``: model, cluster (required) and training
        positional, every other field keyword-only with its default."""
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter("model", positional), inspect.Parameter("cluster", positional),
                  inspect.Parameter("training", positional, default=None)]
        params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
                   for name, f in cls.model_fields.items()
                   if name not in ("model", "cluster", "training")]
        return inspect.Signature(params)

    def fixed(self) -> dict[str, Any]:
        """The pinned or restricted dimensions (:data:`FIXED_OPTIONS`; None: searched)."""
        return {name: getattr(self, name) for name in FIXED_OPTIONS}


def cli_of(field: Any) -> Cli:
    """The :class:`Cli` marker of a field (the default one when it has none)."""
    return next((m for m in field.metadata if isinstance(m, Cli)), Cli())


# --------------------------------------------------------------------------------------------
# Checks: one-line SpecError naming the option and the value, before any work
def _int_arg(name: str, v: Any, lo: int, hi: int) -> int:
    """``v`` as an int in ``[lo, hi]`` or a one-line SpecError naming the argument."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise SpecError(f"{name} = {v!r}: expected an integer in [{lo}, {hi}]")
    if not lo <= int(v) <= hi:
        raise SpecError(f"{name} = {int(v)}: expected an integer in [{lo}, {hi}]")
    return int(v)


def _check_search(options: Mapping[str, Any]) -> None:
    """``top``, ``seed`` and ``strategy``."""
    _int_arg("top", options.get("top", 10), 1, MAX_TOP)
    _int_arg("seed", options.get("seed", 0), 0, MAX_SEED)
    if options.get("max_configurations") is not None:
        _int_arg("max_configurations", options["max_configurations"], 0, MAX_COUNT)
    strategy = options.get("strategy", "grid")
    if not isinstance(getattr(strategy, "value", strategy), str) and (
        not callable(getattr(strategy, "run", None))
    ):
        raise SpecError(
            f"strategy = {strategy!r}: expected one of {', '.join(STRATEGIES)} or an object "
            "with run(problem, seed, progress)"
        )


def _check_setup(options: Mapping[str, Any]) -> None:
    """The counts and the names of the training setup and the evaluation."""
    for name in ("gpus", "global_batch_size", "seq_len"):
        if options.get(name) is not None:
            _int_arg(name, options[name], 1, MAX_COUNT)
    for name in ("precision", "optimizer", "objective", "kernels", "pareto_objectives"):
        v = options.get(name, PlanRequest.model_fields[name].default)
        if (v is not None or name in ("objective", "kernels")) and not isinstance(
                getattr(v, "value", v), str):
            raise SpecError(f"{name} = {v!r}: expected a string")


def _check_layout(options: Mapping[str, Any]) -> None:
    """``stage_layers`` (positive) and ``stage_recompute_layers`` (non-negative) are lists of
    integers; the recompute counts need the layer counts, one per rank."""
    lay, rec = options.get("stage_layers"), options.get("stage_recompute_layers")
    for name, value, lo in (("stage_layers", lay, 1), ("stage_recompute_layers", rec, 0)):
        if value is None:
            continue
        if isinstance(value, (str, bytes)) or not isinstance(
                value, (list, tuple, range, np.ndarray)) or len(value) == 0:
            raise SpecError(f"{name} = {value!r}: expected a list of integers, one per "
                            "pipeline rank")
        for v in value:
            _int_arg(name, v, lo, MAX_COUNT)
    if rec is not None and (lay is None or len(rec) != len(lay)):
        raise SpecError(f"stage_recompute_layers = {list(rec)}: needs stage_layers with as "
                        f"many entries (got {None if lay is None else list(lay)})")


def _check_fixed(options: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
    """Pinned dimensions (and any name that is no field: refused as a dimension) are
    integers, or lists of them; names and flags are checked against their tables later."""
    for name, value in options.items():
        if name in fields and name not in FIXED_OPTIONS or value is None or name in (
                "sequence_parallel", "sp", "recompute", "schedule", "cp_comm"):
            continue
        items = (list(value) if isinstance(value, (list, tuple, range, set, np.ndarray))
                 else [value])
        for v in items:
            _int_arg(name, v, 0 if name in ("zero_stage", "zero") else 1, MAX_COUNT)
    unknown = sorted({ALIASES.get(k, k) for k in options} - set(fields))
    if unknown:
        raise SpecError(
            f"unknown parallel dimension {unknown[0]!r}: expected one of "
            f"{', '.join(SEARCH_DIMS)}, num_microbatches"
        )


def check_options(options: Mapping[str, Any], fields: Mapping[str, Any] | None = None) -> None:
    """Refuse bad options with one line (``SpecError``), before any work: wrong types
    (``gpus='64'``, ``top=2.5``, ``strategy=123``), out-of-range values (``seed=-1``), counts
    beyond int64-safe arithmetic (``tp=10**19``) and names that are not in ``fields`` (default:
    the fields of :class:`PlanRequest`)."""
    _check_search(options)
    _check_setup(options)
    _check_layout(options)
    _check_fixed(options, PlanRequest.model_fields if fields is None else fields)
