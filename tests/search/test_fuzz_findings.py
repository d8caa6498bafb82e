"""Fuzzing findings, one test each: every case ends as one line on stderr with exit 2,
or as a correct answer (huge counts, non-finite spec values, binary files, broken training-runs
tables, ``plan verify --global-batch 0``, the pipeline calculators and the divisor lists)."""

from __future__ import annotations

import math
import tracemalloc
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import search.api
from cli.main import app
from hardware_specs import find_preset
from perfmodel.core.errors import SpecError
from perfmodel.parallel.layers import partition_layers
from perfmodel.pipeline.schedules import bubble_fraction
from perfmodel.spec.specs import MAX_GPUS, load_cluster
from search.space import divisors
from tests.search.test_space import fake_evaluate
from validation.validate import VALIDATION_DIR, training_runs_report

runner = CliRunner()


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    monkeypatch.setattr(search.api, "_default_evaluator", lambda: fake_evaluate)


def one_line_error(args, *needles, prefix="plan: error: "):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(prefix) and "Traceback" not in r.output, lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ huge counts
@pytest.mark.parametrize("args, needle", [
    (["--gpus", str(10**12)], "--gpus 1000000000000: above the limit of 1,048,576 GPUs"),
    (["--gpus", str(10**9)], "above the limit of 1,048,576 GPUs"),
    (["--global-batch", str(10**15), "--allow-idle-gpus"], "--global-batch"),
    (["--global-batch", str(10**20)], "above the limit of 16,777,216 sequences"),
    (["--tp", str(10**19)], "--tp 10000000000000000000: above the limit"),
    (["--dp", str(10**19)], "--dp"),
    (["--micro-batch", str(10**19)], "--micro-batch"),
    (["--pp", str(10**19)], "--pp"),
    (["--cp", str(10**19)], "--cp"),
    (["--vp", str(10**19)], "--vp"),
    (["--seq-len", str(10**20)], "--seq-len"),
    (["--top", str(10**9)], "--top"),
    (["--gpus", "0"], "--gpus 0: expected a positive integer"),
    (["--tp", "-3"], "--tp -3: expected a positive integer"),
])
def test_huge_or_nonpositive_counts_name_the_limit(args, needle):
    one_line_error(args, needle)


def test_cluster_file_with_a_huge_node_count(tmp_path):
    text = find_preset("cluster", "dgx-a100-80g").read_text()
    f = tmp_path / "c.toml"
    f.write_text(text.replace("num_nodes = 128", f"num_nodes = {10**12}"))
    one_line_error(["--cluster", str(f)], f"exceeds the limit of {MAX_GPUS:,} GPUs")
    with pytest.raises(SpecError):
        load_cluster(str(f))


def test_api_large_global_batch_does_not_enumerate_its_divisors():
    # dp candidates with idle GPUs are divisors of the global batch up to the GPU count
    tracemalloc.start()
    v = divisors(10**15, upto=1024)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert v.tolist() == [d for d in range(1, 1025) if 10**15 % d == 0]
    assert peak < 64 * 2**20


# ------------------------------------------------------------------ divisors
@given(st.integers(1, 5000), st.one_of(st.none(), st.integers(1, 6000)))
def test_divisors_match_brute_force(n, upto):
    want = [d for d in range(1, n + 1) if n % d == 0 and (upto is None or d <= upto)]
    assert divisors(n, upto).tolist() == want


def test_divisors_of_large_counts():
    assert divisors(10**12).size == 169  # (12+1)^2
    assert divisors(2**40, upto=64).tolist() == [1, 2, 4, 8, 16, 32, 64]
    assert divisors(10**20, upto=16).tolist() == [1, 2, 4, 5, 8, 10, 16]
    with pytest.raises(ValueError):
        divisors(0)


# ------------------------------------------------------------------ non-finite spec values
@pytest.mark.parametrize("old, new, needle", [
    ("latency_us = 8.0", "latency_us = inf", "latency_us = inf: expected a finite number"),
    ("latency_us = 8.0", "latency_us = nan", "latency_us = nan: expected a finite number"),
    ("oversubscription = 1.0", "oversubscription = inf", "oversubscription = inf"),
])
def test_cluster_file_rejects_nan_and_inf(tmp_path, old, new, needle):
    text = find_preset("cluster", "dgx-a100-80g").read_text()
    assert old in text
    f = tmp_path / "c.toml"
    f.write_text(text.replace(old, new, 1))
    line = one_line_error(["--cluster", str(f)], needle)
    assert "tier 1 (InfiniBand 'hdr-ib')" in line  # the tier named, not "tiers.1"


def test_model_and_training_files_reject_inf(tmp_path):
    f = tmp_path / "m.toml"
    text = find_preset("model", "gpt3-1.3b").read_text()
    f.write_text(text.replace("published_params = ", "published_params = inf #"))
    one_line_error(["--model", str(f)], "published_params = inf")
    t = tmp_path / "t.toml"
    t.write_text("global_batch_size = inf\n")
    one_line_error(["--training", str(t)], "global_batch_size")


def test_misspelt_spec_key_suggests_the_closest(tmp_path):
    text = find_preset("cluster", "dgx-a100-80g").read_text()
    f = tmp_path / "c.toml"
    f.write_text(text.replace("gpus_per_node", "gpus_per_nod"))
    one_line_error(["--cluster", str(f)], "unknown key 'gpus_per_nod'",
                   "did you mean 'gpus_per_node'?")


# ------------------------------------------------------------------ realtime
def test_realtime_on_a_binary_file(tmp_path):
    f = tmp_path / "spec.toml"
    f.write_bytes(bytes(range(256)) * 4)
    one_line_error(["realtime", str(f)], "not a text file", prefix="error: ")


def test_realtime_rejects_infinite_values(tmp_path):
    text = find_preset("realtime", "exercise_9_6").read_text()
    f = tmp_path / "rt.toml"
    f.write_text(text.replace("compute_efficiency = 0.5", "compute_efficiency = 0.5\n"
                              "launch_overhead_us = inf", 1).replace(
        "launch_overhead_us = 10.0", "", 1))
    one_line_error(["realtime", str(f)], "expected a finite number", prefix="error: ")


# ------------------------------------------------------------------ plan validate --runs
def _rows(n=3) -> pd.DataFrame:
    df = pd.read_csv(VALIDATION_DIR / "training_runs_dev.csv")
    return df[df["row_id"].isin(["R0045", "R0046", "R0047"])].head(n).copy()


@pytest.mark.parametrize("col, value, reason", [
    ("num_layers", "twenty-four", "num_layers = 'twenty-four'"),
    ("num_gpus", "lots", "num_gpus = 'lots'"),
    ("num_attention_heads", float("nan"), "num_attention_heads"),
    ("seconds_per_iteration", 0.0, "measured time 0.0 s: expected a positive number"),
    ("hidden_size", 0, "hidden_size"),
    ("num_gpus", 0, "num_gpus"),
    ("gpu_type", "Z80", "gpu_type 'Z80' has no cluster preset"),
    ("tensor_parallel", "many", "tensor_parallel = 'many'"),
])
def test_validate_skips_a_bad_row_with_its_reason(tmp_path, col, value, reason):
    df = _rows()
    df[col] = df[col].astype(object)
    df.iloc[0, df.columns.get_loc(col)] = value
    f = tmp_path / "runs.csv"
    df.to_csv(f, index=False)
    report, skipped = training_runs_report(f)
    assert len(report) == 2
    assert skipped["row_id"].tolist() == ["R0045"]
    assert reason in skipped["reason"].iloc[0]
    r = runner.invoke(app, ["validate", "--no-typed-back", "--runs", str(f), "--no-vtrain"])
    assert r.exit_code == 0, r.output
    assert "not expressible: R0045" in r.stdout


def test_validate_blank_micro_batch(tmp_path):
    df = _rows()
    df["micro_batch_size"] = np.nan  # R0047 has pp = 8: cannot be one micro-batch per step
    f = tmp_path / "runs.csv"
    df.to_csv(f, index=False)
    report, skipped = training_runs_report(f)
    assert set(report["row_id"]) == {"R0045", "R0046"}  # pp = 1, dp = 1: gb / dp = 4
    assert skipped["row_id"].tolist() == ["R0047"]
    assert "micro_batch_size not published" in skipped["reason"].iloc[0]


@pytest.mark.parametrize("content, needle", [
    (b"", "empty file"),
    (b"\x00\x9f\x92\x96garbage\xff" * 50, "--runs"),
    (b"just some text\nwithout the columns\n", "missing column(s)"),
])
def test_validate_unreadable_file_is_one_line(tmp_path, content, needle):
    f = tmp_path / "runs.csv"
    f.write_bytes(content)
    one_line_error(["validate", "--no-typed-back", "--runs", str(f), "--no-vtrain"], needle)


def test_validate_header_only_and_missing_file(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text((VALIDATION_DIR / "training_runs_dev.csv").read_text().splitlines()[0] + "\n")
    # a table without a usable row is a user error (it exited 0 with "rows": 0)
    one_line_error(["validate", "--no-typed-back", "--runs", str(f), "--no-vtrain", "--json"],
                   "no row can be predicted")
    one_line_error(["validate", "--no-typed-back", "--runs", str(tmp_path / "nope.csv"), "--no-vtrain"],
                   "no such file")


# ------------------------------------------------------------------ plan verify
@pytest.mark.slow
def test_verify_global_batch_zero_is_one_line():
    pytest.importorskip("torch")
    one_line_error(["verify", "--global-batch", "0"], "--global-batch = 0",
                   prefix="plan verify: error: ")


# ------------------------------------------------------------------ pipeline calculators
@pytest.mark.parametrize("args", [(0, 8), (8, -1), (8, 0), (2.5, 4), (4, float("nan")),
                                  (4, 8, "interleaved", 0)])
def test_bubble_fraction_rejects_nonsense(args):
    with pytest.raises(ValueError, match="expected whole numbers >= 1"):
        bubble_fraction(*args)


@pytest.mark.parametrize("costs, stages, match", [
    ([1, float("nan"), 3], 2, r"layer_costs\[1\] = nan"),
    ([1, -2, 3], 2, r"layer_costs\[1\] = -2"),
    ([1, 2, 3], 0, "stages"),
    ([1, 2, 3], 4, "stages"),
    ([1, 2, 3], 1.5, "stages"),
])
def test_partition_layers_rejects_nonsense(costs, stages, match):
    with pytest.raises(ValueError, match=match):
        partition_layers(costs, stages)


def _brute(costs, p, mem=None, cap=None):
    n, best = len(costs), math.inf
    for cuts in combinations(range(1, n), p - 1):
        b = [0, *cuts, n]
        if mem is not None and any(sum(mem[b[i]:b[i + 1]]) > cap for i in range(p)):
            continue
        best = min(best, max(sum(costs[b[i]:b[i + 1]]) for i in range(p)))
    return best


@given(st.lists(st.integers(0, 9), min_size=1, max_size=8), st.data())
def test_partition_layers_is_optimal(costs, data):
    p = data.draw(st.integers(1, len(costs)))
    mem = data.draw(st.lists(st.integers(0, 4), min_size=len(costs), max_size=len(costs)))
    cap = data.draw(st.integers(1, 10))
    want = _brute(costs, p, mem, cap)
    if not math.isfinite(want):
        with pytest.raises(ValueError):
            partition_layers(costs, p, mem, cap)
        return
    b, got = partition_layers(costs, p, mem, cap)
    assert got == want
    assert b[0] == 0 and b[-1] == len(costs) and np.all(np.diff(b) >= 1)
    assert max(sum(costs[b[i]:b[i + 1]]) for i in range(p)) == got
    assert all(sum(mem[b[i]:b[i + 1]]) <= cap for i in range(p))


def test_partition_layers_memory_is_o_layers_times_stages():
    # 20,000 layers on 64 stages: the old L x L table would be 20,001^2 * 8 B = 3.0 GiB
    tracemalloc.start()
    _, worst = partition_layers(np.ones(20_000), 64)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert worst == math.ceil(20_000 / 64)
    assert peak < 64 * 20_001 * 8 * 4  # a few (stages x layers) tables, ~41 MiB


@pytest.fixture
def fake_verify(monkeypatch):
    """``plan verify`` with the harness replaced: two runs with known numbers."""
    pytest.importorskip("torch")
    import harness.calibrate
    import harness.verify

    cfg = {"dp": 2, "tp": 1, "pp": 2, "vp": 1, "zero_stage": 1, "micro_batch_size": 4,
           "num_microbatches": 1, "recompute": "none", "sequence_parallel": False,
           "schedule": "1f1b"}

    def run(loss2):
        return {"config": cfg, "ok": True,
                "predicted": {"step_time_s": 0.05, "comm_bytes": {"dp": 1409024.0, "tp": 0.0,
                                                                   "pp": 65536.0},
                              "peak_memory_bytes": 3708416.0},
                "measured": {"step_time_s": 0.051, "comm_bytes": {"dp": 1409536, "tp": 0,
                                                                  "pp": 65536},
                             "peak_memory_bytes": 3866716, "losses": [loss2, 5.2]}}

    state = {"loss2": 5.548226356506348}
    monkeypatch.setattr(harness.calibrate, "calibrate", lambda *a, **k: None)
    monkeypatch.setattr(harness.calibrate, "local_cluster", lambda *a, **k: None)
    monkeypatch.setattr(harness.verify, "select_configs", lambda *a, **k: [cfg, cfg])
    monkeypatch.setattr(harness.verify, "verify", lambda *a, **k: {
        "spearman": 1.0, "runs": [run(5.548226356506348), run(state["loss2"])]})
    return state


def test_verify_table_fits_a_narrow_terminal_and_checks_the_loss(fake_verify):
    r = runner.invoke(app, ["verify", "--nproc", "4"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "…" not in out  # folded, never cut
    assert max(len(x) for x in out.splitlines()) <= 80
    assert "loss equality" in out and ": equal" in out
    fake_verify["loss2"] = 5.9
    r = runner.invoke(app, ["verify", "--nproc", "4"], env={"COLUMNS": "80"})
    assert "DIFFERENT" in r.stdout


def test_loss_check_numbers():
    pytest.importorskip("torch")
    from cli.verify import loss_check

    cfg = {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0, "micro_batch_size": 1,
           "num_microbatches": 1}
    runs = [{"ok": True, "config": cfg, "measured": {"losses": [v]}} for v in (2.0, 2.001)]
    worst, line = loss_check(runs)
    assert worst == pytest.approx(0.0005) and "equal" in line
    assert loss_check(runs[:1])[0] is None


def test_tier_validator_message_names_the_tier(tmp_path):
    text = find_preset("cluster", "dgx-a100-80g").read_text()
    f = tmp_path / "c.toml"
    f.write_text(text.replace("bw_gbit_per_s = 200", "bw_gbit_per_s = 200\nbw_gbyte_per_s = 25"))
    line = one_line_error(["--cluster", str(f)], "tier 1 (InfiniBand 'hdr-ib'): give exactly one")
    assert "tiers.1" not in line


def test_verify_explains_the_zero_bubble_memory_row():
    pytest.importorskip("torch")
    from cli.verify import memory_notes

    def run(schedule, m, pred, meas):
        return {"ok": True, "config": {"dp": 1, "tp": 2, "pp": 2, "zero_stage": 0,
                                        "micro_batch_size": 2, "num_microbatches": m,
                                        "schedule": schedule},
                "predicted": {"peak_memory_bytes": pred}, "measured": {"peak_memory_bytes": meas}}

    # measured with plan verify --nproc 4 (tiny GPT, 2 cores): zb 1.71 / 2.66 MB, 1f1b 1.60 / 1.71
    notes = memory_notes([run("zb", 4, 1709312.0, 2658496), run("1f1b", 4, 1596416.0, 1706728)])
    assert len(notes) == 1 and "-35.7%" in notes[0] and "retain_graph=True" in notes[0]
    assert memory_notes([run("1f1b", 4, 1.0e6, 2.0e6)])[0].endswith("not explained by the "
                                                                     "memory model")
