"""Ring attention overlap (:mod:`perfmodel.comm.cp_ring`): hand-computed numbers and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.comm import cp_ring


def a(*x):
    return np.array(x, dtype=np.float64)


def test_forward_hand():
    # cp 4: 3 sends of 2 ms under 1.5 ms blocks -> 3 x 0.5 exposed, 3 x 1.5 hidden;
    # a send shorter than its block hides entirely; cp 1 has no ring
    exp, hid = cp_ring.ring_forward_s(a(4, 4, 1), a(2e-3, 1e-3, 2e-3), a(1.5e-3, 1.5e-3, 1e-3))
    assert exp == pytest.approx(a(1.5e-3, 0.0, 0.0), rel=1e-12)
    assert hid == pytest.approx(a(4.5e-3, 3e-3, 0.0), rel=1e-12)


def test_backward_hand():
    # cp 4: K/V (1 ms) at step 0, dK/dV (1 ms) at step 3, K/V + dK/dV (1.9 ms) at steps 1, 2,
    # each under a 1.2 ms block: exposed 2 x 0 + 2 x 0.7, hidden 2 x 1 + 2 x 1.2.
    # cp 2: two one-chunk sends (K/V, then dK/dV), no middle step
    exp, hid = cp_ring.ring_backward_s(a(4, 2), a(1e-3, 1e-3), a(1.9e-3, 1.9e-3),
                                       a(1.2e-3, 0.5e-3))
    assert exp == pytest.approx(a(1.4e-3, 1e-3), rel=1e-12)
    assert hid == pytest.approx(a(4.4e-3, 1e-3), rel=1e-12)


def test_layer_hand_full_recompute_and_hybrid():
    # cp 2, attention 4 ms fwd / 8 ms bwd -> blocks 2 / 4 ms; sends 3 ms / 5 ms.
    # forward 1 x (3-2) = 1 ms exposed (2 ms hidden), twice under full recompute;
    # backward 2 x 0 (2 x 3 = 6 ms hidden): 2 ms exposed, 10 ms hidden, slowdown 0.05 x 10 ms
    cp_s, slow = cp_ring.ring_layer_s(a(2), a(4e-3), a(8e-3), a(3e-3), a(5e-3), np.array([True]),
                                      0.05)
    assert cp_s == pytest.approx(a(2e-3), rel=1e-12)
    assert slow == pytest.approx(a(0.5e-3), rel=1e-12)
    # hybrid, attention in half the layers: the averaged attention times are half an
    # attention layer's; the ring runs in that half only
    cp_h, slow_h = cp_ring.ring_layer_s(a(2), a(2e-3), a(4e-3), a(3e-3), a(5e-3),
                                        np.array([True]), 0.05, attention_fraction=0.5)
    assert cp_h == pytest.approx(0.5 * cp_s, rel=1e-12)
    assert slow_h == pytest.approx(0.5 * slow, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(cp=st.integers(1, 16), send=st.floats(0.0, 1e-2), block=st.floats(1e-6, 1e-2),
       bwd=st.floats(1e-6, 2e-2), slowdown=st.floats(0.0, 0.3))
def test_overlap_bounds(cp, send, block, bwd, slowdown):
    """Overlap never costs more than the blocking ring (every send exposed, plus the slowdown
    of what is hidden), never less than zero, and the ring vanishes at cp = 1."""
    cp_s, slow = cp_ring.ring_layer_s(a(cp), a(block), a(bwd), a(send), a(2 * send),
                                      np.array([False]), slowdown)
    blocking = (cp - 1) * send + 2 * (cp - 1) * send  # forward + backward chunks
    assert 0.0 <= cp_s[0] <= blocking + 1e-15
    assert 0.0 <= slow[0] <= slowdown * blocking + 1e-15
    assert cp_s[0] + slow[0] <= (1 + slowdown) * blocking + 1e-15
    if cp == 1:
        assert cp_s[0] == 0.0 and slow[0] == 0.0


def test_bookkeeping_hand():
    # the docstring's example: cp 2, Q = E = 1e6 elements, 1 MB K/V chunk, bf16, head dim 128
    q = e = a(1e6)
    kv = a(1e6)
    copy, add, kernels = cp_ring.ring_bookkeeping(a(2), q, e, kv, 2.0, 128, "fwd")
    assert copy[0] == pytest.approx(1e6)  # one K/V half copied (read + write)
    assert add[0] == pytest.approx(12e6 + 10e6 + 12 * 1e6 / 128)  # init + cast, merge, stats
    assert kernels[0] == 2 + 2 + 1 + 1
    copy, add, kernels = cp_ring.ring_bookkeeping(a(2), q, e, kv, 2.0, 128, "bwd")
    assert copy[0] == pytest.approx(6e6 + 2e6)  # q, out, dout halves; K/V into the send buffer
    assert add[0] == pytest.approx(7e6 + 4.5e6)  # dQ copies / adds; dK, dV adds
    assert kernels[0] == 3 + 1 + 2 + 4
    zero = cp_ring.ring_bookkeeping(a(1), q, e, kv, 2.0, 128, "bwd")
    assert all(z[0] == 0.0 for z in zero)


@settings(max_examples=40, deadline=None)
@given(cp=st.integers(2, 15), pass_=st.sampled_from(["fwd", "bwd"]))
def test_bookkeeping_grows_with_cp(cp, pass_):
    """At a fixed chunk per rank, each more ring step adds copies and merges."""
    args = (a(1e6), a(1e6), a(2e5), 2.0, 128, pass_)
    lo = cp_ring.ring_bookkeeping(a(cp), *args)
    hi = cp_ring.ring_bookkeeping(a(cp + 1), *args)
    assert hi[0][0] + hi[1][0] > lo[0][0] + lo[1][0] and hi[2][0] > lo[2][0]
