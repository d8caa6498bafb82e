"""Megatron's model-FLOP formulas (perfmodel.compute.framework_flops), hand-computed and checked on the
published rows that give both tokens/s and TFLOP/s."""

import pandas as pd
import pytest

from perfmodel.compute.framework_flops import (
    megatron_flops_per_token,
    megatron_padded_vocab,
    step_time_from_tflops,
)
from perfmodel.spec.specs import load_model
from validation.validate import VALIDATION_DIR


def test_padded_vocab():
    assert megatron_padded_vocab(129280) == 129280  # 1010 * 128
    assert megatron_padded_vocab(50257, tp=2) == 50432  # 197 * 256
    assert megatron_padded_vocab(32000) == 32000


def test_mixtral_2024_form_by_hand():
    # 12*L*h^2*((1 + g/n + s/h)*q/h + f/h*k*3/2) + 6*h*V, L=32, h=4096, n=32, g=8, q=h,
    # f=14336, k=2, V=32000, s=4096: 12*32*4096^2 = 6,442,450,944; x (2.25 + 10.5) =
    # 82,141,249,536; + 6*4096*32000 = 786,432,000 -> 82,927,681,536 FLOP per token
    m = load_model("mixtral-8x7b")
    assert megatron_flops_per_token(m, 4096, form="2024") == pytest.approx(82_927_681_536, 1e-9)


def test_deepseek_v3_2025_form_by_hand():
    # per token, h = 7168, s = 4096, no MTP:
    # MLP 6*h*(3*18432*3 + (3*2048*8 + 3*2048)*58) = 6*7168*3,373,056 = 145,068,392,448
    # MLA proj: q 1536*(7168 + 128*192 + 1) = 48,760,320; kv 512*(7168 + 128*256 + 1) =
    #   20,447,744; rope k 7168*64 = 458,752; o 128*128*7168 = 117,440,512 -> 187,107,328
    # core (causal) 4096*128*192/2 + 4096*128*128/2 = 83,886,080
    # attention 6*61*(187,107,328 + 83,886,080) = 99,183,587,328; logits 6*7168*129280 =
    # 5,560,074,240 -> 249,812,054,016
    m = load_model("deepseek-v3")
    assert megatron_flops_per_token(m, 4096) == pytest.approx(249_812_054_016, 1e-9)
    # one MTP layer: + an MoE layer's MLP 6*h*55,296 = 2,378,170,368, its attention
    # 6*(187,107,328 + 83,886,080) = 1,625,960,448, norms + eh proj 6*(3h + 2h^2) = 616,691,712, logits again
    with_mtp = 249_812_054_016 + 2_378_170_368 + 1_625_960_448 + 616_691_712 + 5_560_074_240
    assert megatron_flops_per_token(m, 4096, mtp_layers=1) == pytest.approx(with_mtp, 1e-9)


def test_step_time_from_tflops():
    # 256 x 4096 tokens at 82.93 GFLOP each on 64 GPUs at 438 TFLOP/s
    t = step_time_from_tflops(438.0, 82_927_681_536, 256, 4096, 64)
    assert t == pytest.approx(256 * 4096 * 82_927_681_536 / (438e12 * 64))
    assert t == pytest.approx(3.102, abs=1e-3)


def test_2024_form_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="MLA"):
        megatron_flops_per_token(load_model("deepseek-v3"), 4096, form="2024")


@pytest.mark.parametrize("row,mtp", [("E0002", 1), ("E0040", 1), ("E0019", 0), ("E0047", 0),
                                     ("E0031", 0), ("E0205", 0), ("E0255", 0), ("E0256", 0)])
def test_reproduces_the_published_tflops_over_tokens(row, mtp):
    """TFLOP/s over tokens/s of a row is the formula's FLOP per token (within the rounding)."""
    from validation.validate_moe import flop_convention, model_from_row

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    r = df.loc[row]
    form, m = flop_convention(r)
    assert (form, m) == ("2025", mtp)
    implied = r["tflops_per_gpu"] * 1e12 / r["tokens_per_sec_per_gpu"]
    f = megatron_flops_per_token(model_from_row(r), int(r["seq_len"]), tp=int(r["tensor_parallel"]),
                                 mtp_layers=m, form=form)
    assert f == pytest.approx(implied, rel=0.004)


def test_tflops_only_rows_are_expressed():
    from validation.validate_moe import flop_convention, moe_case_from_row

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    assert flop_convention(df.loc["E0247"]) == ("2024", 0)  # Megatron-LM MoE README, v0.8
    assert flop_convention(df.loc["E0249"]) == ("2025", 0)  # no MTP in the launch script
    assert flop_convention(df.loc["E0001"]) == ("2025", 1)  # Megatron-Bridge DeepSeek-V3
    c = moe_case_from_row(df.loc["E0247"])
    assert c.measured_step_s == pytest.approx(3.102, abs=1e-3)
