"""Cross-validated calibration on the dev split (issue 17 targets).

Per group (one source and release on one GPU type and precision), ``plan calibrate`` is fitted
on two rows, the smallest- and the largest-GPU-count one, and predicts the group's other rows.
This measures calibrated error, so it holds as long as the profile's parameters stay physical
when the base model changes.
"""

from __future__ import annotations

import pytest

from search.calibrate import cross_validate

#: Groups above the 8 % per-group target, with why, and the calibrated MAPE they must stay
#: under. Each is a per-model miss of the base model that no cluster-wide efficiency expresses.
#: The three Megatron-Bridge FP8 groups hold out one row each (three rows, two to calibrate
#: on); even fitted in-sample on all three rows with every profile parameter free, the exact
#: fit needs values far outside the bounds (GB300: scale_up_bw 0.001 and scale_out_bw 3.0; H100:
#: gemm_16bit 1.9-2.4 and both bandwidths 0.04-0.13), because the three runs are 92-98 %
#: compute and move alike under every parameter (d log t / d log gemm_fp8 0.57-0.80, every
#: bandwidth <= 0.05).
KNOWN_OVER_8 = {
    # the calibration rows (R0154 8B, R0157 405B) are predicted slow, the held-out Llama 3 70B
    # (R0156, FSDP on 64 GPUs) fast: a uniform correction makes it worse (8.0 -> 10.7 %)
    "NVIDIA Megatron-Bridge performance summary | NeMo 25.11 / Megatron-Bridge + Megatron-Core "
    "| GB300 | fp8": 0.115,
    # Llama 3 70B FP8 on 64 H100 (t4 p8 v5) is predicted 11-12 % slow in both releases while
    # the calibration rows disagree in sign (8B slow, 405B fast): the fit stays near neutral
    # (10.9 -> 10.3 %, 12.0 -> 10.9 %)
    "NVIDIA Megatron-Bridge performance summary | NeMo 25.11 / Megatron-Bridge + Megatron-Core "
    "| H100 | fp8": 0.115,
    "NVIDIA Megatron-Bridge performance summary | NeMo 25.09 / Megatron-Bridge + Megatron-Core "
    "| H100 | fp8": 0.12,
    # Megatron-LM README 2020 on A100 (read as the 40 GB part): the calibration rows disagree
    # in sign (R0037 1 GPU -7 %, R0044 1024 GPUs t8 +10 %) while the six held-out rows are all
    # predicted 4-13 % fast: the fit stays near neutral (9.1 -> 9.5 %)
    "NVIDIA/Megatron-LM README | Megatron-LM (2020) | A100 | 16-bit": 0.105,
}


@pytest.fixture(scope="module")
def cv():
    return cross_validate()


@pytest.mark.slow
def test_cross_validated_mape_at_most_4_percent(cv):
    groups, rows = cv
    before = rows["error_before"].abs().mean()
    after = rows["error_after"].abs().mean()
    print(f"\nCV over {len(rows)} held-out rows in {int((groups.held_out > 0).sum())} groups: "
          f"MAPE uncalibrated {before:.1%} -> calibrated on 2 rows/group {after:.1%}")
    for g in groups[groups.held_out > 0].itertuples():
        print(f"  {g.mape_before:6.1%} -> {g.mape_after:6.1%}  ({g.held_out:2d} rows)  {g.group}")
    # issue 17's target: 4 % (achieved: 3.7 % uncalibrated -> 3.7 %, since the DeepSpeed
    # ZeRO-3 rows follow perfmodel.zero3_deepspeed; before it 4.2 -> 4.0 %)
    assert after <= 0.04
    assert after < before


@pytest.mark.slow
def test_no_group_above_8_percent(cv):
    groups, _ = cv
    scored = groups[groups.held_out > 0]
    for g in scored.itertuples():
        if g.group in KNOWN_OVER_8:
            assert g.mape_after <= KNOWN_OVER_8[g.group], (g.group, g.mape_after)
        else:
            assert g.mape_after <= 0.08, (g.group, g.mape_after)


@pytest.mark.slow
@pytest.mark.xfail(reason="four groups the base model cannot express (KNOWN_OVER_8)", strict=True)
def test_every_group_at_most_8_percent(cv):
    groups, _ = cv
    assert (groups[groups.held_out > 0].mape_after <= 0.08).all()


@pytest.mark.slow
def test_shipped_profiles_still_improve_their_era():
    """Each shipped era profile lowers the MAPE of the rows it was fitted on. Fails when the base
    model changes enough that the profiles are stale: refit with ``python -m search.calibrate``."""
    import numpy as np

    from perfmodel.profile import EfficiencyProfile, load_profile
    from search.calibrate import ERAS, _predict, dev_cases, era_of

    df, cases = dev_cases()
    eras = [era_of(r) for _, r in df.iterrows()]
    for era, _ in ERAS:
        sel = [c for c, e in zip(cases, eras, strict=True) if e == era]
        meas = np.array([c.measured_step_s for c in sel])
        before = np.abs(_predict(sel, EfficiencyProfile()) / meas - 1).mean()
        after = np.abs(_predict(sel, load_profile(era)) / meas - 1).mean()
        assert after < before, (era, before, after)
