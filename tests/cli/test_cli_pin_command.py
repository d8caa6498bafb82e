"""Every answer can be typed back: the report's `pin it` command (every option, the per-stage
layout included) predicts the best configuration's step time exactly."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

import search
from cli.main import app
from perfmodel.core.errors import SpecError

runner = CliRunner()
DP_PICK = ["--model", "llama3.1-8b", "--cluster", "ethernet-a100", "--gpus", "32",
           "--global-batch", "128", "--seq-len", "8192", "--strategy", "dp", "--framework",
           "ideal"]
GRID_PICK = ["--model", "llama3.1-8b", "--gpus", "16", "--global-batch", "64", "--seq-len",
             "4096", "--framework", "megatron-lm"]


def _json(args: list[str]) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("args", [DP_PICK, GRID_PICK], ids=["dp", "grid"])
def test_pin_command_reproduces_the_best_step_time_exactly(args):
    doc = _json(args)
    words = shlex.split(doc["pin_command"])
    assert words[0] == "plan"
    pinned = _json(words[1:])
    assert pinned["search"]["strategy"] == "single"
    assert pinned["best"]["step_time_s"] == doc["best"]["step_time_s"]  # bit for bit
    assert pinned["best"]["config"] == doc["best"]["config"]
    r = runner.invoke(app, args)
    assert f"  pin it: {doc['pin_command']}" in r.stdout


def test_dp_pick_names_its_stage_layout():
    doc = _json(DP_PICK)
    c = doc["best"]["config"]
    assert c["stage_layers"] and "--stage-layers " + ",".join(map(str, c["stage_layers"])) in (
        doc["pin_command"])


def test_api_takes_stage_layers_as_lists():
    kw = {"gpus": 32, "global_batch_size": 128, "seq_len": 8192, "dp": 1, "tp": 1, "pp": 4,
          "vp": 1, "cp": 8, "zero_stage": 0, "micro_batch_size": 1, "recompute": "full",
          "sequence_parallel": False, "schedule": "1f1b", "framework": "ideal"}
    even = search.plan("llama3.1-8b", "ethernet-a100", **kw).rows[0]
    lay = search.plan("llama3.1-8b", "ethernet-a100", stage_layers=[8, 9, 9, 6],
                      stage_recompute_layers=[8, 2, 0, 0], **kw).rows[0]
    assert lay["config"]["stage_layers"] == (8, 9, 9, 6) or list(
        lay["config"]["stage_layers"]) == [8, 9, 9, 6]
    assert list(lay["config"]["stage_recompute_layers"]) == [8, 2, 0, 0]
    assert lay["step_time_s"] != even["step_time_s"]
    with pytest.raises(SpecError, match="sum to 31"):
        search.plan("llama3.1-8b", "ethernet-a100", stage_layers=[8, 9, 8, 6], **kw)
    with pytest.raises(SpecError, match="stage_recompute_layers"):
        search.plan("llama3.1-8b", "ethernet-a100", stage_recompute_layers=[1, 1, 1, 1], **kw)


def test_stage_layers_on_the_command_line_are_checked_in_one_line():
    r = runner.invoke(app, ["--model", "llama3.1-8b", "--stage-layers", "8,x"])
    assert r.exit_code == 2 and "expected whole numbers separated by commas" in r.stderr


def test_a_release_with_even_splits_only_gets_no_stage_layout():
    """megatron-2022 (the A100 default) splits layers evenly: the dp strategy keeps its even
    splits, and a pinned uneven layout is refused with the release named."""
    doc = _json([*DP_PICK[:-2], "--framework", "megatron-2022"])
    assert not doc["best"]["config"].get("stage_layers")
    r = runner.invoke(app, [*DP_PICK[:-4], "--tp", "4", "--stage-layers", "17,15",
                            "--framework", "megatron-2022"])
    assert r.exit_code == 2 and "splits layers evenly only" in r.stderr


def test_pin_command_names_the_cp_comm_of_an_a2a_pick():
    """An all-to-all (Ulysses) pick pins ``--cp-comm a2a`` and the pinned plan reproduces it;
    the report shows it in the configuration line."""
    args = ["--model", "llama2-7b", "--cluster", "dgx-h100", "--gpus", "32", "--global-batch",
            "16", "--seq-len", "32768", "--framework", "ideal", "--tp", "1", "--pp", "1",
            "--cp", "16", "--cp-comm", "a2a"]
    doc = _json(args)
    assert doc["best"]["config"]["cp_comm"] == "a2a"
    assert "--cp-comm a2a" in doc["pin_command"]
    pinned = _json(shlex.split(doc["pin_command"])[1:])
    assert pinned["best"]["step_time_s"] == doc["best"]["step_time_s"]
    assert "cp=16 " in runner.invoke(app, args).stdout and "cp_comm=a2a" in (
        runner.invoke(app, args).stdout)
