"""The train_run recipe on a hand-computed case, and run_settings from the specs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.run import BOUNDED, RunSettings, run_settings, train_run, train_run_bounds
from perfmodel.run.train import train_steps_for
from perfmodel.spec.specs import SpecError, load_cluster, load_model, load_training


def _settings(**kw):
    base = {"train_steps": 1000, "tokens_per_step": 1000, "checkpoint_bytes": 1e12,
            "interruptions_per_gpu_hour": 3.6e-5, "unexpected_fraction": 1.0,
            "gpus_per_node": 8, "storage_bytes_per_s": 1e11, "relaunch_s": 600.0,
            "tdp_w": 700.0, "idle_power_fraction": 0.15, "node_other_w_per_gpu": 575.0,
            "pue": 1.1, "gpu_hour_price": 2.0, "interval": "young"}
    base.update(kw)
    return RunSettings(**base)


def test_hand_computed_run():
    # 1,000 GPUs at 3.6e-5 per GPU-hour: 1e-5 / s, M = 1e5 s; sync checkpoint 1e12 B at
    # 1e11 B/s = 10 s; Young sqrt(2 x 10 x 1e5) = 1,414 s -> 141 steps of 10 s = 1,410 s;
    # restart 600 + 10 = 610 s; lost (1,410 + 10) / 2 = 710 s;
    # wall = 10,000 (1 + 10/1,410) / (1 - 1e-5 (610 + 710)) = 10,205.64 s.
    r = train_run(_settings(), [10.0], [1000])
    row = r.row(0)
    assert row["checkpoint_s"] == pytest.approx(10.0)
    assert row["checkpoint_interval_s"] == pytest.approx(1410.0)
    assert row["restart_s"] == pytest.approx(610.0)
    assert row["lost_work_s"] == pytest.approx(710.0)
    assert row["wall_s"] == pytest.approx(10_205.636, rel=1e-6)
    assert row["gpu_hours"] == pytest.approx(2834.899, rel=1e-6)
    assert row["cost"] == pytest.approx(2 * 2834.899, rel=1e-6)
    assert row["expected_interruptions"] == pytest.approx(0.102056, rel=1e-5)
    assert row["goodput"] == pytest.approx(0.979851, rel=1e-5)
    assert row["energy_mwh"] == pytest.approx(3.97595, rel=1e-5)  # full power: busy 1


def test_async_checkpoint_blocks_only_the_host_copy():
    s = _settings(checkpoint_mode="async", host_copy_bytes_per_s=25e9)
    r = train_run(s, [10.0], [1000], staged_bytes_per_gpu=5e9)
    assert float(r.checkpoint_s[0]) == pytest.approx(0.2)
    assert float(r.checkpoint_interval_s[0]) >= float(r.checkpoint_write_s[0])
    assert float(r.goodput[0]) > float(train_run(_settings(), [10.0], [1000]).goodput[0])


def test_more_gpus_more_interruptions_lower_goodput():
    r = train_run(_settings(), [10.0, 10.0], [1000, 8000])
    assert r.expected_interruptions[1] > r.expected_interruptions[0]
    assert r.goodput[1] < r.goodput[0]
    assert len(r.to_dataframe()) == 2


def test_without_tdp_or_price_energy_and_cost_are_nan():
    r = train_run(_settings(tdp_w=None, gpu_hour_price=None), [10.0], [1000])
    assert np.isnan(r.energy_mwh[0]) and np.isnan(r.cost[0])


def test_steps_from_tokens_and_errors():
    assert train_steps_for(15.6e12, None, 2048 * 8192) == 929_833
    assert train_steps_for(None, 10, 1) == 10
    with pytest.raises(SpecError, match="exactly one"):
        train_steps_for(None, None, 1)
    with pytest.raises(SpecError, match="train_tokens"):
        train_steps_for(-1.0, None, 1)


def test_run_settings_from_specs_and_cluster_overrides():
    m = load_model("llama3.1-8b")
    t = load_training({"seq_len": 8192, "global_batch_size": 128})
    c = load_cluster("dgx-h100", 64).model_copy(update={
        "interruptions_per_gpu_hour": 1e-4, "storage_write_gbyte_per_s": 100.0,
        "gpu_hour_price": 3.0, "pue": 1.3})
    s = run_settings(m, t, c, train_steps=100)
    assert s.checkpoint_bytes == pytest.approx(m.param_count() * 14)
    assert (s.interruptions_per_gpu_hour, s.storage_bytes_per_s, s.gpu_hour_price, s.pue) == (
        1e-4, 1e11, 3.0, 1.3)
    assert run_settings(m, t, c, train_steps=1, gpu_hour_price=5.0).gpu_hour_price == 5.0
    with pytest.raises(SpecError, match="checkpoint_mode"):
        run_settings(m, t, c, train_steps=1, checkpoint_mode="x")


def test_cluster_file_run_fields_are_validated(tmp_path):
    base = (tmp_path / "c.toml")
    text = ('name = "x"\ngpu = "h100-sxm5-80gb"\ngpus_per_node = 8\nnum_nodes = 2\n'
            '{extra}\n[[tiers]]\nname = "nvl"\nkind = "nvlink"\nbw_gbyte_per_s = 450\n')
    base.write_text(text.format(extra="interruptions_per_gpu_hour = 3e-5\npue = 1.2"))
    c = load_cluster(base)
    assert (c.interruptions_per_gpu_hour, c.pue) == (3e-5, 1.2)
    for bad, field in (("pue = 0.9", "pue"), ("interruptions_per_gpu_hour = 0", "interruptions"),
                       ("storage_write_gbyte_per_s = -1", "storage")):
        base.write_text(text.format(extra=bad))
        with pytest.raises(SpecError, match=field):
            load_cluster(base)


# --- the run at both ends of the step time's interval ----------------------------------------
def test_hand_computed_bounds():
    # The case above (10 s steps, 141 steps between checkpoints) with the step time in [9, 12] s,
    # the interval in steps, the failure rate and the checkpoint cost as given:
    # 9 s: tau = 1,269 s, lost (1,269 + 10) / 2 = 639.5 s,
    #      wall = 9,000 (1 + 10/1,269) / (1 - 1e-5 (610 + 639.5)) = 9,185.70 s;
    # 12 s: tau = 1,692 s, lost 851 s, wall = 12,000 (1 + 10/1,692) / (1 - 1e-5 x 1,461)
    #      = 12,249.89 s. GPU-hours and cost follow the wall time (1,000 GPUs, 2 per GPU-hour).
    r = train_run_bounds(_settings(), [10.0], [9.0], [12.0], [1000])
    row = r.row(0)
    assert row["wall_s"] == pytest.approx(10_205.636, rel=1e-6)  # the point is train_run's
    assert row["wall_s_interval"] == pytest.approx([9185.697, 12249.893], rel=1e-6)
    assert row["days_interval"] == pytest.approx([9185.697 / 86_400, 12249.893 / 86_400],
                                                 rel=1e-6)
    assert row["gpu_hours_interval"] == pytest.approx([2551.583, 3402.748], rel=1e-6)
    assert row["cost_interval"] == pytest.approx([5103.165, 6805.496], rel=1e-6)
    # energy: the same 700 W x (1 + 575/700) x 1.1 per GPU over the wall time's bounds
    per_s = 1000 * (700 + 575) * 1.1 / 3.6e9
    assert row["energy_mwh_interval"] == pytest.approx([9185.697 * per_s, 12249.893 * per_s],
                                                       rel=1e-6)
    # goodput peaks inside: 10,000 / 10,205.64 = 0.979851 is its top, the ends' lower one 12 s
    lo, hi = row["goodput_interval"]
    assert lo == pytest.approx(12_000 / 12249.893, rel=1e-6)
    assert hi >= row["goodput"] and hi == pytest.approx(0.979851, rel=1e-5)
    # not a linear scaling of the point: at ten times the failure rate (lambda = 1e-4 / s,
    # Young sqrt(2 x 10 x 1e4) = 447 s -> 45 steps) the longer interval's checkpoints cost less,
    # its lost work more: 10 s: tau 450, L 230; 12 s: tau 540, L 275;
    # 1.2 x (1 + 10/540) / (1 + 10/450) x (1 - 0.084) / (1 - 0.0885) = 1.20156, not 1.2
    r = train_run_bounds(_settings(interruptions_per_gpu_hour=3.6e-4), [10.0], [9.0], [12.0],
                         [1000]).row(0)
    assert r["wall_s_interval"][1] / r["wall_s"] == pytest.approx(1.20156, rel=1e-5)


def test_bounds_are_monotone_and_absent_without_price():
    s = _settings(gpu_hour_price=None)
    step = np.array([2.0, 10.0, 40.0])
    r = train_run_bounds(s, step, 0.8 * step, 1.3 * step, [64, 1000, 16_384])
    for name in BOUNDED:
        b = r.bounds[name]
        point = getattr(r, name)
        if name == "cost":
            assert np.isnan(b).all() and r.row(0)["cost_interval"] is None
            continue
        assert np.all(b[:, 0] <= point) and np.all(point <= b[:, 1])
    cols = r.to_dataframe().columns
    assert {"days_low", "days_high", "wall_s_low", "goodput_high"} <= set(cols)
    assert list(cols)[:2] == ["train_steps", "train_tokens"]
    assert train_run(s, step, [64, 1000, 16_384]).row(0).get("days_interval") is None


@settings(max_examples=60, deadline=None)
@given(step=st.floats(1e-2, 100.0), low=st.floats(0.3, 1.0), high=st.floats(1.0, 3.0),
       gpus=st.integers(1, 100_000), steps=st.integers(1, 10_000_000),
       rate=st.floats(1e-7, 1e-4), ckpt_bytes=st.floats(1e9, 1e13),
       mode=st.sampled_from(["sync", "async"]), interval=st.sampled_from(["young", "daly"]))
def test_run_interval_contains_the_point(step, low, high, gpus, steps, rate, ckpt_bytes, mode,
                                         interval):
    s = _settings(train_steps=steps, interruptions_per_gpu_hour=rate, unexpected_fraction=0.9,
                  checkpoint_bytes=ckpt_bytes, checkpoint_mode=mode, interval=interval)
    r = train_run_bounds(s, [step], [step * low], [step * high], [gpus], 5e9, 0.8)
    for name in BOUNDED:
        lo, hi = r.bounds[name][0]
        v = float(getattr(r, name)[0])
        if not np.isfinite(v):  # interruptions faster than the run recovers: no progress
            continue
        assert lo <= v * (1 + 1e-12) and v <= hi * (1 + 1e-12), name
    # batch evaluation == one by one
    one = train_run_bounds(s, step, step * low, step * high, gpus, 5e9, 0.8)
    np.testing.assert_array_equal(one.bounds["wall_s"], r.bounds["wall_s"][0])
