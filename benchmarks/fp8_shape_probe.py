"""Probe of two shape-dependent FP8 GEMM prices against the dev split.

Variant ``flat`` prices a Transformer Engine fp8 GEMM at the bf16 efficiency of the
same ``(m, n, k, layout)`` times ``compute.LOW_PRECISION_GEMM_RATIO`` (0.85) and the recipe's
ratio, against the 2x fp8 peak: one ratio for every shape. This script scores the two shape
terms published FP8 kernels suggest against the dev split's FP8 groups (docs/compute.md,
"FP8 GEMM efficiency by shape"); the first ships on Hopper (``compute.low_precision_tile_factor``):

* ``k0`` -- a per-tile fixed cost (prologue, bf16 epilogue / TMA store, scale application) that
  does not halve when the main loop runs at the fp8 rate: the fp8 GEMM time is multiplied by
  ``(1 + k0 / K) / (1 + k0 / K_ref)`` with ``K`` the GEMM's reduction length (fwd ``k``, dgrad
  ``n``, wgrad ``m``) and ``K_ref`` the length at which the fitted 0.85 is left unchanged.
  ``k0`` from ``benchmarks/published_fp8_gemm_h800.csv``: tile-lang's
  per-tensor fp8 sweep (M = N = 8192, K 2048 -> 16384: 1343 -> 1541 TFLOP/s) fits
  ``k0 = 350``; DeepGEMM's block-scaled table (M = 4096, N = 7168, K 2048 vs 16384: 1025 vs
  1358) fits ``k0 = 800``.
* ``tn`` -- Hopper fp8 GEMMs run TN only (cuBLASLt: fp8 needs the TN layout; TE keeps a
  transposed fp8 copy for the dgrad and wgrad GEMMs, ``quantizer.cpp`` ``with_transpose``):
  each fp8 GEMM takes the efficiency of the H200 table's TN op (``gy @ wt.t()``, its ``dgrad``
  rows, both operands contiguous along the reduction) at its own (output, reduction) shape,
  instead of the layout the bf16 GEMM would run in.

Prints per variant: the dense MAPE (147 rows), the H100 fp8 rows' MAPE, the MoE low-precision
rows' MAPE, the Megatron-Bridge H100 Llama 3 rows, and with ``--cv`` the leave-one-group-out
cross-validation (``validation.calibrate.cross_validate``, ~30 s per variant).

Run: ``python -m benchmarks.fp8_shape_probe [--cv] [--variants flat,shipped,k0=800,tn]``.
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np

from perfmodel.compute import layer as compute
from perfmodel.hardware.overlap import gpu_generation

BRIDGE_H100_ROWS = ("R0166", "R0167", "R0168", "R0179", "R0180", "R0181")


def _reduction(m, n, k, layout: str):
    """Reduction length of a layer GEMM given by its forward shape (compute.layer_gemms)."""
    return {"fwd": k, "dgrad": n, "wgrad": m}[layout]


def _tn_shape(m, n, k, layout: str):
    """Forward shape whose H200 ``dgrad`` op (output ``m' x k'``, reduction ``n'``) has the
    output and reduction of this GEMM."""
    if layout == "fwd":  # output m x n, reduction k
        return m, k, n
    if layout == "dgrad":  # output m x k, reduction n
        return m, n, k
    return k, m, n  # wgrad: output k x n, reduction m


@contextlib.contextmanager
def fp8_variant(name: str):
    """Temporarily price the low-precision GEMMs (the calls with ``ratio < 1``: only they carry
    ``LOW_PRECISION_GEMM_RATIO``) by variant ``name``:

    * ``shipped``: the model as it is (``compute.LOW_PRECISION_TILE_K0`` on Hopper);
    * ``flat``: one ratio for every shape (k0 = 0, no per-tile term);
    * ``k0=<float>``: the Hopper term with that k0;
    * ``k0all=<float>``: that k0 on every GPU (Blackwell too);
    * ``tn``: flat, each Hopper fp8 GEMM at the H200 table's TN op of its own shape.
    """
    g0, gg0, gp0 = compute.gemm_time_s, compute.grouped_gemm_time_s, compute.gemm_precision
    k0_shipped = compute.LOW_PRECISION_TILE_K0
    state = {"hopper": False}
    k0 = float(name.split("=")[1]) if "=" in name else (0.0 if name in ("flat", "tn")
                                                         else k0_shipped)
    other_gpus = name.startswith("k0all=")

    def gemm_precision(training, gpu, cal, eager):
        state["hopper"] = gpu_generation(gpu) == "hopper"
        return gp0(training, gpu, cal, eager)

    def priced(fn, cal, m, n, k, layout, peak, ratio, *lead):
        if ratio < 1.0 and name == "tn" and state["hopper"]:
            m2, n2, k2 = _tn_shape(m, n, k, layout)
            return fn(cal, *lead, m2, n2, k2, "dgrad", peak, ratio)
        if ratio < 1.0 and other_gpus and not state["hopper"]:
            red = np.maximum(np.asarray(_reduction(m, n, k, layout), dtype=np.float64), 1.0)
            ref = compute.LOW_PRECISION_REF_REDUCTION
            return fn(cal, *lead, m, n, k, layout, peak, ratio) * (1 + k0 / red) / (1 + k0 / ref)
        return fn(cal, *lead, m, n, k, layout, peak, ratio)

    def gemm_time_s(cal, m, n, k, layout, peak, ratio=1.0):
        return priced(g0, cal, m, n, k, layout, peak, ratio)

    def grouped_gemm_time_s(cal, groups, m, n, k, layout, peak, ratio=1.0):
        return priced(gg0, cal, m, n, k, layout, peak, ratio, groups)

    compute.gemm_time_s, compute.grouped_gemm_time_s = gemm_time_s, grouped_gemm_time_s
    compute.gemm_precision = gemm_precision
    compute.LOW_PRECISION_TILE_K0 = k0
    try:
        yield
    finally:
        compute.gemm_time_s, compute.grouped_gemm_time_s, compute.gemm_precision = g0, gg0, gp0
        compute.LOW_PRECISION_TILE_K0 = k0_shipped


def score(cv: bool) -> dict:
    from validation.validate import training_runs_report
    from validation.validate_moe import moe_runs_report

    rep, _ = training_runs_report()
    h100 = rep[rep.precision.str.contains("fp8") & rep.gpu_type.str.contains("H100")]
    moe, _ = moe_runs_report()
    out = {"dense": rep.error.abs().mean(), "h100_fp8": h100.error.abs().mean(),
           "moe_lowp": moe[moe.precision != "bf16"].error.abs().mean(),
           "rows": {r.row_id: r.error for r in rep.itertuples() if r.row_id in BRIDGE_H100_ROWS}}
    if cv:
        from validation.calibrate import cross_validate

        groups, rows = cross_validate()
        scored = groups[groups.held_out > 0]
        out["cv"] = rows.error_after.abs().mean()
        out["cv_groups"] = {g.group: g.mape_after for g in scored.itertuples()
                            if "Megatron-Bridge" in g.group and g.group.endswith("fp8")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cv", action="store_true", help="also the leave-one-group-out CV")
    ap.add_argument("--variants", default="flat,k0=100,k0=200,shipped,k0=800,k0all=350,tn")
    args = ap.parse_args()
    for v in args.variants.split(","):
        with fp8_variant(v):
            s = score(args.cv)
        rows = " ".join(f"{k} {e:+.1%}" for k, e in s["rows"].items())
        line = (f"{v:8s} dense {s['dense']:.2%}  H100 fp8 {s['h100_fp8']:.2%}  "
                f"MoE low-precision {s['moe_lowp']:.2%}  | {rows}")
        if args.cv:
            line += f"\n         CV {s['cv']:.2%}; " + "; ".join(
                f"{g.split('|')[1].strip()[:9]} {g.split('|')[2].strip()}: {e:.1%}"
                for g, e in s["cv_groups"].items())
        print(line, flush=True)


if __name__ == "__main__":
    main()
