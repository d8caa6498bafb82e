"""Expert-parallel training of a tiny MoE on CPU gloo (ep = 2): the all-to-all bytes the ranks
send equal the planner's prediction, and the losses equal the single-process run."""

import pytest


def test_prediction_by_hand():
    from harness.moe_ep import MoEHarnessConfig, predicted_a2a_bytes

    # T = 2*16 tokens per rank, k = 2, h = 32, fp32: 8192-byte buffer, half leaves the rank;
    # 4 exchanges (dispatch, combine, and their gradients) x 2 MoE layers
    assert predicted_a2a_bytes(MoEHarnessConfig()) == 4 * 2 * 4096


@pytest.mark.slow
def test_ep2_bytes_and_loss_match():
    from harness.moe_ep import run

    res = run()
    pred = res["predicted_a2a_bytes_per_step"]
    for measured in res["a2a_bytes_per_step"]:
        assert measured == pytest.approx(pred, rel=0.01)
    assert res["losses"] == pytest.approx(res["single_losses"], abs=1e-5)
