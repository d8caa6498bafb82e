"""The measured-runs CSV: one format, one reader, for ``plan validate --runs`` and
``plan calibrate --runs``.

A runs table has one row per measured training run: the model's shape, the parallel setup, the
GPUs and one measured speed. The columns are those of the shipped
``hardware_specs/validation/training_runs_dev.csv``; :data:`REQUIRED_COLUMNS` and one of
:data:`MEASURED_COLUMNS` must be there, the :data:`OPTIONAL_COLUMNS` may be left out or blank
(blank: the default the row's software era and source give). A row repeated verbatim (its id
aside) is one run; a row without an id is named ``rowN``; ids are one line, control characters
escaped.

:func:`row_progress` is the progress bar of a long table (over :data:`PROGRESS_MIN_ROWS` rows):
each row is one prediction, about 10 ms.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from hardware_specs import ROOT as SPECS_ROOT
from perfmodel.core.errors import SpecError
from perfmodel.core.files import read_text_bounded, shown

__all__ = ["DEFAULT_RUNS", "MAX_RUNS_BYTES", "MEASURED_COLUMNS", "OPTIONAL_COLUMNS",
           "PROGRESS_MIN_ROWS", "REQUIRED_COLUMNS", "normalize_runs", "read_runs",
           "row_progress"]

#: The published dense runs of the dev split (what ``plan validate`` reads by default).
DEFAULT_RUNS = SPECS_ROOT / "validation" / "training_runs_dev.csv"

#: Columns a runs CSV must have (one row per measured run).
REQUIRED_COLUMNS = (
    "model", "num_layers", "hidden_size", "num_attention_heads", "seq_len",
    "global_batch_size", "micro_batch_size", "tensor_parallel", "pipeline_parallel",
    "gpu_type", "num_gpus", "precision",
)
#: One of these gives the measured speed.
MEASURED_COLUMNS = ("seconds_per_iteration", "tokens_per_sec_per_gpu", "tokens_per_sec_total")
#: Columns that may be left out (blank: the default of the row's era and source).
OPTIONAL_COLUMNS = (
    "row_id", "num_query_groups", "ffn_hidden_size", "vocab_size", "data_parallel",
    "context_parallel", "virtual_pipeline_stages", "sequence_parallel",
    "activation_recompute", "zero_or_dist_optimizer", "software", "source",
    "measurement_scope", "reliability", "tokens_per_sec_total",
    "seconds_per_iteration", "tokens_per_sec_per_gpu", "params_b",
)
#: Text columns: blank cells read as "" (not NaN, which would print as "nan").
_TEXT_COLUMNS = ("measurement_scope", "sequence_parallel", "activation_recompute",
                 "zero_or_dist_optimizer", "software", "source", "reliability")

MAX_RUNS_BYTES = 256 * 2**20
"""Largest runs table read [bytes]: about a million rows."""

PROGRESS_MIN_ROWS = 1000
"""Tables longer than this show a progress bar (on a terminal) while their rows are predicted."""


def read_runs(path: str | Path | None = None) -> pd.DataFrame:
    """The runs table at ``path`` (default :data:`DEFAULT_RUNS`), checked and normalised
    (:func:`normalize_runs`); :class:`SpecError` (one line) when it cannot be read as one."""
    p = Path(path) if path is not None else DEFAULT_RUNS
    if not p.exists():
        raise SpecError(f"--runs {shown(p)}: no such file (the file does not exist)")
    try:
        text = read_text_bounded(p, "CSV", limit=MAX_RUNS_BYTES)
    except SpecError as e:
        raise SpecError(f"--runs {e}") from None
    if not text.strip():
        raise SpecError(f"--runs {shown(p)}: empty file (expected a CSV header and rows)")
    try:
        df = pd.read_csv(io.StringIO(text), dtype={"row_id": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise SpecError(f"--runs {shown(p)}: not a readable CSV table: "
                        f"{shown(str(e).splitlines()[0] if str(e) else type(e).__name__)}"
                        ) from None
    return normalize_runs(df, f"--runs {shown(p)}")


def normalize_runs(df: pd.DataFrame, source: str = "runs") -> pd.DataFrame:
    """Check the required columns, add the optional ones (blank), name rows without an id,
    and drop verbatim repeats of a row; :class:`SpecError` naming what is missing."""
    df = df.copy()
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise SpecError(f"{source}: missing column(s) {', '.join(missing)} (a runs table needs "
                        f"{', '.join(REQUIRED_COLUMNS)} and one of {', '.join(MEASURED_COLUMNS)})")
    if not any(c in df.columns for c in MEASURED_COLUMNS):
        raise SpecError(f"{source}: no measured speed: give one of {', '.join(MEASURED_COLUMNS)}")
    if len(df) == 0:
        raise SpecError(f"{source}: the table has no rows: no row can be predicted")
    for c in OPTIONAL_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    # a row id goes into reports and profile files: one line, control characters escaped
    df["row_id"] = [shown(r, 60) if isinstance(r, str) and r.strip() else f"row{i + 1}"
                    for i, r in enumerate(df["row_id"])]
    # a row repeated verbatim (its id aside) is one run, not two
    df = df[~df.drop(columns="row_id").astype(str).duplicated()].reset_index(drop=True)
    for c in _TEXT_COLUMNS:
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    return df


@contextmanager
def row_progress(n_rows: int, console: Console | None = None, label: str = "predicting"
                 ) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a transient bar on ``console`` (default:
    stderr) for tables over :data:`PROGRESS_MIN_ROWS` rows, when the console is a terminal;
    None otherwise."""
    console = console or Console(stderr=True)
    if n_rows <= PROGRESS_MIN_ROWS or not console.is_terminal:
        yield None
        return
    bar = Progress(label, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)
    task = bar.add_task(label, total=n_rows)
    with bar:
        yield lambda done, total: bar.update(task, completed=done, total=total)
