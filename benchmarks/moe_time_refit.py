"""Joint refit of the MoE time constants fitted on ``moe_runs_dev.csv``.

Parameters (each a named constant with its meaning in its docstring):
``perfmodel.moe.experts.MOE_EXPERT_HOST_S`` (host time per local expert and layer pass),
``perfmodel.moe.experts.MOE_A2A_OVERLAP_HIDDEN`` (share of the all-to-all the EP overlap hides),
``perfmodel.moe.experts.MOE_HOST_SYNC_S`` (per layer pass hook, shipped 0) and
``perfmodel.moe.dispatch.TE_KERNEL_HOST_S`` (per TE kernel of a synced layer, hook, shipped 0).
Objective: the MAPE of the step time over the expressible rows; scipy Nelder-Mead from the
shipped point (bounded by clipping). Leave-one-model-out: refit on the other models, score the
held-out model's rows.

``--grid``: the joint grid of ``MOE_EXPERT_HOST_S`` (per local expert and pass, host / series)
and ``perfmodel.moe.experts.TE_GROUPED_GEMM_SLOWDOWN`` (TE's multi-stream grouped GEMM over the
calibrated single GEMM), the other constants at their shipped values; in-sample best and
leave-one-model-out (each fold picks its grid point on the other models).

Run: ``python -m benchmarks.moe_time_refit [--fp32-grads] [--grid]``.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from perfmodel.core.errors import SpecError
from perfmodel.hardware import calibration
from perfmodel.moe import dispatch as moe_dispatch
from perfmodel.moe import experts as moe
from perfmodel.step.evaluate import evaluate
from validation import validate_moe as vm
from validation.validate import VALIDATION_DIR

NAMES = ("MOE_EXPERT_HOST_S", "MOE_A2A_OVERLAP_HIDDEN", "MOE_HOST_SYNC_S", "TE_KERNEL_HOST_S")
MODULES = (moe, moe, moe, moe_dispatch)
SCALE = np.array([1e-4, 1.0, 1e-4, 1e-5])  # the optimiser works on x / SCALE
LO = np.array([0.0, 0.0, 0.0, 0.0])
HI = np.array([1e-3, 1.0, 2e-3, 2e-4])


def _memoize_gemm_lookup() -> None:
    """The GEMM calibration interpolation does not depend on the fitted constants and is
    most of an evaluation's time: cache it per (calibration, table, points) during the fit."""
    orig = calibration.Calibration._lookup
    if getattr(orig, "_memo", False):
        return
    cache: dict = {}

    def lookup(self, key, name, pts):
        pts = np.asarray(pts, dtype=np.float64)
        k = (id(self), key, name, pts.shape, pts.tobytes())
        if k not in cache:
            cache[k] = orig(self, key, name, pts)
        return cache[k]

    lookup._memo = True
    calibration.Calibration._lookup = lookup


def cases() -> list[tuple]:
    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv")
    out = []
    for _, r in df.iterrows():
        try:
            case = vm.moe_case_from_row(r, df)
        except SpecError:  # refused rows (stated limits)
            continue
        model, batch = vm.timed_model_and_batch(r, case)
        out.append((case.label, model, case.training, case.cluster, batch, case.measured_step_s))
    return out


def set_params(x) -> None:
    for mod, name, v in zip(MODULES, NAMES, x):
        setattr(mod, name, float(v))


def errors(cs, x) -> np.ndarray:
    set_params(x)
    return np.array([float(evaluate(m, t, c, b).step_time_s[0]) / meas - 1.0
                     for _, m, t, c, b, meas in cs])


def fit(cs, x0) -> np.ndarray:
    def obj(z):
        x = np.clip(z * SCALE, LO, HI)
        return float(np.abs(errors(cs, x)).mean())
    res = minimize(obj, np.asarray(x0) / SCALE, method="Nelder-Mead",
                   options={"xatol": 1e-2, "fatol": 1e-5, "maxfev": 70})
    return np.clip(res.x * SCALE, LO, HI)


GRID_HOST_S = (6e-5, 7e-5, 8e-5, 9e-5, 1e-4, 1.1e-4, 1.3e-4)
GRID_SLOWDOWN = (0.0, 0.1, 0.2, 0.3, 0.4)


def grid_fit(cs) -> None:
    """The ``--grid`` fit (see the module docstring); prints in-sample and LOMO MAPE."""
    shipped = (moe.MOE_EXPERT_HOST_S, moe.TE_GROUPED_GEMM_SLOWDOWN)
    labels = np.array([c[0] for c in cs])
    errs = {}
    for host in GRID_HOST_S:
        for slow in GRID_SLOWDOWN:
            moe.MOE_EXPERT_HOST_S, moe.TE_GROUPED_GEMM_SLOWDOWN = host, slow
            errs[(host, slow)] = np.array([float(evaluate(m, t, c, b).step_time_s[0]) / meas - 1
                                           for _, m, t, c, b, meas in cs])
            e = np.abs(errs[(host, slow)])
            print(f"  host {host:.2e} s  slowdown {slow:.2f}: MAPE {e.mean():.4f} "
                  f"within10 {(e <= 0.1).mean():.3f}")
    best = min(errs, key=lambda k: np.abs(errs[k]).mean())
    lomo = np.zeros(len(cs))
    for lab in sorted(set(labels)):
        held = labels == lab
        k = min(errs, key=lambda k: np.abs(errs[k][~held]).mean())
        lomo[held] = errs[k][held]
        print(f"  fold {lab:24s} n={held.sum():2d} picks {k}  held-out MAPE "
              f"{np.abs(lomo[held]).mean():.4f}")
    e = np.abs(errs[best])
    print(f"grid best {best}: MAPE {e.mean():.4f} within10 {(e <= 0.1).mean():.3f}; "
          f"LOMO MAPE {np.abs(lomo).mean():.4f} within10 {(np.abs(lomo) <= 0.1).mean():.3f}")
    moe.MOE_EXPERT_HOST_S, moe.TE_GROUPED_GEMM_SLOWDOWN = shipped


def main(argv: list[str]) -> None:
    if "--fp32-grads" in argv:
        vm.RECIPE_GRAD_DTYPE = False
    _memoize_gemm_lookup()
    if "--grid" in argv:
        grid_fit(cases())
        return
    shipped = np.array([getattr(m, n) for m, n in zip(MODULES, NAMES)])
    cs = cases()
    labels = np.array([c[0] for c in cs])
    e0 = errors(cs, shipped)
    print(f"rows {len(cs)}  shipped {shipped}  MAPE {np.abs(e0).mean():.4f} "
          f"within10 {(np.abs(e0) <= 0.1).mean():.3f}")
    x_all = fit(cs, shipped)
    e1 = errors(cs, x_all)
    print(f"in-sample fit {x_all}  MAPE {np.abs(e1).mean():.4f} "
          f"within10 {(np.abs(e1) <= 0.1).mean():.3f}")
    lomo_fit = np.zeros(len(cs))
    for lab in sorted(set(labels)):
        held = labels == lab
        train = [c for c, h in zip(cs, held) if not h]
        test = [c for c, h in zip(cs, held) if h]
        xf = fit(train, shipped)
        lomo_fit[held] = errors(test, xf)
        print(f"  fold {lab:24s} n={held.sum():2d} params {xf}  "
              f"held-out MAPE {np.abs(lomo_fit[held]).mean():.4f}")
    print(f"LOMO MAPE (refit per fold) {np.abs(lomo_fit).mean():.4f}")
    set_params(shipped)


if __name__ == "__main__":
    main(sys.argv[1:])
