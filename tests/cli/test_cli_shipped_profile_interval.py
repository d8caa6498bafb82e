"""``plan --profile nemo-24.07``: the 80 % interval from the shipped profile's leave-one-out
residuals where they cover the configuration's neighbourhood, the shipped ones (with a note)
where not."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
PINNED = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "1",
          "--pp", "1", "--cp", "1", "--micro-batch", "1", "--zero", "1", "--global-batch", "128",
          "--seq-len", "8192", "--recompute", "none", "--profile", "nemo-24.07"]


def _plan(*extra: str) -> tuple[str, dict]:
    r = runner.invoke(app, [*PINNED, *extra])
    assert r.exit_code == 0, r.output
    j = runner.invoke(app, [*PINNED, *extra, "--json"])
    assert j.exit_code == 0, j.output
    return r.output, json.loads(j.output)["setup"]


def test_covered_neighbourhood_takes_the_profiles_residuals():
    out, setup = _plan("--precision", "fp8-delayed")  # its 12 rows: H100, fp8, dense
    basis = ("80% interval of the measured step time from 12 leave-one-out residuals of your "
             "runs (profile nemo-24.07) of hopper x fp8 x dense")
    assert basis in out and setup["interval"] == basis
    src = setup["interval_source"]
    assert (src["residuals"], src["profile"], src["count"], src["neighbourhood"]) == (
        "profile leave-one-out", "nemo-24.07", 12, "hopper x fp8 x dense")


@pytest.mark.parametrize("precision", ["bf16"])
def test_uncovered_neighbourhood_keeps_the_shipped_ones(precision):
    out, setup = _plan("--precision", precision)
    note = ("profile nemo-24.07 holds 0 leave-one-out residuals of hopper x 16-bit x dense, "
            "fewer than 5: the shipped residuals are used")
    assert note in out
    src = setup["interval_source"]
    assert src["residuals"] == "shipped forward" and src["profile"] is None
    assert src["note"] == note
