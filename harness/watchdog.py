"""No process of a harness job outlives its launcher.

The launcher (``plan verify``, :func:`harness.launch.run_config`) starts torchrun in a session of
its own, and torchrun starts every rank in yet another session, so killing the launcher's process
group reaches neither. Three guards:

* :func:`terminate_as_interrupt`: inside the launcher, SIGTERM (and SIGHUP) raise
  ``KeyboardInterrupt`` like SIGINT, so the launcher's ``finally`` kills the job's whole tree
  before it exits (before, SIGTERM killed ``plan`` at once and left torchrun and the ranks).
* :func:`launcher_env` / :func:`start_parent_watchdog`: every rank watches its launcher (pid and
  start time, so a reused pid does not fool it) and its torchrun parent; when either is gone
  (SIGKILL of the launcher, a crashed torchrun) the rank stops torchrun and exits within
  :data:`WATCH_INTERVAL_S`. Ranks waiting on the rendezvous are covered: the watchdog runs before
  ``init_process_group``.
* :data:`RDZV_TIMEOUT_S`: torchrun's rendezvous and the ranks' store wait time out (they waited
  14 minutes for a dead peer).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "RDZV_TIMEOUT_S",
    "WATCH_INTERVAL_S",
    "launcher_env",
    "process_start_ticks",
    "start_parent_watchdog",
    "terminate_as_interrupt",
]

WATCH_INTERVAL_S = 0.5
"""How often a rank checks that its launcher and its torchrun parent still live [s]."""

RDZV_TIMEOUT_S = 60.0
"""Longest wait for the other ranks to join (torchrun rendezvous, the ranks' TCP store) [s]."""

ENV_PID = "HARNESS_LAUNCHER_PID"
ENV_START = "HARNESS_LAUNCHER_START"


def process_start_ticks(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or None
    when the process does not exist (or /proc is missing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie is dead
        return None
    return fields[19]


def _alive(pid: int, start: str | None) -> bool:
    if Path("/proc").is_dir():
        return process_start_ticks(pid) == start if start else process_start_ticks(pid) is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launcher_env() -> dict[str, str]:
    """Environment entries that tell the ranks who their launcher is (this process)."""
    pid = os.getpid()
    return {ENV_PID: str(pid), ENV_START: process_start_ticks(pid) or ""}


def start_parent_watchdog(interval_s: float = WATCH_INTERVAL_S) -> threading.Thread | None:
    """In a rank: a daemon thread that ends this process (exit code 3) once the launcher named
    in the environment, or the parent (torchrun) this rank started under, is gone; it first
    SIGKILLs that parent if it still lives, so torchrun does not linger either."""
    launcher = os.environ.get(ENV_PID)
    start = os.environ.get(ENV_START) or None
    ppid = os.getppid()
    ppid_start = process_start_ticks(ppid)

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            launcher_gone = launcher is not None and not _alive(int(launcher), start)
            parent_gone = os.getppid() != ppid
            if launcher_gone or parent_gone:
                if not parent_gone and ppid_start and process_start_ticks(ppid) == ppid_start:
                    with contextlib.suppress(OSError):
                        os.kill(ppid, signal.SIGKILL)
                os._exit(3)

    t = threading.Thread(target=watch, name="harness-parent-watchdog", daemon=True)
    t.start()
    return t


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP received: handled like Ctrl-C (``KeyboardInterrupt``)."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Terminated` (a ``KeyboardInterrupt``),
    so ``finally`` blocks clean up exactly as for SIGINT. Only in the main thread (elsewhere
    Python cannot install handlers, and nothing is changed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
