"""Transformer Engine's quantisation casts where TE runs them (perfmodel.compute.quantise), by hand."""

import numpy as np
import pytest

from perfmodel.compute import layer as compute
from perfmodel.compute import quantise
from perfmodel.spec.specs import load_gpu
from validation.validate import precision_from_text

R = compute.LOW_PRECISION_RECIPES
H100, B200 = load_gpu("H100-SXM5-80GB"), load_gpu("B200")


def test_transpose_copy_only_on_tn_only_gpus():
    assert quantise.transpose_copy_needed(H100)
    assert not quantise.transpose_copy_needed(B200)


def test_norm_fed_gathered_operand_docstring_example():
    # Llama 3 70B fc1 input, H100, tp 4 + SP: 2048 local of 8192 rows, 8192 columns
    b, k = quantise.operand_quantise(2048, 8192, 8192, "fp8-delayed", R["fp8-delayed"], 2.0,
                                     True, True)
    assert float(b) == pytest.approx(8192 * 8192 * 2)  # transpose of the gathered fp8 data
    assert float(k) == 1
    b, k = quantise.operand_quantise(2048, 8192, 8192, "fp8-cs", R["fp8-cs"], 2.0, True, True)
    # amax read (2) + cast read (2) + fp8 write (1) on the local rows, then the transpose
    assert float(b) == pytest.approx(2048 * 8192 * 5 + 8192 * 8192 * 2)
    assert float(k) == 3


def test_unfused_local_operand_cast_transpose_on_hopper():
    # proj input, not gathered: read 2, write row-wise 1 + transposed 1 = 4 bytes per element
    b, k = quantise.operand_quantise(100, 100, 10, "fp8-delayed", R["fp8-delayed"], 2.0, True,
                                     False)
    assert float(b) == pytest.approx(4000) and float(k) == 1


def test_blackwell_tensor_scaling_writes_one_copy():
    b, k = quantise.operand_quantise(1000, 1000, 10, "fp8-cs", R["fp8-cs"], 2.0, False, False)
    assert float(b) == pytest.approx(1e4 * (2 * 2 + 1)) and float(k) == 2


def test_mxfp8_quantises_both_axes_from_16_bit():
    b, k = quantise.operand_quantise(1000, 4000, 10, "mxfp8", R["mxfp8"], 2.0, False, True)
    # 2 bytes read once, two copies of 1 + 1/32 bytes, all on the local rows (no transpose)
    assert float(b) == pytest.approx(1e4 * (2 + 2 * (1 + 1 / 32))) and float(k) == 1


GEMMS = [("qkv", 8.0, 12.0, 4.0, 1), ("proj", 8.0, 4.0, 4.0, 1), ("fc1", 8.0, 16.0, 4.0, 1),
         ("fc2", 8.0, 4.0, 8.0, 1), ("router", 8.0, 2.0, 4.0, 1)]


def test_layer_terms_by_hand_tp1():
    d = R["fp8-delayed"]
    b, k = quantise.layer_quantise_terms(GEMMS, "fp8-delayed", d, 2.0, H100, 1, False, "fwd")
    # qkv, fc1: the norms write fp8, transposes 2*8*4 each; proj 8*4*4; fc2 8*8*4; router 16-bit
    assert float(b) == pytest.approx(64 + 128 + 64 + 256) and float(k) == 4
    b, k = quantise.layer_quantise_terms(GEMMS, "fp8-delayed", d, 2.0, H100, 1, False, "bwd")
    assert float(b) == pytest.approx(4 * 8 * (12 + 4 + 16 + 4)) and float(k) == 4


def test_layer_terms_by_hand_sequence_parallel():
    d = R["fp8-delayed"]
    fwd1 = quantise.layer_quantise_terms(GEMMS, "fp8-delayed", d, 2.0, H100, 1, False, "fwd")
    fwd2 = quantise.layer_quantise_terms(GEMMS, "fp8-delayed", d, 2.0, H100, 2, True, "fwd")
    assert float(fwd2[0]) == pytest.approx(float(fwd1[0]))  # the norms write fp8 either way
    b, k = quantise.layer_quantise_terms(GEMMS, "fp8-delayed", d, 2.0, H100, np.array([2]),
                                         np.array([True]), "bwd")
    # proj / fc2 output gradients: cast of 4 local rows (3 B) + transpose of 8 rows (2 B)
    row_par = 4 * 4 * 3 + 8 * 4 * 2
    assert float(b[0]) == pytest.approx(4 * 8 * 12 + 4 * 8 * 16 + 2 * row_par)
    assert float(k[0]) == 6


def test_routed_experts_quantised_by_one_kernel():
    g = [("expert_fc1", 8.0, 16.0, 4.0, 3.0)]
    b, k = quantise.layer_quantise_terms(g, "fp8-delayed", R["fp8-delayed"], 2.0, H100, 1,
                                         False, "fwd")
    assert float(b) == pytest.approx(3 * 8 * 4 * 4) and float(k) == 1


def test_router_stays_16_bit():
    assert "router" in quantise.BF16_GEMMS
    assert not {"qkv", "proj", "fc1", "fc2", "expert_fc1"} & quantise.BF16_GEMMS


@pytest.mark.parametrize(("text", "name"), [
    ("FP8-CS (inferred)", "fp8-cs"),
    ("MXFP8 (footnote: '32x32' granularity)", "mxfp8"),
    ("FP8 (TE delayed scaling, fp8_hybrid)", "fp8-delayed"),
    ("FP8 blockwise (128x128 W / 1x128 A)", "fp8-block"),
    ("FP8 (table says 'FP8'; matched preset is FP8_CS = per-tensor current scaling)", "fp8-cs"),
    ("BF16", "bf16"),
])
def test_precision_from_text(text, name):
    assert precision_from_text(text) == name


def test_amax_reduction_s_docstring_example():
    # Grok-1 on 512 H100: m 128, vp 8, a 90 us reduction and two 2 us kernels per chunk pass
    t = quantise.amax_reduction_s(128, 8, 90e-6, 2e-6)
    assert float(t) == pytest.approx(2 * 128 * 8 * 94e-6)  # 0.192512 s


def test_amax_exposed_s_delayed_scaling_only():
    from perfmodel.comm.comm_time import all_reduce_auto_time
    from perfmodel.hardware.calibration import KERNEL_MIN_S
    from perfmodel.parallel.config import ConfigBatch, ParallelConfig
    from perfmodel.parallel.topology import group_placement
    from perfmodel.spec.specs import TrainingSpec, load_cluster
    from perfmodel.step import evaluate as step

    cluster = load_cluster("dgx-h100")
    cfg = ParallelConfig(dp=8, tp=4, pp=8, vp=8, cp=2, micro_batch_size=1,
                         num_microbatches=128, schedule="interleaved")
    b = ConfigBatch.from_configs([cfg])

    def tr(precision, recipe=None):
        return TrainingSpec(global_batch_size=1024, seq_len=8192, precision=precision,
                            low_precision_recipe=recipe)

    # the 64 ranks of a stage (tp 4 x cp 2 x dp 8, stride 1): one latency-bound all-reduce each
    ar = float(all_reduce_auto_time(np.zeros(1), group_placement(cluster, np.array([64.0]),
                                                                 np.ones(1)))[0])
    got = float(step.amax_exposed_s(tr("fp8"), cluster, b)[0])
    assert got == pytest.approx(2 * 128 * 8 * (ar + 2 * KERNEL_MIN_S))
    assert 0.0 < ar < 1e-3
    for t in (tr("bf16"), tr("fp8", "fp8-cs"), tr("fp8", "mxfp8")):
        assert float(step.amax_exposed_s(t, cluster, b)[0]) == 0.0
    assert float(step.amax_exposed_s(tr("fp8"), cluster, b, kernels="eager")[0]) == 0.0
