"""The ``plan`` command line (typer + rich). No arithmetic here: options map 1:1 onto
:func:`search.api.plan`, and the printed numbers come from the :class:`SearchResult`.

``plan [OPTIONS]`` runs the planner (with no options: GPT-3 175B on 1024 A100-80GB).
Subcommands (``plan realtime SPEC``, later ``plan validate``, ``plan verify``) live in other
modules: add ``"name": "module:function"`` to :data:`SUBCOMMANDS` and the function (a typer
command) is registered on :data:`app` when this module is imported. ``plan [OPTIONS]`` with no
subcommand name runs the planner (a typer callback with ``invoke_without_command=True``).

Exit status: 0 on success, 2 on any user error or when nothing fits (one line on stderr).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from hardware_specs import list_presets
from perfmodel import units
from perfmodel.specs import MAX_GPUS, SpecError, format_validation_error
from perfmodel.step import MFU_CONVENTION
from search import api

__all__ = ["SUBCOMMANDS", "app", "main"]

#: Subcommands: name -> "module:function" (a typer command function), registered on import.
SUBCOMMANDS: dict[str, str] = {
    "realtime": "search.cli_realtime:realtime",
    "validate": "search.validate:validate_command",
    "verify": "harness.cli_verify:verify_cmd",
    "calibrate": "search.calibrate:calibrate_command",
    "sweep": "sweep.cli:sweep_cmd",
}

app = typer.Typer(
    name="plan",
    help="Plan parallel training of a transformer on a GPU cluster: predict step time, MFU, "
    "memory and communication, and search dp/tp/pp/vp/cp, ZeRO, micro-batches, recompute.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=False,
)


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"  # alias of fp8-delayed
    fp8_delayed = "fp8-delayed"
    fp8_cs = "fp8-cs"
    fp8_block = "fp8-block"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"
    fp4 = "fp4"  # alias of nvfp4


class Optimizer(str, Enum):
    adam = "adam"
    adamw = "adamw"
    sgd = "sgd"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class Schedule(str, Enum):
    gpipe = "gpipe"
    f1b = "1f1b"
    interleaved = "interleaved"
    zb = "zb"


class Strategy(str, Enum):
    grid = "grid"
    dp = "dp"
    nsga2 = "nsga2"
    ga = "ga"


class Objective(str, Enum):
    time = "time"
    memory = "memory"
    cost = "cost"


class Kernels(str, Enum):
    fused = "fused"
    eager = "eager"


class Zero3Gather(str, Enum):
    layer = "layer"
    tensor = "tensor"


#: Upper bounds of the count options (a larger value is a typing error; numpy's int64 and the
#: divisor lists of the search stay far from overflow). GPUs: perfmodel.specs.MAX_GPUS.
LIMITS: dict[str, tuple[int, str]] = {
    "gpus": (MAX_GPUS, "GPUs"),
    "global_batch": (2**24, "sequences"),
    "seq_len": (2**24, "tokens"),
    "dp": (MAX_GPUS, "GPUs"),
    "tp": (MAX_GPUS, "GPUs"),
    "pp": (MAX_GPUS, "GPUs"),
    "vp": (2**16, "virtual stages"),
    "cp": (MAX_GPUS, "GPUs"),
    "micro_batch": (2**24, "sequences"),
    "top": (10_000, "rows"),
}


def check_bounds(**values: int | None) -> None:
    """One-line error for a count option outside [1, limit] (the limit is named)."""
    for name, v in values.items():
        if v is None:
            continue
        limit, unit = LIMITS[name]
        flag = "--" + name.replace("_", "-")
        if v < 1:
            _fail(f"{flag} {v}: expected a positive integer")
        if v > limit:
            _fail(f"{flag} {v}: above the limit of {limit:,} {unit}")


class Emit(str, Enum):
    megatron = "megatron"
    bridge = "bridge"
    torchtitan = "torchtitan"
    deepspeed = "deepspeed"


def _launches(result: Any, model: str, plan_kwargs: dict[str, Any], alternatives: bool,
              formats: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Launch settings of the best configuration per format (see :mod:`search.emit`); a refused
    format gets the best configuration of a search restricted to its framework."""
    from search.emit import FORMATS, launch_from_result
    from search.space import SEARCH_DIMS

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
            from rich.progress import BarColumn, Progress, TimeElapsedColumn

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
            + (f" ep={c['ep']} etp={c['etp']}" if _is_moe_row(c) else ""))
    layout = [f"{k}={c[k]}" for k in ("first_stage_layers", "last_stage_layers") if c.get(k)]
    layout += [k for k in ("embedding_as_layer", "loss_as_layer") if c.get(k)]
    return line + (" " + " ".join(layout) if layout else "")


def _is_moe_row(c: dict[str, Any]) -> bool:
    """Whether a configuration uses expert parallelism (MoE): shows the ep / etp columns."""
    return c.get("ep", 1) > 1 or c.get("etp", c["tp"]) != c["tp"]


def _stage_layout_line(c: dict[str, Any], num_layers: int) -> str | None:
    """'layers per stage 15 16 ... 15 (chunks of rank 0: 1 2 ...)' for an uneven layout."""
    from perfmodel.pipeline import stage_layer_table

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
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = (m.group(2) or default_unit).lower() if m else ""
    if not m or unit not in units_ or float(m.group(1)) <= 0:
        _fail(f"{option} {text!r}: expected a positive number with a unit "
              f"({', '.join(k for k in units_ if k != 'b')})")
    return float(m.group(1)) * units_[unit]


_SWITCH_NAMES = {"overlap_grad_reduce": "grad-reduce", "overlap_tp_comm": "tp-comm",
                 "overlap_p2p_comm": "p2p-comm"}
_FIELD_NAMES = {"seq_len": "sequence {v}", "global_batch_size": "global batch {v}",
                "precision": "precision {v}", "optimizer": "optimizer {v}",
                "overlap_grad_reduce": "overlap-grad-reduce {v}",
                "overlap_tp_comm": "overlap-tp-comm {v}", "overlap_p2p_comm": "overlap-p2p-comm {v}",
                "flash_attention": "flash attention {v}", "zero3_gather": "zero3-gather {v}"}


def assumed_lines(s: dict[str, Any]) -> list[str]:
    """The report header's "assumed setup": the switches in force, then every value the user
    did not give, grouped by where it came from."""
    sw = s.get("training_switches") or {}
    on = [_SWITCH_NAMES[k] for k in _SWITCH_NAMES if sw.get(k)]
    first = (f"assumed setup: framework {s.get('framework') or '(none: default switches)'}; "
             f"overlap {', '.join(on) or 'none'}; flash attention "
             f"{'on' if sw.get('flash_attention') else 'off'}"
             f"{'; profile ' + s['profile'] if s.get('profile') else ''}")
    lines = [first]
    values = {**{k: s.get(k) for k in ("seq_len", "global_batch_size", "precision",
                                         "optimizer")}, **sw}
    by_source: dict[str, list[str]] = {}
    for k, src in (s.get("assumed") or {}).items():
        v = values.get(k)
        shown = ("on" if v else "off") if isinstance(v, bool) else v
        by_source.setdefault(src, []).append(_FIELD_NAMES.get(k, k + " {v}").format(v=shown))
    for src, fields in by_source.items():
        lines.append(f"  {', '.join(fields)}: {src}")
    return lines


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
        return "cp = 1: none" if c["cp"] == 1 else "exposed: what ring attention leaves"
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


def _calibration_evidence(s: dict) -> dict | None:
    """:func:`search.evidence.calibration_evidence` of a result's setup (None if unreadable)."""
    from search.evidence import calibration_evidence

    try:
        return calibration_evidence(s["gpu"], s.get("framework"), s.get("precision"))
    except (SpecError, OSError, KeyError, ValueError):
        return None


def _calibration_line(s: dict) -> str:
    """The published runs the plan's kernel efficiency is calibrated on
    (:func:`search.evidence.calibration_evidence`), one line; empty if it cannot be read."""
    from search.evidence import calibration_evidence, evidence_line

    try:
        ev = calibration_evidence(s["gpu"], s.get("framework"), s.get("precision"))
        source = ""
        if not ev["groups"]:
            from perfmodel.compute import sustained_calibration
            from perfmodel.specs import load_cluster

            source = sustained_calibration(load_cluster(s["cluster"]).gpu).source
        return evidence_line(ev, source)
    except (SpecError, OSError, KeyError, ValueError):
        return ""


def _print_best(out: Console, r: Any) -> None:
    row = r.best_row
    s = r.setup
    title = "configuration" if r.strategy == "single" else "best configuration"
    out.print(f"[bold]{s['model']}[/] on {s['gpus']} x {s['gpu']} ({s['cluster']}), global batch "
              f"{s['global_batch_size']} x {s['seq_len']} tokens, {s['precision']}, "
              f"{s['optimizer']}, {s['kernels']} kernels")
    for line in assumed_lines(s):
        out.print(line, soft_wrap=True)
    used = f" ({row['gpus']} of {s['gpus']} GPUs used)" if row["gpus"] != s["gpus"] else ""
    out.print(f"\n[bold]{title}:[/] {_config_line(row['config'])}{used}")
    out.print(f"  step time {units.fmt_seconds(row['step_time_s'])}   "
              f"{units.fmt_count(row['tokens_per_s'])} tokens/s   MFU {row['mfu']:.1%}   "
              f"HFU {row['hfu']:.1%}   peak memory {units.fmt_bytes(row['memory_bytes']['peak'])}"
              f" of {units.fmt_bytes(r.usable_bytes or r.hbm_bytes)} usable (HBM "
              f"{units.fmt_bytes(r.hbm_bytes)} less reserve less {r.memory_headroom:.0%} "
              "headroom)")
    layout = _stage_layout_line(row["config"], s.get("num_layers", 0)) if s.get(
        "num_layers") else None
    if layout:
        out.print(layout)
    evidence = _calibration_line(s)
    if evidence:
        out.print(f"  {evidence}", soft_wrap=True)
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
    for d in r.diagnostics:
        out.print(f"[yellow]warning:[/] {d.message}")


def _print_pareto(out: Console, r: Any) -> None:
    """The Pareto front (step time, peak memory, GPUs), fastest first."""
    t = Table(title=f"Pareto front: {len(r.pareto_rows)} configurations none of which is "
              "faster, smaller and on fewer GPUs at once", title_justify="left")
    for col in ("#", "dp", "tp", "pp", "vp", "cp", "zero", "mbs", "recompute", "sp", "sched",
                "GPUs", "step", "MFU", "peak mem"):
        t.add_column(col, justify="left" if col in ("recompute", "sched") else "right")
    for i, row in enumerate(r.pareto_rows):
        c = row["config"]
        t.add_row(str(i + 1), str(c["dp"]), str(c["tp"]), str(c["pp"]), str(c["vp"]),
                  str(c["cp"]), str(c["zero_stage"]), str(c["micro_batch_size"]),
                  c["recompute"], "on" if c["sequence_parallel"] else "off", c["schedule"],
                  str(row["gpus"]), units.fmt_seconds(row["step_time_s"]), f"{row['mfu']:.1%}",
                  units.fmt_bytes(row["memory_bytes"]["peak"]))
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
                  str(c["cp"]), *expert, str(c["zero_stage"]), str(c["micro_batch_size"]),
                  c["recompute"], "on" if c["sequence_parallel"] else "off", c["schedule"],
                  *([str(row["gpus"])] if gpus_column else []),
                  units.fmt_seconds(row["step_time_s"]), f"{row['mfu']:.1%}",
                  units.fmt_bytes(row["memory_bytes"]["peak"]),
                  "" if i == 0 else r.explain(i))
    out.print(t)


@app.callback(invoke_without_command=True)
def planner(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="model preset name or spec file "
                                       "(TOML, or a Hugging Face config.json)")] =
    api.DEFAULT_MODEL,
    cluster: Annotated[str, typer.Option(help="cluster preset name or spec file")] =
    api.DEFAULT_CLUSTER,
    gpus: Annotated[int | None, typer.Option(help="scale the cluster to N GPUs")] = None,
    global_batch: Annotated[int | None, typer.Option(help="global batch [sequences]")] = None,
    seq_len: Annotated[int | None, typer.Option(help="sequence length [tokens]")] = None,
    precision: Annotated[Precision | None, typer.Option()] = None,
    optimizer: Annotated[Optimizer | None, typer.Option()] = None,
    dp: Annotated[int | None, typer.Option(help="data-parallel size (searched if omitted)")] =
    None,
    tp: Annotated[int | None, typer.Option(help="tensor-parallel size")] = None,
    pp: Annotated[int | None, typer.Option(help="pipeline-parallel stages")] = None,
    vp: Annotated[int | None, typer.Option(help="virtual stages per pipeline rank")] = None,
    cp: Annotated[int | None, typer.Option(help="context-parallel size")] = None,
    zero: Annotated[int | None, typer.Option(min=0, max=3, help="ZeRO stage 0-3")] = None,
    micro_batch: Annotated[int | None, typer.Option(help="micro-batch size [sequences]")] =
    None,
    recompute: Annotated[Recompute | None, typer.Option()] = None,
    sequence_parallel: Annotated[bool | None, typer.Option(
        "--sequence-parallel/--no-sequence-parallel")] = None,
    schedule: Annotated[Schedule | None, typer.Option()] = None,
    ep: Annotated[int | None, typer.Option(help="expert-parallel size (MoE; searched if "
                                           "omitted)")] = None,
    etp: Annotated[int | None, typer.Option(help="expert tensor-parallel size (MoE)")] = None,
    strategy: Annotated[Strategy, typer.Option(help="search strategy")] = Strategy.grid,
    objective: Annotated[Objective, typer.Option(help="what 'best' minimises: step time, "
                                                 "peak memory, or GPU-seconds per step")] =
    Objective.time,
    top: Annotated[int, typer.Option(min=1, help="configurations in the table")] = 10,
    kernels: Annotated[Kernels, typer.Option(help="fused (Megatron/TE) or eager PyTorch")] =
    Kernels.fused,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON document on stdout")] =
    False,
    csv: Annotated[Path | None, typer.Option(help="write the top-k table to this CSV file")] =
    None,
    list_presets_: Annotated[bool, typer.Option("--list", help="list every preset and exit")]
    = False,
    emit: Annotated[Emit | None, typer.Option(help="print only the best configuration's "
                                              "launch settings for this framework on stdout "
                                              "(the report goes to stderr)")] = None,
    emit_dir: Annotated[Path | None, typer.Option(
        help="write the launch settings of every framework into this folder (megatron.args, "
             "bridge.yaml, torchtitan.toml, deepspeed.json)")] = None,
    calibration: Annotated[Path | None, typer.Option(
        help="folder of your own GPU measurements (the format calibrate_gpu.py writes)")] = None,
    allow_idle_gpus: Annotated[bool, typer.Option(
        help="allow dp*tp*pp*cp below the GPU count")] = False,
    allow_tp_across_nodes: Annotated[bool, typer.Option(
        help="allow tensor parallelism beyond the scale-up (NVLink) domain")] = False,
    uneven_layers: Annotated[bool, typer.Option(
        "--uneven-layers/--even-layers-only",
        help="pp*vp that does not divide the layer count runs Megatron-LM's uneven layout "
        "(embedding and loss counted as layers, or lighter first/last stages)")] = True,
    memory_headroom: Annotated[float | None, typer.Option(
        min=0.0, max=0.9, help="fraction of HBM kept free [default: 0: the peak already "
        "carries a 3% allocator allowance of what is allocated during the step]")] = None,
    max_step_time: Annotated[str | None, typer.Option(
        help="only configurations at most this slow, e.g. 20s, 500ms")] = None,
    max_memory: Annotated[str | None, typer.Option(
        help="only configurations whose peak is at most this, e.g. 70GiB")] = None,
    framework: Annotated[str | None, typer.Option(
        help="the training stack you will launch (megatron-2021, megatron-2022, nemo-24.07, "
             "nemo-24.09, bridge-25.09, bridge-25.x, bridge-26.02, deepspeed, deepspeed-2021, torchtitan, or a TOML file): sets its "
             "switches and keeps the search to what it runs")] = None,
    training: Annotated[Path | None, typer.Option(
        help="training spec TOML (global_batch_size, seq_len, precision, optimizer, overlap "
             "switches, flash_attention); the options above and below override it")] = None,
    flash_attention: Annotated[bool | None, typer.Option(
        "--flash-attention/--no-flash-attention",
        help="attention without storing the s^2 scores (default: the framework's)")] = None,
    overlap_grad_reduce: Annotated[bool | None, typer.Option(
        "--overlap-grad-reduce/--no-overlap-grad-reduce",
        help="data-parallel reduce / ZeRO gathers overlap compute")] = None,
    overlap_tp_comm: Annotated[bool | None, typer.Option(
        "--overlap-tp-comm/--no-overlap-tp-comm",
        help="TP collectives overlap the GEMMs (TE userbuffers)")] = None,
    overlap_p2p_comm: Annotated[bool | None, typer.Option(
        "--overlap-p2p-comm/--no-overlap-p2p-comm",
        help="pipeline sends / receives overlap compute")] = None,
    zero3_gather: Annotated[Zero3Gather | None, typer.Option(
        help="ZeRO-3 gathers per layer (FSDP2) or per tensor (DeepSpeed 2021)")] = None,
    profile: Annotated[str | None, typer.Option(
        help="efficiency profile: a shipped one (megatron-2021, megatron-2022, nemo-24.07, "
             "nemo-24.09, bridge-25.x) or a TOML file written by `plan calibrate`")] = None,
) -> None:
    """Search (or, with every parallel option given, evaluate) parallel configurations."""
    if ctx.invoked_subcommand is not None:
        return
    # Tables are wide: when stdout is not a terminal (a pipe, a file, a notebook), do not wrap
    # them at rich's default of 80 columns.
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    if list_presets_:
        for kind in ("model", "cluster", "gpu", "framework", "profile"):
            out.print(f"{kind}s: " + ", ".join(list_presets(kind)), soft_wrap=True)
        return
    check_bounds(gpus=gpus, global_batch=global_batch, seq_len=seq_len, dp=dp, tp=tp, pp=pp,
                 vp=vp, cp=cp, micro_batch=micro_batch, top=top)
    err = Console(stderr=True)
    if emit is not None and not json_out:
        # stdout carries only the launch settings (`plan --emit deepspeed > ds.json`)
        out = Console(stderr=True, highlight=False)
    progress = _LazyProgress(err) if err.is_terminal and not json_out else None
    try:
        plan_kwargs: dict[str, Any] = {
            "model": model, "cluster": cluster, "gpus": gpus, "global_batch_size": global_batch,
            "seq_len": seq_len, "precision": precision.value if precision else None,
            "optimizer": optimizer.value if optimizer else None,
            "strategy": strategy.value, "objective": objective.value, "top": top,
            "kernels": kernels.value, "progress": progress,
            "calibration": str(calibration) if calibration is not None else None,
            "allow_idle_gpus": allow_idle_gpus, "allow_tp_across_nodes": allow_tp_across_nodes,
            "uneven_layers": uneven_layers, "framework": framework, "profile": profile,
            "memory_headroom": memory_headroom,
            "training": str(training) if training is not None else None,
            "flash_attention": flash_attention, "overlap_grad_reduce": overlap_grad_reduce,
            "overlap_tp_comm": overlap_tp_comm, "overlap_p2p_comm": overlap_p2p_comm,
            "zero3_gather": zero3_gather.value if zero3_gather else None,
            "dp": dp, "tp": tp, "pp": pp, "vp": vp, "cp": cp, "zero_stage": zero,
            "micro_batch_size": micro_batch, "recompute": recompute.value if recompute else None,
            "sequence_parallel": sequence_parallel,
            "schedule": schedule.value if schedule else None,
            "ep": ep, "etp": etp,
        }
        plan_kwargs["max_step_time_s"] = _quantity(max_step_time, _UNITS_S, "--max-step-time", "s")
        plan_kwargs["max_memory_bytes"] = _quantity(max_memory, _UNITS_B, "--max-memory", "gib")
        result = api.plan(**plan_kwargs)
    except SpecError as e:
        _fail(str(e))
    except ValidationError as e:
        _fail(format_validation_error(e))
    finally:
        if progress is not None:
            progress.close()
    if not result.fits_any:
        _fail(result.why_nothing_fits())
    if csv is not None:
        try:
            result.top.to_csv(csv, index=False)
        except OSError as e:
            _fail(f"--csv {csv}: cannot write: {e.strerror}")
    want_alt = emit is not None or emit_dir is not None
    try:
        launches = _launches(result, model, plan_kwargs, want_alt) if (
            json_out or want_alt) else {}
    except SpecError as e:
        _fail(str(e))
    if emit_dir is not None:
        try:
            emit_dir.mkdir(parents=True, exist_ok=True)
            for L in launches.values():
                if L.text is not None:
                    (emit_dir / L.file).write_text(L.text)
        except OSError as e:
            _fail(f"--emit-dir {emit_dir}: cannot write: {e.strerror}")
        for L in launches.values():
            if L.text is None:
                err.print(f"plan: {L.file} not written: {L.message()}", soft_wrap=True,
                          highlight=False, markup=False)
    if json_out:
        doc = result.to_json()
        doc["launch"] = {fmt: L.to_json() for fmt, L in launches.items()}
        doc["calibrated_on"] = _calibration_evidence(result.setup)
        typer.echo(json.dumps(doc, indent=2))
        return
    for w in result.setup.get("warnings") or ():
        typer.echo(f"plan: warning: {w}", err=True)
    if emit is not None and launches[emit.value].text is None:
        _fail(launches[emit.value].message())
    _print_best(out, result)
    if result.strategy != "single":
        out.print()
        _print_top(out, result, gpus_column=allow_idle_gpus)
        if result.strategy == "nsga2":
            out.print()
            _print_pareto(out, result)
        out.print(f"searched {result.evaluated:,} configurations ({result.feasible:,} fit in "
                  f"memory, {result.space_size:,} in the space before constraints) with "
                  f"{result.strategy} in {result.seconds:.2f} s")
    if emit is not None:
        typer.echo(launches[emit.value].text, nl=False)


def _register_subcommands() -> None:
    for name, target in SUBCOMMANDS.items():
        module, func = target.split(":")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:  # not written yet: skip
                continue
            raise
        app.command(name)(getattr(mod, func))


_register_subcommands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``plan``)."""
    app(args=argv, prog_name="plan")


if __name__ == "__main__":
    main()
