"""A recipe's own settings are options of the request (and the command line): attention kernel,
recompute modules, CPU-offloaded layers; ``offload none`` stops the offload search."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app
from search.api import plan, problem_of
from search.request import PlanRequest

#: Llama 3.1 8B on 8 H100 without ZeRO: its Adam states do not fit (offloaded, they do).
_TIGHT = {"gpus": 8, "global_batch_size": 8, "seq_len": 4096, "dp": 8, "tp": 1, "pp": 1,
          "cp": 1, "vp": 1, "zero_stage": 0, "micro_batch_size": 1, "recompute": "full",
          "sequence_parallel": False, "schedule": "1f1b", "framework": "bridge-25.x", "top": 1}


def test_recipe_options_reach_the_training_setup():
    t = problem_of(PlanRequest(model="llama3.1-8b", cluster="dgx-h100", gpus=8,
                               attention_backend="flash-attn-2",
                               recompute_modules=["layernorm", "core_attn"],
                               cpu_offload_layers=4, overlap_moe_comm=True)).space.training
    assert t.attention_backend == "flash-attn-2"
    assert t.recompute_modules == ("layernorm", "core_attn")
    assert (t.cpu_offload_layers, t.overlap_moe_comm) == (4, True)


def test_offload_none_is_not_searched():
    searched = plan("llama3.1-8b", "dgx-h100", **_TIGHT)
    assert searched.rows and searched.setup.get("searched")  # optimizer offload made it fit
    r = plan("llama3.1-8b", "dgx-h100", **_TIGHT, offload=["none"])
    assert not r.rows and r.smallest is not None and not r.setup.get("searched")
    assert r.smallest["step_time_s"] < searched.rows[0]["step_time_s"]


def test_cli_takes_hsdp_shard_zero_and_recipe_flags():
    args = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--dp", "8",
            "--tp", "1", "--pp", "1", "--zero", "3", "--micro-batch", "1", "--recompute",
            "selective", "--hsdp-shard", "0", "--recompute-modules", "layernorm",
            "--attention-backend", "flash-attn-2", "--offload", "none", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["best"]["step_time_s"] > 0
    bad = CliRunner().invoke(app, ["--hsdp-shard", "-1"])
    assert bad.exit_code == 2
