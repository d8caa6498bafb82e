"""Search speed: configurations per second and the Llama-3.1-405B / 16,384 H100 search time.

Run: ``.venv/bin/python benchmarks/bench_search.py`` (single process; pin to one core with
``taskset -c 0`` to measure per-core throughput). Prints:

- decode + constraint masks only (configurations of the raw space per second);
- the cost model alone (``perfmodel.step.evaluate`` on one batch of valid configurations);
- the whole grid path (decode, evaluate, top-k, Pareto) per valid configuration;
- the full grid search of Llama-3.1-405B on 16,384 H100s (goal: < 10 s) and GPT-3 175B on
  1024 A100s, with the goal ratios.
"""

from __future__ import annotations

import time

import numpy as np

from perfmodel.specs import load_cluster, load_model, load_training
from perfmodel.step import evaluate
from search.api import plan
from search.space import make_space

GOAL_CONFIGS_PER_S = 1e6
GOAL_405B_S = 10.0


GOAL_DP_405B_S = 30.0  # issue 19: --strategy dp on 16,384 H100


def _best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
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
    t = _best_of(lambda: evaluate(model, training, cluster, batch))
    rate_eval = n / t
    print(f"perfmodel.step.evaluate: {rate_eval:,.0f} configurations/s ({n:,} in {t:.3f} s), "
          f"goal {GOAL_CONFIGS_PER_S:,.0f}/s: ratio {rate_eval / GOAL_CONFIGS_PER_S:.2f}")

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


if __name__ == "__main__":
    main()
