"""Placement of parallel groups on tiered clusters."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.topology import group_placement, parallel_groups
from perfmodel.spec.specs import ClusterSpec, LinkTier, load_cluster, load_gpu

A100 = load_cluster("dgx-a100-80g")  # NVLink 300 GB/s x NCCL protocol 0.8 = 240 GB/s, 3 us, domain 8; HDR IB 25 GB/s, 8 us


def three_tier(oversub: float = 1.0) -> ClusterSpec:
    return ClusterSpec(
        name="toy3",
        gpu=load_gpu("a100-sxm4-80gb"),
        gpus_per_node=4,
        num_nodes=64,
        tiers=[
            {
                "name": "nvl",
                "kind": "nvlink",
                "domain_size": 4,
                "bw_gbyte_per_s": 400,
                "latency_us": 2,
            },
            {
                "name": "rack",
                "kind": "infiniband",
                "domain_size": 32,
                "bw_gbyte_per_s": 50,
                "latency_us": 5,
            },
            {
                "name": "dc",
                "kind": "ethernet",
                "bw_gbyte_per_s": 10,
                "latency_us": 20,
                "oversubscription": oversub,
            },
        ],
    )


def test_tensor_parallel_inside_node():
    g = group_placement(A100, 8, 1)
    assert g.tier == 0 and g.bw_bytes_per_s == pytest.approx(240e9)
    assert g.latency_s == pytest.approx(3e-6)
    assert g.intra_size == 8 and g.inter_size == 1


def test_data_parallel_one_member_per_node():
    # dp=4 with stride tp=8: every member on its own node -> one IB port per GPU
    g = group_placement(A100, 4, 8)
    assert g.tier == 1
    assert g.bw_bytes_per_s == pytest.approx(25e9)
    assert g.latency_s == pytest.approx(8e-6)
    assert g.intra_size == 1 and g.inter_size == 4


def test_group_spanning_two_full_nodes_uses_all_rails():
    # 16 GPUs, stride 1: the ring's node-boundary hop runs over 8 rails: min(240, 8*25) = 200 GB/s
    g = group_placement(A100, 16, 1)
    assert g.tier == 1
    assert g.bw_bytes_per_s == pytest.approx(200e9)
    assert g.p2p_bw_bytes_per_s == pytest.approx(25e9)
    assert g.intra_size == 8 and g.inter_size == 2
    assert g.intra_bw_bytes_per_s == pytest.approx(240e9)
    assert g.inter_bw_bytes_per_s == pytest.approx(25e9)


def test_misaligned_group_crosses():
    # block of 2*6 = 12 ranks does not divide 8: some groups straddle nodes
    assert group_placement(A100, 2, 6).tier == 1
    assert group_placement(A100, 2, 4).tier == 0


def test_group_of_one():
    g = group_placement(A100, 1, 8)
    assert g.tier == -1 and g.inter_size == 1


def test_three_tiers_and_oversubscription():
    c = three_tier(oversub=2.0)
    g = group_placement(c, [4, 8, 64, 64], [1, 1, 1, 4])
    np.testing.assert_array_equal(g.tier, [0, 1, 2, 2])
    # 8 in a rack: min(400, 4*50) = 200; 64 stride 1: min(400, 4*50, 32*10/2) = 160;
    # 64 stride 4: one per node, 8 per rack: min(1*50, 8*5) = 40
    np.testing.assert_allclose(g.bw_bytes_per_s, [400e9, 200e9, 160e9, 40e9])
    np.testing.assert_allclose(g.p2p_bw_bytes_per_s, [400e9, 50e9, 5e9, 5e9])
    np.testing.assert_allclose(g.latency_s, [2e-6, 5e-6, 20e-6, 20e-6])
    # hierarchical split of the 64-GPU stride-1 group: 4 per NVLink domain, 16 domains, whose
    # one-per-domain ring spans racks with 8 members per rack: min(50, 8*5)
    assert g.intra_size[2] == 4 and g.inter_size[2] == 16
    assert g.inter_bw_bytes_per_s[2] == pytest.approx(40e9)


def test_parallel_groups_layout():
    b = ConfigBatch.from_arrays(dp=[4, 2], tp=[8, 2], pp=[2, 4], cp=[1, 2])
    gr = parallel_groups(A100, b)
    assert set(gr) == {"tp", "cp", "dp", "dp_cp", "pp"}
    np.testing.assert_array_equal(gr["cp"].stride, [8, 2])
    np.testing.assert_array_equal(gr["dp"].stride, [8, 4])
    np.testing.assert_array_equal(gr["dp_cp"].size, [4, 4])
    np.testing.assert_array_equal(gr["pp"].stride, [32, 8])
    np.testing.assert_array_equal(gr["tp"].tier, [0, 0])
    np.testing.assert_array_equal(gr["dp"].tier, [1, 0])  # 4 x stride 8 spans nodes; 2 x 4 = 8 fits
    np.testing.assert_array_equal(gr["pp"].tier, [1, 1])


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 6), st.integers(0, 6), st.floats(1.0, 16.0))
def test_bandwidth_between_slowest_port_and_fastest(log_g, log_s, oversub):
    c = three_tier(oversub)
    g = group_placement(c, 2**log_g, 2**log_s)
    if 2**log_g > 1:
        assert 10e9 / oversub * (1 - 1e-12) <= g.bw_bytes_per_s <= 400e9 * (1 + 1e-12)
        inside = 2 ** (log_g + log_s) <= 4
        assert (g.tier == 0) == inside


# --------------------------------------------------------------------------------------------
# Measured nccl-tests bus bandwidth per tier
# --------------------------------------------------------------------------------------------
def pcie_box(table: dict | None) -> ClusterSpec:
    """One node of 8 GPUs on PCIe (31.5 GB/s x 0.8), two nodes on 12.5 GB/s, with ``table`` as
    the PCIe tier's measured busbw."""
    base = load_cluster("pcie-a100-8").with_gpus(16)
    tiers = [base.tiers[0].model_copy(update={"busbw_gbyte_per_s": table}), base.tiers[1]]
    return base.model_copy(update={"tiers": tiers})


def test_measured_busbw_interpolates_in_log_group_size():
    cl = pcie_box({"all_reduce": {2: 20.0, 8: 12.0}})
    # 4 GPUs: halfway between 2 and 8 in log2 -> (20 + 12) / 2 = 16 GB/s; 8 GPUs: 12 GB/s
    g = group_placement(cl, np.array([2, 4, 8]), 1)
    col = g.measured_bw_bytes_per_s("all_reduce")
    assert col == pytest.approx([20e9, 16e9, 12e9])
    # a collective without its own row takes the all-reduce row (busbw compares across them)
    assert g.bw_for("all_gather") == pytest.approx([20e9, 16e9, 12e9])


def test_measured_busbw_only_on_its_tier():
    cl = pcie_box({"all_reduce": {8: 12.6}})
    g = group_placement(cl, np.array([1, 8, 2]), np.array([1, 1, 8]))
    # tp=1: no group; 8 GPUs inside the node: measured; 2 GPUs across nodes: tier 1, analytic
    assert np.isnan(g.measured_bw_bytes_per_s("all_reduce")[[0, 2]]).all()
    assert g.bw_for("all_reduce")[1] == pytest.approx(12.6e9)
    assert g.bw_for("all_reduce")[2] == pytest.approx(12.5e9 / 8)  # 12.5 Gb/s


def test_no_table_is_nan_and_keeps_the_analytic_bandwidth():
    g = group_placement(pcie_box(None), np.array([8]), 1)
    assert np.isnan(g.busbw_bytes_per_s).all() and g.busbw_bytes_per_s.shape == (1, 4)
    assert g.bw_for("all_reduce") == pytest.approx([31.5e9 * 0.8])


def test_busbw_table_rejects_group_of_one():
    tier = load_cluster("pcie-a100-8").tiers[0].model_dump()
    with pytest.raises(ValueError, match="group size \\(1\\) must be at least 2"):
        LinkTier(**(tier | {"busbw_gbyte_per_s": {"all_reduce": {1: 12.6}}}))
    with pytest.raises(ValueError, match="all_reduce"):
        LinkTier(**(tier | {"busbw_gbyte_per_s": {"allreduce": {8: 12.6}}}))
