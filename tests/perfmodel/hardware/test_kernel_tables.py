"""Published kernel tables (hardware_specs/kernels): measured points reproduced, layouts mapped
as the source names them, used only for their GPU and dtype, and reported where absent."""

import numpy as np
import pytest

from benchmarks.import_simumax_gemm import forward_shape
from perfmodel.compute.layer import sustained_calibration, sustained_gemm_fraction
from perfmodel.core.errors import SpecError
from perfmodel.hardware.calibration import calibration_for
from perfmodel.hardware.kernel_tables import (
    gemm_table,
    kernel_table_notes,
    read_gemm_table,
    with_gemm_table,
)
from perfmodel.hardware.profile import EfficiencyProfile
from perfmodel.spec.specs import load_gpu

B200 = load_gpu("b200")


def test_simumax_layouts_map_to_the_forward_shape():
    # Llama 3 70B qkv (8192 -> 10240 features) on 4096 tokens, as SimuMax keys its three GEMMs
    assert forward_shape(4096, 8192, 10240, "TN") == (4096, 10240, 8192, "fwd")
    assert forward_shape(4096, 10240, 8192, "NN") == (4096, 10240, 8192, "dgrad")
    assert forward_shape(10240, 4096, 8192, "NT") == (4096, 10240, 8192, "wgrad")


@pytest.mark.parametrize("layout, measured", [("fwd", 0.6452), ("dgrad", 0.4980),
                                               ("wgrad", 0.5979)])
def test_b200_bf16_gemm_reproduces_the_published_points(layout, measured):
    """SimuMax b200_bf16_ceperm.json: m=4096, k=8192, n=10240 TN 0.64516, the NN and NT
    GEMMs of the same layer 0.49804 and 0.59795 (roofline far away: 687 GFLOP on 319 MB)."""
    cal = sustained_calibration(B200, None, "fused", "bf16")
    eff = cal.gemm_efficiency(4096, 10240, 8192, layout)
    assert float(eff) == pytest.approx(measured, abs=1e-4)
    assert "b200-bf16-gemm.csv" in cal.source


def test_table_prices_only_its_dtype():
    """fp8 runs on B200 keep the transferred H200 table times the fitted sustained fraction."""
    assert gemm_table(B200, "fp8") is None and gemm_table(B200, "fp16") is not None
    fp8 = sustained_calibration(B200, None, "fused", "fp8")
    old = calibration_for(B200, None, gemm_scale=sustained_gemm_fraction(B200))
    shape = (np.array([4096.0, 16384.0]), np.array([10240.0, 4096.0]), np.array([8192.0, 2048.0]))
    assert np.array_equal(fp8.gemm_efficiency(*shape), old.gemm_efficiency(*shape))


def test_measured_gpu_keeps_its_own_calibration():
    h200 = load_gpu("h200-sxm-141gb")
    assert sustained_calibration(h200, None, "fused", "bf16") is calibration_for(h200)
    assert gemm_table(load_gpu("h100-sxm5-80gb"), "bf16") is None


def test_profile_scales_the_table():
    """A profile's gemm_16bit multiplies the published efficiency: 0.6452 x 1.2 = 0.7742."""
    prof = EfficiencyProfile(gemm_16bit=1.2)
    cal = sustained_calibration(B200, prof.calibration(calibration_for(B200), "bf16"), "fused",
                                "bf16")
    assert float(cal.gemm_efficiency(4096, 10240, 8192)) == pytest.approx(0.6452 * 1.2, abs=1e-4)
    assert with_gemm_table(calibration_for(B200), gemm_table(B200, "bf16")) is with_gemm_table(
        calibration_for(B200), gemm_table(B200, "bf16"))  # built once


def test_notes_say_where_no_table_exists():
    src = calibration_for(B200).source
    assert kernel_table_notes(B200, "bf16", src)[0].startswith("GEMM bf16: measured table")
    fp8 = kernel_table_notes(B200, "fp8", src)
    assert fp8[0].startswith("no measured kernel table for B200 fp8")
    assert "low-precision ratio" in fp8[0]
    assert fp8[1].startswith("no measured kernel table for B200 attention")
    h200 = load_gpu("h200-sxm-141gb")
    assert kernel_table_notes(h200, "bf16", calibration_for(h200).source)[0].startswith(
        "kernels: measured on this GPU")


def test_bad_table_is_refused_with_one_line(tmp_path):
    p = tmp_path / "x-bf16-gemm.csv"
    p.write_text("gpu,dtype,peak_tflops,m,n,k,layout,efficiency\nX,bf16,1,1,1,1,fwd,1.5\n")
    with pytest.raises(SpecError, match=r"efficiency outside \(0, 1\]"):
        read_gemm_table(p)
    p.write_text("gpu,dtype,m\nX,bf16,1\n")
    with pytest.raises(SpecError, match="missing columns"):
        read_gemm_table(p)


def test_a100_pcie_table_serves_a_gpu_of_that_name():
    """SimuMax a100_pcie.json: m=4096, k=5120, n=1536 TN 0.788 (of 312 TFLOP/s); no shipped
    preset has that name, so the A100-SXM4 keeps the transferred curve."""
    sxm = load_gpu("a100-sxm4-80gb")
    pcie = sxm.model_copy(update={"name": "A100-PCIe-80GB"})
    assert gemm_table(sxm, "bf16") is None
    cal = sustained_calibration(pcie, None, "fused", "bf16")
    assert float(cal.gemm_efficiency(4096, 1536, 5120)) == pytest.approx(0.788, abs=5e-4)
