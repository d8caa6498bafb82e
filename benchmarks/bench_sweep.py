"""Sweep throughput: scenarios per second in one process and on a Dask LocalCluster of 1 and
2 worker processes, on a 1,000-scenario spec of small searches (GPT-3 125M / 350M on 1-16
GPUs of two clusters, five batches, five sequence lengths, two HBM sizes).

Run: ``.venv/bin/python benchmarks/bench_sweep.py [--scenarios N]`` (N < 1000 keeps the
first N values' product smaller: fewer global batches and sequence lengths). The Dask times
include starting and closing the LocalCluster (what ``plan sweep`` costs); the ratios say how
the sweep scales with workers. Each worker is one process with one thread: on a machine with
fewer idle cores than workers, the ratios fall below the worker count.
"""

from __future__ import annotations

import argparse
import os
import time

from sweep import load_sweep_spec, sweep

SPEC = {
    "models": ["gpt3-125m", "gpt3-350m"],
    "clusters": ["dgx-h100", "dgx-a100-80g"],
    "gpus": [1, 2, 4, 8, 16],
    "global_batch": [8, 16, 32, 64, 128],
    "seq_len": [512, 1024, 2048, 4096, 8192],
    "overrides": {"gpu.hbm_gib": [40, 80]},
}


def _spec(n: int):
    spec = dict(SPEC)
    k = 5
    while k > 1 and 2 * 2 * 5 * k * k * 2 > n:
        k -= 1
    spec["global_batch"] = SPEC["global_batch"][:k]
    spec["seq_len"] = SPEC["seq_len"][:k]
    return load_sweep_spec(spec)


def _rate(spec, **kw) -> tuple[float, float, object]:
    t0 = time.perf_counter()
    table = sweep(spec, **kw)
    s = time.perf_counter() - t0
    return spec.size / s, s, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=1000)
    args = ap.parse_args()
    spec = _spec(args.scenarios)
    print(f"{spec.size} scenarios; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f} at start")
    single, s0, ref = _rate(spec, workers=0)
    print(f"single process: {single:7.2f} scenarios/s ({s0:.1f} s)")
    rates = {}
    for w in (1, 2):
        rates[w], s, table = _rate(spec, workers=w)
        same = table.equals(ref)
        print(f"LocalCluster, {w} worker{'s' if w > 1 else ''}: {rates[w]:7.2f} scenarios/s "
              f"({s:.1f} s, startup included); rows identical to single process: {same}")
    print(f"ratios: 1 worker / single {rates[1] / single:.2f}, 2 workers / single "
          f"{rates[2] / single:.2f}, 2 workers / 1 worker {rates[2] / rates[1]:.2f} "
          f"(ideal 2.00); load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
