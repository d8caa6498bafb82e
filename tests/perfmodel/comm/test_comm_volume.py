"""Per-GPU communication volume per step, and the closed form of exercise 9.5."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.comm import comm_volume as v
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, load_model, load_training

GPT3 = load_model("gpt3-175b")
BF16 = load_training(global_batch_size=1536, seq_len=2048, precision="bf16",
                     grad_reduce_in_fp32=False)  # hand numbers: bf16 gradient reduction
S, H = 2048, 12288
ACT = S * H * 2  # one micro-batch of b=1 activations in bf16 [bytes]
LLAMA_LIKE = ModelSpec(
    name="gqa-toy",
    num_layers=8,
    hidden_size=1024,
    num_attention_heads=16,
    num_kv_heads=4,
    ffn_hidden_size=2816,
    vocab_size=32000,
    activation="swiglu",
    norm="rmsnorm",
    position_embedding="rope",
    tied_embeddings=False,
    linear_bias=False,
)


def batch(**kw):
    return ConfigBatch.from_arrays(**kw)


def test_stage_params_pp1_is_the_whole_model():
    b = batch(pp=[1])
    assert v.largest_stage_params(GPT3, b)[0] == GPT3.param_count()
    # tp splits everything but the norms, the row-parallel biases and the positions
    rep = 96 * (4 * 12288 + 2 * 12288) + 2048 * 12288 + 2 * 12288
    assert v.replicated_layer_params(GPT3) == 4 * 12288 + 2 * 12288
    assert v.params_per_gpu(GPT3, batch(tp=[8]))[0] == pytest.approx(
        (GPT3.param_count() - rep) / 8 + rep
    )
    assert v.params_per_gpu(GPT3, batch(tp=[1]))[0] == GPT3.param_count()


def test_params_per_gpu_tiny_hand():
    # 4 layers, h 64, V 256, learned positions (32), layernorm, biases, untied; tp 2, pp 2.
    # layer: 12h^2 + 13h = 49984, replicated 2*2h + 2h = 384 -> (49984-384)/2 + 384 = 25184
    # first stage: 2 * 25184 + 256*64/2 + 32*64 = 60608; last: 2 * 25184 + 128 + 8192 = 58688
    tiny = ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_attention_heads=4,
                     ffn_hidden_size=256, vocab_size=256, max_seq_len=32,
                     position_embedding="learned", tied_embeddings=False)  # fmt: skip
    assert v.params_per_gpu(tiny, batch(tp=[2], pp=[2]))[0] == 60608
    assert v.params_per_gpu(tiny, batch(tp=[1], pp=[1]))[0] == tiny.param_count()


def test_stage_params_pp_gt_1_largest_end_stage():
    # tied embeddings: the last stage keeps a copy of the word embedding, the first also has
    # positions; the first stage is the largest
    p = v.largest_stage_params(GPT3, batch(pp=[8]))[0]
    expect = 96 / 8 * GPT3.layer_params() + GPT3.embedding_params()
    assert p == pytest.approx(expect)
    # untied: the last stage holds norm + output layer (= word embedding size, no positions)
    q = v.largest_stage_params(LLAMA_LIKE, batch(pp=[2]))[0]
    assert q == pytest.approx(4 * LLAMA_LIKE.layer_params() + 1024 + 32000 * 1024)


def test_dp_all_reduce_bf16_hand():
    b = batch(dp=[4], tp=[2], pp=[1])
    psi = v.params_per_gpu(GPT3, b)[0]
    # 2 (n-1)/n * psi * 2 bytes
    assert v.comm_bytes_per_gpu(GPT3, BF16, b)["dp"][0] == pytest.approx(2 * 0.75 * psi * 2)
    fp32 = load_training(precision="fp32")
    assert v.comm_bytes_per_gpu(GPT3, fp32, b)["dp"][0] == pytest.approx(2 * 0.75 * psi * 4)


def test_dp_group_includes_context_parallel():
    b = batch(dp=[2], cp=[2], tp=[8])
    psi = v.params_per_gpu(GPT3, b)[0]
    assert v.comm_bytes_per_gpu(GPT3, BF16, b)["dp"][0] == pytest.approx(2 * 0.75 * psi * 2)


def test_zero_stages():
    b = batch(dp=8, tp=8, zero_stage=[0, 1, 2, 3], num_microbatches=1)
    dp = v.comm_bytes_per_gpu(GPT3, BF16, b)["dp"]
    assert dp[1] == pytest.approx(dp[0])  # RS + AG = AR
    assert dp[2] == pytest.approx(dp[0])
    assert dp[3] == pytest.approx(1.5 * dp[2])  # ZeRO paper Sec. 7.2.3: 3 Psi vs 2 Psi
    # with 4 micro-batches: ZeRO-2 reduce-scatters every micro-batch, ZeRO-3 also gathers twice
    b4 = batch(dp=8, tp=8, zero_stage=[1, 2, 3], num_microbatches=4)
    dp4 = v.comm_bytes_per_gpu(GPT3, BF16, b4)["dp"]
    unit = 7 / 8 * v.params_per_gpu(GPT3, b4)[0] * 2  # one RS or AG
    np.testing.assert_allclose(dp4, [2 * unit, 5 * unit, 12 * unit])


def test_gradient_compression():
    n, ratio = 16, 0.01
    b = batch(dp=n, tp=8, grad_compression=["none", "topk", "int8", "1bit"], topk_ratio=ratio)
    dp = v.comm_bytes_per_gpu(GPT3, BF16, b)["dp"]
    psi = v.params_per_gpu(GPT3, b)[0]
    ar = 2 * (n - 1) / n * psi
    scale = 4 / 2048
    assert dp[0] == pytest.approx(ar * 2)
    # sparse all-gather: (n-1) * k * psi * (2-byte value + 4-byte index)
    assert dp[1] == pytest.approx((n - 1) * ratio * psi * 6)
    assert dp[2] == pytest.approx(ar * (1 + scale))
    assert dp[3] == pytest.approx(ar * (1 / 8 + scale))
    # top-k under ZeRO-1: sparse reduce-scatter + dense parameter all-gather
    z1 = batch(dp=n, tp=8, zero_stage=1, grad_compression="topk", topk_ratio=ratio)
    assert v.comm_bytes_per_gpu(GPT3, BF16, z1)["dp"][0] == pytest.approx(
        (n - 1) / n * psi * (ratio * 6 + 2)
    )


def test_tensor_parallel_hand():
    b = batch(
        tp=8,
        pp=8,
        num_microbatches=[1, 1, 3],
        recompute=["none", "full", "none"],
        sequence_parallel=[False, False, True],
    )
    tp = v.comm_bytes_per_gpu(GPT3, BF16, b)["tp"]
    per_ar = 2 * 7 / 8 * ACT
    layers = 96 / 8
    # layers, plus the embedding / output layer / loss terms (test_tp_boundary_hand)
    np.testing.assert_allclose(
        tp - v.tp_boundary_bytes(GPT3, BF16, b),
        [4 * per_ar * layers, 6 * per_ar * layers, 3 * 4 * per_ar * layers],
    )


def test_tp_boundary_hand():
    # GPT-3 (learned positions, layernorm, biases, tied), bf16, tp 8, b 1, s 2048, h 12288
    b = batch(tp=8, pp=[8, 8, 1], num_microbatches=[1, 3, 1],
              sequence_parallel=[False, True, False], zero_stage=0)  # fmt: skip
    one = 2 * 7 / 8 * ACT  # one all-reduce equivalent of the activations
    loss = 3 * 2 * 7 / 8 * 2048 * 4  # 3 fp32 all-reduces of one value per token
    # SP: per layer 2 layernorms (2h each) + 2 row biases = 6h; 12 layers + final norm (2h)
    sp_first = 2 * 7 / 8 * 12 * 6 * 12288 * 2  # the first stage has no final norm
    got = v.tp_boundary_bytes(GPT3, BF16, b)
    # pp 8, no SP: the last stage (output layer + loss) is busier than the embedding;
    # SP with learned positions: the embedding is 1.5 (all-reduce + all-gather of its grad),
    # which makes the first stage the busier one
    np.testing.assert_allclose(got, [one + loss, 3 * 1.5 * one + sp_first, 2 * one + loss])
    assert v.tp_boundary_bytes(GPT3, BF16, batch(tp=1))[0] == 0
    # ZeRO-2: the SP gradient all-reduce runs on the 1/dp shard
    z = batch(tp=8, pp=8, dp=4, num_microbatches=1, sequence_parallel=True, zero_stage=[0, 2])
    t = v.tp_boundary_bytes(GPT3, BF16, z)
    assert t[0] - t[1] == pytest.approx(sp_first * 3 / 4)


def test_pipeline_hand():
    b = batch(
        tp=8,
        pp=[1, 2, 4, 4, 4],
        vp=[1, 1, 1, 2, 1],
        num_microbatches=8,
        schedule=["1f1b", "1f1b", "1f1b", "interleaved", "1f1b"],
        sequence_parallel=[False, False, False, False, True],
    )
    pp = v.comm_bytes_per_gpu(GPT3, BF16, b)["pp"]
    # GPT-3 is tied: the word-embedding gradient all-reduce between first and last stage
    tied = 2 * 1 / 2 * 50257 * 12288 / 8 * 2
    assert v.pp_tied_embedding_bytes(GPT3, BF16, b)[1] == pytest.approx(tied)
    assert v.pp_tied_embedding_bytes(LLAMA_LIKE, BF16, b)[1] == 0
    np.testing.assert_allclose(
        pp - np.array([0, 1, 1, 1, 1]) * tied,
        [0, 8 * ACT, 8 * 2 * ACT, 8 * 4 * ACT, 8 * 2 * ACT / 8],
    )


def test_context_parallel_gqa_hand():
    tr = load_training(global_batch_size=64, seq_len=8192, grad_reduce_in_fp32=False)
    b = batch(cp=4, tp=2, num_microbatches=1, recompute=["none", "full"])
    cp = v.comm_bytes_per_gpu(LLAMA_LIKE, tr, b)["cp"]
    # K+V chunk: 2 * (8192/4 tokens) * (4 kv heads / tp 2) * 64 head_dim * 2 bytes
    chunk = 2 * 2048 * 2 * 64 * 2
    assert v.cp_kv_chunk_bytes(LLAMA_LIKE, tr, b)[0] == chunk
    # per layer: 3 sends forward, 6 backward (+3 recompute); 8 layers
    np.testing.assert_allclose(cp, [8 * 9 * chunk, 8 * 12 * chunk])
    # tp larger than kv heads: one kv head per rank
    b8 = batch(cp=2, tp=8)
    assert v.cp_kv_chunk_bytes(LLAMA_LIKE, tr, b8)[0] == 2 * 4096 * 1 * 64 * 2


def closed_form_per_gpu(nd, nm, np_, bglob, s, h, layers, p_stage, bytes_=2):
    """Exercise 9.5, per GPU of an inner stage (docs/communication.md, eq. V_gpu)."""
    dp = 2 * (nd - 1) / nd * p_stage / nm * bytes_
    tp = 8 * (nm - 1) / nm * (bglob / nd) * s * h * (layers / np_) * bytes_
    pp = (2 if np_ >= 3 else 1 if np_ == 2 else 0) * (bglob / nd) * s * h * bytes_
    return dp + tp + pp


@pytest.mark.parametrize(
    "nd,nm,np_,mbs",
    [(1, 1, 1, 1), (8, 1, 1, 2), (4, 8, 1, 1), (2, 8, 8, 1), (16, 4, 12, 2), (3, 2, 2, 4)],
)
def test_exercise_9_5_closed_form(nd, nm, np_, mbs):
    bglob = 96
    b = batch(dp=nd, tp=nm, pp=np_, micro_batch_size=mbs, num_microbatches=bglob // (nd * mbs))
    got = v.comm_bytes_per_gpu(GPT3, BF16, b)
    total = got["dp"][0] + got["tp"][0] + got["pp"][0] + got["cp"][0]
    # the exercise counts the layers only: take off the embedding / output / loss tp terms and
    # the tied-embedding all-reduce, and use the parameters one GPU really holds
    total -= v.tp_boundary_bytes(GPT3, BF16, b)[0] + v.pp_tied_embedding_bytes(GPT3, BF16, b)[0]
    p_stage = v.params_per_gpu(GPT3, b)[0] * nm
    assert total == pytest.approx(closed_form_per_gpu(nd, nm, np_, bglob, S, H, 96, p_stage))


@pytest.mark.parametrize("nd,nm", [(8, 1), (4, 8), (16, 2)])
def test_exercise_9_5_cluster_total_pp1(nd, nm):
    # summed over all N = nd*nm GPUs: 2(Nd-1) M b + 8 (Nm-1) B S H L b
    bglob = 64
    b = batch(dp=nd, tp=nm, num_microbatches=bglob // nd)
    got = v.comm_bytes_per_gpu(GPT3, BF16, b)
    total = nd * nm * (sum(x[0] for x in got.values()) - v.tp_boundary_bytes(GPT3, BF16, b)[0])
    m = v.params_per_gpu(GPT3, b)[0] * nm  # replicated norms, biases, positions counted nm times
    assert total == pytest.approx(2 * (nd - 1) * m * 2 + 8 * (nm - 1) * bglob * S * H * 96 * 2)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 2, 4, 8]),
            st.sampled_from([1, 2, 4, 8]),
            st.sampled_from([1, 2, 3, 4]),
            st.integers(0, 3),
            st.integers(0, 3),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_batch_equals_one_by_one(rows):
    cols = dict(zip(["dp", "tp", "pp", "zero_stage", "grad_compression", "recompute"], zip(*rows)))
    cols = {k: np.array(x) for k, x in cols.items()}
    whole = v.comm_bytes_per_gpu(GPT3, BF16, ConfigBatch.from_arrays(**cols, num_microbatches=4))
    for i in range(len(rows)):
        one = v.comm_bytes_per_gpu(
            GPT3,
            BF16,
            ConfigBatch.from_arrays(
                **{k: x[i : i + 1] for k, x in cols.items()}, num_microbatches=4
            ),
        )
        for k in whole:
            assert whole[k][i] == pytest.approx(one[k][0])
            assert whole[k][i] >= 0


def test_all_reduce_bytes_equal_rs_plus_ag_in_dp():
    # ZeRO-1 (RS + AG) equals ZeRO-0 (AR) on every config of a grid
    dp = np.array([1, 2, 3, 8, 64])
    b0 = batch(dp=dp, tp=2, zero_stage=0)
    b1 = batch(dp=dp, tp=2, zero_stage=1)
    np.testing.assert_allclose(
        v.comm_bytes_per_gpu(GPT3, BF16, b0)["dp"], v.comm_bytes_per_gpu(GPT3, BF16, b1)["dp"]
    )
