"""``plan verify`` refuses unbounded or unrunnable counts up front, one line, exit 2."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.verify import max_nproc


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--nproc", "1000"], "--nproc 1000: expected 1 to"),
        (["--nproc", "3"], "power-of-two"),
        (["--nproc", "6"], "power-of-two"),
        (["--timeout", "-1"], "--timeout -1.0"),
        (["--timeout", "nan"], "--timeout nan"),
        (["--timeout", "inf"], "--timeout inf"),
        (["--timeout", "0"], "--timeout 0.0"),
        (["--top", "100000"], "--top 100000"),
        (["--timed-steps", "1000000"], "--timed-steps 1000000"),
    ],
)
def test_verify_refuses_bad_counts_up_front(args, needle):
    r = CliRunner().invoke(app, ["verify", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1


def test_nproc_cap_is_bounded():
    assert 4 <= max_nproc() <= 64


def test_run_config_refuses_bad_timeout():
    pytest.importorskip("torch")
    from harness.launch import job_spec, run_config
    from harness.model import tiny_spec

    job = job_spec({"dp": 1, "micro_batch_size": 8}, tiny_spec(), global_batch_size=8, seq_len=32)
    for bad in (-1.0, math.nan, math.inf, 0.0):
        with pytest.raises(ValueError, match="timeout_s"):
            run_config(job, 1, timeout_s=bad)
