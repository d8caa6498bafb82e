"""The shipped era profiles carry the leave-one-out residuals of the dev rows they were fitted
on (``python -m validation.calibrate residuals ERA``), their fitted values untouched."""

from __future__ import annotations

import math
import re
import tomllib

import numpy as np
import pytest

from hardware_specs import preset_dir
from perfmodel.hardware.profile import RunResidual, load_profile
from validation.calibrate import add_residuals_toml, era_cases, loo_residuals
from validation.validate import predict_case

#: The shipped profiles that carry leave-one-out residuals (nemo-24.09's 60 refits take long).
WITH_RESIDUALS = ("megatron-2021", "megatron-2022", "nemo-24.07", "bridge-25.x")
SMALLEST = "nemo-24.07"  # 12 rows


def _text(era: str) -> str:
    return (preset_dir("profile") / f"{era}.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize("era", WITH_RESIDUALS)
def test_one_residual_per_listed_step_row(era):
    text = _text(era)
    rows = re.search(r"^# Rows: (.*)$", text, re.MULTILINE).group(1).split(", ")
    p = load_profile(era)
    # one per step-scope row (a layer time is not a step time: no residual)
    assert [c.row_id for c in era_cases(era)] == rows
    assert [r.row_id for r in p.residuals] == [c.row_id for c in era_cases(era)
                                               if c.scope == "step"]
    ratios = np.array([r.ratio for r in p.residuals])
    assert np.all(np.isfinite(ratios)) and np.all(ratios > 0)
    # loo_mape is the mean |predicted / measured - 1| of those residuals
    assert p.loo_mape == pytest.approx(float(np.mean(np.abs(1 / ratios - 1))), abs=1e-4)
    assert 0 < p.in_sample_mape < 0.1 and 0 < p.loo_mape < 0.2


def test_in_sample_mape_is_the_shipped_values_on_their_rows():
    p = load_profile(SMALLEST)
    cases = era_cases(SMALLEST)
    meas = np.array([c.measured_step_s for c in cases])
    assert p.in_sample_mape == pytest.approx(
        float(np.mean(np.abs(np.array([predict_case(c, profile=p) for c in cases]) / meas - 1))), abs=1e-5)


@pytest.mark.slow
def test_shipped_residuals_are_leave_one_out():
    """About two minutes: twelve refits."""
    got = loo_residuals(era_cases(SMALLEST))
    p = load_profile(SMALLEST)
    assert [r.model_dump(exclude={"ratio"}) for r in got] == [
        r.model_dump(exclude={"ratio"}) for r in p.residuals]
    assert [r.ratio for r in p.residuals] == pytest.approx([r.ratio for r in got], abs=1e-5)


def test_adding_residuals_keeps_every_other_line():
    text = _text(SMALLEST)
    p = load_profile(SMALLEST).model_copy(update={
        "in_sample_mape": 0.0123456, "loo_mape": 0.02,
        "residuals": (RunResidual(row_id="R1", generation="hopper", precision="fp8",
                                  kind="dense", ratio=1.0123456),)})
    new = add_residuals_toml(text, p)
    assert add_residuals_toml(new, p) == new  # replaces, never appends twice
    kept = [ln for ln in new.splitlines() if not ln.startswith(("in_sample_mape", "loo_mape"))]
    old = [ln for ln in text.split("\n\n[[residuals]]")[0].splitlines()
           if not ln.startswith(("in_sample_mape", "loo_mape"))]
    assert kept[:len(old)] == old and kept[len(old):] == ["", "[[residuals]]", *(
        f"{k} = {v}" for k, v in (("row_id", '"R1"'), ("generation", '"hopper"'),
                                  ("precision", '"fp8"'), ("kind", '"dense"'),
                                  ("ratio", "1.01235")))]
    d = tomllib.loads(new)
    assert d["loo_mape"] == 0.02 and d["residuals"] == [
        {"row_id": "R1", "generation": "hopper", "precision": "fp8", "kind": "dense",
         "ratio": 1.01235}]
    assert math.isclose(load_profile(SMALLEST).gemm_fp8, tomllib.loads(new)["gemm_fp8"])
