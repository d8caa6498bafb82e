"""The balanced explicit pipeline layout (Megatron-Core ``--pipeline-model-parallel-layout``):
layer counts, its place among Megatron-LM's layouts, the search, the release capability and the
emitted layout string read back by Megatron-Core's own parser."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ConfigBatch, ParallelConfig, resolve_config
from perfmodel.parallel.layers import (
    balanced_chunk_layers,
    balanced_layer_counts,
    balanced_stage_layers,
    megatron_layout,
    stage_layer_table,
)
from perfmodel.spec.frameworks import explicit_layout_allowed, load_framework
from perfmodel.spec.specs import load_cluster, load_model, load_training


def test_deepseek_v3_on_pp8_vp4_by_hand():
    # 61 layers over 32 chunks: q = 1, r = 29 heavier chunks (2 layers) first in model order,
    # chunks 29, 30, 31 (ranks 5, 6, 7, their last chunk) hold 1. Rank s holds chunks s, s+8,
    # s+16, s+24: ranks 0-4 four heavier chunks (8 layers), ranks 5-7 three (7 layers).
    assert balanced_stage_layers(61, 8, 4).tolist() == [[8, 8, 8, 8, 8, 7, 7, 7]]
    t = stage_layer_table(61, 8, 4)
    assert t[:5].tolist() == [[2, 2, 2, 2]] * 5
    assert t[5:].tolist() == [[2, 2, 2, 1]] * 3
    chunks = balanced_chunk_layers([8, 8, 8, 8, 8, 7, 7, 7], 4)
    assert chunks == [2] * 29 + [1] * 3
    c = {k: int(v[0]) for k, v in balanced_layer_counts(61, 8, 4).items()}
    assert (c["first"], c["middle"], c["last"], c["max_rank"]) == (8, 8, 7, 8)
    assert (c["first_chunk0"], c["last_chunk"], c["last_chunk_end"]) == (2, 2, 1)


def test_pp16_vp3_and_two_ranks_by_hand():
    # 61 on 48 chunks: q = 1, r = 13: ranks 0-12 hold one heavier chunk (4), ranks 13-15 hold 3
    assert balanced_stage_layers(61, 16, 3)[0].tolist() == [4] * 13 + [3] * 3
    # 61 on pp 2 x vp 4: q = 7, r = 5; rank 0 chunks 0, 2, 4 heavier (31), rank 1 chunks 1, 3 (30)
    assert balanced_stage_layers(61, 2, 4)[0].tolist() == [31, 30]


def test_fifth_option_only_where_the_others_fail():
    # (8, 1): lighter first / last ranks (6, 8 x 6, 7); (8, 4) and (4, 4): with an odd L and
    # an even vp no first / last split fits (each rank's layers a multiple of vp)
    lay = megatron_layout(61, [8, 8, 4, 16], [4, 1, 4, 4])
    assert lay["valid"].tolist() == [False, True, False, False]
    ex = megatron_layout(61, [8, 8, 4, 16], [4, 1, 4, 4], explicit=True)
    assert ex["valid"].tolist() == [True, True, True, False]  # 16 * 4 = 64 chunks > 61 layers
    assert ex["explicit"].tolist() == [True, False, True, False]
    # the even split, and the embedding / loss as layers, stay the first choices
    assert not megatron_layout(64, 8, 4, explicit=True)["explicit"][0]
    assert not megatron_layout(126, 8, 8, explicit=True)["explicit"][0]


@settings(max_examples=200, deadline=None)
@given(L=st.integers(2, 200), pp=st.integers(2, 32), vp=st.integers(1, 16))
def test_balanced_layout_properties(L, pp, vp):
    """Rank counts sum to L, every chunk holds at least one layer (Megatron builds no empty
    decoder chunk here), chunks differ by at most one, the heavier ones first; the
    slowest-rank counts agree with the ranks."""
    if pp * vp > L:
        assert not megatron_layout(L, pp, vp, explicit=True)["explicit"][0] or L % (pp * vp) == 0
        return
    ranks = balanced_stage_layers(L, pp, vp)[0]
    assert ranks.sum() == L and ranks.shape == (pp,)
    chunks = balanced_chunk_layers(ranks, vp)
    assert sum(chunks) == L and min(chunks) >= 1 and max(chunks) - min(chunks) <= 1
    assert chunks == sorted(chunks, reverse=True)
    for s in range(pp):
        assert sum(chunks[s::pp]) == ranks[s]
    c = {k: v[0] for k, v in balanced_layer_counts(L, pp, vp).items()}
    assert c["first"] == ranks[0] == c["max_rank"] == ranks.max()
    assert c["last"] == ranks[-1] == ranks.min()
    assert c["middle"] == (ranks[1:-1].max() if pp > 2 else ranks[0])
    table = np.array([[chunks[k * pp + s] for k in range(vp)] for s in range(pp)])
    assert c["first_chunk0"] == table[0, 0] and c["last_chunk_end"] == table[-1, -1]
    if vp > 1:
        assert c["last_chunk"] == table[-1, 0]


def test_config_batch_counts_and_resolve():
    b = ConfigBatch.from_arrays(pp=np.array([8, 8]), vp=np.array([4, 1]), num_microbatches=8)
    lc = b.layer_counts(61)
    assert lc["valid"].tolist() == [True, True]
    assert lc["max_rank"].tolist() == [8, 8] and lc["last"].tolist() == [7, 7]
    m = load_model("deepseek-v3")
    tr = load_training(global_batch_size=8192, seq_len=4096)
    cfg = ParallelConfig(dp=64, tp=2, pp=8, vp=4, schedule="interleaved", ep=64, etp=1,
                         sequence_parallel=True)
    c = resolve_config(cfg, m, tr, load_cluster("dgx-h100", gpus=1024))
    assert c.stage_layers is None and not c.first_stage_layers  # implied by (pp, vp)
    with pytest.raises(SpecError, match=r"pp\*vp \(16\*4=64\) does not divide num_layers \(61\)"):
        resolve_config(cfg.model_copy(update={"pp": 16, "dp": 32}), m, tr)


def test_release_capability():
    for name in ("megatron-lm", "bridge-25.09", "bridge-25.x", "bridge-26.02"):
        fw = load_framework(name)
        assert explicit_layout_allowed(fw) and "0.13" in fw.capabilities.pipeline_layout.source
    for name in ("nemo-24.07", "nemo-24.09", "megatron-2022", "torchtitan"):
        assert not explicit_layout_allowed(load_framework(name))
    assert explicit_layout_allowed(None)


@pytest.mark.slow
def test_search_pins_the_deepseek_recipe():
    """E0002's recipe (t2 p8 v4 ep64 on 1024 H100) is planned without a framework and with
    Megatron-Bridge 25.09, and refused with NeMo 24.09 (Megatron-Core 0.9), naming it."""
    from search.api import plan

    m = load_model("deepseek-v3")
    kw = {"gpus": 1024, "global_batch_size": 8192, "seq_len": 4096, "top": 1, "tp": 2,
          "pp": 8, "vp": 4, "ep": 64, "etp": 1, "micro_batch_size": 1, "recompute": "none",
          "sequence_parallel": True, "zero_stage": 1}
    r = plan(m, "dgx-h100", **kw)
    assert len(r.top) == 1 and int(r.top["vp"].iloc[0]) == 4
    assert len(plan(m, "dgx-h100", framework="bridge-25.09", **kw).top) == 1
    with pytest.raises(SpecError, match="nemo-24.09.*pipeline-model-parallel-layout"):
        plan(m, "dgx-h100", framework="nemo-24.09", **kw)


def test_emitted_layout_parses_in_megatron_core():
    from emit.launch import emit, stage_layers

    m = load_model("deepseek-v3").model_copy(update={"mtp_num_layers": 0})
    tr = load_training(global_batch_size=8192, seq_len=4096)
    c = resolve_config(ParallelConfig(dp=64, tp=2, pp=8, vp=4, schedule="interleaved", ep=64,
                                      etp=1, sequence_parallel=True), m, tr)
    chunks = stage_layers(c, m)
    assert chunks == [2] * 29 + [1] * 3
    args = emit("megatron", c, m, tr).splitlines()
    lay = [a.split(" ", 1)[1] for a in args if a.startswith("--pipeline-model-parallel-layout")]
    assert len(lay) == 1 and not any("virtual" in a for a in args if a.startswith("--"))
    assert 'pipeline_model_parallel_layout: "' + lay[0] + '"' in emit("bridge", c, m, tr)
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    parsed = PipelineParallelLayerLayout(lay[0], 8)
    parsed.validate_layer_layout(61, 0)
    assert parsed.virtual_pipeline_model_parallel_size == 4
    assert [parsed.layout[i % 8][i // 8].count(LayerType.decoder) for i in range(32)] == chunks


def test_moe_layers_of_ranks_not_a_multiple_of_vp():
    """DeepSeek-V3 (3 dense leading layers) on Bridge's (4, 4) ranks 16 / 16 / 16 / 13: rank 0
    holds layers 0-3 (3 dense) and three more MoE chunks, rank 3 its 13 layers (chunks of 4, 3,
    3, 3, all MoE). The balanced (8, 4) layout: virtual stage 0 (rank 0) holds layers 0-1 (both
    dense), stage 1 (rank 1) layers 2-3 (one dense): 6 and 7 MoE layers of their 8."""
    from perfmodel.memory.stage_layout import stage_moe_layers

    m = load_model("deepseek-v3")
    b = ConfigBatch.from_arrays(pp=np.array([4, 8]), vp=np.array([4, 4]), num_microbatches=8)
    lay = np.array([[16, 16, 16, 13, 0, 0, 0, 0], [8, 8, 8, 8, 8, 7, 7, 7]])
    assert stage_moe_layers(m, b, lay).tolist() == [[13, 16, 16, 13, 0, 0, 0, 0],
                                                    [6, 7, 8, 8, 8, 7, 7, 7]]
