"""The model's FP8 speed-up against the published rows that differ only in precision
(validation.precision_pairs): 30 dense pairs (DGX Cloud NeMo 24.09 on H100: Llama 3.1 8B / 70B / 405B,
Nemotron-4 15B / 340B) and 7 MoE pairs (Grok-1 on H100, dgxc; DeepSeek-V3 on GB300, MXFP8)."""

import numpy as np
import pandas as pd
import pytest

from validation.precision_pairs import _pairs, precision_pairs, summary_by_gpu


@pytest.fixture(scope="module")
def pairs():
    return precision_pairs()


@pytest.mark.slow
def test_pairs_found(pairs):
    assert (pairs["kind"] == "dense").sum() == 30
    assert (pairs["kind"] == "moe").sum() == 7
    assert set(summary_by_gpu(pairs)["model"]) >= {"Grok-1", "DeepSeek-V3", "Llama 3.1 70B"}


@pytest.mark.slow
def test_dense_fp8_speedup(pairs):
    d = pairs[pairs["kind"] == "dense"]
    # mean |model / measured speed-up - 1| 2.9 % (signed +1.6 %): 8B / 15B / 340B within 1.3 %,
    # Llama 3.1 70B (t4 cp2) over-credited +8.0 %, the 405B proxies under-credited -4.0 %
    assert np.abs(d["ratio_error"]).mean() <= 0.032
    assert abs(d["ratio_error"].mean()) <= 0.02


@pytest.mark.slow
def test_moe_fp8_speedup(pairs):
    m = pairs[pairs["kind"] == "moe"].set_index("fp8_row")
    # DeepSeek-V3 on GB300 priced as the MXFP8 it ran (+9.5 % as delayed scaling): +2.4 %;
    # +5.5 % with the multi-stream grouped-GEMM slowdown (moe.TE_GROUPED_GEMM_SLOWDOWN),
    # which scales the bf16 and the MXFP8 expert GEMMs alike (the bf16 row E0021 +6.8 %, the
    # MXFP8 row E0022 +1.3 %), so the fp8 saving in seconds grows
    assert abs(m.loc["E0022", "ratio_error"]) <= 0.06
    # Grok-1 on H100: measured 1.24x, model 1.37x: a known over-credit (+9.5..+10.9 %), not an
    # fp8 recipe term found in TE / Megatron-Core (docs/compute.md)
    assert m.loc[m["model"] == "Grok-1", "ratio_error"].between(0.0, 0.115).all()


def test_pairing_by_hand():
    df = pd.DataFrame({"row_id": ["a", "b", "c"], "precision": ["BF16", "FP8-CS", "FP8"],
                       "k": [1, 1, 2]})
    rep = pd.DataFrame({"row_id": ["a", "b", "c"], "measured_s": [3.0, 2.0, 1.0],
                        "predicted_s": [3.3, 2.0, 1.0]})
    p = _pairs(df.assign(gpu_type="H100", model="m", source="s"), rep, ("k",), "dense")
    assert len(p) == 1 and p.loc[0, "fp8_row"] == "b"
    assert p.loc[0, "measured_speedup"] == pytest.approx(1.5)
    assert p.loc[0, "ratio_error"] == pytest.approx(1.65 / 1.5 - 1)
