"""Interruption rates: hand-computed values."""

import pytest

from perfmodel.run import failures as fl


def test_llama3_rate_per_gpu_hour():
    # 466 / (16,384 x 54 x 24) = 466 / 21,233,664
    assert fl.INTERRUPTIONS_PER_GPU_HOUR == pytest.approx(2.1946e-5, rel=1e-4)
    assert fl.UNEXPECTED_FRACTION == pytest.approx(419 / 466)


def test_bloom_rate_agrees_with_the_default_within_a_factor_of_two():
    bloom = float(fl.rate_per_gpu_hour(1.5, 384, 7))  # 1-2 GPU failures a week on 384 A100
    assert bloom == pytest.approx(2.325e-5, rel=1e-3)
    assert 0.5 < bloom / fl.INTERRUPTIONS_PER_GPU_HOUR < 2.0


def test_per_node_and_per_job_rates():
    assert float(fl.interruptions_per_node_hour(2e-5, 8)) == pytest.approx(1.6e-4)
    # 1,000 GPUs at 3.6e-5 per GPU-hour: 0.036 per hour = 1e-5 per second
    assert float(fl.interruptions_per_s(3.6e-5, 1000)) == pytest.approx(1e-5)


def test_expected_interruptions_gives_back_the_llama3_count():
    n = fl.expected_interruptions(fl.INTERRUPTIONS_PER_GPU_HOUR, 16_384, 54 * 86_400)
    assert float(n) == pytest.approx(466)
