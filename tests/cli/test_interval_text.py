"""The step time's interval as the report prints it: the step time's unit, three significant
digits, no bare decimal point."""

from cli.main import _interval_text


def test_interval_in_the_step_times_unit():
    assert _interval_text({"step_time_s": 16.4, "step_time_interval_s": [15.1, 17.9]}) == " (15.1-17.9)"
    assert _interval_text({"step_time_s": 0.21629,
                           "step_time_interval_s": [0.205, 0.215]}) == " (205-215)"
    assert _interval_text({"step_time_s": 2.0, "step_time_interval_s": [2.0, 2.5]}) == " (2.00-2.50)"
    assert _interval_text({"step_time_s": 2.0e-4,
                           "step_time_interval_s": [1.9e-4, 2.2e-4]}) == " (190-220)"


def test_no_interval_prints_nothing():
    assert _interval_text({"step_time_s": 1.0}) == ""
    assert _interval_text({"step_time_s": 1.0, "step_time_interval_s": None}) == ""
