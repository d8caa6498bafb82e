"""search.plan / evaluate_config and the diagnostics."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.core.errors import SpecError
from search import evaluate_config, plan
from search.result import diagnose
from tests.search.test_space import fake_evaluate

# the what-if stack: these tests are about the API, not about one release
GPT3 = {"model": "gpt3-175b", "cluster": "dgx-a100-80g", "framework": "ideal"}


def test_plan_pins_and_ranges():
    r = plan(**GPT3, evaluator=fake_evaluate, tp=8, pp=[8, 16], cp=1, top=4)
    assert set(r.top["tp"]) == {8} and set(r.top["pp"]) <= {8, 16}
    assert len(r.top) == 4 and r.best.shape[0] == 1
    assert {"step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes", "gpus",
            "bubble_time_s", "weights_memory_bytes", "dp_comm_bytes_per_gpu"} <= set(r.top.columns)
    j = r.to_json()
    assert j["best"] == r.rows[0] and j["search"]["strategy"] == "grid"
    assert j["search"]["evaluated"] == r.evaluated >= r.feasible


def test_all_pinned_evaluates_one_config():
    r = plan(**GPT3, evaluator=fake_evaluate, dp=16, tp=8, pp=8, vp=1, cp=1, zero_stage=1,
             micro_batch_size=1, recompute="selective", sequence_parallel=True, schedule="1f1b")
    assert r.strategy == "single" and r.evaluated == 1
    c = r.rows[0]["config"]
    assert (c["dp"], c["tp"], c["pp"], c["num_microbatches"]) == (16, 8, 8, 96)


def test_evaluate_config_derives_dp():
    r = evaluate_config(**GPT3, evaluator=fake_evaluate, tp=8, pp=8, zero=1)
    c = r.rows[0]["config"]
    assert c["dp"] == 16 and c["num_microbatches"] == 1536 // 16


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"tp": 5}, r"tp \(5\) must divide num_attention_heads \(96\)"),
        ({"dp": 8, "tp": 8, "pp": 8, "cp": 1, "vp": 1, "zero_stage": 0, "micro_batch_size": 1,
              "recompute": "none", "sequence_parallel": False, "schedule": "1f1b"},
         r"dp\*tp\*pp\*cp \(8\*8\*8\*1=512\) must equal the cluster's GPU count \(1024\)"),
        ({"model": "gpt3-175bb"}, "unknown model preset 'gpt3-175bb'; closest: gpt3-175b"),
        ({"objective": "speed"}, "objective = 'speed'"),
        ({"strategy": "annealing"}, "strategy = 'annealing'"),
    ],
)
def test_user_errors_are_one_line(kw, match):
    args = {**GPT3, **kw}
    with pytest.raises(SpecError, match=match) as e:
        plan(args.pop("model"), args.pop("cluster"), evaluator=fake_evaluate, **args)
    assert "\n" not in str(e.value)


def test_nothing_fits_reports_smallest_footprint():
    r = plan("gpt3-175b", "dgx-a100-80g", gpus=8, evaluator=fake_evaluate, tp=8, cp=1)
    assert not r.fits_any and r.best.empty
    msg = r.why_nothing_fits()
    assert msg.startswith("nothing fits: the smallest footprint found is") and "\n" not in msg
    assert r.smallest["memory_bytes"]["peak"] > r.hbm_bytes


def _row(step, bubble, comm, peak, **cfg):
    c = {"num_microbatches": 8, "schedule": "1f1b", "pp": 4}
    c.update(cfg)
    return {"step_time_s": step, "time_s": {"compute": step - bubble - comm, "bubble": bubble,
                                            "dp_comm": comm}, "memory_bytes": {"peak": peak},
            "config": c}


def test_diagnostics_thresholds():
    """bubble 0.35 s of 1 s > 30%; exposed comm 0.45 s > 40%; headroom 1 - 78/80 = 2.5% < 5%."""
    gib = 2.0**30
    d = {x.name: x for x in diagnose(_row(1.0, 0.35, 0.45, 78 * gib), 80 * gib)}
    assert set(d) == {"bubble_share", "exposed_comm_share", "memory_headroom"}
    assert d["bubble_share"].value == pytest.approx(0.35)
    assert d["exposed_comm_share"].value == pytest.approx(0.45)
    assert d["memory_headroom"].value == pytest.approx(0.025)
    assert "more micro-batches" in d["bubble_share"].message
    assert "dp_comm" in d["exposed_comm_share"].message
    assert diagnose(_row(1.0, 0.29, 0.39, 76 * gib), 80 * gib) == []


def test_real_evaluator_small_space():
    """Through perfmodel.step.evaluate.evaluate: a pinned neighbourhood of the Megatron GPT-3 setup."""
    pytest.importorskip("perfmodel.step.evaluate")
    r = plan(**GPT3, tp=8, pp=[8, 16], cp=1, zero_stage=1, recompute="selective",
             sequence_parallel=True, micro_batch_size=1, top=3)
    assert r.fits_any and r.evaluated >= 2
    row = r.rows[0]
    assert np.isclose(sum(row["time_s"].values()), row["step_time_s"], rtol=1e-9)
    assert 0 < row["mfu"] < 1
