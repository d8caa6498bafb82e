"""Hand-computed numbers for each named term of :func:`perfmodel.step.evaluate.evaluate` and of
:func:`perfmodel.compute.layer._compute_times` (one per function; fast, no search)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from perfmodel.compute import layer as compute
from perfmodel.core.codes import Schedule
from perfmodel.hardware.calibration import KERNEL_MIN_S
from perfmodel.spec.specs import load_training
from perfmodel.step import evaluate as step


def a(*x):
    return np.array(x, dtype=np.float64)


def test_tp_exposed_s_blocking_and_overlapped():
    # blocking: all 2 ms exposed, no slowdown
    tp, slow = step.tp_exposed_s(a(2e-3), a(10e-3), False, 0.2)
    assert tp[0] == 2e-3 and slow[0] == 0.0
    # overlapped: window 5 ms hides all but the 10 % chunk (0.2 ms); hidden 1.8 ms slows the
    # GEMMs by 0.2 * min(1.8, 5) = 0.36 ms
    tp, slow = step.tp_exposed_s(a(2e-3, 8e-3), a(10e-3, 10e-3), True, 0.2)
    assert tp == pytest.approx(a(0.2e-3, 3e-3), rel=1e-12)  # 8 - 5 = 3 ms > 0.8 ms
    assert slow == pytest.approx(a(0.36e-3, 0.2 * 5e-3), rel=1e-12)


def test_cp_exposed_s():
    # cp 1: nothing. cp 4, attention 8 ms fwd / 16 ms bwd -> blocks 2 / 4 ms; sends 3 ms (K/V)
    # and 5 ms (K/V + dK/dV): forward 3 x (3-2) = 3 ms exposed, 3 x 2 = 6 ms hidden; backward
    # 2 x 0 + 2 x (5-4) = 2 ms exposed, 2 x 3 + 2 x 4 = 14 ms hidden; slowdown 0.1 x 20 ms
    model = SimpleNamespace(is_hybrid=False)
    training = SimpleNamespace(recompute_modules=("core_attn",))
    b = SimpleNamespace(cp=np.array([1, 4, 4]), recompute=np.array([0, 0, 1]),
                        cp_comm=np.zeros(3, dtype=np.int64))
    ct = {"attn_fwd_s": a(8e-3, 8e-3, 8e-3), "attn_bwd_s": a(16e-3, 16e-3, 16e-3)}
    comm = {"cp_kv_send_s": a(0.0, 3e-3, 3e-3), "cp_kv_dkv_send_s": a(0.0, 5e-3, 5e-3)}
    cp_s, slow = step.cp_exposed_s(model, training, b, ct, comm, 0.1)
    # selective recompute of core_attn re-runs the forward ring: 3 ms more exposed, 6 hidden
    assert cp_s == pytest.approx(a(0.0, 5e-3, 8e-3), rel=1e-12)
    assert slow == pytest.approx(a(0.0, 2e-3, 2.6e-3), rel=1e-12)


def test_ep_exposed_s_without_overlap():
    model = SimpleNamespace(moe_layer_fraction=0.75)
    training = SimpleNamespace(overlap_moe_comm=False)
    out = step.ep_exposed_s(model, training, None, a(1.0), a(3.0), a(10.0))
    assert out[0] == 3.0  # 0.75 * (1 + 3)


def test_head_stage_s_without_mtp():
    out = step.head_stage_s(SimpleNamespace(mtp_num_layers=0), a(5.0), a(2.0))
    assert out[0] == 2.0


def test_stage_times_s():
    # pp 1: one stage with 4 layers of 1 s + embed 0.5 + head 2; pp 4: 1/2/3 layers
    f, mid, last = step.first_mid_last_times_s(a(4, 1), a(0, 2), a(4, 3), a(1.0, 1.0), a(0.5, 0.5),
                                      a(2.0, 2.0), a(1, 4))
    assert f.tolist() == [6.5, 1.5] and mid.tolist() == [0.0, 2.0] and last.tolist() == [6.5, 5.0]


def test_backward_fractions():
    # forward 1, backward (with recompute) 3 of which 2 GEMM backward: F = 1/4, W = 0.5*2/4
    fwd, w = step.backward_fractions(a(1.0), a(3.0), a(2.0))
    assert fwd[0] == 0.25 and w[0] == 0.25


def test_slowest_stage_s():
    t, n = step.slowest_stage_s(a(3.0, 1.0, 1.0), a(2.0, 4.0, 1.0), a(1.0, 1.0, 5.0),
                                a(10, 10, 10), a(20, 20, 20), a(30, 30, 30))
    assert t.tolist() == [3.0, 4.0, 5.0] and n.tolist() == [10, 20, 30]


def test_stage_comm_shares():
    # 4 layers of 1 ms TP, 0.5 ms CP, 0.25 ms EP, 0.1 ms overlap slowdown, stage 20 ms
    with np.errstate(divide="ignore", invalid="ignore"):  # the empty stage divides by 0
        s = step.stage_comm_shares(a(4.0, 4.0), a(20e-3, 0.0), a(1e-3, 1e-3),
                                   a(0.5e-3, 0.5e-3), a(0.25e-3, 0.25e-3), a(0.1e-3, 0.1e-3))
    assert s["comm"][0] == pytest.approx(0.35, rel=1e-12)
    assert s["tp"][0] == pytest.approx(0.2, rel=1e-12)
    assert s["cp"][0] == pytest.approx(0.1, rel=1e-12)
    assert s["ep"][0] == pytest.approx(0.05, rel=1e-12)
    assert s["tp_overlap"][0] == pytest.approx(0.02, rel=1e-12)
    assert all(v[1] == 0.0 for v in s.values())  # empty stage


def test_pp_sends_per_microbatch():
    out = step.boundary_sends_per_microbatch(np.array([Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED]),
                                       a(3.0, 3.0))
    assert out.tolist() == [2.0, 6.0]


def test_exposed_p2p_s():
    # pp 4, m 8, 2 sends of 1 ms: overlapped (4-1)*2 = 6 ms, blocking (8+3)*2 = 22 ms
    assert step.exposed_p2p_s(True, a(4.0), a(8.0), a(2.0), a(1e-3))[0] == pytest.approx(6e-3)
    assert step.exposed_p2p_s(False, a(4.0), a(8.0), a(2.0), a(1e-3))[0] == pytest.approx(22e-3)


def test_dp_grad_and_zero3_link_s():
    b = SimpleNamespace(dp=np.array([1, 4]), zero_stage=np.array([3, 1]))
    comm = {"dp_grad_s": a(2.0, 2.0), "expert_dp_grad_s": a(0.5, 0.5),
            "zero3_gather_s": a(1.0, 1.0), "expert_zero3_gather_s": a(0.25, 0.25)}
    assert step.dp_grad_link_s(b, comm).tolist() == [0.5, 2.5]
    assert step.zero3_gather_link_s(b, comm).tolist() == [1.25, 0.0]


def test_exposed_zero3_gather_s():
    assert step.exposed_zero3_gather_s(True, a(3.0, 1.0), a(2.0, 2.0)).tolist() == [1.0, 0.0]
    assert step.exposed_zero3_gather_s(False, a(3.0), a(2.0)).tolist() == [3.0]


def test_time_breakdown_s_adds_up():
    shares = {"comm": a(0.3), "tp": a(0.2), "cp": a(0.06), "ep": a(0.04),
              "tp_overlap": a(0.1)}
    t = step.time_breakdown_s(a(12.0), a(10.0), shares, a(0.5), a(0.25), a(0.125), a(1.0),
                              a(0.0625), a(0.03125))
    assert tuple(t) == step.TIME_TERMS
    assert t["compute"][0] == pytest.approx(6.0) and t["bubble"][0] == 2.0
    assert t["overlap_slowdown"][0] == pytest.approx(1.0625)
    assert sum(v[0] for v in t.values()) == pytest.approx(12 + 0.5 + 0.25 + 0.125 + 1
                                                          + 0.0625 + 0.03125, rel=1e-12)


def test_step_time_s_sum_and_shared_links():
    # makespan 10 + p2p 1 + dp 0.5 + ZeRO-3 0.25 + optimizer 0.5 + overlap 0.125 + amax 0.125
    # = 12.5 s. Two tiers: the busier port of config 0 needs 8 + 0.5 (optimizer) = 8.5 s, fits;
    # config 1's needs 14 + 0.5 = 14.5 s, 2 s beyond the sum, exposed as link_shared.
    busy = np.array([[8.0, 14.0], [3.0, 1.0]])
    step_s, shared_s = step.step_time_s(a(10.0, 10.0), a(1.0, 1.0), a(0.5, 0.5), a(0.25, 0.25),
                                        a(0.5, 0.5), a(0.125, 0.125), a(0.125, 0.125), busy)
    assert shared_s.tolist() == [0.0, 2.0]
    assert step_s.tolist() == [12.5, 14.5]
    # a cluster without tiers shares nothing
    step_s, shared_s = step.step_time_s(a(10.0), a(1.0), a(0.5), a(0.25), a(0.5), a(0.125),
                                        a(0.125), np.zeros((0, 1)))
    assert step_s.tolist() == [12.5] and shared_s.tolist() == [0.0]


def test_utilisation():
    # 6e15 FLOPs in 2 s on 8 GPUs of 1e15 FLOP/s peak: 37.5 %
    assert step.utilisation(6e15, a(2.0), a(8.0), 1e15)[0] == pytest.approx(0.375, rel=1e-12)


# ---- perfmodel.compute.layer._compute_times terms

PEAKS = {"bf16": 1000e12, "tf32": 500e12, "fp32": 50e12, "fp8": 2000e12}
GPU = SimpleNamespace(peak_flops=PEAKS.__getitem__, launch_overhead_us=None)
CAL = SimpleNamespace(peak_flops_bf16=1000e12, membw_bytes_per_s=lambda op: 1e12)
SLOW = SimpleNamespace(membw_bytes_per_s=lambda op: 1e9)  # 1 GB/s: bytes, not the launch floor


def test_gemm_precision_fp32_fused_and_eager():
    tr = SimpleNamespace(precision="fp32")
    p = compute.gemm_precision(tr, GPU, CAL, eager=False)  # TF32 tensor cores
    assert (p.peak, p.ratio, p.act_b, p.res_b, p.w_b) == (500e12, 1.0, 4.0, 4.0, 2.0)
    assert p.attn_slowdown == 2.0 and not p.autocast and not p.lowp and p.recipe is None
    p = compute.gemm_precision(tr, GPU, CAL, eager=True)  # fp32 CUDA cores
    assert p.peak == 50e12 and p.attn_slowdown == 20.0 and p.w_b == 4.0


def test_gemm_precision_bf16_eager_autocast():
    p = compute.gemm_precision(SimpleNamespace(precision="bf16"), GPU, CAL, eager=True)
    assert (p.peak, p.peak16, p.act_b, p.res_b, p.w_b) == (1000e12, 1000e12, 2.0, 4.0, 4.0)
    assert p.autocast and not p.lowp and p.attn_slowdown == 1.0


def test_gemm_precision_fp8_fused():
    tr = load_training(precision="fp8")
    p = compute.gemm_precision(tr, GPU, CAL, eager=False)
    assert p.peak == 2000e12 and p.peak16 == 1000e12 and p.ratio16 == 1.0
    assert p.ratio == pytest.approx(compute.LOW_PRECISION_GEMM_RATIO * p.recipe.gemm_ratio)
    assert p.lowp and (p.act_b, p.res_b, p.w_b) == (2.0, 2.0, 2.0)


def test_launch_cost_s():
    assert compute.launch_cost_s(GPU) == (17e-6, 38e-6)
    assert compute.launch_cost_s(SimpleNamespace(launch_overhead_us=5.0)) == pytest.approx(
        (5e-6, 5e-6), rel=1e-12)


def test_recompute_added_s():
    # device 1 + 2 s, host 0.5 + 1 s: 3 * (1 + 0.5^8)^(1/8) = 3.00146235 s, less the 2 s backward
    out = compute.recompute_added_s(a(1.0), a(0.5), a(2.0), a(1.0), a(2.0))
    assert out[0] == pytest.approx(1.00146235, rel=1e-7)


def test_unfused_cross_entropy():
    fwd, bwd = compute._Phase(CAL, 1), compute._Phase(CAL, 1)
    compute.unfused_cross_entropy(fwd, bwd, a(4096.0), 25216.0, 2.0)
    n = 4096 * 25216
    assert fwd.gpu_s[0] == pytest.approx(34 * n / 1e12, rel=1e-12) and fwd.launches[0] == 6
    assert bwd.gpu_s[0] == pytest.approx(22 * n / 1e12, rel=1e-12) and bwd.launches[0] == 3
    assert 6 * n / 1e12 > KERNEL_MIN_S  # every kernel above the launch floor


def _ctx(**kw):
    model = SimpleNamespace(fused_elementwise=True, gated_mlp=True, position_embedding="rope",
                            kv_heads=8)
    base = {"model": model, "pr": SimpleNamespace(act_b=2.0), "T": a(1000.0), "tp": a(2.0),
            "f_gpu": a(100.0), "act_cols": a(200.0), "nh_gpu": a(16.0), "d": 128}
    base.update(kw)
    return SimpleNamespace(**base)


def test_mlp_activation_fused():
    # forward (200 + 100) cols x 2 B x 1000 tokens = 600 kB; backward (400 + 100) -> 1 MB;
    # half the share -> 300 kB
    for pass_, share, nbytes in (("fwd", 1.0, 600e3), ("bwd", 1.0, 1e6), ("fwd", 0.5, 300e3)):
        ph = compute._Phase(SLOW, 1)
        compute._mlp_activation(_ctx(), ph, pass_, share)
        assert ph.gpu_s[0] == pytest.approx(nbytes / 1e9, rel=1e-12)
        assert ph.launches[0] == 1


def test_mlp_activation_unfused_gated():
    # 8 kernels moving 20 values per column: 20 x 100 cols x 2 B x 1000 tokens = 4 MB
    ctx = _ctx(model=SimpleNamespace(fused_elementwise=False, gated_mlp=True))
    ph = compute._Phase(SLOW, 1)
    compute._mlp_activation(ctx, ph, "fwd")
    assert ph.launches[0] == 8
    assert ph.gpu_s[0] == pytest.approx(4e6 / 1e9, rel=1e-12)


def test_rope_kernels():
    # q and k: (16 + 8/2) heads x 128 x 1000 tokens x 2 B, read + write: 10.24 MB in one kernel
    ph = compute._Phase(SLOW, 1)
    compute._rope_kernels(_ctx(), ph)
    assert ph.launches[0] == 1
    assert ph.gpu_s[0] == pytest.approx(10.24e6 / 1e9, rel=1e-12)


def test_unfused_grad_accumulation_bytes():
    # Megatron-FSDP copies param.grad into main_grad: read 2 bytes, write 2 (bf16) or 4 (fp32)
    assert compute.unfused_grad_accumulation_bytes(1e9, False) == pytest.approx(4e9)
    assert compute.unfused_grad_accumulation_bytes(1e9, True) == pytest.approx(6e9)
