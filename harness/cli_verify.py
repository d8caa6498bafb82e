"""``plan verify``: run the planner's top picks for real on local processes and compare.

Registered by the main CLI (``search.cli.SUBCOMMANDS["verify"]``). Searches configurations of
a small model for ``--nproc`` local gloo processes on the calibrated ``local`` cluster
(:mod:`harness.calibrate`), runs the top ``--top`` plus a few deliberately poor ones with
:func:`harness.verify.verify`, and prints predicted versus measured step time, communication
bytes per dimension and peak memory, with the Spearman rank correlation of step times.

Exit codes: 0 done (failed runs are listed); 2 user error (one line on stderr): torch missing,
unknown model, a model or process count the harness cannot run.
"""

from __future__ import annotations

import json
import math
import os
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from perfmodel import units
from perfmodel.specs import SpecError

__all__ = ["verify_cmd"]


def _fail(message: str) -> None:
    typer.echo(f"plan verify: error: {message}", err=True)
    raise typer.Exit(2)


def _cfg(c: dict[str, Any]) -> str:
    s = f"dp{c['dp']} tp{c['tp']} pp{c['pp']}"
    if c.get("vp", 1) > 1:
        s += f" vp{c['vp']}"
    s += f" z{c['zero_stage']} b{c['micro_batch_size']}x{c['num_microbatches']}"
    if c.get("recompute", "none") != "none":
        s += f" rc:{c['recompute']}"
    if c.get("sequence_parallel"):
        s += " sp"
    if c.get("pp", 1) > 1:
        s += f" {c['schedule']}"
    return s


def _pct(pred: float, meas: float) -> str:
    if not meas:
        return "" if not pred else "inf"
    return f"{(pred - meas) / meas:+.1%}"


#: Most processes ``--nproc`` starts: four per CPU core (the ranks are small; beyond that they
#: only time-slice), and never more than 64.
def max_nproc() -> int:
    return min(64, 4 * (os.cpu_count() or 1))


#: Most configurations ``--top`` / ``--poor`` run (each is one torchrun job of up to --timeout s).
MAX_RUNS = 32
MAX_TIMED_STEPS = 100


def _check_counts(nproc: int, top: int, poor: int, timed_steps: int, timeout: float) -> None:
    """Refuse, up front and with one line, counts that would start unbounded work or that the
    harness cannot run (before: ``--nproc 1000`` spawned 1000 ranks on 2 cores, ``--timeout
    -1`` marked every run timed out and exited 0, ``--timeout nan`` disabled the timeout,
    ``--nproc 3`` failed inside the calibration with a pointer into a temporary folder)."""
    cap = max_nproc()
    if not 1 <= nproc <= cap:
        _fail(f"--nproc {nproc}: expected 1 to {cap} (4 per CPU core, at most 64)")
    if nproc & (nproc - 1):
        _fail(f"--nproc {nproc}: the harness runs power-of-two process counts "
              "(1, 2, 4, 8, ...): its calibration and parallel groups tile by halving")
    if not (math.isfinite(timeout) and timeout > 0):
        _fail(f"--timeout {timeout}: expected a finite number of seconds > 0")
    if top > MAX_RUNS or poor > MAX_RUNS:
        _fail(f"--top {top} / --poor {poor}: expected at most {MAX_RUNS} runs each")
    if timed_steps > MAX_TIMED_STEPS:
        _fail(f"--timed-steps {timed_steps}: expected at most {MAX_TIMED_STEPS}")


def verify_cmd(
    model: Annotated[
        str, typer.Option(help="model preset name or spec file (default: the harness's tiny GPT)")
    ] = "",
    nproc: Annotated[int, typer.Option(min=1, help="local processes (ranks)")] = 8,
    top: Annotated[int, typer.Option(min=1, help="top configurations to run")] = 5,
    poor: Annotated[int, typer.Option(min=0, help="deliberately poor configurations added")] = 3,
    global_batch: Annotated[int, typer.Option(help="global batch [sequences]")] = 8,
    seq_len: Annotated[int, typer.Option(help="sequence length [tokens]")] = 32,
    timed_steps: Annotated[int, typer.Option(min=1, help="timed steps per run")] = 3,
    timeout: Annotated[float, typer.Option(help="seconds before a run is killed")] = 240.0,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON document on stdout")] = False,
) -> None:
    """Run the planner's top configurations for real (torch.distributed, gloo) and compare."""
    _check_counts(nproc, top, poor, timed_steps, timeout)
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        _fail("torch is not installed: install the harness extra (pip install -e '.[harness]')")
    from harness.calibrate import calibrate, local_cluster
    from harness.model import tiny_spec
    from harness.verify import harness_training, select_configs, verify
    from perfmodel.specs import load_model

    try:
        spec = load_model(model) if model else tiny_spec(seq_len=max(seq_len, 32))
        training = harness_training(global_batch, seq_len)
    except (SpecError, ValueError) as e:
        _fail(str(e))
    err = Console(stderr=True, highlight=False)
    if not json_out:
        err.print(f"calibrating {nproc} local processes (cached) ...")
    try:
        cluster = local_cluster(nproc, calibrate((nproc,)))
    except RuntimeError as e:
        _fail(str(e))
    try:
        configs = select_configs(spec, nproc, top, cluster=cluster, training=training,
                                 num_poor=poor)  # fmt: skip
    except SpecError as e:
        _fail(str(e))
    if not configs:
        _fail(f"no configuration of {spec.name} on {nproc} processes can be run by the harness")

    def progress(i: int, n: int, row: dict) -> None:
        if not json_out:
            m = row.get("measured", {})
            state = f"{m['step_time_s']:.3f} s" if row.get("ok") else f"failed: {row.get('error')}"
            err.print(f"[{i + 1}/{n}] {_cfg(row['config'])}: {state}", markup=False)

    try:
        res = verify(spec, nproc, configs=configs, training=training, cluster=cluster,
                     timeout_s=timeout, timed_steps=timed_steps, progress=progress)  # fmt: skip
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM/SIGHUP (harness.watchdog)
        typer.echo(f"plan verify: interrupted ({e or 'SIGINT'}): every run stopped", err=True)
        raise typer.Exit(130) from None
    if json_out:
        out = {"spearman": None if math.isnan(res["spearman"]) else res["spearman"],
               "runs": res["runs"]}  # fmt: skip
        typer.echo(json.dumps(out, indent=1))
        return
    out = Console(highlight=False)
    t = Table(title=f"{spec.name} on {nproc} local processes: predicted vs measured",
              title_justify="left")  # fmt: skip
    for col in ("config", "step pred", "step meas", "dp bytes p/m", "tp bytes p/m",
                "pp bytes p/m", "peak mem p/m", "mem err"):  # fmt: skip
        t.add_column(col, justify="left" if col == "config" else "right")
    for r in res["runs"]:
        if not r.get("ok"):
            t.add_row(_cfg(r["config"]), "", "", "", "", "", "", f"failed: {r.get('error')}")
            continue
        p, m = r["predicted"], r["measured"]
        cells = []
        for d in ("dp", "tp", "pp"):
            a, b = p["comm_bytes"].get(d, 0.0), m["comm_bytes"].get(d, 0.0)
            cells.append(f"{int(a):,} / {int(b):,}")
        t.add_row(_cfg(r["config"]), units.fmt_seconds(p["step_time_s"]),
                  units.fmt_seconds(m["step_time_s"]), *cells,
                  f"{units.fmt_bytes(p['peak_memory_bytes'])} / "
                  f"{units.fmt_bytes(m['peak_memory_bytes'])}",
                  _pct(p["peak_memory_bytes"], m["peak_memory_bytes"]))  # fmt: skip
    out.print(t)
    ok = sum(1 for r in res["runs"] if r.get("ok"))
    out.print(f"Spearman rank correlation of step times over {ok} runs: {res['spearman']:.3f}")
