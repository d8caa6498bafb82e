"""Nothing hidden in a plan's report: a cluster file is not silently grown, the model is echoed
as read, and the header names every default that moves the answer and where it came from."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from hardware_specs import find_preset

runner = CliRunner()
SMALL = ["--model", "llama3.1-8b", "--gpus", "8", "--global-batch", "32", "--seq-len", "4096",
         "--tp", "8", "--pp", "1", "--cp", "1", "--vp", "1", "--zero", "0", "--micro-batch", "1",
         "--recompute", "none", "--sequence-parallel", "--schedule", "1f1b"]


def _cluster_file(tmp_path: Path, nodes: int) -> Path:
    text = Path(find_preset("cluster", "dgx-a100-80g")).read_text()
    lines = [f"num_nodes = {nodes}" if x.startswith("num_nodes") else x
             for x in text.splitlines()]
    out = tmp_path / "mine.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_gpus_beyond_a_cluster_file_are_refused_in_one_line(tmp_path):
    c = _cluster_file(tmp_path, 4)  # 32 GPUs
    r = runner.invoke(app, ["--model", "llama3.1-8b", "--cluster", str(c), "--gpus", "64"])
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert "\n" not in line and "gpus (64) exceeds" in line and "= 32 GPUs" in line
    r = runner.invoke(app, [*SMALL, "--cluster", str(c)])
    assert r.exit_code == 0, r.output
    # a shipped preset is a node type sized by --gpus
    r = runner.invoke(app, [*SMALL[:2], "--gpus", "2048", "--tp", "8", "--pp", "8", "--json"])
    assert r.exit_code == 0, r.output


def test_model_is_echoed_as_read():
    r = runner.invoke(app, ["--model", "mixtral-8x7b", "--gpus", "32", "--global-batch", "32",
                            "--seq-len", "4096", "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["model_summary"]
    assert (m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["kv_heads"],
            m["num_experts"], m["moe_top_k"]) == (32, 4096, 32, 8, 8, 2)
    # Mixtral 8x7B: 46.7B parameters, 12.9B active (Jiang et al. 2024, sec. 2)
    assert 46.0e9 < m["params_total"] < 47.5e9 and 12.5e9 < m["params_active"] < 13.2e9
    r = runner.invoke(app, ["--model", "mixtral-8x7b", "--gpus", "32", "--global-batch", "32",
                            "--seq-len", "4096"])
    head = r.stdout.splitlines()[:3]
    assert any(x.startswith("model as read: 46.7 B parameters (12.9 B active per token), 32 "
                            "layers, hidden 4096, 32 heads / 8 KV groups, 8 experts, top-2")
               for x in head)


def test_header_names_every_default_that_moves_the_answer():
    r = runner.invoke(app, [*SMALL[:-9], "--zero", "0", "--framework", "megatron-2022"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    first = next(x for x in lines if x.startswith("assumed setup:"))
    for what in ("framework megatron-2022", "overlap none", "flash attention off",
                 "gradient buffer fp32", "loss fp32", "recompute searched over none"):
        assert what in first, first
    block = "\n".join(lines[:12])
    assert "gradient buffer fp32" in block and "attention kernel cudnn" in block
    r = runner.invoke(app, [*SMALL, "--framework", "bridge-26.02"])
    first = next(x for x in r.stdout.splitlines() if x.startswith("assumed setup:"))
    assert "gradient buffer 16-bit" in first and "loss fused" in first
    assert "gradient buffer 16-bit" in r.stdout and ": framework bridge-26.02" in r.stdout
