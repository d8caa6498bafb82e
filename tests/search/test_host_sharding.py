"""Plan options of routing imbalance, HSDP and offload (search.host_sharding), their search
where the framework runs them, and their command-line flags."""

import json

import pytest
from typer.testing import CliRunner

import search
from cli.main import app
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import load_model, load_training
from search.host_sharding import hsdp_candidates, training_with_options
from search.request import PlanRequest

runner = CliRunner()


def test_training_with_options():
    t = load_training(global_batch_size=64, seq_len=2048)
    m = load_model("llama3.1-8b")
    assert training_with_options(t, m, PlanRequest()) is t
    r = PlanRequest(offload=["optimizer", "activations"], hsdp_shard=8, moe_imbalance=1.2,
                    optimizer_offload_fraction=0.5)
    t1 = training_with_options(t, m, r)
    assert t1.offload == ("optimizer", "activations") and t1.hsdp_shard == 8
    assert t1.moe_imbalance == 1.2 and t1.optimizer_offload_fraction == 0.5
    assert t1.cpu_offload_layers == m.num_layers - 1


def test_one_offload_name_and_a_bad_one():
    t = load_training(global_batch_size=64, seq_len=2048)
    m = load_model("llama3.1-8b")
    assert training_with_options(t, m, PlanRequest(offload="optimizer")).offload == (
        "optimizer",)
    with pytest.raises(SpecError, match="offload"):
        training_with_options(t, m, PlanRequest(offload=["gpu"]))


def test_hsdp_candidates():
    assert hsdp_candidates(256) == [8, 32]
    assert hsdp_candidates(16) == [8]


def test_cli_flags_reach_the_setup_and_the_launch():
    res = runner.invoke(app, ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                              "--zero", "3", "--tp", "1", "--pp", "1", "--cp", "1",
                              "--offload", "optimizer", "--offload", "params",
                              "--framework", "deepspeed", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["setup"]["training_switches"]["offload"] == ["optimizer", "params"]
    text = doc["launch"]["deepspeed"]["text"]
    assert "offload_optimizer" in text and "offload_param" in text


def test_nothing_fits_searches_offload_where_the_stack_runs_it():
    r = search.plan("gpt3-13b", "dgx-a100-40g", gpus=8, framework="deepspeed", zero_stage=2,
                    tp=1, pp=1, top=1)
    assert r.fits_any
    assert r.setup["training_switches"]["offload"] == ("optimizer", "params")
    assert "nothing fits without offload" in r.setup["searched"][0]


@pytest.mark.slow
def test_torchtitan_searches_hsdp():
    # ZeRO-3 on 256 H100s, cp = 2: a shard group of 32 ranks (64 GPUs) beats sharding over all
    # 128 (14.14 s against 14.15 s per step): the plan says so
    r = search.plan("llama3.1-70b", "dgx-h100", gpus=256, framework="torchtitan", zero_stage=3,
                    pp=1, tp=1, top=1)
    lines = r.setup["searched"]
    assert lines[0].startswith("HSDP off") and len(lines) == 4
    assert lines[-1] == "HSDP wins: shard 32"
    assert r.setup["training_switches"]["hsdp_shard"] == 32


def test_hsdp_search_keeps_a_plan_it_does_not_improve():
    r = search.plan("llama3.1-8b", "dgx-h100", gpus=16, framework="torchtitan", zero_stage=2,
                    top=1)
    assert "searched" not in r.setup and "hsdp_shard" not in r.setup["training_switches"]
