"""A sweep's rows equal the in-process searches of its scenarios, whichever executor ran them:
a Dask scheduler and worker started as processes on 127.0.0.1 (``plan sweep --scheduler``), a
LocalCluster, and this process; a stopped sweep resumes; failures are rows."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from distributed import Client
from typer.testing import CliRunner

from cli.main import app
from perfmodel.spec.specs import SpecError
from search import plan
from sweep import run_figures, sweep
from sweep.run import batch_size
from sweep.spec import load_sweep_spec, scenario_cluster
from sweep.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

#: 20 small scenarios: gpt3-125m on 1-16 H100s, two batches, 2 GiB (nothing fits) or 80 GiB HBM.
SPEC_TOML = """\
models = ["gpt3-125m"]
clusters = ["dgx-h100"]
gpus = [1, 2, 4, 8, 16]
global_batch = [16, 32]
seq_len = [1024]
train_tokens = 1e9

[overrides]
"gpu.hbm_gib" = [2, 80]
"""
COMPARED = ["dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "num_microbatches",
            "recompute", "sequence_parallel", "schedule", "step_time_s", "tokens_per_s", "mfu",
            "peak_memory_bytes"]


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "spec.toml"
    path.write_text(SPEC_TOML)
    return path


@pytest.fixture(scope="module")
def expected(spec_path):
    """Each scenario's best configuration from search.plan in this process, with its run's
    ``train_days`` (None: nothing fits)."""
    out = {}
    for s in load_sweep_spec(spec_path).scenarios():
        r = plan(s.model, scenario_cluster(s.cluster, s.overrides), gpus=s.gpus,
                 global_batch_size=s.global_batch, seq_len=s.seq_len,
                 train_tokens=s.train_tokens)
        out[s.id] = ({**r.best.iloc[0].to_dict(), "train_days": r.train.row(0)["days"]}
                     if r.fits_any else None)
    assert len(out) == 20 and any(v is None for v in out.values())
    assert sum(v is not None for v in out.values()) >= 8
    return out


def _check_rows(table: pd.DataFrame, expected: dict) -> None:
    assert sorted(table["scenario_id"]) == sorted(expected) and table["scenario_id"].is_unique
    assert list(table["scenario_id"]) == sorted(table["scenario_id"])
    for row in table.to_dict("records"):
        best = expected[row["scenario_id"]]
        if best is None:
            assert row["status"] == "nothing fits" and "nothing fits" in row["reason"]
            assert pd.isna(row["step_time_s"])
            continue
        assert row["status"] == "ok" and row["reason"] == ""
        assert {k: row[k] for k in COMPARED} == {k: best[k] for k in COMPARED}
        assert row["train_days"] == best["train_days"]  # the plan's run terms


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def scheduler_address():
    """A ``dask scheduler`` and one ``dask worker`` (1 process, 1 thread) on 127.0.0.1."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              **quiet)]
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
             "--nworkers", "1", "--host", "127.0.0.1", "--no-dashboard"], **quiet))
        deadline = time.monotonic() + 90
        while True:
            try:
                with Client(address, timeout="5s") as c:
                    c.wait_for_workers(1, timeout=max(1.0, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield address
    finally:
        for p in reversed(procs):
            _stop(p)


@pytest.mark.slow
def test_cli_sweep_on_a_running_scheduler_equals_in_process_plans(
        scheduler_address, spec_path, expected, tmp_path):
    out = tmp_path / "results.parquet"
    r = runner.invoke(app, ["sweep", str(spec_path), "--out", str(out), "--scheduler",
                            scheduler_address])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "20 scenarios" in r.stdout and "nothing fits" in r.stdout
    table = pd.read_parquet(out)
    _check_rows(table, expected)
    some = load_sweep_spec({**load_sweep_spec(spec_path).model_dump(), "gpus": [8]})
    with Client(scheduler_address) as c:  # the Python API on the same cluster: the same rows
        api = sweep(some, client=c)
    assert len(api) == 4
    pd.testing.assert_frame_equal(api, table[table["gpus"] == 8].reset_index(drop=True),
                                  check_like=False)


@pytest.mark.slow
def test_local_cluster_and_this_process_give_the_same_rows(spec_path, expected):
    local = sweep(spec_path, workers=1)
    _check_rows(local, expected)
    some = load_sweep_spec({**load_sweep_spec(spec_path).model_dump(), "gpus": [1, 16]})
    pd.testing.assert_frame_equal(sweep(some, workers=0),
                                  local[local["gpus"].isin([1, 16])].reset_index(drop=True))


@pytest.mark.slow
def test_a_stopped_sweep_resumes_from_its_parts(spec_path, expected, tmp_path):
    out = tmp_path / "r.parquet"
    spec = load_sweep_spec(spec_path)
    first = load_sweep_spec({**spec.model_dump(), "gpus": [1, 2]})  # 8 of the 20 scenarios
    done = sweep(first, out=out, workers=0)
    assert len(done) == 8 and out.exists()
    # a run stopped after a flush: its parts, without the consolidated file
    store = ResultStore(out)
    out.rename(tmp_path / "kept.parquet")
    store.add(pd.read_parquet(tmp_path / "kept.parquet").to_dict("records"))
    store.flush()
    assert not out.exists() and len(list(Path(f"{out}.parts").glob("*.parquet"))) == 1
    ran = []
    full = _sweep_counting(spec, out, ran)
    assert ran == [12]  # only the 12 scenarios not yet in the parts
    _check_rows(full, expected)
    assert not Path(f"{out}.parts").exists()
    pd.testing.assert_frame_equal(pd.read_parquet(out), full)
    assert len(sweep(spec, out=out, workers=0)) == 20  # nothing left to run


def _sweep_counting(spec, out, ran):
    """``sweep`` in this process, recording how many scenarios it had to run."""
    before = len(ResultStore(out).previous())
    table = sweep(spec, out=out, workers=0)
    ran.append(len(table) - before)
    return table


def test_a_scenario_that_cannot_run_is_a_row():
    table = sweep({"models": ["gpt3-125m"], "clusters": ["dgx-h100"], "gpus": [12],
                   "global_batch": [16], "seq_len": [1024]}, workers=0)
    row = table.iloc[0]
    assert row["status"] == "error" and "multiple of gpus_per_node (8)" in row["reason"]
    assert pd.isna(row["dp"]) and pd.isna(row["mfu"])


def test_top_k_rows_rank_the_configurations():
    table = sweep({"models": ["gpt3-125m"], "clusters": ["dgx-h100"], "gpus": [8],
                   "global_batch": [16], "seq_len": [1024], "top": 3}, workers=0)
    assert list(table["rank"]) == [1, 2, 3]
    assert table["step_time_s"].is_monotonic_increasing


def test_run_figures_are_the_plans():
    """A sweep row's run figures are the ones `plan --train-tokens` reports for the same
    scenario (one definition: perfmodel.run.train_run, with interruptions and checkpoints)."""
    table = sweep({"models": ["gpt3-125m"], "clusters": ["dgx-h100"], "gpus": [8],
                   "global_batch": [16], "seq_len": [1024], "top": 2, "train_tokens": 1e10},
                  workers=0)
    r = plan("gpt3-125m", "dgx-h100", gpus=8, global_batch_size=16, seq_len=1024, top=2,
             train_tokens=1e10)
    for i, row in enumerate(table.to_dict("records")):
        t = r.train.row(i)
        assert row["step_time_s"] == r.rows[i]["step_time_s"]
        assert row["train_days"] == t["days"] and row["gpu_hours"] == t["gpu_hours"]
        assert row["failure_free_days"] == t["useful_s"] / 86_400 and row["goodput"] == t["goodput"]
        assert row["train_days"] > row["failure_free_days"]  # interruptions and checkpoints
        assert run_figures(r.train, i)["train_days"] == t["days"]
    res = runner.invoke(app, ["--model", "gpt3-125m", "--cluster", "dgx-h100", "--gpus", "8",
                              "--global-batch", "16", "--seq-len", "1024", "--train-tokens",
                              "1e10", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["train"]["days"] == table["train_days"].iloc[0]


def test_batch_size_aims_at_seconds_and_spreads_work():
    assert batch_size(0.1, 10_000, 4) == 30      # 3 s / 0.1 s
    assert batch_size(0.1, 40, 4) == 5           # at least two tasks per worker
    assert batch_size(60.0, 10_000, 4) == 1      # a long scenario is a task of its own


def test_unreadable_output_is_a_spec_error(tmp_path):
    out = tmp_path / "r.parquet"
    out.write_text("not parquet")
    with pytest.raises(SpecError, match="not a readable Parquet file"):
        sweep({"models": ["gpt3-125m"], "clusters": ["dgx-h100"], "gpus": [8],
               "global_batch": [16], "seq_len": [1024]}, out=out, workers=0)


def test_an_output_folder_that_does_not_exist_is_refused_before_work(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        sweep({"models": ["gpt3-125m"], "clusters": ["dgx-h100"], "gpus": [8],
               "global_batch": [16], "seq_len": [1024]}, out=tmp_path / "no" / "r.parquet",
              workers=0)
