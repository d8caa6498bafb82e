"""Per-stage layouts (stage_layers, stage_recompute_layers) in the config, time and memory."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel import memory
from perfmodel.core.errors import SpecError
from perfmodel.memory import stage_layout as layout
from perfmodel.parallel import layers as layers_mod
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.step.evaluate import evaluate
from perfmodel.step.timeline import layout_timeline

MODEL = load_model("llama3.1-405b")
TRAINING = load_training(None, global_batch_size=256, seq_len=8192)
BASE = {"dp": 4, "tp": 8, "pp": 18, "micro_batch_size": 1, "sequence_parallel": True, "zero_stage": 1}
CLUSTER = load_cluster("dgx-h100", 4 * 8 * 18)


def _batch(*configs):
    return ConfigBatch.from_configs([resolve_config(c, MODEL, TRAINING, CLUSTER)
                                     for c in configs])


@pytest.mark.parametrize("rc", ["none", "selective", "full"])
def test_even_layout_predicts_the_even_split(rc):
    """126 layers as 18 x 7, written as a layout, predicts exactly what the even split does
    (time, memory, HFU): the layout composes the same per-layer terms."""
    even = ParallelConfig(**BASE, recompute=rc)
    lay = even.model_copy(update={"stage_layers": (7,) * 18})
    r = evaluate(MODEL, TRAINING, CLUSTER, _batch(even, lay))
    assert r.step_time_s[1] == pytest.approx(r.step_time_s[0], rel=1e-12)
    assert r.memory_bytes["peak"][1] == pytest.approx(r.memory_bytes["peak"][0], rel=1e-12)
    assert r.hfu[1] == pytest.approx(r.hfu[0], rel=1e-12)


@pytest.mark.parametrize("rc", ["none", "full"])
def test_even_layout_predicts_the_even_split_moe(rc):
    """An MoE model (Mixtral 8x7B, no dense leading layers, ep 8) written as an even layout
    predicts the even split's memory: experts by ep*etp, states over expert-dp, MoE
    activations, dispatch buffers, fp8 expert copies."""
    m = load_model("mixtral-8x7b")
    tr = load_training(None, global_batch_size=256, seq_len=4096, precision="fp8")
    cl = load_cluster("dgx-h100", 64)
    even = ParallelConfig(dp=16, tp=1, pp=4, ep=8, etp=1, micro_batch_size=1, zero_stage=1,
                          recompute=rc)
    lay = even.model_copy(update={"stage_layers": (8,) * 4})
    b = ConfigBatch.from_configs([resolve_config(c, m, tr, cl) for c in (even, lay)])
    r = evaluate(m, tr, cl, b)
    assert r.memory_bytes["peak"][1] == pytest.approx(r.memory_bytes["peak"][0], rel=1e-12)
    assert r.step_time_s[1] == pytest.approx(r.step_time_s[0], rel=1e-12)
    # the experts are there: 32/4 layers * 8 experts * 3*4096*14336 / ep 8, bf16 weights
    experts = 8 * 8 * 3 * 4096 * 14336 / 8
    assert r.memory_bytes["weights"][1] > 2 * experts


def test_block_recompute_of_every_layer_is_full_recompute():
    full = ParallelConfig(**BASE, recompute="full")
    block = full.model_copy(update={"stage_layers": (7,) * 18,
                                    "stage_recompute_layers": (7,) * 18})
    r = evaluate(MODEL, TRAINING, CLUSTER, _batch(full, block))
    assert r.step_time_s[1] == pytest.approx(r.step_time_s[0], rel=1e-12)
    assert r.memory_bytes["peak"][1] == pytest.approx(r.memory_bytes["peak"][0], rel=1e-12)


def test_stage_memory_moves_with_layers_and_recompute():
    """Hand relations of one stage's memory: one more layer adds its states and ``inflight``
    times its activations (plus the 3% allocator allowance on what the step allocates and
    frees: activations and buffers, not the contiguous state buffers); recomputing ``r`` of them
    saves
    ``inflight * r * (a_keep - a_ckpt)`` and adds one layer's full activations once."""
    b = _batch(ParallelConfig(**BASE, recompute="full"))
    st = lambda n, r: layout.stage_memory_bytes(MODEL, TRAINING, CLUSTER, b, np.array([[0]]),
                                                np.array([[n]]), np.array([[r]]))["peak"][0, 0]
    infl = 18.0  # 1F1B stage 0 of 18 with m = 256 / (4 * 1) = 64 micro-batches
    sp_ = memory.stage_params(MODEL, 8, 18)
    per_param = memory.state_bytes_per_param(
        "bf16", "adam", fp32_main_grads=TRAINING.grad_reduce_in_fp32)
    w, g, o = memory.zero_state_bytes(sp_["layer"], 4, 1, *per_param)
    kw = {"tp": 8, "sequence_parallel": True, "ffn_hidden_size": MODEL.ffn_hidden_size,
              "num_kv_heads": MODEL.kv_heads, "head_dim": MODEL.head_size, "gated_mlp": True, "flash": True,
              "dropout": False}
    a_keep = memory.layer_activation_bytes(8192, 1, MODEL.hidden_size,
                                           MODEL.num_attention_heads, recompute=0, **kw)
    a_ckpt = memory.layer_activation_bytes(8192, 1, MODEL.hidden_size,
                                           MODEL.num_attention_heads, recompute=2, **kw)
    allow = 1.0 + memory.ALLOCATOR_ALLOWANCE_FRACTION
    assert st(8, 0) - st(7, 0) == pytest.approx(w + g + o + infl * a_keep * allow, rel=1e-9)
    assert st(7, 0) - st(7, 2) == pytest.approx(
        (2 * infl * (a_keep - a_ckpt) - a_keep) * allow, rel=1e-9)


def test_stage_times_hand_example():
    """Stages of (2, 3) layers, 1 s each, 0.5 s more per recomputed layer, one recomputed on
    stage 0, embedding 0.25 s, loss 0.75 s: (2 + 0.5 + 0.25, 3 + 0.75) = (2.75, 3.75) s."""
    t = layers_mod.stage_times_s(np.array([[2, 3]]), np.array([[1, 0]]), [1.0], [1.5], [0.25],
                             [0.75], np.array([2]))
    assert t.tolist() == [[2.75, 3.75]]


def test_uneven_layout_moves_the_peak_off_stage_0():
    """Stage 0 holds the most micro-batches in flight: moving a layer from it to the last
    stage lowers the peak of a memory-bound pipeline."""
    even = ParallelConfig(**BASE, recompute="none", stage_layers=(7,) * 18)
    shifted = even.model_copy(update={"stage_layers": (6,) + (7,) * 16 + (8,)})
    r = evaluate(MODEL, TRAINING, CLUSTER, _batch(even, shifted))
    assert r.memory_bytes["peak"][1] < r.memory_bytes["peak"][0]


def test_layout_validation_messages():
    with pytest.raises(ValueError, match="stage_layers has 2 entries, expected pp"):
        ParallelConfig(pp=3, stage_layers=(1, 2))
    with pytest.raises(ValueError, match="needs recompute 'full'"):
        ParallelConfig(pp=2, stage_layers=(1, 2), stage_recompute_layers=(1, 0))
    with pytest.raises(ValueError, match="exceeds stage_layers"):
        ParallelConfig(pp=2, stage_layers=(1, 2), stage_recompute_layers=(2, 0),
                       recompute="full")
    with pytest.raises(ValueError, match="at least vp"):
        ParallelConfig(pp=2, vp=2, schedule="interleaved", stage_layers=(1, 4))
    # a rank's layers need not be a multiple of vp (--pipeline-model-parallel-layout)
    assert ParallelConfig(pp=2, vp=2, schedule="interleaved", stage_layers=(3, 4)).vp == 2
    with pytest.raises(SpecError, match=r"sum to 125, expected num_layers \(126\)"):
        resolve_config(ParallelConfig(**{**BASE, "pp": 2}, stage_layers=(62, 63)), MODEL,
                       TRAINING)


def test_config_batch_round_trip():
    a = ParallelConfig(pp=3, stage_layers=(3, 4, 5), stage_recompute_layers=(1, 0, 0),
                       recompute="full", num_microbatches=4)
    b = ParallelConfig(num_microbatches=2)
    batch = ConfigBatch.from_configs([a, b])
    assert batch.has_layout.tolist() == [True, False]
    assert batch.config(0).stage_layers == (3, 4, 5)
    assert batch.config(0).stage_recompute_layers == (1, 0, 0)
    assert batch.config(1).stage_layers is None
    assert batch.take([1]).config(0).stage_recompute_layers is None


def test_layout_timeline_paced_by_the_slowest_stage():
    """The Gantt input of a layout: per-stage times from the layout, so the stage with the
    most layers is the busiest device."""
    cfg = resolve_config(ParallelConfig(**BASE, recompute="none",
                                        stage_layers=(5,) + (7,) * 16 + (9,)),
                         MODEL, TRAINING, CLUSTER)
    tl = layout_timeline(MODEL, TRAINING, CLUSTER, cfg)
    busy = np.zeros(18)
    for stage, _mb, _chunk, _op, t0, t1 in tl.events:
        busy[stage] += t1 - t0
    assert int(np.argmax(busy)) == 17 and int(np.argmin(busy)) == 0
