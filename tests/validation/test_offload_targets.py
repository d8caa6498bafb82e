"""Offload against published numbers: ZeRO-Offload on one V100 (Ren et al. 2021), and a 13B
model on one 8 x A100-40GB node with ZeRO-3 and optimizer offload."""

import pytest

import search
from perfmodel.spec.specs import load_cluster, load_model

# Ren et al. 2021 (ZeRO-Offload), Sec. 6.2 / Fig. 7: 40 TFLOPS on one V100 for a 10B model
# (Table 4 of its model configurations: 50 layers, hidden 4096; GPT-2 vocabulary, sequence
# 1024), fp16, activation checkpointing, optimizer on the CPU of a DGX-2 (2 x 24-core Xeon
# Platinum 8168, PCIe Gen3 x16: ~12 GB/s per direction measured, 15.75 GB/s line rate).
ZERO_OFFLOAD_TFLOPS = 40.0
V100_FP16_PEAK_TFLOPS = 130.8  # v100-sxm3-32gb preset

GPT_10B = load_model("gpt3-13b").model_copy(update={
    "name": "gpt-10b", "num_layers": 50, "hidden_size": 4096, "num_attention_heads": 32,
    "ffn_hidden_size": 16384, "published_params": None, "published_training": None,
    "max_seq_len": 1024})
DGX2 = load_cluster("dgx2-v100").model_copy(update={"cpu_cores_per_node": 48,
                                                    "host_link_gbyte_per_s": 12.0})


@pytest.mark.slow
def test_zero_offload_10b_on_one_v100_within_15_percent():
    # the largest micro-batch that fits 32 GB (8 sequences), one micro-batch per step; the
    # paper counts the FLOPs the GPU runs (recomputed forward included): our HFU
    r = search.evaluate_config(GPT_10B, DGX2, gpus=1, global_batch_size=8, seq_len=1024,
                               precision="fp16", framework="deepspeed-2021", dp=1, tp=1, pp=1,
                               zero_stage=2, micro_batch_size=8, recompute="full",
                               offload=["optimizer"])
    row = r.rows[0]
    assert row["fits"]
    tflops = row["hfu"] * V100_FP16_PEAK_TFLOPS
    assert tflops == pytest.approx(ZERO_OFFLOAD_TFLOPS, rel=0.15)


@pytest.mark.slow
def test_13b_on_one_a100_40gb_node_with_zero3_and_optimizer_offload():
    r = search.plan("gpt3-13b", "dgx-a100-40g", gpus=8, framework="deepspeed", zero_stage=3,
                    offload=["optimizer"], top=1)
    assert r.fits_any
    best = r.rows[0]
    assert best["config"]["zero_stage"] == 3
    assert best["memory_bytes"]["optimizer"] == 0.0
    assert best["memory_bytes"]["peak"] <= r.setup["usable_hbm_bytes"]
