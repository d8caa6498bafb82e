"""``plan sweep SPEC.toml --out results.parquet``: the command over :func:`sweep.run.sweep`.

Exit status 0 when every scenario has its row (some may say "nothing fits"), 2 on a user
error (one line on stderr, before any search runs).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from perfmodel.spec.specs import SpecError
from sweep.run import sweep
from sweep.spec import check_spec, load_sweep_spec

__all__ = ["sweep_cmd"]


def _fail(message: str) -> None:
    typer.echo(f"plan: error: {message}", err=True)
    raise typer.Exit(2)


def sweep_cmd(
    spec: Annotated[Path, typer.Argument(
        help="Sweep spec (TOML): lists of models, clusters, gpus, global_batch, seq_len, "
        "optional precision, framework, strategy, objective, top, train_tokens, [overrides].",
        show_default=False)],
    out: Annotated[Path, typer.Option(
        "--out", "-o", help="Parquet file of the results; scenarios it holds are skipped.",
        show_default=False)],
    scheduler: Annotated[str | None, typer.Option(
        "--scheduler", help="Address of a running Dask scheduler (tcp://host:8786); default: "
        "a local cluster.", show_default=False)] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", help="Worker processes of the local cluster (default: one per core; 0: "
        "run in this process).", show_default=False)] = None,
    yes: Annotated[bool, typer.Option(
        "--yes", help="Run a sweep larger than the confirmation threshold.")] = False,
) -> None:
    """Run a search per scenario of a sweep spec (the product of its lists) on Dask; write one
    row per scenario to Parquet."""
    t0 = time.perf_counter()
    try:
        s = load_sweep_spec(spec)
        check_spec(s, yes=yes)
        if scheduler is not None and workers is not None:
            raise SpecError("--workers sets the local cluster's size; with --scheduler the "
                            "cluster's own workers run the sweep")
        if workers is not None and workers < 0:
            raise SpecError(f"--workers {workers}: expected a count >= 0")
        table = sweep(s, client=scheduler, out=out, workers=workers, yes=yes, progress=True)
    except SpecError as err:
        _fail(str(err))
    best = table[table["rank"] == 1]
    counts = best["status"].value_counts()
    typer.echo(f"{len(best):,} scenarios ({s.size:,} in the spec): {counts.get('ok', 0):,} ok, "
               f"{counts.get('nothing fits', 0):,} nothing fits, {counts.get('error', 0):,} "
               f"errors; wrote {out} in {time.perf_counter() - t0:.1f} s")
