"""The rows of a sweep: their columns and types, and the Parquet file that holds them.

A sweep writes what it has finished every few seconds into ``<out>.parts/`` (one small Parquet
file per flush), and at the end the whole table, sorted by scenario id, into ``<out>`` (written
to a temporary file and renamed, so ``<out>`` is always a complete table). A run that stops
early leaves its parts; the next run with the same ``out`` reads ``<out>`` and the parts and
skips the scenarios they hold.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from perfmodel.spec.specs import SpecError

__all__ = ["COLUMNS", "FLUSH_S", "ResultStore", "typed"]

#: Every row's columns and their pandas types, in order: the scenario, the outcome, the best
#: configuration's fields (``rank`` 1; ranks up to the spec's ``top`` follow), its
#: predictions, and the run figures (with ``train_tokens``). Override columns (named by their
#: key, ``gpu.hbm_gib``) and interval columns a result carries (``step_time_*_s``) follow.
COLUMNS: dict[str, str] = {
    # the scenario
    "scenario_id": "string", "model": "string", "cluster": "string", "gpus": "Int64",
    "global_batch": "Int64", "seq_len": "Int64", "precision": "string", "framework": "string",
    "strategy": "string", "objective": "string", "top": "Int64", "train_tokens": "float64",
    # the outcome: "ok", "nothing fits" or "error", and why (empty when ok)
    "status": "string", "reason": "string", "rank": "Int64", "evaluated": "Int64",
    "feasible": "Int64",
    # the configuration
    "dp": "Int64", "tp": "Int64", "pp": "Int64", "vp": "Int64", "cp": "Int64",
    "zero_stage": "Int64", "micro_batch_size": "Int64", "num_microbatches": "Int64",
    "recompute": "string", "sequence_parallel": "boolean", "schedule": "string",
    "grad_compression": "string", "ep": "Int64", "etp": "Int64", "gpus_used": "Int64",
    # its predictions
    "step_time_s": "float64", "tokens_per_s": "float64", "mfu": "float64", "hfu": "float64",
    "peak_memory_bytes": "float64",
    # the run (train_tokens given)
    "train_days": "float64", "failure_free_days": "float64", "gpu_hours": "float64",
    "goodput": "float64", "energy_mwh": "float64", "cost": "float64",
    # their bounds from the step time's 80 % interval (the run at both ends of it)
    "train_days_low": "float64", "train_days_high": "float64", "cost_low": "float64",
    "cost_high": "float64",
}

#: Seconds between two writes of finished rows into ``<out>.parts/``.
FLUSH_S = 10.0


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every column of :data:`COLUMNS` (missing ones as NA) in its type, in
    order, the other columns (overrides, intervals: float) after them sorted by name, and
    the rows sorted by (scenario id, rank)."""
    out = {name: _as(frame, name, dtype) for name, dtype in COLUMNS.items()}
    for name in sorted(set(frame.columns) - set(COLUMNS)):
        out[name] = _as(frame, name, "float64")
    result = pd.DataFrame(out, index=frame.index)
    return result.sort_values(["scenario_id", "rank"], kind="stable").reset_index(drop=True)


def _as(frame: pd.DataFrame, name: str, dtype: str) -> pd.Series:
    """Column ``name`` of ``frame`` (all missing when absent) as ``dtype``."""
    if name not in frame:
        return pd.Series(float("nan") if dtype == "float64" else pd.NA, index=frame.index,
                         dtype=dtype)
    if dtype == "float64":
        return pd.to_numeric(frame[name]).astype(dtype)
    return frame[name].astype(dtype)


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path, engine="pyarrow")
    except (pa.ArrowInvalid, OSError) as err:
        raise SpecError(f"{path}: not a readable Parquet file ({err})") from None


class ResultStore:
    """Finished rows of one sweep and where they go (``out`` None: kept in memory only)."""

    def __init__(self, out: str | Path | None) -> None:
        self.out = None if out is None else Path(out)
        self.parts = None if out is None else Path(f"{out}.parts")
        if self.out is not None and not self.out.parent.is_dir():
            raise SpecError(f"{self.out}: the folder {self.out.parent} does not exist")
        if self.out is not None and self.out.is_dir():
            raise SpecError(f"{self.out}: is a folder, expected a Parquet file path")
        self._buffer: list[dict[str, Any]] = []
        self._frames: list[pd.DataFrame] = []
        self._last_flush = time.monotonic()

    def previous(self) -> pd.DataFrame:
        """Rows already written by earlier runs (``out`` and its parts), typed."""
        frames = []
        if self.out is not None and self.out.exists():
            frames.append(_read(self.out))
        if self.parts is not None and self.parts.is_dir():
            frames.extend(_read(p) for p in sorted(self.parts.glob("*.parquet")))
        if not frames:
            return typed(pd.DataFrame(columns=list(COLUMNS)))
        both = pd.concat(frames, ignore_index=True)
        return typed(both.drop_duplicates(["scenario_id", "rank"], keep="first"))

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Keep finished rows; write them to a part file every :data:`FLUSH_S` seconds."""
        self._buffer.extend(rows)
        if time.monotonic() - self._last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows (if any) as one part file."""
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        frame = typed(pd.DataFrame(self._buffer))
        self._buffer = []
        self._frames.append(frame)
        if self.parts is not None:
            self.parts.mkdir(parents=True, exist_ok=True)
            _write(frame, self.parts / f"part-{uuid.uuid4().hex}.parquet")

    def new_rows(self) -> pd.DataFrame:
        """Every row added in this run, typed."""
        self.flush()
        if not self._frames:
            return typed(pd.DataFrame(columns=list(COLUMNS)))
        return typed(pd.concat(self._frames, ignore_index=True))

    def finish(self, table: pd.DataFrame) -> None:
        """Write the whole ``table`` to ``out`` (atomically) and remove the parts."""
        if self.out is None:
            return
        _write(table, self.out)
        if self.parts is not None and self.parts.is_dir():
            shutil.rmtree(self.parts)


def _write(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)
    os.replace(tmp, path)
