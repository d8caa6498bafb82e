"""Golden outputs of the ``plan`` CLI: record them once, compare two recordings byte for byte.

A move of modules (or any change that should not change a number) is checked by recording
before and after and comparing::

    python benchmarks/golden_outputs.py record OUT_DIR
    python benchmarks/golden_outputs.py compare DIR_A DIR_B

``record`` runs every case in one Python process through :class:`typer.testing.CliRunner`
and writes, per case, ``OUT_DIR/<name>.json`` (a JSON document: the exit code, stderr and the
parsed ``--json`` document, keys sorted) or ``OUT_DIR/<name>.txt`` (exit code, stderr and the
plain-text report). Launch files written by ``--emit-dir`` go to ``OUT_DIR/emit/<name>/``.
Wall-clock fields (the search's ``seconds``), the ``in X.XX s`` of the text report and the
temporary paths are normalised away. ``compare`` exits 0 and prints ``identical: N files``
when every file matches; otherwise it lists the differing files with a short unified diff of
the first few and exits 1.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli.main import app

SPECS = ROOT / "hardware_specs"
VALIDATION = SPECS / "validation"

#: Keys holding wall-clock time, dropped wherever they appear under ``search``/top level.
TIMING_KEYS = ("seconds", "wall_s", "elapsed_s", "search_seconds")

#: The ``plan --json`` cases: name -> arguments (a few of them are nonzero exits on purpose).
PIN_8B = ["--tp", "2", "--pp", "1", "--dp", "4", "--cp", "1", "--zero", "1",
          "--micro-batch", "1", "--recompute", "selective", "--sequence-parallel"]
PIN_70B = ["--tp", "8", "--pp", "4", "--vp", "2", "--dp", "4", "--cp", "1", "--zero", "1",
           "--micro-batch", "1", "--recompute", "none", "--schedule", "interleaved",
           "--sequence-parallel"]

JSON_CASES: dict[str, list[str]] = {}
TEXT_CASES: dict[str, list[str]] = {}
EMIT_CASES: dict[str, list[str]] = {}
OTHER_CASES: dict[str, list[str]] = {}


def _cases() -> None:
    """Fill the case tables (a function so the lists read as one recipe)."""
    j = JSON_CASES
    # dense
    j["gpt3_175b_default"] = []
    j["llama31_8b_h100_64"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "64"]
    j["llama31_8b_pinned"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                              "--global-batch", "64", "--seq-len", "8192", *PIN_8B]
    j["llama31_70b_h100_256"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100",
                                 "--gpus", "256", "--global-batch", "512"]
    j["llama31_70b_pinned_fp8"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100",
                                   "--gpus", "128", "--global-batch", "256", "--seq-len", "8192",
                                   "--precision", "fp8", *PIN_70B]
    j["llama31_405b_h100_2048"] = ["--model", "llama3.1-405b", "--cluster", "dgx-h100",
                                   "--gpus", "2048", "--global-batch", "2048"]
    j["llama2_7b_a100_zero3"] = ["--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                                 "--gpus", "32", "--zero", "3", "--global-batch", "256"]
    j["llama2_7b_a100_40g_full"] = ["--model", "llama2-7b", "--cluster", "dgx-a100-40g",
                                    "--gpus", "16", "--recompute", "full"]
    j["llama2_7b_eager"] = ["--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--gpus", "16",
                            "--kernels", "eager"]
    j["gpt3_13b_ethernet"] = ["--model", "gpt3-13b", "--cluster", "ethernet-a100", "--gpus", "64"]
    j["gpt3_175b_objective_memory"] = ["--objective", "memory"]
    j["gpt3_175b_objective_cost"] = ["--objective", "cost", "--top", "3"]
    j["llama31_8b_b200_fp8"] = ["--model", "llama3.1-8b", "--cluster", "dgx-b200", "--gpus", "64",
                                "--precision", "fp8"]
    j["llama31_70b_b200_mxfp8"] = ["--model", "llama3.1-70b", "--cluster", "dgx-b200",
                                   "--gpus", "128", "--precision", "mxfp8"]
    j["llama31_70b_gb200_nvfp4"] = ["--model", "llama3.1-70b", "--cluster", "gb200-nvl72",
                                    "--gpus", "144", "--precision", "nvfp4"]
    j["llama31_8b_h200_fp16_zero2"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h200",
                                       "--gpus", "16", "--precision", "fp16", "--zero", "2"]
    j["gpt3_1_3b_v100_fp32"] = ["--model", "gpt3-1.3b", "--cluster", "dgx-v100", "--gpus", "16",
                                "--precision", "fp32"]
    j["llama31_8b_mi300x"] = ["--model", "llama3.1-8b", "--cluster", "mi300x-8", "--gpus", "32"]
    j["llama31_8b_headroom_caps"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                     "--gpus", "32", "--memory-headroom", "0.2",
                                     "--max-memory", "60gib", "--max-step-time", "30s"]
    j["llama31_8b_limits_unmet"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                    "--gpus", "32", "--max-step-time", "5ms"]
    j["llama2_70b_idle_uneven"] = ["--model", "llama2-70b", "--cluster", "dgx-a100-80g",
                                   "--gpus", "96", "--allow-idle-gpus", "--uneven-layers"]
    j["llama31_70b_zb_schedule"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100",
                                    "--gpus", "64", "--schedule", "zb"]
    # strategies (seeded inside the strategies: same arguments, same output)
    j["llama31_8b_strategy_dp"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                   "--gpus", "64", "--strategy", "dp"]
    j["llama31_70b_strategy_nsga2"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100",
                                       "--gpus", "128", "--strategy", "nsga2"]
    j["llama31_70b_strategy_ga"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100",
                                    "--gpus", "128", "--strategy", "ga"]
    # MoE
    j["mixtral_8x7b_h100_64"] = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64"]
    j["mixtral_8x22b_pinned"] = ["--model", "mixtral-8x22b", "--cluster", "dgx-h100",
                                 "--gpus", "128", "--tp", "2", "--pp", "8", "--dp", "8",
                                 "--cp", "1", "--ep", "8", "--etp", "1", "--zero", "1",
                                 "--micro-batch", "1", "--recompute", "full"]
    j["deepseek_v3_h100_1024"] = ["--model", "deepseek-v3", "--cluster", "dgx-h100",
                                  "--gpus", "1024", "--precision", "fp8", "--tp", "1",
                                  "--cp", "1", "--ep", "64"]
    j["gpt_oss_120b_b200"] = ["--model", "gpt-oss-120b", "--cluster", "dgx-b200", "--gpus", "64",
                              "--ep", "8", "--cp", "1"]
    j["qwen3_30b_a3b_h100"] = ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "32",
                               "--ep", "8", "--cp", "1"]
    j["qwen3_235b_gb200"] = ["--model", "qwen3-235b-a22b", "--cluster", "gb200-nvl72",
                             "--gpus", "288", "--tp", "1", "--ep", "8", "--cp", "1"]
    j["nemotron3_nano_moe_h100"] = ["--model", "nemotron3-nano-30b-a3b", "--cluster", "dgx-h100",
                                    "--gpus", "32"]
    # hybrid Mamba
    j["nemotron_h_8b_h100"] = ["--model", "nemotron-h-8b", "--cluster", "dgx-h100", "--gpus", "32"]
    j["nemotron_h_8b_pinned"] = ["--model", "nemotron-h-8b", "--cluster", "dgx-h100", "--gpus", "8",
                                 *PIN_8B]
    # framework presets (each at least once) and efficiency profiles
    for fw in sorted(p.stem for p in (SPECS / "frameworks").glob("*.toml")):
        j[f"framework_{fw.replace('.', '_').replace('-', '_')}"] = [
            "--model", "gpt3-13b", "--cluster", "dgx-a100-80g", "--gpus", "64",
            "--framework", fw, *(["--precision", "fp16"] if fw == "deepspeed-2021" else [])]
    j["error_framework_precision"] = ["--model", "gpt3-13b", "--cluster", "dgx-a100-80g",
                                      "--gpus", "64", "--framework", "deepspeed-2021"]
    j["profile_megatron_2022"] = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80g",
                                  "--profile", "megatron-2022", "--top", "3"]
    j["profile_bridge_25x"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "64",
                               "--profile", "bridge-25.x", "--top", "3"]
    # user errors and infeasible plans (one line on stderr, exit 2)
    j["error_unknown_model"] = ["--model", "no-such-model"]
    j["error_nothing_fits"] = ["--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8"]

    t = TEXT_CASES
    t["text_gpt3_175b_default"] = []
    t["text_llama31_8b_pinned"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                   "--gpus", "8", *PIN_8B]
    t["text_llama31_8b_nsga2"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                  "--gpus", "32", "--strategy", "nsga2"]
    t["text_mixtral_8x7b"] = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "32",
                              "--ep", "8", "--cp", "1"]
    t["text_nemotron_h_idle"] = ["--model", "nemotron-h-8b", "--cluster", "dgx-a100-80g",
                                 "--gpus", "24", "--allow-idle-gpus"]
    t["text_list_presets"] = ["--list"]
    t["text_emit_megatron"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16",
                               "--emit", "megatron"]
    t["text_emit_deepspeed"] = ["--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                                "--gpus", "16", "--emit", "deepspeed"]
    t["text_emit_torchtitan"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16",
                                 "--emit", "torchtitan"]
    t["text_emit_torchtitan_fsdp"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                      "--gpus", "16", "--framework", "torchtitan",
                                      "--emit", "torchtitan"]
    t["text_emit_bridge"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "64",
                             "--emit", "bridge"]

    e = EMIT_CASES
    e["llama31_8b_h100"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16"]
    e["llama31_70b_pinned"] = ["--model", "llama3.1-70b", "--cluster", "dgx-h100",
                               "--gpus", "128", "--global-batch", "256", *PIN_70B]
    e["llama2_7b_zero3"] = ["--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--gpus", "32",
                            "--zero", "3"]
    e["mixtral_8x7b"] = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
                         "--ep", "8", "--cp", "1"]
    e["nemotron_h_8b"] = ["--model", "nemotron-h-8b", "--cluster", "dgx-h100", "--gpus", "16"]
    e["gpt3_13b_deepspeed"] = ["--model", "gpt3-13b", "--cluster", "dgx-a100-80g", "--gpus", "64",
                               "--framework", "deepspeed"]
    e["llama31_8b_fp8_torchtitan"] = ["--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                      "--gpus", "16", "--precision", "fp8-cs",
                                      "--framework", "torchtitan"]

    o = OTHER_CASES
    o["validate"] = ["validate", "--json"]
    o["calibrate_my_runs"] = ["calibrate", "--runs", str(ROOT / "docs/examples/my_runs.csv"),
                              "--json"]
    for spec in sorted((SPECS / "realtime").glob("*.toml")):
        o[f"realtime_{spec.stem}"] = ["realtime", str(spec), "--json"]
        o[f"realtime_{spec.stem}_text"] = ["realtime", str(spec)]


_cases()


def _drop_timing(doc: Any) -> Any:
    """``doc`` without wall-clock keys in the top level and its ``search`` block."""
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k not in TIMING_KEYS}
        if isinstance(doc.get("search"), dict):
            doc["search"] = {k: v for k, v in doc["search"].items() if k not in TIMING_KEYS}
    return doc


_TEXT_SUBS = [
    (re.compile(r" in \d+(\.\d+)? ?(s|ms|us|µs|min)\b"), " in <T>"),
]


def _norm_text(text: str, tmp: str) -> str:
    """Temporary paths and wall-clock times replaced by placeholders."""
    text = text.replace(tmp, "<TMP>").replace(str(ROOT), "<ROOT>")
    for pat, rep in _TEXT_SUBS:
        text = pat.sub(rep, text)
    return text


def _invoke(runner: CliRunner, args: list[str]) -> tuple[int, str, str]:
    r = runner.invoke(app, args, catch_exceptions=True)
    err = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        err += f"\n<exception {type(r.exception).__name__}: {r.exception}>"
    return r.exit_code, r.stdout, err


def _json_record(code: int, out: str, err: str, tmp: str) -> str:
    try:
        doc: Any = _drop_timing(json.loads(out))
    except json.JSONDecodeError:
        doc = {"unparsed_stdout": _norm_text(out, tmp)}
    rec = {"exit_code": code, "stderr": _norm_text(err, tmp), "stdout": doc}
    text = json.dumps(rec, indent=1, sort_keys=True, allow_nan=True) + "\n"
    return _norm_text(text, tmp)


def _text_record(code: int, out: str, err: str, tmp: str) -> str:
    return (f"exit_code: {code}\n--- stderr\n{_norm_text(err, tmp)}\n--- stdout\n"
            f"{_norm_text(out, tmp)}")


def _run_case(runner: CliRunner, out_dir: Path, name: str, args: list[str], kind: str,
              tmp: str) -> float:
    t0 = time.perf_counter()
    if kind == "emit":
        emit_dir = out_dir / "emit" / name
        args = [*args, "--json", "--emit-dir", str(emit_dir)]
        code, out, err = _invoke(runner, args)
        err = err.replace(str(emit_dir), "<EMIT_DIR>")
        out = out.replace(str(emit_dir), "<EMIT_DIR>")
        (out_dir / f"emit_{name}.json").write_text(_json_record(code, out, err, tmp))
    elif kind == "json" or (kind == "other" and "--json" in args):
        if kind == "json":
            args = [*args, "--json"]
        code, out, err = _invoke(runner, args)
        (out_dir / f"{name}.json").write_text(_json_record(code, out, err, tmp))
    else:
        code, out, err = _invoke(runner, args)
        (out_dir / f"{name}.txt").write_text(_text_record(code, out, err, tmp))
    return time.perf_counter() - t0


def all_cases() -> list[tuple[str, list[str], str]]:
    """Every case as (name, arguments, kind)."""
    return ([(n, a, "json") for n, a in JSON_CASES.items()]
            + [(n, a, "text") for n, a in TEXT_CASES.items()]
            + [(n, a, "emit") for n, a in EMIT_CASES.items()]
            + [(n, a, "other") for n, a in OTHER_CASES.items()])


def record(out_dir: Path, only: str | None = None) -> int:
    """Run every case (or those whose name contains ``only``) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # fixed terminal width, no forced colours: rich renders the same table everywhere
    runner = CliRunner(env={"COLUMNS": "150", "LINES": "50", "FORCE_COLOR": None,
                            "NO_COLOR": "1", "TERM": "dumb"})
    times: list[tuple[float, str]] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # any file a command writes relative to the cwd stays out of the tree
        try:
            for name, args, kind in all_cases():
                if only and only not in name:
                    continue
                dt = _run_case(runner, out_dir, name, args, kind, tmp)
                times.append((dt, name))
                print(f"{dt:7.2f} s  {name}", flush=True)
        finally:
            os.chdir(cwd)
    print(f"\n{len(times)} cases in {time.perf_counter() - t_all:.1f} s; slowest:")
    for dt, name in sorted(times, reverse=True)[:8]:
        print(f"{dt:7.2f} s  {name}")
    return 0


def _files(d: Path) -> dict[str, Path]:
    return {str(p.relative_to(d)): p for p in sorted(d.rglob("*")) if p.is_file()}


def compare(a: Path, b: Path, shown: int = 3, lines: int = 40) -> int:
    """0 when both folders hold the same files with the same bytes; else 1 (differences listed)."""
    fa, fb = _files(a), _files(b)
    only_a, only_b = sorted(fa.keys() - fb.keys()), sorted(fb.keys() - fa.keys())
    differ = [k for k in sorted(fa.keys() & fb.keys()) if fa[k].read_bytes() != fb[k].read_bytes()]
    if not (only_a or only_b or differ):
        print(f"identical: {len(fa)} files")
        return 0
    for k in only_a:
        print(f"only in {a}: {k}")
    for k in only_b:
        print(f"only in {b}: {k}")
    for k in differ:
        print(f"differs: {k}")
    for k in differ[:shown]:
        diff = difflib.unified_diff(fa[k].read_text(errors="replace").splitlines(),
                                    fb[k].read_text(errors="replace").splitlines(),
                                    f"{a}/{k}", f"{b}/{k}", n=2, lineterm="")
        print("\n".join(list(diff)[:lines]))
    print(f"{len(differ)} differ, {len(only_a)} only in A, {len(only_b)} only in B "
          f"(of {len(fa.keys() | fb.keys())} files)")
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run every case, write the outputs to OUT_DIR")
    r.add_argument("out_dir", type=Path)
    r.add_argument("--only", help="only the cases whose name contains this")
    c = sub.add_parser("compare", help="byte-compare two recordings")
    c.add_argument("dir_a", type=Path)
    c.add_argument("dir_b", type=Path)
    ns = p.parse_args(argv)
    if ns.cmd == "record":
        return record(ns.out_dir, ns.only)
    return compare(ns.dir_a, ns.dir_b)


if __name__ == "__main__":
    sys.exit(main())
