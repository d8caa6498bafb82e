"""Harness subprocesses run only the installed project's code, in private folders, and the
launcher kills only processes it can identify (pid and start time)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from harness import isolation
from harness.isolation import private_temp_root, project_root, python_command, worker_env
from harness.launch import kill_all, rank_processes, torchrun_command
from harness.watchdog import process_start_ticks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hostile_cwd(tmp_path, monkeypatch):
    """A working directory holding a package ``harness`` whose modules write a marker file."""
    pkg = tmp_path / "harness"
    pkg.mkdir()
    marker = tmp_path / "PWNED"
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    for name in ("__init__", "worker", "calibrate", "isolation"):
        (pkg / f"{name}.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    return marker


def test_commands_start_python_without_unsafe_path():
    cmd = torchrun_command(2, "harness.worker", "--config", "c.json")
    assert cmd[:2] == [sys.executable, "-P"]
    assert cmd[cmd.index("-m", 3) + 1] == "harness.worker"
    assert python_command("-c", "pass") == [sys.executable, "-P", "-c", "pass"]


@pytest.mark.parametrize("inherited", [None, "", ":", "relative/dir::/abs/site", "/abs/site:"])
def test_worker_pythonpath_has_no_empty_or_relative_entry(inherited):
    base = {} if inherited is None else {"PYTHONPATH": inherited}
    env = worker_env(base)
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries[0] == str(project_root())
    assert all(e and os.path.isabs(e) for e in entries)
    assert env["PYTHONSAFEPATH"] == "1"


def test_worker_env_points_temp_folders_into_the_run(tmp_path):
    env = worker_env({"TMPDIR": "/tmp", "PYTHONSTARTUP": "evil.py"}, temp_root=tmp_path)
    assert env["TMPDIR"] == env["TEMP"] == env["TMP"] == str(tmp_path)
    assert "PYTHONSTARTUP" not in env


def test_hostile_package_in_cwd_is_not_run(hostile_cwd):
    env = worker_env(dict(os.environ, PYTHONPATH=""))
    # the launcher's own interpreter (python -P -m ...) ...
    top = subprocess.run(
        python_command("-m", "harness.isolation"),
        env=env,
        cwd=hostile_cwd.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # ... and the ranks torchrun starts without -P (python -u -m harness.worker), inheriting env
    rank = subprocess.run(
        [sys.executable, "-u", "-c", "import harness; print(harness.__file__)"],
        env=env,
        cwd=hostile_cwd.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert top.returncode == 0, top.stderr
    assert rank.stdout.strip() == str(project_root() / "harness" / "__init__.py")
    assert not hostile_cwd.exists()


class _FakeTorchrun:
    """Stands in for subprocess.Popen: records how the launcher starts torchrun."""

    seen: ClassVar[dict] = {}

    def __init__(self, cmd, **kw):
        _FakeTorchrun.seen = dict(cmd=cmd, **kw)
        self.pid, self.returncode = 2**22 + 7, 1

    def wait(self, timeout=None):
        return self.returncode

    def kill(self):
        pass


def test_launch_and_calibrate_start_workers_in_private_cwd(hostile_cwd, monkeypatch):
    pytest.importorskip("torch")
    from harness import calibrate, launch
    from harness.launch import job_spec, run_config
    from harness.model import tiny_spec

    monkeypatch.setattr(launch.subprocess, "Popen", _FakeTorchrun)
    job = job_spec({"dp": 2, "micro_batch_size": 4}, tiny_spec(), global_batch_size=8, seq_len=32)
    with private_temp_root() as root:
        res = run_config(job, 2, timeout_s=30)
        seen = _FakeTorchrun.seen
        assert not res["ok"]
        assert seen["cmd"][:2] == [sys.executable, "-P"]
        assert Path(seen["cwd"]).parent == root and Path(seen["cwd"]) != Path.cwd()
        assert seen["env"]["PYTHONSAFEPATH"] == "1" and seen["env"]["TMPDIR"] == str(seen["cwd"])
        with pytest.raises(RuntimeError):
            calibrate._run_one(2, 30)
        seen = _FakeTorchrun.seen
        assert seen["cmd"][:2] == [sys.executable, "-P"] and Path(seen["cwd"]).parent == root
    assert not root.exists() and isolation._active_root == []


def test_private_temp_root_is_removed_on_interrupt():
    with pytest.raises(KeyboardInterrupt), private_temp_root() as root:
        (root / "harness-x").mkdir()
        raise KeyboardInterrupt
    assert not root.exists()


class _Reaped:
    pid, returncode = 2**22 + 9, 0

    def wait(self, timeout=None):
        return 0


def test_kill_only_processes_whose_start_time_matches(tmp_path):
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        time.sleep(0.2)
        ticks = process_start_ticks(sleeper.pid)
        (tmp_path / "rank_0.pid").write_text(f"{sleeper.pid} 1")  # a reused pid: other start
        (tmp_path / "rank_1.pid").write_text(f"{sleeper.pid}")  # no start time: never trusted
        kill_all(_Reaped(), rank_processes(tmp_path))
        assert sleeper.poll() is None
        (tmp_path / "rank_0.pid").write_text(f"{sleeper.pid} {ticks}")
        kill_all(_Reaped(), rank_processes(tmp_path))
        assert sleeper.wait(timeout=10) != 0
    finally:
        sleeper.kill()
        sleeper.wait()
