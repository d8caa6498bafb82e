"""Shipped spec data: GPU, cluster and model presets (TOML) and GPU calibration tables (CSV).

The files live inside this package so they are found after ``pip install``. This module only
lists and locates them; parsing and validation live in :mod:`perfmodel.spec.specs`.
"""

from __future__ import annotations

import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent
KINDS = {"gpu": "gpus", "cluster": "clusters", "model": "models", "realtime": "realtime",
         "framework": "frameworks", "profile": "profiles"}


def preset_dir(kind: str) -> Path:
    """Folder holding the presets of ``kind`` (gpu, cluster, model, realtime)."""
    return ROOT / KINDS[kind]


def list_presets(kind: str) -> list[str]:
    """Sorted preset names of ``kind`` (file stems, lower case)."""
    d = preset_dir(kind)
    if not d.exists():
        return []
    return list(_preset_names(str(d), d.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _preset_names(folder: str, mtime_ns: int) -> tuple[str, ...]:
    """The folder's preset names, listed once per folder state (its modification time)."""
    return tuple(sorted(p.stem for p in Path(folder).glob("*.toml")))


def find_preset(kind: str, name: str) -> Path | None:
    """Path of preset ``name`` of ``kind``, or None: only a name of :func:`list_presets`
    (``../../x/secret`` is not joined onto the preset folder)."""
    if name.lower() not in list_presets(kind):
        return None
    return preset_dir(kind) / f"{name.lower()}.toml"


def calibration_dir(name: str) -> Path | None:
    """Folder of a shipped GPU calibration (e.g. ``h200``), or None (also for a name that is
    not a plain folder name)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return None
    p = ROOT / "calibration" / name
    return p if p.is_dir() else None
