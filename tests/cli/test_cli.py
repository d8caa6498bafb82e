"""The plan command line, through typer's CliRunner: output, --json, --csv, --list, and every
bad-input case (one line on stderr, exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import search.api
from cli.main import SUBCOMMANDS, app
from tests.search.test_space import fake_evaluate

runner = CliRunner()

FULL = ["--dp", "16", "--tp", "8", "--pp", "8", "--vp", "1", "--cp", "1", "--zero", "1",
        "--micro-batch", "1", "--recompute", "selective", "--sequence-parallel",
        "--schedule", "1f1b"]


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    monkeypatch.setattr(search.api, "_default_evaluator", lambda: fake_evaluate)


def run(args):
    """The command with the what-if stack unless the test names a framework or a subcommand
    (these tests are about the command line, not one release)."""
    args = list(args)
    if args[:1] and args[0].startswith("--") and not {"--framework", "--list", "--help",
                                                       "--training"} & set(args):
        args += ["--framework", "ideal"]
    return runner.invoke(app, args)


def one_line_error(r, *needles):
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("plan: error: ") and "Traceback" not in r.output
    for n in needles:
        assert n in lines[0], lines[0]


def test_no_arguments_runs_the_default():
    r = run(["--tp", "8", "--cp", "1"])  # pinned a little to keep the test fast
    assert r.exit_code == 0, r.output
    assert "gpt3-175b on 1024 x A100-SXM4-80GB" in r.stdout
    assert "best configuration" in r.stdout and "top 10 by time" in r.stdout
    assert "searched" in r.stdout and "fit in memory" in r.stdout


@pytest.mark.slow
def test_literally_no_arguments():
    r = run([])
    assert r.exit_code == 0, r.output
    assert "best configuration" in r.stdout


def test_json_document():
    r = run(["--tp", "8", "--pp", "8", "--cp", "1", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    best = doc["best"]
    assert set(best["config"]) >= {"dp", "tp", "pp", "vp", "cp", "zero_stage",
                                   "micro_batch_size", "num_microbatches", "recompute",
                                   "sequence_parallel", "schedule"}
    assert set(best["memory_bytes"]) >= {"weights", "gradients", "optimizer", "activations",
                                         "other", "peak"}
    assert set(best["comm_bytes_per_gpu"]) >= {"dp", "tp", "pp", "cp"}
    assert {"step_time_s", "tokens_per_s", "mfu", "time_s"} <= set(best)
    assert len(doc["top"]) == 3 and doc["top"][0] == best
    assert set(doc["search"]) >= {"strategy", "evaluated", "feasible", "seconds"}


def test_all_options_fixed_evaluates_one_configuration():
    r = run(FULL)
    assert r.exit_code == 0, r.output
    assert "configuration: dp=16 tp=8 pp=8" in r.stdout
    assert "step time" in r.stdout and "memory per GPU" in r.stdout
    assert "communication" in r.stdout and "bytes per GPU per step" in r.stdout
    assert "top " not in r.stdout


def test_training_options_reach_the_model():
    r = run(FULL[:2] + ["--tp", "8", "--pp", "8", "--cp", "1", "--vp", "1", "--zero", "1",
                        "--micro-batch", "2", "--recompute", "full", "--no-sequence-parallel",
                        "--schedule", "gpipe", "--global-batch", "512", "--seq-len", "4096",
                        "--precision", "fp16", "--optimizer", "sgd", "--json"])
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)["best"]["config"]
    assert c["num_microbatches"] == 512 // (16 * 2)
    assert (c["recompute"], c["schedule"], c["sequence_parallel"]) == ("full", "gpipe", False)
    assert json.loads(r.stdout)["setup"]["precision"] == "fp16"


def test_csv(tmp_path):
    out = tmp_path / "top.csv"
    r = run(["--tp", "8", "--pp", "8", "--cp", "1", "--top", "4", "--csv", str(out)])
    assert r.exit_code == 0, r.output
    lines = out.read_text().splitlines()
    assert len(lines) == 5 and "step_time_s" in lines[0]


@pytest.mark.parametrize("strategy", ["ga", pytest.param("nsga2", marks=pytest.mark.slow)])
def test_other_strategies(strategy):
    r = run(["--tp", "8", "--cp", "1", "--strategy", strategy, "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["search"]["strategy"] == strategy


def test_list_presets():
    r = run(["--list"])
    assert r.exit_code == 0
    for name in ("gpt3-175b", "llama3.1-405b", "dgx-h100", "gb200-nvl72", "a100-sxm4-80gb"):
        assert name in r.stdout


# ---- bad input ----------------------------------------------------------------------------------
def _cluster_file(tmp_path, extra="", bw="bw_gbyte_per_s = 300"):
    p = tmp_path / "c.toml"
    p.write_text(f'''name = "mine"
gpu = "a100-sxm4-80gb"
gpus_per_node = 8
num_nodes = 2
{extra}
[[tiers]]
name = "nvlink"
kind = "nvlink"
domain_size = 8
{bw}
[[tiers]]
name = "ib"
kind = "infiniband"
bw_gbit_per_s = 200
''')
    return str(p)


def test_typo_key_in_cluster_file(tmp_path):
    r = run(["--cluster", _cluster_file(tmp_path, extra="gpus_per_nod = 8"), *FULL])
    one_line_error(r, "unknown key 'gpus_per_nod'")


def test_negative_bandwidth(tmp_path):
    r = run(["--cluster", _cluster_file(tmp_path, bw="bw_gbyte_per_s = -300"), *FULL])
    one_line_error(r, "bw_gbyte_per_s", "-300", "greater than 0")


def test_typo_key_in_model_file(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('name = "m"\nnum_layers = 4\nhidden_size = 256\nnum_attention_heads = 4\n'
                 'ffn_hidden_size = 1024\nvocab_size = 1000\nhiden_size = 3\n')
    one_line_error(run(["--model", str(p)]), "unknown key 'hiden_size'")


def test_tp_not_dividing_heads():
    one_line_error(run(["--tp", "5"]), "tp (5) must divide num_attention_heads (96)")


def test_tp_not_dividing_heads_single_config():
    args = list(FULL)
    args[args.index("--tp") + 1] = "5"
    one_line_error(run(args), "tp (5) must divide num_attention_heads (96)")


def test_product_not_gpu_count():
    args = list(FULL)
    args[args.index("--dp") + 1] = "8"
    one_line_error(run(args), "dp*tp*pp*cp (8*8*8*1=512) must equal the cluster's GPU count "
                              "(1024)")


def test_product_not_gpu_count_in_search():
    one_line_error(run(["--dp", "8", "--tp", "8", "--pp", "8", "--cp", "1"]),
                   "must equal the cluster's GPU count (1024)")


def test_unknown_presets_name_the_closest():
    one_line_error(run(["--model", "gpt3-175"]), "unknown model preset 'gpt3-175'",
                   "closest: gpt3-175b")
    one_line_error(run(["--cluster", "dgx-h10"]), "unknown cluster preset 'dgx-h10'",
                   "dgx-h100")


def test_gpus_not_multiple_of_node():
    one_line_error(run(["--gpus", "1001"]), "gpus (1001) must be a multiple of gpus_per_node")


def test_nothing_fits():
    one_line_error(run(["--gpus", "8", "--tp", "8", "--cp", "1"]), "nothing fits",
                   "smallest footprint")


def test_bad_choice_exits_2():
    r = run(["--precision", "fp7"])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_subcommand_dispatch():
    """`plan NAME ...` runs a subcommand registered on the app; `plan [OPTIONS]` the planner."""

    @app.command("hello")
    def hello(spec: str) -> None:
        print(f"hello {spec}")

    try:
        r = run(["hello", "x.toml"])
        assert r.exit_code == 0 and r.stdout.strip() == "hello x.toml"
        r = run(FULL + ["--json"])
        assert r.exit_code == 0 and json.loads(r.stdout)["search"]["strategy"] == "single"
    finally:
        app.registered_commands.pop()


def test_realtime_subcommand_is_registered():
    assert SUBCOMMANDS["realtime"] == "cli.realtime:realtime"
    r = run(["--help"])
    assert r.exit_code == 0 and "realtime" in r.stdout.split("Commands:")[1]
    r = run(["realtime", "--help"])
    assert r.exit_code == 0


def test_planner_path_imports_no_heavy_libraries():
    """``plan [OPTIONS]`` imports the subcommands' modules (sweep, validation's reports) and the
    libraries only they use (dask, scipy.stats, matplotlib, pymoo) only when they are invoked."""
    code = ("import sys, cli.main; heavy = ('dask', 'distributed', 'matplotlib', 'pymoo', "
            "'scipy.stats', 'scipy.interpolate', 'sweep.cli', 'cli.realtime'); "
            "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
