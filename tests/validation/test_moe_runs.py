"""Validation against the published MoE training runs (``moe_runs_dev.csv``).

Targets: step-time MAPE <= 10 % with every row expressible or refused for a stated true limit;
the tuned-recipe check in >= 80 % of settings. 98 of 100 rows are expressed (2 refused: their
published layout is not runnable); MAPE and tuned check in docs/moe.md and docs/accuracy.md.
The MAPE target is met, the tuned one is not; the tests below guard what is reached so that a
change cannot make it worse unnoticed, and check the refusals.
"""

import numpy as np
import pandas as pd
import pytest

from validation.validate_moe import (
    moe_runs_report,
    moe_summary,
    moe_tuned_report,
    moe_tuned_summary,
)

#: the stated limits a row may be refused for (substrings of the reason)
TRUE_LIMITS = (
    "no step time, tokens/s or TFLOP/s",  # nothing measured published
    "hybrid Mamba2",  # a hybrid model without a preset of its layer pattern (none in the data)
    "must divide tp*cp*dp",  # the published ep*pp does not fit the GPU count (not runnable)
)


@pytest.fixture(scope="module")
def report():
    return moe_runs_report()


@pytest.mark.slow
def test_every_moe_row_expressed_or_refused_for_a_true_limit(report):
    rows, skipped = report
    assert len(rows) + len(skipped) == 100
    # TFLOP/s-only rows converted with the source's FLOP formula; the 4 hybrid Mamba2 Nemotron-3
    # Nano rows expressed (perfmodel.compute.mamba); the 2 DeepSeek-V3 rows left are not runnable
    assert len(rows) >= 98
    for reason in skipped["reason"]:
        assert any(k in reason for k in TRUE_LIMITS), reason


@pytest.mark.slow
def test_published_recipes_predicted_to_fit(report):
    # 87 of 94 with fp32 main grads for every row (the default); 93 of 94 with each recipe's own
    # gradient dtype (validate_moe.RECIPE_GRAD_DTYPE, off: it costs the tuned check 4 settings)
    rows, _ = report
    # (+3 of the 4 Nemotron-3 Nano rows: E0078, H100 selective with the 'moe' module the
    # spec does not offer and fp32 gradients, is predicted at 94 GiB)
    assert int(rows["fits"].sum()) >= 90, list(rows.loc[~rows["fits"], "row_id"])


@pytest.mark.slow
def test_moe_mape_does_not_regress(report):
    rows, _ = report
    s = moe_summary(rows)
    table = rows[["row_id", "config", "measured_s", "predicted_s", "error"]].to_string()
    # 98 rows: MAPE 9.8 % (72 % within 10 %; docs/accuracy.md), with the terms the rows' sources
    # state: the dispatcher switches each row names (perfmodel.moe.dispatch), the rows'
    # selective-recompute modules, the experts' output bias, the exponential floor, GPT-OSS's
    # sliding-window layers, flash-attn 2 for the dgxc Grok-1 recipe (NVTE_FUSED_ATTN=0), the
    # hybrid Nemotron-3 Nano layers (perfmodel.compute.mamba), each row's own published fp8
    # recipe (MXFP8 / FP8-CS / blockwise / delayed) with TE's quantisation casts where TE runs
    # them (perfmodel.compute.quantise: the routed experts' inputs on their top-k rows, MLA's five
    # projections each cast) and delayed scaling's amax all-reduce per model chunk and pass
    # (quantise.amax_reduction_s), the 16-bit router, TE's multi-stream grouped GEMM
    # (moe.TE_GROUPED_GEMM_SLOWDOWN 0.30) with the per-expert term 0.07 ms (kept for experts
    # padded to capacity), the pre-folding expert layout of Megatron-Core 0.8 / 0.9 (the six
    # dgxc v24.11.1 Grok-1 rows: ep 8 ranks tp*cp = 8 apart, perfmodel.moe.expert_layout), the
    # 25.09 / 25.11 recipes as their files set them (validate_moe.RECIPE_FACTS and
    # RECIPE_FACTS_BY_LAYOUT: "(tokendrop)" rows padded to capacity 1.0, full-iteration CUDA
    # graphs, mla_up_proj / layernorm / moe_act recompute), the context-parallel ring hidden under
    # the attention blocks with its bookkeeping kernels (perfmodel.comm.cp_ring), the MoE layers
    # of a rank whose layers are not a multiple of vp (layout.stage_moe_layers) and the
    # Megatron-Bridge Qwen3-235B rows on their recipe's pipeline split
    # (validate_moe.bridge_accounts_embedding_and_loss: p8 ranks 11, 12 x 6, 11).
    # Source-faithful terms stay even where they move rows away: E0255 (Mixtral 8x22B cp 8 over
    # two nodes) is -14.4 % with the ring hidden (+4.5 % only with the ring fully exposed); the
    # Qwen3-235B DGX B200 / H100 rows are -4..-8 % on the recipe's split (0..+3 % only on a padded
    # 96-layer split with the logits on top). Floors: the measured values plus a small margin.
    assert s["mape"] <= 0.0985, f"MAPE {s['mape']:.1%}\n{table}"
    assert s["within_10pct"] >= 0.71
    # DeepSeek-V3 on Megatron-Bridge's own pipeline layouts with the MTP layer on the last
    # stage: 10.0 % (9.8 % with every selective row recomputing the attention core instead of
    # the recipes' mla_up_proj; the p16 rows were +14 to +29 % timed at a padded 64-layer split)
    ds = rows[rows["model"] == "DeepSeek-V3"]
    # (the 25.09 B200 / GB200 rows read as their recipe ran them, token drop padded to capacity
    # and mla_up_proj recomputed: E0003 / E0004 / E0005 -15.2 / -17.7 / -10.1 %, the model's
    # too-fast DeepSeek-V3 B200 m128 rows, docs/moe.md; the H100 rows E0001 / E0002 pay Hopper's
    # fp8 per-tile fixed cost, compute.low_precision_tile_factor)
    assert len(ds) == 22 and np.abs(ds["error"]).mean() <= 0.0985
    # the all-to-all-overlapped H100 rows (DeepSeek-V3 on 1024, Qwen3-235B on 256) within 9 %
    # but E0002 (FP8-CS, inferred): E0001 +8.8 %, E0002 +10.2 % with current scaling's amax pass
    # over MLA's five projections, the grouped-GEMM slowdown on DeepSeek-V3's 32 local experts
    # and Hopper's fp8 per-tile cost (MLA's projections and the experts' fc2 reduce over
    # 1536-2048)
    ov = rows.set_index("row_id").loc[["E0001", "E0002", "E0024", "E0044", "E0064"], "error"]
    assert np.all(np.abs(ov.drop("E0002")) <= 0.09), ov
    assert abs(ov["E0002"]) <= 0.105, ov
    # GPT-OSS-120B: unfused elementwise ops, the recipes' layernorm + moe_act recompute, the
    # experts' fc2 bias outside the grouped GEMM, the exp-bound forward at head dim 64 on
    # Blackwell, the 128-token window on every other layer and the grouped-GEMM slowdown: MAPE
    # 9.2 % (the rows are 23 % too fast with the elementwise ops counted fused)
    oss = rows[rows["model"] == "GPT-OSS-120B"]
    assert len(oss) == 16 and np.abs(oss["error"]).mean() <= 0.093
    # Grok-1 (dgxc, measured iteration times), etp = tp (Megatron-Core's default), experts
    # padded to capacity (no host sync; the per-expert term kept), attention on flash-attn 2
    # (grok1/configure.sh NVTE_FUSED_ATTN=0; NeMo 24.09 / 24.12 ship no flash-attn 3), the
    # Megatron-Core 0.9 expert layout of the dgxc v24.11.1 rows (E0205-E0210; the v25.02.01 rows,
    # Megatron-Core 0.10, are folded) and delayed scaling's amax reductions (2 x 128
    # micro-batches x 8 one-layer chunks a step over 64-256 ranks): bf16 rows -1 to -2 %, fp8
    # rows -7 to -11 %, MAPE 5.8 %
    grok = rows[rows["model"] == "Grok-1"]
    assert len(grok) == 12 and np.all(np.abs(grok["error"]) <= 0.12)
    assert np.abs(grok["error"]).mean() <= 0.062


@pytest.mark.slow
def test_tuned_check_runs_on_two_settings():
    t = moe_tuned_report(limit=2)
    assert len(t) == 2 and np.all(np.isfinite(t["ratio"])) and (t["ratio"] > 0).all()
    assert set(t.columns) >= {"measured_s", "predicted_best_s", "ratio", "ok", "best_config",
                              "recipe_predicted_s", "recipe_fits", "search_gain"}
    # the ratio splits into the recipe's own time error and the search's gain over it
    np.testing.assert_allclose(t["ratio"], t["measured_s"] / t["recipe_predicted_s"]
                               * t["search_gain"])
    # the gain splits over the step-time terms: recipe's seconds less the pick's, per term
    for r in t.itertuples():
        split = r.gain_by_term_s
        assert set(split) >= {"compute", "ep_comm", "bubble", "dp_comm"}
        assert sum(split.values()) == pytest.approx(r.recipe_predicted_s - r.predicted_best_s,
                                                    rel=1e-6, abs=1e-9)
        assert r.gain_term_s == max(split.values()) and split[r.gain_term] == r.gain_term_s
        assert r.recipe_microbatches >= 1 and r.best_microbatches >= 1
        assert 0 < r.best_hbm_frac <= 1.0 + 1e-12  # the pick fits the usable HBM
        assert r.recipe_hbm_frac > 0
    # what `plan validate --tuned` prints and puts in its JSON
    from rich.console import Console

    from validation.validate_moe import moe_tuned_summary, print_moe_tuned

    s = moe_tuned_summary(t)
    assert s["settings"] == 2 and s["within"] == int(t["ok"].sum()) and s["band"] == [0.90, 1.15]
    out = Console(record=True, width=200)
    print_moe_tuned(out, t)
    assert f"tuned-recipe check: {s['within']} of 2 settings within [0.90, 1.15]" in out.export_text()


@pytest.mark.slow
def test_moe_tuned_fraction_does_not_regress():
    # target: >= 80 % of settings within [0.90, 1.15] (not met). Reached: 23 of 48 (48 %); the
    # misses all have ratio > 1.15: the recipe's own time error (GPT-OSS on GB200/GB300, where
    # the search picks the recipe's config) or search gains the time model predicts for layouts
    # the recipes did not use (Grok-1: etp 1 with an in-node ep group; larger micro-batches that
    # amortise per-micro-batch MoE costs); see docs/moe.md. ~1 min (48 searches).
    t = moe_tuned_report()
    s = moe_tuned_summary(t)
    table = t[["model", "gpu", "gpus", "ratio", "recipe_predicted_s", "search_gain",
               "best_config"]].to_string()
    # 52 settings with the 4 hybrid Nemotron-3 Nano ones (perfmodel.compute.mamba)
    assert s["settings"] == 52
    # 38 of 52 within the band (the floor). What the search needs to land there, each from its
    # source: each row's release capabilities (no zero-bubble / GPipe schedule in Megatron;
    # etp = tp for the Megatron-Core 0.9 era Grok-1 rows); TE's multi-stream grouped GEMM and the
    # per-expert term 0.07 ms (larger micro-batches do not amortise device time as if it were
    # fixed); the pre-folding expert layout for the Megatron-Core 0.9 Grok-1 settings (the
    # search's in-node ep 8 of t1 cp8 is 8 nodes apart there: bf16 ratios 1.08-1.09, fp8
    # 1.19-1.22); the Nemotron-3 Nano settings at mamba.SSD_BANDWIDTH_EFFICIENCY with the
    # per-operand casts (1.06 / 1.04 / 1.14 / 1.00); the balanced explicit pipeline layout
    # (--pipeline-model-parallel-layout, Megatron-Core >= 0.13): E0002 (DeepSeek-V3, 1024 H100)
    # at 1.07 on t2 p16 v3 ep32 (61 layers over 48 chunks), while the other DeepSeek-V3 settings
    # pick vp 3 / 7 / 9 layouts (E0003 1.34, out of the band). The base model's SM-side roofline
    # of memory-bound kernels, Hopper sustained GEMM 0.84 and Blackwell overlap slowdown 0.05
    # move one setting out of the band; not investigated.
    assert s["fraction"] >= 38 / 52 - 1e-9, f"{s}\n{table}"
    assert set(t["framework"]) >= {"nemo-24.09", "bridge-25.x", "bridge-26.02"}
    grok = t[t["model"] == "Grok-1"]
    assert len(grok) == 6 and (grok["framework"] == "nemo-24.09").all()
    cfgs = grok["best_config"].str.extract(r"t(\d+) .* etp(\d+)").astype(int)
    assert (cfgs[0] == cfgs[1]).all(), grok["best_config"].tolist()  # etp = tp before MCore 0.10
    # where the gain comes from: the split sums to the recipe's time less the pick's
    split = t["gain_by_term_s"].map(lambda d: sum(d.values()))
    np.testing.assert_allclose(split, t["recipe_predicted_s"] - t["predicted_best_s"],
                               rtol=1e-6, atol=1e-9)


def test_plan_validate_has_the_tuned_switch():
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["validate", "--no-typed-back", "--help"])
    assert res.exit_code == 0 and "--tuned" in res.output


def test_case_of_a_row_by_hand():
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import moe_case_from_row

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    c = moe_case_from_row(df.loc["E0061"])  # DeepSeek-V3, 256 GB200, t1 p4 v4 ep64, MXFP8
    cfg = c.config
    assert (cfg.tp, cfg.pp, cfg.vp, cfg.ep, cfg.etp, cfg.dp) == (1, 4, 4, 64, 1, 64)
    assert cfg.expert_dp == 1 and c.training.precision == "fp8"
    assert c.cluster.tiers[0].domain_size == 64  # NVL72 rack used as a 64-GPU segment
    assert c.measured_step_s == pytest.approx(16.298)


def test_slowest_rank_model_by_hand():
    from perfmodel.parallel.config import ParallelConfig
    from perfmodel.spec.specs import load_model
    from validation.validate_moe import slowest_rank_model

    ds = load_model("deepseek-v3")  # 61 layers
    # pp 4 x vp 4 = 16 chunks of at most ceil(61/16) = 4 layers: 64 layers, 16 a rank
    c = ParallelConfig(dp=64, pp=4, vp=4, ep=64, etp=1, schedule="interleaved")
    assert slowest_rank_model(ds, c).num_layers == 64
    # pp 16: 4 a stage (Megatron-Bridge layout [E + 4], 14 x [4], [1 + MTP + loss])
    assert slowest_rank_model(ds, ParallelConfig(dp=16, pp=16, ep=8, etp=1)).num_layers == 64
    q = load_model("qwen3-235b-a22b")  # 94 layers; pp 8: 12 a stage
    assert slowest_rank_model(q, ParallelConfig(dp=8, pp=8, ep=8, etp=1)).num_layers == 96
    assert slowest_rank_model(q, ParallelConfig(dp=64, pp=2, ep=8, etp=1)) is q  # divides


def test_bridge_qwen3_235b_pipeline_split_by_hand():
    """Megatron-Bridge's qwen3_235b_a22b_pretrain_config counts the embedding and the loss as
    layers (account_for_embedding/loss_in_pipeline_split): 94 + 2 = 96 over the chunks, one
    decoder layer fewer in the first and the last chunk."""
    from perfmodel.parallel.layers import stage_layer_counts
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import bridge_accounts_embedding_and_loss, moe_case_from_row

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    r = df.loc["E0047"]  # 256 GB200, t1 p8 v1 ep32
    q = moe_case_from_row(r, df)
    assert q.config.embedding_as_layer and q.config.loss_as_layer
    assert q.model.num_layers == 94
    lay = stage_layer_counts(94, 8, 1, 0, 0, True, True)  # 96 / 8 = 12: ranks 11, 12 x 6, 11
    assert (int(lay["first"]), int(lay["middle"]), int(lay["last"])) == (11, 12, 11)
    lay = stage_layer_counts(94, 8, 3, 0, 0, True, True)  # chunks of 96 / 24 = 4: rank 0 3+4+4
    assert (int(lay["first"]), int(lay["first_chunk0"]), int(lay["middle_chunk"])) == (11, 3, 4)
    lay = stage_layer_counts(94, 4, 12, 0, 0, True, True)  # chunks of 2, ranks 23, 24, 24, 23
    assert (int(lay["first"]), int(lay["middle"])) == (23, 24)
    assert not bridge_accounts_embedding_and_loss(r, q.model, 1, 1)  # pp 1: nothing to split
    assert not bridge_accounts_embedding_and_loss(r, q.model, 2, 1)  # 94 divides by 2
    assert not bridge_accounts_embedding_and_loss(df.loc["E0005"], q.model, 8, 1)  # DeepSeek-V3
    assert not moe_case_from_row(df.loc["E0010"], df).config.loss_as_layer  # t2 p1


def test_recipe_loss_switches(monkeypatch):
    """Megatron-Bridge's recipes fuse the loss (cross_entropy_fusion_impl = "te"); the switch
    is off (docs/moe.md: the rows it would speed up are already too fast)."""
    import validation.validate_moe as vm
    from validation.validate import VALIDATION_DIR

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    assert vm.recipe_loss_switches(df.loc["E0047"]) == {}
    monkeypatch.setattr(vm, "BRIDGE_FUSED_CROSS_ENTROPY", True)
    assert vm.recipe_loss_switches(df.loc["E0047"]) == {"cross_entropy": "fused"}
    assert vm.recipe_loss_switches(df.loc["E0205"]) == {}  # dgxc Grok-1: NeMo launcher


def test_recipe_facts_and_default_etp():
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import moe_case_from_row, recipe_facts

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    assert "moe_a2a_overlap=True" in recipe_facts(df.loc["E0002"])  # 25.09 H100 recipe
    assert moe_case_from_row(df.loc["E0002"]).training.overlap_moe_comm
    assert "moe_a2a_overlap" not in recipe_facts(df.loc["E0003"])  # B200: no a2a overlap
    # Grok-1 (NeMo launcher, ETP unset): Megatron-Core's default etp = tp = 4
    assert moe_case_from_row(df.loc["E0205"]).config.etp == 4
    # Megatron-Bridge rows without an ETP: its presets' etp = 1
    assert moe_case_from_row(df.loc["E0010"]).config.etp == 1


def test_25_09_recipes_token_drop_graphs_and_recompute():
    """Megatron-Bridge 25.09 (validate_moe.RECIPE_FACTS): the "(tokendrop)" rows run
    apply_moe_token_drop (capacity 1.0, padded), Qwen3-30B on B200 / GB200 a full-iteration
    CUDA graph (not on H100), DeepSeek-V3 on B200 / GB200 recompute mla_up_proj."""
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import full_iteration_graph, moe_case_from_row, recipe_recompute

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    for rid, graphed in (("E0013", True), ("E0014", True), ("E0012", False), ("E0008", False),
                         ("E0003", False)):
        c = moe_case_from_row(df.loc[rid])
        assert c.model.moe_capacity_factor == 1.0, rid
        assert c.training.moe_pad_expert_input_to_capacity, rid
        assert c.training.cuda_graph_full_iteration is graphed, rid
    # the dropless 25.09 H100 DeepSeek-V3 and the 25.11 rows: no token drop, no full graph
    for rid in ("E0002", "E0031"):
        c = moe_case_from_row(df.loc[rid], df)
        assert c.model.moe_capacity_factor is None and not c.training.cuda_graph_full_iteration
    c = moe_case_from_row(df.loc["E0003"])
    assert c.config.recompute == "selective" and c.training.recompute_modules == ("mla_up_proj",)
    # the row's own column wins over the recipe fact; neither: ''
    assert recipe_recompute(df.loc["E0016"], "recompute_modules=mlp") == str(
        df.loc["E0016", "activation_recompute"])
    assert recipe_recompute(df.loc["E0013"], "") == ""
    assert full_iteration_graph("cuda_graph_impl=local; cuda_graph_scope=full_iteration")
    assert not full_iteration_graph("cuda_graph_scope=['attn', 'moe_router']")


def test_25_11_presets_tied_by_layout():
    """RECIPE_FACTS_BY_LAYOUT: the 25.11 rows the dataset left unmatched take a stored preset
    version's settings only where that preset has the row's GPUs, layout, MBS and GBS."""
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import moe_case_from_row, recipe_facts, row_layout

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    assert row_layout(df.loc["E0018"]) == "n256 t1 p4 v4 ep64 b1 gbs4096"
    # DeepSeek-V3 GB200 BF16 (deepseek/workload_base_configs.py @d19cb73): mla_up_proj, HybridEP
    t = moe_case_from_row(df.loc["E0018"], df)
    assert t.config.recompute == "selective" and t.training.recompute_modules == ("mla_up_proj",)
    assert t.training.moe_flex_backend == "hybridep"
    assert t.training.cuda_graph_scope == ("moe_router", "moe_preprocess")
    # GB300 p2 v4 ep32: HybridEP and TE graphs of attn / router / preprocess, no recompute
    for rid in ("E0021", "E0022"):
        c = moe_case_from_row(df.loc[rid], df)
        assert c.training.cuda_graph_scope == ("attn", "moe_router", "moe_preprocess"), rid
        assert c.training.moe_token_dispatcher == "flex" and c.config.recompute == "none", rid
    # GPT-OSS GB200 ep64 b1 GBS 1280 (gpt_oss/workload_base_configs.py @6b296ac)
    c = moe_case_from_row(df.loc["E0036"], df)
    assert c.training.recompute_modules == ("layernorm", "moe_act")
    # rows no stored preset version ties: untouched
    for rid in ("E0019", "E0025", "E0034", "E0035", "E0038", "E0065", "E0068", "E0074", "E0075"):
        assert "recompute_modules" not in recipe_facts(df.loc[rid]), rid
        assert moe_case_from_row(df.loc[rid], df).config.recompute == "none", rid


def test_rows_run_the_attention_kernel_their_recipe_leaves_te():
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import moe_case_from_row

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    # dgxc Grok-1 (NVTE_FUSED_ATTN=0): flash-attn 2, bf16 and fp8 rows alike
    for rid in ("E0205", "E0214"):
        t = moe_case_from_row(df.loc[rid]).training
        assert t.flash_attention and t.attention_backend == "flash-attn-2"
    # GPT-OSS's learnable sinks on NeMo 25.11 (cuDNN 9.13.1) and 26.02 (9.18): cuDNN, on H100
    # and Blackwell; DeepSeek-V3's MLA: cuDNN
    for rid in ("E0034", "E0036", "E0056", "E0001", "E0018"):
        t = moe_case_from_row(df.loc[rid]).training
        assert t.flash_attention and t.attention_backend == "cudnn", rid


def test_bridge_deepseek_layout_and_mtp_by_hand():
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import (
        bridge_stage_layers,
        moe_case_from_row,
        timed_model_and_batch,
    )

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    # E0061: t1 p4 v4, Megatron-Bridge layout (4, 4): chunks [E+4], 14 x [4], [1 + MTP + loss];
    # rank 3 holds chunks 3, 7, 11, 15: 4 + 4 + 4 + 1 = 13 decoder layers
    r = df.loc["E0061"]
    c = moe_case_from_row(r)
    assert bridge_stage_layers(r, c.config) == [16, 16, 16, 13]
    m, b = timed_model_and_batch(r, c)
    assert m.num_layers == 61 and m.mtp_num_layers == 1
    assert b.stage_layers[0].tolist() == [16, 16, 16, 13] and bool(b.has_layout[0])
    # E0003: t1 p16 v1: 15 ranks of 4, the last 1 + MTP + loss
    r3 = df.loc["E0003"]
    assert bridge_stage_layers(r3, moe_case_from_row(r3).config) == [4] * 15 + [1]
    # "w/o MTP" rows: the layout, no MTP layer (E0018 is labelled so)
    m18, _ = timed_model_and_batch(df.loc["E0018"], moe_case_from_row(df.loc["E0018"]))
    assert m18.mtp_num_layers == 0
    # a (pp, vp) the recipe names no layout for (E0001: p8 v4) keeps the padded even split
    r1 = df.loc["E0001"]
    c1 = moe_case_from_row(r1)
    assert bridge_stage_layers(r1, c1.config) is None
    assert timed_model_and_batch(r1, c1)[0].num_layers == 64


def test_grok_rows_pad_experts_to_capacity():
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import moe_case_from_row

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    c = moe_case_from_row(df.loc["E0205"])  # dgxc Grok-1: capacity 1.0, padded
    assert c.training.moe_pad_expert_input_to_capacity
    assert c.model.moe_capacity_factor == 1.0 and c.model.load_imbalance == 1.0
    c2 = moe_case_from_row(df.loc["E0061"])  # Megatron-Bridge: dropless
    assert not c2.training.moe_pad_expert_input_to_capacity
    assert c2.model.moe_capacity_factor is None


def test_rows_name_their_dispatcher_switches():
    """The switches a row states reach its TrainingSpec (validation.validate_moe.dispatch_switches):
    the Megatron-LM GB200 study's baseline (NCCL alltoall, no graphs, router unfused) and final
    recipe (HybridEP, graphs of attn / router / preprocess), a Bridge GB200 row, a Bridge B200
    alltoall row with router graphs, a dgxc Grok-1 row padded to capacity."""
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import moe_case_from_row

    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    t = {rid: moe_case_from_row(df.loc[rid]).training
         for rid in ("E0249", "E0250", "E0042", "E0031", "E0205", "E0064")}
    assert (t["E0249"].moe_token_dispatcher, t["E0249"].cuda_graph_scope,
            t["E0249"].moe_router_fusion) == ("alltoall", (), False)
    assert (t["E0250"].moe_token_dispatcher, t["E0250"].moe_flex_backend,
            t["E0250"].cuda_graph_scope, t["E0250"].moe_router_fusion) == (
        "flex", "hybridep", ("attn", "moe_router", "moe_preprocess"), True)
    assert (t["E0042"].moe_token_dispatcher, t["E0042"].moe_flex_backend) == ("flex", "hybridep")
    assert (t["E0031"].moe_token_dispatcher, t["E0031"].cuda_graph_scope) == (
        "alltoall", ("moe_router", "moe_preprocess"))
    assert t["E0205"].moe_pad_expert_input_to_capacity and not t["E0205"].moe_router_fusion
    assert (t["E0064"].moe_token_dispatcher, t["E0064"].moe_flex_backend,
            t["E0064"].overlap_moe_comm) == ("flex", "deepep", True)


@pytest.mark.slow
def test_switches_separate_the_gb200_study_pair(report):
    """E0249 (baseline) and E0250 (final) share the parallel config; the switches the model
    prices (router fusion, flex, partial CUDA graphs) make the baseline slower. Most of the
    measured 2x is the study's software steps that are not switches (TE kernel fusions, CPU-side
    binding, PDL), so the baseline stays far too fast (about -43 %)."""
    rows, _ = report
    p = rows.set_index("row_id")["predicted_s"]
    assert p["E0249"] > p["E0250"]


@pytest.mark.slow
def test_hybrid_nemotron3_nano_rows(report):
    # the hybrid Mamba2 / attention / MoE rows (perfmodel.compute.mamba), all predicted too fast:
    # (E0078-E0081)
    rows, _ = report
    nano = rows[rows["model"] == "Nemotron-3-Nano-30B-A3B"]
    assert len(nano) == 4
    # 7.3 % (-7.7, -6.0, -3.7, -12.0 %) with the SSD Triton kernels at
    # mamba.SSD_BANDWIDTH_EFFICIENCY 0.50 of the copy bandwidth (measured on mamba_ssm's forward
    # kernels, vLLM PR #27299; 13.0 % without it) and the hybrid's fp8 casts per operand
    # (quantise.layer_quantise_terms; 9.0 % without them); still all too fast
    assert np.all(nano["error"] < 0)
    assert np.all(np.abs(nano["error"]) <= 0.13) and np.abs(nano["error"]).mean() <= 0.08


@pytest.mark.slow
def test_micro_batch_gain_not_exaggerated(report):
    """The tuned search's larger-micro-batch picks (Qwen3-235B on 256 B200 / B300 at b 4,
    Qwen3-30B on 16 H100 at b 2, docs/moe.md "Source checks of the search's gains") live on the
    per-micro-batch terms (host time per local expert, all-to-all latency). Where the same model,
    GPUs and global batch were measured at two micro-batch sizes, the predicted speed-up must not
    exceed the measured one by more than 10 %: Qwen3-30B on 8 B200, b 1 -> b 4 (E0050, 26.02,
    27.05 s -> E0069, 26.02.01, 9.82 s: 2.75x measured, 1.82x predicted), and Qwen3-30B on 16
    H100, b 1 (E0068, GBS 1024, 28.94 s) against b 2 (E0012, 25.09, GBS 512, 12.49 s), per
    sample 28.3 against 24.4 ms: 1.16x measured, 1.19x predicted."""
    rows, _ = report
    r = rows.set_index("row_id")
    gbs = {"E0050": 512, "E0069": 512, "E0068": 1024, "E0012": 512}
    for slow, fast in (("E0050", "E0069"), ("E0068", "E0012")):
        meas = (r.loc[slow, "measured_s"] / gbs[slow]) / (r.loc[fast, "measured_s"] / gbs[fast])
        pred = (r.loc[slow, "predicted_s"] / gbs[slow]) / (r.loc[fast, "predicted_s"] / gbs[fast])
        assert pred <= 1.10 * meas, (slow, fast, pred, meas)
    # and the b 2 recipe NVIDIA ran on 16 H100 fits the memory model (at 0.998 of the usable HBM)
    assert bool(r.loc["E0012", "fits"])
