"""Expert rank layout with and without MoE parallel folding (perfmodel.moe.expert_layout) and the
nested group placement it uses (perfmodel.parallel.topology.nested_group_placement)."""

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.comm.comm_time import moe_comm_times
from perfmodel.moe import expert_layout as el
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch, ParallelConfig
from perfmodel.parallel.topology import group_placement, nested_group_placement
from perfmodel.spec.specs import TrainingSpec, load_cluster, load_model

H100 = load_cluster("dgx-h100", gpus=512)  # 8-GPU nodes, NVLink 450 GB/s; NDR IB 50 GB/s a GPU
NVL, IB = 450e9, 50e9
MIX = load_model("mixtral-8x7b")


def _batch(**kw) -> ConfigBatch:
    base = {"tp": 4, "pp": 8, "cp": 2, "dp": 8, "ep": 8, "etp": 4, "sequence_parallel": True,
            "num_microbatches": 4}
    return ConfigBatch.from_configs([ParallelConfig(**{**base, **kw})])


def _levels(lv):
    return [(int(g[0]), int(s[0])) for g, s in lv]


def test_levels_tp4_cp2_ep8_by_hand():
    b = _batch()  # 512 GPUs: tp 4, cp 2, dp 8, pp 8
    pre = el.expert_group_levels(b, folding=False)
    # Megatron-Core 0.9, order tp-cp-ep-dp-pp with dp split into ep x dp/ep: ep stride tp*cp = 8
    assert _levels(pre["ep"]) == [(8, 8)]
    assert _levels(pre["etp"]) == [(4, 1)]  # the tp group
    assert _levels(pre["ep_etp"]) == [(4, 1), (8, 8)]  # 'tp-ep': not contiguous with cp 2
    # 'dp-cp' with independent ep: cp 2 ranks tp = 4 apart, dp/ep = 1 rank 64 apart
    assert _levels(pre["expert_dp"]) == [(2, 4), (1, 64)]
    fold = el.expert_group_levels(b, folding=True)
    # Megatron-Core >= 0.10, expert generator tp-ep-dp-pp: ep stride etp = 4, expert-dp
    # 4*2*8 / (8*4) = 2 ranks ep*etp = 32 apart
    assert _levels(fold["ep"]) == [(8, 4)]
    assert _levels(fold["expert_dp"])[0] == (2, 32)
    assert _levels(fold["ep_etp"])[0] == (32, 1)


def test_ep_group_spans_eight_nodes_before_folding():
    b = _batch()
    pre = el.expert_groups(H100, b, folding=False)
    fold = el.expert_groups(H100, b, folding=True)
    # ep 8 ranks 8 apart on 8-GPU nodes: one member a node, 8 nodes, over InfiniBand
    assert pre["ep"].size[0] == 8 and pre["ep"].intra_size[0] == 1 and pre["ep"].tier[0] == 1
    assert pre["ep"].inter_size[0] == 8
    # folded: 4 ranks apart, two members in each of 4 nodes
    assert fold["ep"].intra_size[0] == 2 and fold["ep"].inter_size[0] == 4
    # expert-dp: 2 ranks 4 apart inside one node before folding, 32 apart (two nodes) after
    assert pre["expert_dp"].size[0] == 2 and pre["expert_dp"].tier[0] == 0
    assert fold["expert_dp"].size[0] == 2 and fold["expert_dp"].tier[0] == 1


def test_all_to_all_on_the_two_layouts_by_hand():
    b = _batch()
    pre = el.expert_groups(H100, b, folding=False)["ep"]
    fold = el.expert_groups(H100, b, folding=True)["ep"]
    s = 1e6  # bytes a GPU sends into the all-to-all
    # before folding: 7 of 8 peers in other nodes: 7/8 * 1 MB / 50 GB/s + 7 * 8 us
    assert moe.all_to_all_tiered_time(s, pre)[0] == pytest.approx(0.875e6 / IB + 7 * 8e-6)
    # folded: 1 peer over NVLink, 6 over IB: max(1/8 MB / 450 GB/s, 6/8 MB / 50 GB/s) + 7 * 8 us
    assert moe.all_to_all_tiered_time(s, fold)[0] == pytest.approx(0.75e6 / IB + 7 * 8e-6)


def test_tp_ep_nested_group_by_hand():
    # 'tp-ep' before folding with cp 2: ranks {0..3, 8..11, ..., 56..59}
    g = nested_group_placement(H100, (([4], [1]), ([8], [8])))
    assert g.size[0] == 32 and g.tier[0] == 1
    assert g.intra_size[0] == 4 and g.inter_size[0] == 8
    # ring: NVLink inside the node, then 4 members' IB ports across: min(450, 4 * 50) GB/s
    assert g.bw_bytes_per_s[0] == pytest.approx(min(NVL, 4 * IB))
    assert g.inter_bw_bytes_per_s[0] == pytest.approx(IB)


@settings(max_examples=60, deadline=None)
@given(a=st.sampled_from([1, 2, 4, 8, 16]), b=st.sampled_from([1, 2, 4, 8, 16]),
       s=st.sampled_from([1, 2, 4, 8, 16, 32]),
       cluster=st.sampled_from(["dgx-h100", "dgx-a100-80g", "dgx-b200"]))
def test_two_levels_without_a_gap_are_one_level(a, b, s, cluster):
    # a ranks s apart times b ranks a*s apart are a*b ranks s apart
    c = load_cluster(cluster, gpus=4096)
    one = group_placement(c, a * b, s)
    two = nested_group_placement(c, ((a, s), (b, a * s)))
    for f in fields(one):
        np.testing.assert_allclose(getattr(two, f.name), getattr(one, f.name), err_msg=f.name)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4, 8, 16]),
       ep=st.sampled_from([1, 2, 4, 8]))
def test_layouts_coincide_without_context_parallelism(tp, dp, ep):
    # cp = 1 and etp = tp: ep ranks tp apart, expert-dp dp/ep ranks ep*tp apart in both
    b = ConfigBatch.from_configs([ParallelConfig(tp=tp, pp=1, cp=1, dp=dp * ep, ep=ep, etp=tp,
                                                     num_microbatches=1)])
    pre = el.expert_groups(H100, b, folding=False)
    fold = el.expert_groups(H100, b, folding=True)
    for k in ("ep", "etp", "ep_etp", "expert_dp"):
        for f in fields(pre[k]):
            if f.name != "stride":
                np.testing.assert_allclose(getattr(pre[k], f.name), getattr(fold[k], f.name),
                                           err_msg=f"{k}.{f.name}")


def test_sp2hp_all_to_all_bytes_by_hand():
    b = _batch()
    t = 1 * 8192 / (2 * 4)  # b*s/(cp*tp) = 1024 tokens a GPU
    assert el.sp2hp_all_to_all_bytes(t, 6144, 2.0, b, folding=False)[0] == 1024 * 6144 * 2
    assert el.sp2hp_all_to_all_bytes(t, 6144, 2.0, b, folding=True)[0] == 0.0
    assert el.sp2hp_all_to_all_bytes(t, 6144, 2.0, _batch(tp=1, etp=1, dp=32, sequence_parallel=False),
                                     folding=False)[0] == 0.0
    assert el.sp2hp_all_to_all_bytes(t, 6144, 2.0, _batch(ep=1), folding=False)[0] == 0.0


def test_moe_comm_times_follow_the_layout():
    cl = load_cluster("dgx-h100", gpus=64)
    tr = TrainingSpec(global_batch_size=256, seq_len=4096)
    pre_tr = tr.model_copy(update={"moe_parallel_folding": False})
    b = _batch(pp=1, dp=8)  # 64 GPUs: tp 4, cp 2, dp 8, ep 8, etp 4
    fold, pre = moe_comm_times(MIX, tr, cl, b), moe_comm_times(MIX, pre_tr, cl, b)
    # the ep group one member a node (8 nodes) instead of two a node, plus the tp all-to-all
    groups_pre = el.expert_groups(cl, b, False)
    groups_fold = el.expert_groups(cl, b, True)
    s = moe.routed_tokens_per_gpu(MIX, tr, b) * MIX.hidden_size * 2.0
    sp = moe.tokens_per_gpu(tr, b) * MIX.hidden_size * 2.0
    extra = (moe.all_to_all_tiered_time(s, groups_pre["ep"])
             - moe.all_to_all_tiered_time(s, groups_fold["ep"])
             + moe.all_to_all_tiered_time(sp, groups_pre["etp"]))
    assert extra[0] > 0
    np.testing.assert_allclose(pre["ep_layer_fwd_s"] - fold["ep_layer_fwd_s"], 2 * extra)
    # the expert gradients reduce inside a node before folding (cp ranks tp apart)
    assert pre["expert_dp_grad_s"][0] < fold["expert_dp_grad_s"][0]
    # tp 1, cp 1: the same numbers
    b1 = _batch(tp=1, etp=1, cp=1, pp=1, dp=64, sequence_parallel=False)
    for k, v in moe_comm_times(MIX, tr, cl, b1).items():
        np.testing.assert_array_equal(moe_comm_times(MIX, pre_tr, cl, b1)[k], v, err_msg=k)
