"""Search speed: configurations per second and the Llama-3.1-405B / 16,384 H100 search time.

Run: ``.venv/bin/python benchmarks/bench_search.py`` (single process; pin to one core with
``taskset -c 0`` to measure per-core throughput). Prints:

- decode + constraint masks only (configurations of the raw space per second);
- the cost model alone (``perfmodel.step.evaluate.evaluate`` on one batch of valid configurations,
  a fresh copy of the batch each run: a batch memoizes its layer counts and distinct rows), as a
  ratio to the goal of 1.5 M configurations/s per core;
- the wall time of one ``plan`` command with a preset, start-up included (a subprocess; goal
  <= 1.5 s), median of a few runs;
- the whole grid path (decode, evaluate, top-k, Pareto) per valid configuration;
- the full grid search of Llama-3.1-405B on 16,384 H100s (goal: < 10 s) and GPT-3 175B on
  1024 A100s, with the goal ratios;
- the DeepSeek-V3 plan on 256 GB200 (``plan --model deepseek-v3 --cluster gb200-nvl72
  --gpus 256 --global-batch 8192 --seq-len 4096``, goal: < 10 s);
- the real-time planner on 32 identical models (feasible and infeasible with degraded mode;
  goal: < 10 s each; exponential over subsets before, > 120 s for 16 models);
- the GPT-3 175B search on an idle machine and with a busy neighbour (one process spinning
  on every core), with the BLAS / OpenMP threads limited to one inside the search (the default,
  :func:`search.api.search_threads`) and without the limit (goal: busy within 3x of idle).
  ``--busy-only`` runs just this part, ``--moe-only`` the DeepSeek-V3 and real-time lines,
  ``--quick`` the cost model and the command's wall time only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate
from search.api import plan
from search.space import make_space

GOAL_CONFIGS_PER_S = 1e6  # whole grid path, valid configurations per second
GOAL_EVAL_PER_S = 1.5e6  # the cost model alone, configurations per second per core
GOAL_COMMAND_S = 1.5  # `plan` with a preset, wall time start-up included
COMMAND = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "64", "--top", "1"]
GOAL_405B_S = 10.0


GOAL_DP_405B_S = 30.0  # --strategy dp on 16,384 H100
GOAL_DEEPSEEK_S = 10.0  # the DeepSeek-V3 plan on 256 GB200
GOAL_REALTIME_S = 10.0  # 32 models on the real-time planner


def _best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


GOAL_BUSY_OVER_IDLE = 3.0


def _spin() -> None:  # a neighbour that keeps one core busy
    while True:
        pass


@contextlib.contextmanager
def busy_neighbours(n: int | None = None):
    """``n`` processes (default: one per core) spinning for the duration of the block."""
    procs = [mp.Process(target=_spin, daemon=True) for _ in range(n or os.cpu_count() or 1)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()


def _search_s(limit_threads: bool, repeat: int = 5) -> list[float]:
    from search import api

    saved = api.search_threads
    if not limit_threads:
        api.search_threads = contextlib.nullcontext
    try:
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            plan("gpt3-175b", "dgx-a100-80g", global_batch_size=1536, seq_len=2048)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        api.search_threads = saved


def busy_report(repeat: int = 5) -> dict[str, list[float]]:
    """GPT-3 175B grid search wall times [s]: idle / busy neighbour, threads limited or not."""
    plan("gpt3-175b", "dgx-a100-80g")  # warm imports and caches
    res = {"idle, threads limited": _search_s(True, repeat),
           "idle, threads unlimited": _search_s(False, repeat)}
    with busy_neighbours():
        res["busy, threads limited"] = _search_s(True, repeat)
        res["busy, threads unlimited"] = _search_s(False, repeat)
    env = "set by the user" if any(os.environ.get(k) for k in (
        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")) else "not set"
    print(f"GPT-3 175B grid search, {repeat} runs each, {os.cpu_count()} cores, busy = one "
          f"spinning process per core; BLAS thread variables {env}:")
    for k, v in res.items():
        print(f"  {k:26s} median {statistics.median(v):6.2f} s  max {max(v):6.2f} s  "
              f"(min {min(v):.2f} s)")
    ratio = statistics.median(res["busy, threads limited"]) / statistics.median(
        res["idle, threads limited"])
    print(f"  busy / idle (threads limited, medians): {ratio:.2f} "
          f"(goal <= {GOAL_BUSY_OVER_IDLE:.0f})")
    return res


def realtime_spec(n: int, bound_ms: float, devices: int = 2, gflops: float = 2000.0) -> dict:
    """``n`` identical models (``gflops`` each, priorities 1..n) on ``devices`` identical
    100 TFLOP/s devices: the shape of tests/realtime/test_realtime.py's 32-model cases."""
    dev = {"peak_tflops": 100.0, "mem_bw_gbyte_per_s": 1000.0, "memory_gib": 10.0,
           "compute_efficiency": 1.0, "memory_efficiency": 1.0}
    return {"devices": [{"name": f"d{j}", **dev} for j in range(devices)],
            "models": [{"name": f"m{i:02d}", "gflops": gflops, "weights_mib": 1.0, "layers": 10,
                        "latency_ms": bound_ms, "period_ms": 100.0, "priority": i + 1}
                       for i in range(n)]}


def moe_and_realtime_report() -> None:
    """The DeepSeek-V3 plan on 256 GB200 and the 32-model real-time plans, with goal ratios."""
    from realtime.placement import plan_realtime

    r = plan("deepseek-v3", "gb200-nvl72", gpus=256, global_batch_size=8192, seq_len=4096,
             top=3)
    print(f"grid, DeepSeek-V3 on 256 GB200 (B=8192, seq 4096): {r.evaluated:,} valid of "
          f"{r.space_size:,} in {r.seconds:.2f} s (goal < {GOAL_DEEPSEEK_S:.0f} s: ratio "
          f"{r.seconds / GOAL_DEEPSEEK_S:.2f})")
    for label, spec in (("infeasible, degraded", realtime_spec(32, 70.0)),
                        ("feasible", realtime_spec(32, 100.0, devices=4, gflops=100.0))):
        t0 = time.perf_counter()
        plan_realtime(spec)
        t = time.perf_counter() - t0
        print(f"real-time, 32 models ({label}): {t:.2f} s (goal < {GOAL_REALTIME_S:.0f} s: "
              f"ratio {t / GOAL_REALTIME_S:.2f})")


def command_wall_s(repeat: int = 5, cpu: list[float] | None = None) -> list[float]:
    """Wall times [s] of ``plan`` + :data:`COMMAND` in a fresh interpreter (imports included);
    the command's CPU time (user + system) of each run is appended to ``cpu`` when given (on a
    machine other jobs share, the CPU time is what an idle core's wall time would be)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = "import sys; sys.argv[0] = 'plan'; from cli.main import main; main()"
    argv = [sys.executable, "-c", code, *COMMAND]
    out = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, cwd=root, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return out


def eval_rate(model, training, cluster, batch, repeat: int = 5) -> float:
    """Configurations per second of the cost model on ``batch`` (best of ``repeat``, CPU time of
    this process: a fresh copy of the batch each run, as a search evaluates each batch once)."""
    times = []
    for _ in range(repeat):
        fresh = type(batch)(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)})
        t0 = time.process_time()
        evaluate(model, training, cluster, fresh)
        times.append(time.process_time() - t0)
    return len(batch) / min(times)


def quick_report() -> None:
    """The cost model's rate and the command's wall time, as ratios to their goals."""
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100-80g")
    training = load_training(global_batch_size=1536, seq_len=2048)
    space = make_space(model, training, cluster)
    a, viol = space.decode_flat(np.arange(space.size, dtype=np.int64))
    batch = space.batch(a, np.flatnonzero(viol == 0))
    evaluate(model, training, cluster, batch)  # warm the caches (calibration, presets)
    rate = eval_rate(model, training, cluster, batch)
    print(f"perfmodel.step.evaluate.evaluate: {rate:,.0f} configurations/s per core "
          f"({len(batch):,} per batch, CPU time, best of 5), goal {GOAL_EVAL_PER_S:,.0f}/s: "
          f"ratio {rate / GOAL_EVAL_PER_S:.2f}")
    cpu: list[float] = []
    w = command_wall_s(cpu=cpu)
    med = statistics.median(w)
    print(f"plan {' '.join(COMMAND)}: wall median {med:.2f} s (min {min(w):.2f}, max "
          f"{max(w):.2f}, {len(w)} runs), goal <= {GOAL_COMMAND_S} s: ratio "
          f"{med / GOAL_COMMAND_S:.2f}; CPU time (user + system) min {min(cpu):.2f} s: ratio "
          f"{min(cpu) / GOAL_COMMAND_S:.2f}")


def main() -> None:
    if "--quick" in sys.argv:
        quick_report()
        return
    if "--moe-only" in sys.argv:
        moe_and_realtime_report()
        return
    if "--busy-only" in sys.argv:
        busy_report()
        return
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100-80g")
    training = load_training(global_batch_size=1536, seq_len=2048)
    space = make_space(model, training, cluster)
    flat = np.arange(min(space.size, 2**18), dtype=np.int64)

    t = _best_of(lambda: space.decode_flat(flat))
    print(f"decode+masks: {flat.size / t:,.0f} raw configurations/s ({flat.size:,} in {t:.3f} s)")

    a, viol = space.decode_flat(np.arange(space.size, dtype=np.int64))
    batch = space.batch(a, np.flatnonzero(viol == 0))
    n = len(batch)
    evaluate(model, training, cluster, batch)  # warm the caches (calibration, presets)
    rate_eval = eval_rate(model, training, cluster, batch)
    print(f"perfmodel.step.evaluate.evaluate: {rate_eval:,.0f} configurations/s per core "
          f"({n:,} per batch, CPU time), goal {GOAL_EVAL_PER_S:,.0f}/s: ratio "
          f"{rate_eval / GOAL_EVAL_PER_S:.2f}")
    w = statistics.median(command_wall_s())
    print(f"plan {' '.join(COMMAND)}: wall median {w:.2f} s, goal <= {GOAL_COMMAND_S} s: ratio "
          f"{w / GOAL_COMMAND_S:.2f}")

    r = plan(model, cluster, training)
    rate = r.evaluated / r.seconds
    print(f"grid, GPT-3 175B on 1024 A100-80GB: {r.evaluated:,} valid of {r.space_size:,} in "
          f"{r.seconds:.2f} s = {rate:,.0f} valid configurations/s "
          f"({r.space_size / r.seconds:,.0f} raw/s); goal ratio {rate / GOAL_CONFIGS_PER_S:.2f}")

    r = plan("llama3.1-405b", "dgx-h100", gpus=16384, global_batch_size=2048, seq_len=8192)
    print(f"grid, Llama-3.1-405B on 16,384 H100 (B=2048, seq 8192): {r.evaluated:,} valid of "
          f"{r.space_size:,} in {r.seconds:.2f} s (goal < {GOAL_405B_S:.0f} s: ratio "
          f"{r.seconds / GOAL_405B_S:.2f}); best {r.rows[0]['config'] if r.rows else None}")
    r = plan("llama3.1-405b", "dgx-h100", gpus=16384, global_batch_size=2048, seq_len=8192,
             uneven_layers=True)
    print(f"  with uneven stages (pp*vp need not divide 126 layers): {r.evaluated:,} valid of "
          f"{r.space_size:,} in {r.seconds:.2f} s")
    g_best = r.rows[0]["step_time_s"] if r.rows else float("inf")
    r = plan("llama3.1-405b", "dgx-h100", gpus=16384, global_batch_size=2048, seq_len=8192,
             strategy="dp")
    print(f"dp, Llama-3.1-405B on 16,384 H100: {r.evaluated:,} evaluated "
          f"({r.stats()['layouts']:,} DP layouts of {r.stats()['dp_solved']:,} outer points) in "
          f"{r.seconds:.2f} s (goal < {GOAL_DP_405B_S:.0f} s: ratio "
          f"{r.seconds / GOAL_DP_405B_S:.2f}); best {r.rows[0]['step_time_s']:.3f} s vs grid "
          f"{g_best:.3f} s, layout {r.rows[0]['config']['stage_layers']}")
    moe_and_realtime_report()
    busy_report()


if __name__ == "__main__":
    main()
