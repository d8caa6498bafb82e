"""Plan options of routing imbalance, HSDP and offload (search.host_sharding), their search
where the framework runs them, and their command-line flags."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

import search
from cli.main import app
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import load_model, load_training
from search.host_sharding import (
    hsdp_candidates,
    offload_cannot_win,
    offload_sets,
    training_with_options,
)
from search.pareto import Tally
from search.request import PlanRequest
from search.space import Scored

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
    # the optimizer states alone make it fit; the parameters on top (ZeRO-3 only) add nothing
    assert r.setup["training_switches"]["offload"] == ("optimizer",)
    lines = r.setup["searched"]
    assert lines[0] == "nothing fits without offload" and lines[1] == "offload off: nothing fits"
    assert lines[2].startswith("--offload optimizer:")
    assert lines[3].startswith("--offload optimizer --offload params:")
    assert lines[-1] == "offload wins: --offload optimizer"


def test_offload_is_searched_and_wins_where_memory_is_tight():
    # 13B on one node of 8 A100-40GB with DeepSpeed: without offload only tp 2 with ZeRO-0
    # fits; the optimizer states on the host let tp 1 with ZeRO-1 in, faster per step
    r = search.plan("gpt3-13b", "dgx-a100-40g", gpus=8, framework="deepspeed", top=1)
    off = search.plan("gpt3-13b", "dgx-a100-40g", gpus=8, framework="deepspeed", top=1,
                      offload=[])
    assert r.setup["training_switches"]["offload"] == ("optimizer",)
    assert r.rows[0]["step_time_s"] < off.rows[0]["step_time_s"]
    assert "searched" not in off.setup and "offload" not in off.setup["training_switches"]
    lines = r.setup["searched"]
    assert lines[0].startswith("offload off: ") and lines[-1] == "offload wins: --offload optimizer"
    assert any(x.startswith("--offload optimizer --offload params:") for x in lines)


def test_offload_is_not_picked_where_memory_is_roomy():
    # 8B on 64 H100s: the fastest configuration already fits, so offload cannot win on time
    # and is not even tried
    req = PlanRequest(model="llama3.1-8b", cluster="dgx-h100", gpus=64, framework="bridge-25.x",
                      pp=1, cp=1, top=1)
    r = search.api.plan_request(req)
    assert offload_cannot_win(r)
    assert "searched" not in r.setup and "offload" not in r.setup["training_switches"]


def test_offload_sets_and_when_offload_cannot_win():
    assert offload_sets(("optimizer", "params")) == [("optimizer",), ("optimizer", "params")]
    assert offload_sets(("optimizer", "activations")) == [("optimizer",), ("activations",)]
    row = {"step_time_s": 2.0, "gpus": 8}
    r = SimpleNamespace(rows=[row], objective="time", unfit_floor={"time": 2.5, "cost": 12.0})
    assert offload_cannot_win(r)  # nothing faster was kept out by memory
    assert not offload_cannot_win(SimpleNamespace(**{**vars(r), "objective": "cost"}))  # 12 < 16
    assert not offload_cannot_win(SimpleNamespace(**{**vars(r), "objective": "memory"}))
    assert not offload_cannot_win(SimpleNamespace(**{**vars(r), "rows": []}))
    assert not offload_cannot_win(SimpleNamespace(**{**vars(r), "unfit_floor": {}}))


@pytest.mark.slow
def test_torchtitan_searches_hsdp():
    # ZeRO-3 on 256 H100s, cp = 2: a shard group of 32 ranks (64 GPUs) beats sharding over all
    # 128 (14.14 s against 14.15 s per step): the plan says so
    r = search.plan("llama3.1-70b", "dgx-h100", gpus=256, framework="torchtitan", zero_stage=3,
                    pp=1, tp=1, top=1)
    lines = r.setup["searched"]
    assert lines[0].startswith("HSDP off") and len(lines) == 4
    assert lines[-1].startswith("HSDP wins: shard 32, 14.14")
    assert lines[-1].endswith("against 14.153 s per step with ZeRO-3 shards over all of dp")
    assert r.setup["training_switches"]["hsdp_shard"] == 32


def test_hsdp_search_keeps_a_plan_it_does_not_improve_and_says_so():
    r = search.plan("llama3.1-8b", "dgx-h100", gpus=16, framework="torchtitan", zero_stage=2,
                    top=1)
    assert "hsdp_shard" not in r.setup["training_switches"]
    (line,) = r.setup["searched"]
    step = f"{r.rows[0]['step_time_s']:.3f} s per step"
    assert line == (f"HSDP shard 8 searched, not picked: no gain, {step} with or without it "
                    "(the best plan is ZeRO-2, which HSDP does not change)")


def test_cli_says_whether_hsdp_won():
    args = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16", "--framework",
            "torchtitan", "--pp", "1", "--cp", "1", "--tp", "1"]
    lost = runner.invoke(app, [*args, "--zero", "2"])
    assert lost.exit_code == 0, lost.output
    assert "searched: HSDP shard 8 searched, not picked: no gain" in lost.output
    # ZeRO-3 over 16 ranks against a shard of 8 replicated twice: the shard loses here, and
    # the line shows both step times
    zero3 = runner.invoke(app, [*args, "--zero", "3", "--json"])
    doc = json.loads(zero3.stdout)
    (line,) = doc["setup"]["searched"]
    step = doc["best"]["step_time_s"]
    assert "hsdp_shard" not in doc["setup"]["training_switches"]
    assert line.startswith(f"HSDP shard 8 searched, not picked: {step:.3f} s per step without "
                           "it against ")
    assert line.endswith(" s per step at best with it (shard 8)")


def test_the_pin_command_carries_the_offload_the_search_picked():
    args = ["--model", "gpt3-13b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--framework",
            "deepspeed", "--top", "1", "--json"]
    doc = json.loads(runner.invoke(app, args).stdout)
    pin = doc["pin_command"]
    assert "--offload optimizer" in pin
    again = json.loads(runner.invoke(app, [*pin.split()[1:], "--json"]).stdout)
    assert again["best"]["step_time_s"] == doc["best"]["step_time_s"]
    assert "searched" not in again["setup"]  # offload given: nothing more searched


def test_tally_floors_of_what_memory_kept_out_per_offload_set():
    """Hand numbers: three valid configurations that do not fit (8 GPUs each), 10 GiB over the
    usable HBM; one fits. Optimizer offload frees at most 12 / 4 / 2 GiB of them and adds at
    least 1 s of host Adam; activation offload frees 1 / 20 / 1 GiB."""
    gib = 2.0**30
    n = 4
    s = Scored(flat=np.arange(n), violations=np.zeros(n, dtype=np.int8),
               fits=np.array([False, False, False, True]),
               step_time_s=np.array([1.0, 2.0, 3.0, 5.0]),
               peak_memory_bytes=np.full(n, 90 * gib), gpus=np.full(n, 8),
               score=np.array([np.inf, np.inf, np.inf, 5.0]),
               excess_bytes=np.array([10.0, 10.0, 10.0, -1.0]) * gib,
               freeable_bytes=np.array([[12, 0, 1], [4, 0, 20], [2, 9, 1], [0, 0, 0]]) * gib,
               host_optimizer_s=np.ones(n))
    t = Tally(3)
    t.add(s)
    f = t.unfit_floor()
    assert f["time"] == 1.0 and f["cost"] == 8.0
    assert f["sets"]["optimizer"] == {"time": 2.0, "cost": 16.0}  # the first, + 1 s of Adam
    assert f["sets"]["activations"] == {"time": 2.0, "cost": 16.0}  # the second only
    assert f["sets"]["optimizer+params"]["time"] == 2.0  # the first (the third: 3 + 1)
    result = SimpleNamespace(rows=[{"step_time_s": 2.0, "gpus": 8}], objective="time",
                             unfit_floor=f)
    assert offload_cannot_win(result, ("optimizer",))  # 2 s at best: no better than 2 s
    assert not offload_cannot_win(result)  # without offload's terms: 1 s was kept out
