"""The honest check of ``plan calibrate``'s intervals: calibrate on half of one cluster's
published runs, and hold the other half out (:func:`validation.calibrate.holdout_intervals`)."""

from __future__ import annotations

import pytest

from validation.calibrate import holdout_intervals

NARAYANAN_A100 = "Narayanan et al. 2021 | Megatron-LM (2021), PyTorch NGC 20.12 | A100 | 16-bit"


@pytest.mark.slow
def test_calibrated_interval_on_held_out_a100_runs():
    """Narayanan 2021's A100 runs (one cluster, one release): five to calibrate, five held
    out. Measured: the interval from the five leave-one-out residuals has a median half-width
    of 4.4 % of the step against the shipped 5.1 %, and covers 4 of the 5 held-out runs (the
    shipped one, misplaced about the calibrated prediction, all 5). With five held-out runs a
    coverage is a multiple of 20 %: one miss more or less is within chance at 80 %."""
    r = holdout_intervals(NARAYANAN_A100)
    print(r)
    assert (r["calibration_rows"], r["held_out_rows"]) == (5, 5)
    assert r["from_profile"]
    assert r["half_width_s"] < r["shipped_half_width_s"]
    assert 0.6 <= r["coverage"] <= 1.0
    assert r["in_sample_mape"] <= r["loo_mape"] < 0.05
