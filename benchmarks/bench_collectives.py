"""Benchmark: every collective cost for 10^6 configurations in one vectorized call each.

Run: ``python benchmarks/bench_collectives.py [N]`` (default N = 1_000_000). Prints wall times and
the per-configuration cost in nanoseconds.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from perfmodel.comm.comm_time import comm_times
from perfmodel.comm.comm_volume import comm_bytes_per_gpu
from perfmodel.hardware import collectives as c
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_cluster, load_model, load_training


def random_batch(n: int, rng: np.random.Generator) -> ConfigBatch:
    pow2 = lambda hi: 2 ** rng.integers(0, hi + 1, n)
    tp = pow2(3)
    pp = pow2(4)
    vp = np.where(pp > 1, rng.choice([1, 2, 3], n), 1)
    return ConfigBatch.from_arrays(
        dp=pow2(6),
        tp=tp,
        pp=pp,
        vp=vp,
        cp=pow2(2),
        zero_stage=rng.integers(0, 4, n),
        micro_batch_size=pow2(2),
        num_microbatches=rng.integers(1, 65, n),
        recompute=rng.integers(0, 3, n),
        sequence_parallel=(tp > 1) & rng.integers(0, 2, n).astype(bool),
        schedule=np.where(vp > 1, 2, 1),
        grad_compression=rng.integers(0, 4, n),
        topk_ratio=rng.uniform(0.001, 0.1, n),
    )


def timed(label: str, fn, n: int) -> float:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    print(f"{label:<44s} {dt * 1e3:9.1f} ms   {dt / n * 1e9:7.1f} ns/config")
    return dt


def main(n: int = 1_000_000) -> None:
    rng = np.random.default_rng(0)
    size = 10 ** rng.uniform(3, 11, n)
    group = 2 ** rng.integers(0, 11, n)
    bw = rng.uniform(10e9, 900e9, n)
    lat = rng.uniform(1e-6, 20e-6, n)
    dom = np.minimum(group, 8)

    model = load_model("gpt3-175b")
    training = load_training(global_batch_size=1536, seq_len=2048)
    cluster = load_cluster("dgx-a100-80g")
    batch = random_batch(n, rng)

    print(f"{n:,} configurations")
    total = 0.0
    for algo in c.ALGORITHMS:
        total += timed(
            f"all_reduce_time({algo})",
            lambda a=algo: c.all_reduce_time(
                size, group, bw, lat, a, domain_size=dom, inter_bw_bytes_per_s=bw / 10
            ),
            n,
        )
    for name in c.COLLECTIVES[1:]:
        total += timed(
            f"collective_time({name})", lambda k=name: c.collective_time(k, size, group, bw, lat), n
        )
    total += timed(
        "comm_bytes_per_gpu (gpt3-175b)", lambda: comm_bytes_per_gpu(model, training, batch), n
    )
    total += timed(
        "comm_times (gpt3-175b on dgx-a100-80g)",
        lambda: comm_times(model, training, cluster, batch),
        n,
    )
    print(f"{'total':<44s} {total * 1e3:9.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
