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
from perfmodel.specs import SpecError, format_validation_error
from perfmodel.step import MFU_CONVENTION
from search import api

__all__ = ["SUBCOMMANDS", "app", "main"]

#: Subcommands: name -> "module:function" (a typer command function), registered on import.
SUBCOMMANDS: dict[str, str] = {
    "realtime": "search.cli_realtime:realtime",
    "validate": "search.validate:validate_command",
    "verify": "harness.cli_verify:verify_cmd",
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
    nsga2 = "nsga2"
    ga = "ga"


class Objective(str, Enum):
    time = "time"
    memory = "memory"
    cost = "cost"


class Kernels(str, Enum):
    fused = "fused"
    eager = "eager"


class Emit(str, Enum):
    megatron = "megatron"
    torchtitan = "torchtitan"
    deepspeed = "deepspeed"


def _launch_text(fmt: str, model: str, result: Any) -> str:
    """The best configuration as launch settings (see :mod:`search.emit`)."""
    from perfmodel.config import ParallelConfig
    from perfmodel.specs import TrainingSpec, load_model
    from search.emit import emit

    s = result.setup
    training = TrainingSpec(global_batch_size=s["global_batch_size"], seq_len=s["seq_len"],
                            precision=s["precision"], optimizer=s["optimizer"])
    config = ParallelConfig(**result.best_row["config"])
    return emit(fmt, config, load_model(model), training)


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
            f"schedule={c['schedule']}")
    layout = [f"{k}={c[k]}" for k in ("first_stage_layers", "last_stage_layers") if c.get(k)]
    layout += [k for k in ("embedding_as_layer", "loss_as_layer") if c.get(k)]
    return line + (" " + " ".join(layout) if layout else "")


def _stage_layout_line(c: dict[str, Any], num_layers: int) -> str | None:
    """'layers per stage 15 16 ... 15 (chunks of rank 0: 1 2 ...)' for an uneven layout."""
    from perfmodel.pipeline import stage_layer_table

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


def _print_best(out: Console, r: Any) -> None:
    row = r.best_row
    s = r.setup
    title = "configuration" if r.strategy == "single" else "best configuration"
    out.print(f"[bold]{s['model']}[/] on {s['gpus']} x {s['gpu']} ({s['cluster']}), global batch "
              f"{s['global_batch_size']} x {s['seq_len']} tokens, {s['precision']}, "
              f"{s['optimizer']}, {s['kernels']} kernels")
    sw = s.get("training_switches") or {}
    on = [k.removeprefix("overlap_").replace("_", "-") for k in
          ("overlap_grad_reduce", "overlap_tp_comm", "overlap_p2p_comm") if sw.get(k)]
    out.print(f"assumed setup: framework {s.get('framework') or '(none: default switches)'}; "
              f"overlap {', '.join(on) or 'none'}; flash attention "
              f"{'on' if sw.get('flash_attention') else 'off'}")
    out.print(f"\n[bold]{title}:[/] {_config_line(row['config'])}")
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
    b = r.breakdown(0)
    t = Table(title="step time", title_justify="left")
    t.add_column("term")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    for name, v, share in b["time"]:
        t.add_row(name, units.fmt_seconds(v), f"{share:.1%}")
    m = Table(title="memory per GPU (GiB = 2^30 bytes)", title_justify="left")
    m.add_column("term")
    m.add_column("bytes", justify="right")
    m.add_column("of HBM", justify="right")
    for name, v, share in b["memory"]:
        m.add_row(name, units.fmt_bytes(v), f"{share:.1%}")
    c = Table(title="communication", title_justify="left")
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
    for d in r.diagnostics:
        out.print(f"[yellow]warning:[/] {d.message}")


def _print_top(out: Console, r: Any) -> None:
    t = Table(title=f"top {len(r.rows)} by {r.objective}", title_justify="left")
    for col in ("#", "dp", "tp", "pp", "vp", "cp", "zero", "mbs", "recompute", "sp", "sched",
                "step", "MFU", "peak mem", "why below #1"):
        t.add_column(col, justify="left" if col in ("recompute", "sched", "why below #1")
                     else "right")
    for i, row in enumerate(r.rows):
        c = row["config"]
        t.add_row(str(i + 1), str(c["dp"]), str(c["tp"]), str(c["pp"]), str(c["vp"]),
                  str(c["cp"]), str(c["zero_stage"]), str(c["micro_batch_size"]),
                  c["recompute"], "on" if c["sequence_parallel"] else "off", c["schedule"],
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
    emit: Annotated[Emit | None, typer.Option(help="also print the best configuration as "
                                              "launch settings for this framework")] = None,
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
             "nemo-24.09, bridge-25.x, deepspeed, torchtitan, or a TOML file): sets its "
             "switches and keeps the search to what it runs")] = None,
) -> None:
    """Search (or, with every parallel option given, evaluate) parallel configurations."""
    if ctx.invoked_subcommand is not None:
        return
    # Tables are wide: when stdout is not a terminal (a pipe, a file, a notebook), do not wrap
    # them at rich's default of 80 columns.
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    if list_presets_:
        for kind in ("model", "cluster", "gpu", "framework"):
            out.print(f"{kind}s: " + ", ".join(list_presets(kind)), soft_wrap=True)
        return
    err = Console(stderr=True)
    progress = _LazyProgress(err) if err.is_terminal and not json_out else None
    try:
        result = api.plan(
            model, cluster, gpus=gpus, global_batch_size=global_batch, seq_len=seq_len,
            precision=precision.value if precision else None,
            optimizer=optimizer.value if optimizer else None,
            strategy=strategy.value, objective=objective.value, top=top,
            kernels=kernels.value, progress=progress,
            calibration=str(calibration) if calibration is not None else None,
            allow_idle_gpus=allow_idle_gpus, allow_tp_across_nodes=allow_tp_across_nodes,
            uneven_layers=uneven_layers, memory_headroom=memory_headroom,
            max_step_time_s=_quantity(max_step_time, _UNITS_S, "--max-step-time", "s"),
            max_memory_bytes=_quantity(max_memory, _UNITS_B, "--max-memory", "gib"),
            framework=framework,
            dp=dp, tp=tp, pp=pp, vp=vp, cp=cp, zero_stage=zero, micro_batch_size=micro_batch,
            recompute=recompute.value if recompute else None,
            sequence_parallel=sequence_parallel,
            schedule=schedule.value if schedule else None,
        )
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
    launch = None
    if emit is not None:
        try:
            launch = _launch_text(emit.value, model, result)
        except SpecError as e:
            _fail(str(e))
    if json_out:
        doc = result.to_json()
        if launch is not None:
            doc["launch"] = {"format": emit.value, "text": launch}
        typer.echo(json.dumps(doc, indent=2))
        return
    _print_best(out, result)
    if result.strategy != "single":
        out.print()
        _print_top(out, result)
        out.print(f"searched {result.evaluated:,} configurations ({result.feasible:,} fit in "
                  f"memory, {result.space_size:,} in the space before constraints) with "
                  f"{result.strategy} in {result.seconds:.2f} s")
    if launch is not None:
        out.print(f"\n[bold]{emit.value} launch settings:[/]")
        typer.echo(launch, nl=False)


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
