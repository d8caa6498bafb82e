"""Cross-validated calibration on the dev split (issue 17 targets).

Per group (one source and release on one GPU type and precision), ``plan calibrate`` is fitted
on two rows, the smallest- and the largest-GPU-count one, and predicts the group's other rows.
This measures calibrated error, so it holds as long as the profile's parameters stay physical
when the base model changes.
"""

from __future__ import annotations

import pytest

from search.calibrate import cross_validate

#: Groups above the 8 % per-group target today, with why (the base model misses something that
#: no cluster-wide efficiency can express); each must still not get worse than uncalibrated.
KNOWN_OVER_8 = {
    # ZeRO-3 rows: 174.6B at 1536 GPUs is predicted 16 % slow while 529.6B rows are 17-19 %
    # fast: the ZeRO-3 gather model, not an efficiency.
    "Narayanan et al. 2021 | Megatron-LM (2021) / DeepSpeed ZeRO-3 [DeepSpeed] | A100 | 16-bit",
    # the two calibration rows (Llama2-7B, GPT-3 175B @ 512) are already within 1 %; the others
    # (large-vocabulary Nemotron / Llama 3, GPT-3 at micro-batch 1) are 4-14 % fast.
    "NVIDIA NeMo Framework performance summary | NeMo 24.07 | H100 | fp8",
}


@pytest.fixture(scope="module")
def cv():
    return cross_validate()


@pytest.mark.slow
@pytest.mark.xfail(reason="issue 13 refit the base model (uncalibrated held-out MAPE 4.3 %, "
                   "calibrated on 2 rows/group 4.2 %); 2-row calibration now overfits the "
                   "one-row Megatron-Bridge groups and NeMo 24.07: issue 17's targets need a "
                   "re-tune against the new base", strict=False)
def test_cross_validated_mape_at_most_4_percent(cv):
    groups, rows = cv
    before = rows["error_before"].abs().mean()
    after = rows["error_after"].abs().mean()
    print(f"\nCV over {len(rows)} held-out rows in {int((groups.held_out > 0).sum())} groups: "
          f"MAPE uncalibrated {before:.1%} -> calibrated on 2 rows/group {after:.1%}")
    for g in groups[groups.held_out > 0].itertuples():
        print(f"  {g.mape_before:6.1%} -> {g.mape_after:6.1%}  ({g.held_out:2d} rows)  {g.group}")
    assert after <= 0.04
    assert after < before


@pytest.mark.slow
@pytest.mark.xfail(reason="issue 13 refit the base model (uncalibrated held-out MAPE 4.3 %, "
                   "calibrated on 2 rows/group 4.2 %); 2-row calibration now overfits the "
                   "one-row Megatron-Bridge groups and NeMo 24.07: issue 17's targets need a "
                   "re-tune against the new base", strict=False)
def test_no_group_above_8_percent(cv):
    groups, _ = cv
    scored = groups[groups.held_out > 0]
    for g in scored.itertuples():
        if g.group in KNOWN_OVER_8:
            assert g.mape_after <= g.mape_before + 1e-9, g.group
        else:
            assert g.mape_after <= 0.08, (g.group, g.mape_after)


@pytest.mark.slow
@pytest.mark.xfail(reason="two groups the base model cannot express (KNOWN_OVER_8)", strict=False)
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
