"""Published kernel measurements of GPUs we have not measured ourselves (GEMM efficiency tables).

A GPU with its own calibration folder (:mod:`perfmodel.hardware.calibration`, the H200) takes
its kernel rates from it. Another GPU takes them from the H200 tables transferred by datasheet
(same fraction of its peak at the same shape, scaled by the ratio of published matmul ceilings)
and, in multi-GPU training, by a sustained fraction fitted on end-to-end rows. Where a measured
per-shape table of that GPU and dtype is published, we use it instead: it is a kernel
measurement of that part, not a fit to end-to-end step times.

A table is a CSV file in ``hardware_specs/kernels`` (package data): ``#`` header lines naming the
source (repository, file, commit), then the columns ``gpu`` (the GPU spec's ``name``),
``dtype``, ``peak_tflops`` (the peak its efficiencies are fractions of [TFLOP/s]), ``m``, ``n``,
``k`` (the forward GEMM's shape: tokens, output and input features, as ``gemm.csv`` of a
calibration folder), ``layout`` (``fwd``, ``dgrad``, ``wgrad``) and ``efficiency`` (achieved
``2*m*n*k`` FLOP/s over ``peak_tflops``). Between measured shapes the efficiency is
interpolated as a calibration's (piecewise-linear in ``log`` over ``(log2 m, log2 n, log2
k)``, nearest measured shape outside their hull; :meth:`Calibration.gemm_efficiency`).

Shipped (the ``gpu`` column matches a GPU spec's name, case aside): B200 bf16 (SimuMax
``configs/system/b200_bf16_ceperm.json``, 432 shapes of dense Llama / DeepSeek layer GEMMs;
median efficiency 0.49 of the 2,250 TFLOP/s peak) and A100-PCIe-80GB bf16 (SimuMax
``configs/system/a100_pcie.json``, 183 shapes, median 0.73 of 312 TFLOP/s; used by a GPU preset
of that name, none shipped yet). No other GPU and dtype has a published per-shape table here:
:func:`kernel_table_notes` says so for each run.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from hardware_specs import ROOT as SPECS_ROOT
from perfmodel.core.csvtable import read_columns, to_float
from perfmodel.core.errors import SpecError
from perfmodel.core.files import read_text_bounded, shown
from perfmodel.hardware.calibration import Calibration, layout_shape_means
from perfmodel.spec.specs import GPUSpec

__all__ = ["KERNEL_TABLE_DIR", "GemmTable", "gemm_table", "kernel_table_notes",
           "read_gemm_table", "table_dtype", "with_gemm_table"]

KERNEL_TABLE_DIR = SPECS_ROOT / "kernels"
"""Folder of the shipped kernel tables (``<gpu>-<dtype>-gemm.csv``)."""

_COLUMNS = ("gpu", "dtype", "peak_tflops", "m", "n", "k", "layout", "efficiency")

#: Precision of a run -> dtype of the GEMM table that prices its layer GEMMs. fp16 runs on the
#: same tensor-core rate as bf16; fp8 / fp4 / fp32 GEMMs need a table of their own.
_TABLE_DTYPE = {"bf16": "bf16", "fp16": "bf16"}


@dataclass(frozen=True)
class GemmTable:
    """One published GEMM efficiency table: ``points`` maps a layout to (log2 (m, n, k) of the
    measured shapes (N, 3), their efficiency (N,) as a fraction of ``peak_tflops``)."""

    gpu: str
    dtype: str
    peak_tflops: float
    file: str
    source: str
    points: dict


def table_dtype(precision: str) -> str | None:
    """The dtype of the GEMM table that prices a run at ``precision`` (None: no table can)."""
    return _TABLE_DTYPE.get(precision)


def _header(text: str) -> str:
    """The ``# source: ...`` line of a table's header comment (what the table was read from)."""
    for line in text.splitlines():
        if line.startswith("# source:"):
            return line[len("# source:"):].strip()
    return "source not stated"


def read_gemm_table(path: Path) -> GemmTable:
    """A GEMM table file, checked (columns, one GPU and dtype, efficiencies in (0, 1]);
    :class:`SpecError` (one line) else."""
    text = read_text_bounded(path, "CSV")
    try:
        df = read_columns(text, comment="#")
    except ValueError as err:
        raise SpecError(f"{shown(path)}: not a CSV table: {shown(err)}") from None
    missing = [c for c in _COLUMNS if c not in df]
    if missing or not len(next(iter(df.values()))):
        raise SpecError(f"{shown(path)}: " + (f"missing columns {missing}" if missing
                                              else "no rows"))
    eff = to_float(df["efficiency"])
    if not (np.isfinite(eff).all() and (eff > 0).all() and (eff <= 1).all()):
        raise SpecError(f"{shown(path)}: efficiency outside (0, 1]")
    if len(set(df["gpu"].tolist())) != 1 or len(set(df["dtype"].tolist())) != 1:
        raise SpecError(f"{shown(path)}: one GPU and one dtype per table")
    mnk = np.stack([to_float(df[c]) for c in ("m", "n", "k")], axis=1)
    points = layout_shape_means(mnk, df["layout"].astype(str), eff, shown(path))
    return GemmTable(gpu=str(df["gpu"][0]), dtype=str(df["dtype"][0]),
                     peak_tflops=float(to_float(df["peak_tflops"][:1])[0]),
                     file=f"hardware_specs/kernels/{path.name}", source=_header(text),
                     points=points)


@functools.lru_cache(maxsize=1)
def _tables() -> dict[tuple[str, str], GemmTable]:
    """(GPU name, dtype) -> table, for every shipped ``*-gemm.csv``."""
    out = {}
    for p in sorted(KERNEL_TABLE_DIR.glob("*-gemm.csv")):
        t = read_gemm_table(p)
        out[(t.gpu.upper(), t.dtype)] = t
    return out


def gemm_table(gpu: GPUSpec, precision: str) -> GemmTable | None:
    """The published GEMM table of ``gpu`` for the layer GEMMs of a run at ``precision``, or
    None where none is shipped."""
    dtype = table_dtype(precision)
    return None if dtype is None else _tables().get((gpu.name.upper(), dtype))


def with_gemm_table(cal: Calibration, table: GemmTable, gemm_scale: float = 1.0) -> Calibration:
    """``cal`` with its GEMM efficiency taken from ``table`` (attention and memory-bound
    kernels unchanged), times ``gemm_scale`` (an efficiency profile's correction; 1 leaves the
    measurement as published).

    The table's efficiencies are fractions of its ``peak_tflops``; the calibration's are
    fractions of the GPU's dense bf16 peak: ``log(efficiency * peak_tflops / peak_bf16)``.
    No tile model, no transfer of rows between parts (``gemm_m_scale`` 1): the shapes are the
    measured part's own.
    """
    return _table_calibration(cal, table.gpu, table.dtype, float(gemm_scale))


@functools.lru_cache(maxsize=64)
def _table_calibration(cal: Calibration, gpu: str, dtype: str, gemm_scale: float) -> Calibration:
    """:func:`with_gemm_table`, built once per calibration (hashed by identity), table and
    scale: the interpolators are triangulated once."""
    table = _tables()[(gpu.upper(), dtype)]
    ratio = table.peak_tflops * 1e12 / cal.peak_flops_bf16
    points = {lay: (pts, np.log(eff * ratio)) for lay, (pts, eff) in table.points.items()}
    # a plain Calibration (a profiled one shares its base's interpolators: rebuild them here)
    return Calibration(**{
        **{f.name: getattr(cal, f.name) for f in fields(Calibration)},
        "gemm_points": points, "gemm_tiles": None, "gemm_points_plain": None,
        "gemm_scale": gemm_scale, "gemm_m_scale": 1.0, "name": f"{cal.name}+{table.file}",
        "source": f"{cal.source}; GEMMs: measured table {table.file} ({table.source})",
        "_interp": {},
    })


def kernel_table_notes(gpu: GPUSpec, precision: str, calibration_source: str,
                       sustained_fraction: float = 1.0) -> list[str]:
    """One line per kernel family saying where this run's efficiencies come from: a measured
    calibration of the GPU, a published table (file and source), or, where there is no measured
    kernel table for the GPU and dtype, what stands in for it (``sustained_fraction``: the
    fraction fitted on end-to-end rows that scales the transferred GEMM efficiency, 1 when none
    applies)."""
    if "scaled to" not in calibration_source:
        return [f"kernels: measured on this GPU ({calibration_source})"]
    table = gemm_table(gpu, precision)
    if table is not None:
        gemm = f"GEMM {table.dtype}: measured table {table.file} ({table.source})"
    else:
        gemm = (f"no measured kernel table for {gpu.name} {precision}: GEMM efficiency from the "
                "H200 bf16 table transferred by datasheet peak and published matmul ceiling"
                + (f", times the sustained fraction {sustained_fraction:.3g} fitted on end-to-end "
                   "rows" if sustained_fraction != 1.0 else "")
                + (" and the fitted low-precision ratio" if precision in ("fp8", "fp4") else ""))
    attention = (f"no measured kernel table for {gpu.name} attention: flash-attention rate from "
                 "the H200 table at the same fraction of peak")
    return [gemm, attention]
