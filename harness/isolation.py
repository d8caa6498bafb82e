"""Start harness subprocesses that run only the installed project's code, in private folders.

``plan verify`` starts ``python -m torch.distributed.run ... -m harness.worker`` (and
``-m harness.calibrate``). Python puts the current directory first on ``sys.path`` for ``-m``,
and an empty ``PYTHONPATH`` entry means the current directory too, so a folder holding a file
``harness/worker.py`` had its code run by ``plan verify`` started there. Here:

* the interpreter runs with ``-P`` (no unsafe path first) and ``PYTHONSAFEPATH=1`` in the
  environment, which torchrun's own ``python -m harness.worker`` children inherit;
* ``PYTHONPATH`` is the installed project root, then only the absolute, non-empty entries the
  user had (no empty or relative entry, which would mean a working directory);
* every process starts in a private temporary working directory;
* :func:`private_temp_root` gives one run one temporary root (``TMPDIR`` of its children, so
  torchelastic's and torchinductor's folders land there) and removes it at the end.

``-I`` (isolated mode) is not used: it also ignores ``PYTHONPATH``, and torchrun starts its
ranks without it anyway; ``-P`` with an explicit ``PYTHONPATH`` gives the same guarantee for
the project's modules.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["private_temp_root", "project_root", "python_command", "worker_env"]

_TEMP_VARS = ("TMPDIR", "TEMP", "TMP")
_active_root: list[Path] = []


def project_root() -> Path:
    """The folder that holds the installed ``harness`` and ``perfmodel`` packages."""
    return Path(__file__).resolve().parents[1]


def python_command(*args: str) -> list[str]:
    """``[python, -P, *args]``: this interpreter, never importing from its working directory."""
    return [sys.executable, "-P", *args]


def worker_pythonpath(inherited: str | None, root: Path | None = None) -> str:
    """``PYTHONPATH`` for a worker: the project root, then the absolute entries of ``inherited``
    (empty and relative entries dropped: they name a working directory)."""
    first = str(root or project_root())
    keep = [p for p in (inherited or "").split(os.pathsep) if p and os.path.isabs(p) and p != first]
    return os.pathsep.join([first, *dict.fromkeys(keep)])


def worker_env(base: Mapping[str, str], temp_root: str | Path | None = None) -> dict[str, str]:
    """A copy of ``base`` for a worker: explicit ``PYTHONPATH``, ``PYTHONSAFEPATH=1``, no
    ``PYTHONSTARTUP``; with ``temp_root``, every temporary-folder variable points into it."""
    env = dict(base)
    env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH"))
    env["PYTHONSAFEPATH"] = "1"
    env.pop("PYTHONSTARTUP", None)
    root = temp_root or (_active_root[-1] if _active_root else None)
    if root is not None:
        env.update({v: str(root) for v in _TEMP_VARS})
    return env


def private_dir(prefix: str) -> Path:
    """A new private (mode 0700) folder inside the active temporary root (or the system's)."""
    parent = _active_root[-1] if _active_root else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


@contextlib.contextmanager
def private_temp_root(prefix: str = "plan-verify-") -> Iterator[Path]:
    """One private temporary root for one run, removed (with all it holds) on leaving, also on
    an error or an interrupt. Nested uses share the outermost root."""
    if _active_root:
        yield _active_root[-1]
        return
    root = Path(tempfile.mkdtemp(prefix=prefix))
    _active_root.append(root)
    try:
        yield root
    finally:
        _active_root.pop()
        shutil.rmtree(root, ignore_errors=True)
