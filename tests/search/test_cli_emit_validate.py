"""`plan --emit` and `plan validate` through the CLI."""

import json
import tomllib

from typer.testing import CliRunner

from search.cli import app

runner = CliRunner()
FIXED = ["--model", "gpt3-1.3b", "--cluster", "dgx-a100-80g", "--gpus", "16",
         "--global-batch", "64", "--dp", "4", "--tp", "2", "--pp", "2", "--cp", "1",
         "--vp", "1", "--zero", "1", "--micro-batch", "2", "--recompute", "none",
         "--no-sequence-parallel", "--schedule", "1f1b"]


def test_emit_deepspeed_in_json():
    r = runner.invoke(app, [*FIXED, "--emit", "deepspeed", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    ds = json.loads(doc["launch"]["text"])
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 64 // (4 * 2)
    assert ds["zero_optimization"]["stage"] == 1


def test_emit_torchtitan_printed():
    r = runner.invoke(app, [*FIXED, "--emit", "torchtitan"])
    assert r.exit_code == 0, r.output
    toml_text = r.stdout[r.stdout.index("[training]"):]
    doc = tomllib.loads(toml_text)
    assert doc["parallelism"]["tensor_parallel_degree"] == 2
    assert doc["parallelism"]["pipeline_parallel_degree"] == 2


def test_validate_json():
    r = runner.invoke(app, ["validate", "--no-vtrain", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["training_runs"]["rows"] >= 55
    assert doc["training_runs"]["mape"] <= 0.10
