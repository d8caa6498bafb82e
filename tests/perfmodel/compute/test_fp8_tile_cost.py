"""The per-tile fixed cost of Hopper fp8 GEMMs (compute.low_precision_tile_factor), by hand."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.compute import layer as compute
from perfmodel.spec.specs import load_gpu

H100, B200 = load_gpu("H100-SXM5-80GB"), load_gpu("B200")


def test_docstring_example_attention_projection_70b_tp4():
    # forward reduction k = 2048: (1 + 350/2048) / (1 + 350/8192)
    f = compute.low_precision_tile_factor(8192, 8192, 2048, "fwd", H100)
    assert float(f) == pytest.approx((1 + 350 / 2048) / (1 + 350 / 8192))
    assert float(f) == pytest.approx(1.1229, abs=1e-4)


def test_reduction_follows_the_layout():
    m, n, k = 4096, 2304, 16384  # Llama 3.1 405B qkv at tp 8, cp 2
    ref = 1 + 350 / 8192
    assert float(compute.low_precision_tile_factor(m, n, k, "fwd", H100)) == pytest.approx(
        (1 + 350 / k) / ref)
    assert float(compute.low_precision_tile_factor(m, n, k, "dgrad", H100)) == pytest.approx(
        (1 + 350 / n) / ref)
    assert float(compute.low_precision_tile_factor(m, n, k, "wgrad", H100)) == pytest.approx(
        (1 + 350 / m) / ref)


def test_only_hopper_and_neutral_at_the_reference_reduction():
    assert compute.low_precision_tile_factor(8192, 8192, 2048, "fwd", B200) == 1.0
    assert float(compute.low_precision_tile_factor(
        1, 1, compute.LOW_PRECISION_REF_REDUCTION, "fwd", H100)) == pytest.approx(1.0)


def test_tile_k0_reproduces_the_published_sweep():
    # tile-lang per-tensor fp8 on H800 (M = N = 8192): t ~ K + k0 through K = 2048 and 16384
    k, tflops = np.array([2048, 16384.0]), np.array([1343, 1541.0])
    t = k / tflops  # per unit of M*N
    k0 = (t[0] * k[1] - t[1] * k[0]) / (t[1] - t[0])
    assert k0 == pytest.approx(compute.LOW_PRECISION_TILE_K0, rel=0.02)


@given(st.floats(64, 65536), st.floats(64, 65536))
def test_shorter_reductions_cost_more(k1, k2):
    f1 = float(compute.low_precision_tile_factor(8192, 8192, min(k1, k2), "fwd", H100))
    f2 = float(compute.low_precision_tile_factor(8192, 8192, max(k1, k2), "fwd", H100))
    assert f1 >= f2 > 0.95


def test_fp8_layer_gemms_pay_it_on_hopper_only():
    # the fp8 layer's linear GEMMs: H100 forward time rises by the flop-weighted factor, B200's not
    from perfmodel.parallel.config import ConfigBatch, ParallelConfig
    from perfmodel.spec.specs import TrainingSpec, load_model

    model = load_model("llama3.1-70b")
    tr = TrainingSpec(global_batch_size=64, seq_len=8192, precision="fp8",
                      low_precision_recipe="fp8-delayed")
    b = ConfigBatch.from_configs([ParallelConfig(dp=1, tp=4, pp=1, micro_batch_size=1, num_microbatches=64,
                                                 sequence_parallel=True)])
    k0 = compute.LOW_PRECISION_TILE_K0
    try:
        compute.LOW_PRECISION_TILE_K0 = 0.0
        flat = {g.name: compute.compute_times(model, tr, g, b)["layer_fwd_s"][0]
                for g in (H100, B200)}
    finally:
        compute.LOW_PRECISION_TILE_K0 = k0
    now = {g.name: compute.compute_times(model, tr, g, b)["layer_fwd_s"][0] for g in (H100, B200)}
    assert now[B200.name] == pytest.approx(flat[B200.name])
    assert now[H100.name] > flat[H100.name]
