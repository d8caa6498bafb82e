"""The measured fp8 GEMM table (``gemm_fp8.csv``): the calibration script's fp8 part, its
loading (perfmodel.hardware.calibration) and its use for per-tensor fp8 GEMMs (perfmodel.compute.layer)."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hardware_specs import calibration_dir
from perfmodel.compute import layer as compute
from perfmodel.hardware.calibration import FP8_GEMM_FILE, LAYOUTS, load_calibration
from perfmodel.parallel.config import ConfigBatch, ParallelConfig
from perfmodel.spec.specs import TrainingSpec, load_gpu, load_model

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "calibrate_gpu.py"
H200, H100, B200 = load_gpu("h200-sxm-141gb"), load_gpu("H100-SXM5-80GB"), load_gpu("B200")
DISPATCH_S = 8e-6  # calibration.BENCH_DISPATCH_S, subtracted from both times
BATCH = ConfigBatch.from_configs([ParallelConfig(dp=1, tp=4, pp=1, micro_batch_size=1,
                                                 num_microbatches=64, sequence_parallel=True)])


def _training(precision="fp8", recipe="fp8-delayed"):
    return TrainingSpec(global_batch_size=64, seq_len=8192, precision=precision,
                        low_precision_recipe=recipe if precision == "fp8" else None)


def _folder_with(tmp_path, ratio_of_k):
    """The shipped h200 folder plus a synthetic gemm_fp8.csv on a 2x2x2 grid per layout:
    bf16 1 ms, fp8 ``ratio_of_k(k)`` ms (both plus the dispatch time)."""
    d = tmp_path / "h200"
    shutil.copytree(calibration_dir("h200"), d)
    rows = [{"tokens": m, "hidden": 0, "tp": 1, "op": "x", "layout": lay, "m": m, "n": n, "k": k,
             "seconds": DISPATCH_S + ratio_of_k(k) * 1e-3, "tflops": 0.0,
             "bf16_seconds": DISPATCH_S + 1e-3, "bf16_tflops": 0.0}
            for lay in LAYOUTS for m in (2048, 8192) for n in (2048, 8192) for k in (1024, 4096)]
    pd.DataFrame(rows).to_csv(d / FP8_GEMM_FILE, index=False)
    return d


def _gemm_phase_s(model, training, gpu, cal, layouts=LAYOUTS, batch=BATCH, skip=()):
    """Device time of one layer's linear GEMMs (compute._gemm_phase) under ``cal``."""
    c = compute._layer_context(model, training, gpu, batch, cal, False)
    ph = compute._Phase(cal, len(batch))
    compute._gemm_phase(c, ph, layouts, skip)
    return ph.gpu_s[0], c


# ---- (a) the script's fp8 part, smoke mode on the CPU

def _load_script(out, monkeypatch):
    monkeypatch.setenv("OUT", str(out))  # the script creates its OUT folder on import
    spec = importlib.util.spec_from_file_location("calibrate_gpu_fp8", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.torch
def test_smoke_run_writes_a_table_the_calibration_loads(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), CUDA_VISIBLE_DEVICES="")
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--parts", "fp8"], env=env,
                   check=True, capture_output=True, timeout=120)
    df = pd.read_csv(out / FP8_GEMM_FILE)
    n_shapes = len(_load_script(tmp_path / "unused", monkeypatch).fp8_shapes(True))
    assert len(df) == 3 * n_shapes
    assert {"seconds", "bf16_seconds", "a_dtype", "b_dtype"} <= set(df.columns)
    assert (df["seconds"] > 0).all() and (df["bf16_seconds"] > 0).all()
    assert set(df[df["layout"] != "fwd"]["a_dtype"]) == {"float8_e5m2"}  # HYBRID gradients
    d = tmp_path / "h200"
    shutil.copytree(calibration_dir("h200"), d)
    shutil.copy(out / FP8_GEMM_FILE, d)
    cal = load_calibration(d)
    assert cal.gemm_fp8_generation == "hopper"
    r = cal.fp8_time_ratio(df["m"], df["n"], df["k"], "fwd")
    assert np.isfinite(r).all() and (r > 0).all()


def test_fp8_cases_are_the_models_layer_gemms(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    cases = {c[0]: c for c in _load_script(tmp_path, monkeypatch).FP8_CASES}
    for case, name, ep in (("llama3.1-8b tp1", "llama3.1-8b", 1),
                           ("llama3.1-70b tp4", "llama3.1-70b", 1),
                           ("llama3.1-405b tp8 cp2", "llama3.1-405b", 1),
                           ("nemotron4-340b tp8", "nemotron4-340b", 1),
                           ("moe h4096 ffn1536 rows1024", "qwen3-235b-a22b", 128)):
        _, tokens, hidden, tp, ops = cases[case]
        model = load_model(name)
        assert model.hidden_size == hidden
        etp = 1 if model.is_moe else None
        got = {g[0]: (float(np.ravel(g[2])[0]), float(np.ravel(g[3])[0]))
               for g in compute.layer_gemms(model, tokens, tp, ep, etp, tokens)}
        for op, n, k in ops:
            assert got[op] == (n, k), (case, op)


# ---- (b) a synthetic table prices the fp8 GEMMs

def test_ratio_interpolates_in_log_space(tmp_path):
    cal = load_calibration(_folder_with(tmp_path, lambda k: 0.5 if k == 1024 else 0.8))
    for lay in LAYOUTS:
        # a measured point, half-way in log2 k (exp of the mean log), beyond the hull (nearest)
        r = cal.fp8_time_ratio([2048, 4096, 8192], [2048, 4096, 8192], [1024, 2048, 16384], lay)
        assert r == pytest.approx([0.5, np.sqrt(0.4), 0.8], rel=1e-9)
    assert float(cal.fp8_time_ratio(4096, 4096, 2048)) == pytest.approx(0.63246, abs=1e-5)


def test_fp8_gemm_time_is_the_ratio_times_bf16(tmp_path):
    cal = load_calibration(_folder_with(tmp_path, lambda k: 0.5 if k == 1024 else 0.8))
    peak16 = H200.peak_flops("bf16")
    t16 = compute.gemm_time_s(cal, 4096, 4096, 2048, "dgrad", peak16)
    t8 = compute.fp8_table_gemm_time_s(cal, 4096, 4096, 2048, "dgrad", peak16)
    assert float(t8) == pytest.approx(np.sqrt(0.4) * float(t16), rel=1e-9)
    g16 = compute.grouped_gemm_time_s(cal, 4, 2048, 2048, 4096, "wgrad", peak16)
    g8 = compute.fp8_table_gemm_time_s(cal, 2048, 2048, 4096, "wgrad", peak16, groups=4)
    assert float(g8) == pytest.approx(0.8 * float(g16), rel=1e-9)


@pytest.mark.parametrize("gpu", [H200, H100], ids=["h200", "h100-transferred"])
def test_layer_gemms_take_the_measured_ratio(tmp_path, gpu):
    # constant measured ratio 0.7: every fp8 layer GEMM takes 0.7 x its bf16 time (the fitted
    # path would give 0.5 / 0.85 x the tile factor, 0.59-0.66 for this layer)
    cal = load_calibration(_folder_with(tmp_path, lambda k: 0.7))
    if gpu is H100:
        cal = compute.sustained_calibration(H100, cal.scaled_to(H100))
        assert cal.gemm_scale < 1.0  # the bf16 transfer (MAMF, sustained fraction) applies
    model = load_model("llama3.1-70b")
    t8, c = _gemm_phase_s(model, _training(), gpu, cal)
    t16, _ = _gemm_phase_s(model, _training("bf16"), gpu, cal)
    assert c.pr.fp8_table
    assert t8 == pytest.approx(0.7 * t16, rel=1e-9)


def test_grouped_expert_gemms_take_the_measured_ratio(tmp_path):
    # MoE: the routed experts' grouped GEMMs (with the multi-stream slowdown) at 0.7 x bf16
    cal = compute.sustained_calibration(
        H100, load_calibration(_folder_with(tmp_path, lambda k: 0.7)).scaled_to(H100))
    model = load_model("qwen3-30b-a3b")
    batch = ConfigBatch.from_configs([ParallelConfig(dp=8, tp=1, pp=1, ep=8, etp=1,
                                                     micro_batch_size=1, num_microbatches=8)])
    dense = tuple(g[0] for g in compute.layer_gemms(model, 4096, 1) if not
                  g[0].startswith("expert_"))
    t8, c = _gemm_phase_s(model, _training(), H100, cal, batch=batch, skip=dense)
    t16, _ = _gemm_phase_s(model, _training("bf16"), H100, cal, batch=batch, skip=dense)
    assert c.pr.fp8_table and t16 > 0
    assert t8 == pytest.approx(0.7 * t16, rel=1e-9)


def test_table_is_for_per_tensor_fp8_on_its_generation_only(tmp_path):
    cal = load_calibration(_folder_with(tmp_path, lambda k: 0.7))
    assert compute.fp8_table_applies(_training("fp8", "fp8-cs"), H100, cal)
    assert not compute.fp8_table_applies(_training("fp8", "fp8-block"), H100, cal)
    assert not compute.fp8_table_applies(_training("fp8", "fp8-delayed"), B200, cal)
    assert not compute.fp8_table_applies(_training("fp8", "mxfp8"), B200, cal)
    assert not compute.fp8_table_applies(_training("bf16"), H100, cal)


def test_step_times_follow_the_table(tmp_path):
    model, tr = load_model("llama3.1-70b"), _training()
    fast = load_calibration(_folder_with(tmp_path / "a", lambda k: 0.5))
    slow = load_calibration(_folder_with(tmp_path / "b", lambda k: 0.7))
    t = [compute.compute_times(model, tr, H200, BATCH, calibration=cal)["layer_bwd_s"][0]
         for cal in (fast, slow, None)]
    assert t[0] < t[1] and t[2] not in (t[0], t[1])


# ---- (c) without the file: exactly the fitted formula

def test_shipped_h200_has_no_fp8_table():
    cal = load_calibration("h200")
    assert cal.gemm_fp8_points is None and cal.gemm_fp8_generation is None
    assert not (calibration_dir("h200") / FP8_GEMM_FILE).exists()
    with pytest.raises(ValueError, match="no fp8 GEMM table"):
        cal.fp8_time_ratio(8192, 8192, 8192)


@pytest.mark.parametrize("gpu", [H200, H100, B200], ids=["h200", "h100", "b200"])
@pytest.mark.parametrize("recipe", ["fp8-delayed", "fp8-cs"])
def test_without_the_table_times_are_the_fitted_formula(gpu, recipe):
    model, tr = load_model("llama3.1-70b"), _training("fp8", recipe)
    cal = compute.sustained_calibration(gpu)
    got, c = _gemm_phase_s(model, tr, gpu, cal, ("fwd", "dgrad", "wgrad"))
    assert not c.pr.fp8_table
    peak8 = gpu.peak_flops("fp8")
    ratio = compute.LOW_PRECISION_GEMM_RATIO * compute.LOW_PRECISION_RECIPES[recipe].gemm_ratio
    want = np.zeros(1)
    for _, m, n, k, count in c.gemms:
        for lay in ("fwd", "dgrad", "wgrad"):
            want = want + (count * compute.gemm_time_s(cal, m, n, k, lay, peak8, ratio)
                           * compute.low_precision_tile_factor(m, n, k, lay, gpu))
    assert got == want[0]  # bit-identical, not approximately
