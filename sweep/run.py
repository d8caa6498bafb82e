"""Run a sweep: each scenario's full search (``search.plan``), on Dask, one row per scenario.

>>> from sweep import sweep
>>> df = sweep("sweep.toml", out="results.parquet")                 # doctest: +SKIP
>>> df = sweep("sweep.toml", client="tcp://scheduler:8786")         # doctest: +SKIP

Where the searches run:

- ``client`` None and ``workers`` None or >= 1: a Dask ``LocalCluster`` started for the sweep
  (worker processes with one thread each; ``workers`` None: one per core) and closed after it;
- ``client`` a ``distributed.Client`` or a scheduler address: that cluster's workers;
- ``workers=0``: this process, one scenario after the other (no Dask).

Scenarios are sent in batches sized from a timed probe so that one task is a few seconds
(:data:`TASK_TARGET_S`), and at most a few batches per worker are in flight. The rows are the
same whichever executor ran them (each is a deterministic function of its scenario) and come
back sorted by scenario id.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import pandas as pd
from distributed import Client, LocalCluster, as_completed
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from perfmodel.spec.specs import SpecError
from search.api import plan
from sweep.spec import (
    MAX_SCENARIOS,
    Scenario,
    SweepSpec,
    check_spec,
    load_sweep_spec,
    scenario_cluster,
)
from sweep.store import ResultStore, typed

__all__ = [
    "SECONDS_PER_DAY",
    "TASK_TARGET_S",
    "batch_size",
    "run_batch",
    "run_figures",
    "run_scenario",
    "sweep",
]

#: Wall time one Dask task should take: long enough that scheduling (~1 ms a task) and
#: transfers are noise, short enough that work spreads evenly over the workers.
TASK_TARGET_S = 3.0

#: Batches in flight per worker thread (the next one is queued while one runs).
IN_FLIGHT_PER_WORKER = 2

SECONDS_PER_DAY = 86_400.0

_CONFIG_FIELDS = ("dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size",
                  "num_microbatches", "recompute", "sequence_parallel", "schedule",
                  "grad_compression", "ep", "etp")
_PREDICTIONS = ("step_time_s", "tokens_per_s", "mfu", "hfu", "peak_memory_bytes")


def run_figures(train: Any, i: int) -> dict[str, float | None]:
    """The run figures of configuration ``i`` of a search's whole run (``result.train``, a
    :class:`perfmodel.run.TrainRun`: the very terms ``plan --train-tokens`` reports).

    Returns ``train_days`` (wall-clock days with interruptions, restarts and checkpoints),
    ``failure_free_days`` (the steps alone), ``gpu_hours`` (GPUs x wall time), ``goodput``
    (failure-free over wall time), ``energy_mwh`` (None without the GPU's TDP) and ``cost``
    (None without a GPU-hour price), and the bounds of the days and the cost from the step
    time's 80 % interval (``train_days_low`` / ``_high``, ``cost_low`` / ``_high``; None
    without an interval or a price).
    """
    r = train.row(i)
    days = r.get("days_interval") or (None, None)
    cost = r.get("cost_interval") or (None, None)
    return {"train_days": r["days"], "failure_free_days": r["useful_s"] / SECONDS_PER_DAY,
            "gpu_hours": r["gpu_hours"], "goodput": r["goodput"],
            "energy_mwh": r["energy_mwh"], "cost": r["cost"],
            "train_days_low": days[0], "train_days_high": days[1],
            "cost_low": cost[0], "cost_high": cost[1]}


def _scenario_fields(s: Scenario) -> dict[str, Any]:
    fields = s.model_dump(exclude={"overrides"})
    return {"scenario_id": s.id, **fields, **dict(s.overrides)}


def _search(s: Scenario) -> Any:
    """The scenario's search through the public API (the preset name when nothing is
    overridden, else the cluster with its overrides)."""
    cluster = scenario_cluster(s.cluster, s.overrides) if s.overrides else s.cluster
    return plan(s.model, cluster, gpus=s.gpus, global_batch_size=s.global_batch,
                seq_len=s.seq_len, precision=s.precision, framework=s.framework,
                strategy=s.strategy, objective=s.objective, top=s.top,
                train_tokens=s.train_tokens)


def _ranked_rows(s: Scenario, result: Any) -> list[dict[str, Any]]:
    """One row per reported configuration (rank 1 is the best)."""
    rows = []
    intervals = [c for c in result.top.columns
                 if c.startswith("step_time_") and c.endswith("_s") and c != "step_time_s"]
    for rank, rec in enumerate(result.top.to_dict("records"), start=1):
        row = {"status": "ok", "reason": "", "rank": rank, "gpus_used": rec["gpus"],
               **{k: rec[k] for k in (*_CONFIG_FIELDS, *_PREDICTIONS, *intervals)}}
        if result.train is not None:  # train_tokens given: the plan's own run terms
            row.update(run_figures(result.train, rank - 1))
        rows.append(row)
    return rows


def run_scenario(s: Scenario) -> list[dict[str, Any]]:
    """The rows of one scenario: its best configurations, or one row saying why there are
    none (``status`` "nothing fits" or "error", ``reason`` one line). Never raises."""
    base = _scenario_fields(s)
    try:
        result = _search(s)
    except SpecError as err:
        return [{**base, "status": "error", "reason": str(err), "rank": 1}]
    except Exception as err:  # noqa: BLE001 - one broken scenario must not end a long sweep
        return [{**base, "status": "error", "rank": 1,
                 "reason": f"internal error: {type(err).__name__}: {err}"}]
    counts = {"evaluated": result.evaluated, "feasible": result.feasible}
    if not result.fits_any:
        return [{**base, **counts, "status": "nothing fits", "rank": 1,
                 "reason": result.why_nothing_fits()}]
    return [{**base, **counts, **row} for row in _ranked_rows(s, result)]


def run_batch(scenarios: list[Scenario]) -> list[dict[str, Any]]:
    """The rows of a batch of scenarios (one Dask task)."""
    return [row for s in scenarios for row in run_scenario(s)]


def _batches(items: list[Scenario], size: int) -> Iterator[list[Scenario]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def _probe(pending: list[Scenario], emit: Callable[[list[dict]], None]) -> float:
    """Run the first two scenarios here; return the faster one's wall time [s] (the first
    search of a process also pays for warming caches)."""
    times = []
    for s in pending[:2]:
        t0 = time.perf_counter()
        emit(run_scenario(s))
        times.append(time.perf_counter() - t0)
    return min(times) if times else 1.0


def batch_size(seconds_per_scenario: float, scenarios: int, workers: int) -> int:
    """Scenarios per task: about :data:`TASK_TARGET_S` of work, but at least two tasks per
    worker so that none idles while another finishes a long batch."""
    by_time = max(1, int(TASK_TARGET_S / max(seconds_per_scenario, 1e-6)))
    by_spread = max(1, math.ceil(scenarios / (2 * max(workers, 1))))
    return min(by_time, by_spread)


def _run_dask(client: Client, pending: list[Scenario], emit: Callable[[list[dict]], None]
              ) -> None:
    """Probe, then send the rest in batches, keeping a bounded number of tasks in flight."""
    done = min(2, len(pending))
    per_scenario_s = _probe(pending, emit)
    workers = max(1, sum(client.nthreads().values()))
    size = batch_size(per_scenario_s, len(pending) - done, workers)
    batches = _batches(pending[done:], size)
    first = [client.submit(run_batch, b, pure=False)
             for b in islice(batches, workers * IN_FLIGHT_PER_WORKER)]
    queue = as_completed(first)
    for future in queue:
        emit(future.result())
        future.release()
        nxt = next(batches, None)
        if nxt is not None:
            queue.add(client.submit(run_batch, nxt, pure=False))


@contextmanager
def _dask_client(client: Client | str | None, workers: int | None) -> Iterator[Client]:
    """The caller's client, a client of the scheduler at an address, or a LocalCluster of
    ``workers`` single-threaded processes started here and closed afterwards."""
    if isinstance(client, Client):
        yield client
        return
    if isinstance(client, str):
        try:
            own = Client(client, timeout="20s")
        except (OSError, TimeoutError) as err:
            raise SpecError(f"cannot reach the Dask scheduler at {client}: {err}") from None
        with own:
            yield own
        return
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as own:
        yield own


def _progress(enabled: bool, total: int) -> tuple[Progress, Any]:
    bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("scenarios"), TimeRemainingColumn(),
                   console=Console(stderr=True), disable=not enabled, transient=False)
    return bar, bar.add_task("sweep", total=total)


def sweep(
    spec: str | Path | dict | SweepSpec,
    client: Client | str | None = None,
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    yes: bool = False,
    progress: bool = False,
    max_scenarios: int = MAX_SCENARIOS,
) -> pd.DataFrame:
    """Run every scenario of ``spec`` and return one row per scenario (and rank).

    Parameters
    ----------
    spec
        A :class:`sweep.spec.SweepSpec`, a dict of its fields or a TOML path.
    client
        A ``distributed.Client``, a scheduler address (``"tcp://host:8786"``), or None for a
        LocalCluster of ``workers`` processes (see the module's docstring).
    out
        Parquet file: finished rows are written as they come and the scenarios it already
        holds are skipped (a stopped sweep resumes). None: nothing is written.
    workers
        Worker processes of the LocalCluster (None: one per core); 0 runs in this process.
    yes, max_scenarios
        Run a sweep of more than ``max_scenarios`` scenarios (else SpecError).
    progress
        Show a progress bar on stderr.

    Returns
    -------
    pandas.DataFrame
        The columns of :data:`sweep.store.COLUMNS`, one column per override key, sorted by
        ``scenario_id`` and ``rank``; with ``out``, the rows of earlier runs included.

    Raises
    ------
    SpecError
        A bad spec (before any search runs), an unreadable ``out``, an unreachable scheduler.
    """
    spec = load_sweep_spec(spec)
    check_spec(spec, yes=yes, max_scenarios=max_scenarios)
    if workers is not None and (workers < 0 or client is not None):
        raise SpecError(f"workers = {workers}: expected a count >= 0 of local worker processes "
                        "(not with a client or scheduler address)")
    store = ResultStore(out)
    previous = store.previous()
    seen = set(previous["scenario_id"])
    pending = [s for s in spec.scenarios() if s.id not in seen]
    bar, task = _progress(progress and bool(pending), len(pending))

    def emit(rows: list[dict[str, Any]]) -> None:
        store.add(rows)
        bar.advance(task, len({r["scenario_id"] for r in rows}))

    try:
        with bar:
            _execute(pending, client, workers, emit)
    finally:
        new = store.new_rows()
    table = typed(pd.concat([previous, new], ignore_index=True)) if len(previous) else new
    store.finish(table)
    return table


def _execute(pending: list[Scenario], client: Client | str | None, workers: int | None,
             emit: Callable[[list[dict]], None]) -> None:
    """Run ``pending`` here (``workers=0``, or no more than the probe's two scenarios), or
    on Dask."""
    if workers == 0 or len(pending) <= 2:
        for s in pending:
            emit(run_scenario(s))
        return
    with _dask_client(client, workers) as c:
        _run_dask(c, pending, emit)
