"""What a user gets by typing a published row's settings: the dev-split accuracy both ways.

:func:`typed_back_report` predicts each dev row of the newest two releases
(:data:`NEWEST_SOURCES`) through :func:`search.plan` with only what the command line takes:
the model and cluster, the GPU count, global batch, sequence, plain precision (``--precision
fp8-cs``, ``bf16``, ``mxfp8``, ...) and every parallel dimension pinned (with the row's
per-stage layout where it has one). Once with the row's framework named (``--framework
bridge-25.x``) and once with no ``--framework`` (the GPU's default release,
:func:`perfmodel.spec.frameworks.default_framework`). The row reader's own knowledge (its
recipe switches, :func:`validation.validate.case_from_row`) is not used: the difference between
the two columns and ``plan validate``'s table is what a user would miss.
"""

from __future__ import annotations

import math

import pandas as pd

from perfmodel.core.errors import SpecError
from search.api import plan
from validation import validate
from validation.requests import case_pins

__all__ = ["NEWEST_SOURCES", "typed_back_report", "typed_back_summary"]

#: The rows of the newest two releases in the dev split (their source groups).
NEWEST_SOURCES = ("Megatron-Bridge 25.09", "Megatron-Bridge 25.11")


def _typed(case: validate.Case, framework: str | None) -> float:
    """The step time a user gets by typing the row's settings [s] (NaN: refused)."""
    t = case.training
    try:
        r = plan(case.model, case.cluster, None, global_batch_size=t.global_batch_size,
                 seq_len=t.seq_len, precision=t.precision_name, framework=framework, top=1,
                 **case_pins(case))
    except SpecError:
        return math.nan
    return float(r.rows[0]["step_time_s"]) if r.rows else math.nan


def typed_back_report(path=None) -> pd.DataFrame:
    """One row per step-scope dev row of :data:`NEWEST_SOURCES`: measured, predicted with the
    row's framework named (``named_s``) and with none (``default_s``), signed errors."""
    rows = []
    for _, r in validate.read_runs(path).iterrows():
        group = validate.source_group(str(r["source"]))
        if group not in NEWEST_SOURCES:
            continue
        try:
            case = validate.case_from_row(r)
        except SpecError:
            continue
        if case.scope != "step":
            continue
        named = _typed(case, validate.VENDOR_SOURCE_FRAMEWORK.get(group))
        default = _typed(case, None)
        rows.append({"row_id": case.row_id, "model": case.model.name, "source": group,
                     "gpu_type": case.cluster.gpu.name, "precision": case.training.precision_name,
                     "measured_s": case.measured_step_s, "named_s": named, "default_s": default,
                     "named_error": named / case.measured_step_s - 1.0,
                     "default_error": default / case.measured_step_s - 1.0})
    return pd.DataFrame(rows)


def typed_back_summary(report: pd.DataFrame) -> dict:
    """Rows, MAPE with the framework named and with none, and rows either way refused."""
    if report.empty:
        return {"rows": 0, "mape_named": math.nan, "mape_default": math.nan, "refused": 0}
    return {"rows": len(report),
            "mape_named": float(report["named_error"].abs().mean()),
            "mape_default": float(report["default_error"].abs().mean()),
            "refused": int(report[["named_s", "default_s"]].isna().any(axis=1).sum())}
