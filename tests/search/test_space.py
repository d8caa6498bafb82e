"""The search space: enumeration as arrays, constraints, pinning; plus the fake evaluator that
the other search tests share (a cheap analytic stand-in for ``perfmodel.step.evaluate.evaluate``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.core.codes import SCHEDULE, Schedule
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ParallelConfig, resolve_config
from perfmodel.spec.specs import ModelSpec, TrainingSpec, load_cluster
from search.space import Problem, divisors, make_space


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------
def small_model(**kw) -> ModelSpec:
    d = {"name": "toy-14b", "num_layers": 32, "hidden_size": 6144, "num_attention_heads": 48,
             "num_kv_heads": 8, "ffn_hidden_size": 16384, "vocab_size": 32000, "max_seq_len": 2048,
             "activation": "gelu", "position_embedding": "rope", "tied_embeddings": False}
    d.update(kw)
    return ModelSpec(**d)


def small_setup(gpus: int = 8, **tkw):
    model = small_model()
    training = TrainingSpec(global_batch_size=tkw.pop("global_batch_size", 64),
                            seq_len=tkw.pop("seq_len", 2048), **tkw)
    cluster = load_cluster("dgx-a100-80g", gpus)
    return model, training, cluster


def fake_evaluate(model, training, cluster, batch, *, kernels="fused", calibration=None):
    """Analytic stand-in with the StepResult arrays: compute shrinks with the GPU count, the
    bubble is (p-1)/(v*m), TP/DP communication and recompute cost time, ZeRO shards memory."""
    b = batch
    f = lambda x: np.asarray(x, dtype=float)
    dp, tp, pp, vp, cp = f(b.dp), f(b.tp), f(b.pp), f(b.vp), f(b.cp)
    m, mbs = f(b.num_microbatches), f(b.micro_batch_size)
    P = float(model.param_count())
    tokens = training.global_batch_size * training.seq_len
    gpus = dp * tp * pp * cp
    eff = 0.5 * (1 + 0.1 * np.log2(mbs)) / (1 + 0.02 * (tp - 1))
    rc = np.array([1.0, 1.04, 1.33])[b.recompute]
    compute = 6 * P * tokens / (gpus * 312e12 * eff) * rc
    bubble = compute * (pp - 1) / (vp * m) * np.where(b.schedule == Schedule.ZB, 0.3, 1.0)
    bubble = np.where(b.schedule == Schedule.GPIPE, bubble * 1.05, bubble)
    tp_comm = compute * 0.02 * (tp - 1) * np.where(b.sequence_parallel, 0.9, 1.0)
    cp_comm = compute * 0.05 * (cp - 1)
    dp_comm = 2 * P / (tp * pp) * 2 / 25e9 * (dp - 1) / dp * np.where(b.zero_stage == 3, 1.5, 1)
    opt = 16 * P / (tp * pp) / 2e12 / np.where(b.zero_stage >= 1, dp, 1)
    time_s = {"compute": compute, "tp_comm": tp_comm, "cp_comm": cp_comm, "bubble": bubble,
                  "pp_comm": 0 * compute, "dp_comm": dp_comm, "zero3_comm": 0 * compute, "optimizer": opt}
    step = sum(time_s.values())
    shard = P / (tp * pp)
    weights = 2 * shard / np.where(b.zero_stage == 3, dp, 1)
    grads = 2 * shard / np.where(b.zero_stage >= 2, dp, 1)
    optim = 12 * shard / np.where(b.zero_stage >= 1, dp, 1)
    act_f = np.array([34.0, 10.0, 2.0])[b.recompute] * np.where(b.sequence_parallel, 1, 1.3)
    acts = act_f * mbs * training.seq_len / cp * model.hidden_size * model.num_layers / pp / tp
    acts = acts * np.where(b.schedule == Schedule.GPIPE, m, np.minimum(pp, m))
    other = np.full(len(b), 2.0 * 2**30)
    peak = weights + grads + optim + acts + other
    mfu = 6 * P * tokens / (step * gpus * 312e12)
    return SimpleNamespace(
        step_time_s=step, tokens_per_s=tokens / step, mfu=mfu, hfu=mfu * rc,
        time_s=time_s,
        memory_bytes={"weights": weights, "gradients": grads, "optimizer": optim, "activations": acts,
                          "other": other, "peak": peak},
        comm_bytes_per_gpu={"dp": 2 * shard * 2 * (dp - 1) / dp, "tp": tp_comm * 1e11,
                                "pp": (pp - 1) * 1e6 * m, "cp": cp_comm * 1e11},
        fits=peak <= cluster.gpu.hbm_bytes,
    )


def small_problem(objective: str = "time", **fixed) -> Problem:
    model, training, cluster = small_setup()
    fixed.setdefault("cp", 1)
    fixed.setdefault("max_micro_batch_size", 4)
    return Problem(make_space(model, training, cluster, **fixed), fake_evaluate, objective)


def all_valid_configs(space):
    """Every structurally valid configuration, as flat indices (the reference enumeration)."""
    flat = np.arange(space.size)
    _, viol = space.decode_flat(flat)
    return flat[viol == 0]


# ---------------------------------------------------------------------------------------------
def test_divisors():
    assert divisors(12).tolist() == [1, 2, 3, 4, 6, 12]
    assert divisors(1).tolist() == [1]


def test_default_candidates_gpt3_1024():
    """GPT-3 175B on 1024 A100: tp divides 96 heads within the 8-GPU NVLink domain."""
    model, _training, cluster = small_setup()
    from perfmodel.spec.specs import load_model

    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100-80g")
    space = make_space(model, TrainingSpec(), cluster)
    assert space.values["tp"].tolist() == [1, 2, 3, 4, 6, 8]
    # uneven Megatron layouts are searched by default: divisors of the GPU count join
    gpu_div = divisors(cluster.total_gpus)
    assert space.values["pp"].tolist() == np.union1d(divisors(96), gpu_div[gpu_div <= 96]).tolist()
    even = make_space(model, TrainingSpec(), cluster, uneven_layers=False)
    assert even.values["pp"].tolist() == divisors(96).tolist()
    assert space.values["micro_batch_size"].tolist() == [1, 2, 4, 8, 16]
    assert space.values["cp"].tolist() == [1, 2, 4, 8, 16]
    assert "dp" not in space.dims  # derived from the GPU count


def test_every_valid_config_resolves():
    """Each configuration the masks accept passes resolve_config, dp*tp*pp*cp == GPUs, and
    num_microbatches = B / (dp*mbs)."""
    p = small_problem()
    space = p.space
    flat = all_valid_configs(space)
    assert flat.size > 100
    a, _viol = space.decode_flat(flat)
    batch = space.batch(a)
    assert np.all(batch.gpus == 8)
    assert np.all(batch.num_microbatches * batch.dp * batch.micro_batch_size == 64)
    for i in np.linspace(0, len(batch) - 1, 60).astype(int):
        cfg = batch.config(int(i))
        ParallelConfig(**cfg.model_dump())  # validators
        resolve_config(cfg, space.model, space.training, space.cluster)


def test_rejected_configs_do_not_resolve():
    """Configurations rejected by a real constraint (not the duplicate filter) fail
    resolve_config or ParallelConfig validation."""
    p = small_problem()
    space = p.space
    flat = np.arange(0, space.size, 7)
    a, _viol = space.decode_flat(flat)
    masks = space._constraint_masks(dict(a))
    real_bad = np.flatnonzero(~np.logical_and.reduce([masks[k] for k in masks
                                                       if k != "canonical"]))
    assert real_bad.size > 0
    from pydantic import ValidationError

    from perfmodel.core.codes import RECOMPUTE

    for i in real_bad[:: max(1, real_bad.size // 40)]:
        d = {k: a[k][i].item() for k in ("dp", "tp", "pp", "vp", "cp", "zero_stage",
                                          "micro_batch_size")}
        d.update(recompute=RECOMPUTE[a["recompute"][i]], schedule=SCHEDULE[a["schedule"][i]],
                 sequence_parallel=bool(a["sequence_parallel"][i]))
        with pytest.raises((SpecError, ValidationError)):
            resolve_config(ParallelConfig(**d), space.model, space.training, space.cluster)


def test_decode_matches_hand_count():
    """8 GPUs, 16 layers, 48 heads/8 kv heads, B=64, cp=1, zero=0, mbs=1, no recompute,
    no sp, 1f1b: (tp, pp) with tp*pp | 8 -> tp in {1,2,4,8}, pp in {1,2,4,8}, tp*pp <= 8:
    (1,1..8): 4, (2,1..4): 3, (4,1..2): 2, (8,1): 1 -> 10 configurations."""
    model, training, cluster = small_setup()
    space = make_space(model, training, cluster, cp=1, vp=1, zero_stage=0, micro_batch_size=1,
                       recompute="none", sequence_parallel=False, schedule="1f1b")
    assert all_valid_configs(space).size == 10


def test_pinning_and_lists():
    model, training, cluster = small_setup()
    space = make_space(model, training, cluster, tp=[2, 4], pp=range(1, 3), zero=1,
                       recompute="selective")
    assert space.values["tp"].tolist() == [2, 4]
    assert space.values["pp"].tolist() == [1, 2]
    assert space.values["zero_stage"].tolist() == [1]
    a, _viol = space.decode_flat(all_valid_configs(space))
    assert set(a["tp"].tolist()) <= {2, 4} and set(a["recompute"].tolist()) == {1}


@pytest.mark.parametrize(
    "fixed, match",
    [
        ({"tpp": 2}, "unknown parallel dimension 'tpp'"),
        ({"recompute": "partial"}, "recompute = 'partial': expected one of none"),
        ({"zero_stage": 5}, "zero_stage = 5: expected 0, 1, 2 or 3"),
        ({"tp": 0}, "tp = 0: expected a positive integer"),
        ({"schedule": "1f2b"}, "schedule = '1f2b'"),
    ],
)
def test_bad_pins(fixed, match):
    model, training, cluster = small_setup()
    with pytest.raises(SpecError, match=match):
        make_space(model, training, cluster, **fixed)


def test_explain_empty_names_operands():
    model, training, cluster = small_setup()
    space = make_space(model, training, cluster, tp=5)
    assert all_valid_configs(space).size == 0
    msg = space.explain_empty()
    assert "tp (5) must divide num_attention_heads (48)" in msg


def test_idle_gpus_makes_dp_a_dimension():
    model, training, cluster = small_setup()
    space = make_space(model, training, cluster, allow_idle_gpus=True, cp=1, vp=1,
                       zero_stage=0, micro_batch_size=1, recompute="none",
                       sequence_parallel=False, schedule="1f1b")
    assert "dp" in space.dims
    a, _ = space.decode_flat(all_valid_configs(space))
    gpus = a["dp"] * a["tp"] * a["pp"] * a["cp"]
    assert gpus.max() == 8 and gpus.min() == 1


def test_no_duplicate_configurations():
    """pp=1 ignores the schedule and dp=1 the ZeRO stage: each appears once."""
    p = small_problem()
    a, _ = p.space.decode_flat(all_valid_configs(p.space))
    keys = np.stack([a[k] for k in ("dp", "tp", "pp", "vp", "zero_stage", "micro_batch_size",
                                    "recompute", "sequence_parallel", "schedule")], 1)
    assert np.unique(keys, axis=0).shape[0] == keys.shape[0]
    assert not np.any((a["pp"] == 1) & (a["schedule"] != SCHEDULE.index("1f1b")))
    assert not np.any((a["dp"] == 1) & (a["zero_stage"] > 0))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=50))
def test_decode_flat_equals_decode_genes(seeds):
    """Decoding flat indices equals decoding the unravelled gene matrix (same arrays)."""
    p = small_problem()
    flat = np.asarray(seeds, dtype=np.int64) % p.space.size
    genes = np.stack(np.unravel_index(flat, p.space.shape), 1)
    s1, s2 = p.score_flat(flat), p.score_genes(genes)
    np.testing.assert_array_equal(s1.violations, s2.violations)
    np.testing.assert_array_equal(s1.score, s2.score)
    np.testing.assert_array_equal(s1.flat, s2.flat)


def test_encode_roundtrip():
    p = small_problem()
    flat = all_valid_configs(p.space)[::97]
    a, _ = p.space.decode_flat(flat)
    batch = p.space.batch(a)
    assert [p.space.encode(batch.config(i)) for i in range(len(batch))] == flat.tolist()
