"""``plan verify``: run the planner's top picks for real on local processes and compare.

Registered by the main CLI (``cli.main.SUBCOMMANDS["verify"]``). Searches configurations of
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
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from perfmodel.core import units
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import format_validation_error, load_model

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


#: Largest relative spread of the first-step loss across configurations still called equal: every
#: configuration trains the same model from the same seed on the same batch, so parallelism
#: must not change the loss beyond float32 reduction order (about 1e-6; 1e-3 leaves margin).
LOSS_RTOL = 1e-3


def loss_check(runs: list[dict[str, Any]]) -> tuple[float | None, str]:
    """Largest relative difference of each run's first-step loss from the first run's, and a
    line saying whether the configurations compute the same loss."""
    losses = [(r["config"], r["measured"]["losses"][0]) for r in runs
              if r.get("ok") and r.get("measured", {}).get("losses")
              and r["measured"]["losses"][0] is not None]
    if len(losses) < 2:
        return None, "loss equality: fewer than two runs report a loss"
    ref = losses[0][1]
    worst_cfg, worst = max(((c, abs(v - ref) / max(abs(ref), 1e-12)) for c, v in losses),
                           key=lambda x: x[1])
    verdict = "equal" if worst <= LOSS_RTOL else f"DIFFERENT (worst {_cfg(worst_cfg)})"
    return worst, (f"loss equality: first-step loss {ref:.6g} in {len(losses)} runs, largest "
                   f"relative difference {worst:.1e} (tolerance {LOSS_RTOL:.0e}): {verdict}")


#: A peak-memory row further off than this gets a note under the table.
MEMORY_NOTE_ABOVE = 0.20


def memory_notes(runs: list[dict[str, Any]]) -> list[str]:
    """One line per run whose predicted peak memory is more than 20% off the measured one,
    saying what the model does not count there (or that it is unexplained)."""
    out = []
    for r in runs:
        if not r.get("ok"):
            continue
        p, m = r["predicted"]["peak_memory_bytes"], r["measured"]["peak_memory_bytes"]
        if not m or abs(p / m - 1) <= MEMORY_NOTE_ABOVE:
            continue
        c = r["config"]
        why = "not explained by the memory model"
        if c.get("schedule") == "zb" and c.get("pp", 1) > 1 and c.get("num_microbatches", 1) > 1:
            why = ("torch's ScheduleInterleavedZeroBubble keeps each micro-batch's backward "
                   "graph (stage_backward_input runs with retain_graph=True) until its deferred "
                   "weight-gradient pass; the model counts min(p, m) retained graphs and "
                   "output-gradient sets on the last stage (memory.torch_zb_retained_"
                   "microbatches), not every tensor torch's B pass keeps for W")
        out.append(f"memory {_pct(p, m)} for {_cfg(c)}: {why}")
    return out


def _bytes_pair(a: float, b: float) -> str:
    return f"{units.fmt_bytes(a)} / {units.fmt_bytes(b)}"


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

    try:
        spec = load_model(model) if model else tiny_spec(seq_len=max(seq_len, 32))
        training = harness_training(global_batch, seq_len)
    except ValidationError as e:
        _fail(format_validation_error(e).replace("global_batch_size", "--global-batch")
              .replace("seq_len", "--seq-len"))
    except (SpecError, ValueError) as e:
        _fail(str(e).splitlines()[0])
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
    _print_report(spec.name, nproc, res)


def _print_report(model_name: str, nproc: int, res: dict[str, Any]) -> None:
    """The predicted / measured table of the runs, the rank correlation of their step times,
    whether they compute the same loss, and the notes on memory far off."""
    out = Console(highlight=False)
    t = Table(title=f"{model_name} on {nproc} local processes: predicted / measured",
              title_justify="left")  # fmt: skip
    for col in ("config", "step pred", "step meas", "dp bytes", "tp bytes", "pp bytes",
                "peak mem", "mem err", "loss"):  # fmt: skip
        # fold (wrap) a cell that does not fit rather than cut it with an ellipsis
        t.add_column(col, justify="left" if col == "config" else "right", overflow="fold")
    for r in res["runs"]:
        if not r.get("ok"):
            t.add_row(_cfg(r["config"]), "", "", "", "", "", "", "",
                      f"failed: {r.get('error')}")
            continue
        p, m = r["predicted"], r["measured"]
        cells = [_bytes_pair(p["comm_bytes"].get(d, 0.0), m["comm_bytes"].get(d, 0.0))
                 for d in ("dp", "tp", "pp")]
        loss = (m.get("losses") or [None])[0]
        t.add_row(_cfg(r["config"]), units.fmt_seconds(p["step_time_s"]),
                  units.fmt_seconds(m["step_time_s"]), *cells,
                  _bytes_pair(p["peak_memory_bytes"], m["peak_memory_bytes"]),
                  _pct(p["peak_memory_bytes"], m["peak_memory_bytes"]),
                  "" if loss is None else f"{loss:.6g}")  # fmt: skip
    out.print(t)
    ok = sum(1 for r in res["runs"] if r.get("ok"))
    out.print(f"Spearman rank correlation of step times over {ok} runs: {res['spearman']:.3f}")
    out.print(loss_check(res["runs"])[1])
    for line in memory_notes(res["runs"]):
        out.print(line)
