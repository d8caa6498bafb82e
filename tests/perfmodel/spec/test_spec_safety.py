"""Spec loaders refuse what could reach other files or folders: control characters in names,
preset names that are paths, and names the OS refuses; each as one SpecError line."""

from __future__ import annotations

import json
import tomllib

import pytest

from emit.launch import bridge_yaml, megatron_args, torchtitan_toml
from hardware_specs import calibration_dir, find_preset
from perfmodel.core.files import plain_name, shown
from perfmodel.parallel.config import ParallelConfig
from perfmodel.spec.specs import SpecError, TrainingSpec, load_cluster, load_gpu, load_model

INJECTED = "tiny\n[job]\ndump_folder = '/etc'\n[checkpoint]\nenable = true"


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and "\r" not in msg and len(msg) < 1000, msg
    return msg


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "a\x00b", "a\x1bb", "a\u2028b", "a\x85b"])
def test_model_name_with_control_character_is_refused(tmp_path, name):
    text = find_preset("model", "gpt3-125m").read_text()
    assert 'name = "gpt3-125m"' in text
    (tmp_path / "m.toml").write_text(text.replace('name = "gpt3-125m"',
                                                  f"name = {json.dumps(name)}"))
    with pytest.raises(SpecError, match="control character") as err:
        load_model(tmp_path / "m.toml")
    _one_line(err)


def test_hf_config_folder_name_with_newline_is_refused(tmp_path):
    folder = tmp_path / "evil\n[job]"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 1000}))
    with pytest.raises(SpecError, match="control character") as err:
        load_model(folder / "config.json")
    _one_line(err)


def test_plain_name_and_shown():
    assert plain_name("llama3.1-8b") == "llama3.1-8b"
    assert shown("a\nb") == "a\\nb"
    assert len(shown("x" * 10_000)) == 120


def test_newline_in_model_name_cannot_inject_toml_or_yaml_lines():
    """Past the loaders (a spec built without validation), every emitter still writes the
    name on one line: the TOML tables and YAML keys stay the ones the plan wrote."""
    clean = load_model("gpt3-125m")
    evil = clean.model_copy(update={"name": INJECTED})
    cfg, tr = ParallelConfig(dp=8), TrainingSpec(global_batch_size=64, seq_len=2048)
    want = tomllib.loads(torchtitan_toml(cfg, clean, tr))
    got = tomllib.loads(torchtitan_toml(cfg, evil, tr))
    assert set(got) == set(want) and "checkpoint" not in got
    assert got["model"]["flavor"] == INJECTED  # a TOML string, not tables
    for text in (torchtitan_toml(cfg, evil, tr), megatron_args(cfg, evil, tr),
                 bridge_yaml(cfg, evil, tr)):
        assert not any(line.startswith(("[job]", "[checkpoint]", "dump_folder"))
                       for line in text.splitlines())


@pytest.mark.parametrize("loader", [load_model, load_cluster, load_gpu])
def test_preset_name_is_never_a_path(tmp_path, monkeypatch, loader):
    secret = tmp_path / "x" / "secret.toml"
    secret.parent.mkdir()
    secret.write_text('name = "secret"\nhidden = "do not echo"\n')
    monkeypatch.chdir(tmp_path / "x")
    for name in ("../" * 12 + str(secret.with_suffix(""))[1:], "../x/secret", "./secret"):
        with pytest.raises(SpecError) as err:
            loader(name)
        assert "do not echo" not in _one_line(err)
    assert find_preset("model", "../models/gpt3-125m") is None
    assert calibration_dir("../calibration/h200") is None and calibration_dir("..") is None


@pytest.mark.parametrize("loader", [load_model, load_cluster, load_gpu])
def test_name_too_long_for_the_os_is_one_line(loader):
    for name in ("a" * 10_000, "a" * 10_000 + ".toml", "a" * 10_000 + ".json"):
        with pytest.raises(SpecError) as err:
            loader(name)
        assert len(_one_line(err)) < 2000
