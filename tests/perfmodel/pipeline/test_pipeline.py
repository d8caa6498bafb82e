"""Pipeline schedules: closed forms, simulator, in-flight micro-batches, layer partitioning."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.parallel.layers import partition_layers
from perfmodel.pipeline.schedules import (
    bubble_fraction,
    inflight_microbatches,
    pipeline_efficiency,
    pipeline_time_s,
    schedule_code,
    simulate,
    stage_op_order,
)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")


# --- exercise answers ---------------------------------------------------------------------


def test_exercise_9_2_gpipe_bubble_share():
    # 48 layers on 8 GPUs (6 per stage), GPipe, 32 micro-batches: (p-1)/(m+p-1) = 7/39.
    assert bubble_fraction(8, 32, "gpipe") == pytest.approx(7 / 39)
    # the simulator agrees (layer count only sets the stage time: 6 layers of 1 + 2 units)
    tl = simulate([6.0] * 8, [12.0] * 8, 32, "gpipe")
    assert tl.bubble_fraction == pytest.approx(float(Fraction(7, 39)))
    assert tl.makespan_s == pytest.approx((32 + 7) * 18.0)


def test_second_seed_example_efficiency_8_over_11():
    # L=24, P=4, M=8: efficiency M/(M+P-1) = 8/11 (the seed's 72.7 %).
    assert pipeline_efficiency(4, 8, "1f1b") == pytest.approx(8 / 11)
    tl = simulate([6.0] * 4, [12.0] * 4, 8, "1f1b")
    assert 1 - tl.bubble_fraction == pytest.approx(8 / 11)


def test_efficiency_rises_with_m_seed_optimum_is_wrong():
    # The seed claims M* = P-1 maximises efficiency at 0.5. Efficiency M/(M+P-1) is 0.5 *at*
    # M = P-1 and rises monotonically towards 1 with M.
    p = 8
    m = np.arange(1, 257)
    eff = pipeline_efficiency(p, m, "1f1b")
    assert eff[p - 2] == pytest.approx(0.5)  # M = P-1
    assert np.all(np.diff(eff) > 0)
    assert eff[-1] > 0.97
    assert eff[4 * p - 1] == pytest.approx(32 / 39)  # M = 4P: 82 %, far above 0.5


# --- closed forms, hand-computed ----------------------------------------------------------


def test_bubble_fraction_hand_values():
    assert bubble_fraction(4, 8, "gpipe") == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, "1f1b") == pytest.approx(3 / 11)
    # interleaved, v=2: (p-1)/(v m + p - 1) = 3/19; relative to ideal (p-1)/(v m) = 3/16
    b = bubble_fraction(4, 8, "interleaved", v=2)
    assert b == pytest.approx(3 / 19)
    assert b / (1 - b) == pytest.approx(3 / 16)
    # ZB-H1 with F = B_in = W: (p-1)/(3m + p - 1) = 3/27; a third of 1F1B relative to ideal
    z = bubble_fraction(4, 8, "zb")
    assert z == pytest.approx(3 / 27)
    assert z / (1 - z) == pytest.approx((3 / 8) / 3)
    assert bubble_fraction(1, 5, SCHEDULES) == pytest.approx(np.zeros(4))


def test_bubble_fraction_vectorized_with_codes():
    p = np.array([2, 4, 4, 8])
    m = np.array([4, 8, 8, 16])
    code = schedule_code(["gpipe", "1f1b", "interleaved", "zb"])
    assert list(code) == [0, 1, 2, 3]
    out = bubble_fraction(p, m, code, v=np.array([1, 1, 2, 1]))
    assert out == pytest.approx([1 / 5, 3 / 11, 3 / 19, 7 / 55])
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_code("pipedream")


def test_pipeline_time_hand_values():
    # F = 1, B = 2, p = 4, m = 8
    assert pipeline_time_s(4, 8, 1.0, 2.0, schedule="gpipe") == pytest.approx(33.0)
    assert pipeline_time_s(4, 8, 1.0, 2.0, schedule="interleaved", v=3) == pytest.approx(27.0)
    # ZB-H1, W = 1: 8*3 + 3*(1 + 1 - 1) = 27
    assert pipeline_time_s(4, 8, 1.0, 2.0, 1.0, schedule="zb") == pytest.approx(27.0)
    # ZB-H1 with W > B_in: stage 0 waits (p-1) B_in for its first backward: 8*3.5 + 3*1 = 31
    assert pipeline_time_s(4, 8, 1.0, 2.5, 1.5, schedule="zb") == pytest.approx(31.0)
    # p2p c = 0.1: GPipe + 2(p-1)c; 1F1B + 2c[(p-1) + (m-2) - floor((m-2)/p)] = +2c*(3+5)
    assert pipeline_time_s(4, 8, 1.0, 2.0, p2p_s=0.1, schedule="gpipe") == pytest.approx(33.6)
    assert pipeline_time_s(4, 8, 1.0, 2.0, p2p_s=0.1, schedule="1f1b") == pytest.approx(34.6)
    # vectorized over schedules
    out = pipeline_time_s(4, 8, 1.0, 2.0, schedule=np.array([0, 1, 2, 3]), v=np.array([1, 1, 2, 1]))
    assert out == pytest.approx([33.0, 33.0, 28.5, 27.0])
    assert pipeline_time_s(1, 8, 1.0, 2.0, schedule="zb") == pytest.approx(24.0)


def test_inflight_hand_values():
    assert inflight_microbatches(4, 8, "gpipe") == 8
    assert list(inflight_microbatches(4, 8, "1f1b", stage=np.arange(4))) == [4, 3, 2, 1]
    assert inflight_microbatches(4, 2, "1f1b") == 2
    assert list(inflight_microbatches(4, 8, "zb", stage=np.arange(4))) == [4, 3, 2, 1]
    # interleaved v=2, stage 0: warm-up 2*3 + 1*4 = 10 chunks, +1 = 11 chunks = 5.5 mb
    # = p * (1 + (p-1)/(p v)) = 4 * 1.375 (Megatron's interleaving memory factor)
    assert inflight_microbatches(4, 8, "interleaved", v=2) == pytest.approx(5.5)
    assert inflight_microbatches(4, 8, "interleaved", v=2, stage=3) == pytest.approx(2.5)


# --- simulator ----------------------------------------------------------------------------


def test_simulator_hand_timeline_nonuniform_gpipe():
    # p=2, m=2, F=[1,2], B=[2,4]: s0 F0[0,1] F1[1,2]; s1 F0[1,3] F1[3,5] B0[5,9] B1[9,13];
    # s0 B0[9,11] B1[13,15].
    tl = simulate([1.0, 2.0], [2.0, 4.0], 2, "gpipe")
    df = tl.to_frame()
    s0 = df[df.stage == 0]
    assert list(s0.op) == ["F", "F", "B", "B"]
    assert list(s0.start_s) == [0, 1, 9, 13]
    assert tl.makespan_s == 15.0
    assert list(df.columns) == [
        "stage",
        "microbatch",
        "chunk",
        "op",
        "start_s",
        "end_s",
        "duration_s",
    ]
    assert tl.busy_s.tolist() == [6.0, 12.0]
    assert tl.bubble_fraction == pytest.approx(1 - 18 / 30)


def test_simulator_nonuniform_slowest_stage_paces():
    # Heavy last stage (logits): the steady state runs at the slowest stage's pace.
    f = np.array([1.0, 1.0, 1.0, 2.0])
    tl = simulate(f, 2 * f, 32, "1f1b")
    assert tl.makespan_s >= 32 * 6.0
    assert tl.makespan_s >= 3 * (f.sum() + 2 * f.sum()) / 3
    # a uniform pipeline with the slowest stage everywhere is an upper bound
    assert tl.makespan_s <= pipeline_time_s(4, 32, 2.0, 4.0, schedule="1f1b") + 1e-9


def test_simulator_op_orders():
    assert stage_op_order(4, 6, 3, "1f1b")[:4] == [
        ("F", 0, 0),
        ("B", 0, 0),
        ("F", 1, 0),
        ("B", 1, 0),
    ]
    assert [o[0] for o in stage_op_order(4, 6, 0, "1f1b")[:5]] == ["F", "F", "F", "F", "B"]
    zb0 = stage_op_order(4, 6, 0, "zb")
    assert zb0[4:7] == [("B", 0, 0), ("W", 0, 0), ("F", 4, 0)]
    zb3 = stage_op_order(4, 6, 3, "zb")
    assert zb3[-3:] == [("W", 3, 0), ("W", 4, 0), ("W", 5, 0)]  # deferred W fill the drain
    inter = stage_op_order(2, 4, 1, "interleaved", v=2)
    # warm-up (v-1)p = 2 chunk forwards: mb0, mb1 of chunk 0, then F/B alternate
    assert inter[:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1)]
    for s in range(3):
        for sched, v in (("gpipe", 1), ("1f1b", 1), ("zb", 1), ("interleaved", 2)):
            ops = stage_op_order(3, 6, s, sched, v)
            n_kinds = 3 if sched == "zb" else 2
            assert len(ops) == len(set(ops)) == n_kinds * 6 * v


def test_simulator_rejects_bad_inputs():
    with pytest.raises(ValueError, match="must divide"):
        simulate([1.0] * 4, [2.0] * 4, 6, "interleaved", v=2)
    with pytest.raises(ValueError, match="needs schedule 'interleaved'"):
        simulate([1.0] * 4, [2.0] * 4, 8, "1f1b", v=2)
    with pytest.raises(ValueError, match="stage_bwd_s"):
        simulate([1.0] * 4, [2.0] * 3, 8)


def test_simulator_per_chunk_times_and_p2p_array():
    f = np.array([[0.5, 0.5], [0.5, 0.5]])
    tl = simulate(f, 2 * f, 4, "interleaved", v=2, p2p_s=np.zeros(3))
    assert tl.makespan_s == pytest.approx(float(pipeline_time_s(2, 4, 1.0, 2.0, schedule=2, v=2)))


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(1, 6),
    k=st.integers(1, 4),
    extra=st.integers(0, 5),
    v=st.integers(2, 3),
    sched=st.sampled_from(SCHEDULES),
    f=st.floats(0.1, 3.0),
    b=st.floats(0.1, 3.0),
)
def test_simulator_equals_closed_form_on_uniform_stages(p, k, extra, v, sched, f, b):
    if sched == "interleaved":
        if p == 1:
            return
        m = k * p
    else:
        m = k * p + extra if sched == "zb" else k + extra
        v = 1
    tl = simulate([f] * p, [b] * p, m, sched, v=v)
    assert tl.makespan_s == pytest.approx(float(pipeline_time_s(p, m, f, b, None, sched, v)))
    # in-flight micro-batches per stage
    assert tl.peak_inflight == pytest.approx(inflight_microbatches(p, m, sched, v, np.arange(p)))
    # bubble in [0, 1); with B = 2F (and W = B/2) it equals the closed bubble fraction
    assert 0 <= tl.bubble_fraction < 1
    tl2 = simulate([1.0] * p, [2.0] * p, m, sched, v=v)
    assert tl2.bubble_fraction == pytest.approx(float(bubble_fraction(p, m, sched, v)))


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(2, 6),
    m=st.integers(1, 14),
    f=st.floats(0.1, 3.0),
    b_in=st.floats(0.1, 3.0),
    w=st.floats(0.1, 3.0),
)
def test_zb_closed_form_any_ratio(p, m, f, b_in, w):
    """ZB-H1: exact for m >= p and any F, B_in, W; for m < p a lower bound within 10 %."""
    tl = simulate([f] * p, [b_in + w] * p, m, "zb", stage_w_s=[w] * p)
    cf = float(pipeline_time_s(p, m, f, b_in + w, w, "zb"))
    if m >= p:
        assert tl.makespan_s == pytest.approx(cf)
    else:
        assert cf <= tl.makespan_s * (1 + 1e-12)
        assert cf >= 0.9 * tl.makespan_s


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(2, 6),
    m=st.integers(1, 16),
    v=st.integers(2, 3),
    f=st.floats(0.2, 3.0),
    b=st.floats(0.2, 3.0),
    c_share=st.floats(0.0, 1.0),
)
def test_p2p_closed_forms(p, m, v, f, b, c_share):
    c = c_share * min(f, b) / 3
    for sched in ("gpipe", "1f1b"):
        tl = simulate([f] * p, [b] * p, m, sched, p2p_s=c)
        assert tl.makespan_s == pytest.approx(float(pipeline_time_s(p, m, f, b, None, sched, 1, c)))
    mi = p * max(1, m // p)
    c_i = c_share * min(f, b) / v
    tl = simulate([f] * p, [b] * p, mi, "interleaved", v=v, p2p_s=c_i)
    assert tl.makespan_s == pytest.approx(float(pipeline_time_s(p, mi, f, b, None, 2, v, c_i)))
    # ZB-H1 with F = B_in = W and 2c <= W
    c_z = c_share * f / 2
    tl = simulate([f] * p, [2 * f] * p, m, "zb", p2p_s=c_z)
    assert tl.makespan_s == pytest.approx(float(pipeline_time_s(p, m, f, 2 * f, f, "zb", 1, c_z)))


def test_zb_inflight_held_until_w():
    tl = simulate([1.0] * 4, [2.0] * 4, 8, "zb")
    assert tl.peak_inflight.tolist() == [4, 3, 2, 1]
    assert tl.peak_held.tolist() == [4, 4, 4, 4]  # W lags B on later stages
    tl = simulate([1.0] * 4, [2.0] * 4, 8, "1f1b")
    assert tl.peak_held.tolist() == tl.peak_inflight.tolist()


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 8), m=st.integers(1, 64), v=st.integers(1, 4))
def test_bubble_monotone_and_ordered(p, m, v):
    """Bubble in [0, 1), falls with m; interleaving and ZB-H1 never worse than 1F1B."""
    one = bubble_fraction(p, m, "1f1b")
    assert 0 <= one < 1
    assert bubble_fraction(p, m + 1, "1f1b") < one
    assert bubble_fraction(p, m, "interleaved", v) <= one + 1e-12
    assert bubble_fraction(p, m, "zb") <= one + 1e-12
    assert bubble_fraction(p, m, "gpipe") == pytest.approx(one)


# --- partitioning (exercise 9.4) ----------------------------------------------------------


def _brute_force(costs, stages, memory=None, cap=None):
    n = len(costs)
    best = np.inf
    for cuts in itertools.combinations(range(1, n), stages - 1):
        b = (0, *cuts, n)
        if memory is not None and any(sum(memory[b[i] : b[i + 1]]) > cap for i in range(stages)):
            continue
        best = min(best, max(sum(costs[b[i] : b[i + 1]]) for i in range(stages)))
    return best


@pytest.mark.parametrize(
    "costs, stages, bottleneck",
    [
        ([1] * 48, 8, 6),  # 48 equal layers on 8 GPUs: 6 each
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, 17),  # [1..5]=15, [6,7]=13, [8,9]=17
        ([10, 1, 1, 1, 1, 1, 1, 10], 3, 10),
        ([5, 5, 5, 5], 4, 5),
        ([3, 1, 1], 1, 5),
    ],
)
def test_partition_known_optima(costs, stages, bottleneck):
    bounds, bott = partition_layers(costs, stages)
    assert bott == pytest.approx(bottleneck)
    assert bounds[0] == 0 and bounds[-1] == len(costs) and len(bounds) == stages + 1
    assert np.all(np.diff(bounds) > 0)
    sums = [sum(costs[bounds[i] : bounds[i + 1]]) for i in range(stages)]
    assert max(sums) == pytest.approx(bott)


def test_partition_beats_even_split_with_heavy_ends():
    # embedding (3) + 14 layers (1) + logits (5) on 4 stages. Even split by count (4 each):
    # [3,1,1,1]=6, [1]*4=4, [1]*4=4, [1,1,1,5]=8 -> bottleneck 8. Optimum 6 (22/4 = 5.5, integer
    # sums): [3,1,1,1] [1]*6 [1]*5 [5].
    costs = [3] + [1] * 14 + [5]
    _bounds, bott = partition_layers(costs, 4)
    assert bott == 6
    even = max(sum(costs[i : i + 4]) for i in range(0, 16, 4))
    assert even == 8
    assert _brute_force(costs, 4) == 6


def test_partition_memory_cap():
    # Without a cap: [1,1] [1,1] -> 2. Layer 0 holds 5 bytes, cap 6: the stage with layer 0
    # may take one more 1-byte layer at most.
    bounds, bott = partition_layers([1, 1, 1, 1], 2, memory=[5, 1, 1, 1], memory_cap=6)
    assert bott == 2 and list(bounds) == [0, 2, 4]
    bounds, bott = partition_layers([1, 1, 1, 1], 2, memory=[5, 1, 1, 1], memory_cap=5)
    assert bott == 3 and list(bounds) == [0, 1, 4]
    with pytest.raises(ValueError, match="memory_cap"):
        partition_layers([1, 1, 1], 2, memory=[5, 5, 5], memory_cap=4)
    with pytest.raises(ValueError, match="stages"):
        partition_layers([1, 1], 3)


@settings(max_examples=60, deadline=None)
@given(
    costs=st.lists(st.integers(1, 20), min_size=1, max_size=9),
    stages=st.integers(1, 5),
    memory=st.lists(st.integers(1, 10), min_size=9, max_size=9),
    cap=st.one_of(st.none(), st.integers(5, 40)),
)
def test_partition_matches_brute_force(costs, stages, memory, cap):
    if stages > len(costs):
        return
    mem = memory[: len(costs)] if cap is not None else None
    expected = _brute_force(costs, stages, mem, cap)
    if not np.isfinite(expected):
        with pytest.raises(ValueError):
            partition_layers(costs, stages, memory=mem, memory_cap=cap)
        return
    bounds, bott = partition_layers(costs, stages, memory=mem, memory_cap=cap)
    assert bott == pytest.approx(expected)
    if mem is not None:
        assert all(sum(mem[bounds[i] : bounds[i + 1]]) <= cap for i in range(stages))
