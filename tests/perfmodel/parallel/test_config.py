"""ParallelConfig validation, resolve_config cross-checks (messages print the operands), and the
ConfigBatch struct of arrays: from_arrays / from_configs / take / config round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from perfmodel.core.codes import COMPRESSION, RECOMPUTE, SCHEDULE
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.spec.specs import load_cluster, load_model, load_training

LLAMA7 = load_model("llama2-7b")  # 32 layers, 32 heads (no GQA), seq 4096
LLAMA70 = load_model("llama2-70b")  # 80 layers, 64 heads, 8 KV heads
GPT175 = load_model("gpt3-175b")  # 96 layers, 96 heads
TRAIN = load_training(global_batch_size=1536, seq_len=2048)
DGX16 = load_cluster("dgx-a100-80g", gpus=16)


# ------------------------------------------------------------------------------------------
# ParallelConfig (one point)
# ------------------------------------------------------------------------------------------
def test_defaults_and_gpus():
    c = ParallelConfig(dp=4, tp=2, pp=3, cp=2)
    assert c.gpus == 48
    assert (c.vp, c.zero_stage, c.recompute, c.schedule, c.sequence_parallel) == (
        1,
        0,
        "none",
        "1f1b",
        False,
    )


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"tp": 0}, r"tp\s+Input should be greater than 0"),
        ({"zero_stage": 4}, r"zero_stage"),
        ({"recompute": "some"}, r"recompute"),
        ({"vp": 2}, r"vp \(2\) > 1 needs schedule 'interleaved' \(got schedule '1f1b'\)"),
        (
            {"pp": 2, "schedule": "interleaved"},
            r"schedule 'interleaved' needs vp >= 2 \(got vp=1\)",
        ),
        ({"sequence_parallel": True}, r"sequence_parallel needs tp > 1 \(got tp=1\)"),
        ({"schedule": "zb"}, r"schedule 'zb' needs pp > 1 \(got pp=1\)"),
        ({"topk_ratio": 0.0}, r"topk_ratio"),
        ({"tensor_parallel": 2}, r"tensor_parallel"),  # typo'd field
    ],
)
def test_parallel_config_rejects(kwargs, pattern):
    with pytest.raises(ValidationError, match=pattern):
        ParallelConfig(**kwargs)


# ------------------------------------------------------------------------------------------
# resolve_config (against model, training, cluster)
# ------------------------------------------------------------------------------------------
def test_resolve_fills_num_microbatches():
    c = resolve_config(ParallelConfig(dp=2, tp=8, micro_batch_size=4), LLAMA7, TRAIN, DGX16)
    assert c.num_microbatches == 1536 // (2 * 4) == 192
    # giving the right value is accepted
    again = resolve_config(c, LLAMA7, TRAIN, DGX16)
    assert again == c


@pytest.mark.parametrize(
    ("config", "model", "cluster", "message"),
    [
        (ParallelConfig(dp=2, tp=3), LLAMA7, None, "tp (3) must divide num_attention_heads (32)"),
        (ParallelConfig(tp=16), LLAMA70, None, None),  # 16 | 64 heads and 8 | 16: allowed
        (
            ParallelConfig(dp=4, tp=2),
            LLAMA7,
            DGX16,
            "dp*tp*pp*cp (4*2*1*1=8) must equal the cluster's GPU count (16)",
        ),
        (
            ParallelConfig(dp=1, tp=2, pp=16, vp=3, schedule="interleaved"),
            LLAMA7,
            None,
            (
                "pp*vp (16*3=48) does not divide num_layers (32) and no Megatron-LM layout fits "
                "(first/last-stage layer counts, the embedding and the loss counted as layers, or a "
                "balanced --pipeline-model-parallel-layout, which needs pp*vp <= num_layers)"
            ),
        ),
        (
            ParallelConfig(pp=8, vp=5, schedule="interleaved"),
            LLAMA7,
            None,
            (
                "pp*vp (8*5=40) does not divide num_layers (32) and no Megatron-LM layout fits "
                "(first/last-stage layer counts, the embedding and the loss counted as layers, or a "
                "balanced --pipeline-model-parallel-layout, which needs pp*vp <= num_layers)"
            ),
        ),
        (
            ParallelConfig(dp=5),
            LLAMA7,
            None,
            "dp*micro_batch_size (5*1=5) must divide global_batch_size (1536)",
        ),
        (
            ParallelConfig(dp=2, micro_batch_size=2, num_microbatches=7),
            LLAMA7,
            None,
            (
                "num_microbatches (7) must equal global_batch_size / (dp*micro_batch_size) = "
                "1536/4 = 384"
            ),
        ),
        (
            ParallelConfig(dp=512, pp=4, vp=2, schedule="interleaved"),
            LLAMA7,
            None,
            "interleaved schedule: pp (4) must divide num_microbatches (3)",
        ),
        (
            ParallelConfig(dp=1, tp=16),
            LLAMA7,
            DGX16,
            "tp (16) must fit in the scale-up domain (8 GPUs) of cluster 'dgx-a100-80g'",
        ),
        (ParallelConfig(cp=3), LLAMA7, None, "2*cp (6) must divide seq_len (2048)"),
    ],
)
def test_resolve_errors_print_operands(config, model, cluster, message):
    if message is None:
        assert resolve_config(config, model, TRAIN, cluster).num_microbatches == 1536
        return
    with pytest.raises(SpecError) as err:
        resolve_config(config, model, TRAIN, cluster)
    assert str(err.value) == message


def test_resolve_kv_heads_and_tp():
    # 8 KV heads: tp 16 replicates KV heads (8 | 16), tp 3 fails the heads check first,
    # a model with 12 KV heads and tp 8 fails the KV check.
    from perfmodel.spec.specs import ModelSpec

    m = ModelSpec(
        name="m",
        num_layers=4,
        hidden_size=96 * 16,
        num_attention_heads=96,
        num_kv_heads=12,
        ffn_hidden_size=4096,
        vocab_size=1000,
    )
    with pytest.raises(
        SpecError, match=r"tp \(8\) and num_kv_heads \(12\) must divide one another"
    ):
        resolve_config(ParallelConfig(tp=8), m, TRAIN)


def test_resolve_sequence_parallel_needs_tp_to_divide_seq():
    t = load_training(seq_len=2050, global_batch_size=8)
    with pytest.raises(
        SpecError, match=r"tp \(4\) must divide seq_len \(2050\) for sequence_parallel"
    ):
        resolve_config(ParallelConfig(tp=4, sequence_parallel=True), LLAMA7, t)


def test_resolve_escape_hatches():
    c = ParallelConfig(dp=4, tp=2)
    assert resolve_config(c, LLAMA7, TRAIN, DGX16, allow_idle_gpus=True).num_microbatches == 384
    with pytest.raises(SpecError):  # more GPUs than the cluster has: never allowed
        resolve_config(ParallelConfig(dp=8, tp=4), LLAMA7, TRAIN, DGX16, allow_idle_gpus=True)
    wide = ParallelConfig(tp=16)
    assert resolve_config(wide, LLAMA7, TRAIN, DGX16, allow_tp_across_nodes=True).tp == 16


def test_gpu_count_against_every_cluster_preset_after_scaling():
    for name in ["dgx-h100", "gb200-nvl72", "ethernet-a100", "ring8-100gbps"]:
        cl = load_cluster(name, gpus=8)
        resolve_config(ParallelConfig(dp=2, tp=4), GPT175, TRAIN, cl)
        with pytest.raises(SpecError, match=r"must equal the cluster's GPU count \(8\)"):
            resolve_config(ParallelConfig(dp=4, tp=4), GPT175, TRAIN, cl)


# ------------------------------------------------------------------------------------------
# ConfigBatch
# ------------------------------------------------------------------------------------------
def test_from_arrays_broadcasts_and_codes_strings():
    b = ConfigBatch.from_arrays(
        dp=[1, 2, 4],
        tp=8,
        recompute=["none", "selective", "full"],
        schedule="interleaved",
        vp=2,
        sequence_parallel=[0, 1, 1],
    )
    assert len(b) == 3
    assert b.tp.tolist() == [8, 8, 8] and b.vp.tolist() == [2, 2, 2]
    assert b.recompute.tolist() == [0, 1, 2]
    assert b.schedule.tolist() == [SCHEDULE.index("interleaved")] * 3
    assert b.sequence_parallel.dtype == bool and b.sequence_parallel.tolist() == [False, True, True]
    assert b.gpus.tolist() == [8, 16, 32]
    # defaults: ParallelConfig's, num_microbatches 1
    assert b.pp.tolist() == [1, 1, 1] and b.num_microbatches.tolist() == [1, 1, 1]
    assert b.topk_ratio.dtype == np.float64 and b.grad_compression.tolist() == [0, 0, 0]
    for f in ("dp", "tp", "pp", "vp", "cp", "zero_stage", "recompute", "schedule"):
        assert getattr(b, f).dtype == np.int64


def test_from_arrays_accepts_codes_and_rejects_unknown_fields():
    b = ConfigBatch.from_arrays(dp=np.array([1, 2]), recompute=np.array([2, 0]))
    assert b.recompute.tolist() == [2, 0]
    with pytest.raises(TypeError, match="unknown ConfigBatch fields: \\['tensor_parallel'\\]"):
        ConfigBatch.from_arrays(dp=1, tensor_parallel=2)
    with pytest.raises(ValueError):
        ConfigBatch.from_arrays(recompute=["none", "sometimes"])


def test_from_configs_round_trip():
    cfgs = [
        ParallelConfig(dp=8, tp=8, pp=8, micro_batch_size=1, recompute="full"),
        ParallelConfig(
            dp=4,
            tp=8,
            pp=16,
            vp=3,
            schedule="interleaved",
            sequence_parallel=True,
            recompute="selective",
            zero_stage=1,
            micro_batch_size=2,
        ),
        ParallelConfig(dp=512, tp=1, pp=1, zero_stage=3, grad_compression="topk", topk_ratio=0.05),
    ]
    resolved = [resolve_config(c, GPT175, TRAIN) for c in cfgs]
    b = ConfigBatch.from_configs(resolved)
    assert len(b) == 3
    assert b.num_microbatches.tolist() == [192, 192, 3]
    for i, c in enumerate(resolved):
        back = b.config(i)
        assert back.model_dump() == c.model_dump()
        assert b.to_dict(i) == c.model_dump()
        assert type(back.dp) is int and type(back.sequence_parallel) is bool
        assert back.recompute in RECOMPUTE and back.grad_compression in COMPRESSION


def test_from_configs_needs_resolved_configs():
    with pytest.raises(ValueError, match="resolve configs"):
        ConfigBatch.from_configs([ParallelConfig(dp=2)])


def test_take_indices_and_mask():
    b = ConfigBatch.from_arrays(dp=np.arange(1, 7), tp=[1, 2, 4, 8, 1, 2])
    sub = b.take(np.array([5, 0]))
    assert sub.dp.tolist() == [6, 1] and sub.tp.tolist() == [2, 1]
    mask = b.tp >= 4
    assert b.take(mask).dp.tolist() == [3, 4]
    assert len(b.take(np.zeros(6, dtype=bool))) == 0
    assert b.take(slice(1, 3)).dp.tolist() == [2, 3]


def test_batch_is_frozen():
    b = ConfigBatch.from_arrays(dp=[1, 2])
    with pytest.raises(AttributeError):
        b.dp = np.array([3, 4])  # type: ignore[misc]


_configs = st.builds(
    lambda dp, tp, pp, cp, zero, mbs, rc, sp, comp, ratio: ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        zero_stage=zero,
        micro_batch_size=mbs,
        num_microbatches=3,
        recompute=rc,
        sequence_parallel=sp and tp > 1,
        schedule="1f1b",
        grad_compression=comp,
        topk_ratio=ratio,
    ),
    st.integers(1, 64),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 16),
    st.sampled_from([1, 2]),
    st.integers(0, 3),
    st.integers(1, 8),
    st.sampled_from(RECOMPUTE),
    st.booleans(),
    st.sampled_from(COMPRESSION),
    st.floats(0.001, 1.0),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(_configs, min_size=1, max_size=8))
def test_batch_round_trip_property(cfgs):
    b = ConfigBatch.from_configs(cfgs)
    assert len(b) == len(cfgs)
    assert [b.config(i).model_dump() for i in range(len(b))] == [c.model_dump() for c in cfgs]
    assert b.gpus.tolist() == [c.gpus for c in cfgs]
    idx = np.arange(len(cfgs))[::-1]
    assert [b.take(idx).config(i).model_dump() for i in range(len(b))] == [
        cfgs[j].model_dump() for j in idx
    ]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.sampled_from([0.01, 0.5]),
                          st.booleans()), min_size=1, max_size=600),
       st.sampled_from([("tp",), ("tp", "cp"), ("tp", "cp", "topk_ratio", "sequence_parallel"),
                        ("cp", "topk_ratio")]))
def test_unique_by_is_first_occurrence_factorisation(rows, names):
    """unique_by: the distinct rows by ``names`` in order of first occurrence and every row's
    index among them, as a pandas.factorize of the tuples (with a cached prefix too)."""
    tp, cp, topk, sp = (np.array(c) for c in zip(*rows))
    b = ConfigBatch.from_arrays(tp=tp, cp=cp, topk_ratio=topk, sequence_parallel=sp)
    if len(names) > 1:
        b.unique_by(names[:1])  # the prefix's codes are reused
    sub, codes = b.unique_by(names)
    keys = list(zip(*(getattr(b, f).tolist() for f in names)))
    first = {}
    expect = [first.setdefault(k, len(first)) for k in keys]
    assert codes.tolist() == expect
    assert list(zip(*(getattr(sub, f).tolist() for f in names))) == list(first)

    def fn(s):  # reads only the fields of names
        return {"x": sum(100.0 ** i * getattr(s, f) for i, f in enumerate(names)), "k": 3.0}

    spread = b.per_distinct(names, fn)
    assert spread["k"] == 3.0
    np.testing.assert_array_equal(spread["x"], fn(b)["x"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.sampled_from([0.01, 0.5]),
                          st.booleans(), st.integers(1, 3)), min_size=300, max_size=700),
       st.permutations(["tp", "cp", "topk_ratio", "sequence_parallel", "pp"]),
       st.integers(1, 4))
def test_unique_by_from_coarser_and_finer_keys(rows, names, cut):
    """unique_by found from the codes of a subset of its fields, or from the distinct rows of
    a superset (either order of the calls, any order of the fields): the same first-occurrence
    factorisation as on its own."""
    tp, cp, topk, sp, pp = (np.array(c) for c in zip(*rows))
    arrays = {"tp": tp, "cp": cp, "topk_ratio": topk, "sequence_parallel": sp, "pp": pp}
    fresh = ConfigBatch.from_arrays(**arrays)
    for first, then in ((names[:cut], names), (names, names[:cut]), (names[::-1], names[:cut])):
        b = ConfigBatch.from_arrays(**arrays)
        b.unique_by(tuple(first))
        sub, codes = b.unique_by(tuple(then))
        alone_sub, alone_codes = ConfigBatch.from_arrays(**arrays).unique_by(tuple(then))
        np.testing.assert_array_equal(codes, alone_codes)
        for f in then:
            np.testing.assert_array_equal(getattr(sub, f), getattr(alone_sub, f))
    keys = list(zip(*(arrays[f].tolist() for f in names)))
    first_seen = {}
    expect = [first_seen.setdefault(k, len(first_seen)) for k in keys]
    assert fresh.unique_by(tuple(names))[1].tolist() == expect
