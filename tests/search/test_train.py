"""The run section: API (result.train), CLI (--train-tokens, --json train) and the
time-to-train objective."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.run import train_run
from perfmodel.spec.specs import SpecError
from search import make_problem, plan

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


# --- NSGA-II over (time to train, cost) ------------------------------------------------------
RUN_FRONT = {"gpus": 16, "global_batch_size": 64, "seq_len": 2048, "tp": [1, 2], "pp": 1,
             "cp": 1, "vp": 1, "allow_idle_gpus": True, "train_tokens": 2e10,
             "gpu_hour_price": 2.5}
PINNED = ("dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "recompute",
          "sequence_parallel", "schedule")


@pytest.fixture(scope="module")
def run_front():
    return plan("llama3.1-8b", "dgx-h100", strategy="nsga2", objective="time-to-train",
                **RUN_FRONT)


def test_nsga2_front_over_time_to_train_and_cost_is_non_dominated(run_front):
    r = run_front
    assert r.extra["pareto_objectives"] == ["train_wall_s", "train_cost"]
    F = np.array([[p["train"]["wall_s"], p["train"]["cost"]] for p in r.pareto_rows])
    assert len(F) >= 2  # more GPUs finish sooner and cost more: a trade-off, not one point
    for i in range(len(F)):
        others = np.delete(F, i, axis=0)
        assert not np.any(np.all(others <= F[i], 1) & np.any(others < F[i], 1))
    assert np.all(np.diff(F[:, 0]) >= 0)  # ordered by time to train
    assert list(r.pareto["train_wall_s"]) == list(F[:, 0])
    assert r.to_json()["pareto"][0]["train"] == r.pareto_rows[0]["train"]


def test_each_front_point_is_what_plan_gives_for_it_pinned(run_front):
    """A front point's time to train and cost are the run section of that configuration
    planned alone (every dimension pinned) with the same run options."""
    for p in run_front.pareto_rows:
        c = p["config"]
        alone = plan("llama3.1-8b", "dgx-h100", gpus=16, global_batch_size=64, seq_len=2048,
                     allow_idle_gpus=True, train_tokens=2e10, gpu_hour_price=2.5,
                     num_microbatches=c["num_microbatches"], **{k: c[k] for k in PINNED})
        t = alone.train.to_dict()
        assert p["train"]["wall_s"] == pytest.approx(t["wall_s"], rel=1e-12)
        assert p["train"]["cost"] == pytest.approx(t["cost"], rel=1e-12)
        assert p["train"]["cost"] == pytest.approx(2.5 * p["gpus"]
                                                   * p["train"]["wall_s"] / 3600)


def test_run_front_matches_the_exhaustive_grid():
    """On a small space NSGA-II finds the grid's (exhaustive) front over the same objectives."""
    opts = {**RUN_FRONT, "tp": 1, "micro_batch_size": 1, "recompute": "none"}
    grid = plan("llama3.1-8b", "dgx-h100", pareto_objectives="time-to-train-cost", **opts)
    nsga = plan("llama3.1-8b", "dgx-h100", strategy="nsga2",
                pareto_objectives="time-to-train-cost", **opts)
    key = [(p["gpus"], p["config"]["zero_stage"]) for p in grid.pareto_rows]
    assert [(p["gpus"], p["config"]["zero_stage"]) for p in nsga.pareto_rows] == key
    assert grid.objective == "time"  # the front's objectives do not change "best"


def test_run_front_needs_the_run_length():
    with pytest.raises(SpecError, match="time-to-train-cost.*train_tokens or train_steps"):
        plan("llama3.1-8b", "dgx-h100", strategy="nsga2",
             pareto_objectives="time-to-train-cost", **SMALL)
    r = runner.invoke(app, ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "64",
                            "--strategy", "nsga2", "--pareto-objectives",
                            "time-to-train-cost"])
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    assert "needs the run's length" in r.output


# --- the run figures' 80 % intervals ---------------------------------------------------------
BOUNDED_KEYS = ("wall_s_interval", "days_interval", "gpu_hours_interval", "energy_mwh_interval",
                "cost_interval", "goodput_interval")


def test_run_interval_is_the_run_at_the_step_time_bounds():
    """The best row's run figures carry [low, high]: train_run at the step time's bounds with
    the point's checkpoint interval in steps (not the point scaled)."""
    r = plan("llama3.1-8b", "dgx-h100", train_tokens=1e11, gpu_hour_price=2.0, **SMALL)
    d = r.to_json()["train"]
    assert all(d[k] is not None and d[k][0] <= d[k][1] for k in BOUNDED_KEYS)
    step_lo, step_hi = r.rows[0]["step_time_interval_s"]
    row = r.rows[0]
    settings = make_problem("llama3.1-8b", "dgx-h100", train_tokens=1e11, gpu_hour_price=2.0,
                            **SMALL).run
    ends = [train_run(settings, t, row["gpus"],
                      row["memory_bytes"]["weights"] + row["memory_bytes"]["optimizer"],
                      row["time_s"]["compute"] / row["step_time_s"],
                      interval_steps=d["checkpoint_interval_steps"]).row(0)
            for t in ([step_lo], [step_hi])]
    assert d["wall_s_interval"] == pytest.approx([e["wall_s"] for e in ends], rel=1e-12)
    assert d["cost_interval"] == pytest.approx([e["cost"] for e in ends], rel=1e-12)
    lo_ratio, hi_ratio = (t / row["step_time_s"] for t in (step_lo, step_hi))
    inside = lo_ratio <= 1.0 <= hi_ratio
    assert inside == (d["days_interval"][0] <= d["days"] <= d["days_interval"][1])
    assert "the run figures' intervals are the run at both ends of it" in r.setup["interval"]


def test_cli_prints_run_intervals_and_json_carries_them():
    args = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "64",
            "--global-batch", "64", "--seq-len", "2048", "--tp", "8", "--pp", "1", "--cp", "1",
            "--train-steps", "1000", "--gpu-hour-price", "2"]
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    t = doc["train"]
    lo, hi = t["days_interval"]
    out = runner.invoke(app, args).output
    assert f"{t['days']:.1f} days ({lo:.1f}-{hi:.1f})" in out
    c_lo, c_hi = t["cost_interval"]
    assert f"cost {t['cost']:,.0f} ({c_lo:,.0f}-{c_hi:,.0f})" in out
    assert "MWh (" in out and "goodput" in out
    assert "failure rate, checkpoint cost and interval in steps taken as given" in out


def test_front_rows_carry_run_intervals(run_front):
    for p in run_front.pareto_rows:
        assert all(k in p["train"] for k in BOUNDED_KEYS)
    cols = run_front.pareto.columns
    assert {"train_days_low", "train_days_high", "train_cost_low", "train_cost_high"} <= set(cols)
