"""The 80 % intervals of predicted step times (search.intervals)."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.hardware.profile import EfficiencyProfile, RunResidual
from search import plan
from search.intervals import (
    BACKOFF_WIDEN,
    conformal_ranks,
    interval_for,
    precision_class,
    residual_interval,
)


def _table(n_hopper: int) -> pd.DataFrame:
    ratios = [1.0, 1.1, 0.9, 1.2, 0.8, 1.05, 0.95, 1.0, 1.0, 1.0][:n_hopper]
    rows = [("hopper", "fp8", "dense", "bridge-25.x", r) for r in ratios]
    rows += [("ampere", "16-bit", "dense", "", r) for r in (1.0, 1.0, 1.0, 1.0, 1.0, 2.0)]
    return pd.DataFrame(rows, columns=["generation", "precision", "kind", "framework", "ratio"])


def test_conformal_ranks():
    # n = 20: k_lo = floor(21 * 0.1) = 2, k_hi = 21 - 2 = 19, covers 17 / 21
    assert conformal_ranks(20) == (2, 19, pytest.approx(17 / 21))
    assert conformal_ranks(5) == (1, 5, pytest.approx(4 / 6))


def test_finest_cell_with_enough_rows():
    # ratios 0.8 ... 1.2 (n = 5): min and max cover 4/6 only, stretched by 0.8 / (4/6) = 1.2
    # about the median 1.0: 0.8^1.2 = 0.76508, 1.2^1.2 = 1.24456
    iv = residual_interval(_table(5), {"generation": "hopper", "precision": "fp8",
                                       "kind": "dense", "framework": "bridge-25.x"})
    assert iv.backoff == 0 and iv.residuals == 5
    assert iv.low == pytest.approx(0.76508, abs=1e-5)
    assert iv.high == pytest.approx(1.24456, abs=1e-5)


def test_thin_cell_backs_off_and_widens():
    # 4 hopper rows < 5: hopper x fp8 x dense x framework and hopper x fp8 x dense and
    # hopper x dense all have 4, so it backs off to "dense" (10 rows), 3 levels: widened
    iv = residual_interval(_table(4), {"generation": "hopper", "precision": "fp8",
                                       "kind": "dense", "framework": "bridge-25.x"})
    # 10 rows: min 0.9, median 1.0, max 2.0 (ranks 1 and 10 cover 9/11 >= 0.8); two levels
    # beyond the first widen by 1 + 2 * 0.25 = 1.5: 0.9^1.5 = 0.85382, 2^1.5 = 2.82843
    assert iv.backoff == 3 and iv.residuals == 10
    assert BACKOFF_WIDEN == 0.25
    assert iv.low == pytest.approx(0.85382, abs=1e-5)
    assert iv.high == pytest.approx(2.82843, abs=1e-5)
    assert "widened" in iv.basis()


def test_unnamed_framework_skips_its_level():
    # the ampere rows have framework "": no framework named must not match them at the finest
    # level; ampere x 16-bit x dense has 6 rows, backoff 0
    iv = residual_interval(_table(5), {"generation": "ampere", "precision": "16-bit",
                                       "kind": "dense", "framework": ""})
    assert iv.level == "ampere x 16-bit x dense" and iv.backoff == 0 and iv.residuals == 6


def test_precision_class():
    assert precision_class("fp8-mx") == "fp8" and precision_class("bf16") == "16-bit"


def test_shipped_table_gives_a_finite_interval():
    # the interval need not hold 1: a biased neighbourhood shifts it (Hopper 16-bit dense rows
    # run faster than predicted)
    iv = interval_for("hopper", "bf16", False, None)
    assert 0.5 < iv.low < iv.high < 2.0 and iv.residuals >= 5


def test_every_result_row_carries_its_interval():
    r = plan("llama3.1-8b", "dgx-h100", gpus=8, tp=[1, 2], pp=1, cp=1, top=3)
    iv = interval_for("hopper", "bf16", False, None)
    for row in [r.best_row, *r.rows]:
        lo, hi = row["step_time_interval_s"]
        assert (lo, hi) == pytest.approx((row["step_time_s"] * iv.low,
                                          row["step_time_s"] * iv.high))
        tlo, thi = row["tokens_per_s_interval"]
        # tokens/s is inversely proportional to the step time: its bounds are inverted
        assert (tlo, thi) == pytest.approx((row["tokens_per_s"] / iv.high,
                                            row["tokens_per_s"] / iv.low))
    assert "out-of-sample residuals" in r.setup["interval"]
    assert {"step_time_low_s", "step_time_high_s"} <= set(r.top.columns)


# ---- a calibrated profile's own leave-one-out residuals ------------------------------------
def _profile(ratios, generation="hopper"):
    res = tuple(RunResidual(row_id=f"r{i}", generation=generation, precision="fp8",
                            kind="dense", ratio=r) for i, r in enumerate(ratios))
    return EfficiencyProfile(name="mine", residuals=res)


def test_profile_residuals_give_the_interval():
    # the same five ratios as the shipped-table case above: 0.8^1.2 = 0.76508, 1.2^1.2 = 1.24456
    iv = interval_for("hopper", "fp8", False, "bridge-25.x", _profile([1.0, 1.1, 0.9, 1.2, 0.8]))
    assert (iv.origin, iv.residuals, iv.backoff) == ("mine", 5, 0)
    assert iv.low == pytest.approx(0.76508, abs=1e-5)
    assert iv.high == pytest.approx(1.24456, abs=1e-5)
    assert "from 5 leave-one-out residuals of your runs (profile mine)" in iv.basis()
    assert iv.source()["residuals"] == "profile leave-one-out"


def test_profile_without_enough_residuals_falls_back_and_says_so():
    shipped = interval_for("hopper", "fp8", False, "bridge-25.x")
    four = "holds 4 leave-one-out residuals of hopper x fp8 x dense, fewer than 5"
    for prof, why in ((_profile([1.0] * 4), four),
                      (_profile([1.0] * 6, generation="ampere"), "holds 0 leave-one-out"),
                      (EfficiencyProfile(name="mine"), "holds no leave-one-out residuals")):
        iv = interval_for("hopper", "fp8", False, "bridge-25.x", prof)
        assert (iv.low, iv.high, iv.residuals) == (shipped.low, shipped.high, shipped.residuals)
        assert iv.origin == "" and why in iv.basis() and "shipped residuals are used" in iv.basis()
        assert iv.source()["note"] and iv.source()["residuals"] == "shipped forward"


def test_plan_under_a_profile_takes_its_interval():
    prof = _profile([0.95, 1.0, 1.02, 1.05, 1.1])
    prof = prof.model_copy(update={"residuals": tuple(
        r.model_copy(update={"precision": "16-bit"}) for r in prof.residuals)})
    r = plan("llama3.1-8b", "dgx-h100", gpus=8, global_batch_size=64, seq_len=4096,
             tp=1, pp=1, cp=1, micro_batch_size=1, zero_stage=1, profile=prof)
    row = r.rows[0]
    iv = interval_for("hopper", "bf16", False, None, prof)
    assert row["step_time_interval_s"] == pytest.approx(
        [row["step_time_s"] * iv.low, row["step_time_s"] * iv.high])
    assert "leave-one-out residuals of your runs (profile mine)" in r.setup["interval"]
    assert r.setup["interval_source"]["profile"] == "mine"
