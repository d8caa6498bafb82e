"""``--strategy dp`` for mixture-of-experts models: dense and MoE layers at their own cost per
stage (perfmodel.memory.stage_layout), the DP against exhaustive enumeration of layouts, ep = 1 against the
dense model, and the CLI."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from perfmodel.core.codes import Recompute
from perfmodel.memory import stage_layout as layout
from perfmodel.parallel import layers as layers_mod
from perfmodel.parallel.config import ConfigBatch, ParallelConfig
from perfmodel.spec.specs import ModelSpec, load_cluster, load_model, load_training
from perfmodel.step.evaluate import layer_times_by_type

GB, SEQ = 16, 2048


def _tiny_moe(**kw) -> ModelSpec:
    """An 8-layer DeepSeek-style MoE (8 experts, top-2, one shared expert), 2 dense leading
    layers unless told otherwise; standard attention."""
    base = load_model("deepseek-v3").model_dump()
    base.update({"name": "tiny-moe", "num_layers": 8, "hidden_size": 1024,
                 "ffn_hidden_size": 4096, "num_attention_heads": 8, "num_kv_heads": None,
                 "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 1024,
                 "num_shared_experts": 1, "moe_shared_ffn_hidden_size": None,
                 "moe_dense_layers": 2, "vocab_size": 32000, "kv_lora_rank": None,
                 "q_lora_rank": None, "qk_rope_head_dim": 0, "v_head_dim": None,
                 "head_dim": None, **kw})
    return ModelSpec.model_validate(base)


def _batch(**kw) -> ConfigBatch:
    cfg = {"dp": 4, "tp": 1, "pp": 2, "ep": 2, "etp": 1, "micro_batch_size": 1,
           "num_microbatches": GB // 4, **kw}
    return ConfigBatch.from_configs([ParallelConfig(**cfg)])


# --------------------------------------------------------------------------------------------
# Which layers are MoE, by hand
# --------------------------------------------------------------------------------------------
def test_moe_layer_mask_and_stage_counts_by_hand():
    """DeepSeek style (2 dense leading): layers 2..7 MoE; ranks of 3 and 5 layers hold 1 and 5
    MoE layers. Llama-4 style (every 2nd layer MoE: 1, 3, 5, 7) with vp = 2 on 2 ranks of 4
    layers: virtual stages 0-1 | 2-3 | 4-5 | 6-7, rank 0 holds chunks 0-1 and 4-5 (2 MoE),
    rank 1 chunks 2-3 and 6-7 (2 MoE); uneven, chunks of 1 and 3 layers: rank 0 holds layers 0
    and 4 (no MoE), rank 1 layers 1-3 and 5-7 (4 MoE)."""
    m = _tiny_moe()
    assert layers_mod.moe_layer_mask(m).tolist() == [False, False] + [True] * 6
    b = _batch()
    assert layers_mod.stage_moe_layers(m, b, np.array([[3, 5]])).tolist() == [[1, 5]]
    assert layers_mod.stage_moe_layers(m, b, np.array([[1, 7]])).tolist() == [[0, 6]]
    il = _tiny_moe(moe_dense_layers=0, moe_layer_freq=2)
    assert np.flatnonzero(layers_mod.moe_layer_mask(il)).tolist() == [1, 3, 5, 7]
    assert il.num_moe_layers == 4
    b2 = _batch(vp=2, schedule="interleaved")
    assert layers_mod.stage_moe_layers(il, b2, np.array([[4, 4]])).tolist() == [[2, 2]]
    assert layers_mod.stage_moe_layers(il, b2, np.array([[2, 6]])).tolist() == [[0, 4]]
    dense = load_model("llama2-7b")
    assert not layers_mod.moe_layer_mask(dense).any()


def test_stage_time_by_layer_type_by_hand():
    """Stage 0: 2 dense + 1 MoE layer, one of them recomputed, plus the embedding; stage 1:
    5 MoE layers and the loss. Dense layer 1.0 s (1.5 s recomputed), MoE layer 2.0 s (3.0 s):
    stage 0 = 2*1 + 2 + (2/3*0.5 + 1/3*1.0) + 0.1 = 4.7667 s, stage 1 = 5*2 + 0.2 = 10.2 s."""
    t = layers_mod.stage_times_s(np.array([[3, 5]]), np.array([[1, 0]]), [1.0], [1.5], [0.1],
                             [0.2], np.array([2]), moe_layers=np.array([[1, 5]]),
                             moe_keep_s=[2.0], moe_full_s=[3.0])
    assert t[0].tolist() == pytest.approx([2.0 + 2.0 + 2.0 / 3.0 * 0.5 + 1.0 / 3.0 + 0.1, 10.2])
    # without the MoE counts: the average layer everywhere (the dense path, unchanged)
    t0 = layers_mod.stage_times_s(np.array([[3, 5]]), np.array([[1, 0]]), [1.0], [1.5], [0.1],
                              [0.2], np.array([2]))
    assert t0[0].tolist() == pytest.approx([3.0 + 0.5 + 0.1, 5.2])


def test_stage_expert_memory_by_hand():
    """One more MoE layer in place of a dense one on a stage (tp 1, ep 2, etp 1, bf16 weights):
    + 8 experts * 3*1024*1024 / ep 2 routed, + the shared expert 3*1024*1024, + the router
    1024*8, - the dense MLP 3*1024*4096 parameters, at 2 bytes (ZeRO-1 keeps the weights
    whole)."""
    m = _tiny_moe()
    tr = load_training(None, global_batch_size=GB, seq_len=SEQ)
    cl = load_cluster("dgx-h100")
    b = _batch(zero_stage=1)

    def weights(n_moe):
        return layout.stage_memory_bytes(m, tr, cl, b, np.array([[1]]), np.array([[4]]),
                                         np.array([[0]]), moe_layers=np.array([[n_moe]])
                                         )["weights"][0, 0]

    per = 8 * 3 * 1024 * 1024 / 2 + 3 * 1024 * 1024 + 1024 * 8 - 3 * 1024 * 4096
    assert weights(3) - weights(2) == pytest.approx(2.0 * per, rel=1e-12)
    # the model's average layer (moe_layers None) holds the experts of every non-leading layer
    avg = layout.stage_memory_bytes(m, tr, cl, b, np.array([[1]]), np.array([[4]]),
                                    np.array([[0]]))
    assert avg["weights"][0, 0] > weights(3)


# --------------------------------------------------------------------------------------------
# ep = 1 and all-MoE models reduce to the even split / the dense model
# --------------------------------------------------------------------------------------------
def test_dense_layer_of_an_moe_model_is_the_dense_model_layer():
    """The dense layer type of an MoE model (layers_mod.moe_variants) costs what the same layer of
    the dense model costs (num_experts = 1), at ep = 1 and ep = 2: the expert terms vanish."""
    m = _tiny_moe()
    dense = ModelSpec.model_validate({**m.model_dump(), "num_experts": 1, "moe_top_k": 1,
                                      "moe_ffn_hidden_size": None, "num_shared_experts": 0,
                                      "moe_dense_layers": 0})
    tr = load_training(None, global_batch_size=GB, seq_len=SEQ)
    cl = load_cluster("dgx-h100")
    for ep in (1, 2):
        b = _batch(ep=ep)
        lt = layer_times_by_type(m, tr, cl, b)
        ref = layer_times_by_type(dense, tr, cl, _batch(ep=1))
        assert lt["dense_keep"][0] == pytest.approx(ref["keep"][0], rel=1e-12)
        assert lt["dense_full"][0] == pytest.approx(ref["full"][0], rel=1e-12)
        assert lt["moe_keep"][0] > lt["dense_keep"][0] * 0.5  # an MoE layer has its own cost
        # the model's average layer is close to the mix of the two: its terms are linear in the
        # MoE share except the kernel launch floors, which it pays once per GEMM of either type
        # (measured 1.1 % here)
        phi = m.moe_layer_fraction
        mix = (1 - phi) * lt["dense_keep"][0] + phi * lt["moe_keep"][0]
        assert lt["keep"][0] == pytest.approx(mix, rel=0.02)


@pytest.mark.parametrize("ep", [1, 2])
def test_even_layout_of_an_all_moe_model_equals_the_even_split(ep):
    """With every layer MoE (Mixtral, Qwen3 style) the typed layout model is the even split's:
    the same step time and memory, at ep = 1 (experts local) and ep = 2."""
    from perfmodel.step.evaluate import evaluate

    m = _tiny_moe(moe_dense_layers=0)
    tr = load_training(None, global_batch_size=GB, seq_len=SEQ)
    cl = load_cluster("dgx-h100")
    b = _batch(ep=ep)
    lay = dataclasses.replace(b, stage_layers=np.array([[4, 4]]),
                              stage_recompute_layers=np.array([[-1, -1]]))
    r0, r1 = evaluate(m, tr, cl, b), evaluate(m, tr, cl, lay)
    assert r1.step_time_s[0] == pytest.approx(r0.step_time_s[0], rel=1e-9)
    assert r1.memory_bytes["peak"][0] == pytest.approx(r0.memory_bytes["peak"][0], rel=1e-3)


# --------------------------------------------------------------------------------------------
# The DP's pick against exhaustive enumeration of every layout
# --------------------------------------------------------------------------------------------
def _exhaustive_best(problem, L: int):
    """Every outer configuration of the space x every contiguous layout (counts divisible by
    vp, no block recompute), priced by the full model: the best that fits."""
    from search.strategies.dp import _concat

    sp = problem.space
    rows = []
    for flat in sp.iter_chunks():
        a, viol = sp.decode_flat(flat)
        valid = np.flatnonzero(viol == 0)
        if valid.size:
            rows.append(sp.batch(a, valid))
    B = _concat(rows)
    B = B.take(np.flatnonzero(B.recompute != Recompute.FULL))
    pp = int(B.pp[0])
    lays = np.array([np.diff((0, *c, L)) for c in itertools.combinations(range(1, L), pp - 1)])
    n = len(B)
    Bs = B.take(np.repeat(np.arange(n), len(lays)))
    S = np.tile(lays, (n, 1))
    zeros = np.zeros(len(Bs), dtype=np.int64)
    Bs = dataclasses.replace(Bs, stage_layers=S, stage_recompute_layers=np.full_like(S, -1),
                             first_stage_layers=zeros, last_stage_layers=zeros,
                             embedding_as_layer=zeros.astype(bool),
                             loss_as_layer=zeros.astype(bool))
    ok = np.all(S % Bs.vp[:, None] == 0, axis=1)
    Bs, S = Bs.take(np.flatnonzero(ok)), S[ok]
    res = problem.evaluate_batch(Bs)
    t = np.where(res.fits & problem.within_limits(res.step_time_s, res.memory_bytes["peak"]),
                 res.step_time_s, np.inf)
    k = int(np.argmin(t))
    return float(t[k]), S[k].tolist()


@pytest.mark.parametrize("pattern, pp", [
    ({"moe_dense_layers": 2}, 2),
    pytest.param({"moe_dense_layers": 2}, 4, marks=pytest.mark.slow),
    pytest.param({"moe_dense_layers": 1, "moe_layer_freq": 2}, 4, marks=pytest.mark.slow),
    pytest.param({"moe_dense_layers": 0, "moe_layer_freq": 2}, 2, marks=pytest.mark.slow),
    pytest.param({"moe_dense_layers": 2, "mtp_num_layers": 1}, 2, marks=pytest.mark.slow),
    pytest.param({"moe_dense_layers": 0, "moe_layer_freq": 2, "mtp_num_layers": 1}, 2,
                 marks=pytest.mark.slow),
])
def test_dp_pick_equals_exhaustive_layouts_on_a_small_moe_space(pattern, pp):
    """Tiny MoE on 8 H100 (pp pinned) with dense leading layers or MoE every 2nd layer (the
    exact range DP, search.strategies.dp._solve_ranges), with and without a multi-token-prediction layer on
    the last stage: the DP's best equals the best of every outer configuration x every layout
    priced by the full model (within 1e-9; measured equal: 2 dense, pp 2 -> 5|3, ep 4,
    23.67 ms; pp 4 -> 3|2|2|1, ep 2, 34.08 ms; 1 dense + every 2nd, pp 4: 29.73 ms (30.08 ms
    when interleaved layers were priced as the average layer); every 2nd, pp 2: 22.63 ms; with
    MTP, 2 dense, pp 2 -> 7|1: 30.92 ms (35.02 ms when the DP left the MTP head out of the last
    stage); every 2nd + MTP: 30.10 ms), and beats the grid, whose Megatron layouts cannot give
    the stages the layer counts their layer types and in-flight micro-batches call for (pp 2:
    25.30 ms, pp 4: 39.42 ms)."""
    import search
    from search.api import make_problem

    m = _tiny_moe(**pattern)
    kw = {"gpus": 8, "global_batch_size": GB, "seq_len": SEQ, "cp": 1, "pp": pp}
    best, _ = _exhaustive_best(make_problem(m, "dgx-h100", **kw), m.num_layers)
    d = search.plan(m, "dgx-h100", strategy="dp", top=1, **kw).rows[0]
    g = search.plan(m, "dgx-h100", top=1, **kw).rows[0]
    assert d["step_time_s"] == pytest.approx(best, rel=1e-9)
    assert d["step_time_s"] <= g["step_time_s"] * (1 + 1e-9)
    assert d["config"]["ep"] > 1


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def test_cli_strategy_dp_on_an_moe_preset():
    """``plan --strategy dp`` on Mixtral 8x7B (16 H100, tp 2, pp 2 pinned): exit 0, ep and etp
    in the table, and the printed prediction is the full model's (evaluate_config of the same
    configuration gives the same step time)."""
    import json

    from typer.testing import CliRunner

    import search
    from cli.main import app

    args = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16",
            "--global-batch", "64", "--seq-len", "4096", "--tp", "2", "--pp", "2", "--cp", "1",
            "--zero", "1", "--strategy", "dp", "--top", "3"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "┃ ep ┃ etp ┃" in r.output
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["best"]
    cfg = best["config"]
    assert cfg["ep"] > 1
    if not cfg.get("stage_layers"):  # an even split: the default search's own prediction
        fields = {k: cfg[k] for k in ("dp", "tp", "pp", "vp", "cp", "ep", "etp", "zero_stage",
                                      "micro_batch_size", "recompute", "sequence_parallel",
                                      "schedule")}
        ev = search.evaluate_config("mixtral-8x7b", "dgx-h100", gpus=16, global_batch_size=64,
                                    seq_len=4096, **fields).rows[0]
        assert best["step_time_s"] == pytest.approx(ev["step_time_s"], rel=1e-9)


@pytest.mark.slow
def test_deepseek_v3_256_gb200_dp_plan_agrees_with_the_default_search():
    """The DeepSeek-V3 plan with ``--strategy dp`` (DeepSeek-V3, 256 GB200, GBS 8192, seq 4096):
    exit 0 with ep and etp in the table; its best is no worse than the default search's and, for
    the same configuration, the same prediction (measured: both dp=64 pp=4 ep=64 zb, 40.14 s)."""
    import json

    from typer.testing import CliRunner

    from cli.main import app

    args = ["--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--gpus", "256",
            "--global-batch", "8192", "--seq-len", "4096", "--top", "3", "--json"]
    dp = CliRunner().invoke(app, [*args, "--strategy", "dp"])
    assert dp.exit_code == 0, dp.output
    grid = CliRunner().invoke(app, args)
    d, g = json.loads(dp.stdout)["best"], json.loads(grid.stdout)["best"]
    assert d["config"]["ep"] > 1 and "etp" in d["config"]
    assert d["step_time_s"] <= g["step_time_s"] * (1 + 1e-9)
    if d["config"] == g["config"]:
        assert d["step_time_s"] == pytest.approx(g["step_time_s"], rel=1e-12)
