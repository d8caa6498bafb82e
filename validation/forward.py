"""Validation that looks forward: the error of predictions the fitted constants never saw.

Three kinds of split over the dense (``training_runs_dev.csv``) and MoE (``moe_runs_dev.csv``)
rows, each refitting the dev-row constants on its training rows and predicting the held-out ones:

* ``forward``: by release date (one calendar for both files). For each release date R, the
  constants are refitted on the rows published before R and predict R's rows;
* ``lomo``: leave one MoE model out;
* ``logo``: leave one GPU generation out (volta, ampere, hopper, blackwell).

What is refitted per fold (the constants that carry most of the step time; the others stay at
their shipped values, fitted on all rows, and are listed as such in the report):

* the sustained GEMM fraction per part (Hopper; B200, GB200, GB300, B300), on the part's dense
  step rows with overlap (the rows :mod:`benchmarks.fit_time_model` fits it on), by the same
  objective (mean squared log ratio). A part with no training row takes the mean of the fitted
  Blackwell parts, else the Hopper value, else 1 (the one-GPU ceiling as measured: no fit);
* ``perfmodel.moe.experts.MOE_EXPERT_HOST_S`` on the training MoE rows, on the grid of
  ``benchmarks/moe_time_refit.py --grid`` (mean absolute error, as that script); 0 without rows.

The fit runs on a surrogate: every row is evaluated once per grid value of each constant, and
``log(step)`` is interpolated between grid values (separable in the two constants); the
held-out predictions are then evaluated exactly at the fold's constants. The per-fold constants
and per-row out-of-sample predictions are written by ``benchmarks/forward_refit.py`` into
``hardware_specs/validation/forward_folds.json`` and ``residuals.csv``; this module reads them
to report (:func:`forward_report`) and re-evaluates rows to check them (:func:`predict_row`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.errors import SpecError
from perfmodel.hardware.overlap import gpu_generation
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch
from perfmodel.step.evaluate import evaluate
from search.intervals import precision_class, read_residual_table, residual_interval
from validation import validate, validate_moe
from validation.validate import VALIDATION_DIR

__all__ = ["FRACTION_GRID", "HOST_GRID", "TARGETS", "Row", "all_rows", "fit_constants",
           "folds", "forward_report", "interval_calibration", "predict_row", "read_residuals",
           "release_date"]

FRACTION_GRID = (0.6, 0.7, 0.8, 0.9, 1.0)
HOST_GRID = (0.0, 6e-5, 7e-5, 8e-5, 9e-5, 1e-4, 1.1e-4, 1.3e-4)
FOLDS_PATH = VALIDATION_DIR / "forward_folds.json"
RESIDUALS_PATH = VALIDATION_DIR / "residuals.csv"
#: Targets of the out-of-sample errors (MAPE, or the largest |mean signed error| of a group).
TARGETS = {"forward_dense_mape": 0.07, "forward_moe_mape": 0.12, "group_bias": 0.10,
           "logo_mape": 0.12, "lomo_moe_mape": 0.12}

#: Release date (year-month) of each dense source group and MoE release (the publication or
#: container date).
_DENSE_DATES = {"Megatron-LM README 2020": "2020-09", "Megatron-LM 2021": "2021-04",
                "Korthikanti 2022": "2022-05", "NeMo 24.07": "2024-07",
                "NeMo 24.09 DGX Cloud": "2024-10", "Megatron-Bridge 25.09": "2025-09",
                "Megatron-Bridge 25.11": "2025-11"}
_MOE_DATES = (("MCore v0.8", "2024-08"), ("MCore v0.9", "2024-10"), ("v24.11", "2024-11"),
              ("v25.02", "2025-02"), ("25.02", "2025-02"), ("25.04", "2025-04"),
              ("25.07", "2025-07"), ("25.09", "2025-09"), ("v0.15", "2025-10"),
              ("25.11", "2025-11"), ("26.02", "2026-02"))
#: Framework preset of each release (the interval's finest neighbourhood), where one is shipped.
_FRAMEWORKS = (("Megatron-LM 2021", "megatron-2021"), ("Korthikanti", "megatron-2022"),
               ("NeMo 24.07", "nemo-24.07"), ("NeMo 24.09", "nemo-24.09"),
               ("25.09", "bridge-25.09"), ("25.11", "bridge-25.x"), ("26.02", "bridge-26.02"))
_PARTS = (("GB300", "GB300"), ("GB200", "GB200"), ("B300", "B300"), ("B200", "B200"),
          ("H100", "hopper"), ("H200", "hopper"), ("H800", "hopper"))


def release_date(release: str) -> str:
    """Year-month of a dense source group or MoE release label ('9999-99' when unknown)."""
    if release in _DENSE_DATES:
        return _DENSE_DATES[release]
    for key, date in _MOE_DATES:
        if key in release:
            return date
    return "9999-99"


def framework_of(release: str) -> str:
    """The shipped framework preset a release ran ('' when none matches)."""
    return next((fw for key, fw in _FRAMEWORKS if key in release), "")


def part_of(gpu_name: str) -> str:
    """The sustained-fraction key of a GPU: 'hopper' or the Blackwell part ('' when unfitted)."""
    up = gpu_name.upper()
    return next((p for key, p in _PARTS if key in up), "")


@dataclass(frozen=True)
class Row:
    """One expressible dev row: identity, neighbourhood keys, and how to predict it."""

    row_id: str
    kind: str  # "dense" or "moe"
    release: str
    date: str
    model: str
    gpu: str
    generation: str
    precision: str
    framework: str
    measured_s: float
    fits_fraction: bool  # a dense step row with overlap: sets the sustained fraction
    predict: Callable[[dict], float]


@contextlib.contextmanager
def _moe_host(host_s: float) -> Iterator[None]:
    old = moe.MOE_EXPERT_HOST_S
    moe.MOE_EXPERT_HOST_S = float(host_s)
    try:
        yield
    finally:
        moe.MOE_EXPERT_HOST_S = old


def _with_fraction(cluster, consts: dict):
    part = part_of(cluster.gpu.name)
    if not part or part not in consts.get("fraction", {}):
        return cluster
    gpu = cluster.gpu.model_copy(update={"sustained_gemm_fraction": consts["fraction"][part]})
    return cluster.model_copy(update={"gpu": gpu})


def _dense_predictor(case: validate.Case) -> Callable[[dict], float]:
    def predict(consts: dict) -> float:
        if not consts:
            return validate.predict_case(case)
        return validate.predict_case(replace(case, cluster=_with_fraction(case.cluster, consts)))
    return predict


def _moe_predictor(model, training, cluster, batch: ConfigBatch) -> Callable[[dict], float]:
    def predict(consts: dict) -> float:
        host = consts.get("moe_host_s", moe.MOE_EXPERT_HOST_S)
        with _moe_host(host):
            res = evaluate(model, training, _with_fraction(cluster, consts), batch)
        return float(res.step_time_s[0])
    return predict


def _dense_rows() -> list[Row]:
    out = []
    for _, r in validate.read_runs().iterrows():
        try:
            case = validate.case_from_row(r)
        except (SpecError, ValueError, TypeError, ZeroDivisionError):
            continue
        rel = validate.source_group(str(r["source"]))
        out.append(Row(case.row_id, "dense", rel, release_date(rel), case.label,
                       case.cluster.gpu.name, gpu_generation(case.cluster.gpu),
                       precision_class(case.training.precision_name), framework_of(rel),
                       case.measured_step_s,
                       case.scope == "step" and case.training.overlap_grad_reduce,
                       _dense_predictor(case)))
    return out


def _moe_rows() -> list[Row]:
    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv")
    out = []
    for _, r in df.iterrows():
        try:
            case = validate_moe.moe_case_from_row(r, df)
        except SpecError:  # refused rows (stated limits)
            continue
        model, batch = validate_moe.timed_model_and_batch(r, case)
        rel = str(r["release"])
        out.append(Row(str(r["row_id"]), "moe", rel, release_date(rel), case.label,
                       case.cluster.gpu.name, gpu_generation(case.cluster.gpu),
                       precision_class(case.training.precision_name), framework_of(rel),
                       case.measured_step_s, False,
                       _moe_predictor(model, case.training, case.cluster, batch)))
    return out


def all_rows() -> list[Row]:
    """Every expressible dense and MoE dev row."""
    return [*_dense_rows(), *_moe_rows()]


def predict_row(row: Row, consts: dict) -> float:
    """The row's predicted step time [s] under a fold's constants (``{}``: shipped)."""
    return row.predict(consts)


# ---- the splits --------------------------------------------------------------------------

def folds(rows: list[Row]) -> list[tuple[str, str, np.ndarray]]:
    """``(split, held-out key, test mask)`` of every fold; training rows are the others, and for
    ``forward`` only those of earlier dates."""
    out = []
    dates = np.array([r.date for r in rows])
    for d in sorted(set(dates)):
        out.append(("forward", d, dates == d))
    labels = np.array([r.model if r.kind == "moe" else "" for r in rows])
    for m in sorted(set(labels) - {""}):
        out.append(("lomo", m, labels == m))
    gens = np.array([r.generation for r in rows])
    for g in sorted(set(gens)):
        out.append(("logo", g, gens == g))
    return out


def training_mask(rows: list[Row], split: str, key: str, test: np.ndarray) -> np.ndarray:
    """The rows a fold fits on."""
    if split == "forward":
        return np.array([r.date < key for r in rows])
    return ~test


# ---- the fit on the surrogate ------------------------------------------------------------

def _interp_log(table: np.ndarray, grid: tuple, x: float) -> np.ndarray:
    """log(step) of every row of ``table`` (rows x grid) at ``x`` (linear in 1 / x for the
    fraction grid, in x for the host grid; both clipped to the grid)."""
    g = np.asarray(grid, dtype=float)
    inv = g[0] > 0
    xs, gx = (1.0 / g, 1.0 / x) if inv else (g, x)
    order = np.argsort(xs)
    return np.array([np.interp(gx, xs[order], np.log(t)[order]) for t in table])


def _fit_fraction(table: np.ndarray, measured: np.ndarray) -> float:
    fine = np.arange(FRACTION_GRID[0], FRACTION_GRID[-1] + 1e-9, 0.0025)
    loss = [np.mean((_interp_log(table, FRACTION_GRID, f) - np.log(measured)) ** 2)
            for f in fine]
    return round(float(fine[int(np.argmin(loss))]), 4)


def _fill_fractions(fitted: dict) -> dict:
    """Parts without training rows: mean of the fitted Blackwell parts, else Hopper's, else 1."""
    bw = [v for k, v in fitted.items() if k != "hopper"]
    out = dict(fitted)
    for part in ("hopper", "B200", "GB200", "GB300", "B300"):
        if part not in out:
            out[part] = (round(float(np.mean(bw)), 4) if part != "hopper" and bw
                         else fitted.get("hopper", round(float(np.mean(bw)), 4) if bw else 1.0))
    return out


def _fit_host(host_table: np.ndarray, frac_shift: np.ndarray, measured: np.ndarray) -> float:
    if len(measured) == 0:
        return 0.0
    loss = [np.mean(np.abs(np.exp(np.log(host_table[:, j]) + frac_shift) / measured - 1.0))
            for j in range(len(HOST_GRID))]
    return float(HOST_GRID[int(np.argmin(loss))])


def fit_constants(rows: list[Row], train: np.ndarray, tables: dict) -> dict:
    """The fold's constants from its training rows and the surrogate ``tables``
    (``fraction``: rows x :data:`FRACTION_GRID`, ``host``: rows x :data:`HOST_GRID`,
    ``shipped``: the rows' shipped predictions)."""
    measured = np.array([r.measured_s for r in rows])
    fitted = {}
    for part in ("hopper", "B200", "GB200", "GB300", "B300"):
        sel = train & np.array([r.fits_fraction and part_of(r.gpu) == part for r in rows])
        if sel.any():
            fitted[part] = _fit_fraction(tables["fraction"][sel], measured[sel])
    fractions = _fill_fractions(fitted)
    sel = train & np.array([r.kind == "moe" for r in rows])
    shift = _fraction_shift(rows, sel, tables, fractions)
    host = _fit_host(tables["host"][sel], shift, measured[sel])
    return {"fraction": fractions, "moe_host_s": host, "fitted_parts": sorted(fitted)}


def _fraction_shift(rows: list[Row], sel: np.ndarray, tables: dict, fractions: dict):
    """log(step at the fold's fraction) - log(step at the shipped one), per selected row."""
    idx = np.flatnonzero(sel)
    out = np.zeros(len(idx))
    for n, i in enumerate(idx):
        part = part_of(rows[i].gpu)
        if part:
            at = _interp_log(tables["fraction"][i:i + 1], FRACTION_GRID, fractions[part])[0]
            out[n] = at - np.log(tables["shipped"][i])
    return out


# ---- the report (from the committed files) ----------------------------------------------

def read_residuals(path: Path | None = None) -> pd.DataFrame:
    """The committed per-row out-of-sample predictions (one row per row and split)."""
    return pd.read_csv(path or RESIDUALS_PATH)


def read_folds(path: Path | None = None) -> list[dict]:
    """The committed per-fold constants."""
    return json.loads((path or FOLDS_PATH).read_text())["folds"]


def _stats(err: pd.Series) -> dict:
    return {"rows": len(err), "mape": float(err.abs().mean()) if len(err) else float("nan"),
            "bias": float(err.mean()) if len(err) else float("nan")}


def split_summary(res: pd.DataFrame) -> dict:
    """Per split and kind: out-of-sample and in-sample MAPE / mean signed error."""
    out = {}
    for (split, kind), g in res.groupby(["split", "kind"]):
        warm = g["warm"] if split == "forward" else pd.Series(True, index=g.index)
        out[f"{split}_{kind}"] = {"out_of_sample": _stats(g["error"][warm]),
                                  "in_sample": _stats(g["insample_error"][warm]),
                                  "cold_rows": int((~warm).sum()),
                                  "out_of_sample_with_cold": _stats(g["error"])}
    return out


def fold_table(res: pd.DataFrame) -> pd.DataFrame:
    """Per fold: rows, out-of-sample and in-sample MAPE and bias."""
    g = res.groupby(["split", "fold", "kind"], sort=True)
    return pd.DataFrame({"rows": g.size(), "mape": g["error"].apply(lambda e: e.abs().mean()),
                         "bias": g["error"].mean(),
                         "insample_mape": g["insample_error"].apply(lambda e: e.abs().mean()),
                         "insample_bias": g["insample_error"].mean()}).reset_index()


def group_bias_table(res: pd.DataFrame, split: str = "forward", min_rows: int = 3) -> pd.DataFrame:
    """Groups (kind x release x GPU x precision) of >= ``min_rows`` warm rows of a split."""
    sub = res[(res["split"] == split) & res["warm"]]
    g = sub.groupby(["kind", "release", "gpu", "precision"])
    t = pd.DataFrame({"rows": g.size(), "bias": g["error"].mean(),
                      "mape": g["error"].apply(lambda e: e.abs().mean()),
                      "insample_bias": g["insample_error"].mean()}).reset_index()
    return t[t["rows"] >= min_rows].reset_index(drop=True)


def targets_table(res: pd.DataFrame) -> list[dict]:
    """Each target: measured value, threshold, met."""
    s = split_summary(res)
    groups = group_bias_table(res)
    measured = {
        "forward_dense_mape": s["forward_dense"]["out_of_sample"]["mape"],
        "forward_moe_mape": s["forward_moe"]["out_of_sample"]["mape"],
        "group_bias": float(groups["bias"].abs().max()) if len(groups) else 0.0,
        "logo_mape": float(res[res["split"] == "logo"]["error"].abs().mean()),
        "lomo_moe_mape": s["lomo_moe"]["out_of_sample"]["mape"],
    }
    return [{"target": k, "measured": v, "threshold": TARGETS[k], "met": bool(v <= TARGETS[k])}
            for k, v in measured.items()]


def interval_calibration(path: Path | None = None) -> dict:
    """Coverage of the 80 % intervals (:mod:`search.intervals`) on the forward-chaining rows,
    each row's interval built from the residual table without that row (leave one out), and
    the median half-width (fraction of the predicted step time)."""
    table = read_residual_table(path)
    inside, half = [], []
    for i in range(len(table)):
        row = table.iloc[i]
        iv = residual_interval(table.drop(index=table.index[i]), row.to_dict())
        inside.append(iv.low <= row["ratio"] <= iv.high)
        half.append((iv.high - iv.low) / 2.0)
    return {"rows": len(table), "coverage": float(np.mean(inside)),
            "median_half_width": float(np.median(half))}


def forward_report(path: Path | None = None) -> dict:
    """The forward-looking report as one JSON-ready document."""
    res = read_residuals(path)
    return {"summary": split_summary(res), "targets": targets_table(res),
            "intervals": interval_calibration(path),
            "folds": fold_table(res).to_dict("records"),
            "groups": group_bias_table(res).to_dict("records"),
            "fold_constants": read_folds()}
