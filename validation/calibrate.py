"""``plan calibrate``: fit an efficiency profile to a few measured runs of one cluster.

A user who has run two or three jobs on a cluster writes them into a CSV (the training-runs
format that ``plan validate --runs`` reads, :data:`REQUIRED_COLUMNS` at least) and gets a
profile (:class:`perfmodel.hardware.profile.EfficiencyProfile`) that ``plan --profile`` applies to every
other prediction.

The fit (:func:`fit_profile`) is a bounded nonlinear least-squares problem
(:func:`scipy.optimize.least_squares`, trust-region reflective) over the profile's named
parameters, never a constant per row:

* residual of a run: ``log(predicted / measured)`` divided by the run-to-run noise of a
  measured step time (:data:`NOISE`, 3 %);
* a prior residual per parameter, ``(x - neutral) / prior_sigma``, so that a direction the runs
  do not pin stays at the uncalibrated model (with two runs and several parameters, the fit is
  the smallest correction that explains them);
* parameters that no run is sensitive to (a one-sigma prior change moves no run by half the
  noise) are not fitted and stay neutral.
* when the runs cannot separate the informed parameters (fewer than two runs more than
  parameters, or a degenerate scaled Jacobian, :data:`MAX_CONDITION`) one overall efficiency
  is fitted that scales them all together (prior :data:`PRIOR_SIGMA_OVERALL`);
* the runs' scatter about the fit (what no parameter explains: model error per run) is added to
  the noise and the fit redone, so two runs that disagree pin little.

What it reports: each fitted parameter with its value, one-sigma uncertainty (from the Jacobian
at the solution) and the runs behind it (those whose time it changes most); the residual of
every run before and after; a warning when a parameter sits at a bound, and when two parameters
cannot be separated by the runs (posterior correlation), naming what kind of run would.

:func:`loo_residuals` is the check a user's own runs allow: each run predicted by the profile
refitted without it (leave-one-out, the path ``plan --profile`` predicts by). ``plan calibrate``
reports their MAPE next to the in-sample one and stores the residuals in the profile, from which
``plan --profile`` takes its 80 % intervals (:mod:`search.intervals`);
:func:`write_shipped_residuals` (``python -m validation.calibrate residuals ERA ...``) adds them
to the shipped era profiles, their fitted values untouched.

:func:`cross_validate` is the honest check on the dev split: per group (one source and release
on one GPU type and precision), fit on two rows chosen by a fixed rule (smallest and largest GPU
count) and predict the others; :func:`holdout_intervals` calibrates on half of a group's rows and
checks the intervals of the other half.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from scipy.optimize import least_squares

from hardware_specs import find_preset, preset_dir
from perfmodel.core.errors import SpecError
from perfmodel.core.files import (
    atomic_write,
    plain_name,
    refuse_input_as_output,
    shown,
)
from perfmodel.hardware.overlap import gpu_generation
from perfmodel.hardware.profile import (
    PARAMETERS,
    EfficiencyProfile,
    RunResidual,
    load_profile,
    profile_toml,
)
from perfmodel.parallel.config import resolve_config
from perfmodel.spec.specs import format_validation_error, load_cluster
from search.intervals import MIN_RESIDUALS, interval_for, precision_class
from validation.runs import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    normalize_runs,
    read_runs,
    row_progress,
)
from validation.validate import VALIDATION_DIR, Case, case_from_row, predict_case

__all__ = [
    "ERAS",
    "LOO_MIN_RUNS",
    "NOISE",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "FitResult",
    "calibrate_command",
    "calibration_pair",
    "check_consistent",
    "cross_validate",
    "dev_cases",
    "era_of",
    "era_transfer",
    "fit_era",
    "fit_profile",
    "group_key",
    "holdout_intervals",
    "load_profile",
    "loo_residuals",
    "normalize_runs",
    "profile_everywhere",
    "read_runs",
    "runs_to_cases",
    "with_loo",
    "write_profile",
    "write_shipped_profiles",
]

NOISE = 0.03
"""Run-to-run noise of a measured step time (relative, one sigma): published tables of the same
recipe differ by 1-4 % between releases of a page (validation README, NeMo 24.07)."""

PRIOR_SIGMA = {
    # one-sigma prior width of each parameter around neutral (log units for scales)
    "gemm_16bit": 0.15,
    "gemm_fp8": 0.15,
    "membw": 0.15,
    "scale_up_bw": 0.3,
    "scale_out_bw": 0.3,
    "step_overhead_ms": 50.0,
}

PRIOR_SIGMA_OVERALL = 0.06
"""One-sigma prior width of the overall efficiency (log units) fitted when the runs cannot
separate the parameters: the spread of the base model's per-group mean error on the dev split
(most group means within +-6 %)."""

CONTRADICTION = 0.10
"""Two rows describing the same run whose measured times differ by more than this are refused."""

def runs_to_cases(df: pd.DataFrame, cluster: Any = None, progress: Any = None
                  ) -> tuple[list[Case], list[tuple[str, str]]]:
    """Cases of the rows the tool can express, and ``(row_id, reason)`` for the others.

    ``cluster`` (a preset name, TOML path or ClusterSpec) replaces the cluster preset picked
    from each row's ``gpu_type``: describe your own fabric, and the profile is relative to it
    (use the same cluster with ``plan --profile``). ``progress(done, total)`` is called after
    each row (:func:`validation.runs.row_progress`).
    """


    cases, skipped = [], []
    for i, (_, r) in enumerate(df.iterrows()):
        if progress is not None:
            progress(i, len(df))
        try:
            c = case_from_row(r)
            if cluster is not None:
                cl = load_cluster(cluster, gpus=c.cluster.total_gpus)
                cfg = resolve_config(c.config, c.model, c.training,
                                     cl if c.scope == "step" else None)
                c = replace(c, cluster=cl, config=cfg)
            cases.append(c)
        except SpecError as e:
            skipped.append((str(r["row_id"]), shown(str(e), 400)))
        except ValidationError as e:
            skipped.append((str(r["row_id"]), shown(format_validation_error(e), 400)))
        except (ValueError, TypeError, KeyError, ArithmeticError) as e:
            skipped.append((str(r["row_id"]), f"malformed value: {shown(e, 200)}"))
    return cases, skipped


def _same_run_key(c: Case) -> str:
    return json.dumps([c.model.model_dump(), c.training.model_dump(), c.cluster.name,
                       c.cluster.total_gpus, c.config.model_dump(), c.scope], sort_keys=True,
                      default=str)


def check_consistent(cases: list[Case]) -> None:
    """SpecError when two rows describe the same run with measured times more than
    :data:`CONTRADICTION` apart."""
    seen: dict[str, Case] = {}
    for c in cases:
        k = _same_run_key(c)
        if k in seen:
            a = seen[k]
            hi, lo = max(a.measured_step_s, c.measured_step_s), min(a.measured_step_s,
                                                                   c.measured_step_s)
            if hi / lo - 1.0 > CONTRADICTION:
                raise SpecError(
                    f"rows {a.row_id} and {c.row_id} describe the same run but their measured "
                    f"times differ by {hi / lo - 1.0:.0%} ({a.measured_step_s:.4g} s vs "
                    f"{c.measured_step_s:.4g} s): contradictory, fix or drop one")
        else:
            seen[k] = c


# --------------------------------------------------------------------------------------------
# the fit
# --------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    """What :func:`fit_profile` found (see :meth:`report_lines`)."""

    profile: EfficiencyProfile
    params: list[dict[str, Any]]  # name, value, sigma, lo, hi, neutral, fitted, rows, at_bound
    rows: pd.DataFrame  # row_id, label, gpus, measured_s, before_s, after_s, err_before/after
    warnings: list[str] = field(default_factory=list)
    cost: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile.model_dump(), "parameters": self.params,
                "rows": self.rows.to_dict("records"), "warnings": self.warnings}


def _x_from_values(values: dict[str, float], names: list[str]) -> np.ndarray:
    by = {p.name: p for p in PARAMETERS}
    return np.array([math.log(values[n]) if by[n].log else values[n] for n in names])


def _values_from_x(x: np.ndarray, names: list[str]) -> dict[str, float]:
    by = {p.name: p for p in PARAMETERS}
    out = {}
    for n, v in zip(names, x, strict=True):
        p = by[n]
        out[n] = float(np.clip(math.exp(v) if p.log else v, p.lo, p.hi))
    return out


def _predict(cases: list[Case], profile: EfficiencyProfile) -> np.ndarray:
    return np.array([predict_case(c, profile=profile) for c in cases])


def _sensitivity(cases, profile, names, base_pred) -> np.ndarray:
    """``d log(predicted) / dx`` of every run for each parameter (forward differences)."""
    by = {p.name: p for p in PARAMETERS}
    S = np.zeros((len(cases), len(names)))
    vals = profile.values()
    for j, n in enumerate(names):
        p = by[n]
        h = 0.05 if p.log else 10.0
        x = math.log(vals[n]) if p.log else vals[n]
        if x + h > (math.log(p.hi) if p.log else p.hi):
            h = -h
        new = math.exp(x + h) if p.log else x + h
        pred = _predict(cases, profile.with_values(**{n: new}))
        S[:, j] = np.log(pred / base_pred) / h
    return S


MAX_CONDITION = 200.0
"""Largest condition number of the runs' scaled sensitivity matrix (``d log t / d x`` times
prior width over noise) at which the parameters are fitted separately. Above it (runs whose
terms all scale alike), or with fewer than two runs more than parameters (no residual left to
check a split against the noise: two runs of a cluster), the runs pin one overall efficiency,
not the split."""


def _condition(A: np.ndarray) -> float:
    if A.shape[1] == 0:
        return 1.0
    sv = np.linalg.svd(A, compute_uv=False)
    if sv.size < A.shape[1] or sv[-1] <= 1e-12 * max(sv[0], 1e-30):
        return math.inf
    return float(sv[0] / sv[-1])


def _free_directions(S: np.ndarray, names: list[str], sg: np.ndarray,
                     noise: float) -> tuple[np.ndarray, list[str]]:
    """Basis ``B`` (parameters x free directions) of the fit and the names tied together.

    Separate parameters when the runs can tell them apart: at least two runs more than
    parameters and a scaled sensitivity matrix that is not degenerate (:data:`MAX_CONDITION`). Otherwise one free direction, the overall
    efficiency: every informed scale (GEMM, memory, links) moves by the same log factor, which
    scales the predicted step time uniformly; an additive overhead stays neutral.
    """
    by = {p.name: p for p in PARAMETERS}
    n = len(names)
    if n <= 1 or (S.shape[0] > n + 1 and _condition(S * sg / noise) <= MAX_CONDITION):
        return np.eye(n), []
    scales = [i for i, m in enumerate(names) if by[m].log]
    B = np.zeros((n, 1))
    B[scales, 0] = 1.0
    return B, [names[i] for i in scales]


def _direction_bounds(B, x0, lo, hi):
    """Box bounds on the free directions such that ``x0 + B z`` stays in ``[lo, hi]``."""
    k = B.shape[1]
    zlo, zhi = np.full(k, -np.inf), np.full(k, np.inf)
    for j in range(k):
        m = B[:, j] != 0
        a = (lo[m] - x0[m]) / B[m, j]
        b = (hi[m] - x0[m]) / B[m, j]
        zlo[j] = np.max(np.minimum(a, b))
        zhi[j] = np.min(np.maximum(a, b))
    return zlo, zhi


def fit_profile(cases: list[Case], *, name: str = "calibrated", description: str = "",
                fitted_on: str = "", noise: float = NOISE,
                parameters: tuple[str, ...] | None = None) -> FitResult:
    """Fit the profile's parameters to measured runs (see module docstring).

    Raises SpecError with fewer than two runs or with contradictory rows.
    """
    if len(cases) < 2:
        raise SpecError(f"calibration needs at least 2 measured runs, got {len(cases)}: one run "
                        "cannot tell a slower GPU from a slower network")
    check_consistent(cases)
    neutral = EfficiencyProfile(name=name)
    meas = np.array([c.measured_step_s for c in cases])
    before = _predict(cases, neutral)
    warnings: list[str] = []
    # 1. which parameters the runs inform, and the directions they can be fitted in
    fs = _fit_space(cases, neutral, before, list(parameters or [p.name for p in PARAMETERS]),
                    noise, warnings)
    # 2. the bounded least-squares fit (refitted with the runs' scatter counted as noise)
    x, J, cost = _solve(_Objective(fs, cases, neutral, meas, noise))
    values = _values_from_x(x, fs.names)
    prof = neutral.with_values(**values)
    after = _predict(cases, prof)
    # 3. uncertainty, the runs behind each parameter, and what the runs cannot tell apart
    cov, S = _posterior(fs, J, after, meas, noise, len(cases))
    ids = [c.row_id for c in cases]
    params, unc = _parameter_entries(fs, values, x, cov, S, ids, warnings)
    if len(fs.names) >= 2 and not fs.tied:
        warnings += _separability_warnings(fs.names, cov, S)
    err_after = after / meas - 1.0
    for i in np.flatnonzero(np.abs(err_after) > 0.15):
        warnings.append(f"run {ids[i]} is still {err_after[i]:+.0%} off after calibration: "
                        "the profile cannot explain it (a setting of that run the model misses?)")
    prof = prof.model_copy(update={"description": description, "fitted_on": fitted_on,
                                   "uncertainty": unc})
    rows = pd.DataFrame({
        "row_id": ids, "model": [c.label for c in cases],
        "gpus": [c.cluster.total_gpus for c in cases],
        "measured_s": meas, "before_s": before, "after_s": after,
        "error_before": before / meas - 1.0, "error_after": err_after,
    })
    return FitResult(prof, params, rows, warnings, cost)


@dataclass
class _FitSpace:
    """What a fit moves: the informed parameters (``names``, of ``all_names``) in the internal
    coordinates ``x`` (log for scales), their neutral point ``x0``, prior widths ``sg`` and
    bounds, the free directions ``B`` (``x = x0 + B z``; one column per parameter, or one
    overall efficiency for the ``tied`` ones), the directions' prior widths ``zsg``, and the
    neutral sensitivities ``S0`` of every run to ``all_names``."""

    all_names: list[str]
    names: list[str]
    S0: np.ndarray
    x0: np.ndarray
    sg: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    B: np.ndarray
    tied: list[str]
    zsg: np.ndarray

    @property
    def S(self) -> np.ndarray:
        """The neutral sensitivities of the informed parameters (runs x names)."""
        return self.S0[:, [self.all_names.index(n) for n in self.names]]


def _fit_space(cases: list[Case], neutral: EfficiencyProfile, before: np.ndarray,
               all_names: list[str], noise: float, warnings: list[str]) -> _FitSpace:
    """The parameters the runs inform (a one-sigma prior change moves some run by half the
    noise) and the directions they are fitted in; warns when they are tied together."""
    by = {p.name: p for p in PARAMETERS}
    S0 = _sensitivity(cases, neutral, all_names, before)
    sig = np.array([PRIOR_SIGMA[n] for n in all_names])
    informed = np.max(np.abs(S0), axis=0) * sig >= 0.5 * noise
    names = [n for n, ok in zip(all_names, informed, strict=True) if ok]
    x0 = _x_from_values(neutral.values(), names)
    sg = np.array([PRIOR_SIGMA[n] for n in names])
    lo = np.array([math.log(by[n].lo) if by[n].log else by[n].lo for n in names])
    hi = np.array([math.log(by[n].hi) if by[n].log else by[n].hi for n in names])
    B, tied = _free_directions(S0[:, [all_names.index(n) for n in names]], names, sg, noise)
    if tied:
        warnings.append(
            f"{len(cases)} runs cannot separate {', '.join(tied)} (their sensitivities, scaled "
            f"by the prior and the noise, have condition number {_condition(S0[:, [all_names.index(n) for n in names]] * sg / noise):.3g}"
            f" > {MAX_CONDITION:g}, or fewer than two runs more than parameters): fitted one overall "
            f"efficiency that scales them together. To separate them add runs that differ in "
            + "; or ".join(f"{by[n].informed_by} ({n})" for n in tied))
    zsg = np.sqrt(1.0 / np.sum((B / sg[:, None]) ** 2, axis=0)) if B.shape[1] else np.zeros(0)
    if tied:  # one overall efficiency: its own prior, not the product of the tied ones
        zsg = np.array([PRIOR_SIGMA_OVERALL])
        sg = np.where(B[:, 0] != 0, PRIOR_SIGMA_OVERALL * math.sqrt(len(tied)), sg)
    return _FitSpace(all_names, names, S0, x0, sg, lo, hi, B, tied, zsg)


class _Objective:
    """Residuals of the fit in the free directions ``z``: per run ``log(predicted / measured)``
    over the noise, per parameter its prior residual; and their forward-difference Jacobian.
    ``noise`` is what the refit raises (the runs' scatter about the first fit)."""

    def __init__(self, fs: _FitSpace, cases: list[Case], neutral: EfficiencyProfile,
                 meas: np.ndarray, noise: float) -> None:
        self.fs, self.cases, self.neutral, self.meas = fs, cases, neutral, meas
        self.noise = noise
        self.memo: dict[bytes, np.ndarray] = {}
        # bounds of the free directions: every parameter they move stays inside its own bounds
        self.zlo, self.zhi = _direction_bounds(fs.B, fs.x0, fs.lo, fs.hi)

    def x_of(self, z: np.ndarray) -> np.ndarray:
        """The parameters (internal coordinates) at ``z``, clipped to their bounds."""
        return np.clip(self.fs.x0 + self.fs.B @ z, self.fs.lo, self.fs.hi)

    def log_ratio(self, x: np.ndarray) -> np.ndarray:
        """``log(predicted / measured)`` of every run at parameters ``x``."""
        prof = self.neutral.with_values(**_values_from_x(x, self.fs.names))
        return np.log(_predict(self.cases, prof) / self.meas)

    def resid(self, z):
        fs = self.fs
        key = np.asarray(z, dtype=np.float64).tobytes()
        if key not in self.memo:  # the Jacobian re-evaluates the point the solver just took
            x = fs.x0 + fs.B @ z
            r = self.log_ratio(x) / self.noise
            self.memo.clear()
            self.memo[key] = np.concatenate([r, (x - fs.x0) / fs.sg])
        return self.memo[key]

    def jac(self, z):
        # forward differences with an absolute step (the neutral point is z = 0, where a
        # relative step vanishes), stepping inward at an upper bound
        f0 = self.resid(z)
        out = np.empty((f0.size, z.size))
        for j in range(z.size):
            h = 1e-3 * self.fs.zsg[j]
            if z[j] + h > self.zhi[j]:
                h = -h
            zh = z.copy()
            zh[j] += h
            out[:, j] = (self.resid(zh) - f0) / h
        return out

    def fit(self, start: np.ndarray):
        """:func:`scipy.optimize.least_squares` (trust-region reflective) from ``start``."""
        return least_squares(self.resid, start, jac=self.jac, bounds=(self.zlo, self.zhi),
                             x_scale=self.fs.zsg, method="trf", xtol=1e-8, ftol=1e-10)


def _solve(obj: _Objective) -> tuple[np.ndarray, np.ndarray, float]:
    """The fitted parameters ``x``, the Jacobian in the free directions at the solution and
    the solver's cost; the neutral point when no parameter is informed."""
    fs = obj.fs
    n_runs = len(obj.cases)
    if not fs.names:
        return fs.x0, np.zeros((n_runs, 0)), 0.0
    zsg, zlo, zhi = fs.zsg, obj.zlo, obj.zhi
    start = np.clip(np.zeros(fs.B.shape[1]), zlo + 1e-2 * zsg, zhi - 1e-2 * zsg)
    sol = obj.fit(start)
    dof = n_runs - fs.B.shape[1]
    if dof > 0:
        # the runs' scatter about the fit (less any common offset a bound left over) is
        # error of the model that no profile parameter explains: count it as noise (two
        # runs that disagree pin little), refit
        r = obj.log_ratio(obj.x_of(sol.x))
        obj.noise = math.sqrt(obj.noise**2 + float(np.sum((r - r.mean())**2)) / dof)
        obj.memo.clear()
        sol = obj.fit(sol.x)
    z = np.clip(sol.x, zlo, zhi)
    return obj.x_of(z), obj.jac(z), float(sol.cost)


def _posterior(fs: _FitSpace, J: np.ndarray, after: np.ndarray, meas: np.ndarray,
               noise: float, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Posterior covariance of the parameters (``J`` includes the prior rows), inflated by the
    reduced chi-square when there are more runs than fitted directions (tied parameters fully
    correlated), and every run's ``d log(predicted) / dx`` (the neutral sensitivity)."""
    covz = np.linalg.pinv(J.T @ J) if fs.names else np.zeros((0, 0))
    data_r = np.log(after / meas) / noise
    dof = n_rows - fs.B.shape[1]
    if dof > 0:
        covz = covz * max(1.0, float(np.sum(data_r**2)) / dof)
    cov = fs.B @ covz @ fs.B.T  # of the parameters (tied ones fully correlated)
    S = fs.S if fs.names else np.zeros((n_rows, 0))
    return cov, S


def _parameter_entries(fs: _FitSpace, values: dict[str, float], x: np.ndarray,
                       cov: np.ndarray, S: np.ndarray, ids: list[str],
                       warnings: list[str]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One entry per profile parameter (fitted: value, sigma, the runs behind it, whether it
    sits at a bound, which is warned about; else why not) and the fitted ones' sigmas."""
    sx = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    names, lo, hi = fs.names, fs.lo, fs.hi
    params, unc = [], {}
    for p in PARAMETERS:
        entry: dict[str, Any] = {"name": p.name, "unit": p.unit, "neutral": p.neutral,
                                 "lo": p.lo, "hi": p.hi, "meaning": p.meaning}
        if p.name in names:
            j = names.index(p.name)
            v = values[p.name]
            s = v * sx[j] if p.log else sx[j]
            order = np.argsort(-np.abs(S[:, j]))
            rows = [ids[i] for i in order if abs(S[i, j]) >= 0.05][:8]
            at_lo = x[j] <= lo[j] + 1e-3
            at_hi = x[j] >= hi[j] - 1e-3
            neutral_x = fs.x0[j]
            at_bound = (at_lo and abs(lo[j] - neutral_x) > 1e-9) or (
                at_hi and abs(hi[j] - neutral_x) > 1e-9)
            entry.update(value=v, sigma=float(s), fitted=True, rows=rows, at_bound=bool(at_bound))
            unc[p.name] = float(s)
            if at_bound:
                warnings.append(
                    f"{p.name} = {v:.4g} sits at its bound [{p.lo:g}, {p.hi:g}]: the runs ask "
                    "for more than this correction allows; check their setup (precision, "
                    "overlap switches, recompute) and the cluster spec")
        else:
            why = ("not in the fitted set" if p.name not in fs.all_names else
                   "no run is sensitive to it: kept neutral")
            entry.update(value=p.neutral, sigma=None, fitted=False, rows=[], at_bound=False,
                         note=why)
        params.append(entry)
    return params, unc


def _separability_warnings(names: list[str], cov: np.ndarray, S: np.ndarray) -> list[str]:
    """Two fitted parameters the runs move together (their sensitivity columns are nearly
    parallel, or their posterior correlation is strong), one warning per pair."""
    by = {p.name: p for p in PARAMETERS}
    out = []
    d = np.sqrt(np.clip(np.diag(cov), 1e-30, None))
    corr = cov / np.outer(d, d)
    norm = np.linalg.norm(S, axis=0)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            cos = float(S[:, a] @ S[:, b] / max(norm[a] * norm[b], 1e-30))
            if abs(corr[a, b]) >= 0.8 or abs(cos) >= 0.98:
                pa, pb = by[names[a]], by[names[b]]
                out.append(
                    f"the runs cannot separate {pa.name} and {pb.name} (they change the "
                    f"runs in the same proportions: cosine {cos:+.2f}, posterior "
                    f"correlation {corr[a, b]:+.2f}); their split follows the prior. To "
                    f"separate them add runs that differ in one but not the other: "
                    f"{pa.informed_by} ({pa.name}), or {pb.informed_by} ({pb.name})")
    return out


# --------------------------------------------------------------------------------------------
# leave-one-out: out-of-sample residuals of the user's own runs
# --------------------------------------------------------------------------------------------
LOO_MIN_RUNS = 3
"""Fewest runs with leave-one-out residuals: each refit needs two runs (:func:`fit_profile`)."""


def _run_residual(case: Case, predicted_s: float) -> RunResidual:
    """``case``'s measured / ``predicted_s`` with its neighbourhood keys (search.intervals)."""
    return RunResidual(row_id=case.row_id, generation=gpu_generation(case.cluster.gpu),
                       precision=precision_class(case.training.precision_name),
                       kind="moe" if case.model.is_moe else "dense",
                       ratio=case.measured_step_s / predicted_s)


def loo_residuals(cases: list[Case], noise: float = NOISE, progress: Any = None
                  ) -> list[RunResidual]:
    """Out-of-sample residual of every run: the profile refitted on the other runs
    (:func:`fit_profile`, same settings) predicts it by :func:`predict_case`, the path of
    ``plan --profile``. Step-scope runs only (a layer time is not a step time); none with
    fewer than :data:`LOO_MIN_RUNS` runs. ``progress(done, total)`` is called before each
    refit."""
    if len(cases) < LOO_MIN_RUNS:
        return []
    out = []
    for i, case in enumerate(cases):
        if progress is not None:
            progress(i, len(cases))
        if case.scope != "step":
            continue
        prof = fit_profile(cases[:i] + cases[i + 1:], name="leave-one-out", noise=noise).profile
        out.append(_run_residual(case, predict_case(case, profile=prof)))
    return out


def with_loo(fit: FitResult, residuals: list[RunResidual]) -> FitResult:
    """``fit`` with its profile carrying the in-sample MAPE of its runs, their leave-one-out
    ``residuals`` and MAPE (None without residuals), and a ``loo_error`` column on its rows."""
    loo = {r.row_id: 1.0 / r.ratio - 1.0 for r in residuals}  # predicted / measured - 1
    ins = float(fit.rows["error_after"].abs().mean())
    loo_mape = float(np.mean(np.abs(list(loo.values())))) if loo else None
    prof = fit.profile.model_copy(update={"in_sample_mape": ins, "loo_mape": loo_mape,
                                          "residuals": tuple(residuals)})
    rows = fit.rows.assign(loo_error=pd.Series([loo.get(r) for r in fit.rows["row_id"]],
                                               index=fit.rows.index, dtype=object))
    return replace(fit, profile=prof, rows=rows)


# --------------------------------------------------------------------------------------------
# groups of the dev split, cross-validation, the shipped profiles
# --------------------------------------------------------------------------------------------
_GPU_CLASSES = ("GB300", "GB200", "B200", "H200", "H100", "A100", "V100", "MI300")


def _gpu_class(text: str) -> str:
    t = str(text).upper()
    return next((k for k in _GPU_CLASSES if k in t), t)


def _precision_group(text: str) -> str:
    """The precision part of a calibration group: ``fp8-mx`` (MXFP8) apart from the other fp8
    recipes, ``fp4``, and ``16-bit`` for everything else."""
    t = str(text).lower()
    if "fp8-mx" in t or "mxfp8" in t:
        return "fp8-mx"
    if "fp8" in t:
        return "fp8"
    if "fp4" in t:
        return "fp4"
    return "16-bit"


def group_key(r: pd.Series) -> str:
    """The calibration group of a dev-split row: source, software release (DeepSpeed rows of a
    Megatron paper apart), GPU type, precision class."""
    stack = " [DeepSpeed]" if "deepspeed" in str(r["zero_or_dist_optimizer"]).lower() else ""
    src = re.split(r"[,(]", str(r["source"]))[0].strip()
    return (f"{src} | {r['software']}{stack} | {_gpu_class(r['gpu_type'])} | "
            f"{_precision_group(r['precision'])}")


#: Era of each dev-split row, by its ``software`` column (first match), and the shipped profile.
ERAS = (
    ("megatron-2021", ("Megatron-LM (2020)", "Megatron-LM (2021)")),
    ("megatron-2022", ("Megatron-LM (2022)",)),
    ("nemo-24.07", ("NeMo 24.07",)),
    ("nemo-24.09", ("NeMo 24.09",)),
    ("bridge-25.x", ("NeMo 25.",)),
)


def era_of(r: pd.Series) -> str | None:
    """The shipped profile a dev row belongs to (DeepSpeed ZeRO-3 rows belong to none)."""
    if "deepspeed" in str(r["zero_or_dist_optimizer"]).lower():
        return None
    sw = str(r["software"])
    return next((name for name, keys in ERAS if any(k in sw for k in keys)), None)


_DEV_CACHE: dict[str, tuple[pd.DataFrame, list[Case]]] = {}


def dev_cases(path: str | Path | None = None) -> tuple[pd.DataFrame, list[Case]]:
    """The expressible rows of a training-runs CSV (default: the dev split) and their cases,
    row for row (cached)."""
    p = str(path or VALIDATION_DIR / "training_runs_dev.csv")
    if p not in _DEV_CACHE:
        df = normalize_runs(pd.read_csv(p, dtype={"row_id": str}), p)
        keep, cases = [], []
        for i, r in df.iterrows():
            try:
                cases.append(case_from_row(r))
            except SpecError:
                continue
            keep.append(i)
        _DEV_CACHE[p] = (df.loc[keep].reset_index(drop=True), cases)
    return _DEV_CACHE[p]


def calibration_pair(df: pd.DataFrame) -> tuple[int, int]:
    """The fixed rule: positions (in ``df``) of the smallest- and the largest-GPU-count row,
    ties broken by file order."""
    order = sorted(range(len(df)), key=lambda i: (int(df["num_gpus"].iloc[i]), i))
    return order[0], order[-1]


def cross_validate(path: str | Path | None = None, k_rule=calibration_pair) -> tuple[
        pd.DataFrame, pd.DataFrame]:
    """Per group of the dev split: fit on two rows (``k_rule``), predict the others.

    Returns ``(groups, rows)``: per group its row count, held-out count, MAPE before (the
    uncalibrated model) and after; per held-out row the errors before and after. Groups with
    fewer than three rows hold nothing out and are listed with ``held_out = 0``.
    """
    df, cases = dev_cases(path)
    keys = df.apply(group_key, axis=1)
    groups, rows = [], []
    for g in dict.fromkeys(keys):
        idx = np.flatnonzero((keys == g).to_numpy())
        sub = df.iloc[idx]
        if len(idx) < 3:
            groups.append({"group": g, "rows": len(idx), "held_out": 0, "mape_before": np.nan,
                           "mape_after": np.nan, "calibrated_on": ""})
            continue
        a, b = k_rule(sub)
        cal = [cases[idx[a]], cases[idx[b]]]
        fit = fit_profile(cal, name="cv")
        test = [cases[i] for j, i in enumerate(idx) if j not in (a, b)]
        before = _predict(test, EfficiencyProfile())
        after = _predict(test, fit.profile)
        meas = np.array([c.measured_step_s for c in test])
        eb, ea = before / meas - 1.0, after / meas - 1.0
        for c, x, y in zip(test, eb, ea, strict=True):
            rows.append({"group": g, "row_id": c.row_id, "model": c.label,
                         "gpus": c.cluster.total_gpus, "error_before": x, "error_after": y})
        groups.append({"group": g, "rows": len(idx), "held_out": len(test),
                       "mape_before": float(np.mean(np.abs(eb))),
                       "mape_after": float(np.mean(np.abs(ea))),
                       "calibrated_on": f"{cal[0].row_id}, {cal[1].row_id}",
                       "profile": {n: round(v, 3) for n, v in fit.profile.values().items()}})
    return pd.DataFrame(groups), pd.DataFrame(rows)


def era_cases(era: str, path: str | Path | None = None) -> list[Case]:
    """The cases of every dev row of a software era (:func:`era_of`), in file order."""
    df, cases = dev_cases(path)
    return [c for c, (_, r) in zip(cases, df.iterrows(), strict=True) if era_of(r) == era]


def fit_era(era: str, path: str | Path | None = None) -> FitResult:
    """The shipped profile of a software era: fitted on every dev row of that era."""
    df, _ = dev_cases(path)
    sel = era_cases(era, path)
    groups = sorted({group_key(r) for _, r in df.iterrows() if era_of(r) == era})
    return fit_profile(sel, name=era, description=f"software era {era}",
                       fitted_on=f"{len(sel)} rows of training_runs_dev.csv: " + "; ".join(groups))


def holdout_intervals(group: str, path: str | Path | None = None) -> dict[str, Any]:
    """The calibrated interval against the shipped one on one group of the dev split (one
    source, release, GPU type and precision: one cluster): its step-scope rows alternately in
    file order to a calibration half (fit and leave-one-out residuals, as ``plan calibrate``)
    and a held-out half, predicted under the profile as ``plan --profile`` does.

    Returns the halves' sizes, the in-sample and leave-one-out MAPE, the median half-width (s)
    over the held-out rows of the interval from the profile's residuals and of the shipped one,
    and the coverage of the held-out measured times by each (the shipped one also about the
    uncalibrated prediction, what the user has without a profile).
    """
    df, cases = dev_cases(path)
    keys = df.apply(group_key, axis=1).to_numpy()
    sel = [c for c, k in zip(cases, keys, strict=True) if k == group and c.scope == "step"]
    cal, held = sel[0::2], sel[1::2]
    fit = with_loo(fit_profile(cal, name="calibration-half"), loo_residuals(cal))
    meas = np.array([c.measured_step_s for c in held])
    pred = _predict(held, fit.profile)
    base = _predict(held, EfficiencyProfile())
    own, shipped = [], []
    for c in held:
        a = (gpu_generation(c.cluster.gpu), c.training.precision_name, bool(c.model.is_moe),
             c.framework or None)
        own.append(interval_for(*a, profile=fit.profile))
        shipped.append(interval_for(*a))

    def cover(p: np.ndarray, ivs: list) -> float:
        return float(np.mean([iv.low <= m / x <= iv.high for m, x, iv in zip(meas, p, ivs,
                                                                             strict=True)]))

    def half_width_s(ivs: list) -> float:
        return float(np.median([x * (iv.high - iv.low) / 2 for x, iv in zip(pred, ivs,
                                                                            strict=True)]))

    return {"group": group, "calibration_rows": len(cal), "held_out_rows": len(held),
            "in_sample_mape": fit.profile.in_sample_mape, "loo_mape": fit.profile.loo_mape,
            "from_profile": all(iv.origin for iv in own),
            "half_width_s": half_width_s(own), "shipped_half_width_s": half_width_s(shipped),
            "coverage": cover(pred, own), "shipped_coverage": cover(pred, shipped),
            "shipped_coverage_uncalibrated": cover(base, shipped)}


def era_transfer(path: str | Path | None = None) -> pd.DataFrame:
    """Calibration without a run of the cluster: per group of a shipped era that has a sibling
    group in that era, fit the era's profile on the era's *other* groups (strict
    leave-one-group-out) and predict every row of this group.

    Returns one row per group: ``era``, ``group``, ``rows``, ``mape_before`` (uncalibrated),
    ``mape_after`` (with the era profile fitted without the group).
    """
    df, cases = dev_cases(path)
    keys = df.apply(group_key, axis=1).to_numpy()
    eras = np.array([era_of(r) for _, r in df.iterrows()], dtype=object)
    out = []
    for era, _ in ERAS:
        groups = list(dict.fromkeys(keys[eras == era]))
        if len(groups) < 2:
            continue
        for g in groups:
            train = [c for c, k, e in zip(cases, keys, eras, strict=True) if e == era and k != g]
            test = [c for c, k in zip(cases, keys, strict=True) if k == g]
            fit = fit_profile(train, name=f"{era}-without-group")
            meas = np.array([c.measured_step_s for c in test])
            before = _predict(test, EfficiencyProfile()) / meas - 1.0
            after = _predict(test, fit.profile) / meas - 1.0
            out.append({"era": era, "group": g, "rows": len(test),
                        "mape_before": float(np.mean(np.abs(before))),
                        "mape_after": float(np.mean(np.abs(after))),
                        "abs_before": np.abs(before), "abs_after": np.abs(after)})
    return pd.DataFrame(out)


def profile_everywhere(profile: str | Path | EfficiencyProfile,
                       path: str | Path | None = None) -> pd.DataFrame:
    """One profile applied to every dev row: MAPE per era of the rows (``None``: rows of no
    shipped era, the DeepSpeed ZeRO-3 ones) and overall (``era = "all"``), before and after."""
    prof = load_profile(profile)
    df, cases = dev_cases(path)
    meas = np.array([c.measured_step_s for c in cases])
    before = np.abs(_predict(cases, EfficiencyProfile()) / meas - 1.0)
    after = np.abs(_predict(cases, prof) / meas - 1.0)
    eras = np.array([str(era_of(r)) for _, r in df.iterrows()], dtype=object)
    rows = [{"era": "all", "rows": len(cases), "mape_before": float(before.mean()),
             "mape_after": float(after.mean())}]
    for e in dict.fromkeys(eras):
        m = eras == e
        rows.append({"era": e, "rows": int(m.sum()), "mape_before": float(before[m].mean()),
                     "mape_after": float(after[m].mean())})
    return pd.DataFrame(rows)


def write_profile(fit: FitResult, path: str | Path, header: str = "") -> None:
    """Write the fitted profile's TOML to ``path`` atomically (temporary file and rename)."""
    atomic_write(path, profile_toml(fit.profile, header))



# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------
_RUNS_HELP = ("CSV of your measured runs: one row per run with the columns of "
              "training_runs_dev.csv; at least " + ", ".join(REQUIRED_COLUMNS)
              + " and seconds_per_iteration (or tokens_per_sec_per_gpu)")


def calibrate_command(
    runs: Annotated[Path, typer.Option("--runs", help=_RUNS_HELP)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="write the fitted profile (TOML) here; use it with "
        "`plan --profile FILE`")] = None,
    name: Annotated[str, typer.Option("--name", help="name stored in the profile")] =
    "calibrated",
    json_out: Annotated[bool, typer.Option("--json", help="one JSON document on stdout")] =
    False,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", help="your cluster (preset or TOML) instead of the preset picked from each "
        "row's gpu_type; use the same one with `plan --profile`")] = None,
) -> None:
    """Fit an efficiency profile to your cluster's measured runs (and refit it without each of
    them: the leave-one-out errors that give `plan --profile` its intervals)."""
    def fail(msg: str) -> None:
        typer.echo(f"plan: error: {msg}", err=True)
        raise typer.Exit(2)

    try:
        plain_name(name, "--name")
        if out is not None:  # --out r.csv with --runs r.csv destroyed the runs
            refuse_input_as_output(out, [runs, cluster, find_preset("cluster", cluster or "")],
                                   "--out")
        df = read_runs(runs)
        with row_progress(len(df), label="reading runs") as progress:
            cases, skipped = runs_to_cases(df, cluster, progress)
        if skipped and len(cases) < 2:
            rid, why = skipped[0]
            fail(f"--runs {runs}: row {rid}: {why}" + (
                f" (and {len(skipped) - 1} more rows)" if len(skipped) > 1 else ""))
        fit = fit_profile(cases, name=name, fitted_on=f"{len(cases)} runs of {runs.name}: "
                          + ", ".join(c.row_id for c in cases))
        if len(cases) >= LOO_MIN_RUNS and sys.stderr.isatty():
            typer.echo(f"leave-one-out: refitting without each of the {len(cases)} runs ...",
                       err=True)
        fit = with_loo(fit, loo_residuals(cases))
    except SpecError as e:
        fail(str(e))
        return
    if out is not None:
        try:
            write_profile(fit, out, header=f"fitted by `plan calibrate --runs {runs.name}`")
        except OSError as e:
            fail(f"--out {out}: cannot write: {e.strerror}")
    if json_out:
        doc = fit.to_json()
        doc["skipped"] = [{"row_id": r, "reason": w} for r, w in skipped]
        typer.echo(json.dumps(doc, indent=2, default=float))
        return
    con = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    _print_fit(con, fit, name, len(cases))
    for line in _loo_lines(fit.profile, len(cases)):
        con.print(line, soft_wrap=True, markup=False)
    for rid, why in skipped:
        con.print(f"not used: {rid}: {why}")
    for w in fit.warnings:
        con.print(f"[yellow]warning:[/] {w}")
    if out is not None:
        con.print(f"profile written to {out}: use it with `plan --profile {out}`")


def _loo_lines(prof: EfficiencyProfile, n_runs: int) -> list[str]:
    """The in-sample and leave-one-out MAPE of the runs, and where the intervals of
    ``plan --profile`` will come from."""
    ins = f"MAPE of the runs: {prof.in_sample_mape:.1%} in-sample (profile fitted on all of them)"
    if prof.loo_mape is None:
        return [(f"{ins}; leave-one-out needs at least {LOO_MIN_RUNS} runs (each refit needs "
                 "2), so `plan --profile` takes its 80% intervals from the shipped residuals")]
    cells: dict[str, int] = {}
    for r in prof.residuals:
        k = f"{r.generation} x {r.precision} x {r.kind}"
        cells[k] = cells.get(k, 0) + 1
    used = [f"{k} ({n} runs)" for k, n in cells.items() if n >= MIN_RESIDUALS]
    where = ("`plan --profile` takes its 80% intervals from these residuals for "
             + ", ".join(used) if used else
             f"fewer than {MIN_RESIDUALS} in every neighbourhood, so `plan --profile` takes its "
             "80% intervals from the shipped residuals")
    return [(f"{ins}, {prof.loo_mape:.1%} leave-one-out (each run predicted by the profile "
             f"fitted on the other {n_runs - 1})"),
            f"leave-one-out residuals stored in the profile: {where}"]


def _print_fit(con: Console, fit: FitResult, name: str, n_runs: int) -> None:
    """The fitted parameters and every run's error before and after calibration (and left out
    of it, where the runs allow leave-one-out)."""
    t = Table(title=f"fitted profile '{name}' ({n_runs} runs)", title_justify="left")
    for col in ("parameter", "value", "+-1 sigma", "bounds", "runs behind it"):
        t.add_column(col, justify="right" if col in ("value", "+-1 sigma") else "left")
    for p in fit.params:
        if p["fitted"]:
            t.add_row(p["name"], f"{p['value']:.3f}", f"{p['sigma']:.3f}",
                      f"[{p['lo']:g}, {p['hi']:g}]", ", ".join(p["rows"]) or "(prior only)")
        else:
            t.add_row(p["name"], f"{p['value']:g}", "-", f"[{p['lo']:g}, {p['hi']:g}]",
                      p.get("note", ""))
    con.print(t)
    loo = fit.profile.loo_mape is not None
    r = Table(title="runs: predicted vs measured step time", title_justify="left")
    for col in ("run", "model", "GPUs", "measured", "before", "error", "after", "error ",
                *(("left out",) if loo else ())):
        r.add_column(col, justify="left" if col in ("run", "model") else "right")
    for x in fit.rows.itertuples():
        out = ("-" if x.loo_error is None else f"{x.loo_error:+.1%}",) if loo else ()
        r.add_row(x.row_id, x.model, str(x.gpus), f"{x.measured_s:.4g} s", f"{x.before_s:.4g} s",
                  f"{x.error_before:+.1%}", f"{x.after_s:.4g} s", f"{x.error_after:+.1%}", *out)
    con.print(r)


def shipped_loo(era: str, folder: str | Path | None = None, progress: Any = None
                ) -> EfficiencyProfile:
    """The shipped profile of ``era`` (as written in ``folder``) with the in-sample MAPE of its
    values on the era's dev rows and their leave-one-out residuals and MAPE
    (:func:`loo_residuals`: refitted by :func:`fit_profile` without each row, the row predicted
    as ``plan --profile`` does); its fitted values untouched."""
    prof = load_profile(Path(folder or preset_dir("profile")) / f"{era}.toml")
    cases = era_cases(era)
    meas = np.array([c.measured_step_s for c in cases])
    ins = float(np.mean(np.abs(_predict(cases, prof) / meas - 1.0)))
    res = tuple(loo_residuals(cases, progress=progress))
    loo = float(np.mean([abs(1.0 / r.ratio - 1.0) for r in res])) if res else None
    return prof.model_copy(update={"in_sample_mape": ins, "loo_mape": loo, "residuals": res})


def add_residuals_toml(text: str, profile: EfficiencyProfile) -> str:
    """A profile's TOML ``text`` with the ``in_sample_mape`` / ``loo_mape`` lines and the
    ``[[residuals]]`` tables of ``profile`` (as :func:`profile_toml` writes them) in place of
    any it had; every other line, the fitted values included, byte for byte."""
    new = profile_toml(profile).splitlines()
    mapes = [ln for ln in new if ln.startswith(("in_sample_mape =", "loo_mape ="))]
    tail = new[new.index("[[residuals]]") - 1:] if profile.residuals else []
    cut = text.find("\n\n[[residuals]]")
    lines = [ln for ln in (text if cut < 0 else text[:cut + 1]).splitlines()
             if not ln.startswith(("in_sample_mape =", "loo_mape ="))]
    at = next(i for i, ln in enumerate(lines) if ln.startswith("fitted_on =")) + 1
    return "\n".join(lines[:at] + mapes + lines[at:] + tail) + "\n"


def write_shipped_residuals(eras: list[str], folder: str | Path | None = None
                            ) -> dict[str, EfficiencyProfile]:
    """Add :func:`shipped_loo`'s residuals to the shipped profiles of ``eras`` (in
    ``folder``), their fitted values unchanged (:func:`add_residuals_toml`)."""
    d = Path(folder or preset_dir("profile"))
    out = {}
    for era in eras:
        prof = shipped_loo(era, d)
        f = d / f"{era}.toml"
        atomic_write(f, add_residuals_toml(f.read_text(encoding="utf-8"), prof))
        out[era] = prof
    return out


def write_shipped_profiles(folder: str | Path | None = None) -> dict[str, FitResult]:
    """Fit and write the per-era profiles of ``hardware_specs/profiles`` from the dev split."""

    d = Path(folder or preset_dir("profile"))
    d.mkdir(parents=True, exist_ok=True)
    fits = {}
    for era, _ in ERAS:
        fit = fit_era(era)
        rms = float(np.sqrt(np.mean(fit.rows["error_after"] ** 2)))
        head = (f"Efficiency profile of the software era '{era}', fitted by\n"
                f"`python -m validation.calibrate` (validation.calibrate.fit_era) on the dev split\n"
                f"hardware_specs/validation/training_runs_dev.csv.\n"
                f"Rows: {', '.join(fit.rows['row_id'])}\n"
                f"In-sample MAPE {fit.rows['error_before'].abs().mean():.1%} uncalibrated -> "
                f"{fit.rows['error_after'].abs().mean():.1%} (rms {rms:.1%}); these are the "
                f"runs it was fitted on,\nnot a cross-validated figure (see README, "
                f"'calibrate to your cluster').")
        (d / f"{era}.toml").write_text(profile_toml(fit.profile, head))
        fits[era] = fit
    return fits


if __name__ == "__main__":  # `residuals ERA ...`: add leave-one-out residuals, refit nothing
    if sys.argv[1:2] == ["residuals"]:
        for era, p in write_shipped_residuals(sys.argv[2:]).items():
            print(era, f"in-sample {p.in_sample_mape:.3f}, leave-one-out {p.loo_mape:.3f}")
        sys.exit(0)
    for era, f in write_shipped_profiles().items():
        print(era, {k: round(v, 3) for k, v in f.profile.values().items()},
              f"{f.rows['error_before'].abs().mean():.3f} -> {f.rows['error_after'].abs().mean():.3f}")
