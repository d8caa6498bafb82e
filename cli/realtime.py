"""``plan realtime SPEC_FILE``: place inference models with deadlines (no arithmetic here).

Registered by the main CLI as ``app.command("realtime")(realtime)``. Exit codes: 0 a placement
meets every constraint; 2 bad spec or infeasible (one line on stderr naming the binding
constraint).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from perfmodel.core import units
from perfmodel.core.errors import SpecError
from realtime.placement import RealtimePlan, plan_realtime

__all__ = ["realtime", "render_plan"]


def _fail(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"error: {message}", markup=False, highlight=False)
    raise typer.Exit(code=2)


def render_plan(plan: RealtimePlan, console: Console) -> None:
    """Print the placement, per-model latency and slack, memory and the determinism checklist."""
    table = Table(title=f"{plan.name}: real-time placement")
    cols = ("model", "prio", "device(s)", "own", "layers", "exec", "response", "bound", "slack")
    for col in cols:
        table.add_column(col, justify="left" if col in cols[:4] else "right", no_wrap=True)
    for p in plan.placements:
        table.add_row(
            p.model, str(p.priority),
            " + ".join(p.devices), "yes" if p.exclusive else "shared",
            " + ".join(str(x) for x in p.layers),
            units.fmt_seconds(p.exec_s), units.fmt_seconds(p.response_s),
            units.fmt_seconds(p.bound_s), units.fmt_seconds(p.slack_s),
        )  # fmt: skip
    console.print(table)
    if plan.chain_latency_s is not None:
        console.print(
            f"chain {' -> '.join(plan.chain)}: {units.fmt_seconds(plan.chain_latency_s)} "
            f"of {units.fmt_seconds(plan.chain_deadline_s)}",
            highlight=False,
        )
    mem = ", ".join(
        f"{d} {units.fmt_bytes(u)} / {units.fmt_bytes(plan.memory_capacity_bytes[d])}"
        for d, u in plan.memory_used_bytes.items()
    )
    console.print(f"memory: {mem}", highlight=False)
    console.print(f"binding: {plan.binding}", highlight=False, markup=False)
    console.print(
        f"placements evaluated: {plan.n_evaluated}"
        + ("" if plan.search_complete else " (search bound reached: best found, not proven best)"),
        highlight=False,
    )
    console.print("determinism checklist:")
    for item in plan.checklist:
        console.print(f"  [ ] {item}", highlight=False, markup=False)


def realtime(
    spec_file: Annotated[
        Path, typer.Argument(help="TOML/JSON file: devices, links, models, chain")
    ],
    json_out: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Place inference models with deadlines on heterogeneous devices (exact search)."""
    try:
        plan = plan_realtime(spec_file)
    except SpecError as err:
        _fail(str(err))
        return
    if not plan.feasible:
        drops = (
            f"; degraded mode: drop {', '.join(plan.degraded_drops)}" if plan.degraded_drops else ""
        )
        _fail(f"infeasible: {plan.reason}{drops}")
    if json_out:
        typer.echo(json.dumps(plan.to_dict(), indent=2))
        return
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(soft_wrap=True, width=120)  # pipes and CliRunner: do not squeeze
    render_plan(plan, console)
