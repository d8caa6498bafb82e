"""Real-time placement (seed 9.4.4, exercise 9.6): latency model, response times, search, CLI."""

from __future__ import annotations

import json
import math

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.realtime import realtime
from hardware_specs import preset_dir
from perfmodel.compute import inference
from perfmodel.core.errors import SpecError
from realtime.placement import (
    latency_matrix_s,
    load_realtime,
    plan_realtime,
    response_time_s,
)

MIB = 1024**2
GIB = 1024**3
EX96 = preset_dir("realtime") / "exercise_9_6.toml"
EX96_BAD = preset_dir("realtime") / "exercise_9_6_infeasible.toml"


# ---------------------------------------------------------------------------------------------
# perfmodel.compute.inference: hand-computed numbers
# ---------------------------------------------------------------------------------------------
def test_roofline_compute_bound_plus_overhead():
    # compute 1e12 / (100e12 * 0.5) = 20 ms; memory 1e9 / (1e12 * 0.8) = 1.25 ms; + 10 * 10 us
    t = inference.roofline_latency_s(
        1e12, 1e9, 100e12, 1e12, compute_efficiency=0.5, memory_efficiency=0.8,
        num_layers=10, launch_overhead_s=10e-6,
    )  # fmt: skip
    assert t == pytest.approx(0.0201)


def test_roofline_memory_bound():
    # compute 1e9 / 1e14 = 10 us; memory 2e9 / 1e12 = 2 ms
    assert inference.roofline_latency_s(1e9, 2e9, 1e14, 1e12) == pytest.approx(2e-3)


def test_block_split_transfer_and_resident_bytes():
    # quarter of a 1 TFLOP, 8 GB weights, 0 B activation model on 100 TFLOP/s, 1 TB/s:
    # max(0.25e12 / 1e14, 2e9 / 1e12) = 2.5 ms
    assert inference.block_latency_s(1e12, 8e9, 0.0, 8, 2, 1e14, 1e12) == pytest.approx(2.5e-3)
    assert inference.boundary_activation_bytes(800.0, 8) == 100.0
    # 10 us + 1 MB / 1 GB/s = 1.01 ms
    assert inference.transfer_s(1e6, 1e9, 10e-6) == pytest.approx(1.01e-3)
    assert inference.split_latency_s(1e-3, 2e-3, 0.5e-3) == pytest.approx(3.5e-3)
    # 8 GB * 2/8 + 2 * 800 B / 8 = 2e9 + 200
    assert inference.resident_bytes(8e9, 800.0, 8, 2) == pytest.approx(2e9 + 200)


@settings(max_examples=50, deadline=None)
@given(
    flops=st.floats(1e6, 1e13), nbytes=st.floats(1e3, 1e11),
    bw=st.floats(1e9, 1e13), more=st.floats(1.0, 10.0),
)  # fmt: skip
def test_more_bandwidth_or_flops_never_slower(flops, nbytes, bw, more):
    base = inference.roofline_latency_s(
        flops, nbytes, 1e14, bw, num_layers=4, launch_overhead_s=5e-6
    )
    assert (
        inference.roofline_latency_s(
            flops, nbytes, 1e14, bw * more, num_layers=4, launch_overhead_s=5e-6
        )
        <= base
    )
    assert (
        inference.roofline_latency_s(
            flops, nbytes, 1e14 * more, bw, num_layers=4, launch_overhead_s=5e-6
        )
        <= base
    )


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 31))
def test_split_is_never_faster_than_the_faster_device_at_batch_1(k):
    # Why a split only helps memory at batch 1: t_a * k/L + t_b * (L-k)/L >= min(t_a, t_b).
    L = 32
    a = inference.block_latency_s(4e12, 14e9, 1e9, L, k, 121e12, 300e9, compute_efficiency=0.5)
    b = inference.block_latency_s(4e12, 14e9, 1e9, L, L - k, 60e12, 200e9, compute_efficiency=0.5)
    full = inference.block_latency_s(4e12, 14e9, 1e9, L, L, [121e12, 60e12], [300e9, 200e9],
                                     compute_efficiency=0.5)  # fmt: skip
    assert inference.split_latency_s(a, b, 0.0) >= full.min() - 1e-12


# ---------------------------------------------------------------------------------------------
# Response-time analysis
# ---------------------------------------------------------------------------------------------
def test_response_time_hand_computed():
    # C=1, B=0.5, one higher task (C=2, T=5): R = 1.5 -> 1.5 + 2 = 3.5 -> 3.5 (fixed point)
    assert response_time_s(1.0, 0.5, [(2.0, 5.0, 0.0)], 100.0) == pytest.approx(3.5)
    # with release jitter 2 on the higher task: ceil((3.5 + 2) / 5) = 2 -> 1.5 + 4 = 5.5
    assert response_time_s(1.0, 0.5, [(2.0, 5.0, 2.0)], 100.0) == pytest.approx(5.5)
    # C=4: 4 -> 6 -> ceil(6/5) * 2 + 4 = 8 -> 8; past a limit of 7 it returns inf
    assert response_time_s(4.0, 0.0, [(2.0, 5.0, 0.0)], 10.0) == pytest.approx(8.0)
    assert math.isinf(response_time_s(4.0, 0.0, [(2.0, 5.0, 0.0)], 7.0))


@settings(max_examples=50, deadline=None)
@given(
    c=st.floats(0.01, 1.0), b=st.floats(0.0, 0.5),
    hp=st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(2.0, 20.0)), max_size=3),
)  # fmt: skip
def test_response_time_at_least_exec_and_monotone_in_interference(c, b, hp):
    higher = [(cj, tj, 0.0) for cj, tj in hp]
    r = response_time_s(c, b, higher, 1e6)
    assert r >= c + b - 1e-12
    assert response_time_s(c, b, higher + [(0.1, 3.0, 0.0)], 1e6) >= r - 1e-12


# ---------------------------------------------------------------------------------------------
# Small hand-made specs
# ---------------------------------------------------------------------------------------------
def _device(name, mem_gib=10.0):
    return {
        "name": name, "peak_tflops": 100.0, "mem_bw_gbyte_per_s": 1000.0, "memory_gib": mem_gib,
        "compute_efficiency": 1.0, "memory_efficiency": 1.0,
    }  # fmt: skip


def _model(name, gflops, prio, bound_ms, period_ms, **kw):
    return dict(
        name=name, gflops=gflops, weights_mib=1.0, layers=10, latency_ms=bound_ms,
        period_ms=period_ms, priority=prio, **kw,
    )  # fmt: skip


def test_two_models_share_one_device_hand_computed():
    # A: 2000 GFLOP / 100 TFLOP/s = 20 ms (prio 2); B: 30 ms (prio 1), 10 layers each.
    # R_A = 20 + one layer of B (3 ms) = 23 ms; R_B = 30 + ceil(R_B / 50) * 20 = 50 ms.
    spec = {
        "devices": [_device("d0")],
        "models": [_model("A", 2000.0, 2, 30.0, 50.0), _model("B", 3000.0, 1, 100.0, 100.0)],
    }
    plan = plan_realtime(spec)
    assert plan.feasible
    df = plan.to_frame().set_index("model")
    assert df.loc["A", "response_s"] == pytest.approx(23e-3, rel=1e-4)
    assert df.loc["B", "response_s"] == pytest.approx(50e-3, rel=1e-4)
    assert df.loc["B", "slack_s"] == pytest.approx(50e-3, rel=1e-3)
    assert not df["exclusive"].any()


def test_interference_makes_it_infeasible_with_reason_and_degraded_mode():
    spec = {
        "devices": [_device("d0")],
        "models": [_model("A", 2000.0, 2, 30.0, 50.0), _model("B", 3000.0, 1, 45.0, 100.0)],
    }
    plan = plan_realtime(spec)
    assert not plan.feasible
    assert "model 'B'" in plan.reason and "50.00 ms" in plan.reason and "45.00 ms" in plan.reason
    assert plan.degraded_drops == ("B",)


def test_highest_priority_gets_its_own_device():
    # Min-slack alone would put the tiny C next to A; the seed's rule gives C a device of its own.
    spec = {
        "devices": [_device("d0"), _device("d1")],
        "models": [
            _model("A", 2000.0, 2, 30.0, 50.0), _model("B", 3000.0, 1, 100.0, 100.0),
            _model("C", 1.0, 3, 10.0, 10.0),
        ],
    }  # fmt: skip
    df = plan_realtime(spec).to_frame().set_index("model")
    assert df.loc["C", "exclusive"]
    assert df.loc["A", "devices"] == df.loc["B", "devices"] != df.loc["C", "devices"]


def test_split_by_layers_when_no_device_holds_the_model():
    # 30 GiB of weights, 64 layers, two 22 GiB devices linked at 10 GB/s: the even cut 32 + 32.
    spec = {
        "devices": [_device("d0", 22.0), _device("d1", 22.0)],
        "links": [{"a": "d0", "b": "d1", "bw_gbyte_per_s": 10.0, "latency_us": 5.0}],
        "models": [{"name": "big", "gflops": 100.0, "weights_mib": 30 * 1024.0, "activation_mib": 64.0,
                     "layers": 64, "latency_ms": 100.0, "priority": 1}],
    }  # fmt: skip
    plan = plan_realtime(spec)
    assert plan.feasible
    p = plan.placements[0]
    assert p.devices == ("d0", "d1") and p.layers == (32, 32)
    # boundary activation 64 MiB / 64 = 1 MiB: 5 us + 1048576 / 1e10 = 109.9 us
    assert p.link_s == pytest.approx(5e-6 + MIB / 1e10)
    # each half: max(50e9 / 1e14, (15 GiB + 32 MiB) / 1e12) = 16.14 ms
    half_s = (15 * GIB + 32 * MIB) / 1e12
    assert p.response_s == pytest.approx(2 * half_s + p.link_s)


def test_model_fitting_nowhere_is_reported():
    spec = {
        "devices": [_device("d0", 1.0)],
        "models": [{"name": "big", "gflops": 1.0, "weights_mib": 4096.0, "layers": 4, "latency_ms": 10.0,
                     "priority": 1, "splittable": False}],
    }  # fmt: skip
    plan = plan_realtime(spec)
    assert not plan.feasible and "fits no device" in plan.reason


def test_latency_table_overrides_roofline():
    spec = {
        "devices": [_device("d0")],
        "models": [_model("A", 2000.0, 1, 30.0, 50.0, latency_table_ms={"d0": 7.0})],
    }
    assert latency_matrix_s(load_realtime(spec))[0, 0] == pytest.approx(7e-3)
    assert plan_realtime(spec).placements[0].response_s == pytest.approx(7e-3)


@pytest.mark.parametrize(
    "patch, needle",
    [
        ({"models": [{**_model("A", 1.0, 1, 10.0, 10.0), "latncy_ms": 3}]}, "latncy_ms"),
        (
            {"models": [_model("A", 1.0, 1, 10.0, 10.0), _model("B", 1.0, 1, 10.0, 10.0)]},
            "priorities",
        ),
        ({"models": [_model("A", 1.0, 1, 20.0, 10.0)]}, "period_ms"),
        ({"links": [{"a": "d0", "b": "dX", "bw_gbyte_per_s": 1.0}]}, "unknown device 'dX'"),
        ({"chain": {"models": ["A", "Z"], "deadline_ms": 10.0}}, "unknown model 'Z'"),
    ],
)
def test_bad_specs_raise_one_line_spec_error(patch, needle):
    spec = {"devices": [_device("d0")], "models": [_model("A", 1.0, 1, 10.0, 10.0)], **patch}
    with pytest.raises(SpecError) as err:
        load_realtime(spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# Exercise 9.6
# ---------------------------------------------------------------------------------------------
def test_exercise_9_6_latencies_hand_computed():
    t = latency_matrix_s(load_realtime(EX96))
    # perception on an L4: max(739e9 / 60.5e12, 1134 MiB / 240e9) + 24 * 10 us = 12.455 ms
    assert t[0, 0] == pytest.approx(739e9 / 60.5e12 + 24e-5)
    # planning on an L4: memory bound, 2318 MiB / 240e9 + 22 * 10 us = 10.347 ms
    assert t[1, 0] == pytest.approx(2318 * MIB / 240e9 + 22e-5)
    # control on an Edge TPU: 1.91 MiB / (100e9 * 0.8) = 25.0 us
    assert t[2, 2] == pytest.approx(1.91 * MIB / 80e9)


def test_exercise_9_6_placement():
    plan = plan_realtime(EX96)
    assert plan.feasible
    df = plan.to_frame().set_index("model")
    assert df.loc["perception", "devices"] == "gpu0"
    assert df.loc["planning", "devices"] == "gpu1"
    assert df.loc["control", "devices"] == "tpu0"
    assert df["exclusive"].all() and (df["slack_s"] > 0).all()
    # chain, time-triggered: (50 + 30 + 10) ms + responses + gpu0->gpu1 (10 us + 4 MiB / 25 GB/s)
    # + gpu1->tpu0 (100 us + 0.1 MiB / 0.5 GB/s) = 113.31 ms of 120 ms: the binding constraint
    expected = 0.090 + df["response_s"].sum() + 10e-6 + 4 * MIB / 25e9 + 100e-6 + 0.1 * MIB / 0.5e9
    assert plan.chain_latency_s == pytest.approx(expected)
    assert plan.chain_latency_s == pytest.approx(0.11331, abs=1e-5)
    assert plan.binding.startswith("chain perception -> planning -> control")
    assert plan.drop_order == ("perception", "planning")
    assert any(item.startswith("fixed memory pools") for item in plan.checklist)
    json.dumps(plan.to_dict())


def test_exercise_9_6_infeasible_variant_reports_reason():
    plan = plan_realtime(EX96_BAD)
    assert not plan.feasible
    assert "model 'planning'" in plan.reason and "30.00 ms" in plan.reason
    assert "71.23 ms" in plan.reason  # 4290e9 / 60.5e12 + 32 * 10 us
    assert plan.degraded_drops == ("planning",)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("realtime")(realtime)

    @app.command("version")
    def _version() -> None:  # a second command so that "realtime" stays a subcommand
        typer.echo("0")

    return app


def test_cli_prints_placement():
    res = CliRunner().invoke(_app(), ["realtime", str(EX96)])
    assert res.exit_code == 0, res.output
    assert "perception" in res.output and "tpu0" in res.output and "binding: chain" in res.output


def test_cli_json():
    res = CliRunner().invoke(_app(), ["realtime", str(EX96), "--json"])
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert data["feasible"] and data["placements"][2]["devices"] == ["tpu0"]


def test_cli_infeasible_exit_2_one_line():
    res = CliRunner().invoke(_app(), ["realtime", str(EX96_BAD)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "infeasible" in lines[0] and "planning" in lines[0]


def test_cli_bad_key_exit_2_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(EX96.read_text().replace("peak_tflops = 4.0", "peak_tflop = 4.0", 1))
    res = CliRunner().invoke(_app(), ["realtime", str(bad)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "peak_tflop" in lines[0]
    missing = CliRunner().invoke(_app(), ["realtime", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Bounded search: branch-and-bound over priorities, degraded mode by bisection
# ---------------------------------------------------------------------------------------------
def _identical(n, bound_ms, devices=2):
    return {
        "devices": [_device(f"d{j}") for j in range(devices)],
        "models": [_model(f"m{i:02d}", 2000.0, i + 1, bound_ms, 100.0) for i in range(n)],
    }


def test_32_models_infeasible_answers_with_degraded_mode():
    # 20 ms each, bound 70 ms: a device meets three bounds, two devices six of the 32. (Its
    # wall time, exponential over subsets before, is timed by benchmarks/bench_search.py.)
    plan = plan_realtime(_identical(32, 70.0))
    assert not plan.feasible
    assert plan.degraded_drops == tuple(f"m{i:02d}" for i in range(26))


def test_32_models_feasible():
    spec = _identical(32, 100.0, devices=4)
    for m in spec["models"]:
        m["gflops"] = 100.0  # 1 ms each: all 32 fit on the four devices
    plan = plan_realtime(spec)  # timed by benchmarks/bench_search.py
    assert plan.feasible
    top = max(plan.placements, key=lambda p: p.priority)
    assert top.exclusive  # the seed's rule: the most important model owns a device


def _brute_force(spec):
    import itertools

    from realtime.placement import _evaluate, _options

    spec = load_realtime(spec)
    options, reasons = _options(spec)
    if any(reasons):
        return None
    top = max(range(len(spec.models)), key=lambda i: spec.models[i].priority)
    best = None
    for combo in itertools.product(*options):
        _, cons = _evaluate(spec, combo)
        worst = max(c.ratio for c in cons)
        if worst <= 1.0:
            shared = any(dev in o.devices for i, o in enumerate(combo) if i != top
                         for dev in combo[top].devices)
            key = (shared, sum(len(o.devices) > 1 for o in combo), worst)
            best = key if best is None or key < best else best
    return best


@settings(max_examples=40, deadline=None)
@given(
    gflops=st.lists(st.sampled_from([300.0, 800.0, 1500.0, 2500.0]), min_size=2, max_size=5),
    bounds=st.lists(st.sampled_from([20.0, 40.0, 60.0, 100.0]), min_size=5, max_size=5),
    n_dev=st.integers(1, 3),
)
def test_branch_and_bound_agrees_with_exhaustive_enumeration(gflops, bounds, n_dev):
    spec = {
        "devices": [_device(f"d{j}") for j in range(n_dev)],
        "models": [_model(f"m{i}", g, i + 1, bounds[i], 100.0) for i, g in enumerate(gflops)],
    }
    plan = plan_realtime(spec)
    best = _brute_force(spec)
    assert plan.feasible == (best is not None)
    if best is not None:
        p = {x.model: x for x in plan.placements}
        top = max(plan.placements, key=lambda x: x.priority)
        assert (not top.exclusive) == best[0]
        worst = max(max(x.response_s / x.bound_s for x in plan.placements),
                    *(plan.memory_used_bytes[d] / plan.memory_capacity_bytes[d]
                      for d in plan.memory_used_bytes if plan.memory_used_bytes[d] > 0))
        assert worst == pytest.approx(best[2], rel=1e-12)
        assert len(p) == len(gflops)
    else:
        drops = plan.degraded_drops
        if drops is not None:  # the kept models are feasible, and no dropped one can come back
            keep = [m for m in spec["models"] if m["name"] not in drops]
            assert _brute_force({**spec, "models": keep}) is not None
            for d in drops:
                back = [m for m in spec["models"] if m["name"] not in drops or m["name"] == d]
                assert _brute_force({**spec, "models": back}) is None
