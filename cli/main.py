"""The ``plan`` command line (typer + rich). No arithmetic here: the options are generated
from the fields of :class:`PlanCommand` (the :class:`search.request.PlanRequest` fields, which
are the keywords of :func:`search.api.plan`, and where the report goes), and the printed
numbers come from the :class:`SearchResult`.

``plan [OPTIONS]`` runs the planner (with no options: GPT-3 175B on 1024 A100-80GB).
Subcommands (``plan realtime SPEC``, ``plan validate``, ``plan verify``, ``plan sweep``) live in
other modules: add ``"name": "module:function"`` to :data:`SUBCOMMANDS`; the module is imported
when the subcommand is invoked or listed (``plan --help``), not when the planner runs (click's
lazily loading group: validation, sweep and their libraries stay out of ``plan [OPTIONS]``).
``plan [OPTIONS]`` with no subcommand name runs the planner (a typer callback with
``invoke_without_command=True``).

Exit status: 0 on success, 2 on any user error or when nothing fits (one line on stderr).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.progress import BarColumn, Progress, TimeElapsedColumn
from rich.table import Table
from typer._click.exceptions import BadParameter, ClickException, UsageError
from typer.core import TyperGroup
from typer.main import get_command_from_info
from typer.models import CommandInfo

from emit.launch import (
    FORMAT_FRAMEWORK,
    FORMATS,
    check_outputs,
    launch_from_result,
    plan_inputs,
    write_emit_dir,
)
from hardware_specs import list_presets
from perfmodel.compute.layer import sustained_calibration
from perfmodel.core import units
from perfmodel.core.errors import SpecError
from perfmodel.core.files import atomic_write
from perfmodel.parallel.layers import stage_layer_table
from perfmodel.spec.specs import format_validation_error, load_cluster
from perfmodel.step.evaluate import MFU_CONVENTION
from search import api
from search.request import Cli, PlanRequest, cli_of
from search.space import SEARCH_DIMS
from search.train import run_lines
from validation.evidence import calibration_evidence, evidence_line

__all__ = ["SUBCOMMANDS", "app", "main"]

#: Subcommands: name -> "module:function" (a typer command function), imported when used.
SUBCOMMANDS: dict[str, str] = {
    "realtime": "cli.realtime:realtime",
    "validate": "cli.validate:validate_command",
    "verify": "cli.verify:verify_cmd",
    "calibrate": "validation.calibrate:calibrate_command",
    "calibrate-links": "validation.nccl_tests:calibrate_links_command",
    "sweep": "sweep.cli:sweep_cmd",
}

def _raw_value(argv: list[str], param: Any) -> str | None:
    """The text the user gave an option (its last occurrence in ``argv``), if any."""
    names = [*param.opts, *param.secondary_opts]
    value = None
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.split("=", 1)[0] in names and "=" in arg:
            value = arg.split("=", 1)[1]
    return value


def _expected(param: Any) -> str | None:
    """What an option takes, from its parsed type and bounds: "a whole number from 0 to 3",
    "one of grid, dp, nsga2, ga"; None for other types."""
    t = param.type_descriptor.annotation
    if isinstance(t, type) and issubclass(t, Enum):
        return "one of " + ", ".join(m.value for m in t)
    if t not in (int, float):
        return None
    what = "a whole number" if t is int else "a number"
    if param.min is not None and param.max is not None:
        return f"{what} from {param.min} to {param.max}"
    if param.min is not None:
        return f"{what} of at least {param.min}"
    return what if param.max is None else f"{what} of at most {param.max}"


def _usage_line(e: Any, argv: list[str]) -> str:
    """One line for a command-line value the parser refused:
    ``--gpus 'abc': expected a whole number``; otherwise the parser's own message."""
    param = e.param if isinstance(e, BadParameter) else None
    if param is not None and getattr(param, "type_descriptor", None) is not None:
        value, expected = _raw_value(argv, param), _expected(param)
        if value is not None and expected is not None:
            return f"{param.opts[0]} {value!r}: expected {expected}"
    return " ".join(e.format_message().split())


class _OneLineError(ClickException):
    """A usage error shown as ``plan: error: <message>`` on stderr (exit status 2)."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        typer.echo(f"plan: error: {self.message}", err=True)


@contextmanager
def _one_line_usage(argv: list[str]) -> Iterator[None]:
    try:
        yield
    except UsageError as e:
        raise _OneLineError(_usage_line(e, argv)) from None


class _PlanGroup(TyperGroup):
    """The ``plan`` command group: a value the parser refuses (a non-number, an unknown name,
    a count out of range, an unknown option) ends in one line and exit status 2, for the
    planner's options and every subcommand's."""

    def make_context(self, info_name: Any, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        argv = list(args)
        with _one_line_usage(argv):
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        ctx.meta["plan.argv"] = argv
        return ctx

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage(ctx.meta.get("plan.argv", [])):
            return super().invoke(ctx)

    def list_commands(self, ctx: Any) -> list[str]:
        """The commands registered on :data:`app`, then those of :data:`SUBCOMMANDS`."""
        names = list(super().list_commands(ctx))
        return names + [n for n in SUBCOMMANDS if n not in names]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """A registered command, or the :data:`SUBCOMMANDS` entry, imported now (None when
        its module does not exist)."""
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in SUBCOMMANDS:
            cmd = _load_subcommand(cmd_name)
            if cmd is not None:
                self.add_command(cmd, cmd_name)
        return cmd


def _load_subcommand(name: str) -> Any:
    """The click command of ``SUBCOMMANDS[name]``, built as ``app.command(name)`` would build
    it; None when its module is not there."""
    module, func = SUBCOMMANDS[name].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:  # not written yet: skip
            return None
        raise
    return get_command_from_info(CommandInfo(name=name, callback=getattr(mod, func)),
                                 pretty_exceptions_short=app.pretty_exceptions_short,
                                 rich_markup_mode=app.rich_markup_mode)


app = typer.Typer(
    cls=_PlanGroup,
    name="plan",
    help="Plan parallel training of a transformer on a GPU cluster: predict step time, MFU, "
    "memory and communication, and search dp/tp/pp/vp/cp, ZeRO, micro-batches, recompute.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=False,
)


class PlanCommand(PlanRequest):
    """The ``plan`` command's options: every :class:`PlanRequest` field, then where the report
    goes (these last ones are no options of :func:`search.plan`)."""

    json_out: Annotated[bool, Cli(("--json",))] = Field(
        False, description="one JSON document on stdout")
    csv: str | None = Field(None, description="write the top-k table to this CSV file")
    list_presets: Annotated[bool, Cli(("--list",))] = Field(
        False, description="list every preset and exit")
    emit: Literal[FORMATS] | None = Field(
        None, description="print only the best configuration's launch settings for this "
        "framework on stdout (the report goes to stderr)")
    emit_dir: str | None = Field(
        None, description="write the launch settings of every framework into this folder "
        "(megatron.args, bridge.yaml, torchtitan.toml, deepspeed.json)")


# --------------------------------------------------------------------------------------------
# Options from the fields of a request model
def _flag(name: str, field: FieldInfo) -> str:
    """The option's name in messages: ``--global-batch`` for ``global_batch_size``."""
    flags = cli_of(field).flags
    return flags[0].split("/")[0] if flags else "--" + name.replace("_", "-")


def _cli_type(name: str, field: FieldInfo) -> Any:
    """The type the command line parses: text for a quantity with a unit, else the first type
    of the field's union; names (a Literal) become a str Enum of them."""
    if cli_of(field).quantity or cli_of(field).int_list:
        return str
    t = field.annotation
    if get_origin(t) in (Union, UnionType):
        t = next(a for a in get_args(t) if a is not type(None))
    if get_origin(t) is list and get_origin(get_args(t)[0]) is Literal:  # a repeatable name
        names = get_args(get_args(t)[0])
        return list[Enum(name.title().replace("_", ""), {n: n for n in names}, type=str)]
    if get_origin(t) is Literal:
        names = get_args(t)
        t = Enum(name.title().replace("_", ""), {n: n for n in names}, type=str)
    return t


def _option(name: str, field: FieldInfo) -> inspect.Parameter:
    """A typer option of a request field: its flags, type, default, bounds and help text."""
    cli = cli_of(field)
    t = _cli_type(name, field)
    default = field.default
    if isinstance(t, type) and issubclass(t, Enum) and default is not None:
        default = t(default)
    option = typer.Option(*cli.flags, help=field.description, min=cli.min, max=cli.max)
    annotation = Annotated[t if default is not None else t | None, option]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)


def command_signature(model: type[PlanRequest]) -> inspect.Signature:
    """The signature typer reads: the context, then one option per shown field of ``model``."""
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                            annotation=typer.Context)
    return inspect.Signature([ctx, *(_option(n, f) for n, f in model.model_fields.items()
                                     if cli_of(f).show)])


def check_bounds(options: dict[str, Any]) -> None:
    """One-line error for a count option outside [min, limit] (min: the field's, else 1; the
    limit is named)."""
    for name, field in PlanCommand.model_fields.items():
        limit, least = cli_of(field).limit, cli_of(field).min
        v = options.get(name)
        if limit is None or v is None:
            continue
        flag = _flag(name, field)
        if least is not None and v < least:
            _fail(f"{flag} {v}: expected an integer >= {least:g}")
        if least is None and v < 1:
            _fail(f"{flag} {v}: expected a positive integer")
        if v > limit[0]:
            _fail(f"{flag} {v}: above the limit of {limit[0]:,} {limit[1]}")


def _launches(result: Any, model: str, plan_kwargs: dict[str, Any], alternatives: bool,
              formats: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Launch settings of the best configuration per format (see :mod:`emit.launch`); a refused
    format gets the best configuration of a search restricted to its framework."""

    def replan(framework: str, precision: str) -> Any:
        kw = {k: v for k, v in plan_kwargs.items() if k not in SEARCH_DIMS}
        kw.update(framework=framework, precision=precision, top=1, progress=None)
        return api.plan(**kw)

    return launch_from_result(result, model, formats or FORMATS,
                              framework=plan_kwargs.get("framework"),
                              replan=replan if alternatives else None)


def _fail(message: str) -> None:
    typer.echo(f"plan: error: {message}", err=True)
    raise typer.Exit(2)


class _LazyProgress:
    """A rich progress bar on stderr that appears only once a search has run ~1 s."""

    def __init__(self, console: Console, delay_s: float = 1.0) -> None:
        self.console, self.delay_s = console, delay_s
        self.t0 = time.perf_counter()
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.perf_counter() - self.t0 < self.delay_s:
                return
            self.bar = Progress("searching", BarColumn(), "{task.percentage:>3.0f}%",
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("search", total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _config_line(c: dict[str, Any]) -> str:
    line = (f"dp={c['dp']} tp={c['tp']} pp={c['pp']} vp={c['vp']} cp={c['cp']} "
            f"zero={c['zero_stage']} mbs={c['micro_batch_size']} m={c['num_microbatches']} "
            f"recompute={c['recompute']} sp={'on' if c['sequence_parallel'] else 'off'} "
            f"schedule={c['schedule']}"
            + (f" ep={c['ep']} etp={c['etp']}" if _is_moe_row(c) else "")
            + (f" cp_comm={c.get('cp_comm', 'p2p')}" if c["cp"] > 1 else "")
            + (f" (a2a {c['cp_a2a']} x p2p {c['cp'] // c['cp_a2a']})" if c.get("cp_a2a") else ""))
    layout = [f"{k}={c[k]}" for k in ("first_stage_layers", "last_stage_layers") if c.get(k)]
    layout += [k for k in ("embedding_as_layer", "loss_as_layer") if c.get(k)]
    return line + (" " + " ".join(layout) if layout else "")


_CP_COMM_WHAT = {
    "a2a": "exposed: the all-to-alls around attention (Ulysses)",
    "allgather": "exposed: K/V all-gather, dK/dV reduce-scatter",
    "a2a+p2p": "exposed: inner all-to-alls, outer ring's rest",
}


def _cp_cell(c: dict[str, Any]) -> str:
    """The cp column: the degree, and the cp_comm type where it is not the ring (p2p)."""
    a2a = c["cp"] > 1 and c.get("cp_comm", "p2p") != "p2p"
    return f"{c['cp']} {c['cp_comm']}" if a2a else str(c["cp"])


def _is_moe_row(c: dict[str, Any]) -> bool:
    """Whether a configuration uses expert parallelism (MoE): shows the ep / etp columns."""
    return c.get("ep", 1) > 1 or c.get("etp", c["tp"]) != c["tp"]


def _stage_layout_line(c: dict[str, Any], num_layers: int) -> str | None:
    """'layers per stage 15 16 ... 15 (chunks of rank 0: 1 2 ...)' for an uneven layout."""

    if c.get("stage_layers"):  # a per-stage layout of the DP searcher (search/dp.py)
        line = f"  layers per pipeline rank: {' '.join(str(n) for n in c['stage_layers'])}"
        if c.get("stage_recompute_layers"):
            line += (" (recomputed: "
                     f"{' '.join(str(n) for n in c['stage_recompute_layers'])})")
        return line
    if c["pp"] == 1 or num_layers % (c["pp"] * c["vp"]) == 0 and not any(
            c.get(k) for k in ("first_stage_layers", "last_stage_layers", "embedding_as_layer",
                               "loss_as_layer")):
        return None
    t = stage_layer_table(num_layers, c["pp"], c["vp"], c.get("first_stage_layers") or 0,
                          c.get("last_stage_layers") or 0, bool(c.get("embedding_as_layer")),
                          bool(c.get("loss_as_layer")))
    ranks = " ".join(str(int(x)) for x in t.sum(axis=1))
    line = f"  layers per pipeline rank: {ranks}"
    if c["vp"] > 1:
        line += (f" (chunks of rank 0: {' '.join(str(int(x)) for x in t[0])}; of rank "
                 f"{c['pp'] - 1}: {' '.join(str(int(x)) for x in t[-1])})")
    return line


_UNITS_S = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
_UNITS_B = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 1e3, "mb": 1e6,
            "gb": 1e9, "tb": 1e12, "b": 1.0}


def _quantity(text: str | None, units_: dict[str, float], option: str, default_unit: str
              ) -> float | None:
    """'20s' -> 20.0, '70GiB' -> 70 * 2**30 (a bare number takes ``default_unit``)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = (m.group(2) or default_unit).lower() if m else ""
    if not m or unit not in units_ or not 0 < float(m.group(1)) * units_[unit] < float("inf"):
        _fail(f"{option} {text!r}: expected a finite positive number with a unit "
              f"({', '.join(k for k in units_ if k != 'b')})")
    return float(m.group(1)) * units_[unit]


_SWITCH_NAMES = {"overlap_grad_reduce": "grad-reduce", "overlap_tp_comm": "tp-comm",
                 "overlap_p2p_comm": "p2p-comm"}
_FIELD_NAMES = {"seq_len": "sequence {v}", "global_batch_size": "global batch {v}",
                "precision": "precision {v}", "optimizer": "optimizer {v}",
                "overlap_grad_reduce": "overlap-grad-reduce {v}",
                "overlap_tp_comm": "overlap-tp-comm {v}", "overlap_p2p_comm": "overlap-p2p-comm {v}",
                "flash_attention": "flash attention {v}", "zero3_gather": "zero3-gather {v}",
                "grad_reduce_in_fp32": "gradient buffer {v}",
                "attention_backend": "attention kernel {v}", "cross_entropy": "loss kernel {v}",
                "fp8_params": "fp8 weights {v}", "recompute_modules": "selective recompute of {v}"}


def _shown(k: str, v: Any) -> Any:
    """A setup value as the header shows it."""
    if k == "grad_reduce_in_fp32":
        return "fp32" if v else "16-bit"
    if isinstance(v, (list, tuple)):
        return "+".join(map(str, v)) or "none"
    return ("on" if v else "off") if isinstance(v, bool) else v


def _recompute_words(s: dict[str, Any]) -> str:
    """'recompute full' (pinned) or 'recompute searched over none/selective/full'."""
    r = list(s.get("recompute_searched") or [])
    return f"recompute {r[0]}" if len(r) == 1 else f"recompute searched over {'/'.join(r)}"


def _stack_line(s: dict[str, Any]) -> str:
    """The header's first setup line: the stack planned for, and every default that moves the
    answer (overlaps, attention kernel, gradient buffer, loss kernel, recompute searched)."""
    sw = s.get("training_switches") or {}
    on = [_SWITCH_NAMES[k] for k in _SWITCH_NAMES if sw.get(k)]
    fw = s.get("framework")
    why = s.get("framework_source")
    stack = (f"framework {fw}" + (" (the GPU's default release)" if why else "")) if fw else (
        "framework (none: default switches)")
    attention = (f"on ({sw.get('attention_backend', 'cudnn')} kernel)" if sw.get("flash_attention")
                 else "off (s^2 scores stored)")
    return (f"assumed setup: {stack}; overlap {', '.join(on) or 'none'}; flash attention {attention}; "
            f"gradient buffer {_shown('grad_reduce_in_fp32', sw.get('grad_reduce_in_fp32', True))}"
            f"; loss {sw.get('cross_entropy', 'fp32')}; {_recompute_words(s)} (selective: "
            f"{_shown('recompute_modules', sw.get('recompute_modules') or ())})"
            f"{'; profile ' + s['profile'] if s.get('profile') else ''}")


def assumed_lines(s: dict[str, Any]) -> list[str]:
    """The report header's "assumed setup": the stack and the switches in force, then every
    value the user did not give, grouped by where it came from."""
    sw = s.get("training_switches") or {}
    lines = [_stack_line(s)]
    values = {**{k: s.get(k) for k in ("seq_len", "global_batch_size", "precision",
                                         "optimizer")}, **sw}
    by_source: dict[str, list[str]] = {}
    for k, src in (s.get("assumed") or {}).items():
        if k == "framework":  # on the first line
            continue
        shown = _shown(k, values.get(k))
        by_source.setdefault(src, []).append(_FIELD_NAMES.get(k, k + " {v}").format(v=shown))
    for src, fields in by_source.items():
        lines.append(f"  {', '.join(fields)}: {src}")
    return lines


def model_line(s: dict[str, Any]) -> str | None:
    """The model as read, one line: parameters total / active, layers, hidden size, heads /
    KV groups, experts and top-k (:func:`search.result.model_summary`)."""
    m = s.get("model_summary")
    if not m:
        return None
    line = (f"model as read: {units.fmt_count(m['params_total'])} parameters "
            f"({units.fmt_count(m['params_active'])} active per token), {m['num_layers']} layers,"
            f" hidden {m['hidden_size']}, {m['num_attention_heads']} heads / {m['kv_heads']} KV "
            "groups")
    if m["num_experts"] > 1:
        line += f", {m['num_experts']} experts, top-{m['moe_top_k']}"
    return line


def term_note(name: str, value: float, row: dict[str, Any], s: dict[str, Any]) -> str:
    """What a step-time term is for this configuration: the communication terms are what
    overlap leaves exposed; a zero says why it is zero."""
    c = row["config"]
    sw = s.get("training_switches") or {}
    zero_time = value <= 0.0
    if name == "bubble":
        return "pp = 1: no pipeline" if c["pp"] == 1 else "pipeline fill and drain"
    if name == "tp_comm":
        if c["tp"] == 1:
            return "tp = 1: none"
        return ("exposed: what the GEMM overlap leaves" if sw.get("overlap_tp_comm")
                else "exposed (no TP overlap)")
    if name == "cp_comm":
        if c["cp"] == 1:
            return "cp = 1: none"
        return _CP_COMM_WHAT.get(c.get("cp_comm", "p2p"), "exposed: what ring attention leaves")
    if name == "pp_comm":
        if c["pp"] == 1:
            return "pp = 1: none"
        return ("exposed: fill and drain sends (p2p overlapped)" if sw.get("overlap_p2p_comm")
                else "exposed: every send (p2p not overlapped)")
    if name == "dp_comm":
        if c["dp"] == 1:
            return "dp = 1: none"
        if sw.get("overlap_grad_reduce"):
            return ("hidden behind the backward (overlapped)" if zero_time else
                    "exposed: what the last backward does not hide")
        return "exposed: after the flush (no overlap)"
    if name == "ep_comm":
        if c.get("ep", 1) == 1 and c.get("etp", c["tp"]) == c["tp"]:
            return "ep = 1: no token dispatch"
        return ("exposed: what the MoE overlap leaves" if sw.get("overlap_moe_comm")
                else "exposed: token dispatch and combine (no overlap)")
    if name == "zero3_comm":
        if c["zero_stage"] != 3:
            return f"ZeRO-{c['zero_stage']}: no parameter gathers"
        if sw.get("overlap_grad_reduce"):
            return ("hidden: the gathers are prefetched behind compute" if zero_time else
                    "exposed: gathers longer than the compute they overlap")
        return "exposed: gathers not overlapped"
    if name == "overlap_slowdown":
        return "compute slowed by the communication it hides"
    if name == "link_shared":
        return ("the streams sharing each link fit in the step" if zero_time else
                "exposed: a link's streams together exceed the step")
    return ""


def _evidence_key(s: dict) -> tuple[str, str | None, str | None, bool | None]:
    """(GPU, framework, precision, MoE) of a plan: its evidence is of the same precision class
    and the same kind of model."""
    m = s.get("model_summary")
    return (s["gpu"], s.get("framework"), s.get("precision"),
            None if not m else m["num_experts"] > 1)


def _calibration_evidence(s: dict) -> dict | None:
    """:func:`validation.evidence.calibration_evidence` of a result's setup (None if unreadable)."""
    try:
        return calibration_evidence(*_evidence_key(s))
    except (SpecError, OSError, KeyError, ValueError):
        return None


def _calibration_line(s: dict) -> str:
    """The published runs the plan's kernel efficiency is calibrated on
    (:func:`validation.evidence.calibration_evidence`), one line; empty if it cannot be read."""
    try:
        ev = calibration_evidence(*_evidence_key(s))
        source = ""
        if not ev["groups"]:

            source = sustained_calibration(load_cluster(s["cluster"]).gpu).source
        return evidence_line(ev, source)
    except (SpecError, OSError, KeyError, ValueError):
        return ""


def _interval_text(row: dict) -> str:
    """`` (15.1-17.9)``: the step time's 80 % interval in the unit :func:`units.fmt_seconds`
    prints the step time in ('' without one)."""
    iv = row.get("step_time_interval_s")
    if not iv:
        return ""
    step = abs(row["step_time_s"])
    scale = 1.0 if step >= 1.0 else 1e3 if step >= 1e-3 else 1e6
    return f" ({_sig3(iv[0] * scale)}-{_sig3(iv[1] * scale)})"


def _sig3(value: float) -> str:
    """Three significant digits, trailing zeros kept and no bare point: 15.10 -> '15.1',
    2.0 -> '2.00', 205.0 -> '205'."""
    return f"{value:#.3g}".rstrip(".")


def _print_best(out: Console, r: Any, plan_kwargs: dict[str, Any] | None = None) -> None:
    row = r.best_row
    s = r.setup
    title = "configuration" if r.strategy == "single" else "best configuration"
    out.print(f"[bold]{s['model']}[/] on {s['gpus']} x {s['gpu']} ({s['cluster']}), global batch "
              f"{s['global_batch_size']} x {s['seq_len']} tokens, {s['precision']}, "
              f"{s['optimizer']}, {s['kernels']} kernels"
              + (f", for {s['framework']}" if s.get("framework") else "")
              + (f" ({s['framework_source']})" if s.get("framework_source") else ""),
              soft_wrap=True)
    described = model_line(s)
    if described:
        out.print(described, soft_wrap=True)
    for line in assumed_lines(s):
        out.print(line, soft_wrap=True)
    used = f" ({row['gpus']} of {s['gpus']} GPUs used)" if row["gpus"] != s["gpus"] else ""
    out.print(f"\n[bold]{title}:[/] {_config_line(row['config'])}{used}")
    out.print(f"  step time {units.fmt_seconds(row['step_time_s'])}{_interval_text(row)}   "
              f"{units.fmt_count(row['tokens_per_s'])} tokens/s   MFU {row['mfu']:.1%}   "
              f"HFU {row['hfu']:.1%}   peak memory {units.fmt_bytes(row['memory_bytes']['peak'])}"
              f" of {units.fmt_bytes(r.usable_bytes or r.hbm_bytes)} usable (HBM "
              f"{units.fmt_bytes(r.hbm_bytes)} less reserve less {r.memory_headroom:.0%} "
              "headroom)")
    layout = _stage_layout_line(row["config"], s.get("num_layers", 0)) if s.get(
        "num_layers") else None
    if layout:
        out.print(layout)
    if s.get("interval"):
        out.print(f"  {s['interval']}", soft_wrap=True)
    if plan_kwargs is not None and r.strategy != "single":
        out.print(f"  pin it: {pin_command(row, s, plan_kwargs)}", soft_wrap=True,
                  markup=False)
    evidence = _calibration_line(s)
    if evidence:
        out.print(f"  {evidence}", soft_wrap=True)
    for line in s.get("kernel_tables") or ():
        out.print(f"  {line}", soft_wrap=True, markup=False)
    b = r.breakdown(0)
    t = Table(title="step time (communication rows: the part overlap leaves exposed)",
              title_justify="left")
    t.add_column("term")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    t.add_column("what it is")
    for name, v, share in b["time"]:
        t.add_row(name, units.fmt_seconds(v), f"{share:.1%}", term_note(name, v, row, s))
    m = Table(title="memory per GPU (GiB = 2^30 bytes)", title_justify="left")
    m.add_column("term")
    m.add_column("bytes", justify="right")
    m.add_column("of HBM", justify="right")
    for name, v, share in b["memory"]:
        m.add_row(name, units.fmt_bytes(v), f"{share:.1%}")
    c = Table(title="communication volume", title_justify="left")
    c.add_column("group")
    c.add_column("bytes per GPU per step", justify="right")
    for name, v, _ in b["comm"]:
        c.add_row(name, units.fmt_bytes(v))
    busy = row.get("link_busy_s", {})
    lk = Table(title="link busy per step (all streams sharing each tier's port)",
               title_justify="left")
    lk.add_column("tier")
    lk.add_column("busy", justify="right")
    lk.add_column("of step", justify="right")
    for name, v in busy.items():
        lk.add_row(name, units.fmt_seconds(v), f"{v / row['step_time_s']:.1%}")
    out.print(t)
    out.print(m)
    out.print(c)
    if busy:
        out.print(lk)
    out.print(f"  {MFU_CONVENTION}")
    for w in s.get("warnings") or ():
        out.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    for w in s.get("searched") or ():  # HSDP and offload tried (search.host_sharding)
        out.print(f"  searched: {w}", soft_wrap=True)
    for d in r.diagnostics:
        out.print(f"[yellow]warning:[/] {d.message}")


#: Request fields a pinning command leaves out: the search's own settings, which do not
#: change a pinned configuration's prediction, and the API-only ones.
_NOT_PINNED = ("strategy", "objective", "pareto_objectives", "top", "seed", "progress",
               "evaluator", "max_step_time_s", "max_memory_bytes", "num_microbatches")


def _option_words(name: str, value: Any) -> list[str]:
    """``--flag value`` (or the switch ``--flag`` / ``--no-flag``) of one request field."""
    field = PlanCommand.model_fields[name]
    flags = cli_of(field).flags
    flag = flags[0] if flags else "--" + name.replace("_", "-")
    if isinstance(value, bool):
        on, _, off = flag.partition("/")
        return [on if value else (off or "--no-" + on.removeprefix("--"))]
    if isinstance(value, (list, tuple)) and cli_of(field).int_list:
        value = ",".join(str(int(v)) for v in value)
    elif isinstance(value, (list, tuple)):  # a repeatable option: --offload a --offload b
        return [w for v in value for w in (flag, str(getattr(v, "value", v)))]
    return [flag, str(getattr(value, "value", value))]


def pin_options(row: dict[str, Any], setup: dict[str, Any],
                plan_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The :func:`search.plan` keywords that pin ``row``: every option the user gave (but the
    search's own settings), the training setup as resolved, and every parallel dimension with
    the per-stage layout; :func:`search.plan` of them evaluates this one configuration."""
    c = row["config"]
    given = {k: v for k, v in plan_kwargs.items()
             if v is not None and k not in (*_NOT_PINNED, *SEARCH_DIMS, "stage_layers",
                                             "stage_recompute_layers")
             and v != PlanRequest.model_fields[k].default}
    pins = {"model": plan_kwargs.get("model", setup["model"]),
            "cluster": plan_kwargs.get("cluster", setup["cluster"]),
            "gpus": setup["gpus"], "global_batch_size": setup["global_batch_size"],
            "seq_len": setup["seq_len"], "precision": setup["precision"],
            "optimizer": setup["optimizer"]}
    if setup.get("framework") and not given.get("framework"):
        pins["framework"] = setup["framework"]
    searched = setup.get("training_switches", {})  # what the HSDP / offload search picked
    if searched.get("offload") and given.get("offload") is None:
        pins["offload"] = list(searched["offload"])
    if searched.get("hsdp_shard") and given.get("hsdp_shard") is None:
        pins["hsdp_shard"] = searched["hsdp_shard"]
    dims = {d: c[d] for d in SEARCH_DIMS if d in c and d not in ("ep", "etp", "cp_comm")}
    if c.get("cp", 1) > 1 and "cp_comm" in c:  # searched where cp > 1
        dims["cp_comm"] = c["cp_comm"]
    if _is_moe_row(c) or setup.get("model_summary", {}).get("num_experts", 1) > 1:
        dims.update(ep=c["ep"], etp=c["etp"])
    if c.get("stage_layers"):
        dims["stage_layers"] = list(c["stage_layers"])
        if c.get("stage_recompute_layers"):
            dims["stage_recompute_layers"] = list(c["stage_recompute_layers"])
    return {**given, **pins, **dims}


def pin_command(row: dict[str, Any], setup: dict[str, Any],
                plan_kwargs: dict[str, Any]) -> str:
    """The ``plan ...`` command line whose output is exactly ``row``'s prediction."""
    return command_line(pin_options(row, setup, plan_kwargs))


def command_line(options: dict[str, Any]) -> str:
    """The ``plan ...`` command line of :func:`search.plan` keywords (files and names, not spec
    objects; the search's own settings, :data:`_NOT_PINNED`, left out)."""
    words = ["plan"]
    for name, value in options.items():
        if name not in _NOT_PINNED and value is not None:
            words += _option_words(name, value)
    return shlex.join(words)


def _print_pareto(out: Console, r: Any) -> None:
    """The Pareto front, fastest first: the step's (step time, peak memory, GPUs), or the
    run's (time to train, cost: ``--pareto-objectives time-to-train-cost``); with the run's
    length, each row's days, GPU-hours and cost."""
    run_view = "pareto_objectives" in r.extra
    train = bool(r.pareto_rows) and "train" in r.pareto_rows[0]
    title = ("finishes sooner and costs less at once" if run_view else
             "is faster, smaller and on fewer GPUs at once")
    t = Table(title=f"Pareto front: {len(r.pareto_rows)} configurations none of which {title}",
              title_justify="left")
    extra_cols = ["days", "GPU-hours", "cost"] if train else []
    for col in ("#", "dp", "tp", "pp", "vp", "cp", "zero", "mbs", "recompute", "sp", "sched",
                "GPUs", "step", "MFU", "peak mem", *extra_cols):
        t.add_column(col, justify="left" if col in ("recompute", "sched") else "right")
    for i, row in enumerate(r.pareto_rows):
        c = row["config"]
        tr = row.get("train") or {}
        run_cells = [f"{tr['days']:.1f}", f"{tr['gpu_hours']:,.0f}",
                     "-" if tr["cost"] is None else f"{tr['cost']:,.0f}"] if train else []
        t.add_row(str(i + 1), str(c["dp"]), str(c["tp"]), str(c["pp"]), str(c["vp"]),
                  _cp_cell(c), str(c["zero_stage"]), str(c["micro_batch_size"]),
                  c["recompute"], "on" if c["sequence_parallel"] else "off", c["schedule"],
                  str(row["gpus"]), units.fmt_seconds(row["step_time_s"]), f"{row['mfu']:.1%}",
                  units.fmt_bytes(row["memory_bytes"]["peak"]), *run_cells)
    out.print(t)


def _print_top(out: Console, r: Any, gpus_column: bool = False) -> None:
    t = Table(title=f"top {len(r.rows)} by {r.objective}", title_justify="left")
    moe = any(_is_moe_row(row["config"]) for row in r.rows)
    expert_cols = ["ep", "etp"] if moe else []
    cols = ["#", "dp", "tp", "pp", "vp", "cp", *expert_cols, "zero", "mbs", "recompute", "sp", "sched",
            *(["GPUs"] if gpus_column else []), "step", "MFU", "peak mem", "why below #1"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("recompute", "sched", "why below #1")
                     else "right")
    for i, row in enumerate(r.rows):
        c = row["config"]
        expert = (str(c["ep"]), str(c["etp"])) if moe else ()
        t.add_row(str(i + 1), str(c["dp"]), str(c["tp"]), str(c["pp"]), str(c["vp"]),
                  _cp_cell(c), *expert, str(c["zero_stage"]), str(c["micro_batch_size"]),
                  c["recompute"], "on" if c["sequence_parallel"] else "off", c["schedule"],
                  *([str(row["gpus"])] if gpus_column else []),
                  units.fmt_seconds(row["step_time_s"]), f"{row['mfu']:.1%}",
                  units.fmt_bytes(row["memory_bytes"]["peak"]),
                  "" if i == 0 else r.explain(i))
    out.print(t)


def _print_presets(out: Console) -> None:
    for kind in ("model", "cluster", "gpu", "framework", "profile"):
        out.print(f"{kind}s: " + ", ".join(list_presets(kind)), soft_wrap=True)


def _int_list(text: str, option: str) -> tuple[int, ...]:
    """'8,9,9,6' -> (8, 9, 9, 6)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(re.fullmatch(r"[0-9]{1,9}", p) for p in parts):
        _fail(f"{option} {text!r}: expected whole numbers separated by commas, e.g. 8,9,9,6")
    return tuple(int(p) for p in parts)


def _request_value(name: str, value: Any) -> Any:
    """An option's value as :func:`search.plan` takes it: a name as text, a path as text, a
    quantity with a unit in SI units (``--max-memory 70GiB`` -> bytes)."""
    field = PlanRequest.model_fields[name]
    if cli_of(field).int_list and value is not None:
        return _int_list(value, _flag(name, field))
    quantity = cli_of(field).quantity
    if quantity is not None:
        units_ = _UNITS_S if quantity == "s" else _UNITS_B
        return _quantity(value, units_, _flag(name, field), quantity)
    return str(value) if isinstance(value, Path) else value


def _plan_kwargs(options: dict[str, Any], progress: Any) -> dict[str, Any]:
    """The keywords of :func:`search.plan`: every request field the command line has."""
    kwargs = {name: _request_value(name, options[name])
              for name in PlanRequest.model_fields if name in options}
    kwargs["progress"] = progress
    return kwargs


def _run_plan(options: dict[str, Any], progress: Any) -> tuple[dict[str, Any], Any]:
    """(the keywords of :func:`search.plan`, its result); a user error ends the command."""
    try:
        kwargs = _plan_kwargs(options, progress)
        check_outputs(plan_inputs(kwargs), csv=options["csv"], emit_dir=options["emit_dir"])
        return kwargs, api.plan(**kwargs)
    except SpecError as e:
        _fail(str(e))
    except ValidationError as e:
        _fail(format_validation_error(e))
    finally:
        if progress is not None:
            progress.close()


def _write_csv(result: Any, csv: str | None) -> None:
    if csv is not None:
        try:
            atomic_write(csv, result.top.to_csv(index=False))
        except OSError as e:
            _fail(f"--csv {csv}: cannot write: {e.strerror}")


def _write_launches(launches: dict[str, Any], emit_dir: str | None, plan_kwargs: dict[str, Any],
                    err: Console) -> None:
    """Write every launch file into ``emit_dir`` (each atomically; the files of formats this
    plan did not write are removed); say which could not be written."""
    if emit_dir is None:
        return
    try:
        write_emit_dir(emit_dir, launches, plan_inputs(plan_kwargs))
    except SpecError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"--emit-dir {emit_dir}: cannot write: {e.strerror}")
    for L in launches.values():
        if L.text is None:
            err.print(f"plan: {L.file} not written: {L.message()}", soft_wrap=True,
                      highlight=False, markup=False)


def _print_json(result: Any, launches: dict[str, Any], plan_kwargs: dict[str, Any]) -> None:
    doc = result.to_json()
    if result.rows:
        doc["pin_command"] = pin_command(result.best_row, result.setup, plan_kwargs)
    doc["launch"] = {fmt: L.to_json() for fmt, L in launches.items()}
    doc["calibrated_on"] = _calibration_evidence(result.setup)
    typer.echo(json.dumps(doc, indent=2))


def _print_report(out: Console, result: Any, options: dict[str, Any],
                  plan_kwargs: dict[str, Any] | None = None) -> None:
    """The best configuration, the top table (and the Pareto front) and the search's size."""
    _print_best(out, result, plan_kwargs)
    for line in run_lines(result):
        out.print(line, soft_wrap=True, markup=False)
    if result.strategy == "single":
        return
    out.print()
    _print_top(out, result, gpus_column=options["allow_idle_gpus"])
    if result.strategy == "nsga2":
        out.print()
        _print_pareto(out, result)
    out.print(f"searched {result.evaluated:,} configurations ({result.feasible:,} fit in "
              f"memory, {result.space_size:,} in the space before constraints) with "
              f"{result.strategy} in {result.seconds:.2f} s")


def _emit_framework(options: dict[str, Any]) -> str:
    """``--emit X`` without ``--framework`` plans for X's newest shipped preset
    (:data:`emit.launch.FORMAT_FRAMEWORK`), so that the file printed is of the configuration
    the report shows; the report's first line says so ("" when nothing was filled in)."""
    emit = options["emit"]
    if emit is None or options.get("framework") is not None:
        return ""
    options["framework"] = FORMAT_FRAMEWORK[emit]
    return (f"framework {FORMAT_FRAMEWORK[emit]}: --emit {emit} without --framework plans "
            f"for {emit}'s newest preset")


def planner(ctx: typer.Context, **options: Any) -> None:
    """Search (or, with every parallel option given, evaluate) parallel configurations."""
    if ctx.invoked_subcommand is not None:
        return
    options = {k: v.value if isinstance(v, Enum) else v for k, v in options.items()}
    # Tables are wide: when stdout is not a terminal (a pipe, a file, a notebook), do not wrap
    # them at rich's default of 80 columns.
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    if options["list_presets"]:
        _print_presets(out)
        return
    check_bounds(options)
    err = Console(stderr=True)
    json_out, emit = options["json_out"], options["emit"]
    if emit is not None and not json_out:
        # stdout carries only the launch settings (`plan --emit deepspeed > ds.json`)
        out = Console(stderr=True, highlight=False)
    framework_note = _emit_framework(options)
    progress = _LazyProgress(err) if err.is_terminal and not json_out else None
    plan_kwargs, result = _run_plan(options, progress)
    if not result.fits_any:
        _fail(result.why_nothing_fits())
    _write_csv(result, options["csv"])
    want_alt = emit is not None or options["emit_dir"] is not None
    try:
        launches = _launches(result, options["model"], plan_kwargs, want_alt) if (
            json_out or want_alt) else {}
    except SpecError as e:
        _fail(str(e))
    _write_launches(launches, options["emit_dir"], plan_kwargs, err)
    if json_out:
        _print_json(result, launches, plan_kwargs)
        return
    if framework_note:
        out.print(framework_note, soft_wrap=True, markup=False)
    for w in result.setup.get("warnings") or ():
        typer.echo(f"plan: warning: {w}", err=True)
    if emit is not None and launches[emit].text is None:
        _fail(launches[emit].message())
    _print_report(out, result, options, plan_kwargs)
    if emit is not None:
        typer.echo(launches[emit].text, nl=False)


planner.__signature__ = command_signature(PlanCommand)  # type: ignore[attr-defined]
app.callback(invoke_without_command=True)(planner)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``plan``)."""
    app(args=argv, prog_name="plan")


if __name__ == "__main__":
    main()
