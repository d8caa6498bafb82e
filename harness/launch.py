"""Run one configuration with torchrun in a subprocess and collect its measurements.

``run_config`` writes the job JSON, starts
``python -m torch.distributed.run --standalone --nproc-per-node N -m harness.worker``
in a new session with ``OMP_NUM_THREADS=1``, waits with a timeout, and merges the per-rank JSON
files into one result. A rank that fails makes torchrun stop the others; a rank that hangs is
caught by the timeout. Either way every process of the job (torchrun and its ranks, which torchrun
starts in sessions of their own) is killed by process group and pid, and the result says
``ok: False`` with the first rank's error. Nothing is left behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from harness.isolation import private_dir, python_command, worker_env
from harness.watchdog import (
    RDZV_TIMEOUT_S,
    launcher_env,
    process_start_ticks,
    terminate_as_interrupt,
)
from perfmodel.parallel.config import ParallelConfig
from perfmodel.spec.specs import ModelSpec

__all__ = [
    "descendants", "job_spec", "kill_all", "rank_processes", "run_config", "summarize", "torchrun_command",
]  # fmt: skip

PARALLEL_KEYS = (
    "dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "num_microbatches",
    "recompute", "sequence_parallel", "schedule", "grad_compression",
)  # fmt: skip


def job_spec(
    config: ParallelConfig | dict,
    model: ModelSpec,
    *,
    global_batch_size: int,
    seq_len: int,
    seed: int = 0,
    lr: float = 3e-3,
    warmup_steps: int = 2,
    timed_steps: int = 3,
    dp_impl: str = "auto",
    inject: dict | None = None,
) -> dict[str, Any]:
    """The JSON job a worker reads. ``num_microbatches`` defaults to B / (dp * micro_batch_size)."""
    c = config.model_dump() if isinstance(config, ParallelConfig) else dict(config)
    base = ParallelConfig().model_dump()
    par = {k: c.get(k, base.get(k)) for k in PARALLEL_KEYS}
    if par["num_microbatches"] is None:
        par["num_microbatches"] = global_batch_size // (par["dp"] * par["micro_batch_size"])
    return {
        "parallel": par,
        "model": model.model_dump(),
        "training": {"global_batch_size": global_batch_size, "seq_len": seq_len},
        "harness": {
            "seed": seed, "lr": lr, "warmup_steps": warmup_steps, "timed_steps": timed_steps,
            "dp_impl": dp_impl, "inject": inject,
        },
    }  # fmt: skip


def torchrun_command(nproc: int, module: str, *args: str) -> list[str]:
    """``python -P -m torch.distributed.run ... -m module args``: ``nproc`` local ranks."""
    return python_command(
        "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "--monitor-interval=0.2", f"--rdzv-conf=join_timeout={RDZV_TIMEOUT_S:.0f}",
        "-m", module, *args,
    )  # fmt: skip


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from /proc; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def rank_processes(out: Path) -> list[tuple[int, str]]:
    """(pid, start ticks) of each rank, from the ``rank_*.pid`` files the ranks write (a file
    without a start time, or unreadable, is skipped: a bare pid may name a reused process)."""
    found = []
    for f in sorted(out.glob("rank_*.pid")):
        try:
            pid, ticks = f.read_text().split()
            found.append((int(pid), ticks))
        except (OSError, ValueError):
            continue
    return found


def _kill_verified(pid: int, ticks: str | None) -> None:
    """SIGKILL ``pid`` and its process group, only while it is the process that started at
    ``ticks`` (a pid read from a file or /proc may have been reused since)."""
    if ticks is None or process_start_ticks(pid) != ticks:
        return
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:  # a rank leads a session of its own: its helpers go too
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)


def kill_all(proc: subprocess.Popen, ranks: list[tuple[int, str]]) -> None:
    """Kill torchrun (its process group while it is not reaped), its live descendants and the
    ranks named by ``ranks``; each pid only after its start time is checked."""
    tree: list[tuple[int, str | None]] = []
    if proc.returncode is None:  # not reaped: proc.pid and its group id still name our job
        tree = [(p, process_start_ticks(p)) for p in descendants(proc.pid)]
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            proc.kill()
    for pid, ticks in [*tree, *ranks]:
        _kill_verified(pid, ticks)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    pids = {p for p, _ in [*tree, *ranks]}
    # reap anything torchrun had started that re-parented to us (none expected)
    deadline = time.time() + 5
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        alive = [p for p in pids if Path(f"/proc/{p}").exists()]
        zombies = [p for p in alive if "(Z)" in _state(p)]
        if len(zombies) == len(alive):
            break
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
        return f"({s.rsplit(')', 1)[1].split()[0]})"
    except OSError:
        return ""


def run_config(
    job: dict[str, Any],
    nproc: int,
    *,
    timeout_s: float = 180.0,
    workdir: str | Path | None = None,
    env: dict[str, str] | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """Run ``job`` on ``nproc`` local ranks; return the merged result (``ok``, ``error``, ...).

    The rank files stay in ``workdir`` when it is given (or ``keep``, or the run failed); a
    temporary directory of a successful run is removed. ``timeout_s`` must be finite and
    positive (ValueError). SIGTERM while it runs is handled like SIGINT: every process of the
    job is killed, then ``KeyboardInterrupt`` propagates.
    """
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s = {timeout_s!r}: expected a finite number of seconds > 0")
    from harness.worker import ConfigRefused, check_config

    par = job["parallel"]
    try:
        check_config(
            par, ModelSpec.model_validate(job["model"]), job["training"]["global_batch_size"],
            job["training"]["seq_len"], job["harness"].get("dp_impl", "auto"),
        )  # fmt: skip
        if par["dp"] * par["tp"] * par["pp"] * par.get("cp", 1) != nproc:
            raise ConfigRefused(f"dp*tp*pp*cp must equal nproc ({nproc})")
    except ConfigRefused as err:
        return {"ok": False, "refused": True, "error": str(err), "config": par}
    out = Path(workdir) if workdir else private_dir("harness-")
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "job.json"
    cfg.write_text(json.dumps(job))
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e.pop("HARNESS_INJECT", None)
    e.update(launcher_env())  # the ranks' watchdog ends them if this process dies
    if env:
        e.update(env)
    e = worker_env(e, temp_root=out)  # the project's code only; temporary folders in ``out``
    cmd = torchrun_command(nproc, "harness.worker", "--config", str(cfg), "--out", str(out))
    t0 = time.perf_counter()
    log = open(out / "torchrun.log", "wb")  # noqa: SIM115 - closed in the finally below
    timed_out = False
    with terminate_as_interrupt():  # SIGTERM cleans up like SIGINT
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=e, cwd=out, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_all(proc, rank_processes(out))
            log.close()
    wall_s = time.perf_counter() - t0
    res = summarize(out, nproc)
    res.update(config=par, wall_s=wall_s, returncode=proc.returncode, workdir=str(out))
    if timed_out:
        res["ok"] = False
        hung = [r for r in range(nproc) if not (out / f"rank_{r}.json").exists()]
        msg = f"timed out after {timeout_s:.0f} s (killed); ranks without a result: {hung}"
        errs = res.get("rank_errors")
        res["error"] = msg + (f"; rank {errs[0]['rank']}: {errs[0]['error']}" if errs else "")
    elif proc.returncode != 0 and res.get("ok"):
        res["ok"] = False
        res["error"] = f"torchrun exited with {proc.returncode}"
    if not res["ok"]:
        res["log_tail"] = (out / "torchrun.log").read_text(errors="replace")[-3000:]
    elif workdir is None and not keep:
        shutil.rmtree(out, ignore_errors=True)
        res["workdir"] = None
    return res


def summarize(out: Path, nproc: int) -> dict[str, Any]:
    """Merge the rank files of one run: losses, median step time, comm per dim, peak memory."""
    errors = []
    for r in range(nproc):
        f = out / f"rank_{r}.error.json"
        if f.exists():
            errors.append(json.loads(f.read_text()))
    ranks = []
    for r in range(nproc):
        f = out / f"rank_{r}.json"
        if f.exists():
            ranks.append(json.loads(f.read_text()))
    if errors or len(ranks) != nproc:
        # the root cause is the earliest error; the others are usually "connection closed by peer"
        errors.sort(key=lambda e: e.get("time", 0.0))
        first = errors[0] if errors else None
        msg = (
            f"rank {first['rank']}: {first['error']}"
            if first
            else f"{nproc - len(ranks)} ranks gave no result"
        )
        return {"ok": False, "error": msg, "rank_errors": errors}
    # loss per step: mean over data-parallel replicas of the last stage's (tp rank 0) loss
    n_steps = len(ranks[0]["losses"])
    losses = []
    for s in range(n_steps):
        vals = [r["losses"][s] for r in ranks if r["losses"][s] is not None]
        losses.append(statistics.fmean(vals) if vals else None)
    comm_dims: dict[str, float] = {}
    per_rank_comm = []
    for r in ranks:
        d: dict[str, float] = {}
        for row in r["comm"]:
            d[row["dim"]] = d.get(row["dim"], 0.0) + row["sent_bytes"]
        per_rank_comm.append(d)
    for d in per_rank_comm:
        for k, v in d.items():
            comm_dims[k] = max(comm_dims.get(k, 0.0), v)
    r0 = ranks[0]
    return {
        "ok": True,
        "losses": losses,
        "step_time_s": r0["step_time_s"],
        "step_times_s": r0["step_times_s"],
        "comm_bytes": comm_dims,  # bytes sent per step by the busiest rank, per dimension
        "comm_bytes_per_rank": per_rank_comm,
        "comm_ops": [dict(rank=r["rank"], **row) for r in ranks for row in r["comm"]],
        "peak_memory_bytes": max(r["memory"]["peak_bytes"] for r in ranks),
        "peak_memory_bytes_per_rank": [r["memory"]["peak_bytes"] for r in ranks],
        "steady_memory_bytes_per_rank": [r["memory"]["steady_bytes"] for r in ranks],
        "param_bytes_per_rank": [r["memory"]["param_bytes"] for r in ranks],
        "peak_snapshot_per_rank": [r["memory"].get("peak_snapshot") for r in ranks],
        "dp_impl": r0["dp_impl"],
        "phases_s": r0["phases_s"],
    }
