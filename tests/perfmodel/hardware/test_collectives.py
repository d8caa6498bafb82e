"""Collective cost models: hand-computed values, exercise 9.1, and invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.hardware import collectives as c

sizes = st.floats(min_value=1.0, max_value=1e11)
groups = st.integers(min_value=1, max_value=4096)
bws = st.floats(min_value=1e8, max_value=1e12)
lats = st.floats(min_value=0.0, max_value=1e-4)


def test_exercise_9_1_ring_all_reduce_175b_fp16_on_8_gpus():
    # 175e9 parameters * 2 bytes = 350e9 bytes; 2 (n-1)/n S / B = 2 * 7/8 * 350e9 / 100e9
    assert c.all_reduce_time(350e9, 8, 100e9) == pytest.approx(6.125)
    assert c.all_reduce_time(350e9, 8, 100e9, algorithm="auto") <= 6.125


def test_bus_bandwidth_factors_nccl_tests():
    assert c.bus_bandwidth_factor("all_reduce", 8) == pytest.approx(1.75)
    assert c.bus_bandwidth_factor("all_gather", 8) == pytest.approx(0.875)
    assert c.bus_bandwidth_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert c.bus_bandwidth_factor("all_to_all", 4) == pytest.approx(0.75)
    assert c.bus_bandwidth_factor("broadcast", 4) == 1.0
    assert c.bus_bandwidth_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError):
        c.bus_bandwidth_factor("gather", 4)


def test_ring_all_reduce_hand():
    # 2*3 steps * 10 us + 2*3/4 * 1e6 B / 1e9 B/s = 60 us + 1.5 ms
    assert c.all_reduce_time(1e6, 4, 1e9, 1e-5) == pytest.approx(6e-5 + 1.5e-3)


def test_tree_all_reduce_hand():
    # 2*ceil(log2 8)=6 hops * 10 us + 2 * 1e6 / 1e9
    assert c.all_reduce_time(1e6, 8, 1e9, 1e-5, "tree") == pytest.approx(6e-5 + 2e-3)
    # ceil(log2 5) = 3
    assert c.tree_all_reduce_time(0.0, 5, 1e9, 1e-5) == pytest.approx(6e-5)


def test_hierarchical_hand():
    # RS in domain: 7/8*8e6/100e9 = 7e-5; AR of 1e6 over 4 at 10e9: ring 1.5e-4 (< tree 2e-4);
    # AG in domain 7e-5
    t = c.hierarchical_all_reduce_time(8e6, 8, 4, 100e9, 10e9)
    assert t == pytest.approx(2.9e-4)
    t2 = c.all_reduce_time(
        8e6, 32, 100e9, algorithm="hierarchical", domain_size=8, inter_bw_bytes_per_s=10e9
    )
    assert t2 == pytest.approx(2.9e-4)


def test_other_collectives_hand():
    assert c.all_gather_time(8e6, 8, 1e9, 1e-6) == pytest.approx(7e-6 + 7e-3)
    assert c.reduce_scatter_time(8e6, 8, 1e9, 1e-6) == pytest.approx(7e-6 + 7e-3)
    assert c.broadcast_time(8e6, 8, 1e9, 1e-6) == pytest.approx(7e-6 + 8e-3)
    assert c.all_to_all_time(8e6, 8, 1e9, 1e-6) == pytest.approx(7e-6 + 7e-3)
    assert c.p2p_time(1e6, 1e9, 1e-6) == pytest.approx(1e-6 + 1e-3)
    assert c.p2p_time(0.0, 1e9, 1e-6) == 0.0
    assert c.collective_time("broadcast", 8e6, 8, 1e9, 1e-6) == pytest.approx(7e-6 + 8e-3)
    assert c.collective_time("p2p", 1e6, 8, 1e9) == pytest.approx(1e-3)
    with pytest.raises(ValueError):
        c.all_reduce_time(1e6, 4, 1e9, algorithm="butterfly")


def test_auto_small_messages_tree_large_ring():
    # 16 GPUs, 25 GB/s, 8 us: crossover S* = n B alpha ((n-1) - log2 n) = 35.2 MB
    n, bw, lat = 16, 25e9, 8e-6
    small, large = 1e6, 1e9
    ring_s, tree_s = (c.all_reduce_time(small, n, bw, lat, a) for a in ("ring", "tree"))
    ring_l, tree_l = (c.all_reduce_time(large, n, bw, lat, a) for a in ("ring", "tree"))
    assert tree_s < ring_s and c.all_reduce_time(small, n, bw, lat, "auto") == tree_s
    assert ring_l < tree_l and c.all_reduce_time(large, n, bw, lat, "auto") == ring_l
    cross = n * bw * lat * ((n - 1) - np.log2(n))
    assert cross == pytest.approx(35.2e6)
    assert c.all_reduce_time(cross, n, bw, lat, "ring") == pytest.approx(
        c.all_reduce_time(cross, n, bw, lat, "tree")
    )


def test_broadcasting_shapes():
    s = np.logspace(3, 9, 7)[:, None]
    n = np.array([1, 2, 8, 64])[None, :]
    for a in c.ALGORITHMS:
        assert c.all_reduce_time(s, n, 1e10, 1e-6, a).shape == (7, 4)
    assert np.all(c.all_reduce_time(s, n, 1e10, 1e-6)[:, 0] == 0)


@settings(max_examples=60, deadline=None)
@given(sizes, groups, bws, lats, st.floats(min_value=1.0, max_value=100.0))
def test_time_never_grows_with_bandwidth(size, n, bw, lat, factor):
    for a in c.ALGORITHMS:
        slow = c.all_reduce_time(
            size, n, bw, lat, a, domain_size=min(n, 8), inter_bw_bytes_per_s=bw / 4
        )
        fast = c.all_reduce_time(
            size,
            n,
            bw * factor,
            lat,
            a,
            domain_size=min(n, 8),
            inter_bw_bytes_per_s=bw * factor / 4,
        )
        assert fast <= slow * (1 + 1e-12)
    for name in c.COLLECTIVES:
        assert c.collective_time(name, size, n, bw * factor, lat) <= c.collective_time(
            name, size, n, bw, lat
        ) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(sizes, groups)
def test_all_reduce_bytes_equal_reduce_scatter_plus_all_gather(size, n):
    ar = c.all_reduce_bytes_per_gpu(size, n)
    assert ar == pytest.approx(
        c.reduce_scatter_bytes_per_gpu(size, n) + c.all_gather_bytes_per_gpu(size, n)
    )
    # and in time, for the ring at equal latency
    t_ar = c.ring_all_reduce_time(size, n, 1e10, 1e-6)
    t_rs_ag = c.reduce_scatter_time(size, n, 1e10, 1e-6) + c.all_gather_time(size, n, 1e10, 1e-6)
    assert t_ar == pytest.approx(t_rs_ag)


@settings(max_examples=30, deadline=None)
@given(sizes, bws, lats)
def test_group_of_one_costs_nothing(size, bw, lat):
    for a in c.ALGORITHMS:
        assert c.all_reduce_time(size, 1, bw, lat, a) == 0.0
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        assert c.collective_time(name, size, 1, bw, lat) == 0.0
        assert c.bytes_per_gpu(name, size, 1) == 0.0


@settings(max_examples=60, deadline=None)
@given(sizes, groups, bws, lats)
def test_hierarchical_equals_ring_in_one_domain(size, n, bw, lat):
    ring = c.all_reduce_time(size, n, bw, lat, "ring")
    assert c.all_reduce_time(size, n, bw, lat, "hierarchical") == pytest.approx(ring)
    assert c.all_reduce_time(
        size, n, bw, lat, "hierarchical", domain_size=n, inter_bw_bytes_per_s=bw / 10
    ) == pytest.approx(ring)


@settings(max_examples=60, deadline=None)
@given(sizes, groups, bws, lats)
def test_auto_is_the_minimum(size, n, bw, lat):
    auto = c.all_reduce_time(size, n, bw, lat, "auto")
    for a in ("ring", "tree", "hierarchical"):
        assert auto <= c.all_reduce_time(size, n, bw, lat, a) * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------
# Bounds: a unit mistake raises instead of giving absurd or negative times
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn, args",
    [
        ("all_reduce_time", (1e9, 8, 1e-300)),
        ("all_reduce_time", (1e9, 8, 100e9, -1e-6)),
        ("all_reduce_time", (1e9, 8, 100e9, float("nan"))),
        ("ring_all_reduce_time", (1e9, 8, 0.0)),
        ("tree_all_reduce_time", (1e9, 8, 100e9, -5e-6)),
        ("all_gather_time", (1e9, 8, -100e9)),
        ("reduce_scatter_time", (-1e9, 8, 100e9)),
        ("broadcast_time", (1e9, 8, float("nan"))),
        ("all_to_all_time", (1e9, 8, 100e9, float("inf"))),
        ("p2p_time", (1e9, 1e-300)),
    ],
)
def test_calculators_refuse_out_of_range_links(fn, args):
    import perfmodel.hardware.collectives as col

    with pytest.raises(ValueError):
        getattr(col, fn)(*args)


def test_hierarchical_and_auto_check_both_tiers():
    import perfmodel.hardware.collectives as col

    with pytest.raises(ValueError, match="latency_s"):
        col.all_reduce_time(1e9, 16, 100e9, 0.0, "auto", domain_size=8, inter_bw_bytes_per_s=25e9,
                            inter_latency_s=-1e-6)
    with pytest.raises(ValueError, match="bw_bytes_per_s"):
        col.all_reduce_time(1e9, 16, 100e9, 0.0, "hierarchical", domain_size=8,
                            inter_bw_bytes_per_s=1e-300)
    # the bounds still admit every real link: 1 kB/s, zero latency, infinite bandwidth
    assert col.all_reduce_time(1e3, 2, 1e3) == pytest.approx(1.0)
    assert col.p2p_time(1e6, np.inf, 1e-6) == pytest.approx(1e-6)


def test_collective_base_cost_hand():
    # NCCL tuning.cc baseLat (ring, Simple) = 8.4 us per call; nothing for a group of one
    assert c.NCCL_BASE_LATENCY_S == 8.4e-6
    np.testing.assert_allclose(c.collective_base_s([1, 2, 8], [4, 4, 8]), [0.0, 33.6e-6, 67.2e-6])
