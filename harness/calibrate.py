"""Calibrate this machine as a ``local`` cluster for the planner.

For each process count ``N`` a torchrun job of ``N`` gloo ranks measures, with *all* ranks busy at
once (as in a training run, where 8 ranks share the cores):

* matmul rate of one process among ``N`` (fp32 square GEMMs of 64..512; 2 n^3 FLOP each);
* per-op overhead: wall time of a tiny eager op (a 1-element add), the floor of every kernel;
* memory copy bandwidth of one process among ``N``;
* gloo all-reduce time for group sizes 2, 4, ..., N (the world split into N/g concurrent groups)
  and message sizes 4 B .. 1 MiB, fitted to the alpha-beta model
  ``t = alpha + 2 (g-1)/g * bytes / bw`` (Hockney 1994; ring all-reduce, Patarasuk & Yuan 2009).

The results are cached to a JSON file (default ``~/.cache/llm-planner/local_calibration.json``)
and turned into a :class:`~perfmodel.spec.specs.ClusterSpec` by :func:`local_cluster`: one "GPU" per
process whose ``peak_tflops`` is the measured per-process matmul rate, ``hbm_gib`` = RAM / N, and
one link tier of kind ``gloo`` with the fitted bandwidth and latency. The per-op overhead has no
field in ClusterSpec; it is kept in the JSON (``op_overhead_s``) and in the spec's description.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from harness.isolation import private_dir, worker_env
from harness.launch import kill_all, torchrun_command
from harness.watchdog import launcher_env, terminate_as_interrupt
from perfmodel.core import units
from perfmodel.core.files import atomic_write
from perfmodel.spec.specs import ClusterSpec, GPUSpec, LinkTier, PeakTflops

__all__ = ["DEFAULT_PATH", "calibrate", "fit_alpha_beta", "local_cluster", "read_cache"]

DEFAULT_PATH = Path.home() / ".cache" / "llm-planner" / "local_calibration.json"
MATMUL_SIZES = (64, 128, 256, 512)
MSG_BYTES = (4, 4096, 65536, 1 << 20)


def fit_alpha_beta(
    group_size: np.ndarray, msg_bytes: np.ndarray, time_s: np.ndarray
) -> tuple[float, float]:
    """Least-squares ``t = alpha + 2(g-1)/g * bytes / bw``; returns (alpha [s], bw [bytes/s]).

    References: Hockney 1994 (alpha-beta model); Patarasuk & Yuan 2009 (ring all-reduce volume).
    """
    g = np.asarray(group_size, dtype=float)
    x = 2.0 * (g - 1.0) / g * np.asarray(msg_bytes, dtype=float)  # bytes sent per rank
    a = np.stack([np.ones_like(x), x], axis=1)
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, np.asarray(time_s, dtype=float), rcond=None)
    alpha = max(float(alpha), 1e-7)
    inv_bw = max(float(inv_bw), 1e-15)
    return alpha, 1.0 / inv_bw


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _loop_time(fn, reps: int) -> float:
    """Wall time of ``reps`` calls in a row: with N processes sharing the cores, this includes the
    time this process is descheduled, so ``work / time`` is the rate of one process among N."""
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return time.perf_counter() - t0


def _worker(out: Path) -> None:  # one rank of the calibration job
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    res: dict[str, Any] = {"nproc": world}
    try:
        dist.barrier()
        mm = {}
        for n in MATMUL_SIZES:
            a, b = torch.randn(n, n), torch.randn(n, n)
            reps = max(3, int(4e8 / n**3))  # ~0.3 s of one core's work per size
            a @ b
            dist.barrier()
            t = _loop_time(lambda a=a, b=b: a @ b, reps)
            mm[str(n)] = 2 * n**3 * reps / t
        res["matmul_flops_per_s"] = mm
        x = torch.ones(1)
        dist.barrier()
        res["op_overhead_s"] = _loop_time(lambda: x.add(1.0), 20000) / 20000
        big = torch.ones(1 << 21)  # 8 MiB
        dist.barrier()
        t = _loop_time(lambda: big.clone(), 40)
        res["copy_bytes_per_s"] = 40 * 2 * big.numel() * 4 / t  # read + write
        ar = []
        g = 2
        while g <= world:
            groups = [dist.new_group(list(range(s, s + g))) for s in range(0, world, g)]
            mine = groups[rank // g]
            for nb in MSG_BYTES:
                buf = torch.ones(max(nb // 4, 1))
                dist.all_reduce(buf, group=mine)
                dist.barrier()
                t = _median_time(lambda buf=buf, g=mine: dist.all_reduce(buf, group=g), 7)
                ar.append({"group_size": g, "bytes": nb, "time_s": t})
            g *= 2
        res["all_reduce"] = ar
        allv = [None] * world
        dist.all_gather_object(allv, res)
        if rank == 0:
            res["matmul_flops_per_s"] = {
                k: statistics.median(r["matmul_flops_per_s"][k] for r in allv) for k in mm
            }
            res["op_overhead_s"] = statistics.median(r["op_overhead_s"] for r in allv)
            res["copy_bytes_per_s"] = statistics.median(r["copy_bytes_per_s"] for r in allv)
            for i, row in enumerate(res["all_reduce"]):
                row["time_s"] = max(r["all_reduce"][i]["time_s"] for r in allv)
            (out / "calibration.json").write_text(json.dumps(res))
    except BaseException as err:  # noqa: BLE001
        (out / f"error_{rank}.txt").write_text(repr(err))
        os._exit(1)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def _run_one(nproc: int, timeout_s: float) -> dict[str, Any]:
    out = private_dir("harness-cal-")
    base = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **launcher_env())
    e = worker_env(base, temp_root=out)  # torchelastic's temporary folders go into ``out``
    cmd = torchrun_command(nproc, "harness.calibrate", "--worker", str(out))
    with terminate_as_interrupt():  # SIGTERM cleans up like SIGINT
        proc = subprocess.Popen(cmd, env=e, cwd=out, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            kill_all(proc, [])
    f = out / "calibration.json"
    if not f.exists():
        raise RuntimeError(f"calibration with {nproc} processes failed (see {out})")
    res = json.loads(f.read_text())
    shutil.rmtree(out, ignore_errors=True)
    if res["all_reduce"]:
        rows = res["all_reduce"]
        alpha, bw = fit_alpha_beta(
            np.array([r["group_size"] for r in rows]), np.array([r["bytes"] for r in rows]),
            np.array([r["time_s"] for r in rows]),
        )  # fmt: skip
        res["gloo_latency_s"], res["gloo_bw_bytes_per_s"] = alpha, bw
    return res


def _valid_run(run: Any, nproc: int) -> bool:
    """Whether a cached measurement has every number :func:`local_cluster` reads."""
    keys = ["copy_bytes_per_s", "op_overhead_s"] + (
        ["gloo_bw_bytes_per_s", "gloo_latency_s"] if nproc > 1 else [])
    if not isinstance(run, dict) or not isinstance(run.get("matmul_flops_per_s"), dict):
        return False
    nums = [run.get(k) for k in keys] + list(run["matmul_flops_per_s"].values())
    return bool(run["matmul_flops_per_s"]) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
        for x in nums)


def read_cache(path: Path, host: dict[str, Any]) -> dict[str, Any]:
    """The cached calibration of ``host`` at ``path``; an absent, empty, corrupt or foreign
    cache (or a corrupt entry in it) counts as absent."""
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = None
    if not isinstance(cache, dict) or cache.get("host") != host or not isinstance(
            cache.get("runs"), dict):
        return {"host": host, "runs": {}}
    runs = {n: r for n, r in cache["runs"].items() if n.isdigit() and _valid_run(r, int(n))}
    return {"host": host, "runs": runs}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock (``fcntl.flock`` on ``path.lock``) for a read-modify-write of the
    cache: two calibrations started together measure once and keep both results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def calibrate(
    nprocs: tuple[int, ...] = (1, 2, 4, 8),
    path: str | Path | None = None,
    *,
    force: bool = False,
    timeout_s: float = 180.0,
) -> dict[str, Any]:
    """Measure (or read from the cache) the local machine for each process count in ``nprocs``.

    The cache is read and updated under a lock and replaced atomically (temporary file and
    rename), and only when something was measured."""
    p = Path(path) if path else DEFAULT_PATH
    host = {"machine": platform.machine(), "cpus": os.cpu_count(), "node": platform.node()}
    with _locked(p):
        cache = {"host": host, "runs": {}} if force else read_cache(p, host)
        missing = [n for n in nprocs if str(n) not in cache["runs"]]
        for n in missing:
            cache["runs"][str(n)] = _run_one(n, timeout_s)
        if missing:
            atomic_write(p, json.dumps(cache, indent=1))
    return cache


def local_cluster(nproc: int, calibration: dict[str, Any]) -> ClusterSpec:
    """ClusterSpec ``local`` for ``nproc`` processes from a :func:`calibrate` result."""
    run = calibration["runs"][str(nproc)]
    flops = max(run["matmul_flops_per_s"].values())
    tf = flops / units.TERA
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu = GPUSpec(
        name="local-cpu-process",
        vendor="cpu",
        peak_tflops=PeakTflops(fp32=tf, tf32=tf, bf16=tf, fp16=tf),
        hbm_gib=ram / nproc / units.GIB,
        hbm_tbyte_per_s=run["copy_bytes_per_s"] / units.TERA,
        launch_overhead_us=run["op_overhead_s"] / units.US,  # per-op eager dispatch, measured
    )
    if nproc > 1:
        tier = LinkTier(
            name="gloo-local", kind="gloo", domain_size=nproc,
            bw_gbyte_per_s=run["gloo_bw_bytes_per_s"] / units.GIGA,
            latency_us=run["gloo_latency_s"] / units.US,
        )  # fmt: skip
    else:
        tier = LinkTier(name="gloo-local", kind="gloo", domain_size=1, bw_gbyte_per_s=1e3)
    return ClusterSpec(
        name=f"local-{nproc}",
        gpu=gpu,
        gpus_per_node=nproc,
        num_nodes=1,
        tiers=[tier],
        description=(
            f"this machine, {nproc} gloo processes on {os.cpu_count()} cores (harness.calibrate); "
            f"op_overhead_s={run['op_overhead_s']:.3g}"
        ),
    )


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        from harness.watchdog import start_parent_watchdog

        start_parent_watchdog()
        _worker(Path(sys.argv[2]))
    else:
        res = calibrate(tuple(int(a) for a in sys.argv[1:]) or (1, 2, 4, 8), force=True)
        print(json.dumps(res, indent=1))
