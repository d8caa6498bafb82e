"""The calibration group a plan names (validation.evidence): which published runs back its MFU."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.parallel.config import ConfigBatch
from perfmodel.step.evaluate import evaluate
from validation import evidence_table, validate
from validation.evidence import TABLE_PATH, _rows, calibration_evidence, evidence_line


def test_framework_narrows_to_its_source():
    ev = calibration_evidence("A100-SXM4-80GB", "megatron-2022", "bf16")
    assert ev["matched_by"] == "16-bit, framework megatron-2022"
    (g,) = ev["groups"]
    assert g["source"] == "Korthikanti 2022" and g["gpu_type"] == "A100-SXM4-80GB"
    # the step-scope rows of Korthikanti et al. 2022 (Table 5 and the 530B/2240 GPU runs that
    # have a global batch); Table 4's one-layer rows are not steps
    assert g["rows"] == [f"R00{i}" for i in range(45, 53)]
    assert 0.3 < g["measured_mfu_min"] < g["measured_mfu_max"] < 0.6


def test_measured_mfu_is_the_models_flops_over_the_measured_time():
    """measured MFU = predicted MFU x predicted step / measured step (same FLOPs, same peak)."""
    ev = calibration_evidence("A100-SXM4-80GB", "megatron-2022", "bf16")
    df = validate.read_runs()
    mfus = []
    for rid in ev["groups"][0]["rows"]:
        case = validate.case_from_row(df[df.row_id == rid].iloc[0])
        res = evaluate(case.model, case.training, case.cluster,
                       ConfigBatch.from_configs([case.config]))
        mfus.append(float(res.mfu[0] * res.step_time_s[0]) / case.measured_step_s)
    g = ev["groups"][0]
    assert g["measured_mfu_min"] == pytest.approx(min(mfus))
    assert g["measured_mfu_max"] == pytest.approx(max(mfus))
    # Korthikanti et al. 2022 (README of NVIDIA/Megatron-LM, commit 2e90a342f5): the best run,
    # 1T on 512 A100 with selective recompute, 56.3 % MFU
    assert g["measured_mfu_max"] == pytest.approx(0.563, abs=0.01)


def test_precision_class_when_no_framework_matches():
    ev = calibration_evidence("H100-SXM5-80GB", None, "fp8-cs")
    assert ev["matched_by"] == "fp8"
    assert ev["groups"] and all("fp8" in g["precision"] for g in ev["groups"])
    ev16 = calibration_evidence("H100-SXM5-80GB", None, "bf16")
    assert {g["precision"] for g in ev16["groups"]} == {"bf16"}


def test_gpu_without_published_runs_says_so():
    ev = calibration_evidence("MI300X", None, "bf16")
    assert ev["groups"] == []
    line = evidence_line(ev, "measured on NVIDIA H200; scaled to MI300X")
    assert "no published 16-bit run on MI300X" in line and "scaled to MI300X" in line


def test_make_plan_names_its_calibration_group():
    """`make plan` (GPT-3 175B on 1024 A100, megatron-2022): the header names the group and its
    measured MFU range, and the JSON carries it; the plan's MFU lies within that range."""
    r = CliRunner().invoke(app, ["--framework", "megatron-2022"])
    assert r.exit_code == 0, r.output
    assert ("calibrated on (16-bit dense, framework megatron-2022): Korthikanti 2022 / "
            "A100-SXM4-80GB") in r.output
    r = CliRunner().invoke(app, ["--framework", "megatron-2022", "--json"])
    doc = json.loads(r.stdout)
    g = doc["calibrated_on"]["groups"][0]
    mfu = doc["best"]["mfu"] if "best" in doc else doc["rows"][0]["mfu"]
    assert g["measured_mfu_min"] <= mfu <= g["measured_mfu_max"]


def test_evidence_is_of_the_same_precision_class_and_kind_of_model():
    """A bf16 MoE plan is never backed by dense or fp8 runs: the same class and kind, or none."""
    ev = calibration_evidence("H100-SXM5-80GB", None, "bf16", True)
    assert ev["kind"] == "16-bit MoE"
    for g in ev["groups"]:
        assert g["precision"] in ("bf16", "fp16")
    dense = calibration_evidence("H100-SXM5-80GB", None, "fp8-cs", False)
    moe_rows = {x["row_id"] for x in _rows() if x["moe"]}
    assert all(not set(g["rows"]) & moe_rows for g in dense["groups"])
    if not ev["groups"]:
        assert "no published 16-bit MoE run on H100-SXM5-80GB" in evidence_line(ev)


def test_shipped_table_is_fresh():
    """The per-row table the plan header reads equals the dev rows evaluated now (regenerate it
    with ``python -m validation.evidence_table`` when predictions move)."""
    shipped = json.loads(TABLE_PATH.read_text())
    fresh = evidence_table.evidence_rows()
    assert [r["row_id"] for r in shipped] == [r["row_id"] for r in fresh]
    for old, new in zip(shipped, fresh):
        for k, v in new.items():
            if isinstance(v, float):
                assert old[k] == pytest.approx(v, rel=1e-12, abs=1e-15), (new["row_id"], k)
            else:
                assert old[k] == v, (new["row_id"], k)
