"""``plan validate`` predicts each published row through the request a user types
(validation.requests): the row's ``plan ...`` command line gives exactly the step time the
report gives, and the request's evaluation equals the step model's."""

from __future__ import annotations

import json
import shlex

import pandas as pd
import pytest
from typer.testing import CliRunner

from cli.main import app
from search.api import problem_of
from search.request import PlanRequest
from validation import validate, validate_moe
from validation.requests import predict_options, spec_toml, typed_options
from validation.runs import read_runs

runner = CliRunner()

#: Rows of the dev split whose commands are run: dense (Megatron-LM 2021, DeepSpeed ZeRO-3,
#: Megatron-LM's 2020 README in fp16, Megatron-Bridge Megatron-FSDP with CPU offload and an uneven
#: pipeline, DGX Cloud on flash-attn 2, two rows of the newest releases) and every 7th MoE row
#: that fits.
DENSE_SAMPLE = ("R0001", "R0016", "R0033", "R0156", "R0174", "R0243")
MOE_SAMPLE = 6


def _typed_step_s(command: str) -> float:
    """The step time ``command --json`` prints (run through the ``plan`` app)."""
    args = shlex.split(command)[1:] + ["--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return float(json.loads(res.stdout)["best"]["step_time_s"])


def _dense_sample(n_extra: int = 2) -> list[str]:
    """The fixed dense rows, plus the first rows of the two newest releases."""
    rows = list(DENSE_SAMPLE)
    df = read_runs()
    for src in ("25.09", "25.11"):
        ids = df.loc[df["source"].str.contains(src, regex=False), "row_id"].tolist()
        rows += [i for i in ids if i not in rows][:n_extra // 2]
    return rows


def test_spec_toml_reads_back(tmp_path):
    """A row's model and framework written as TOML are the same specs when read back."""
    df = read_runs()
    case = validate.case_from_row(df[df["row_id"] == "R0174"].iloc[0])
    opts = typed_options(validate.case_request(case), tmp_path, "r")
    assert "= " in spec_toml(case.model)
    space = problem_of(PlanRequest(**opts)).space
    assert space.model == case.model


@pytest.mark.slow
def test_row_commands_give_the_reported_step_time(tmp_path):
    """For 8 dense and 6 MoE rows, the command ``plan validate --commands`` prints gives, with
    ``--json``, exactly the step time ``plan validate`` reports."""
    res = runner.invoke(app, ["validate", "--commands", str(tmp_path)])
    assert res.exit_code == 0, res.output
    commands = dict(line.split("\t", 1) for line in res.stdout.splitlines())
    dense_ids = _dense_sample()
    df = read_runs()
    report, _ = validate.training_runs_report(df[df["row_id"].isin(dense_ids)].reset_index(
        drop=True))
    reported = dict(zip(report["row_id"], report["predicted_s"], strict=True))
    moe = validate_moe.moe_row_requests()
    moe_ids = [i for i in moe if predict_options(moe[i])[1].get("fits")][::7][:MOE_SAMPLE]
    reported.update({i: predict_options(moe[i])[0] for i in moe_ids})
    assert len(reported) == len(dense_ids) + MOE_SAMPLE
    for row_id, step_s in reported.items():
        assert _typed_step_s(commands[row_id]) == step_s, row_id


@pytest.mark.slow
def test_request_equals_step_model_on_every_row():
    """Every step row's request (plan_request) predicts what the step model gives the row
    directly (validation.validate.predict_case / the MoE timed batch): one path, no loss."""
    report, _ = validate.training_runs_report()
    df = read_runs()
    for _, r in df[df["row_id"].isin(report["row_id"])].iterrows():
        case = validate.case_from_row(r)
        if case.scope == "step":
            assert validate.predict_row(case)[0] == validate.predict_case(case), case.row_id
    moe_df = pd.read_csv(validate_moe.VALIDATION_DIR / "moe_runs_dev.csv")
    report, _ = validate_moe.moe_runs_report()
    for _, r in moe_df.iterrows():
        if r["row_id"] not in set(report["row_id"]):
            continue
        case = validate_moe.moe_case_from_row(r, moe_df)
        model, batch = validate_moe.timed_model_and_batch(r, case)
        direct = validate_moe.evaluate(model, case.training, case.cluster, batch)
        got = report.loc[report["row_id"] == case.row_id, "predicted_s"].item()
        assert got == float(direct.step_time_s[0]), case.row_id
