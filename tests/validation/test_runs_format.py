"""One runs format: ``plan validate --runs`` and ``plan calibrate --runs`` read the same CSV
with the same reader (:mod:`validation.runs`), the README's ``docs/examples/my_runs.csv``
included; long tables get a progress bar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli.main import app
from perfmodel.core.errors import SpecError
from validation import calibrate, validate
from validation.runs import PROGRESS_MIN_ROWS, read_runs, row_progress

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "my_runs.csv"
runner = CliRunner()


def test_both_commands_share_the_reader():
    assert validate.read_runs is read_runs
    assert calibrate.read_runs is read_runs


def test_example_is_a_runs_table():
    df = read_runs(EXAMPLE)
    assert len(df) == 2
    assert set(df["measurement_scope"]) == {""}  # optional, blank when left out


def test_plan_validate_reads_the_example():
    res = runner.invoke(app, ["validate", "--runs", str(EXAMPLE), "--no-vtrain", "--no-moe",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["rows"]) == 2


def test_plan_calibrate_reads_the_example():
    res = runner.invoke(app, ["calibrate", "--runs", str(EXAMPLE), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["profile"]["name"] == "calibrated"


def test_a_table_without_required_columns_is_one_line(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("model,num_gpus\nx,8\n")
    with pytest.raises(SpecError, match="missing column"):
        read_runs(f)
    for cmd in (["validate", "--runs", str(f), "--no-vtrain", "--no-moe"],
                ["calibrate", "--runs", str(f)]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2
        assert len(res.output.strip().splitlines()) == 1, res.output


def _terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True)


def test_progress_bar_only_for_long_tables():
    with row_progress(PROGRESS_MIN_ROWS, _terminal()) as progress:
        assert progress is None
    with row_progress(PROGRESS_MIN_ROWS + 1, Console(file=io.StringIO())) as progress:
        assert progress is None  # not a terminal
    con = _terminal()
    with row_progress(PROGRESS_MIN_ROWS + 1, con) as progress:
        assert callable(progress)
        progress(500, PROGRESS_MIN_ROWS + 1)


def test_validate_reports_progress_per_row():
    seen = []
    report, _ = validate.training_runs_report(read_runs(EXAMPLE),
                                              progress=lambda d, t: seen.append((d, t)))
    assert seen == [(0, 2), (1, 2)] and len(report) == 2
