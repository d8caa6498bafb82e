"""K/V all-gather (:mod:`perfmodel.comm.cp_allgather`) and hierarchical a2a+p2p
(:mod:`perfmodel.comm.cp_hierarchical`) context parallelism: hand-computed numbers, the
hierarchical sizes, the search and batch invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import search
from perfmodel.comm import cp_allgather, cp_hierarchical
from perfmodel.comm.comm_time import comm_times
from perfmodel.comm.comm_volume import comm_bytes_per_gpu
from perfmodel.core.errors import SpecError
from perfmodel.hardware import collectives as coll
from perfmodel.memory.breakdown import cp_gather_buffer_bytes
from perfmodel.parallel.config import (
    ConfigBatch,
    ParallelConfig,
    a2a_heads_ok,
    hierarchical_a2a_size,
    resolve_config,
)
from perfmodel.parallel.topology import group_placement, parallel_groups
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate

LLAMA8 = load_model("llama3.1-8b")  # 32 heads, 8 K/V heads of 128, 32 layers
H100 = load_cluster("dgx-h100", gpus=8)
H100_16 = load_cluster("dgx-h100", gpus=16)
TR = load_training(global_batch_size=8, seq_len=8192, precision="bf16")
MiB = 2**20


def a(*x):
    return np.array(x, dtype=np.float64)


# ------------------------------------------------------------------------------------------
# all-gather
# ------------------------------------------------------------------------------------------
def test_allgather_layer_hand():
    # cp 4: gather K, V 1 ms, reduce-scatter dK, dV 1.2 ms: forward 1, backward 1 + 1.2 = 3.2 ms;
    # full recompute gathers once more: 4.2 ms; half the layers with attention: 1.6 ms; cp 1: 0
    t = cp_allgather.allgather_layer_s(a(4, 4, 1), a(1e-3, 1e-3, 1e-3), a(1.2e-3, 1.2e-3, 1.2e-3),
                                       np.array([False, True, False]))
    assert t == pytest.approx(a(3.2e-3, 4.2e-3, 0.0), rel=1e-12)
    half = cp_allgather.allgather_layer_s(a(4), a(1e-3), a(1.2e-3), np.array([False]), 0.5)
    assert half == pytest.approx(a(1.6e-3), rel=1e-12)


def test_allgather_buffer_hand():
    # cp 8, 4 MiB of K/V a rank: gathered K/V 32 MiB + full dK/dV 32 MiB = 64 MiB; cp 1: none
    assert cp_allgather.allgather_buffer_bytes(a(8, 1), a(4 * MiB, 4 * MiB)).tolist() == [
        64 * MiB, 0.0]


def test_allgather_comm_times_and_bytes_hand_one_node():
    # llama3.1-8b, seq 8192 over cp 8 in one node: K/V chunk 2 x 1024 x 8 x 128 x 2 B = 4 MiB,
    # the whole sequence's 32 MiB; ring all-gather / reduce-scatter (n-1) alpha + 7/8 S / B,
    # plus NCCL's fixed cost, twice each (K then V; dK then dV)
    b = ConfigBatch.from_arrays(dp=1, tp=1, cp=8, num_microbatches=8, cp_comm="allgather")
    g = parallel_groups(H100, b, ("cp",))["cp"]
    full = 32 * MiB
    bw_ag, bw_rs, lat = (float(g.bw_for("all_gather")[0]), float(g.bw_for("reduce_scatter")[0]),
                         float(g.latency_s[0]))
    base = float(coll.collective_base_s(8))
    gather = 7 * lat + 7 / 8 * full / bw_ag + 2 * base
    scatter = 7 * lat + 7 / 8 * full / bw_rs + 2 * base
    ct = comm_times(LLAMA8, TR, H100, b)
    assert ct["cp_kv_gather_s"][0] == pytest.approx(gather, rel=1e-12)
    assert ct["cp_dkv_scatter_s"][0] == pytest.approx(scatter, rel=1e-12)
    assert ct["cp_layer_bwd_s"][0] == pytest.approx(gather + scatter, rel=1e-12)
    # bytes per GPU and step: 8 micro-batches x 32 layers x 3 collectives x 7/8 x 32 MiB
    sent = comm_bytes_per_gpu(LLAMA8, TR, b)["cp"][0]
    assert sent == pytest.approx(8 * 32 * 3 * 7 / 8 * 32 * MiB, rel=1e-12)


def test_allgather_memory_holds_the_full_sequence_kv():
    b = ConfigBatch.from_arrays(dp=1, tp=1, cp=8, num_microbatches=8,
                                cp_comm=["p2p", "allgather"])
    assert cp_gather_buffer_bytes(LLAMA8, TR, b).tolist() == [0.0, 64 * MiB]
    r = evaluate(LLAMA8, TR, H100, b)
    assert r.memory_bytes["peak"][1] - r.memory_bytes["peak"][0] >= 64 * MiB


# ------------------------------------------------------------------------------------------
# hierarchical a2a+p2p
# ------------------------------------------------------------------------------------------
def test_hierarchical_sizes_hand():
    # 32 query / 8 K/V heads on 8-GPU nodes: cp 16, tp 2 -> A 4 (2 x 4 = 8 GPUs); cp 16, tp 1
    # -> 8; cp 8, tp 1 -> 8 = cp (Ulysses: not hierarchical); tp 8 -> 1 (the ring)
    got = hierarchical_a2a_size(32, 8, a(2, 1, 1, 8), a(16, 16, 8, 4), 8)
    assert got.tolist() == [4, 8, 8, 1]
    assert cp_hierarchical.ring_size(a(16, 16), a(4, 8)).tolist() == [4.0, 2.0]


def test_hierarchical_layer_hand():
    # the docstring's example: cp 8 = a2a 4 x ring 2, attention 4 / 8 ms (blocks 2 / 4 ms),
    # 3 ms sends: 1 ms of the forward send exposed; all-to-alls 2 x (0.5 + 0.25) ms: 2.5 ms
    exp, slow = cp_hierarchical.hierarchical_layer_s(
        a(8, 1), a(4, 1), a(4e-3, 4e-3), a(8e-3, 8e-3), a(3e-3, 3e-3), a(5e-3, 5e-3),
        a(0.5e-3, 0.5e-3), a(0.25e-3, 0.25e-3), np.array([False, False]), 0.0)
    assert exp == pytest.approx(a(2.5e-3, 0.0), rel=1e-12)
    assert slow.tolist() == [0.0, 0.0]


def test_hierarchical_comm_times_hand_two_nodes():
    # cp 16 on two nodes, tp 1: the all-to-all over the node's 8 (A = 8) on NVLink, the ring of
    # 2 between the nodes. 512 tokens a rank: Q = out = 512 x 32 x 128 x 2 B = 4 MiB,
    # K = V = 1 MiB; the ring's chunk 2 x 512 x 8 x 128 x 2 B = 2 MiB
    tr = load_training(global_batch_size=1, seq_len=8192, precision="bf16")
    b = ConfigBatch.from_arrays(dp=1, tp=1, cp=16, num_microbatches=1, cp_comm="a2a+p2p",
                                cp_a2a=8)
    inner = group_placement(H100_16, a(8), a(1))
    outer = group_placement(H100_16, a(2), a(8))
    bw, lat = float(inner.intra_bw_bytes_per_s[0]), float(inner.latency_s[0])

    def one(nbytes):
        return 7 / 8 * nbytes / bw + 7 * lat

    ct = comm_times(LLAMA8, tr, H100_16, b)
    assert ct["cp_qkv_a2a_s"][0] == pytest.approx(one(4 * MiB) + 2 * one(MiB), rel=1e-12)
    assert ct["cp_out_a2a_s"][0] == pytest.approx(one(4 * MiB), rel=1e-12)
    send = coll.p2p_time(2 * MiB, outer.p2p_bw_bytes_per_s, outer.latency_s)[0]
    assert ct["cp_kv_send_s"][0] == pytest.approx(send, rel=1e-12)
    assert outer.tier[0] > 0 and inner.tier[0] == 0  # the ring crosses the nodes, a2a does not
    # bytes: all-to-alls 2 passes x 7/8 x 10 MiB, ring 1 + 2 sends of 2 MiB, 32 layers
    sent = comm_bytes_per_gpu(LLAMA8, tr, b)["cp"][0]
    assert sent == pytest.approx(32 * (2 * 7 / 8 * 10 * MiB + 3 * 2 * MiB), rel=1e-12)


def test_resolve_fills_the_sizes_from_the_node_and_checks_given_ones():
    tr = load_training(global_batch_size=4, seq_len=65536)
    c = resolve_config(ParallelConfig(dp=4, tp=2, cp=8, cp_comm="a2a+p2p"), LLAMA8, tr,
                       load_cluster("dgx-h100", gpus=64))
    assert c.cp_a2a == 4 and c.model_dump()["cp_a2a"] == 4
    assert "cp_a2a" not in ParallelConfig(cp=8).model_dump()  # None: left out of the dump
    with pytest.raises(SpecError, match="give cp_a2a") as e:
        resolve_config(ParallelConfig(dp=4, tp=2, cp=8, cp_comm="a2a+p2p"), LLAMA8, tr)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(SpecError, match="no all-to-all group"):  # tp 8 leaves no room in a node
        resolve_config(ParallelConfig(dp=1, tp=8, cp=8, cp_comm="a2a+p2p"), LLAMA8, tr,
                       load_cluster("dgx-h100", gpus=64))
    with pytest.raises(ValueError, match="cp_a2a"):
        ParallelConfig(cp=8, cp_comm="a2a+p2p", cp_a2a=8)  # A = cp is Ulysses


# ------------------------------------------------------------------------------------------
# search and batches
# ------------------------------------------------------------------------------------------
def test_search_tries_the_new_types_where_the_framework_runs_them():
    kw = {"gpus": 64, "global_batch_size": 64, "seq_len": 131072, "pp": 1, "top": 400}
    r = search.plan("llama3.1-8b", "dgx-h100", framework="bridge-26.02", **kw)
    seen = {x["config"]["cp_comm"] for x in r.rows if x["config"]["cp"] > 1}
    assert {"allgather", "a2a+p2p"} <= seen
    for x in r.rows:
        c = x["config"]
        if c["cp_comm"] == "a2a+p2p":  # the a2a part fills the node and splits the heads
            assert c["cp_a2a"] == int(hierarchical_a2a_size(32, 8, c["tp"], c["cp"], 8))
            assert 1 < c["cp_a2a"] < c["cp"] and bool(a2a_heads_ok(32, 8, c["tp"], c["cp_a2a"]))
    r = search.plan("llama3.1-8b", "dgx-h100", framework="nemo-24.09", **kw)
    assert {x["config"]["cp_comm"] for x in r.rows} == {"p2p"}
    with pytest.raises(SpecError, match="torchtitan does not run cp_comm = allgather"):
        search.plan("llama3.1-8b", "dgx-h100", framework="torchtitan", cp_comm="allgather", **kw)


def test_each_type_wins_somewhere():
    """Llama 3.1 8B on H100 nodes (the docs' worked example): Ulysses inside one node, the
    ring where tp 8 leaves one K/V head and its sends hide, the all-gather where tp 4 x cp 16
    makes the ring's 16 steps short and leaves no in-node all-to-all of two, the hierarchy
    where cp 64 spans eight nodes."""
    def best(gpus, seq, tp, cp):
        r = search.plan("llama3.1-8b", "dgx-h100", gpus=gpus, global_batch_size=gpus // (tp * cp),
                        seq_len=seq, tp=tp, pp=1, cp=cp, zero_stage=1, micro_batch_size=1,
                        recompute="full", sequence_parallel=tp > 1, schedule="1f1b",
                        framework="ideal", top=10)
        return r.rows[0]["config"]["cp_comm"]

    assert best(8, 32768, 1, 8) == "a2a"
    assert best(64, 131072, 8, 8) == "p2p"
    assert best(64, 32768, 4, 16) == "allgather"
    assert best(64, 262144, 1, 64) == "a2a+p2p"


def test_batch_equals_one_by_one_with_all_four_types():
    """A search batch (over 256 rows: the per-shape caches) prices each row as alone."""
    n = 300
    types = np.array(["p2p", "a2a", "allgather", "a2a+p2p"])[np.arange(n) % 4]
    b = ConfigBatch.from_arrays(dp=1, tp=1, cp=16, num_microbatches=8, micro_batch_size=1,
                                recompute="selective", cp_comm=types,
                                cp_a2a=np.where(types == "a2a+p2p", 8, 1))
    whole = evaluate(LLAMA8, TR, H100_16, b)
    for i in range(8):
        alone = evaluate(LLAMA8, TR, H100_16, b.take(np.array([i])))
        assert whole.step_time_s[i] == pytest.approx(alone.step_time_s[0], rel=1e-12)
        assert whole.memory_bytes["peak"][i] == pytest.approx(alone.memory_bytes["peak"][0],
                                                              rel=1e-12)
    assert len(set(np.round(whole.step_time_s[:4], 9))) == 4


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), mbs=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_cp1_is_the_same_for_the_new_types(tp, mbs, recompute):
    """With cp = 1 the communication type changes nothing."""
    rows = {cc: ConfigBatch.from_arrays(dp=8 // tp, tp=tp, cp=1, micro_batch_size=mbs,
                                        num_microbatches=8 * tp // (8 * mbs) or 1,
                                        recompute=recompute, sequence_parallel=tp > 1,
                                        cp_comm=cc) for cc in ("p2p", "allgather", "a2a+p2p")}
    r = {cc: evaluate(LLAMA8, TR, H100, b) for cc, b in rows.items()}
    for cc in ("allgather", "a2a+p2p"):
        assert r[cc].step_time_s[0] == r["p2p"].step_time_s[0]
        assert r[cc].memory_bytes["peak"][0] == r["p2p"].memory_bytes["peak"][0]


@settings(max_examples=50, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([2, 4, 6, 8, 12, 16, 32, 64]),
       heads=st.sampled_from([(32, 8), (64, 8), (96, 96), (128, 8), (40, 10)]),
       node=st.sampled_from([4, 8, 72]))
def test_hierarchical_size_is_the_largest_that_fits(tp, cp, heads, node):
    """The a2a size divides cp, fits the node with tp and splits the heads, and no larger one
    does."""
    q, kv = heads
    got = int(hierarchical_a2a_size(q, kv, tp, cp, node))

    def ok(x):
        return cp % x == 0 and tp * x <= node and bool(a2a_heads_ok(q, kv, tp, x))

    assert got == 1 or ok(got)
    assert not any(ok(x) for x in range(got + 1, cp + 1))


def test_strategies_agree_over_all_four_types():
    """cp_comm searched as a gene with the four types: the DP strategy finds the grid's best."""
    kw = {"gpus": 32, "global_batch_size": 8, "seq_len": 131072, "pp": 1, "framework": "ideal",
          "top": 1}
    grid = search.plan("llama3.1-8b", "dgx-h100", strategy="grid", **kw).rows[0]
    dp = search.plan("llama3.1-8b", "dgx-h100", strategy="dp", **kw).rows[0]
    assert dp["step_time_s"] == pytest.approx(grid["step_time_s"], rel=1e-12)


def test_evaluate_fills_a_missing_hierarchical_size_from_the_node():
    bare = ConfigBatch.from_arrays(dp=1, tp=1, cp=16, num_microbatches=8, cp_comm="a2a+p2p")
    named = ConfigBatch.from_arrays(dp=1, tp=1, cp=16, num_microbatches=8, cp_comm="a2a+p2p",
                                    cp_a2a=8)
    assert bare.config(0).cp_a2a is None and named.config(0).cp_a2a == 8
    t = [evaluate(LLAMA8, TR, H100_16, b).step_time_s[0] for b in (bare, named)]
    assert t[0] == t[1]
