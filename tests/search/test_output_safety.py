"""Outputs never replace the command's inputs, are written whole (temporary file and rename),
and an --emit-dir never mixes the files of two plans."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
from typer.testing import CliRunner

from cli.main import app
from emit.launch import FILE_NAMES, Launch, write_emit_dir
from hardware_specs import find_preset
from perfmodel.core.files import atomic_write, refuse_input_as_output
from perfmodel.spec.specs import SpecError

runner = CliRunner()
PLAN = ["--gpus", "8", "--global-batch", "64", "--seq-len", "1024"]


def _err_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    return lines[0]


def test_atomic_write_replaces_whole_file_and_keeps_mode(tmp_path):
    f = tmp_path / "out.csv"
    f.write_text("old")
    f.chmod(0o640)
    atomic_write(f, "new\n")
    assert f.read_text() == "new\n" and stat.S_IMODE(f.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["out.csv"]  # no temporary file left


def test_atomic_write_failure_leaves_old_file(tmp_path, monkeypatch):
    f = tmp_path / "out.csv"
    f.write_text("old")

    def boom(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(f, "new")
    assert f.read_text() == "old" and os.listdir(tmp_path) == ["out.csv"]


def test_refuse_input_as_output(tmp_path):
    m = tmp_path / "m.toml"
    m.write_text("x")
    with pytest.raises(SpecError, match="is one of this command's inputs"):
        refuse_input_as_output(tmp_path / "." / "m.toml", [None, "gpt3-125m", m], "--csv")
    with pytest.raises(SpecError, match="give a file or folder name"):
        refuse_input_as_output("", [], "--emit-dir")
    refuse_input_as_output(tmp_path / "other.csv", [m, tmp_path], "--csv")


def test_csv_that_is_the_model_file_is_refused(tmp_path):
    m = tmp_path / "m.toml"
    shutil.copy(find_preset("model", "gpt3-125m"), m)
    before = m.read_text()
    line = _err_line(runner.invoke(app, ["--model", str(m), *PLAN, "--csv", str(m)]))
    assert "--csv" in line and m.read_text() == before


def test_csv_onto_a_shipped_preset_is_refused():
    p = find_preset("model", "gpt3-125m")
    before = p.read_text()
    _err_line(runner.invoke(app, ["--model", "gpt3-125m", *PLAN, "--csv", str(p)]))
    assert p.read_text() == before


@pytest.mark.parametrize("opt", ["--csv", "--emit-dir"])
def test_empty_output_name_is_refused(opt):
    assert "give a file or folder name" in _err_line(
        runner.invoke(app, ["--model", "gpt3-125m", *PLAN, opt, ""]))


def test_emit_dir_that_holds_the_model_file_is_refused(tmp_path):
    m = tmp_path / "torchtitan.toml"
    shutil.copy(find_preset("model", "gpt3-125m"), m)
    before = m.read_text()
    _err_line(runner.invoke(app, ["--model", str(m), *PLAN, "--emit-dir", str(tmp_path)]))
    assert m.read_text() == before


def test_emit_dir_removes_files_of_formats_this_plan_did_not_write(tmp_path):
    for name in FILE_NAMES.values():
        (tmp_path / name).write_text("an earlier plan")
    (tmp_path / "notes.txt").write_text("mine")
    launches = {"megatron": Launch("megatron", "megatron", FILE_NAMES["megatron"], text="--x\n"),
                "deepspeed": Launch("deepspeed", "deepspeed", FILE_NAMES["deepspeed"],
                                    refused="no")}
    write_emit_dir(tmp_path, launches, [])
    assert sorted(os.listdir(tmp_path)) == ["megatron.args", "notes.txt"]
    assert (tmp_path / "megatron.args").read_text() == "--x\n"


def test_calibrate_out_that_is_the_runs_file_is_refused(tmp_path):
    runs = tmp_path / "r.csv"
    runs.write_text("row_id,model\n")
    res = runner.invoke(app, ["calibrate", "--runs", str(runs), "--out", str(runs)])
    assert "--out" in _err_line(res) and runs.read_text() == "row_id,model\n"
