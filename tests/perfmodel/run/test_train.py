"""The train_run recipe on a hand-computed case, and run_settings from the specs."""

import numpy as np
import pytest

from perfmodel.run import RunSettings, run_settings, train_run
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
