"""``plan calibrate``'s leave-one-out residuals: each run predicted by the profile refitted
without it, stored in the profile, and the 80 % interval ``plan --profile`` takes from them."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.hardware.profile import EfficiencyProfile, load_profile
from validation.calibrate import (
    fit_profile,
    loo_residuals,
    read_runs,
    runs_to_cases,
    with_loo,
    write_profile,
)
from validation.validate import predict_case

runner = CliRunner()

#: Three runs of Llama 3.1 8B on DGX H100 nodes (NeMo 24.09 recipe settings); the measured
#: times are filled in as 1.10 x the uncalibrated prediction: a cluster uniformly 10 % slow.
RUNS = """\
row_id,model,num_layers,hidden_size,num_attention_heads,seq_len,global_batch_size,micro_batch_size,tensor_parallel,pipeline_parallel,gpu_type,num_gpus,precision,num_query_groups,ffn_hidden_size,vocab_size,context_parallel,software,seconds_per_iteration
a8,Llama 3.1 8B,32,4096,32,8192,128,1,1,1,H100 80GB,8,BF16,8,14336,128256,2,NeMo 24.09,1
b16,Llama 3.1 8B,32,4096,32,8192,256,1,1,1,H100 80GB,16,BF16,8,14336,128256,2,NeMo 24.09,1
c16,Llama 3.1 8B,32,4096,32,8192,128,1,2,1,H100 80GB,16,BF16,8,14336,128256,1,NeMo 24.09,1
"""
SLOW = 1.10


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    df = pd.read_csv(io.StringIO(RUNS), dtype={"row_id": str})
    cases, skipped = runs_to_cases(read_runs(_write(df, tmp_path_factory.mktemp("r"))))
    assert not skipped and len(cases) == 3
    df["seconds_per_iteration"] = [SLOW * predict_case(c, profile=EfficiencyProfile())
                                   for c in cases]
    f = _write(df, tmp_path_factory.mktemp("runs"))
    cases, _ = runs_to_cases(read_runs(f))
    return f, cases


def _write(df, folder):
    f = folder / "runs.csv"
    df.to_csv(f, index=False)
    return f


@pytest.fixture(scope="module")
def loo(runs):
    return loo_residuals(runs[1])


def test_loo_residual_is_the_run_predicted_without_it(runs, loo):
    _, cases = runs
    assert [r.row_id for r in loo] == ["a8", "b16", "c16"]
    assert {(r.generation, r.precision, r.kind) for r in loo} == {("hopper", "16-bit", "dense")}
    # run 0 by hand: fit on runs 1 and 2, predict run 0 through plan --profile's path
    prof = fit_profile(cases[1:], name="without a8").profile
    assert loo[0].ratio == pytest.approx(cases[0].measured_step_s / predict_case(cases[0],
                                                                                 profile=prof))
    # two runs fit one overall efficiency (prior 0.06, noise 0.03 each): the posterior mean of
    # the log slowdown log(1.1) = 0.0953 is 0.0953 * 0.06^2 / (0.06^2 + 0.03^2 / 2) = 0.0847,
    # leaving exp(0.0953 - 0.0847) = 1.011 (less where a term does not scale with it)
    for r in loo:
        assert 1.0 < r.ratio < 1.03, r


def test_profile_stores_them_and_reads_them_back(runs, loo, tmp_path):
    _, cases = runs
    fit = with_loo(fit_profile(cases, name="mine"), loo)
    p = fit.profile
    assert p.loo_mape == pytest.approx(np.mean([abs(1 / r.ratio - 1) for r in loo]))
    assert p.in_sample_mape == pytest.approx(fit.rows["error_after"].abs().mean())
    assert p.in_sample_mape < p.loo_mape < math.log(SLOW)
    write_profile(fit, tmp_path / "mine.toml")
    back = load_profile(tmp_path / "mine.toml")
    assert [r.row_id for r in back.residuals] == ["a8", "b16", "c16"]
    assert [r.ratio for r in back.residuals] == pytest.approx([r.ratio for r in loo], abs=1e-5)
    assert back.loo_mape == pytest.approx(p.loo_mape, abs=1e-5)


def test_two_runs_have_no_loo_residuals(runs):
    assert loo_residuals(runs[1][:2]) == []


@pytest.mark.slow
def test_cli_reports_loo_next_to_in_sample(runs, tmp_path):
    f, _ = runs
    out = tmp_path / "mine.toml"
    r = runner.invoke(app, ["calibrate", "--runs", str(f), "--out", str(out), "--name", "mine"])
    assert r.exit_code == 0, r.output
    assert "in-sample (profile fitted on all of them)" in r.output
    assert "leave-one-out (each run predicted by the profile fitted on the other 2)" in r.output
    assert "left out" in r.output  # the runs table's leave-one-out column
    # three runs: fewer than MIN_RESIDUALS, the intervals stay the shipped ones, and it says so
    assert "fewer than 5 in every neighbourhood" in r.output
    p = load_profile(out)
    assert len(p.residuals) == 3
    r2 = runner.invoke(app, ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                             "--tp", "1", "--pp", "1", "--cp", "2", "--micro-batch", "1",
                             "--zero", "1", "--global-batch", "128", "--seq-len", "8192",
                             "--profile", str(out), "--json"])
    assert r2.exit_code == 0, r2.output
    src = json.loads(r2.output)["setup"]["interval_source"]
    assert src["residuals"] == "shipped forward" and "profile mine holds 3" in src["note"]
