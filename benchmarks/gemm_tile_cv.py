"""Leave-one-hidden-size-out cross-validation of GEMM time models on the H200 ``gemm.csv``.

Models compared (time of each measured row, as the calibration timed it):

* ``interp``: the shipped :class:`perfmodel.hardware.calibration.Calibration` interpolation
  (piecewise-linear ``log efficiency`` over ``(log m, log n, log k)``), built from the other
  hidden sizes' rows;
* ``tile``: :func:`perfmodel.hardware.gemm_tiles.tile_time_s` (wave quantization over candidate CTA tiles,
  split-K, launch latency), 7 named parameters fitted on the other hidden sizes;
* ``hybrid``: the tile model times the interpolated residual ``measured / tile`` (measured points
  exact, the tile model shapes between them).

Per held-out hidden size (all its tokens, tp and layouts), then per held-out token count: MAPE
of the time. Run:
``python benchmarks/gemm_tile_cv.py`` (about a minute).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodel.hardware.calibration import BENCH_DISPATCH_S, LAYOUTS, _gemm_points, load_calibration
from perfmodel.hardware.gemm_tiles import fit_tile_params, tile_time_s

CAL = load_calibration("h200")
PEAK = CAL.peak_flops_bf16
DF = pd.read_csv(ROOT / "hardware_specs" / "calibration" / "h200" / "gemm.csv")


def fit_tile(df) -> dict:
    """layout -> TileParams fitted on ``df``'s rows."""
    return fit_tile_params(df["m"], df["n"], df["k"], df["layout"], df["seconds"])


def tile_pred(tiles, df) -> np.ndarray:
    out = np.empty(len(df))
    for lay in LAYOUTS:
        s = (df["layout"] == lay).to_numpy()
        g = df[s]
        out[s] = tile_time_s(g["m"], g["n"], g["k"], tiles[lay])
    return out


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
            out[s] = v * tile_time_s(g["m"], g["n"], g["k"], resid_of[lay])
    return out


def mape(p, t) -> float:
    return float(np.mean(np.abs(p / t - 1.0)))


def loo(col: str) -> None:
    """Leave one value of ``col`` out: MAPE per held-out value and overall."""
    rows = []
    for h in sorted(DF[col].unique()):
        train, test = DF[DF[col] != h], DF[DF[col] == h]
        t = test["seconds"].to_numpy()
        xt = fit_tile(train)
        p_i = interp_pred(train, test)
        p_t = tile_pred(xt, test)
        p_h = interp_pred(train, test, resid_of=xt)
        rows.append({col: h, "interp": mape(p_i, t), "tile": mape(p_t, t),
                     "hybrid": mape(p_h, t), "n": len(t),
                     "interp_bias": float(np.mean(p_i / t - 1)),
                     "hybrid_bias": float(np.mean(p_h / t - 1))})
    r = pd.DataFrame(rows)
    print(f"leave one {col} out:")
    print(r.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    inner = r[(r[col] > r[col].min()) & (r[col] < r[col].max())]
    for name, d in (("all", r), ("interior", inner)):
        w = d["n"] / d["n"].sum()
        print(f"  MAPE ({name}): " + ", ".join(
            f"{c} {float((d[c] * w).sum()):.2%}" for c in ("interp", "tile", "hybrid")))


def main() -> int:
    x = fit_tile(DF)
    for lay in LAYOUTS:
        print(f"tile model fitted on all rows, {lay}: " + ", ".join(
            f"{k} {v:.4g}" for k, v in x[lay].__dict__.items()))
    print(f"  in-sample MAPE {mape(tile_pred(x, DF), DF['seconds'].to_numpy()):.2%}")
    for col in ("hidden", "tokens"):
        loo(col)
    return 0


if __name__ == "__main__":
    sys.exit(main())
