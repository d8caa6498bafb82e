"""Forward-looking validation (validation.forward): out-of-sample errors against their targets,
the committed fold files against a re-evaluation, and the coverage of the 80 % intervals.

The targets that the model does not meet are strict xfails carrying the measured number: when
the model improves past a target the xfail turns into a failure and the mark must go."""

from __future__ import annotations

import numpy as np
import pytest

from validation import forward as fw

pytestmark = pytest.mark.slow

#: Measured out-of-sample numbers (hardware_specs/validation/residuals.csv) of the targets not met.
NOT_MET: dict[str, float] = {"group_bias": 0.1868}  # MoE NeMo 25.11 B200 fp8 (4 rows): -18.7 %


@pytest.fixture(scope="module")
def targets() -> dict[str, dict]:
    return {t["target"]: t for t in fw.targets_table(fw.read_residuals())}


@pytest.mark.parametrize("name", sorted(fw.TARGETS))
def test_target(name, targets, request):
    t = targets[name]
    if name in NOT_MET:
        assert t["measured"] == pytest.approx(NOT_MET[name], abs=5e-4)
        request.applymarker(pytest.mark.xfail(
            strict=True, reason=f"{name} is {t['measured']:.1%} (target {t['threshold']:.0%})"))
    assert t["measured"] <= t["threshold"]


def test_interval_coverage_is_calibrated():
    iv = fw.interval_calibration()
    assert 0.75 <= iv["coverage"] <= 0.85
    assert 0.0 < iv["median_half_width"] < 0.5


def test_committed_folds_match_a_reevaluation():
    """A cheap subset: two held-out rows of each split, re-predicted with their fold's
    committed constants, give the committed predictions."""
    rows = {r.row_id: r for r in fw.all_rows()}
    res = fw.read_residuals()
    consts = {(f["split"], str(f["held_out"])): f for f in fw.read_folds()}
    picked = res[(res["kind"] == "moe") | (res["generation"] == "hopper")]
    for _, g in picked.groupby("split"):
        for rec in g.head(2).itertuples():
            pred = fw.predict_row(rows[rec.row_id], consts[(rec.split, str(rec.fold))])
            assert pred == pytest.approx(rec.predicted_s, rel=1e-4)


def test_forward_folds_train_only_on_earlier_releases():
    res = fw.read_residuals()
    dates = res.loc[res["split"] == "forward", "date"]
    for f in fw.read_folds():
        if f["split"] == "forward":
            assert f["train_rows"] == int((dates < f["held_out"]).sum())
            assert f["test_rows"] == int((dates == f["held_out"]).sum())
    assert np.isfinite(res["error"]).all()
