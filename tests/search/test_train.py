"""The run section: API (result.train), CLI (--train-tokens, --json train) and the
time-to-train objective."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.spec.specs import SpecError
from search import plan

runner = CliRunner()
SMALL = {"gpus": 64, "global_batch_size": 64, "seq_len": 2048, "tp": 8, "pp": [1, 2],
         "cp": 1, "vp": 1}


def test_plan_adds_the_run_section():
    r = plan("llama3.1-8b", "dgx-h100", train_tokens=1e11, gpu_hour_price=2.0, **SMALL)
    t = r.train
    assert len(t.wall_s) == len(r.rows)
    d = t.to_dict()
    steps = np.ceil(1e11 / (64 * 2048))
    assert d["train_steps"] == steps
    assert d["useful_s"] == pytest.approx(steps * r.rows[0]["step_time_s"])
    assert 0.5 < d["goodput"] < 1.0 and d["wall_s"] > d["useful_s"]
    assert d["cost"] == pytest.approx(2.0 * d["gpu_hours"])
    assert d["gpu_hours"] == pytest.approx(64 * d["wall_s"] / 3600)
    assert r.to_json()["train"] == d
    assert list(t.to_dataframe().columns)[:2] == ["train_steps", "train_tokens"]


def test_no_length_no_section_and_price_alone_is_refused():
    assert plan("llama3.1-8b", "dgx-h100", **SMALL).train is None
    with pytest.raises(SpecError, match="train_tokens or train_steps"):
        plan("llama3.1-8b", "dgx-h100", gpu_hour_price=2.0, **SMALL)
    with pytest.raises(SpecError, match="exactly one"):
        plan("llama3.1-8b", "dgx-h100", train_tokens=1e9, train_steps=10, **SMALL)
    with pytest.raises(SpecError, match="time-to-train"):
        plan("llama3.1-8b", "dgx-h100", objective="time-to-train", **SMALL)


def test_time_to_train_objective_ranks_by_expected_wall_time():
    r = plan("llama3.1-8b", "dgx-h100", objective="time-to-train", train_steps=10_000,
             allow_idle_gpus=True, top=5, **SMALL)
    walls = r.train.wall_s
    assert np.all(np.diff(walls) >= -1e-6 * walls[:-1])


def test_cli_run_section_and_json():
    args = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "64",
            "--global-batch", "64", "--seq-len", "2048", "--tp", "8", "--pp", "1", "--cp", "1",
            "--train-steps", "1000", "--checkpoint", "async"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "run: " in r.output and "goodput" in r.output
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    t = doc["train"]
    for k in ("days", "gpu_hours", "energy_mwh", "cost", "expected_interruptions",
              "checkpoint_interval_s", "goodput"):
        assert k in t
    assert t["cost"] is None and t["train_steps"] == 1000
