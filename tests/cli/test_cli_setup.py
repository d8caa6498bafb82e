"""The training setup on the command line (--framework, single switch flags,
--training FILE), defaults that fit the model, the assumed-setup header, API parity of
evaluate_config, the MoE warning, the BLAS thread limit, and the output items (exposed terms,
ZeRO-3 note, nsga2 Pareto table, GPUs-used column)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

import search
from cli.main import app, term_note
from perfmodel.core.errors import SpecError
from perfmodel.spec.frameworks import load_framework
from perfmodel.spec.specs import load_model
from search import api
from validation.validate import VALIDATION_DIR, case_from_row, predict_case

runner = CliRunner()


def run(args):
    """The command with the what-if stack unless the test names a framework or a subcommand
    (these tests are about the command line, not one release)."""
    args = list(args)
    if args[:1] and args[0].startswith("--") and not {"--framework", "--list", "--help",
                                                       "--training"} & set(args):
        args += ["--framework", "ideal"]
    return runner.invoke(app, args)


def best(args) -> dict:
    r = run([*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# ------------------------------------------------------------------ Calculon's 8 validation rows
# Calculon (Isaacs et al., SC23) validates against the 8 Megatron runs of Korthikanti et al.
# 2022, Tables 3 and 5: 22B / 175B / 530B / 1T, each with full recompute and with sequence
# parallelism + selective recompute (rows R0045-R0052 of training_runs_dev.csv).
CALCULON_ROWS = [f"R00{i}" for i in range(45, 53)]
PRESET = {"GPT-22B": "megatron-22b", "GPT-175B": "megatron-175b", "GPT-530B": "megatron-530b",
          "GPT-1T": "megatron-1t"}


def _calculon_cases():
    df = pd.read_csv(VALIDATION_DIR / "training_runs_dev.csv")
    rows = df[df["row_id"].isin(CALCULON_ROWS)]
    assert len(rows) == 8
    return [(r["row_id"], r, case_from_row(r)) for _, r in rows.iterrows()]


def test_calculon_rows_cli_with_framework_equals_api():
    """Through the CLI alone (presets + --framework megatron-2022 + the published parallel
    layout) each of the 8 rows gives the API's prediction (validate.py's mapping)."""
    for rid, r, case in _calculon_cases():
        c = case.config
        args = ["--model", PRESET[case.model.name], "--cluster", "dgx-a100-80g",
                "--gpus", str(int(r["num_gpus"])), "--framework", "megatron-2022",
                "--global-batch", str(case.training.global_batch_size),
                "--precision", case.training.precision,  # the runs' fp16 (16-bit gradients)
                "--tp", str(c.tp), "--pp", str(c.pp), "--vp", str(c.vp),
                "--micro-batch", str(c.micro_batch_size), "--recompute", c.recompute,
                "--sequence-parallel" if c.sequence_parallel else "--no-sequence-parallel"]
        doc = best(args)
        assert doc["best"]["config"]["dp"] == c.dp and doc["best"]["config"]["zero_stage"] == 0
        assert doc["best"]["step_time_s"] == pytest.approx(predict_case(case), rel=1e-9), rid


def test_megatron_2022_preset_matches_validate_era_switches():
    fw = load_framework("megatron-2022")
    for rid, _, case in _calculon_cases():
        for k, v in fw.training_switches(case.training.precision).items():
            assert getattr(case.training, k) == v, (rid, k)
        assert case.config.zero_stage in fw.zero_stages
        assert case.config.recompute in fw.recompute


def test_korthikanti_presets_match_the_rows_models():
    for _, _, case in _calculon_cases():
        preset = load_model(PRESET[case.model.name])
        for k in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                  "vocab_size", "max_seq_len", "position_embedding", "tied_embeddings"):
            assert getattr(preset, k) == getattr(case.model, k), (case.model.name, k)


# ------------------------------------------------------------------ single switches, --training
@pytest.fixture
def fake(monkeypatch):
    from tests.search.test_space import fake_evaluate

    monkeypatch.setattr(api, "_default_evaluator", lambda: fake_evaluate)


def test_single_flags_override_the_framework(fake):
    doc = best(["--framework", "nemo-24.09", "--no-flash-attention", "--no-overlap-tp-comm"])
    sw = doc["setup"]["training_switches"]
    assert sw["flash_attention"] is False and sw["overlap_tp_comm"] is False
    assert sw["overlap_grad_reduce"] is True and sw["overlap_p2p_comm"] is True  # framework's
    doc = best(["--framework", "megatron-2022", "--overlap-grad-reduce", "--overlap-p2p-comm",
                "--zero3-gather", "tensor"])
    sw = doc["setup"]["training_switches"]
    assert sw["overlap_grad_reduce"] and sw["overlap_p2p_comm"] and not sw["flash_attention"]
    assert sw["zero3_gather"] == "tensor"
    assert doc["setup"]["assumed"]["flash_attention"] == "framework megatron-2022"
    assert "overlap_grad_reduce" not in doc["setup"]["assumed"]  # given on the command line


def test_switch_flags_change_the_prediction():
    args = ["--model", "gpt3-1.3b", "--gpus", "16", "--dp", "16", "--tp", "1", "--pp", "1",
            "--micro-batch", "4", "--zero", "0"]
    on = best([*args, "--overlap-grad-reduce"])["best"]
    off = best([*args, "--no-overlap-grad-reduce"])["best"]
    assert off["time_s"]["dp_comm"] > on["time_s"]["dp_comm"]
    assert off["step_time_s"] > on["step_time_s"]


def test_training_file(tmp_path, fake):
    f = tmp_path / "t.toml"
    f.write_text('global_batch_size = 512\nseq_len = 4096\nprecision = "fp16"\n'
                 'flash_attention = false\noverlap_p2p_comm = false\n')
    doc = best(["--training", str(f)])
    s = doc["setup"]
    assert (s["global_batch_size"], s["seq_len"], s["precision"]) == (512, 4096, "fp16")
    assert not s["training_switches"]["flash_attention"]
    assert s["assumed"]["seq_len"] == f"training file {f}"
    # single options win over the file
    doc = best(["--training", str(f), "--seq-len", "2048", "--flash-attention"])
    assert doc["setup"]["seq_len"] == 2048 and doc["setup"]["training_switches"][
        "flash_attention"]


def test_training_file_errors_are_one_line(tmp_path, fake):
    f = tmp_path / "t.toml"
    f.write_text("global_batch = 512\n")
    r = run(["--training", str(f)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "did you mean 'global_batch_size'?" in r.stderr
    r = run(["--training", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "does not exist" in r.stderr


# ------------------------------------------------------------------ defaults that fit the model
def test_llama_preset_gets_its_context_not_gpt3_batch(fake):
    s = best(["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "64"])["setup"]
    assert s["seq_len"] == 8192
    assert s["global_batch_size"] == round(api.DEFAULT_TOKENS_PER_STEP / 8192) == 384
    assert "context length 8192" in s["assumed"]["seq_len"]


def test_published_training_setup_of_a_preset(fake):
    s = best(["--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--gpus", "64"])["setup"]
    assert (s["global_batch_size"], s["seq_len"]) == (1024, 4096)  # 4M tokens of 4096
    assert "published training setup" in s["assumed"]["global_batch_size"]
    s = best(["--model", "megatron-22b", "--gpus", "8"])["setup"]
    assert s["global_batch_size"] == 4  # Korthikanti et al. 2022 Table 3
    assert load_model("megatron-530b").published_training.global_batch_size == 2520


def test_default_gpt3_is_unchanged(fake):
    s = best([])["setup"]
    assert (s["global_batch_size"], s["seq_len"]) == (1536, 2048)


def test_hf_config_context_capped(tmp_path, fake):
    cfg = {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 32000,
           "max_position_embeddings": 131072, "hidden_act": "silu", "rms_norm_eps": 1e-5}
    d = tmp_path / "tiny-128k"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    s = best(["--model", str(d / "config.json"), "--gpus", "8"])["setup"]
    assert s["seq_len"] == api.DEFAULT_SEQ_LEN_CAP == 8192
    assert s["global_batch_size"] == 384
    assert "capped at 8192" in s["assumed"]["seq_len"]
    cfg["max_position_embeddings"] = 4096
    (d / "config.json").write_text(json.dumps(cfg))
    s = best(["--model", str(d / "config.json"), "--gpus", "8"])["setup"]
    assert (s["seq_len"], s["global_batch_size"]) == (4096, 768)


def test_header_says_what_was_defaulted_and_from_where(fake):
    r = run(["--framework", "megatron-2022"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("assumed setup:"))
    assert "framework megatron-2022" in lines[i] and "flash attention off" in lines[i]
    block = "\n".join(lines[i:i + 6])
    assert "sequence 2048, global batch 1536: gpt3-175b's published training setup" in block
    assert "precision bf16, optimizer adam, " in block and "attention kernel cudnn" in block
    assert ": tool default" in block
    assert "flash attention off" in block and ": framework megatron-2022" in block
    r = run(["--global-batch", "512", "--seq-len", "1024"])
    assert "global batch 512" not in r.stdout.split("best configuration")[0].split(
        "assumed setup")[1]  # given, so not listed as assumed


# ------------------------------------------------------------------ API parity
def test_evaluate_config_accepts_every_plan_option(fake):
    import inspect

    plan_opts = {k for k, p in inspect.signature(search.plan).parameters.items()
                 if p.kind is p.KEYWORD_ONLY}
    r = search.evaluate_config("gpt3-175b", "dgx-a100-80g", tp=8, pp=8, micro_batch_size=1,
                               uneven_layers=True, objective="cost", seed=3, top=2,
                               framework="nemo-24.09", flash_attention=False, kernels="eager")
    assert r.strategy == "single" and r.setup["framework"] == "nemo-24.09"
    assert not r.setup["training_switches"]["flash_attention"]
    assert {"uneven_layers", "framework", "flash_attention", "overlap_tp_comm"} <= plan_opts
    with pytest.raises(SpecError, match="did you mean 'uneven_layers'"):
        search.evaluate_config("gpt3-175b", "dgx-a100-80g", uneven_layer=True)


def test_readme_evaluate_config_example_returns_a_result():
    r = search.evaluate_config("gpt3-175b", "dgx-a100-80g", dp=16, tp=8, pp=8,
                               micro_batch_size=1, zero_stage=1, framework="ideal")
    assert r.fits_any and len(r.best) == 1 and r.best["step_time_s"].iloc[0] > 0
    # a configuration that does not fit is still shown, with fits False
    r = search.evaluate_config("gpt3-175b", "dgx-a100-80g", dp=512, tp=2, pp=1,
                               micro_batch_size=1, zero_stage=0, framework="ideal")
    assert not r.fits_any and len(r.best) == 1 and not bool(r.best["fits"].iloc[0])


# ------------------------------------------------------------------ MoE warning
def test_moe_model_warns_in_one_line(tmp_path, fake):
    text = (VALIDATION_DIR.parent / "models" / "gpt3-1.3b.toml").read_text()
    text = text.replace('name = "gpt3-1.3b"', 'name = "moe-test"\nnum_experts = 8\nmoe_top_k = 2')
    text = text.split("[published_training]")[0]
    f = tmp_path / "moe.toml"
    f.write_text(text)
    r = run(["--model", str(f), "--gpus", "64"])
    assert r.exit_code == 0, r.output
    warns = [x for x in r.stderr.splitlines() if x.startswith("plan: warning:")]
    # expert parallelism is modelled: ep is searched, so no dense-MoE warning
    assert not any("expert parallelism is not modelled" in w for w in warns), warns
    r = run([])  # a dense model: no warning
    assert "mixture-of-experts" not in r.stderr


# ------------------------------------------------------------------ thread limit
def test_search_threads_limits_blas_unless_the_user_set_it(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    import numpy  # noqa: F401  (loads the BLAS)

    with api.search_threads():
        inside = [p["num_threads"] for p in threadpoolctl.threadpool_info()]
    assert all(n == 1 for n in inside)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert api._user_set_threads()
    with threadpoolctl.threadpool_limits(limits=2), api.search_threads():
        inside = [p["num_threads"] for p in threadpoolctl.threadpool_info()]
    assert all(n == 2 for n in inside) or not inside


# ------------------------------------------------------------------ output items
def test_breakdown_says_exposed_and_explains_zero3(fake):
    r = run(["--dp", "16", "--tp", "8", "--pp", "8", "--vp", "1", "--cp", "1", "--zero", "1",
             "--micro-batch", "1", "--recompute", "selective", "--sequence-parallel",
             "--schedule", "1f1b"])
    assert r.exit_code == 0, r.output
    assert "the part overlap leaves exposed" in r.stdout
    assert "ZeRO-1: no parameter gathers" in r.stdout
    row = {"config": {"dp": 4, "tp": 1, "pp": 1, "cp": 1, "zero_stage": 3}}
    sw = {"training_switches": {"overlap_grad_reduce": True}}
    assert term_note("zero3_comm", 0.0, row, sw).startswith("hidden")
    assert term_note("zero3_comm", 1e-3, row, sw).startswith("exposed")
    assert term_note("zero3_comm", 1e-3, row, {"training_switches": {}}) == (
        "exposed: gathers not overlapped")
    assert term_note("dp_comm", 1e-3, row, {"training_switches": {}}).startswith("exposed")
    assert term_note("pp_comm", 0.0, row, sw) == "pp = 1: none"


def test_nsga2_prints_a_pareto_table(fake):
    r = run(["--strategy", "nsga2", "--gpus", "64"])
    assert r.exit_code == 0, r.output
    assert "Pareto front:" in r.stdout
    part = r.stdout.split("Pareto front:")[1]
    assert "GPUs" in part and "peak mem" in part


def test_allow_idle_gpus_shows_gpus_used(fake):
    r = run(["--allow-idle-gpus", "--gpus", "64", "--model", "gpt3-1.3b", "--top", "5"])
    assert r.exit_code == 0, r.output
    header = next(x for x in r.stdout.splitlines() if "why below #1" in x)
    assert "GPUs" in header
    r = run(["--gpus", "64", "--model", "gpt3-1.3b", "--top", "5"])
    header = next(x for x in r.stdout.splitlines() if "why below #1" in x)
    assert "GPUs" not in header
