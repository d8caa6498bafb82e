"""Wave-quantized tile model of one GEMM's time (the shape physics between measured points).

A cuBLAS / CUTLASS GEMM on Hopper splits the ``m x n`` output into CTA tiles of ``tile_m x
tile_n``; each of the GPU's SMs computes one tile at a time, so the kernel runs in
``waves = ceil(tiles / sms)`` rounds and a partly filled last round costs a full one. The work
actually done is ``waves * sms * tile_m * tile_n`` output elements for ``m * n`` useful ones:
the **wave utilisation** (:func:`wave_utilisation`, padding of the edge tiles included). The
library's heuristic picks among a few tile shapes (and may split ``k`` over more CTAs when the
output has few tiles); we take the fastest candidate (:func:`tile_time_s`):

``t = t_fixed + min_c 2*m*n*(k/s_c + k0) * s_c / (rate * eff_c * util_c)``

with ``t_fixed`` the launch/ramp latency seen by the timing, ``rate`` the sustained dense rate of
a full wave of the largest tile, ``k0`` the per-tile prologue/epilogue in units of ``k`` (the
pipeline fill and the output store a tile pays whatever its ``k``), ``eff_c`` the relative rate of
a smaller tile (less operand reuse per loaded byte), ``s_c`` the split of ``k``.

References
----------
NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning Performance docs),
sections "Tile quantization" and "Wave quantization"; CUTLASS 3.x ``sm90`` warp-specialized
GEMM kernels (CTA tiles 128x256, 256x128, 128x128, 64x128 ...); split-K: CUTLASS
``GemmSplitKParallel``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SPLIT_K", "TILE_CANDIDATES", "TILE_FIT_SCALE", "TILE_FIT_START", "TileParams",
           "fit_tile_params", "fit_tile_x", "tile_fit_cost", "tile_fit_residuals", "tile_params_of",
           "tile_time_s", "wave_utilisation"]

TILE_CANDIDATES = (
    # (tile_m, tile_n, class): class 0 the largest tiles (rate 1), 1 = 128x128, 2 = 64-wide
    (128, 256, 0), (256, 128, 0), (128, 128, 1), (64, 256, 2), (256, 64, 2), (64, 128, 2),
    (128, 64, 2),
)
"""CTA tiles of the Hopper bf16 GEMM kernels cuBLAS chooses among (CUTLASS sm90 configs)."""

SPLIT_K = (1, 2, 4)
"""k splits considered (parallel split-K with a reduction of the partial outputs)."""


@dataclass(frozen=True)
class TileParams:
    """Named parameters of :func:`tile_time_s` (fitted on ``gemm.csv``,
    ``benchmarks/gemm_tile_cv.py``)."""

    t_fixed_s: float  # latency of a launch as the calibration times it [s]
    rate_flops: float  # sustained dense rate of full waves of the largest tile [FLOP/s]
    k0: float  # per-tile fixed work in units of k (prologue, epilogue) [-]
    eff_128: float  # relative rate of a 128x128 tile [-]
    eff_64: float  # relative rate of a 64-wide tile [-]
    sms: int = 132  # SMs of the GPU (H200 SXM: 132)


def wave_utilisation(m, n, tile_m: int, tile_n: int, sms: int, split: int = 1) -> np.ndarray:
    """Useful output over the output the waves compute: ``m*n / (waves * sms * tile_m * tile_n)``
    with ``waves = ceil(ceil(m/tile_m) * ceil(n/tile_n) * split / sms)`` (a split-``k`` GEMM runs
    ``split`` CTAs per output tile, each on ``k/split``, so a wave holds ``sms/split`` tiles).
    """
    m, n = np.asarray(m, dtype=np.float64), np.asarray(n, dtype=np.float64)
    tiles = np.ceil(m / tile_m) * np.ceil(n / tile_n) * split
    waves = np.ceil(tiles / sms)
    return m * n * split / (waves * sms * tile_m * tile_n)


def tile_time_s(m, n, k, p: TileParams) -> np.ndarray:
    """Time [s] of an ``m x k`` by ``k x n`` bf16 GEMM by the fastest tile candidate (see module
    docstring); vectorized over arrays."""
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    eff = (1.0, p.eff_128, p.eff_64)
    best = np.full(np.broadcast(m, n, k).shape, np.inf)
    for tm, tn, cls in TILE_CANDIDATES:
        for s in SPLIT_K:
            u = wave_utilisation(m, n, tm, tn, p.sms, s)
            t = 2.0 * m * n * (k / s + p.k0) * s / (p.rate_flops * eff[cls] * u)
            best = np.minimum(best, t)
    return p.t_fixed_s + best


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _params(x, layout: str, sms: int) -> TileParams:
    """``x``: log t_fixed, log rate (fwd), log k0, logit eff_128, logit eff_64 / eff_128,
    log rate ratio dgrad / fwd, log rate ratio wgrad / fwd (so 1 >= eff_128 >= eff_64)."""
    r = x[1] + {"fwd": 0.0, "dgrad": x[5], "wgrad": x[6]}[layout]
    return TileParams(t_fixed_s=float(np.exp(x[0])), rate_flops=float(np.exp(r)),
                      k0=float(np.exp(x[2])), eff_128=float(_sigmoid(x[3])),
                      eff_64=float(_sigmoid(x[3]) * _sigmoid(x[4])), sms=sms)


def fit_tile_params(m, n, k, layout, seconds, sms: int = 132) -> dict[str, TileParams]:
    """Least-squares fit (robust, on ``log(predicted / measured)``) of :class:`TileParams` to
    measured GEMM times: the rate per layout, everything else shared. Returns layout -> params."""
    lays = sorted(set(np.asarray(layout).tolist()))
    return tile_params_of(fit_tile_x(m, n, k, layout, seconds, sms), lays, sms)


def tile_params_of(x, layouts, sms: int) -> dict[str, TileParams]:
    """layout -> :class:`TileParams` of the fitted vector ``x`` (:func:`fit_tile_x`)."""
    return {lay: _params(x, lay, sms) for lay in layouts}


TILE_FIT_SCALE = 0.1
"""Residual scale of the robust tile fit [log ratio]: residuals beyond about 10 % count
linearly, not quadratically (scipy ``least_squares(loss="soft_l1", f_scale=0.1)``)."""

TILE_FIT_START = (np.log(20e-6), np.log(700e12), np.log(128.0), 1.0, 1.0, 0.0, 0.0)
"""Starting vector of the tile fit: 20 us fixed time, 700 TFLOP/s, k0 = 128, neutral shape."""


def tile_fit_residuals(x, m, n, k, layout, seconds, sms: int = 132) -> np.ndarray:
    """``log(predicted / measured)`` of each measured GEMM under the parameter vector ``x``
    (:func:`_params`): the residuals :func:`fit_tile_x` minimises."""
    m, n, k, t = (np.asarray(v, dtype=np.float64) for v in (m, n, k, seconds))
    layout = np.asarray(layout)
    out = np.empty(len(t))
    for lay in sorted(set(layout.tolist())):
        s = layout == lay
        out[s] = tile_time_s(m[s], n[s], k[s], _params(x, lay, sms))
    return np.log(out / t)


def tile_fit_cost(x, m, n, k, layout, seconds, sms: int = 132) -> float:
    """The robust loss :func:`fit_tile_x` minimises at ``x``: scipy's ``soft_l1`` with
    ``f_scale`` :data:`TILE_FIT_SCALE`, ``sum(f^2 * 2 (sqrt(1 + (r/f)^2) - 1)) / 2``."""
    z = (tile_fit_residuals(x, m, n, k, layout, seconds, sms) / TILE_FIT_SCALE) ** 2
    return float(0.5 * TILE_FIT_SCALE**2 * np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def fit_tile_x(m, n, k, layout, seconds, sms: int = 132, x0=None) -> np.ndarray:
    """The fitted parameter vector of :func:`fit_tile_params` (see :func:`_params`), from
    ``x0`` (default :data:`TILE_FIT_START`)."""
    from scipy.optimize import least_squares

    start = np.array(TILE_FIT_START if x0 is None else x0, dtype=np.float64)
    res = least_squares(lambda x: tile_fit_residuals(x, m, n, k, layout, seconds, sms), start,
                        loss="soft_l1", f_scale=TILE_FIT_SCALE)
    return res.x
