"""No orphans: SIGTERM to the launcher cleans up like SIGINT, and after a SIGKILL of
the launcher every rank (and torchrun) ends within a few seconds through its watchdog."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from harness.launch import descendants
from harness.watchdog import process_start_ticks

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = """
import sys
from harness.launch import job_spec, run_config
from harness.model import tiny_spec
job = job_spec({"dp": 2, "micro_batch_size": 4}, tiny_spec(), global_batch_size=8, seq_len=32,
               warmup_steps=1, timed_steps=1, inject={"rank": 0, "kind": "hang"})
try:
    run_config(job, 2, timeout_s=120, workdir=sys.argv[1])
except KeyboardInterrupt:
    sys.exit(143)
"""


def _start(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:  # both ranks are up (they write their pid after torch import)
        if all((tmp_path / f"rank_{r}.pid").exists() for r in (0, 1)):
            break
        assert proc.poll() is None, "launcher exited early"
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("ranks did not start within 60 s")
    time.sleep(0.5)
    tree = descendants(proc.pid)  # torchrun and its two ranks
    assert len(tree) >= 3, tree
    return proc, tree


def _left(pids, within_s):
    deadline = time.time() + within_s
    while True:
        alive = [p for p in pids if process_start_ticks(p) is not None]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.1)


@pytest.mark.slow  # ~3 s of killing; starting torchrun and two ranks is most of it
@pytest.mark.torch
def test_sigterm_to_launcher_leaves_no_process(tmp_path):
    proc, tree = _start(tmp_path)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143  # cleaned up, then exited as interrupted
    assert _left(tree, 3.0) == []
    assert time.time() - t0 < 15


# launcher -> "torchrun" (own session) -> "rank" with the watchdog; no torch needed, ~1 s
_RANK = (
    "import pathlib, os, sys, time\n"
    "from harness.watchdog import start_parent_watchdog\n"
    "start_parent_watchdog(0.1)\n"
    "pathlib.Path(sys.argv[1], 'rank.pid').write_text(str(os.getpid()))\n"
    "time.sleep(60)\n"
)
_MID = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1]], start_new_session=True)\n"
    "time.sleep(60)\n"
)
_LAUNCH = (
    "import os, subprocess, sys, time\n"
    "from harness.watchdog import launcher_env\n"
    "env = dict(os.environ, **launcher_env())\n"
    "subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1], sys.argv[3]], env=env,\n"
    "                 start_new_session=True)\n"
    "time.sleep(60)\n"
)


def test_sigkill_of_launcher_rank_and_torchrun_follow_within_a_second(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(tmp_path), _MID, _RANK], env=env,
                            start_new_session=True)
    deadline = time.time() + 30
    while not (tmp_path / "rank.pid").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "rank.pid").exists()
    tree = descendants(proc.pid)  # the fake torchrun and its rank
    assert len(tree) == 2 and int((tmp_path / "rank.pid").read_text()) in tree
    proc.kill()  # no cleanup possible: the rank's watchdog ends itself and its parent
    proc.wait(timeout=10)
    t0 = time.time()
    assert _left(tree, 3.0) == []
    assert time.time() - t0 < 3.0


def test_terminate_as_interrupt_raises_keyboard_interrupt_and_restores():
    from harness.watchdog import Terminated, terminate_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) == before
    assert issubclass(Terminated, KeyboardInterrupt)
