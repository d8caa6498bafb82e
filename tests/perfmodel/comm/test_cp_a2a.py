"""Ulysses all-to-all context parallelism (:mod:`perfmodel.comm.cp_a2a`): hand-computed numbers,
the head constraint and invariants, and the ring-versus-all-to-all comparison."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import search
from perfmodel.comm import cp_a2a
from perfmodel.comm.comm_time import comm_times
from perfmodel.comm.comm_volume import comm_bytes_per_gpu
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, a2a_heads_ok, resolve_config
from perfmodel.parallel.topology import parallel_groups
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate

LLAMA8 = load_model("llama3.1-8b")  # 32 heads, 8 K/V heads of 128, 32 layers
H100 = load_cluster("dgx-h100", gpus=8)
TR = load_training(global_batch_size=8, seq_len=8192, precision="bf16")
MiB = 2**20


def a(*x):
    return np.array(x, dtype=np.float64)


def test_buffers_hand():
    # 4096 tokens x 8 query heads x 128 x 2 bytes = 8 MiB; K, V over 2 heads: 2 MiB
    b = cp_a2a.a2a_buffer_bytes(4096, 8, 2, 128, 128, 2.0)
    assert [b[k] / MiB for k in ("q", "k", "v", "out")] == [8.0, 2.0, 2.0, 8.0]


def test_layer_hand():
    # cp 4: Q, K, V 1.5 ms and out 1 ms, forward + backward = 2 x 2.5 ms; full recompute
    # re-runs the forward's: 3 x 2.5 ms; half the layers with attention: half; cp 1: nothing
    t = cp_a2a.a2a_layer_s(a(4, 4, 1), a(1.5e-3, 1.5e-3, 1.5e-3), a(1e-3, 1e-3, 1e-3),
                           np.array([False, True, False]))
    assert t == pytest.approx(a(5e-3, 7.5e-3, 0.0), rel=1e-12)
    assert cp_a2a.a2a_layer_s(a(4), a(1.5e-3), a(1e-3), np.array([False]), 0.5) == (
        pytest.approx(a(2.5e-3), rel=1e-12))


def test_reshape_bytes_hand():
    # buffers of 8, 2, 2, 8 MiB: two copies (read + write) of each, 4 x 20 MiB in 8 kernels
    nbytes, kernels = cp_a2a.a2a_reshape_bytes(
        {"q": a(8 * MiB), "k": a(2 * MiB), "v": a(2 * MiB), "out": a(8 * MiB)}, a(4), "fwd")
    assert nbytes[0] == 80 * MiB and kernels[0] == 8


def test_comm_times_hand_one_node():
    # llama3.1-8b, seq 8192 over cp 8 inside one NVLink node (tp 1): 1024 tokens per rank.
    # Q = out = 1024 x 32 x 128 x 2 B = 8 MiB, K = V = 1024 x 8 x 128 x 2 B = 2 MiB.
    # Each all-to-all sends 7/8 of its buffer over NVLink and pays 7 latencies.
    b = ConfigBatch.from_arrays(dp=1, tp=1, cp=8, num_microbatches=8, cp_comm="a2a")
    g = parallel_groups(H100, b, ("cp",))["cp"]
    bw, lat = float(g.intra_bw_bytes_per_s[0]), float(g.latency_s[0])

    def one(nbytes):
        return 7 / 8 * nbytes / bw + 7 * lat

    ct = comm_times(LLAMA8, TR, H100, b)
    assert ct["cp_qkv_a2a_s"][0] == pytest.approx(one(8 * MiB) + 2 * one(2 * MiB), rel=1e-12)
    assert ct["cp_out_a2a_s"][0] == pytest.approx(one(8 * MiB), rel=1e-12)
    assert ct["cp_layer_fwd_s"][0] == pytest.approx(
        ct["cp_qkv_a2a_s"][0] + ct["cp_out_a2a_s"][0], rel=1e-12)
    # bytes per GPU per step: 8 micro-batches x 32 layers x (fwd + bwd) x 7/8 x 20 MiB
    sent = comm_bytes_per_gpu(LLAMA8, TR, b)["cp"][0]
    assert sent == pytest.approx(8 * 32 * 2 * 7 / 8 * 20 * MiB, rel=1e-12)


def test_heads_constraint():
    # 32 query / 8 K/V heads: tp 1 takes cp 2, 4, 8; tp 2 leaves 16 / 4 heads: cp 4, not 8;
    # tp 8 leaves one K/V head: no a2a; cp 1 always
    ok = a2a_heads_ok(32, 8, a(1, 1, 1, 2, 2, 8, 8), a(8, 16, 2, 4, 8, 2, 1))
    assert ok.tolist() == [True, False, True, True, False, False, True]


def test_pinned_a2a_heads_not_divisible_is_one_line():
    c = ParallelConfig(dp=1, tp=2, cp=8, cp_comm="a2a")
    with pytest.raises(SpecError, match=r"cp_comm 'a2a': cp \(8\) must divide") as e:
        resolve_config(c, LLAMA8, load_training(global_batch_size=1, seq_len=8192))
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(SpecError, match="cp_comm 'a2a'"):
        search.plan("llama3.1-8b", "dgx-h100", gpus=16, global_batch_size=1, seq_len=8192,
                    tp=2, pp=1, cp=8, zero_stage=0, micro_batch_size=1, recompute="full",
                    sequence_parallel=True, schedule="1f1b", cp_comm="a2a")


def test_space_leaves_out_what_the_heads_do_not_divide():
    r = search.plan("llama3.1-8b", "dgx-h100", gpus=16, global_batch_size=16, seq_len=32768,
                    pp=1, cp_comm=["p2p", "a2a"], framework="ideal", top=200)
    seen = {(x["config"]["tp"], x["config"]["cp"], x["config"]["cp_comm"]) for x in r.rows}
    assert any(cc == "a2a" for _, _, cc in seen)
    for tp, cp, cc in seen:
        if cc == "a2a":
            assert cp > 1 and bool(a2a_heads_ok(32, 8, tp, cp))


def test_framework_without_a2a_refuses_a_pinned_a2a():
    with pytest.raises(SpecError, match="nemo-24.09 does not run cp_comm = a2a: it runs p2p"):
        search.plan("llama3.1-8b", "dgx-h100", gpus=16, global_batch_size=16, seq_len=32768,
                    cp_comm="a2a", framework="nemo-24.09")


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), mbs=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_cp1_is_the_same_whatever_the_cp_comm(tp, mbs, recompute):
    """With cp = 1 there is no context parallelism: the communication type changes nothing."""
    rows = {cc: ConfigBatch.from_arrays(dp=8 // tp, tp=tp, cp=1, micro_batch_size=mbs,
                                        num_microbatches=8 * tp // (8 * mbs) or 1,
                                        recompute=recompute, sequence_parallel=tp > 1,
                                        cp_comm=cc) for cc in ("p2p", "a2a")}
    r = {cc: evaluate(LLAMA8, TR, H100, b) for cc, b in rows.items()}
    assert r["a2a"].step_time_s[0] == r["p2p"].step_time_s[0]
    assert r["a2a"].memory_bytes["peak"][0] == r["p2p"].memory_bytes["peak"][0]


def test_batch_equals_one_by_one_with_mixed_cp_comm():
    """A search batch (over 256 rows: the per-shape caches) prices each row as alone."""
    n = 300
    cc = np.where(np.arange(n) % 2 == 0, "p2p", "a2a")
    tp = np.where(np.arange(n) % 3 == 0, 1, 2)
    b = ConfigBatch.from_arrays(dp=2 // tp, tp=tp, cp=4, num_microbatches=4 * tp,
                                micro_batch_size=1, recompute="selective",
                                sequence_parallel=tp > 1, cp_comm=cc)
    cl = load_cluster("dgx-h100", gpus=8)
    whole = evaluate(LLAMA8, TR, cl, b).step_time_s
    for i in (0, 1, 2, 3):
        alone = evaluate(LLAMA8, TR, cl, b.take(np.array([i]))).step_time_s[0]
        assert whole[i] == pytest.approx(alone, rel=1e-12)
    assert whole[0] != whole[1] or whole[2] != whole[3]


def _step(model, gpus, seq, tp, cp, cc):
    r = search.plan(model, "dgx-h100", gpus=gpus, global_batch_size=gpus // (tp * cp),
                    seq_len=seq, tp=tp, pp=1, cp=cp, zero_stage=1, micro_batch_size=1,
                    recompute="full", sequence_parallel=tp > 1, schedule="1f1b", cp_comm=cc,
                    framework="ideal")
    row = r.rows[0] if r.rows else r.smallest
    return row["step_time_s"], row["time_s"]["cp_comm"]


def test_a2a_beats_the_ring_that_cannot_hide_its_kv():
    """Llama-2-7B (32 heads, no GQA), 32K tokens over cp 16 on two nodes: a ring step's K/V
    chunk (2K tokens x 4096 x 2 x 2 B) takes longer than its attention block, and the ring
    sends all of K/V through each GPU; the all-to-alls send ``4/cp`` of the sequence's Q, K, V,
    out. Jacobs et al. 2023 (DeepSpeed-Ulysses), Sec. 3.2 and Fig. 2: the all-to-all's volume per
    link falls with the degree, the ring's does not."""
    ring_s, ring_exposed = _step("llama2-7b", 16, 32768, 1, 16, "p2p")
    a2a_s, _ = _step("llama2-7b", 16, 32768, 1, 16, "a2a")
    assert ring_exposed > 0 and a2a_s < ring_s


def test_ring_wins_across_nodes_where_it_hides_its_kv():
    """GPT-3 175B (96 heads), 256K tokens on tp 8 x cp 4 (the cp group spans four nodes): each
    ring step's K/V send hides under its attention block, while the all-to-alls over the
    InfiniBand ports are exposed. Fang and Zhao 2024 (USP, arXiv:2405.07719): all-to-all is
    sensitive to inter-node bandwidth, the ring overlaps its P2P with attention; their hybrid
    keeps Ulysses inside a node and the ring across nodes."""
    ring_s, ring_exposed = _step("gpt3-175b", 32, 262144, 8, 4, "p2p")
    a2a_s, a2a_exposed = _step("gpt3-175b", 32, 262144, 8, 4, "a2a")
    assert ring_exposed == 0 and a2a_exposed > 0 and ring_s < a2a_s


def _scaled(cluster, f):
    tiers = [t.model_copy(update={"bw_gbyte_per_s": t.bw_bytes_per_s * f / 1e9,
                                  "bw_gbit_per_s": None}) for t in cluster.tiers]
    return cluster.model_copy(update={"tiers": tiers})


@settings(max_examples=25, deadline=None)
@given(f=st.floats(1.0, 8.0), cp=st.sampled_from([2, 4, 8]), tp=st.sampled_from([1, 2]))
def test_more_bandwidth_never_slows_the_all_to_alls(f, cp, tp):
    """On faster links (every tier ``f`` times the bandwidth) the all-to-alls take no longer,
    whether the cp group stays in a node or spans two."""
    model = load_model("llama2-7b")
    b = ConfigBatch.from_arrays(dp=16 // (tp * cp), tp=tp, cp=cp, num_microbatches=1,
                                sequence_parallel=tp > 1, cp_comm="a2a")
    cl = load_cluster("dgx-h100", gpus=16)
    slow, fast = (comm_times(model, TR, c, b) for c in (cl, _scaled(cl, f)))
    for k in ("cp_qkv_a2a_s", "cp_out_a2a_s", "cp_layer_fwd_s", "cp_layer_bwd_s"):
        assert fast[k][0] <= slow[k][0] * (1 + 1e-12)


def test_strategies_agree_when_cp_comm_is_searched():
    """cp_comm searched as a gene (both offered): the DP strategy finds the grid's best."""
    kw = {"gpus": 16, "global_batch_size": 16, "seq_len": 32768, "pp": 1,
          "cp_comm": ["p2p", "a2a"], "framework": "ideal", "top": 1}
    grid = search.plan("llama2-7b", "dgx-h100", strategy="grid", **kw).rows[0]
    dp = search.plan("llama2-7b", "dgx-h100", strategy="dp", **kw).rows[0]
    assert dp["step_time_s"] == pytest.approx(grid["step_time_s"], rel=1e-12)
