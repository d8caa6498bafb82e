"""Fit the time model's few physical constants on the dev split of published runs.

Parameters (each a named constant with a meaning, not a per-row factor):

* ``perfmodel.hardware.overlap.OVERLAP_SLOWDOWN["hopper"]``, ``["blackwell"]``: compute slowdown while
  overlapped communication runs (Calculon ``processor_usage``; Galvatron 1.1-1.3x);
* ``perfmodel.compute.layer.LOW_PRECISION_GEMM_RATIO``: fp8 GEMM efficiency relative to bf16 at the
  same shape (against the 2x fp8 peak);
* ``perfmodel.compute.layer.LOW_PRECISION_RECIPES["mxfp8"].gemm_ratio``: MXFP8 GEMM efficiency
  relative to the tensor-wise fp8 one, from the Megatron-Bridge rows that differ only in the
  recipe (``MX_CS_PAIRS``);
* ``perfmodel.compute.layer.SUSTAINED_GEMM_FRACTION["hopper"]``: GEMM throughput of a node training at
  its power limit relative to the one-GPU matmul ceiling (MAMF); for the Blackwell parts, each
  GPU spec's ``sustained_gemm_fraction``, fitted on that part's Megatron-Bridge rows alone (no
  calibration is published for them).

The overlap slowdown is bounded to 0.05..0.4 (Galvatron measures 0.1..0.3).

Objective: mean squared log ratio predicted / measured over the rows each parameter acts on
(rows with communication overlap: NeMo 24.07, DGX Cloud NeMo 24.09, Megatron-Bridge 25.09/25.11).
Reported: the in-sample fit and leave-one-source-out cross-validation (fit on all sources but
one, predict the held-out one). Run: ``python benchmarks/fit_time_model.py [hopper|blackwell|mxfp8]
[--no-cv] [--hold-out=SOURCE ...] [--sustained-only]`` (a few minutes per fit).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from perfmodel.compute import layer as compute
from perfmodel.hardware import overlap
from validation import validate

HOPPER = ("H100", "H200")
BLACKWELL = ("B200", "GB200", "GB300")


def load_cases():
    df = pd.read_csv(validate.VALIDATION_DIR / "training_runs_dev.csv")
    cases = []
    for _, r in df.iterrows():
        try:
            c = validate.case_from_row(r)
        except Exception:  # noqa: BLE001, S112 - rows the tool cannot express are skipped
            continue
        if c.scope != "step" or not c.training.overlap_grad_reduce:
            continue
        src = str(r["source"])
        src = ("NeMo 24.07" if "24.07" in src else "DGXC NeMo 24.09" if "DGX Cloud" in src
               else "MBridge 25.09" if "25.09" in src else "MBridge 25.11")
        cases.append((src, c))
    return cases


def set_params(x, names):
    for n, v in zip(names, x):
        if n == "kappa_hopper":
            overlap.OVERLAP_SLOWDOWN["hopper"] = float(v)
        elif n == "kappa_blackwell":
            overlap.OVERLAP_SLOWDOWN["blackwell"] = float(v)
        elif n == "fp8_ratio":
            compute.LOW_PRECISION_GEMM_RATIO = float(v)
        elif n == "sustained_hopper":
            compute.SUSTAINED_GEMM_FRACTION["hopper"] = float(v)
        elif n == "sustained_blackwell":
            compute.SUSTAINED_GEMM_FRACTION["blackwell"] = float(v)


def with_mamf(case, x, names):
    gpu = case.cluster.gpu
    key = {"B200": "sustained_b200", "GB200": "sustained_gb200",
           "GB300": "sustained_gb300"}.get(gpu.name)
    if key in names:
        gpu = gpu.model_copy(update={"sustained_gemm_fraction": float(x[names.index(key)])})
        return case.__class__(**{**case.__dict__,
                                 "cluster": case.cluster.model_copy(update={"gpu": gpu})})
    return case


def log_errors(x, names, cases):
    set_params(x, names)
    return np.array([np.log(validate.predict_case(with_mamf(c, x, names)) / c.measured_step_s)
                     for _, c in cases])


def fit(names, x0, bounds, cases):
    res = minimize(lambda x: float(np.mean(log_errors(x, names, cases) ** 2)), x0,
                   method="Powell", bounds=bounds, options={"xtol": 1e-3, "ftol": 1e-5})
    return res.x


def report(title, names, x0, bounds, cases):
    t0 = time.time()
    x = fit(names, x0, bounds, cases)
    e = np.exp(log_errors(x, names, cases)) - 1
    print(f"{title}: " + ", ".join(f"{n}={v:.4g}" for n, v in zip(names, x))
          + f"  in-sample MAPE {np.mean(np.abs(e)):.2%}, bias {np.mean(e):+.2%} "
          f"({len(cases)} rows, {time.time() - t0:.0f} s)")
    srcs = sorted({s for s, _ in cases})
    cv = np.full(len(cases), np.nan)
    held_out = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--hold-out=")]
    for s in (srcs if "--no-cv" not in sys.argv else []):
        if held_out and s not in held_out:
            continue
        train = [c for c in cases if c[0] != s]
        test_idx = [i for i, c in enumerate(cases) if c[0] == s]
        if not train:
            continue
        xs = fit(names, x, bounds, train)
        cv[test_idx] = np.exp(log_errors(xs, names, [cases[i] for i in test_idx])) - 1
        print(f"  held out {s:16s}: " + ", ".join(f"{n}={v:.4g}" for n, v in zip(names, xs))
              + f"  held-out MAPE {np.nanmean(np.abs(cv[test_idx])):.2%}, "
              f"bias {np.nanmean(cv[test_idx]):+.2%} ({len(test_idx)} rows)")
    ok = ~np.isnan(cv)
    print(f"  leave-one-source-out MAPE {np.mean(np.abs(cv[ok])):.2%}")
    set_params(x, names)
    return x


#: Megatron-Bridge rows that differ only in the low-precision recipe (same release, GPU, model
#: and layout): (FP8-CS row, FP8-MX row).
MX_CS_PAIRS = (("R0154", "R0155"), ("R0158", "R0159"), ("R0162", "R0163"), ("R0164", "R0165"),
               ("R0169", "R0170"), ("R0175", "R0176"), ("R0177", "R0178"))


def fit_mxfp8_ratio(cases) -> float:
    """``compute.LOW_PRECISION_RECIPES['mxfp8'].gemm_ratio``: the mean log ratio of predicted
    MX / CS step times equals the measured one over :data:`MX_CS_PAIRS` (1-D root)."""
    from dataclasses import replace

    from scipy.optimize import brentq

    by_id = {c.row_id: c for _, c in cases}
    pairs = [(by_id[a], by_id[b]) for a, b in MX_CS_PAIRS if a in by_id and b in by_id]
    target = np.mean([np.log(b.measured_step_s / a.measured_step_s) for a, b in pairs])
    base = compute.LOW_PRECISION_RECIPES["mxfp8"]

    def gap(g):
        compute.LOW_PRECISION_RECIPES["mxfp8"] = replace(base, gemm_ratio=float(g))
        return np.mean([np.log(validate.predict_case(b) / validate.predict_case(a))
                        for a, b in pairs]) - target

    g = brentq(gap, 0.6, 1.1, xtol=1e-4)
    gap(g)
    held = []
    for i in range(len(pairs)):  # leave one pair out
        rest = pairs[:i] + pairs[i + 1:]
        t_i = np.mean([np.log(b.measured_step_s / a.measured_step_s) for a, b in rest])

        def gap_i(x, rest=rest, t_i=t_i):
            compute.LOW_PRECISION_RECIPES["mxfp8"] = replace(base, gemm_ratio=float(x))
            return np.mean([np.log(validate.predict_case(b) / validate.predict_case(a))
                            for a, b in rest]) - t_i

        gi = brentq(gap_i, 0.6, 1.1, xtol=1e-4)
        a, b = pairs[i]
        compute.LOW_PRECISION_RECIPES["mxfp8"] = replace(base, gemm_ratio=float(gi))
        pred = validate.predict_case(b) / validate.predict_case(a)
        held.append(pred / (b.measured_step_s / a.measured_step_s) - 1)
    compute.LOW_PRECISION_RECIPES["mxfp8"] = replace(base, gemm_ratio=float(g))
    print(f"mxfp8 gemm_ratio={g:.3f} from {len(pairs)} CS/MX pairs (measured MX/CS "
          f"{np.exp(target):.3f}); leave-one-pair-out MX/CS ratio error "
          f"{np.mean(np.abs(held)):.2%} (max {np.max(np.abs(held)):.2%})", flush=True)
    return g


def sustained_only(hop) -> None:
    """The Hopper sustained GEMM fraction alone (bounded scalar fit; overlap slowdown and fp8
    ratio held at their shipped values), with leave-one-source-out: a quick refit after a model
    change (``--sustained-only``; the numbers in docs/compute.md)."""
    from scipy.optimize import minimize_scalar

    names = ["kappa_hopper", "fp8_ratio", "sustained_hopper"]
    held = [overlap.OVERLAP_SLOWDOWN["hopper"], compute.LOW_PRECISION_GEMM_RATIO]

    def fit1(rows):
        return minimize_scalar(lambda x: float(np.mean(log_errors([*held, x], names, rows) ** 2)),
                               bounds=(0.7, 1.05), method="bounded",
                               options={"xatol": 2e-3}).x

    x = fit1(hop)
    e = np.exp(log_errors([*held, x], names, hop)) - 1
    print(f"sustained_hopper={x:.4f} (held: slowdown {held[0]}, fp8 ratio {held[1]}): in-sample "
          f"MAPE {np.mean(np.abs(e)):.2%}, bias {np.mean(e):+.2%} ({len(hop)} rows)", flush=True)
    for src in sorted({s for s, _ in hop}):
        xs = fit1([c for c in hop if c[0] != src])
        test = [c for c in hop if c[0] == src]
        et = np.exp(log_errors([*held, xs], names, test)) - 1
        print(f"  held out {src:16s}: sustained={xs:.3f} held-out MAPE "
              f"{np.mean(np.abs(et)):.2%}, bias {np.mean(et):+.2%} ({len(test)} rows)", flush=True)
    set_params([*held, x], names)


def main() -> None:
    cases = load_cases()
    hop = [c for c in cases if any(k in c[1].cluster.gpu.name for k in HOPPER)]
    bw = [c for c in cases if any(k in c[1].cluster.gpu.name for k in BLACKWELL)]
    which = [a for a in sys.argv[1:] if not a.startswith("--")] or ["hopper", "blackwell"]
    if "--sustained-only" in sys.argv:
        sustained_only(hop)
    elif "hopper" in which:
        report("Hopper", ["kappa_hopper", "fp8_ratio", "sustained_hopper"], [0.2, 0.85, 0.9],
               [(0.05, 0.4), (0.5, 1.0), (0.6, 1.05)], hop)
    if "mxfp8" in which or "blackwell" in which:
        fit_mxfp8_ratio(cases)
    if "blackwell" in which:
        # The overlap slowdown keeps Hopper's value (too few Blackwell rows to separate the
        # two); each part gets its own sustained fraction (their power limits differ: B200
        # 1,000 W, GB200 1,200 W, GB300 1,400 W), set by its Megatron-Bridge rows only.
        overlap.OVERLAP_SLOWDOWN["blackwell"] = overlap.OVERLAP_SLOWDOWN["hopper"]
        for part in ("B200", "GB200", "GB300"):
            rows = [c for c in bw if c[1].cluster.gpu.name == part]
            x = fit([f"sustained_{part.lower()}"], [0.9], [(0.5, 1.1)], rows)
            e = np.exp(log_errors(x, [f"sustained_{part.lower()}"], rows)) - 1
            print(f"{part}: sustained_gemm_fraction={x[0]:.3f} from rows "
                  f"{', '.join(c.row_id for _, c in rows)}: MAPE {np.mean(np.abs(e)):.2%}, "
                  f"bias {np.mean(e):+.2%}", flush=True)


if __name__ == "__main__":
    main()
