"""Group biases: the memory-bound kernels' transfer to other GPUs (SM-side roofline),
Transformer Engine's fused cross-entropy, and reading an undated-memory A100 by its era."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.compute import layer as compute
from perfmodel.hardware.calibration import calibration_for, transfer_membw
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_gpu
from validation import validate


def test_transfer_membw_hand_computed():
    """H200 table (copy 4.25, softmax 1.57, layernorm 2.33 TB/s) on a part with 0.1875x the HBM
    bandwidth and 0.529x the SMs x clock (V100-SXM3 against H200): copy 4.25*0.1875 = 0.797;
    softmax min(0.797, 1.57*0.529 = 0.830) = 0.797; on a part with 0.698x HBM and the same SMs
    (H100 SXM5): softmax min(4.25*0.698 = 2.97, 1.57) = 1.57, copy 2.97."""
    t = {"copy": 4.25e12, "softmax": 1.57e12, "layernorm": 2.33e12}
    v = transfer_membw(t, 0.1875, 0.529)
    assert v["copy"] == pytest.approx(0.796875e12)
    assert v["softmax"] == pytest.approx(0.796875e12)
    h = transfer_membw(t, 0.698, 1.0)
    assert h["softmax"] == pytest.approx(1.57e12) and h["copy"] == pytest.approx(2.9665e12)
    assert h["layernorm"] == pytest.approx(2.33e12)
    # without SM figures every kernel keeps its fraction of HBM bandwidth
    assert transfer_membw(t, 0.5, None) == {k: x * 0.5 for k, x in t.items()}


def test_transfer_is_identity_on_the_measured_part_and_never_beats_streaming():
    h200 = calibration_for(load_gpu("h200-sxm-141gb"))
    for name in ("v100-sxm3-32gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "b200"):
        gpu = load_gpu(name)
        cal = calibration_for(gpu)
        r = gpu.hbm_bw_bytes_per_s / h200.hbm_bw_bytes_per_s
        for op, bw in cal.membw_bytes_per_s_table.items():
            assert bw <= h200.membw_bytes_per_s_table["copy"] * r * (1 + 1e-12), (name, op)
            # a kernel is never slower than the same fraction of HBM bandwidth it had measured
            assert bw >= h200.membw_bytes_per_s_table[op] * min(r, 1.0) * (1 - 1e-12), (name, op)
    same = transfer_membw(h200.membw_bytes_per_s_table, 1.0, 1.0)
    assert same == h200.membw_bytes_per_s_table


def test_fused_cross_entropy_moves_six_bytes_per_logit():
    """Transformer Engine's cross-entropy on 8192 x 32064 bf16 logits: 2 B read forward, 2 B read
    + 2 B written backward, at the copy bandwidth; the unfused fp32 path moves 56 B."""
    cal = calibration_for(load_gpu("h100-sxm5-80gb"))
    f, b = compute._Phase(cal, 1), compute._Phase(cal, 1)
    compute.fused_cross_entropy(f, b, 8192 * 32064, 2.0)
    bw = cal.membw_bytes_per_s("copy")
    assert f.gpu_s[0] == pytest.approx(2 * 8192 * 32064 / bw + compute.KERNEL_MIN_S)
    assert b.gpu_s[0] == pytest.approx(4 * 8192 * 32064 / bw)


def test_fused_cross_entropy_only_shortens_the_loss():
    from perfmodel.spec.specs import ModelSpec, TrainingSpec

    m = ModelSpec(name="t", num_layers=4, hidden_size=4096, num_attention_heads=32,
                  num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256, max_seq_len=8192,
                  activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  tied_embeddings=False, linear_bias=False)
    gpu = load_gpu("h100-sxm5-80gb")
    b = ConfigBatch.from_arrays(dp=[8], tp=[1], pp=[1], micro_batch_size=[1],
                                num_microbatches=[16])
    out = {}
    for ce in ("fp32", "fused"):
        t = TrainingSpec(global_batch_size=128, seq_len=8192, precision="bf16", cross_entropy=ce)
        out[ce] = compute.compute_times(m, t, gpu, b)
    for k in ("layer_fwd_s", "layer_bwd_s", "embed_fwd_s", "optimizer_s"):
        assert np.allclose(out["fp32"][k], out["fused"][k])
    # 8192 x 128256 logits: the unfused path moves 56 B each, the fused one 6 B
    saved = (out["fp32"]["logits_fwd_s"] + out["fp32"]["logits_bwd_s"]
             - out["fused"]["logits_fwd_s"] - out["fused"]["logits_bwd_s"])[0]
    bw = calibration_for(gpu).membw_bytes_per_s("copy")
    assert saved == pytest.approx(50 * 8192 * 128256 / bw, rel=0.02)


def test_a100_of_unstated_memory_is_read_by_its_era():
    """A 2020 run on 'A100' (no memory size) ran on the 40 GB part (the 80 GB one came in
    November 2020); a 2021 one stays the 80 GB preset."""
    df = validate.read_runs()
    r = df[df.row_id == "R0037"].iloc[0]
    assert validate.case_from_row(r).cluster.gpu.name == "A100-SXM4-40GB"
    later = r.copy()
    later["software"] = "Megatron-LM (2021)"
    assert validate.case_from_row(later).cluster.gpu.name == "A100-SXM4-80GB"
    stated = pd.Series({**r.to_dict(), "gpu_type": "A100-SXM4-80GB"})
    assert validate.case_from_row(stated).cluster.gpu.name == "A100-SXM4-80GB"
