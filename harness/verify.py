"""Check the planner's predictions against real runs of the harness.

:func:`verify` runs each configuration with :func:`harness.launch.run_config` (one torchrun job
each, failures reported and skipped), predicts the same configurations with
:func:`perfmodel.step.evaluate.evaluate` on the calibrated ``local`` cluster (:mod:`harness.calibrate`),
and returns predicted versus measured step time, communication bytes per dimension and peak
memory per configuration, with the Spearman rank correlation of step times.

The search that picks the configurations (top K plus a few deliberately poor ones) is wired by
the caller (``plan verify``); this module takes the list.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.calibrate import calibrate, local_cluster
from harness.isolation import private_temp_root
from harness.launch import job_spec, run_config
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec
from perfmodel.step.evaluate import evaluate
from search.api import MAX_TOP, plan

__all__ = ["harness_training", "select_configs", "spearman", "verify"]


def harness_training(global_batch_size: int = 8, seq_len: int = 32) -> TrainingSpec:
    """What the harness runs: fp32 everywhere, AdamW, no communication overlap features.

    Eager PyTorch on CPU: DP gradient reductions run after the backward (a single bucket for a
    tiny model), TP collectives are not overlapped, CPU ``scaled_dot_product_attention`` uses the
    flash kernel (no s^2 scores kept).
    """
    return TrainingSpec(
        global_batch_size=global_batch_size,
        seq_len=seq_len,
        precision="fp32",
        optimizer="adamw",
        overlap_grad_reduce=False,
        overlap_tp_comm=False,
        overlap_p2p_comm=False,
        flash_attention=True,
    )


def spearman(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); nan with fewer than 3 pairs.

    References: Spearman 1904; computed as Pearson correlation of ranks (scipy.stats.spearmanr).
    """
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 3:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def select_configs(
    model: ModelSpec,
    nproc: int,
    top_k: int,
    *,
    cluster: ClusterSpec,
    training: TrainingSpec | None = None,
    num_poor: int = 3,
    kernels: str = "eager",
) -> list[dict]:
    """The planner's ``top_k`` configurations for ``nproc`` local processes that the harness
    can run (the best of each dp x tp x pp layout first), plus ``num_poor`` deliberately poor
    ones (evenly spaced over the slower half of the ranking) for spread.

    Searches with :func:`search.api.plan` (grid, every configuration, ``cp = 1``, no gradient
    compression: the harness implements neither) and drops those :func:`harness.worker.check_config`
    refuses. Returns config dicts, fastest predicted first, the poor ones last.
    """
    from harness.worker import ConfigRefused, check_config


    training = training or harness_training()
    # every configuration: a harness model on <= 64 processes has under 1000 that fit
    res = plan(model, cluster, training, strategy="grid", top=MAX_TOP, kernels=kernels,
               cp=1)  # fmt: skip
    runnable = []
    for row in res.rows:
        c = dict(row["config"])
        try:
            check_config(c, model, training.global_batch_size, training.seq_len)
        except ConfigRefused:
            continue
        if c not in runnable:
            runnable.append(c)
    # the best configuration of each (dp, tp, pp) layout first, fastest first, then the rest in
    # rank order: the top picks mix layouts instead of ZeRO variants of one layout
    seen, first, later = set(), [], []
    for c in runnable:
        key = (c["dp"], c["tp"], c["pp"])
        (later if key in seen else first).append(c)
        seen.add(key)
    top = sorted(first[:top_k], key=runnable.index)
    top += later[: top_k - len(top)]
    rest = [c for c in runnable if c not in top]
    half = rest[len(rest) // 2 :]
    poor = []
    if half and num_poor > 0:
        idx = np.unique(np.linspace(0, len(half) - 1, num_poor).round().astype(int))
        poor = [half[i] for i in idx]
    return top + poor


def verify(
    model: ModelSpec,
    nproc: int,
    top_k: int | None = None,
    *,
    configs: list[ParallelConfig | dict],
    training: TrainingSpec | None = None,
    cluster: ClusterSpec | None = None,
    calibration_path: str | Path | None = None,
    kernels: str = "eager",
    timeout_s: float = 240.0,
    warmup_steps: int = 2,
    timed_steps: int = 3,
    dp_impl: str = "auto",
    progress: Callable[[int, int, dict], None] | None = None,
) -> dict[str, Any]:
    """Run ``configs[:top_k]`` on ``nproc`` local processes and compare with the predictions.

    Returns ``{"spearman": float, "runs": [{"config", "predicted", "measured", "ok", "error"}]}``;
    ``predicted`` and ``measured`` both hold ``step_time_s``, ``comm_bytes`` (per dimension, bytes
    sent per step by the busiest rank) and ``peak_memory_bytes`` (largest rank).
    """
    training = training or harness_training()
    if cluster is None:
        cluster = local_cluster(nproc, calibrate((nproc,), calibration_path))
    chosen = list(configs)[: top_k if top_k else None]
    with private_temp_root():  # every run's folders in one root, removed also on interrupt
        runs = []
        for i, c in enumerate(chosen):
            pc = c if isinstance(c, ParallelConfig) else ParallelConfig(**c)
            row: dict[str, Any] = {"config": pc.model_dump()}
            try:
                pc = resolve_config(pc, model, training, cluster)
                row["config"] = pc.model_dump()
                pred = evaluate(
                    model, training, cluster, ConfigBatch.from_configs([pc]), kernels=kernels
                )
                row["predicted"] = {
                    "step_time_s": float(pred.step_time_s[0]),
                    "comm_bytes": {k: float(v[0]) for k, v in pred.comm_bytes_per_gpu.items()},
                    "peak_memory_bytes": float(pred.memory_bytes["peak"][0]),
                }
            except SpecError as err:
                row.update(ok=False, error=str(err))
                runs.append(row)
                continue
            job = job_spec(
                pc, model, global_batch_size=training.global_batch_size, seq_len=training.seq_len,
                warmup_steps=warmup_steps, timed_steps=timed_steps, dp_impl=dp_impl,
            )  # fmt: skip
            res = run_config(job, nproc, timeout_s=timeout_s)
            row["ok"] = bool(res.get("ok"))
            if row["ok"]:
                row["measured"] = {
                    "step_time_s": res["step_time_s"],
                    "comm_bytes": res["comm_bytes"],
                    "peak_memory_bytes": res["peak_memory_bytes"],
                    "losses": res["losses"],
                    "dp_impl": res["dp_impl"],
                }
            else:
                row["error"] = res.get("error")
            runs.append(row)
            if progress:
                progress(i, len(chosen), row)
    ok = [r for r in runs if r.get("ok") and math.isfinite(r["predicted"]["step_time_s"])]
    rho = spearman(
        [r["predicted"]["step_time_s"] for r in ok], [r["measured"]["step_time_s"] for r in ok]
    )
    return {"spearman": rho, "runs": runs, "cluster": cluster.model_dump()}
