"""Physics never runs backwards: a faster link or faster memory never slows a step.

More bandwidth or less latency on any tier of the cluster, or more HBM bandwidth on the GPU,
can shrink a window that hid some communication, and the exposed part of that communication may
then grow; it may never grow by more than the window shrank. Random valid configurations of a
dense, a hybrid (Mamba + attention) and two MoE models on several clusters, evaluated as one
:class:`~perfmodel.parallel.config.ConfigBatch` before and after the change.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.comm import comm_time
from perfmodel.spec.specs import ClusterSpec
from perfmodel.step import evaluate as step
from perfmodel.step.evaluate import evaluate
from search.api import make_problem

#: (model, cluster, GPUs, options): dense, hybrid, MoE; NVLink, NVL72 and A100 clusters; long
#: sequences (context parallelism) and ZeRO-3 pinned where the defaults would not search them.
CASES = [
    ("llama3.1-8b", "dgx-b200", 16, {"seq_len": 32768, "global_batch_size": 32}),
    ("nemotron-h-8b", "dgx-b200", 512, {"zero_stage": 3}),
    ("mixtral-8x7b", "dgx-h100", 64, {}),
    ("qwen3-30b-a3b", "gb200-nvl72", 144, {}),
    ("gpt3-1.3b", "dgx-a100-80g", 32, {}),
]
#: relative tolerance of "never slower" (rounding of sums of terms)
RTOL = 1e-9
#: configurations of one case evaluated per example
PER_EXAMPLE = 24


@functools.cache
def _case(i: int):
    """The specs and the valid configurations of case ``i``."""
    model, cluster, gpus, options = CASES[i]
    space = make_problem(model, cluster, gpus=gpus, **options).space
    flat = np.concatenate(list(space.iter_chunks()))
    arrays, viol = space.decode_flat(flat)
    return space, space.batch(arrays, np.flatnonzero(viol == 0))


def _scaled_tier(cluster: ClusterSpec, i: int, bw: float, latency: float) -> ClusterSpec:
    """``cluster`` with tier ``i``'s bandwidth times ``bw`` and latency times ``latency``."""
    tiers = list(cluster.tiers)
    t = tiers[i]
    key = "bw_gbyte_per_s" if t.bw_gbyte_per_s is not None else "bw_gbit_per_s"
    tiers[i] = t.model_copy(update={key: getattr(t, key) * bw,
                                    "latency_us": t.latency_us * latency})
    return cluster.model_copy(update={"tiers": tiers})


def _scaled_hbm(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    """``cluster`` with its GPU's HBM bandwidth times ``factor``."""
    gpu = cluster.gpu.model_copy(update={"hbm_tbyte_per_s": cluster.gpu.hbm_tbyte_per_s * factor})
    return cluster.model_copy(update={"gpu": gpu})


def _assert_not_slower(space, batch, faster: ClusterSpec) -> None:
    base = evaluate(space.model, space.training, space.cluster, batch).step_time_s
    new = evaluate(space.model, space.training, faster, batch).step_time_s
    worse = np.flatnonzero(new > base * (1.0 + RTOL))
    assert worse.size == 0, [(batch.to_dict(int(k)), float(base[k]), float(new[k]))
                             for k in worse[:3]]


def _sample(data, batch):
    n = len(batch)
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=PER_EXAMPLE,
                             unique=True))
    return batch.take(np.sort(np.asarray(idx)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.integers(0, len(CASES) - 1), bw=st.floats(1.0, 20.0),
       latency=st.floats(0.0, 1.0), data=st.data())
def test_faster_tier_never_slows_the_step(case, bw, latency, data):
    space, batch = _case(case)
    tier = data.draw(st.integers(0, len(space.cluster.tiers) - 1))
    _assert_not_slower(space, _sample(data, batch),
                       _scaled_tier(space.cluster, tier, bw, latency))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.integers(0, len(CASES) - 1), factor=st.floats(1.0, 8.0), data=st.data())
def test_more_hbm_bandwidth_never_slows_the_step(case, factor, data):
    space, batch = _case(case)
    _assert_not_slower(space, _sample(data, batch), _scaled_hbm(space.cluster, factor))


def test_faster_nvlink_does_not_crowd_the_zero3_window():
    """A 10x NVLink on a ZeRO-3, tp 8 hybrid model: the faster tensor-parallel leg shrinks the
    steady compute that hid the gathers; the gathers' exposure grows by what the window shrank,
    and the gradient reduction beside them may not grow on top of it."""
    space, batch = _case(1)
    _assert_not_slower(space, batch, _scaled_tier(space.cluster, 0, 10.0, 1.0))


# ---- the monotone terms, hand-computed ---------------------------------------------------------
def test_window_share_hand_computed():
    # 2.7 s of gathers over a 3 s step fill 0.45 s of a 0.5 s window; over 2 s, all of it
    assert comm_time.window_share_s(2.7, 0.5, 3.0) == pytest.approx(0.45)
    assert comm_time.window_share_s(2.7, 0.5, 2.0) == pytest.approx(0.5)
    assert comm_time.stream_busy_in_window_s(0.7, 3.4, 0.5, 2.0) == pytest.approx(1.2)


@given(spread=st.floats(0.0, 10.0), window=st.floats(0.0, 5.0), span=st.floats(0.01, 10.0),
       grow=st.floats(0.0, 5.0))
def test_span_plus_window_share_never_falls_as_the_span_grows(spread, window, span, grow):
    window = min(window, span)
    before = span + comm_time.window_share_s(spread, window, span)
    after = span + grow + comm_time.window_share_s(spread, window, span + grow)
    assert after >= before - 1e-12 * max(1.0, before)


def test_stream_span_and_zero3_window_hand_computed():
    assert step.stream_span_s(np.array([5.0]), np.array([1.0])).tolist() == [6.0]
    # 1F1B (code 1): the steady compute; ZB-H1 (code 3): the whole makespan
    w = step.zero3_gather_window_s(np.array([10.0, 10.0]), np.array([8.0, 8.0]),
                                   np.array([1, 3]))
    assert w.tolist() == [8.0, 10.0]
