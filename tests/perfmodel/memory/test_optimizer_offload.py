"""Optimizer and parameter offload (perfmodel.memory.optimizer_offload): hand numbers, and
offload never raises peak HBM."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.comm.comm_volume import params_per_gpu
from perfmodel.memory import optimizer_offload as oo
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate

LLAMA = load_model("llama3.1-8b")
H100 = load_cluster("dgx-h100").with_gpus(16)


def test_cpu_adam_hand_numbers():
    c = load_cluster("dgx2-v100").with_gpus(1).model_copy(update={"cpu_cores_per_node": 48})
    assert oo.cpu_adam_params_per_s(c) == pytest.approx(48 * 8.1e7)
    assert oo.cpu_adam_s(10e9, 3.9e9) == pytest.approx(2.564, rel=1e-3)
    # default: 14 cores per GPU
    assert oo.cpu_adam_params_per_s(H100) == pytest.approx(14 * 8.1e7)


def test_offloaded_step_hand_number():
    # 1e9 host parameters, 4 B gradients (80 ms at 50 GB/s, hidden in a 100 ms window),
    # Adam 250 ms at 4e9 per s, 2 B weights back (40 ms): 0.29 s
    t = oo.offload_optimizer_step_s(0.02, 1e9, 1.0, 4.0, 2.0, 50e9, 4e9, 0.1, True)
    assert t == pytest.approx(0.29)
    # not overlapped: + 80 ms; half on the GPU: the host path still dominates
    assert oo.offload_optimizer_step_s(0.02, 1e9, 1.0, 4.0, 2.0, 50e9, 4e9, 0.1, False) == (
        pytest.approx(0.37))
    assert oo.offload_optimizer_step_s(10.0, 0.0, 0.5, 4.0, 2.0, 50e9, 4e9, 0.1, True) == 5.0
    assert oo.param_fetch_s(3, 1e9, 50e9) == pytest.approx(0.06)


def test_host_link_from_cluster_or_gpu():
    assert oo.host_link_of(H100) == pytest.approx(55.2e9)
    c = H100.model_copy(update={"host_link_gbyte_per_s": 450.0})
    assert oo.host_link_of(c) == 450e9


@settings(max_examples=12, deadline=None)
@given(dp=st.sampled_from([2, 4, 8, 16]), zero=st.integers(0, 3),
       kinds=st.sets(st.sampled_from(["optimizer", "params", "activations"]), min_size=1),
       frac=st.sampled_from([0.25, 0.5, 1.0]), recompute=st.sampled_from(["none", "full"]))
def test_offload_never_raises_peak_hbm(dp, zero, kinds, frac, recompute):
    b = ConfigBatch.from_arrays(dp=dp, tp=16 // dp, zero_stage=zero, micro_batch_size=1,
                                num_microbatches=64 // dp, recompute=recompute,
                                sequence_parallel=16 // dp > 1)
    t0 = load_training(global_batch_size=64, seq_len=4096)
    t1 = load_training(t0, offload=tuple(sorted(kinds)), optimizer_offload_fraction=frac,
                       cpu_offload_layers=LLAMA.num_layers if "activations" in kinds else 0)
    r0, r1 = evaluate(LLAMA, t0, H100, b), evaluate(LLAMA, t1, H100, b)
    assert np.all(r1.memory_bytes["peak"] <= r0.memory_bytes["peak"])
    assert np.all(r1.fits >= r0.fits)


def test_optimizer_offload_moves_states_and_costs_time():
    b = ConfigBatch.from_arrays(dp=16, tp=1, zero_stage=3, micro_batch_size=1,
                                num_microbatches=4, recompute="full")
    t0 = load_training(global_batch_size=64, seq_len=4096)
    r0 = evaluate(LLAMA, t0, H100, b)
    r1 = evaluate(LLAMA, load_training(t0, offload=("optimizer",)), H100, b)
    assert r1.memory_bytes["optimizer"][0] == 0.0 and r1.memory_bytes["gradients"][0] == 0.0
    assert r1.time_s["optimizer"][0] > r0.time_s["optimizer"][0]


def test_parameter_offload_fetches_the_shard_before_each_gather():
    b = ConfigBatch.from_arrays(dp=16, tp=1, zero_stage=3, micro_batch_size=1,
                                num_microbatches=4, recompute="none")
    t0 = load_training(global_batch_size=64, seq_len=4096, overlap_grad_reduce=False)
    r0 = evaluate(LLAMA, t0, H100, b)
    r1 = evaluate(LLAMA, load_training(t0, offload=("params",)), H100, b)
    # 2 gathers per micro-batch x 4 of the 16-bit shard (params of the GPU * 2 B / 16) at
    # 55.2 GB/s (PCIe Gen5 as measured on the H200)
    shard_bytes = params_per_gpu(LLAMA, b)[0] * 2.0 / 16
    np.testing.assert_allclose(r1.time_s["zero3_comm"] - r0.time_s["zero3_comm"],
                               8 * shard_bytes / 55.2e9, rtol=1e-3)
    assert r1.memory_bytes["weights"][0] == 0.0
