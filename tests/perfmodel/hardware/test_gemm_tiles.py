"""Wave-quantized tile model of a GEMM (perfmodel/gemm_tiles.py): hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.hardware.calibration import BENCH_DISPATCH_S, load_calibration
from perfmodel.hardware.gemm_tiles import TileParams, tile_time_s, wave_utilisation

P = TileParams(t_fixed_s=10e-6, rate_flops=700e12, k0=0.0, eff_128=0.5, eff_64=0.25)


def test_wave_utilisation_by_hand():
    # 2048 x 3072 in 128x256 tiles: 16 * 12 = 192 tiles, 2 waves of 132 -> 192 / 264
    assert wave_utilisation(2048, 3072, 128, 256, 132) == pytest.approx(192 / 264)
    # edge tiles padded: 200 x 256 -> 2 tiles of 128x256, one wave: 200*256 / (132*128*256)
    assert wave_utilisation(200, 256, 128, 256, 132) == pytest.approx(200 / (132 * 128))
    # split-K 2: 1024 x 1024 -> 32 tiles x 2 CTAs = 64 CTAs in one wave: 64 / 132
    assert wave_utilisation(1024, 1024, 128, 256, 132, split=2) == pytest.approx(64 / 132)


def test_tile_time_full_waves_by_hand():
    # 4096^3: 32*16 = 512 tiles of 128x256, 4 waves of 132 -> util 512/528; the 128x128 tile
    # (same quantization, half the rate) loses
    t = tile_time_s(4096, 4096, 4096, P)
    assert t == pytest.approx(10e-6 + 2 * 4096**3 / (700e12 * 512 / 528))


def test_tile_time_split_k_wins_on_few_tiles():
    # 1024 x 1024 x 8192: 32 tiles fill 32/132 of a wave; split 4 -> 128 CTAs, util 128/132
    assert tile_time_s(1024, 1024, 8192, P) == pytest.approx(
        10e-6 + 2 * 1024 * 1024 * 8192 / (700e12 * 128 / 132))
    # with 64 k-elements of fixed work per CTA, split 4 pays 4 x 64: (2048 + 64) * 4
    p = TileParams(t_fixed_s=10e-6, rate_flops=700e12, k0=64.0, eff_128=0.5, eff_64=0.25)
    assert tile_time_s(1024, 1024, 8192, p) == pytest.approx(
        10e-6 + 2 * 1024 * 1024 * (2048 + 64) * 4 / (700e12 * 128 / 132))


def test_calibration_keeps_measured_points_exact():
    cal = load_calibration("h200")
    d = pd.read_csv("hardware_specs/calibration/h200/gemm.csv")
    g = d[(d.layout == "fwd") & (d.m == 8192) & (d.n == 12288) & (d.k == 4096)]
    assert len(g) == 1
    t = 2.0 * 8192 * 12288 * 4096 / (cal.gemm_efficiency(8192, 12288, 4096) * cal.peak_flops_bf16)
    assert t + BENCH_DISPATCH_S == pytest.approx(float(g.seconds.iloc[0]), rel=1e-9)


def test_calibration_tile_fit_is_physical():
    cal = load_calibration("h200")
    p = cal.gemm_tiles["fwd"]
    assert 10e-6 < p.t_fixed_s < 40e-6  # launch as the calibration times it (dispatch ~8-20 us)
    assert 600e12 < p.rate_flops < 800e12  # MAMF of the H200: 782 TFLOP/s (env.json)
    assert p.sms == 132
    assert np.isfinite(cal.gemm_efficiency(np.array([1536.0]), 4608, 1536)).all()


def test_transferred_table_uses_plain_interpolation():
    # the tile quantization is the H200's (132 SMs): another GPU gets the measured curve alone
    from perfmodel.spec.specs import load_gpu

    cal = load_calibration("h200")
    a100 = cal.scaled_to(load_gpu("a100-sxm4-80gb"))
    assert a100.gemm_tiles is None
    assert a100.gemm_points is cal.gemm_points_plain


@given(st.integers(1, 20000), st.integers(1, 20000), st.integers(1, 20000),
       st.sampled_from(["m", "n", "k"]), st.integers(1, 4096))
@settings(max_examples=60, deadline=None)
def test_tile_time_never_falls_when_a_dimension_grows(m, n, k, dim, extra):
    # time = waves x per-wave work: waves and per-CTA work only grow with m, n, k
    p = TileParams(t_fixed_s=10e-6, rate_flops=700e12, k0=37.0, eff_128=0.8, eff_64=0.6)
    grown = {"m": m, "n": n, "k": k}
    grown[dim] += extra
    assert tile_time_s(grown["m"], grown["n"], grown["k"], p) >= tile_time_s(m, n, k, p) * (1 - 1e-12)
