"""The dynamic-programming searcher: the DP against brute force, the batched solver against
the DP, and the searcher against the grid."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search.strategies.dp import (
    DPSearch,
    StageCoefficients,
    balanced_counts,
    brute_force_partition,
    partition_dp,
)


def _random_problem(seed: int, L: int, P: int, identical: bool = False):
    rng = np.random.default_rng(seed)
    n = 1 if identical else L

    def per_layer(lo, hi):
        return np.broadcast_to(rng.uniform(lo, hi, n), (L,)).copy()

    keep = per_layer(0.5, 2.0)
    return (
        per_layer(0.5, 2.0),  # layer time
        per_layer(0.0, 1.0),  # extra time when recomputed
        per_layer(0.0, 1.0),  # model states
        keep,  # activations kept
        keep * rng.uniform(0.0, 0.5),  # activations of a checkpointed layer
        rng.uniform(0.0, 2.0, P),  # stage fixed time (embedding, loss)
        rng.uniform(0.0, 2.0, P),  # stage fixed memory
        rng.integers(1, 5, P).astype(float),  # in-flight micro-batches
        rng.uniform(0.0, 1.0, P),  # one recomputed layer's full activations
        np.full(P, rng.uniform(1.0, 3.0 + 3.0 * L / P)),  # memory cap
    )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 12), P=st.integers(1, 4),
       N=st.one_of(st.none(), st.integers(0, 4)))
def test_dp_equals_brute_force(seed, L, P, N):
    """<= 12 layers, <= 4 stages, random costs and caps: same bottleneck and same total as
    every split with every recompute count."""
    P = min(P, L)
    args = _random_problem(seed, L, P)
    a = partition_dp(*args, recompute_layers=N)
    b = brute_force_partition(*args, recompute_layers=N)
    assert (a is None) == (b is None)
    if a is not None:
        assert a.bottleneck_s == pytest.approx(b.bottleneck_s, rel=1e-12)
        assert a.total_s == pytest.approx(b.total_s, rel=1e-12)
        assert a.counts.sum() == L and np.all(a.counts >= 1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 10), P=st.integers(1, 4),
       N=st.one_of(st.none(), st.integers(0, 3)))
def test_range_dp_on_stage_cost_tables_equals_partition_dp(seed, L, P, N):
    """:func:`search.strategies.dp.range_dp` (the batched DP over precomputed stage costs ``W[s, k, i]``,
    what interleaved MoE models use) on the tables of :func:`partition_dp`'s own stage cost:
    the same bottleneck and total, and its counts and recompute give them back."""
    from search.strategies.dp import _stage_cost, range_dp

    P = min(P, L)
    args = [np.asarray(a, dtype=np.float64) for a in _random_problem(seed, L, P)]
    ref = partition_dp(*args, recompute_layers=N)

    def prefix(x):
        return np.concatenate([[0.0], np.cumsum(x)])

    c, cr, sb, keep, ckpt, fs, fb, infl, once, cap = args
    pre = (prefix(c), prefix(cr), prefix(sb), prefix(keep), prefix(keep - ckpt))
    W = np.full((1, P, L + 1, L + 1), np.inf)
    R = np.zeros((1, P, L + 1, L + 1), dtype=np.int64)
    for s in range(P):
        for i in range(1, L + 1):
            w, r = _stage_cost(s, np.arange(i), i, P, pre, fs, fb, infl, once, cap, N)
            W[0, s, :i, i], R[0, s, :i, i] = w, r
    cnt, rec, T = range_dp(W, R)
    assert (ref is None) == (not np.isfinite(T[0]))
    if ref is not None:
        assert T[0] == pytest.approx(ref.bottleneck_s, rel=1e-12)
        bounds = np.concatenate([[0], np.cumsum(cnt[0])])
        times = [W[0, s, bounds[s], bounds[s + 1]] for s in range(P)]
        assert max(times) == pytest.approx(ref.bottleneck_s, rel=1e-12)
        assert sum(times) == pytest.approx(ref.total_s, rel=1e-12)
        assert cnt[0].sum() == L and np.all(cnt[0] >= 1)
        assert all(rec[0, s] == R[0, s, bounds[s], bounds[s + 1]] for s in range(P))


def test_dp_hand_example():
    """4 layers of 1 s (0.3 s more when recomputed), embedding 1 s on stage 0, loss 0.5 s on
    stage 1. A layer holds 1 byte of state and 1 byte of activations (0.25 when checkpointed),
    one micro-batch in flight, so stage 0 with n layers of which r recompute needs
    ``2n - 0.75r`` bytes.

    * No cap: (1, 3) takes max(2, 3.5) = 3.5 s, (2, 2) max(3, 2.5) = 3 s -> (2, 2), 3 s.
    * Cap 2.5: two layers fit only by recomputing both (2.5 bytes, 2 + 0.6 + 1 = 3.6 s), worse
      than (1, 3) at 3.5 s -> (1, 3), 3.5 s.
    * Cap 3.25: two layers fit recomputing one (3.25 bytes, 3.3 s) -> (2, 2), r = (1, 0), 3.3 s.
    """
    ones = np.ones(4)
    args = (ones, 0.3 * ones, ones, ones, 0.25 * ones, [1.0, 0.5], [0.0, 0.0], [1.0, 1.0],
            [0.0, 0.0])
    free = partition_dp(*args, [1e9, 1e9])
    assert free.counts.tolist() == [2, 2] and free.bottleneck_s == pytest.approx(3.0)
    capped = partition_dp(*args, [2.5, 1e9])
    assert capped.counts.tolist() == [1, 3] and capped.bottleneck_s == pytest.approx(3.5)
    # Cap 3.25: two layers fit on stage 0 by recomputing one (3 s + 0.3 s recompute).
    rec = partition_dp(*args, [3.25, 1e9])
    assert rec.counts.tolist() == [2, 2] and rec.recomputed.tolist() == [1, 0]
    assert rec.bottleneck_s == pytest.approx(3.3)


def _coefficients_of(problems, Smax=4):
    """StageCoefficients of identical-layer problems (one unit = one layer)."""
    def pad(x):
        x = np.asarray(x, dtype=float)
        return np.concatenate([x, np.zeros(Smax - x.size)])

    cols = {k: [] for k in ("unit_s", "recompute_unit_s", "fixed_s", "mem1_bytes",
                            "mem_unit_bytes", "once_bytes", "saved_bytes", "cap_bytes",
                            "units", "stages", "recompute_units")}
    for args, N in problems:
        c, cr, w, keep, ckpt, fs, fb, infl, once, cap = args
        cols["unit_s"].append(c[0])
        cols["recompute_unit_s"].append(cr[0])
        cols["fixed_s"].append(pad(fs))
        cols["mem1_bytes"].append(pad(fb + w[0] + infl * keep[0]))
        cols["mem_unit_bytes"].append(pad(w[0] + infl * keep[0]))
        cols["once_bytes"].append(pad(once))
        cols["saved_bytes"].append(pad(infl * (keep[0] - ckpt[0])))
        cols["cap_bytes"].append(cap[0])
        cols["units"].append(c.size)
        cols["stages"].append(fs.size)
        cols["recompute_units"].append(-1 if N is None else N)
    return StageCoefficients(**{k: np.array(v) for k, v in cols.items()})


def test_batched_solver_equals_dp_on_identical_layers():
    """The vectorised threshold search gives the DP's bottleneck and total for identical
    layers, for 300 random problems in one call (per-stage and one-count recompute)."""
    rng = np.random.default_rng(7)
    problems = []
    for i in range(300):
        L = int(rng.integers(1, 13))
        P = int(rng.integers(1, min(4, L) + 1))
        N = None if i % 2 else int(rng.integers(0, 4))
        problems.append((_random_problem(i, L, P, identical=True), N))
    cnt, rec, bott = balanced_counts(_coefficients_of(problems))
    for j, (args, N) in enumerate(problems):
        ref = partition_dp(*args, recompute_layers=N)
        if ref is None:
            assert not np.isfinite(bott[j])
            continue
        P = args[5].size
        assert bott[j] == pytest.approx(ref.bottleneck_s, rel=1e-9)
        assert cnt[j, :P].sum() == args[0].size
        total = (cnt[j, :P] * args[0][0] + rec[j, :P] * args[1][0] + args[5]).sum()
        assert total == pytest.approx(ref.total_s, rel=1e-9)


# --------------------------------------------------------------------------------------------
# The searcher on real models
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nemotron():
    from search import plan

    kw = {"gpus": 128, "global_batch_size": 32, "seq_len": 4096, "top": 3, "framework": "ideal"}
    return plan("nemotron4-340b", "dgx-h100", **kw), plan("nemotron4-340b", "dgx-h100",
                                                           strategy="dp", **kw)


@pytest.mark.slow
def test_nemotron_dp_balances_memory_bound_stages(nemotron):
    """Nemotron-4 340B on 128 H100 (GBS 32, seq 4096): the DP finds a layout that fits without
    full recompute and is faster than the grid's best (predicted 5.01 s -> 4.82 s), by moving
    layers off the first stages, which hold the most micro-batches."""
    grid, dp = nemotron
    g, d = grid.rows[0], dp.rows[0]
    assert d["config"]["recompute"] != "full" and d["fits"]
    assert d["step_time_s"] < g["step_time_s"]
    lay = d["config"]["stage_layers"]
    assert lay is not None and sum(lay) == 96 and lay[0] < max(lay)


@pytest.mark.slow
def test_llama405b_512_dp_without_full_recompute():
    """Llama 3.1 405B on 512 H100 (GBS 256, seq 8192): with even splits only the grid's best
    recomputes fully (21.4 s); the DP's fits without full recompute, is faster than that and
    no worse than the grid with Megatron's uneven layouts (18.39 s)."""
    from search import plan

    kw = {"gpus": 512, "global_batch_size": 256, "seq_len": 8192, "top": 3}
    even = plan("llama3.1-405b", "dgx-h100", uneven_layers=False, **kw).rows[0]
    g = plan("llama3.1-405b", "dgx-h100", **kw).rows[0]
    d = plan("llama3.1-405b", "dgx-h100", strategy="dp", **kw).rows[0]
    assert even["config"]["recompute"] == "full"
    assert d["config"]["recompute"] != "full" and d["fits"]
    assert d["step_time_s"] < even["step_time_s"]
    assert d["step_time_s"] <= g["step_time_s"]


@pytest.mark.slow
def test_llama405b_16k_no_worse_than_grid():
    """``--strategy dp`` for Llama 3.1 405B on 16,384 H100 is no worse than the grid (its
    30 s goal is timed by benchmarks/bench_search.py)."""
    from search import plan

    kw = {"gpus": 16384, "global_batch_size": 2048, "seq_len": 8192, "top": 3}
    d = plan("llama3.1-405b", "dgx-h100", strategy="dp", **kw)
    g = plan("llama3.1-405b", "dgx-h100", **kw)
    assert d.rows[0]["step_time_s"] <= g.rows[0]["step_time_s"]


def test_dp_result_flows_through_emit_and_json(nemotron):
    """The DP's best is a SearchResult row like any other: JSON config with its layout, a
    breakdown, and Megatron flags with the layout string."""
    from emit.launch import megatron_args
    from perfmodel.parallel.config import ParallelConfig
    from perfmodel.spec.specs import load_model, load_training

    _, dp = nemotron
    row = dp.rows[0]
    cfg = ParallelConfig(**row["config"])
    b = dp.breakdown(0)
    assert sum(v for _, v, _ in b["time"]) == pytest.approx(row["step_time_s"], rel=1e-9)
    text = megatron_args(cfg, load_model("nemotron4-340b"),
                         load_training(None, global_batch_size=32, seq_len=4096))
    layout = "|".join(("E," if s == 0 else "") + f"t*{n}" + (",L" if s == cfg.pp - 1 else "")
                      for s, n in enumerate(cfg.stage_layers))
    assert f"--pipeline-model-parallel-layout {layout}" in text
    assert dp.to_json()["best"]["config"]["stage_layers"] == list(cfg.stage_layers) or \
        tuple(dp.to_json()["best"]["config"]["stage_layers"]) == cfg.stage_layers


def test_dp_needs_fused_kernels():
    from perfmodel.core.errors import SpecError
    from tests.search.test_space import small_problem

    p = small_problem()
    p = type(p)(p.space, p.evaluator, p.objective, kernels="eager")
    with pytest.raises(SpecError, match="kernels must be 'fused'"):
        DPSearch().run(p)


def test_cli_strategy_dp_prints_the_layout_and_emits_it():
    """``plan --strategy dp`` on Llama 2 13B / 8 A100-40GB with 1F1B and tp 2, pp 1 (memory-bound:
    ZeRO-3 and recompute needed): the best recomputes only part of its layers (Megatron's block recompute), shown under the best configuration, in
    ``--json`` and in ``--emit megatron``."""
    import json

    from typer.testing import CliRunner

    from cli.main import app

    args = ["--model", "llama2-13b", "--cluster", "dgx-a100-40g", "--gpus", "8",
            "--global-batch", "32", "--seq-len", "4096", "--cp", "1", "--schedule", "1f1b",
            "--tp", "2", "--pp", "1", "--strategy", "dp", "--top", "3"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    cfg = doc["best"]["config"]
    assert doc["search"]["strategy"] == "dp" and sum(cfg["stage_layers"]) == 40
    rec = cfg["stage_recompute_layers"]
    assert cfg["recompute"] == "full" and 0 < max(rec) < 40
    r = CliRunner().invoke(app, [*args, "--emit", "megatron"])
    assert r.exit_code == 0, r.output
    assert "--recompute-method block" in r.stdout
    assert f"--recompute-num-layers {max(rec)}" in r.stdout
    if cfg["pp"] > 1:
        assert "--pipeline-model-parallel-layout" in r.stdout
    assert f"(recomputed: {' '.join(map(str, rec))})" in r.output


def test_gantt_of_a_dp_layout():
    """The result's Gantt chart (plots.figures.plot_config_timeline) draws the DP's layout: the
    title names rank 0's and the last rank's layers."""
    import matplotlib

    matplotlib.use("Agg")
    from perfmodel.parallel.config import ParallelConfig, resolve_config
    from perfmodel.spec.specs import load_cluster, load_model, load_training
    from plots.figures import plot_config_timeline

    model = load_model("llama2-13b")
    training = load_training(None, global_batch_size=32, seq_len=4096)
    cluster = load_cluster("dgx-a100-40g", 8)
    cfg = resolve_config(ParallelConfig(dp=1, tp=2, pp=4, stage_layers=(9, 10, 11, 10),
                                        sequence_parallel=True), model, training, cluster)
    fig = plot_config_timeline(model, training, cluster, cfg)
    assert "layers of rank 0 9, of rank 3 10" in fig.axes[0].get_title()


def test_dp_plans_moe_models_with_their_expert_terms():
    """The per-stage layout model has the expert terms (experts sharded ep*etp, their states over
    expert-dp, MoE activations and dispatch buffers; the time per layer carries the all-to-all):
    the dp searcher ranks MoE configurations, with ep searched, and its best is never worse than
    the grid's (the even split is one of its layouts). Before it had predicted Mixtral on 64 H100
    at 2.25 s with ep = 1 and no all-to-all, where the grid's best, with ep, is 2.82 s."""
    import search

    grid = search.plan("mixtral-8x7b", "dgx-h100", gpus=64, top=1)
    dp = search.plan("mixtral-8x7b", "dgx-h100", gpus=64, strategy="dp", top=1)
    g, d = grid.top.iloc[0], dp.top.iloc[0]
    assert d["step_time_s"] <= g["step_time_s"] * (1 + 1e-9)
    assert d["step_time_s"] >= 0.9 * g["step_time_s"]  # no layout escapes the expert terms
    assert int(d["ep"]) > 1
