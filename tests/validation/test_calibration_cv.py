"""Cross-validated calibration on the dev split, against its targets.

Per group (one source and release on one GPU type and precision), ``plan calibrate`` is fitted
on two rows, the smallest- and the largest-GPU-count one, and predicts the group's other rows.
This measures calibrated error, so it holds as long as the profile's parameters stay physical
when the base model changes.
"""

from __future__ import annotations

import pytest

from validation.calibrate import cross_validate

#: Groups above the 8 % per-group target, with why, and the calibrated MAPE they must stay under
#: (the measured value plus 0.2-0.3 pt: 9.7, 9.1, 9.8 %, with the unfused weight-gradient staging of
#: the Megatron-FSDP rows). Each is a per-model miss of the base model that no cluster-wide
#: efficiency expresses. The three Megatron-Bridge FP8 groups hold out one row each (three rows, two
#: to calibrate on); even fitted in-sample on all three rows with every profile parameter free, the
#: exact fit needs values far outside the bounds (GB300: scale_up_bw 0.001 and scale_out_bw 3.0;
#: H100: gemm_16bit 1.9-2.4 and both bandwidths 0.04-0.13), because the three runs are 92-98 %
#: compute and move alike under every parameter (d log t / d log gemm_fp8 0.57-0.80, every bandwidth
#: <= 0.05). Megatron-LM README 2020 A100 is within the target (7.0 %) with its 1024-GPU row priced
#: with 2-byte gradients and the clusters' NCCL protocol efficiency rather than the datasheet NVLink
#: rate (fp16_grads_in_fp16, protocol_efficiency).
KNOWN_OVER_8 = {
    # the calibration rows (R0154 8B, R0157 405B) are predicted slow, the held-out Llama 3 70B
    # (R0156, Megatron-FSDP on 64 GPUs) fast: a uniform correction makes it worse (8.0 -> 10.7 %).
    # R0156 is a release-specific outlier, not a base-model term: the same recipe (GB300, FP8,
    # GBS 256, MBS 2, FSDP 64) ran at 5003 tokens/s/GPU in the 26.02 table of the same page
    # (Megatron-Bridge docs/performance-summary-archive.md), +10.7 % over 25.11's 4520, and the
    # base model predicts 4913 (-1.8 % from 26.02). Within 25.11, GB300 is 1.19x / 1.21x GB200
    # on the 8B rows but 1.048x on this 70B row, with the same config on both parts: no speed-up
    # per kernel class explains both (the 8B row is 19 % 16-bit attention / 66 % fp8 GEMM / 18 %
    # memory-bound, the 70B 12 / 77 / 11 %, HBM equal: solving for the two rates gives a negative
    # attention time).
    # (10.7 -> 10.5 % since perfmodel.compute.quantise; 10.5 -> 10.8 % since perfmodel.comm.cp_ring: the
    # ring's bookkeeping kernels make the cp 2 calibration row R0157 0.9 % slower still, and the
    # uniform correction carries that onto R0156)
    # (10.8 -> 9.7 % since compute.unfused_grad_accumulation_bytes: Megatron-Bridge's
    # Megatron-FSDP configs turn gradient_accumulation_fusion off, so R0156 pays one copy of
    # every 16-bit weight gradient into the main-grad buffer per micro-batch, -8.7 -> -7.6 %
    # uncalibrated; the calibration rows are DDP and do not move)
    "NVIDIA Megatron-Bridge performance summary | NeMo 25.11 / Megatron-Bridge + Megatron-Core "
    "| GB300 | fp8": 0.100,
    # Llama 3 70B FP8 on 64 H100 (t4 p8 v5) is predicted 11-12 % slow in both releases while
    # the calibration rows disagree in sign (8B slow, 405B fast): the fit stays near neutral
    # (10.9 -> 10.3 %, 12.0 -> 10.9 %). The 70B's measured step (10.23 s, 64 micro-batches) is
    # shorter than the modelled work of its last pipeline rank alone (64 x 172.5 ms = 11.04 s:
    # 10 layers at 15.0 ms and the bf16 output layer + loss at 23 ms), so the base model
    # over-prices that rank's kernels by >= 6 % (>= 5 % on the 8B row too, 597 vs <= 567 ms per
    # micro-batch), while the 1024-GPU 405B row is 2-6 % slower than modelled; the same 70B
    # recipe ran at 1602 / 1619 / 1621 tokens/s/GPU in 25.11 / 25.09 / 26.02 (not noise).
    # Probes: the Bridge 25.x recipes defer the output-layer weight gradient to the pipeline
    # flush (recipes/llama/llama3_70b.py defer_embedding_wgrad_compute=True,
    # wgrad_deferral_limit=22; llama31_405b.py the same with 50 of 64 micro-batches): ~1.4 %
    # off the 70B and the 405B alike, no net change; TE userbuffers ring-exchange running the
    # AG/RS GEMMs as tp chunks of m/tp rows (tile model): 405B -5.6 -> -0.3 %, but 70B 10.9 ->
    # 12.0 %, CV 10.3 -> 9.3 % / 10.9 -> 9.2 %, dense MAPE 3.7 -> 4.4 % (NeMo 24.09 405B FP8
    # +12-16 %); GEMM efficiency flattened over the H200 table's shape noise: 8B / 70B / 405B
    # +9.5 / +9.3 / -5.2 % (the pattern stays).
    # Since perfmodel.compute.quantise (TE's casts on the sequence-parallel rows, delayed scaling's
    # cast inside the norm): 10.3 -> 9.3 % (25.11), 10.9 -> 10.2 % (25.09). Also probed for
    # FP8 (docs/compute.md "The measured FP8 speed-up"): each userbuffer collective
    # hidden by its own GEMM (<= 0.02 ms a layer exposed), the amax all-reduce per autocast
    # region, first_last_layers_bf16 (off in the Bridge performance recipes); none separates
    # the 70B from the 8B / 405B rows.
    # Per-shape fp8 GEMM prices (docs/compute.md "FP8 GEMM efficiency by shape: probed, not
    # adopted"; benchmarks/fp8_shape_probe.py): the published H800 fp8 kernel tables (DeepGEMM,
    # tile-lang) show a per-tile fixed cost that does not halve at the fp8 rate (fp8 / bf16 speed-up
    # 1.5-2.0 at K = 2048 against 2.0-2.2 at K >= 4096); priced so
    # (compute.low_precision_tile_factor, k0 = 350 fp8-K units, shipped on Hopper; 800 probed) the
    # three models move alike (their reductions all span 2048-16384), 9.3 -> 9.2 %, 10.2 -> 10.0 %;
    # Hopper's TN-only fp8 GEMMs at the H200 table's TN op: 8.5 % / 9.2 %, but the dense MAPE 3.54
    # -> 3.61 % (per-layout table noise, not adopted); fp8-cs vs fp8-delayed: -2.2 / -1.3 / -0.9 %
    # on 8B / 70B / 405B. The 405B shapes (t8 cp2) are +5-6 % in DGX Cloud NeMo 24.09 and -5 to -8 %
    # here: the gap is per release at one shape, not a GEMM rate.
    # The Megatron-Bridge FP8 groups (docs/compute.md): the 8B calibration
    # row is Megatron-FSDP, whose unfused weight-gradient staging makes it 1.5 % slower
    # (+8.6 -> +10.1 %, +5.8 -> +7.3 %); the uniform correction moves a little further
    # (9.3 -> 9.1 %, 10.1 -> 9.8 %). The 70B is also 5-11 % slow against the same layout's
    # NeMo 24.09 neighbour (t4 p4 v5 cp2, -4 %): Bridge's t4 p8 v5 cp1 ran 9 % faster than
    # 24.09's t4 p4 v5 cp2 where the model puts it 6 % slower (the last stage's bf16 output
    # layer + loss, 23 ms on 148 ms of layers, paces 8 stages more than 4).
    "NVIDIA Megatron-Bridge performance summary | NeMo 25.11 / Megatron-Bridge + Megatron-Core "
    "| H100 | fp8": 0.093,
    "NVIDIA Megatron-Bridge performance summary | NeMo 25.09 / Megatron-Bridge + Megatron-Core "
    "| H100 | fp8": 0.100,
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
    # target: 4 % (3.40 % uncalibrated -> 3.32 % calibrated)
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
@pytest.mark.xfail(reason="three groups the base model cannot express (KNOWN_OVER_8)", strict=True)
def test_every_group_at_most_8_percent(cv):
    groups, _ = cv
    assert (groups[groups.held_out > 0].mape_after <= 0.08).all()


@pytest.mark.slow
def test_shipped_profiles_still_improve_their_era():
    """Each shipped era profile lowers the MAPE of the rows it was fitted on. Fails when the base
    model changes enough that the profiles are stale: refit with ``python -m validation.calibrate``."""
    import numpy as np

    from perfmodel.hardware.profile import EfficiencyProfile, load_profile
    from validation.calibrate import ERAS, _predict, dev_cases, era_of

    df, cases = dev_cases()
    eras = [era_of(r) for _, r in df.iterrows()]
    for era, _ in ERAS:
        sel = [c for c, e in zip(cases, eras, strict=True) if e == era]
        meas = np.array([c.measured_step_s for c in sel])
        before = np.abs(_predict(sel, EfficiencyProfile()) / meas - 1).mean()
        after = np.abs(_predict(sel, load_profile(era)) / meas - 1).mean()
        assert after < before, (era, before, after)
