"""A step evaluated under an efficiency profile (:mod:`perfmodel.hardware.profile`): the
profile's kernel and link scalings applied to the inputs, its fixed per-step overhead added as
the ``host`` time term."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.hardware.calibration import calibration_for
from perfmodel.hardware.profile import EfficiencyProfile, load_profile
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec
from perfmodel.step.evaluate import evaluate as step_evaluate

__all__ = ["evaluate_profiled"]


def evaluate_profiled(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, batch,
             *, profile: EfficiencyProfile | str | Path | None = None, kernels: str = "fused",
             calibration: Any = None, evaluator=None):
    """:func:`perfmodel.step.evaluate.evaluate` under ``profile`` (None or neutral: exactly the same).

    The profile scales the kernel rates and link bandwidths the step model reads, then adds
    ``step_overhead_ms`` to every step as the ``host`` time term (throughput, MFU and HFU
    follow the longer step).
    """
    if evaluator is None:
        evaluator = step_evaluate
    prof = load_profile(profile)
    if prof is None or prof.is_neutral:
        kw = {} if calibration is None else {"calibration": calibration}
        return evaluator(model, training, cluster, batch, kernels=kernels, **kw)
    cal = prof.calibration(calibration_for(cluster.gpu, calibration), training.precision)
    res = evaluator(model, training, prof.cluster(cluster), batch, kernels=kernels,
                    calibration=cal)
    return add_host_time(res, prof.step_overhead_s)


def add_host_time(res, host_s: float):
    """``res`` (a StepResult) with ``host_s`` seconds added to every step."""
    if host_s == 0.0:
        return res
    step = res.step_time_s + host_s
    r = step / res.step_time_s
    time_s = dict(res.time_s)
    time_s["host"] = time_s.get("host", np.zeros_like(step)) + host_s
    return replace(res, step_time_s=step, tokens_per_s=res.tokens_per_s / r, mfu=res.mfu / r,
                   hfu=res.hfu / r, time_s=time_s)
