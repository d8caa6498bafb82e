"""Calibration tables: interpolation reproduces measured points; scaling to other GPUs."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware_specs import calibration_dir
from perfmodel.core.errors import SpecError
from perfmodel.hardware import calibration as cal_mod
from perfmodel.hardware.calibration import (
    BENCH_DISPATCH_S,
    Calibration,
    calibration_for,
    load_calibration,
)
from perfmodel.hardware.gemm_tiles import fit_tile_x, tile_fit_cost, tile_params_of
from perfmodel.spec.specs import load_gpu

H200_PEAK = 989.4e12


@pytest.fixture(scope="module")
def cal() -> Calibration:
    return load_calibration("h200")


def test_gemm_efficiency_reproduces_a_measured_point(cal):
    # gemm.csv: tokens 32768, hidden 12288, tp 1, fc1 fwd: m=32768 n=49152 k=12288, 692.13 TFLOP/s
    flops = 2 * 32768 * 49152 * 12288
    t = flops / 692.13e12 - BENCH_DISPATCH_S
    expected = flops / t / H200_PEAK  # ~0.70
    assert cal.gemm_efficiency(32768, 49152, 12288, "fwd") == pytest.approx(expected, rel=0.01)


def test_gemm_efficiency_small_shapes_are_slower(cal):
    small = cal.gemm_efficiency(2048, 1024, 128, "fwd")
    large = cal.gemm_efficiency(8192, 12288, 12288, "fwd")
    assert small < 0.3
    assert 0.6 < large <= 0.95


def test_gemm_efficiency_vectorized_equals_scalar(cal):
    m = np.array([2048, 4096, 65536, 100])
    n = np.array([3072, 5000, 4096, 100])
    k = np.array([1024, 2048, 16384, 50])
    vec = cal.gemm_efficiency(m, n, k, "wgrad")
    one = [float(cal.gemm_efficiency(a, b, c, "wgrad")) for a, b, c in zip(m, n, k)]
    np.testing.assert_allclose(vec, one)


def test_attention_fit_matches_measurement(cal):
    # attention.csv: batch 4, 64 heads, seq 4096, fwd 606.18 TFLOP/s; fwd+bwd 480.44
    assert cal.attention_efficiency(256, 4096, "fwd") == pytest.approx(606.18 / 989.4, rel=0.05)
    assert cal.attention_efficiency(256, 4096, "fwd+bwd") == pytest.approx(480.44 / 989.4,
                                                                          rel=0.05)


def test_attention_time_by_hand(cal):
    # t = t0 + flops / rate; head_dim 128 and causal: flops = 2*bh*s^2*d
    ls, t0_flops, rate = cal.attention_points["fwd"]
    i = list(ls).index(11.0)  # seq 2048
    t = t0_flops[i] / H200_PEAK + 2 * 64 * 2048**2 * 128 / (rate[i] * H200_PEAK)
    assert cal.attention_time_s(64, 2048, 128, "fwd") == pytest.approx(t, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2048), st.sampled_from([512, 1024, 2048, 3000, 8192, 32768]),
       st.sampled_from(["fwd", "bwd"]))
def test_attention_time_grows_with_heads(bh, s, p):
    c = load_calibration("h200")
    assert c.attention_time_s(bh + 1, s, 128, p) > c.attention_time_s(bh, s, 128, p) > 0


def test_membw_from_memops(cal):
    # copy rows: bytes vs seconds least-squares slope ~ 4.25 TB/s; adamw one row, 3.37 TB/s
    assert cal.membw_bytes_per_s("copy") == pytest.approx(4.25e12, rel=0.02)
    assert 3.3e12 < cal.membw_bytes_per_s("adamw") < 3.5e12
    assert cal.membw_bytes_per_s("layernorm") < cal.membw_bytes_per_s("copy")
    with pytest.raises(ValueError):
        cal.membw_bytes_per_s("nope")


def test_scaled_to_a100_keeps_fractions_and_scales_bandwidth(cal):
    a100 = load_gpu("a100-sxm4-80gb")
    sc = calibration_for(a100)
    # same fraction of the part's own ceiling: A100 MAMF 267.9/312 vs H200 782.0/989.4
    ceiling_ratio = (267.9 / 312) / (782.0139499331823 / 989.4)
    # ... at the shape that takes as long on the H200: rows scaled by the peak ratio 989.4/312,
    # on the H200's measured curve without its tile model (that quantization is the H200's)
    plain = replace(cal, gemm_points=cal.gemm_points_plain, gemm_tiles=None, _interp={})
    assert sc.gemm_efficiency(2048, 4608, 12288) == pytest.approx(
        ceiling_ratio * plain.gemm_efficiency(2048 * 989.4 / 312, 4608, 12288), rel=1e-9)
    assert sc.membw_bytes_per_s("copy") == pytest.approx(
        cal.membw_bytes_per_s("copy") * 2.039 / 4.8, rel=1e-9)
    # 175B layer GEMMs at tp=8, b=1, s=2048 on A100: 65-80 % of peak
    for n, k in ((4608, 12288), (12288, 1536), (6144, 12288), (12288, 6144)):
        assert 0.5 <= sc.gemm_efficiency(2048, n, k) <= 0.8
    assert calibration_for(a100, gemm_scale=1.1).gemm_efficiency(2048, 4608, 12288) == (
        pytest.approx(1.1 * sc.gemm_efficiency(2048, 4608, 12288), rel=1e-9))


def test_user_folder_loads_like_shipped(tmp_path, cal):
    shutil.copytree(calibration_dir("h200"), tmp_path / "mine")
    mine = load_calibration(tmp_path / "mine", "h200-sxm-141gb")
    assert mine.gemm_efficiency(4096, 4096, 4096) == pytest.approx(
        cal.gemm_efficiency(4096, 4096, 4096))
    h200 = load_gpu("h200-sxm-141gb")
    assert calibration_for(h200, tmp_path / "mine").membw_bytes_per_s("gelu") == pytest.approx(
        cal.membw_bytes_per_s("gelu"))


def test_missing_files_are_spec_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="gemm.csv"):
        load_calibration(tmp_path / "empty", "h200-sxm-141gb")
    with pytest.raises(SpecError, match="does not exist"):
        load_calibration(tmp_path / "nowhere", "h200-sxm-141gb")


def test_shipped_h200_tables_equal_shared_ones():
    d = calibration_dir("h200")
    assert len(pd.read_csv(d / "gemm.csv")) == 1008


def test_shipped_tile_fit_is_the_fit_of_its_table():
    """The saved tile-model fit of the shipped table is the fit of ``gemm.csv`` (same digest), and
    a calibration loads it instead of refitting. The robust least squares has nearby local
    minima whose choice depends on the scipy release, so the check is not bit equality with a
    fresh fit: refitting from the saved vector stays there (a minimum of this table's loss),
    and no fresh fit from the default start is better."""
    folder = calibration_dir("h200")
    env = cal_mod._read_env(folder)
    gemm = cal_mod._read_csv(folder, "gemm.csv")
    sms = int(env.get("sms", 132))
    saved = json.loads((folder / cal_mod.TILE_FIT_FILE).read_text())
    assert saved["digest"] == cal_mod.tile_fit_digest(gemm, sms)
    cols = (gemm["m"], gemm["n"], gemm["k"], gemm["layout"], gemm["seconds"])
    x_saved = np.asarray(saved["x"], dtype=np.float64)
    cost_saved = tile_fit_cost(x_saved, *cols, sms=sms)
    again = fit_tile_x(*cols, sms=sms, x0=x_saved)
    assert tile_fit_cost(again, *cols, sms=sms) == pytest.approx(cost_saved, rel=1e-9)
    np.testing.assert_allclose(again, x_saved, rtol=1e-5, atol=1e-6)
    assert cost_saved <= tile_fit_cost(fit_tile_x(*cols, sms=sms), *cols, sms=sms) * (1 + 1e-9)
    lays = sorted(set(np.asarray(gemm["layout"]).tolist()))
    assert cal_mod._tile_params(folder, gemm, sms) == tile_params_of(x_saved, lays, sms)


def test_tile_fit_of_other_rows_is_refitted(tmp_path):
    """A saved fit whose digest does not match the folder's rows is ignored (refitted)."""
    src = calibration_dir("h200")
    for f in ("gemm.csv", "attention.csv", "memops.csv", "env.json"):
        shutil.copy(src / f, tmp_path / f)
    gemm = cal_mod._read_csv(tmp_path, "gemm.csv")
    good = cal_mod._tile_params(tmp_path, gemm, 132)
    (tmp_path / cal_mod.TILE_FIT_FILE).write_text(json.dumps({"digest": "0" * 64, "x": [0.0] * 7}))
    assert cal_mod._tile_params(tmp_path, gemm, 132) == good
