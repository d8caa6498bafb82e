"""The run section of a search: time to train, cost, energy and goodput of the reported
configurations (:mod:`perfmodel.run`), for the API's ``result.train`` and the CLI's report.

``run_settings_for(space, ...)`` binds the whole-run settings to a search's specs;
``attach_train(result, problem)`` adds ``result.train`` (a :class:`perfmodel.run.TrainRun`
over ``result.rows``, best first); ``run_lines(result)`` are the report's lines.

Where the rows carry the step time's 80 % interval (``step_time_interval_s``), the run figures
carry one too: the run's terms at both ends of it (:func:`perfmodel.run.train_run_bounds`),
and the interval's basis line says so (:data:`RUN_INTERVAL_BASIS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from perfmodel.core import units
from perfmodel.run import RunSettings, TrainRun, run_settings, train_run, train_run_bounds
from perfmodel.spec.specs import SpecError

__all__ = ["RUN_INTERVAL_BASIS", "attach_train", "run_lines", "run_settings_for",
           "train_of_rows"]

#: What the run figures' intervals rest on (appended to the step time's basis line).
RUN_INTERVAL_BASIS = ("the run figures' intervals are the run at both ends of it (failure rate, "
                      "checkpoint cost and interval in steps taken as given)")


def run_settings_for(space: Any, train_tokens: float | None, train_steps: int | None,
                     gpu_hour_price: float | None, checkpoint_mode: str | None
                     ) -> RunSettings | None:
    """The run's settings for a search's specs; None when neither length is given (and no
    price or checkpoint mode either, which need one: SpecError)."""
    if train_tokens is None and train_steps is None:
        if gpu_hour_price is not None or checkpoint_mode is not None:
            raise SpecError("gpu_hour_price and checkpoint_mode price the whole run: give "
                            "train_tokens or train_steps as well")
        return None
    return run_settings(space.model, space.training, space.cluster, train_tokens=train_tokens,
                        train_steps=train_steps, gpu_hour_price=gpu_hour_price,
                        checkpoint_mode=checkpoint_mode or "sync")


def train_of_rows(settings: RunSettings, rows: list[dict[str, Any]]) -> TrainRun:
    """:func:`perfmodel.run.train_run` of JSON rows (``SearchResult.rows``): their step time,
    GPUs, staged weights + optimizer bytes and compute share of the step."""
    step = np.array([r["step_time_s"] for r in rows], dtype=float)
    gpus = np.array([r["gpus"] for r in rows], dtype=float)
    staged = np.array([r["memory_bytes"].get("weights", 0.0)
                       + r["memory_bytes"].get("optimizer", 0.0) for r in rows])
    compute = np.array([r["time_s"].get("compute", r["step_time_s"]) for r in rows])
    if all(r.get("step_time_interval_s") for r in rows):
        low, high = np.array([r["step_time_interval_s"] for r in rows], dtype=float).T
        return train_run_bounds(settings, step, low, high, gpus, staged, compute / step)
    return train_run(settings, step, gpus, staged, compute / step)


def attach_train(result: Any, problem: Any) -> Any:
    """``result`` with ``train`` set when the problem carries run settings (and, when the run
    figures carry intervals, the interval's basis line saying what they rest on)."""
    if getattr(problem, "run", None) is None or not result.rows:
        return result
    train = train_of_rows(problem.run, result.rows)
    setup = result.setup
    if train.bounds and setup.get("interval"):
        setup = setup | {"interval": f"{setup['interval']}; {RUN_INTERVAL_BASIS}"}
    return dataclasses.replace(result, train=train, setup=setup)


def _money(v: float | None) -> str:
    return "no price (--gpu-hour-price)" if v is None else f"{v:,.0f}"


def _duration(s: float) -> str:
    """Seconds as seconds, minutes or hours, whichever reads best."""
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return units.fmt_seconds(s)


def _percent(v: float) -> str:
    return f"{v * 100:.1f}"


def _range(r: dict[str, Any], name: str, fmt: Any, sep: str = "") -> str:
    """`` (49.8-58.7)``: the bounds of figure ``name`` of a run row in ``fmt`` ('' without
    them); ``sep`` closes the parenthesis with more text (``"; "``) or not."""
    iv = r.get(f"{name}_interval")
    if not iv:
        return f" ({sep.removeprefix('; ')}" if sep else ""
    return f" ({fmt(iv[0])}-{fmt(iv[1])}{sep}" + ("" if sep else ")")


def run_lines(result: Any) -> list[str]:
    """The report's run section for the best configuration (plain text lines); each figure
    that carries an interval is followed by it, as the step time is: ``54.0 days
    (49.8-58.7)``."""
    t = getattr(result, "train", None)
    if t is None:
        return []
    r = t.row(0)
    energy = ("no TDP in the GPU spec" if r["energy_mwh"] is None else
              f"{r['energy_mwh']:,.0f} MWh"
              f"{_range(r, 'energy_mwh', '{:,.0f}'.format, '; ')}GPU "
              f"{r['gpu_power_w']:.0f} W + node and site)")
    cost = ("no price (--gpu-hour-price)" if r["cost"] is None else
            f"{r['cost']:,.0f}{_range(r, 'cost', '{:,.0f}'.format)}")
    head = (f"run: {units.fmt_count(r['train_tokens'])} tokens in {r['train_steps']:,.0f} "
            f"steps: {r['days']:.1f} days{_range(r, 'days', '{:.1f}'.format)}, "
            f"{units.fmt_count(r['gpu_hours'])} GPU-hours"
            f"{_range(r, 'gpu_hours', units.fmt_count)}, energy {energy}, cost {cost}")
    every = r["wall_s"] / max(r["expected_interruptions"], 1e-12)
    failures = (f"  goodput {r['goodput']:.1%}{_range(r, 'goodput', _percent)} "
                f"(failure-free {r['useful_s'] / 86_400:.1f} "
                f"days); expected interruptions {r['expected_interruptions']:,.0f} (one every "
                f"{_duration(every)})")
    ckpt = (f"  checkpoint {units.fmt_bytes(r['checkpoint_bytes'])} every "
            f"{r['checkpoint_interval_steps']:,.0f} steps "
            f"({_duration(r['checkpoint_interval_s'])}), blocking "
            f"{units.fmt_seconds(r['checkpoint_s'])}; restart {_duration(r['restart_s'])}"
            f", lost work {_duration(r['lost_work_s'])} per unexpected interruption")
    return [head, failures, ckpt]
