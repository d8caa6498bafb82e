"""Expert parallelism in the configuration and the search space: folding constraints with their
operands, defaults (etp = tp), dense models unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import search
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.specs import load_cluster, load_model, load_training
from search.space import make_space

MIX = load_model("mixtral-8x7b")
TR = load_training(global_batch_size=256, seq_len=4096)
H100_64 = load_cluster("dgx-h100", gpus=64)


def test_etp_defaults_to_tp():
    assert ParallelConfig(tp=4).etp == 4
    assert ParallelConfig(tp=4, etp=1).etp == 1
    assert ConfigBatch.from_arrays(tp=np.array([2, 8])).etp.tolist() == [2, 8]
    c = resolve_config(ParallelConfig(dp=8, tp=2, pp=4, ep=8, etp=1, sequence_parallel=True),
                       MIX, TR, H100_64)
    assert c.expert_dp == 2  # tp*cp*dp / (ep*etp) = 16/8


@pytest.mark.parametrize("cfg,msg", [
    ({"dp": 16, "tp": 1, "pp": 4, "ep": 3}, r"ep \(3\) must divide num_experts \(8\)"),
    ({"dp": 2, "tp": 2, "pp": 16, "ep": 8, "etp": 1, "sequence_parallel": True},
     r"ep\*etp \(8\*1=8\) must divide tp\*cp\*dp \(2\*1\*2=4\)"),
    ({"dp": 16, "tp": 2, "pp": 2, "ep": 8, "etp": 1}, r"MoE with tp \(2\) > 1 needs sequence_parallel"),
    ({"dp": 16, "tp": 1, "pp": 4, "ep": 1, "etp": 16}, r"etp \(16\) must fit in the scale-up domain"),
])
def test_expert_constraints_name_operands(cfg, msg):
    with pytest.raises(SpecError, match=msg):
        resolve_config(ParallelConfig(**cfg), MIX, TR, H100_64)


def test_dense_model_rejects_ep():
    with pytest.raises(SpecError, match=r"ep \(2\) applies to MoE models; 'llama2-7b' is dense"):
        resolve_config(ParallelConfig(dp=8, ep=2), load_model("llama2-7b"), TR,
                       load_cluster("dgx-h100", gpus=8))


def test_space_searches_ep_etp_for_moe_only():
    s = make_space(MIX, TR, H100_64)
    assert s.values["ep"].tolist() == [1, 2, 4, 8]
    assert s.values["etp"].tolist() == [1, 2, 4, 8]
    d = make_space(load_model("llama2-7b"), TR, H100_64)
    assert d.values["ep"].tolist() == [1] and d.values["etp"].tolist() == [1]
    pinned = make_space(MIX, TR, H100_64, ep=4, etp=1)
    assert pinned.values["ep"].tolist() == [4] and pinned.values["etp"].tolist() == [1]


def test_dense_search_unchanged_by_expert_dims():
    """A dense model searches no expert dimension, and its configurations evaluate exactly as a
    ConfigBatch that names no ep / etp (the dense path of before the MoE work)."""
    from perfmodel.step.evaluate import evaluate

    m, tr = load_model("llama2-7b"), load_training(global_batch_size=576, seq_len=4096)
    cl = load_cluster("gb200-nvl72", gpus=72)
    r = search.plan(m, cl, tr, top=5)
    assert (r.top["ep"] == 1).all() and (r.top["etp"] == r.top["tp"]).all()
    fields = ("dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "num_microbatches",
              "recompute", "sequence_parallel", "schedule")
    top = r.top
    batch = ConfigBatch.from_arrays(**{f: top[f].to_numpy() for f in fields})
    plain = evaluate(m, tr, cl, batch)
    np.testing.assert_allclose(plain.step_time_s, top["step_time_s"].to_numpy(), rtol=1e-12)


@pytest.mark.slow
def test_cli_deepseek_v3_plan_shows_ep_and_etp():
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--gpus",
                                 "256", "--global-batch", "8192", "--seq-len", "4096", "--top",
                                 "3"])
    assert r.exit_code == 0, r.output
    header = next(line for line in r.output.splitlines() if "why below #1" in line)
    assert " ep " in header and " etp " in header
    assert "ep=" in r.output and "ep_comm" in r.output
    # The 10 s goal is timed by benchmarks/bench_search.py, not here.
