"""Checkpoint size, cost, Young / Daly intervals, restart, lost work, wall time."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.run import checkpoint as ck


def test_checkpoint_bytes_bf16_adam():
    assert float(ck.checkpoint_bytes(405.85e9, 2, 12)) == pytest.approx(5.6819e12)


def test_blocking_cost_sync_and_async():
    assert float(ck.blocking_checkpoint_s("sync", 1e12, 2e11, 5e9)) == pytest.approx(5.0)
    assert float(ck.blocking_checkpoint_s("async", 1e12, 2e11, 5e9, 25e9)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="checkpoint mode"):
        ck.blocking_checkpoint_s("lazy", 1, 1, 1)


def test_young_interval():
    # sqrt(2 x 60 s x 3 h) = sqrt(1,296,000)
    assert float(ck.young_interval_s(60.0, 10_800.0)) == pytest.approx(1138.42, abs=0.01)


def test_daly_interval():
    # x = 60 / 21,600; 1,138.42 (1 + sqrt(x)/3 + x/9) - 60 = 1,098.77
    assert float(ck.daly_interval_s(60.0, 10_800.0)) == pytest.approx(1098.77, abs=0.01)
    # beyond delta >= 2M the interval is M
    assert float(ck.daly_interval_s(30_000.0, 10_000.0)) == pytest.approx(10_000.0)


def test_restart_and_lost_work():
    assert float(ck.restart_s(2e12, 1e12, 600.0)) == pytest.approx(602.0)
    assert float(ck.lost_work_s(1000.0, 10.0)) == pytest.approx(505.0)
    assert float(ck.lost_work_s(1000.0, 1.0, 20.0)) == pytest.approx(520.5)


def test_expected_wall_time():
    w = ck.expected_wall_s(1e6, 1000.0, 10.0, 600.0, 505.0, 1 / 10_800, 1.0)
    assert float(w) == pytest.approx(1.01e6 / (1 - 1105 / 10_800))
    assert np.isinf(ck.expected_wall_s(1e6, 1000.0, 10.0, 600.0, 505.0, 1 / 1000, 1.0))


@given(st.floats(0.1, 1e3), st.floats(1e3, 1e6))
def test_daly_is_near_young_and_positive(delta, mtbf):
    y = float(ck.young_interval_s(delta, mtbf))
    d = float(ck.daly_interval_s(delta, mtbf))
    assert d > 0
    assert abs(d - y) <= delta + 0.5 * y


@given(st.floats(1.0, 1e4), st.floats(1e-7, 1e-4))
def test_failures_never_shorten_the_run(tau, lam):
    w = float(ck.expected_wall_s(1e6, tau, 1.0, 600.0, tau / 2, lam, 0.9))
    assert w >= 1e6
