"""Leave-one-hidden-size-out cross-validation of GEMM time models on the H200 ``gemm.csv``.

Models compared (time of each measured row, as the calibration timed it):

* ``interp``: the shipped :class:`perfmodel.calibration.Calibration` interpolation
  (piecewise-linear ``log efficiency`` over ``(log m, log n, log k)``), built from the other
  hidden sizes' rows;
* ``tile``: :func:`perfmodel.gemm_tiles.tile_time_s` (wave quantization over candidate CTA tiles,
  split-K, launch latency), 7 named parameters fitted on the other hidden sizes;
* ``hybrid``: the tile model times the interpolated residual ``measured / tile`` (measured points
  exact, the tile model shapes between them).

Per held-out hidden size (all its tokens, tp and layouts): MAPE of the time. Run:
``python benchmarks/gemm_tile_cv.py`` (about a minute).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodel.calibration import BENCH_DISPATCH_S, LAYOUTS, _gemm_points, load_calibration
from perfmodel.gemm_tiles import TileParams, tile_time_s

CAL = load_calibration("h200")
PEAK = CAL.peak_flops_bf16
DF = pd.read_csv(ROOT / "hardware_specs" / "calibration" / "h200" / "gemm.csv")
X0 = np.array([np.log(20e-6), np.log(700e12), np.log(128.0), 1.0, 1.0, 0.0, 0.0])


def params(x, layout: str) -> TileParams:
    """Parameters: log t_fixed, log rate (fwd), log k0, logit eff_128, logit eff_64 / eff_128,
    log rate ratio dgrad / fwd, log rate ratio wgrad / fwd (so 1 >= eff_128 >= eff_64)."""
    r = x[1] + {"fwd": 0.0, "dgrad": x[5], "wgrad": x[6]}[layout]
    return TileParams(t_fixed_s=float(np.exp(x[0])), rate_flops=float(np.exp(r)),
                      k0=float(np.exp(x[2])), eff_128=float(_sig(x[3])),
                      eff_64=float(_sig(x[3]) * _sig(x[4])))


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def tile_pred(x, df) -> np.ndarray:
    out = np.empty(len(df))
    for lay in LAYOUTS:
        s = (df["layout"] == lay).to_numpy()
        g = df[s]
        out[s] = tile_time_s(g["m"], g["n"], g["k"], params(x, lay))
    return out


def fit_tile(df) -> np.ndarray:
    t = df["seconds"].to_numpy()
    res = least_squares(lambda x: np.log(tile_pred(x, df) / t), X0, loss="soft_l1",
                        f_scale=0.1)
    return res.x


def interp_pred(train, test, resid_of=None) -> np.ndarray:
    """Time of ``test`` rows from ``train``: the shipped interpolation of the measured log
    efficiency, or with ``resid_of`` (tile parameters) the tile time times the interpolated
    ``log(measured / tile)``."""
    if resid_of is None:
        cal = replace(CAL, gemm_points=_gemm_points(train, PEAK), _interp={})
    else:
        lr = np.log(train["seconds"].to_numpy() / tile_pred(resid_of, train))
        g = train.assign(lr=lr).groupby(["layout", "m", "n", "k"], as_index=False)["lr"].mean()
        pts = {lay: (np.log2(d[["m", "n", "k"]].to_numpy(float)), d["lr"].to_numpy())
               for lay, d in g.groupby("layout")}
        cal = replace(CAL, gemm_points=pts, _interp={})
    out = np.empty(len(test))
    for lay in LAYOUTS:
        s = (test["layout"] == lay).to_numpy()
        g = test[s]
        v = cal._lookup("gemm", lay, np.log2(g[["m", "n", "k"]].to_numpy(float)))
        if resid_of is None:
            flops = 2.0 * g["m"] * g["n"] * g["k"]
            out[s] = flops / (np.clip(v, 1e-4, 0.95) * PEAK) + BENCH_DISPATCH_S
        else:
            out[s] = v * tile_time_s(g["m"], g["n"], g["k"], params(resid_of, lay))
    return out


def mape(p, t) -> float:
    return float(np.mean(np.abs(p / t - 1.0)))


def main() -> int:
    x = fit_tile(DF)
    print("tile model fitted on all rows: " + ", ".join(
        f"{k} {v:.4g}" for k, v in params(x, "fwd").__dict__.items()),
        f"; dgrad/fwd {np.exp(x[5]):.3f}, wgrad/fwd {np.exp(x[6]):.3f}")
    print(f"  in-sample MAPE {mape(tile_pred(x, DF), DF['seconds'].to_numpy()):.2%}")
    rows = []
    for h in sorted(DF["hidden"].unique()):
        train, test = DF[DF["hidden"] != h], DF[DF["hidden"] == h]
        t = test["seconds"].to_numpy()
        xt = fit_tile(train)
        p_i = interp_pred(train, test)
        p_t = tile_pred(xt, test)
        p_h = interp_pred(train, test, resid_of=xt)
        rows.append({"hidden": h, "interp": mape(p_i, t), "tile": mape(p_t, t),
                     "hybrid": mape(p_h, t), "n": len(t),
                     "interp_bias": float(np.mean(p_i / t - 1)),
                     "hybrid_bias": float(np.mean(p_h / t - 1))})
    r = pd.DataFrame(rows)
    print(r.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    inner = r[(r.hidden > r.hidden.min()) & (r.hidden < r.hidden.max())]
    for name, d in (("all", r), ("interior", inner)):
        w = d["n"] / d["n"].sum()
        print(f"LOHO MAPE ({name}): " + ", ".join(
            f"{c} {float((d[c] * w).sum()):.2%}" for c in ("interp", "tile", "hybrid")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
