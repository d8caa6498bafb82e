"""Efficiency profiles: neutral is exact, each hook scales what it names, bounds are enforced."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.core.errors import SpecError
from perfmodel.hardware.calibration import calibration_for
from perfmodel.hardware.profile import EfficiencyProfile, load_profile, profile_toml
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.specs import TrainingSpec, load_cluster, load_model
from perfmodel.step import profiled as prof_mod
from perfmodel.step.evaluate import evaluate


@pytest.fixture(scope="module")
def setup():
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100-80g", gpus=64)
    training = TrainingSpec(global_batch_size=64, seq_len=2048)
    cfgs = [ParallelConfig(dp=1, tp=8, pp=8, micro_batch_size=1),
            ParallelConfig(dp=2, tp=8, pp=4, micro_batch_size=1, recompute="full")]
    batch = ConfigBatch.from_configs([resolve_config(c, model, training, cluster) for c in cfgs])
    return model, training, cluster, batch


def test_neutral_profile_gives_exactly_todays_predictions(setup):
    model, training, cluster, batch = setup
    base = evaluate(model, training, cluster, batch)
    for p in (None, EfficiencyProfile(), EfficiencyProfile(name="x", description="y")):
        res = prof_mod.evaluate_profiled(model, training, cluster, batch, profile=p)
        assert np.array_equal(res.step_time_s, base.step_time_s)
        for k in base.time_s:
            assert np.array_equal(res.time_s[k], base.time_s[k])
        assert np.array_equal(res.mfu, base.mfu)


def test_gemm_scale_multiplies_gemm_efficiency_by_precision():
    gpu = load_cluster("dgx-h100").gpu
    cal = calibration_for(gpu)
    p = EfficiencyProfile(gemm_16bit=0.8, gemm_fp8=0.5)
    m, n, k = 4096.0, 4096.0, 4096.0
    e0 = cal.gemm_efficiency(m, n, k)
    assert p.calibration(cal, "bf16").gemm_efficiency(m, n, k) == pytest.approx(0.8 * e0)
    assert p.calibration(cal, "fp8").gemm_efficiency(m, n, k) == pytest.approx(0.5 * e0)
    # flash attention follows the 16-bit scale under every precision: time / 0.8
    t0 = cal.attention_time_s(32, 4096, 128, "fwd")
    assert p.calibration(cal, "fp8").attention_time_s(32, 4096, 128, "fwd") == pytest.approx(
        t0 / 0.8)


def test_membw_scales_memory_bound_bandwidth():
    cal = calibration_for(load_cluster("dgx-h100").gpu)
    p = EfficiencyProfile(membw=1.25)
    assert p.calibration(cal, "bf16").membw_bytes_per_s("layernorm") == pytest.approx(
        1.25 * cal.membw_bytes_per_s("layernorm"))


def test_link_scales_apply_per_tier():
    c = load_cluster("dgx-h100", gpus=64)
    s = EfficiencyProfile(scale_up_bw=0.5, scale_out_bw=0.25).cluster(c)
    # NVLink4 450 GB/s -> 225 GB/s; NDR 400 Gb/s = 50 GB/s -> 12.5 GB/s
    assert s.tiers[0].bw_bytes_per_s == pytest.approx(225e9)
    assert s.tiers[1].bw_bytes_per_s == pytest.approx(12.5e9)
    assert s.tiers[0].latency_s == c.tiers[0].latency_s


def test_step_overhead_adds_host_term(setup):
    model, training, cluster, batch = setup
    base = evaluate(model, training, cluster, batch)
    res = prof_mod.evaluate_profiled(model, training, cluster, batch,
                            profile=EfficiencyProfile(step_overhead_ms=250.0))
    assert np.allclose(res.step_time_s, base.step_time_s + 0.25)
    assert np.allclose(res.time_s["host"], 0.25)
    assert np.allclose(sum(res.time_s.values()), res.step_time_s)
    assert np.allclose(res.mfu * res.step_time_s, base.mfu * base.step_time_s)


def test_slower_gemms_slow_the_step(setup):
    model, training, cluster, batch = setup
    base = evaluate(model, training, cluster, batch).step_time_s
    slow = prof_mod.evaluate_profiled(model, training, cluster, batch,
                             profile=EfficiencyProfile(gemm_16bit=0.8)).step_time_s
    assert np.all(slow > base * 1.1) and np.all(slow < base / 0.8 + 1e-9)


@pytest.mark.parametrize("field,value", [("gemm_16bit", 0.2), ("scale_out_bw", 3.0),
                                         ("step_overhead_ms", -1.0)])
def test_out_of_bounds_rejected_with_field_name(field, value):
    with pytest.raises(SpecError, match=field):
        EfficiencyProfile().with_values(**{field: value})


def test_toml_round_trip(tmp_path):
    p = EfficiencyProfile(name="mine", fitted_on="two runs", gemm_16bit=0.91, scale_out_bw=0.7,
                          uncertainty={"gemm_16bit": 0.02})
    f = tmp_path / "p.toml"
    f.write_text(profile_toml(p, "header line"))
    q = load_profile(f)
    assert q.gemm_16bit == pytest.approx(0.91) and q.scale_out_bw == pytest.approx(0.7)
    assert q.uncertainty == {"gemm_16bit": 0.02} and q.fitted_on == "two runs"


@pytest.mark.parametrize("name", ["megatron-2021", "megatron-2022", "nemo-24.07", "nemo-24.09",
                                  "bridge-25.x"])
def test_shipped_profiles_load_and_say_what_they_were_fitted_on(name):
    p = load_profile(name)
    assert p.name == name and "rows of training_runs_dev.csv" in p.fitted_on
    assert not p.is_neutral


def test_unknown_profile_is_one_line_error():
    with pytest.raises(SpecError, match="unknown profile preset 'nemo-99'"):
        load_profile("nemo-99")
