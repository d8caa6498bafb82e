"""Step-time composition: hand-computed pipeline terms, bottleneck of uneven splits, invariants."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.parallel.layers import partition_layers
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import TIME_TERMS, bottleneck_stage_s, evaluate, pipeline_makespan_s

GPT = load_model("gpt3-1.3b")
CLUSTER = load_cluster("dgx-a100-80g", gpus=64)
TRAIN = load_training(global_batch_size=256, seq_len=2048)


def one(**kw):
    cfg = resolve_config(ParallelConfig(**kw), GPT, TRAIN, CLUSTER)
    return evaluate(GPT, TRAIN, CLUSTER, ConfigBatch.from_configs([cfg]))


def test_uniform_1f1b_makespan_is_m_plus_p_minus_1_stages():
    # Narayanan et al. 2021 Sec. 2.2.1: (m + p - 1) * t for uniform stages
    t = np.array([2.0])
    mk, steady = pipeline_makespan_s(t, t, t, np.array([4]), np.array([1]), np.array([8.0]),
                                     np.array([1]), np.array([1 / 3]), np.array([1 / 3]))
    assert mk[0] == pytest.approx((8 + 4 - 1) * 2.0)
    assert steady[0] == pytest.approx(16.0)


def test_interleaved_divides_fill_by_v():
    t = np.array([2.0])
    mk, _ = pipeline_makespan_s(t, t, t, np.array([4]), np.array([2]), np.array([8.0]),
                                np.array([2]), np.array([1 / 3]), np.array([1 / 3]))
    assert mk[0] == pytest.approx(8 * 2.0 + 3 * 2.0 / 2)


def test_zb_h1_bubble_is_a_third_with_equal_f_b_w():
    t = np.array([3.0])
    mk, steady = pipeline_makespan_s(t, t, t, np.array([4]), np.array([1]), np.array([8.0]),
                                     np.array([3]), np.array([1 / 3]), np.array([1 / 3]))
    assert mk[0] - steady[0] == pytest.approx(3 * 3.0 / 3)  # (p-1)*F with F = t/3


def test_bottleneck_matches_partition_dp_by_hand():
    # 14 layers of 1, embedding 3 on the first stage, logits 5 on the last, 4 stages: the DP
    # (exercise 9.4) gives 6; the vectorised bisection must agree.
    costs = [3.0] + [1.0] * 14 + [5.0]
    _, best = partition_layers(costs, 4)
    got = bottleneck_stage_s(14, np.array([4]), np.array([1.0]), np.array([3.0]), np.array([5.0]))
    assert best == pytest.approx(6.0)
    assert got[0] == pytest.approx(6.0, abs=1e-9)


@given(L=st.integers(2, 40), p=st.integers(2, 8), e=st.integers(0, 6), g=st.integers(0, 6))
def test_bottleneck_equals_dp_on_random_instances(L, p, e, g):
    # embedding and logits are items of their own at the ends (a stage may hold no layer)
    costs = [float(e)] + [1.0] * L + [float(g)]
    if len(costs) < p:
        return
    _, best = partition_layers(costs, p)
    got = bottleneck_stage_s(L, np.array([p]), np.array([1.0]), np.array([float(e)]),
                             np.array([float(g)]))
    assert got[0] == pytest.approx(best, abs=1e-6)


def test_terms_add_up_and_mfu_consistent():
    r = one(dp=8, tp=2, pp=4, micro_batch_size=2, zero_stage=1)
    total = sum(r.time_s[k][0] for k in TIME_TERMS)
    assert total == pytest.approx(r.step_time_s[0])
    peak = CLUSTER.gpu.peak_flops("bf16")
    assert r.mfu[0] == pytest.approx(r.model_flops[0] / (r.step_time_s[0] * 64 * peak))
    assert r.tokens_per_s[0] == pytest.approx(256 * 2048 / r.step_time_s[0])


def test_more_microbatches_shrink_bubble_share():
    a = one(dp=4, tp=2, pp=8, micro_batch_size=8)   # m = 8
    b = one(dp=4, tp=2, pp=8, micro_batch_size=1)   # m = 64
    share_a = a.time_s["bubble"][0] / a.step_time_s[0]
    share_b = b.time_s["bubble"][0] / b.step_time_s[0]
    assert share_b < share_a


def test_faster_network_never_slower():
    slow = load_cluster("ethernet-a100", gpus=64)
    cfg = resolve_config(ParallelConfig(dp=16, tp=4, micro_batch_size=2), GPT, TRAIN, CLUSTER)
    b = ConfigBatch.from_configs([cfg])
    fast_t = evaluate(GPT, TRAIN, CLUSTER, b).step_time_s[0]
    slow_t = evaluate(GPT, TRAIN, slow, b).step_time_s[0]
    assert fast_t <= slow_t


def test_batch_equals_one_by_one():
    cfgs = [resolve_config(ParallelConfig(dp=d, tp=t, pp=p, micro_batch_size=b), GPT, TRAIN,
                           CLUSTER)
            for d, t, p, b in ((64, 1, 1, 1), (16, 2, 2, 2), (8, 8, 1, 4), (4, 2, 8, 1))]
    batch = evaluate(GPT, TRAIN, CLUSTER, ConfigBatch.from_configs(cfgs)).step_time_s
    single = [evaluate(GPT, TRAIN, CLUSTER, ConfigBatch.from_configs([c])).step_time_s[0]
              for c in cfgs]
    assert np.allclose(batch, single)
