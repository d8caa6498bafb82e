"""Power, energy and cost: hand-computed values."""

import numpy as np
import pytest

from perfmodel.run import energy as en


def test_gpu_power_at_its_utilisation():
    assert float(en.gpu_power_w(700.0, 0.8, 0.15)) == pytest.approx(581.0)
    assert float(en.gpu_power_w(700.0, 1.0, 0.15)) == pytest.approx(700.0)
    assert float(en.gpu_power_w(700.0, 0.0, 0.15)) == pytest.approx(105.0)


def test_energy_of_a_known_run():
    # 1,024 GPUs, 10 days, 581 W + 575 W per GPU, PUE 1.1: 312.5 MWh
    j = en.energy_j(1024, 10 * 86_400, 581.0, 575.0, 1.1)
    assert float(j) / en.JOULES_PER_MWH == pytest.approx(312.508, rel=1e-5)


def test_gpu_hours_and_cost():
    h = en.gpu_hours(16_384, 3600.0 * 24)
    assert float(h) == pytest.approx(393_216)
    assert float(en.cost(h, 2.0)) == pytest.approx(786_432)
    assert np.isnan(en.cost(h, None))
