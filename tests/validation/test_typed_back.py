"""The dev rows of the newest two releases as a user types them (validation.typed_back): with
each row's framework named and with no framework, within the accuracy target."""

from __future__ import annotations

import pytest

from cli.validate import typed_back_line
from validation.typed_back import NEWEST_SOURCES, typed_back_report, typed_back_summary


@pytest.mark.slow
def test_newest_releases_typed_back_within_target():
    report = typed_back_report()
    assert set(report["source"]) == set(NEWEST_SOURCES)
    s = typed_back_summary(report)
    assert s["rows"] >= 20 and s["refused"] <= s["rows"] // 4
    assert s["mape_default"] <= 0.08 and s["mape_named"] <= 0.08
    line = typed_back_line(s)
    assert "with no --framework" in line and f"{s['rows']} rows" in line
