"""`plan --emit` and `plan validate` through the CLI."""

import json
import tomllib

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
FIXED = ["--model", "gpt3-1.3b", "--cluster", "dgx-a100-80g", "--gpus", "16",
         "--global-batch", "64", "--dp", "4", "--tp", "2", "--pp", "2", "--cp", "1",
         "--vp", "1", "--zero", "1", "--micro-batch", "2", "--recompute", "none",
         "--no-sequence-parallel", "--schedule", "1f1b", "--framework", "ideal"]


ALL_RUN = ["--model", "gpt3-1.3b", "--cluster", "dgx-a100-80g", "--gpus", "16",
           "--global-batch", "64", "--dp", "8", "--tp", "1", "--pp", "2", "--cp", "1",
           "--vp", "1", "--zero", "0", "--micro-batch", "2", "--recompute", "none",
           "--no-sequence-parallel", "--schedule", "1f1b", "--framework", "ideal"]


def test_emit_deepspeed_in_json():
    r = runner.invoke(app, [*FIXED, "--emit", "deepspeed", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc["launch"]) == {"megatron", "bridge", "torchtitan", "deepspeed"}
    ds = json.loads(doc["launch"]["deepspeed"]["text"])
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 64 // (4 * 2)
    assert ds["zero_optimization"]["stage"] == 1
    tt = doc["launch"]["torchtitan"]  # ZeRO-1: refused, with the nearest torchtitan plan
    assert tt["text"] is None and "no ZeRO-1" in tt["refused"]
    assert tt["alternative"]["config"]["zero_stage"] in (0, 2, 3)


def test_emit_stdout_is_only_the_file():
    """`plan --emit X > file` is a valid file for every X; the report goes to stderr."""
    from tests.emit import yaml_free_check

    for fmt, load in (("deepspeed", json.loads), ("torchtitan", tomllib.loads),
                      ("megatron", yaml_free_check.megatron_lines),
                      ("bridge", yaml_free_check.bridge_sections)):
        r = runner.invoke(app, [*ALL_RUN, "--emit", fmt])
        assert r.exit_code == 0, r.output
        doc = load(r.stdout)
        assert doc, fmt
        assert "step time" in r.stderr  # the report is still shown, on stderr
    assert json.loads(runner.invoke(app, [*ALL_RUN, "--emit", "deepspeed"]).stdout)[
        "pipeline"]["stages"] == 2


def test_emit_refused_says_why_and_offers_the_nearest():
    # planned for another stack: the file is refused, with the nearest torchtitan plan
    r = runner.invoke(app, [*FIXED, "--framework", "megatron-lm", "--emit", "torchtitan"])
    assert r.exit_code == 2 and r.stdout == ""
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "torchtitan has no ZeRO-1" in line and "nearest that torchtitan runs" in line
    # without --framework the plan is torchtitan's: the pinned ZeRO-1 is refused up front
    r = runner.invoke(app, [*FIXED, "--emit", "torchtitan"])
    assert r.exit_code == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "torchtitan" in r.stderr


def test_emit_dir_writes_one_file_per_format(tmp_path):
    r = runner.invoke(app, [*ALL_RUN, "--emit-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bridge.yaml", "deepspeed.json", "megatron.args", "torchtitan.toml"]
    assert tomllib.loads((tmp_path / "torchtitan.toml").read_text())["parallelism"][
        "pipeline_parallel_degree"] == 2


def test_validate_json():
    r = runner.invoke(app, ["validate", "--no-typed-back", "--no-vtrain", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["training_runs"]["rows"] >= 55
    assert doc["training_runs"]["mape"] <= 0.10


def test_calibration_of_another_gpu_is_refused():
    r = runner.invoke(app, ["--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
                            "--calibration", "hardware_specs/calibration/h200"])
    assert r.exit_code == 2
    assert "measured on 'NVIDIA H200'" in r.stderr and "A100" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_own_calibration_folder_on_its_gpu():
    r = runner.invoke(app, ["--model", "gpt3-1.3b", "--cluster", "dgx-h200", "--gpus", "8",
                            "--global-batch", "64", "--calibration",
                            "hardware_specs/calibration/h200", "--json"])
    assert r.exit_code == 0, r.output
    assert 0 < json.loads(r.stdout)["best"]["mfu"] < 0.8


def test_uneven_layers_admits_pipeline_degrees_not_dividing_layers():
    # 126 layers: pp=4 is only possible with uneven stages
    base = ["--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "512",
            "--global-batch", "512", "--seq-len", "4096", "--pp", "4", "--json"]
    # uneven Megatron layouts are searched by default; --even-layers-only refuses pp=4
    assert runner.invoke(app, [*base, "--even-layers-only"]).exit_code == 2
    r = runner.invoke(app, base)
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["best"]["config"]
    assert best["pp"] == 4
    # 126 + embedding + loss = 128 = 4 x 32: Megatron's accounting layout
    assert best["embedding_as_layer"] and best["loss_as_layer"]
