"""Measured kernel efficiency of one GPU, and its transfer to GPUs without a measurement.

A calibration folder holds what ``calibrate_gpu.py`` writes (``gemm.csv``, ``attention.csv``,
``memops.csv``, ``env.json``; see ``hardware_specs/calibration/h200``). From it we build a
:class:`Calibration`:

* GEMM efficiency (achieved / dense bf16 peak) as a function of the shape ``(m, n, k)`` and the
  layout (``fwd`` ``x@W``, ``dgrad`` ``dy@W^T``, ``wgrad`` ``x^T@dy``): piecewise-linear
  interpolation of ``log(efficiency)`` over the measured points in ``(log m, log n, log k)``
  (Delaunay simplices, located point by point), nearest measured point outside
  their hull, and never above the roofline of the GEMM's own operand traffic. The interpolated
  quantity is the measured efficiency over that of a wave-quantized tile model
  (:mod:`perfmodel.hardware.gemm_tiles`, 7 parameters fitted on the same rows): measured points stay
  exact and the tile model shapes the curve between them (leave-one-hidden-size-out CV on the
  H200 table: GEMM time MAPE 8.3 % -> 7.0 %, ``benchmarks/gemm_tile_cv.py``). On the measured
  part only: a transferred table (:meth:`Calibration.scaled_to`) uses the plain interpolation.
* Flash-attention time ``t0(s) + flops / rate(s)`` per pass, fitted per measured sequence length
  (the intercept is the longest thread block, which more heads do not shorten).
* Achieved bandwidth of the memory-bound kernels (copy, layernorm, gelu, dropout, add, softmax,
  fused AdamW), the slope of a least-squares line ``t = t0 + bytes / bw`` through each op's rows.

The timing script launches one kernel between two CUDA events on an idle stream, so every row
also holds the CPU time to dispatch that one kernel (the GPU waits for it). We subtract
:data:`BENCH_DISPATCH_S` from every measured time before turning it into an efficiency; it is the
intercept of the ``copy`` rows of ``memops.csv`` (10.4 us) less a 2 us kernel (ramp + tail).

Other GPUs (no measurement): efficiencies are fractions of peak, so the measured curve is applied
to the target's datasheet peak (same fraction of peak at the same shape), and memory-bound
bandwidths scale with the datasheet HBM bandwidth. Parts differ in the ceiling a large GEMM reaches
(the "maximum achievable matmul FLOPS", MAMF): when the GPU spec gives ``mamf_tflops``, the
efficiency curve is scaled by (target MAMF / target peak) / (measured 8192^3 GEMM / H200 peak).
``gemm_scale`` (default 1) adjusts the curve further by hand.

fp8 GEMMs (optional ``gemm_fp8.csv``, ``calibrate_gpu.py --parts fp8``): each row holds the time
of a per-tensor-scaled fp8 GEMM and of the bf16 GEMM of the same shape and layout, timed side by
side. :meth:`Calibration.fp8_time_ratio` is their ratio (dispatch subtracted from both),
interpolated as the bf16 efficiency is (piecewise-linear in ``log`` over ``(log2 m, log2 n,
log2 k)``, nearest point outside the hull; no tile model). It multiplies the bf16 GEMM time of
the part the table is used for, so a transferred table (:meth:`Calibration.scaled_to`) carries
the bf16 curve's transfer (MAMF, sustained fraction) to its fp8 GEMMs. Without the file the
calibration has no fp8 table (``gemm_fp8_points`` None) and fp8 GEMMs are priced by the fitted
ratio (:data:`perfmodel.compute.layer.LOW_PRECISION_GEMM_RATIO`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hardware_specs import calibration_dir
from perfmodel.core.csvtable import group_mean, read_columns, to_float
from perfmodel.core.errors import SpecError
from perfmodel.core.files import atomic_write, parse_json, read_text_bounded, shown
from perfmodel.hardware.gemm_tiles import TileParams, fit_tile_x, tile_params_of, tile_time_s
from perfmodel.hardware.overlap import gpu_generation
from perfmodel.hardware.simplex import interpolation_of
from perfmodel.spec.specs import GPUSpec, load_gpu

__all__ = [
    "BENCH_DISPATCH_S",
    "FP8_GEMM_FILE",
    "KERNEL_MIN_S",
    "LAYOUTS",
    "MEMOPS",
    "TILE_FIT_FILE",
    "Calibration",
    "calibration_for",
    "layout_shape_means",
    "load_calibration",
    "tile_fit_digest",
    "write_tile_fit",
]

LAYOUTS = ("fwd", "dgrad", "wgrad")
MEMOPS = ("copy", "layernorm", "gelu", "dropout", "add", "softmax", "adamw")
ATTENTION_PASSES = ("fwd", "bwd", "fwd+bwd")

BENCH_DISPATCH_S = 8e-6
"""CPU dispatch time inside every calibration row [s] (see module docstring)."""

KERNEL_MIN_S = 2e-6
"""Shortest GPU kernel [s]: launch-to-completion of a tiny kernel on the device (ramp and tail of
one wave). Applied to every modelled kernel as a floor."""

MAX_EFFICIENCY = 0.95
"""No kernel is credited with more than this fraction of the datasheet peak."""

_REFERENCE_GPU = {"h200": "h200-sxm-141gb"}

FP8_GEMM_FILE = "gemm_fp8.csv"

#: The tile model's least-squares fit to ``gemm.csv`` (:func:`fit_tile_x`), saved in the folder
#: with a digest of what it was fitted on (:func:`write_tile_fit`): a shipped calibration is not
#: refitted at every start. A missing file or another digest: fitted when loaded.
TILE_FIT_FILE = "gemm_tiles_fit.json"
"""Optional file of a calibration folder: paired fp8 / bf16 GEMM times (``calibrate_gpu.py``)."""


#: Columns each calibration table must hold: numeric ones (finite, > 0 for times) and text ones.
_CSV_COLUMNS = {
    "gemm.csv": (("m", "n", "k", "seconds"), ("layout",)),
    FP8_GEMM_FILE: (("m", "n", "k", "seconds", "bf16_seconds"), ("layout",)),
    "attention.csv": (("batch", "heads", "seq", "head_dim", "seconds"), ("pass",)),
    "memops.csv": (("bytes_moved", "seconds"), ("op",)),
}


def _read_csv(folder: Path, name: str) -> dict[str, np.ndarray]:
    """A calibration table, checked: bounded UTF-8 text, the columns of :data:`_CSV_COLUMNS`,
    at least one row, every number finite and positive; :class:`SpecError` (one line) else.
    Returns ``column -> array`` (float64 for the numeric columns, text for the others)."""
    p = folder / name
    if not p.exists():
        raise SpecError(f"calibration folder '{shown(folder)}': missing {name}")
    text = read_text_bounded(p, "CSV")
    try:
        cols = read_columns(text)
    except ValueError as err:
        raise SpecError(f"{shown(p)}: not a CSV table: {shown(err)}") from None
    numeric, textual = _CSV_COLUMNS[name]
    missing = [c for c in (*numeric, *textual) if c not in cols]
    if missing or not len(next(iter(cols.values()))):
        raise SpecError(f"{shown(p)}: " + (f"missing columns {missing}" if missing else "no rows"))
    out = dict(cols)
    for col in numeric:
        values = to_float(cols[col])
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            i = int(np.argmax(bad))
            raw = str(cols[col][i]) or "nan"
            raise SpecError(f"{shown(p)}: row {i + 2}: {col} = {shown(raw, 40)}: "
                            "expected a finite number > 0")
        out[col] = values
    for col in textual:
        out[col] = cols[col].astype(str)
    return out


def _read_env(folder: Path) -> dict:
    """``env.json`` of a calibration folder ({} where absent); :class:`SpecError` when it is
    not a JSON object or its ``sms`` / ``matmul_bf16_8192_tflops`` are not positive numbers."""
    f = folder / "env.json"
    if not f.exists():
        return {}
    env = parse_json(read_text_bounded(f, "JSON"), str(f))
    for key in ("sms", "matmul_bf16_8192_tflops"):
        v = env.get(key)
        if key in env and (isinstance(v, bool) or not isinstance(v, (int, float))
                           or not np.isfinite(v) or v <= 0):
            raise SpecError(f"{shown(f)}: {key} = {shown(repr(v), 40)}: expected a number > 0")
    if "name" in env and not isinstance(env["name"], str):
        raise SpecError(f"{shown(f)}: name = {shown(repr(env['name']), 40)}: expected text")
    return env



#: Sets of distinct points whose interpolated values a calibration remembers (per table).
_LOOKUP_MEMO_SIZE = 256


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of a 2-D float array and each row's index among them
    (``uniq[inv] == a``), as ``np.unique(a, axis=0, return_inverse=True)`` up to the order of
    the distinct rows: one 1-D ``np.unique`` per column, then one of the combined integer key
    (the row-wise unique sorts byte strings, many times slower on a search batch)."""
    key = np.zeros(len(a), dtype=np.int64)
    radix = 1
    for j in range(a.shape[1]):
        u, inv = np.unique(a[:, j], return_inverse=True)
        if radix * len(u) >= 2**62:  # too many combinations for one integer key
            uniq, inv_rows = np.unique(a, axis=0, return_inverse=True)
            return uniq, inv_rows.reshape(-1)
        key = key * len(u) + inv.reshape(-1)
        radix *= len(u)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return a[first], inv.reshape(-1)

@dataclass(frozen=True, eq=False)
class Calibration:
    """Kernel efficiencies of one GPU (measured, or scaled from another's measurement).

    Efficiencies are fractions of the dense bf16 tensor-core peak of the GPU they are used for;
    bandwidths are bytes/s on that GPU. Build with :func:`load_calibration` or
    :func:`calibration_for`; methods are vectorized over numpy arrays.
    """

    name: str
    gemm_points: dict  # layout -> (points (N, 3) log2 m n k, log efficiency (N,))
    attention_points: dict  # pass -> (log2 seq, t0 * peak [FLOP], rate / peak), see below
    membw_bytes_per_s_table: dict  # op -> achieved bandwidth [bytes/s]
    hbm_bw_bytes_per_s: float  # datasheet HBM bandwidth of the GPU used for
    peak_flops_bf16: float  # dense bf16 peak of the GPU used for [FLOP/s]
    gemm_scale: float = 1.0
    large_gemm_fraction: float | None = None
    gemm_m_scale: float = 1.0
    """Rows of the measured GEMM that take as long per FLOP-of-peak as one row on the target
    (measured peak / target peak): a slower part reaches a given fraction of its peak with
    proportionally fewer rows, since launch, ramp and tail times are fixed."""
    """Largest square bf16 GEMM of the measured part over its datasheet peak (env.json)."""
    sm_rate: float | None = None
    """SMs x boost clock [SM GHz] of the GPU the tables are for (None when its spec lacks them):
    the SM-side rate of the memory-bound kernels, see :meth:`scaled_to`."""
    source: str = ""
    gemm_tiles: dict | None = None
    """layout -> :class:`perfmodel.hardware.gemm_tiles.TileParams` the measured points are relative to
    (``gemm_points`` hold log(measured / tile efficiency)); None: plain interpolation."""
    gemm_tiles_peak_flops: float = 0.0
    """Dense bf16 peak of the measured part [FLOP/s]: tile efficiencies are fractions of it."""
    gemm_points_plain: dict | None = None
    """The measured log efficiencies without the tile model, for GPUs the table is transferred
    to (:meth:`scaled_to`): the tile quantization is the measured part's (its SM count and tile
    grid), not the target's, and the transfer is validated without it."""
    gemm_fp8_points: dict | None = None
    """layout -> (log2 (m, n, k) points, log(fp8 time / bf16 time)) from ``gemm_fp8.csv``;
    None when the folder has no such file."""
    gemm_fp8_generation: str | None = None
    """GPU generation (:func:`perfmodel.hardware.overlap.gpu_generation`) the fp8 table was measured on:
    it prices that generation's per-tensor fp8 GEMMs only."""
    _interp: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for key, table in (("gemm", self.gemm_points), ("fp8", self.gemm_fp8_points or {})):
            for name, (pts, vals) in table.items():
                tri, tree = interpolation_of(np.asarray(pts, dtype=np.float64))
                self._interp[(key, name)] = (tri, np.asarray(vals, dtype=np.float64), tree)

    def _lookup(self, key: str, name: str, pts: np.ndarray, distinct: bool = False) -> np.ndarray:
        """``exp`` of the piecewise-linear interpolant at each row of ``pts``, elementwise.

        The value at a point depends on that point only, never on the rest of the batch (a
        configuration's time must not change with what it is evaluated with): each distinct
        point is located by a brute-force scan of the simplices (scipy's default walks from the
        previous query point, so near a face or the hull a different simplex can win), and the
        barycentric sum is written out term by term (no BLAS reduction whose blocking depends
        on the batch length).
        """
        pts = np.asarray(pts, dtype=np.float64)
        if len(pts) == 0:
            return np.empty(0)
        # A batch has few distinct shapes (they depend on tp, cp and the micro-batch only):
        # interpolate each distinct point once (exact float rows, no rounding); ``distinct``:
        # the caller has already made the rows distinct. The values of a set of distinct
        # points are remembered (a search's batches ask for the same shapes again).
        if distinct:
            uniq, inv = pts, np.arange(len(pts))
        else:
            uniq, inv = unique_rows(pts)
        memo = ("memo", key, name, uniq.shape, uniq.tobytes())
        out = self._interp.get(memo)
        if out is None:
            if sum(len(k) == 5 for k in list(self._interp)) >= _LOOKUP_MEMO_SIZE:
                for k in [k for k in list(self._interp) if len(k) == 5]:
                    self._interp.pop(k, None)
            out = self._interp[memo] = self._interpolate(key, name, uniq)
            out.setflags(write=False)
        return out[inv.reshape(-1)]

    def _interpolate(self, key: str, name: str, uniq: np.ndarray) -> np.ndarray:
        """:meth:`_lookup` at distinct points ``uniq``: each located by a brute-force scan of
        the simplices, the barycentric sum written out term by term."""
        tri, vals, tree = self._interp[(key, name)]
        if tri is None:  # too few or coplanar points to triangulate: nearest measured point
            return np.exp(vals[tree.query(uniq)])
        simplex = tri.find_simplex(uniq)
        inside = simplex >= 0
        s = np.where(inside, simplex, 0)
        t = tri.transform[s]  # (u, 4, 3): rows 0-2 the inverse affine map, row 3 the origin
        d = [uniq[:, j] - t[:, 3, j] for j in range(3)]
        c = [t[:, i, 0] * d[0] + t[:, i, 1] * d[1] + t[:, i, 2] * d[2] for i in range(3)]
        v_s = vals[tri.simplices[s]]  # (u, 4)
        lin = (c[0] * v_s[:, 0] + c[1] * v_s[:, 1] + c[2] * v_s[:, 2]
               + (1.0 - c[0] - c[1] - c[2]) * v_s[:, 3])  # fmt: skip
        if not inside.all():
            lin[~inside] = vals[tree.query(uniq[~inside])]
        return np.exp(lin)

    def gemm_efficiency(self, m, n, k, layout: str = "fwd") -> np.ndarray:
        """Achieved / peak for an ``m x k`` by ``k x n`` GEMM (``2*m*n*k`` FLOPs).

        Parameters
        ----------
        m : tokens (rows of the activation) [-]; n : output features; k : input features.
            For ``dgrad`` and ``wgrad`` give the shape of the forward GEMM (as ``gemm.csv``).
        layout : ``fwd``, ``dgrad`` or ``wgrad``.

        Returns
        -------
        Efficiency in (0, 0.95], including the roofline of the operand traffic
        (``2*(mk + kn + mn)`` bf16 bytes at the HBM bandwidth).

        References
        ----------
        Measured: ``gemm.csv`` of the calibration; roofline: Williams et al. 2009, CACM 52(4).
        """
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: expected one of {LAYOUTS}")
        m, n, k = (np.maximum(np.asarray(x, dtype=np.float64), 1.0) for x in (m, n, k))
        m, n, k = np.broadcast_arrays(m, n, k)
        m_lookup = m * self.gemm_m_scale
        pts = np.stack(
            [np.log2(m_lookup).ravel(), np.log2(n).ravel(), np.log2(k).ravel()], axis=1
        )
        if self.gemm_tiles is None:
            eff = self._lookup("gemm", layout, pts).reshape(m.shape) * self.gemm_scale
        else:
            # few distinct shapes per batch: residual and tile model once per shape
            raw = np.stack([m_lookup.ravel(), n.ravel(), k.ravel()], axis=1)
            u, inv = unique_rows(raw)
            mu, nu, ku = u[:, 0], u[:, 1], u[:, 2]
            eu = self._lookup("gemm", layout, np.log2(u), distinct=True) * _tile_efficiency(
                mu, nu, ku, self.gemm_tiles[layout], self.gemm_tiles_peak_flops)
            eff = eu[inv.reshape(-1)].reshape(m.shape) * self.gemm_scale
        flops = 2.0 * m * n * k
        bytes_ = 2.0 * (m * k + k * n + m * n)
        roof = flops / (bytes_ / self.hbm_bw_bytes_per_s) / self.peak_flops_bf16
        return np.clip(np.minimum(eff, roof), 1e-4, MAX_EFFICIENCY)

    def fp8_time_ratio(self, m, n, k, layout: str = "fwd") -> np.ndarray:
        """Measured time of a per-tensor-scaled fp8 GEMM over that of the bf16 GEMM of the same
        shape and layout (``gemm_fp8.csv``), elementwise.

        ``exp`` of the piecewise-linear interpolant of ``log(t_fp8 / t_bf16)`` over the measured
        ``(log2 m, log2 n, log2 k)`` (nearest measured point outside their hull), ``m`` scaled by
        ``gemm_m_scale`` as in :meth:`gemm_efficiency`. Shape arguments as there.

        Example: measured 0.5 at k = 1024 and 0.8 at k = 4096 (same m, n): at k = 2048 the
        ratio is exp((ln 0.5 + ln 0.8) / 2) = sqrt(0.4) = 0.632.

        References
        ----------
        Measured: ``gemm_fp8.csv`` (``benchmarks/calibrate_gpu.py --parts fp8``).
        """
        if self.gemm_fp8_points is None:
            raise ValueError(f"calibration '{self.name}' has no fp8 GEMM table ({FP8_GEMM_FILE})")
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: expected one of {LAYOUTS}")
        m, n, k = (np.maximum(np.asarray(x, dtype=np.float64), 1.0) for x in (m, n, k))
        m, n, k = np.broadcast_arrays(m, n, k)
        pts = np.stack([np.log2(m * self.gemm_m_scale).ravel(), np.log2(n).ravel(),
                        np.log2(k).ravel()], axis=1)
        return self._lookup("fp8", layout, pts).reshape(m.shape)

    def attention_time_s(
        self, batch_heads, seq, head_dim=128, pass_: str = "fwd", causal: bool = True
    ) -> np.ndarray:
        """Time [s] of flash attention over ``batch_heads`` heads of ``seq`` queries and keys.

        ``t = t0(s) * (d/128) * (2 if not causal) + flops / (rate(s) * (d/128)**0.25)``, with
        ``flops = 4*bh*s^2*d`` (halved when causal; x2.5 for ``bwd``). ``t0`` (the longest thread
        block) and ``rate`` are fitted per measured sequence length and interpolated linearly in
        ``log2(s)`` (``t0/s`` and ``rate``, held constant outside the measured range). The
        ``(d/128)**0.25`` rate penalty for head_dim < 128 is an assumption (smaller tiles reuse
        less of each K/V load), not a measurement.

        References
        ----------
        Measured: ``attention.csv``; FLOPs: Dao 2023 (FlashAttention-2), Sec. 4.1.
        """
        if pass_ not in ("fwd", "bwd", "fwd+bwd"):
            raise ValueError(f"pass {pass_!r}: expected one of {ATTENTION_PASSES}")
        if pass_ == "fwd+bwd":
            return self.attention_time_s(batch_heads, seq, head_dim, "fwd", causal) + (
                self.attention_time_s(batch_heads, seq, head_dim, "bwd", causal)
            )
        bh = np.asarray(batch_heads, dtype=np.float64)
        s = np.asarray(seq, dtype=np.float64)
        d = np.asarray(head_dim, dtype=np.float64)
        ls, t0_flops, rate_frac = self.attention_points[pass_]
        x = np.log2(np.maximum(s, 1.0))
        t0_per_token = np.interp(x, ls, t0_flops / 2.0**ls) / self.peak_flops_bf16
        rate = np.interp(x, ls, rate_frac) * self.peak_flops_bf16 * np.minimum(d / 128.0, 1.0) ** 0.25
        mult = 1.0 if pass_ == "fwd" else 2.5
        flops = mult * 4.0 * bh * s**2 * d * (0.5 if causal else 1.0)
        t0 = t0_per_token * s * (d / 128.0) * (1.0 if causal else 2.0)
        return np.where(bh * s > 0, t0 + flops / rate, 0.0)

    def attention_efficiency(self, batch_heads, seq, pass_: str = "fwd") -> np.ndarray:
        """Achieved / peak of causal flash attention with head_dim 128, counting causal FLOPs
        (``4*bh*s^2*d/2`` forward, 2.5x that backward, 3.5x for ``fwd+bwd``), from
        :meth:`attention_time_s`.

        References
        ----------
        Measured: ``attention.csv``; Dao 2023 (FlashAttention-2), Sec. 4.1 for the FLOP count.
        """
        mult = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_]
        bh, s = np.broadcast_arrays(np.asarray(batch_heads, float), np.asarray(seq, float))
        flops = mult * 4.0 * bh * s**2 * 128 / 2.0
        t = self.attention_time_s(bh, s, 128, pass_)
        return np.clip(flops / t / self.peak_flops_bf16, 1e-4, MAX_EFFICIENCY)

    def membw_bytes_per_s(self, op: str) -> float:
        """Achieved bandwidth [bytes/s] of memory-bound kernel ``op`` (see :data:`MEMOPS`),
        counting bytes read plus bytes written."""
        if op not in self.membw_bytes_per_s_table:
            raise ValueError(f"memory op {op!r}: expected one of {sorted(self.membw_bytes_per_s_table)}")
        return self.membw_bytes_per_s_table[op]

    def scaled_to(self, gpu: GPUSpec, gemm_scale: float = 1.0) -> Calibration:
        """This calibration applied to another GPU: same fraction of peak at the same shape,
        memory-bound bandwidths scaled by the ratio of datasheet HBM bandwidths."""
        r = gpu.hbm_bw_bytes_per_s / self.hbm_bw_bytes_per_s
        target_sm = (gpu.sm_count * gpu.boost_clock_ghz
                     if gpu.sm_count is not None and gpu.boost_clock_ghz is not None else None)
        if gpu.mamf_tflops is not None and self.large_gemm_fraction is not None:
            # Parts differ in how close a large GEMM gets to the datasheet peak (A100 86%,
            # H100 80%, MI300X 60%): scale the measured efficiency curve by the ratio of the
            # ceilings, the target's published MAMF over ours.
            target = gpu.mamf_tflops * 1e12 / gpu.peak_flops("bf16")
            gemm_scale = gemm_scale * target / self.large_gemm_fraction
        plain = {} if self.gemm_points_plain is None else {
            "gemm_points": self.gemm_points_plain, "gemm_tiles": None, "gemm_points_plain": None}
        return replace(
            self,
            **plain,
            name=f"{self.name}->{gpu.name}",
            membw_bytes_per_s_table=transfer_membw(self.membw_bytes_per_s_table, r,
                                                   None if target_sm is None or self.sm_rate
                                                   is None else target_sm / self.sm_rate),
            sm_rate=target_sm,
            hbm_bw_bytes_per_s=gpu.hbm_bw_bytes_per_s,
            peak_flops_bf16=gpu.peak_flops("bf16"),
            gemm_m_scale=self.gemm_m_scale * self.peak_flops_bf16 / max(
                gpu.peak_flops("bf16"), gpu.peak_flops("fp16")
            ),
            gemm_scale=self.gemm_scale * gemm_scale,
            source=f"{self.source}; scaled to {gpu.name} by datasheet peak and HBM bandwidth",
            _interp={},
        )


def transfer_membw(table: dict, bw_ratio: float, sm_ratio: float | None) -> dict:
    """Achieved bandwidths of the memory-bound kernels on another GPU [bytes/s].

    A kernel's time is the longer of its HBM traffic and its work on the SMs (a roofline over
    two resources; Williams et al. 2009). On the measured part, ``copy`` runs at the HBM
    ceiling; a kernel slower than ``copy`` (norms, softmax, dropout's random numbers, reductions)
    is bound by its SM-side work, which scales with SM count x clock, not with HBM bandwidth. So
    on the target: ``min(copy * bw_ratio, bw_op * sm_ratio)``, with ``bw_ratio`` the ratio of
    datasheet HBM bandwidths and ``sm_ratio`` that of SMs x boost clock. Without SM figures
    (``sm_ratio`` None) every kernel keeps its fraction of HBM bandwidth: ``bw_op * bw_ratio``.

    Example: H200 (132 SMs x 1.83 GHz, 4.8 TB/s) softmax 1.57 TB/s, copy 4.25 TB/s, on a V100
    (80 SMs x 1.597 GHz, 0.9 TB/s): min(4.25 * 0.1875, 1.57 * 0.529) = min(0.80, 0.83) = 0.80
    TB/s, where the same fraction of HBM would give 0.29 TB/s.
    """
    if sm_ratio is None:
        return {k: v * bw_ratio for k, v in table.items()}
    ceiling = table["copy"] * bw_ratio
    return {k: min(ceiling, v * sm_ratio) for k, v in table.items()}


def _tile_efficiency(m, n, k, p: TileParams, peak: float) -> np.ndarray:
    """Efficiency (of ``peak``) the tile model gives an ``(m, n, k)`` GEMM, as the measured
    rows are turned into efficiencies (dispatch subtracted, at most :data:`MAX_EFFICIENCY`)."""
    flops = 2.0 * np.asarray(m, float) * np.asarray(n, float) * np.asarray(k, float)
    t = np.maximum(tile_time_s(m, n, k, p) - BENCH_DISPATCH_S, flops / (peak * MAX_EFFICIENCY))
    return flops / t / peak


def _columns(df, names: tuple[str, ...]) -> list[np.ndarray]:
    """Columns of a table (``column -> array``, or a DataFrame) as float64 arrays."""
    return [np.asarray(df[c], dtype=np.float64) for c in names]


def _layout_means(df, values: np.ndarray, file: str) -> dict:
    """layout -> (log2 (m, n, k) of the distinct shapes, sorted; mean of ``values`` over the
    rows of each shape); :class:`SpecError` for a layout without rows."""
    mnk = np.stack(_columns(df, ("m", "n", "k")), axis=1)
    return layout_shape_means(mnk, np.asarray(df["layout"]).astype(str), values, file)


def layout_shape_means(mnk: np.ndarray, layout: np.ndarray, values: np.ndarray,
                       file: str) -> dict:
    """layout -> (log2 (m, n, k) of the distinct GEMM shapes of ``mnk`` (N, 3), sorted; mean of
    ``values`` over the rows of each shape), for every layout of :data:`LAYOUTS`;
    :class:`SpecError` naming ``file`` for a layout without rows."""
    out = {}
    for lay in LAYOUTS:
        s = layout == lay
        if not s.any():
            raise SpecError(f"{file}: no rows with layout '{lay}'")
        shapes, mean = group_mean(mnk[s], values[s])
        out[lay] = (np.log2(shapes), mean)
    return out


def _gemm_points(df, peak: float, tiles: dict | None = None) -> dict:
    """layout -> (log2 (m, n, k) points, log efficiency), relative to the tile model's
    efficiency when ``tiles`` (layout -> TileParams) is given. ``df``: the columns of
    ``gemm.csv`` (:func:`_read_csv`)."""
    m, n, k, seconds = _columns(df, ("m", "n", "k", "seconds"))
    flops = 2.0 * m * n * k
    t = np.maximum(seconds - BENCH_DISPATCH_S, flops / (peak * MAX_EFFICIENCY))
    leff = np.log(flops / t / peak)
    if tiles is not None:
        layout = np.asarray(df["layout"]).astype(str)
        for lay, p in tiles.items():
            s = layout == lay
            leff[s] -= np.log(_tile_efficiency(m[s], n[s], k[s], p, peak))
    return _layout_means(df, leff, "gemm.csv")


def _fp8_ratio_points(df: dict, peak16: float, peak8: float) -> dict:
    """layout -> (log2 (m, n, k) points, log(fp8 / bf16 time)) of ``gemm_fp8.csv``.

    Both times less :data:`BENCH_DISPATCH_S`, each at least the GEMM at :data:`MAX_EFFICIENCY`
    of its own peak (``peak16`` bf16, ``peak8`` fp8 [FLOP/s]); rows of one shape averaged in
    log. Example: fp8 18 us, bf16 28 us measured -> (18 - 8) / (28 - 8) = 0.5.
    """
    missing = {"m", "n", "k", "layout", "seconds", "bf16_seconds"} - set(df)
    if missing:
        raise SpecError(f"{FP8_GEMM_FILE}: missing columns {sorted(missing)}")
    m, n, k, s8, s16 = _columns(df, ("m", "n", "k", "seconds", "bf16_seconds"))
    flops = 2.0 * m * n * k
    t8 = np.maximum(s8 - BENCH_DISPATCH_S, flops / (peak8 * MAX_EFFICIENCY))
    t16 = np.maximum(s16 - BENCH_DISPATCH_S, flops / (peak16 * MAX_EFFICIENCY))
    return _layout_means(df, np.log(t8 / t16), FP8_GEMM_FILE)


def _attention_points(df: dict, peak: float) -> dict:
    """Per sequence length and pass: ``t = t0 + flops / rate`` (least squares over the rows).

    The intercept is the longest thread block (the last causal query block against all keys):
    it grows with the sequence and does not shrink with more heads. The backward's intercept is
    fixed at 2.5x the forward's (its FLOP ratio); its rate is fitted on ``fwd+bwd - fwd``.
    Returns ``pass -> (log2 seq (S,), t0 * peak (S,) [FLOP], rate / peak (S,))``.
    """
    batch, heads, seq, head_dim, seconds = _columns(
        df, ("batch", "heads", "seq", "head_dim", "seconds"))
    bh, t = batch * heads, seconds - BENCH_DISPATCH_S
    flops = 4.0 * bh * seq**2 * head_dim / 2.0
    passes = np.asarray(df["pass"]).astype(str)
    out: dict = {"fwd": ([], [], []), "bwd": ([], [], [])}
    for s in np.unique(seq):
        fwd = _by_bh(bh, (seq == s) & (passes == "fwd"))
        both = _by_bh(bh, (seq == s) & (passes == "fwd+bwd"))
        common = np.intersect1d(bh[fwd], bh[both])
        if len(np.unique(bh[fwd])) < 2 or not len(common):
            raise SpecError(
                f"attention.csv: sequence {s:g} has {len(np.unique(bh[fwd]))} forward "
                f"batch*heads size(s) and "
                f"{len(common)} with fwd+bwd: need at least two forward "
                "sizes and one of them also fwd+bwd"
            )
        slope, t0 = np.polyfit(flops[fwd], t[fwd], 1)
        t0 = max(t0, 0.0)
        rate = 1.0 / slope if slope > 0 else float(np.max(flops[fwd] / t[fwd]))
        f_c = fwd[np.searchsorted(bh[fwd], common)]  # rows of the common sizes
        b_c = both[np.searchsorted(bh[both], common)]
        fl_b = 2.5 * flops[f_c]
        t_b = (t[b_c] - t[f_c]) - 2.5 * t0
        rate_b = float(np.sum(fl_b * fl_b) / np.sum(fl_b * np.maximum(t_b, 1e-9)))
        for key, a, r in (("fwd", t0, rate), ("bwd", 2.5 * t0, rate_b)):
            out[key][0].append(np.log2(s))
            out[key][1].append(a * peak)
            out[key][2].append(min(r / peak, MAX_EFFICIENCY))
    return {k: tuple(np.asarray(x, dtype=np.float64) for x in v) for k, v in out.items()}


def _by_bh(bh: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """Indices of the selected rows, ordered by batch*heads (ties in row order)."""
    rows = np.flatnonzero(sel)
    return rows[np.argsort(bh[rows], kind="stable")]


def _membw(df: dict) -> dict:
    out = {}
    ops = np.asarray(df["op"]).astype(str)
    bytes_moved, seconds = _columns(df, ("bytes_moved", "seconds"))
    for op in np.unique(ops):
        name = "adamw" if op.startswith("adamw") else str(op)
        b, t = bytes_moved[ops == op], seconds[ops == op]
        if len(b) >= 2 and np.ptp(b) > 0:
            slope, _ = np.polyfit(b, t, 1)  # t = t0 + bytes / bw
            bw = 1.0 / slope if slope > 0 else float(np.max(b / t))
            bw = min(bw, float(np.max(b / np.maximum(t - BENCH_DISPATCH_S, 1e-9))))
        else:
            bw = float(b[0] / max(t[0] - BENCH_DISPATCH_S, 1e-9))
        out[name] = bw
    out.setdefault("copy", max(out.values()))
    for op in MEMOPS:  # ops the folder lacks run at the copy rate
        out.setdefault(op, out["copy"])
    return out


def load_calibration(folder: str | Path, gpu: str | GPUSpec | None = None) -> Calibration:
    """Read a calibration folder measured on ``gpu`` (the part that was measured).

    Parameters
    ----------
    folder : a path, or the name of a shipped calibration (``h200``).
    gpu : the measured GPU (preset name or spec); its datasheet bf16 peak and HBM bandwidth turn
        measured rates into fractions. Optional for shipped calibrations.
    """
    name = str(folder)
    path = Path(folder)
    if not path.is_dir():
        shipped = calibration_dir(name)
        if shipped is None:
            raise SpecError(f"calibration folder '{folder}' does not exist")
        path = shipped
    if gpu is None:
        if path.name not in _REFERENCE_GPU:
            raise SpecError(f"calibration '{folder}': give the measured GPU (gpu=...)")
        gpu = _REFERENCE_GPU[path.name]
    spec = load_gpu(gpu)
    _check_measured_part(path, spec)
    return _load_cached(str(path.resolve()), spec.model_dump_json())


def _check_measured_part(path: Path, gpu: GPUSpec) -> None:
    """Refuse a calibration measured on another part: its absolute rates would be read as
    fractions of this GPU's peak (an H200 table on an A100 gives 90 % MFU)."""
    measured = _read_env(path).get("name", "")
    models = re.findall(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", measured.upper())
    if models and not any(m_ in gpu.name.upper() for m_ in models):
        raise SpecError(
            f"calibration '{path}' was measured on {measured!r}, not on the cluster's GPU "
            f"'{gpu.name}': measure this GPU with calibrate_gpu.py, or leave the calibration "
            "out to scale the shipped one by datasheet"
        )


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, gpu_json: str) -> Calibration:
    gpu = GPUSpec.model_validate_json(gpu_json)
    folder = Path(path)
    peak = gpu.peak_flops("bf16")
    env = _read_env(folder)
    gemm = _read_csv(folder, "gemm.csv")
    tiles = _tile_params(folder, gemm, sms=int(env.get("sms", 132)))  # env.json: measured SMs
    fp8_points, fp8_gen = None, None
    if (folder / FP8_GEMM_FILE).exists():
        peak8 = gpu.peak_flops("fp8") if gpu.peak_tflops.fp8 is not None else 2.0 * peak
        fp8_points = _fp8_ratio_points(_read_csv(folder, FP8_GEMM_FILE), peak, peak8)
        fp8_gen = gpu_generation(gpu)
    return Calibration(
        name=folder.name,
        gemm_points=_gemm_points(gemm, peak, tiles),
        gemm_tiles=tiles,
        gemm_tiles_peak_flops=peak,
        gemm_points_plain=_gemm_points(gemm, peak),
        gemm_fp8_points=fp8_points,
        gemm_fp8_generation=fp8_gen,
        attention_points=_attention_points(_read_csv(folder, "attention.csv"), peak),
        membw_bytes_per_s_table=_membw(_read_csv(folder, "memops.csv")),
        hbm_bw_bytes_per_s=gpu.hbm_bw_bytes_per_s,
        peak_flops_bf16=peak,
        large_gemm_fraction=(
            env["matmul_bf16_8192_tflops"] * 1e12 / peak if "matmul_bf16_8192_tflops" in env
            else None
        ),
        sm_rate=(gpu.sm_count * gpu.boost_clock_ghz
                 if gpu.sm_count is not None and gpu.boost_clock_ghz is not None else None),
        source=f"measured on {env.get('name', gpu.name)} ({folder})",
    )


def tile_fit_digest(gemm: dict, sms: int) -> str:
    """SHA-256 of what the tile model is fitted on: the GEMM rows (shape, layout, seconds) and
    the SM count."""
    h = hashlib.sha256(f"sms={sms};".encode())
    for col in _columns(gemm, ("m", "n", "k", "seconds")):
        h.update(np.ascontiguousarray(col).tobytes())
    h.update("\0".join(np.asarray(gemm["layout"]).astype(str).tolist()).encode())
    return h.hexdigest()


def _fit_x(gemm: dict, sms: int) -> np.ndarray:
    return fit_tile_x(gemm["m"], gemm["n"], gemm["k"], gemm["layout"], gemm["seconds"], sms=sms)


def _tile_params(folder: Path, gemm: dict, sms: int) -> dict:
    """layout -> TileParams of ``gemm.csv``: the saved fit (:data:`TILE_FIT_FILE`) when it was
    made on these rows, else a fresh fit."""
    lays = sorted(set(np.asarray(gemm["layout"]).astype(str).tolist()))
    f = folder / TILE_FIT_FILE
    saved = parse_json(read_text_bounded(f, "JSON"), str(f)) if f.exists() else {}
    x = saved.get("x")
    if (saved.get("digest") == tile_fit_digest(gemm, sms) and isinstance(x, list)
            and len(x) == 7 and all(isinstance(v, float) for v in x)):
        return tile_params_of(np.array(x, dtype=np.float64), lays, sms)
    return tile_params_of(_fit_x(gemm, sms), lays, sms)


def write_tile_fit(folder: str | Path) -> Path:
    """Fit the tile model to a calibration folder's ``gemm.csv`` and save the fit there
    (:data:`TILE_FIT_FILE`; run after measuring or changing the table). Returns its path."""
    folder = Path(folder)
    sms = int(_read_env(folder).get("sms", 132))
    gemm = _read_csv(folder, "gemm.csv")
    doc = {"digest": tile_fit_digest(gemm, sms), "x": [float(v) for v in _fit_x(gemm, sms)]}
    path = folder / TILE_FIT_FILE
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    return path


def calibration_for(
    gpu: GPUSpec, calibration: Calibration | str | Path | None = None, gemm_scale: float = 1.0
) -> Calibration:
    """The calibration to use for ``gpu``.

    ``calibration`` given as a Calibration is used as is; as a folder it is read as measured on
    ``gpu``. Otherwise the GPU's shipped calibration (``gpu.calibration``) if any, else the H200
    measurement scaled to the GPU's datasheet (see :meth:`Calibration.scaled_to`).
    """
    if isinstance(calibration, Calibration):
        return calibration
    if calibration is not None:
        return load_calibration(calibration, gpu)
    if gpu.calibration is not None:
        cal = load_calibration(gpu.calibration, gpu)
        return cal if gemm_scale == 1.0 else replace(cal, gemm_scale=gemm_scale, _interp={})
    return _scaled_h200(gpu.model_dump_json(), gemm_scale)


@functools.lru_cache(maxsize=64)
def _scaled_h200(gpu_json: str, gemm_scale: float) -> Calibration:
    gpu = GPUSpec.model_validate_json(gpu_json)
    return load_calibration("h200").scaled_to(gpu, gemm_scale)
