"""The whole run: time to train, GPU-hours, energy, cost, interruptions, checkpoints, goodput.

:func:`run_settings` gathers, once per search, what does not depend on the layout (the number
of steps, the checkpoint's size, the cluster's failure rate, storage, power and price, each
with its documented default); :func:`train_run` composes the terms of
:mod:`perfmodel.run.failures`, :mod:`perfmodel.run.checkpoint` and :mod:`perfmodel.run.energy`
over arrays of configurations (step time, GPUs, staged bytes, busy share), in this order:

1. failure-free training time = steps x step time;
2. the job's interruption rate = rate per GPU-hour x GPUs; its mean time between unexpected
   interruptions ``M``;
3. the blocking checkpoint cost ``delta`` (sync: the storage write; async: the copy to host);
4. the interval: Daly's optimum (Young's to first order), whole steps, and no shorter than the
   background write in async mode;
5. restart (relaunch + load) and the work lost per unexpected interruption;
6. the expected wall time, hence days, GPU-hours, interruptions, goodput, energy and cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from perfmodel.memory.breakdown import state_bytes_per_param
from perfmodel.run import checkpoint as ck
from perfmodel.run import energy as en
from perfmodel.run import failures as fl
from perfmodel.spec.specs import ClusterSpec, ModelSpec, SpecError, TrainingSpec

__all__ = ["RunSettings", "TrainRun", "run_settings", "train_run", "train_steps_for"]

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class RunSettings:
    """What the run's terms need beyond one configuration's step (SI units)."""

    train_steps: int
    tokens_per_step: int
    checkpoint_bytes: float
    interruptions_per_gpu_hour: float
    unexpected_fraction: float
    gpus_per_node: int
    #: aggregate storage bandwidth [bytes/s]; None: STORAGE_WRITE_BYTES_PER_S_PER_NODE x nodes
    storage_bytes_per_s: float | None
    checkpoint_mode: str = "sync"
    host_copy_bytes_per_s: float = ck.HOST_COPY_BYTES_PER_S
    relaunch_s: float = ck.RELAUNCH_S
    tdp_w: float | None = None
    idle_power_fraction: float = en.IDLE_POWER_FRACTION
    node_other_w_per_gpu: float = en.NODE_OTHER_W_PER_GPU
    pue: float = en.PUE
    gpu_hour_price: float | None = None
    interval: str = "daly"  # or "young"

    def storage_for(self, gpus) -> np.ndarray:
        """Storage bandwidth the job sees [bytes/s]: the cluster's aggregate tier, or the
        per-node default times the job's nodes."""
        if self.storage_bytes_per_s is not None:
            return np.broadcast_to(float(self.storage_bytes_per_s), np.shape(gpus)).astype(float)
        nodes = np.ceil(np.asarray(gpus, dtype=float) / self.gpus_per_node)
        return nodes * ck.STORAGE_WRITE_BYTES_PER_S_PER_NODE


@dataclass(frozen=True)
class TrainRun:
    """The run's predictions, one entry per configuration (arrays, SI units; cost in the
    price's currency, NaN without a price; energy NaN without the GPU's TDP)."""

    train_steps: np.ndarray
    train_tokens: np.ndarray
    useful_s: np.ndarray
    wall_s: np.ndarray
    days: np.ndarray
    gpu_hours: np.ndarray
    energy_mwh: np.ndarray
    cost: np.ndarray
    expected_interruptions: np.ndarray
    mtbf_s: np.ndarray
    checkpoint_bytes: np.ndarray
    checkpoint_s: np.ndarray
    checkpoint_write_s: np.ndarray
    checkpoint_interval_s: np.ndarray
    checkpoint_interval_steps: np.ndarray
    restart_s: np.ndarray
    lost_work_s: np.ndarray
    gpu_power_w: np.ndarray
    goodput: np.ndarray

    def row(self, i: int = 0) -> dict[str, float | None]:
        """One configuration as a JSON-able dict (the CLI's ``train`` object); what cannot be
        computed (cost without a price, energy without a TDP) is None."""
        out = {f.name: float(np.asarray(getattr(self, f.name))[i]) for f in fields(self)}
        return {k: None if math.isnan(v) else v for k, v in out.items()}

    def to_dict(self) -> dict[str, float | None]:
        """The first configuration (the best of a search) as a dict: :meth:`row` of 0."""
        return self.row(0)

    def to_dataframe(self):
        """A pandas DataFrame, one row per configuration."""
        import pandas as pd

        return pd.DataFrame({f.name: np.atleast_1d(getattr(self, f.name)) for f in fields(self)})


def train_steps_for(train_tokens: float | None, train_steps: int | None,
                    tokens_per_step: int) -> int:
    """Steps of the run: ``train_steps``, or ``ceil(train_tokens / tokens_per_step)``; exactly
    one of the two must be given (SpecError otherwise)."""
    if (train_tokens is None) == (train_steps is None):
        raise SpecError("give exactly one of train_tokens or train_steps "
                        f"(got train_tokens={train_tokens}, train_steps={train_steps})")
    if train_steps is not None:
        if isinstance(train_steps, bool) or int(train_steps) != train_steps or train_steps < 1:
            raise SpecError(f"train_steps = {train_steps!r}: expected a positive integer")
        return int(train_steps)
    if not (isinstance(train_tokens, (int, float)) and math.isfinite(train_tokens)
            and train_tokens > 0):
        raise SpecError(f"train_tokens = {train_tokens!r}: expected a positive number")
    return max(1, math.ceil(train_tokens / tokens_per_step))


def run_settings(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, *,
                 train_tokens: float | None = None, train_steps: int | None = None,
                 gpu_hour_price: float | None = None, checkpoint_mode: str = "sync"
                 ) -> RunSettings:
    """The :class:`RunSettings` of a model, training setup and cluster: the checkpoint is the
    model's parameters x (weight + optimizer state) bytes per parameter of the precision and
    optimizer (:func:`perfmodel.memory.breakdown.state_bytes_per_param`); the cluster's optional fields
    override the defaults of :mod:`perfmodel.run`; ``gpu_hour_price`` overrides the cluster's."""
    if checkpoint_mode not in ck.MODES:
        raise SpecError(f"checkpoint_mode = {checkpoint_mode!r}: expected one of "
                        f"{', '.join(ck.MODES)}")
    if gpu_hour_price is not None and not (isinstance(gpu_hour_price, (int, float))
                                           and math.isfinite(gpu_hour_price)
                                           and gpu_hour_price > 0):
        raise SpecError(f"gpu_hour_price = {gpu_hour_price!r}: expected a positive number")
    tps = training.tokens_per_step
    w, _, o = state_bytes_per_param(training.precision, training.optimizer)
    c = cluster
    storage = (None if c.storage_write_gbyte_per_s is None
               else c.storage_write_gbyte_per_s * 1e9)
    return RunSettings(
        train_steps=train_steps_for(train_tokens, train_steps, tps),
        tokens_per_step=tps,
        checkpoint_bytes=float(ck.checkpoint_bytes(model.param_count(), w, o)),
        interruptions_per_gpu_hour=(c.interruptions_per_gpu_hour
                                    or fl.INTERRUPTIONS_PER_GPU_HOUR),
        unexpected_fraction=fl.UNEXPECTED_FRACTION,
        gpus_per_node=c.gpus_per_node,
        storage_bytes_per_s=storage,
        checkpoint_mode=checkpoint_mode,
        tdp_w=c.gpu.tdp_w,
        node_other_w_per_gpu=(en.NODE_OTHER_W_PER_GPU if c.node_other_w_per_gpu is None
                              else c.node_other_w_per_gpu),
        pue=en.PUE if c.pue is None else c.pue,
        gpu_hour_price=gpu_hour_price if gpu_hour_price is not None else c.gpu_hour_price,
    )


def _interval_s(s: RunSettings, step_s, delta_s, mtbf_s, persist_s):
    """Step 4: the optimum interval in whole steps, not below the async background write."""
    opt = (ck.young_interval_s if s.interval == "young" else ck.daly_interval_s)(delta_s, mtbf_s)
    opt = np.maximum(opt, persist_s)
    steps = np.maximum(1.0, np.round(opt / step_s))
    return steps * step_s, steps


def train_run(settings: RunSettings, step_time_s, gpus, staged_bytes_per_gpu=0.0,
              busy_fraction=1.0) -> TrainRun:
    """Whole-run predictions for configurations of one search (see the module docstring).

    Parameters
    ----------
    settings : RunSettings
        From :func:`run_settings`.
    step_time_s : array_like
        Failure-free step time [s] (``perfmodel.step.evaluate.evaluate``).
    gpus : array_like
        GPUs of each configuration [count].
    staged_bytes_per_gpu : array_like
        Weights + optimizer states on one GPU [bytes] (async checkpoints).
    busy_fraction : array_like
        Share of the step the GPU computes (its power, :func:`perfmodel.run.energy.gpu_power_w`).

    Returns
    -------
    TrainRun
    """
    s = settings
    step = np.asarray(step_time_s, dtype=float)
    n = np.asarray(gpus, dtype=float)
    useful = s.train_steps * step                                            # 1
    lam = fl.interruptions_per_s(s.interruptions_per_gpu_hour, n)            # 2
    mtbf = 1.0 / (lam * s.unexpected_fraction)
    storage = s.storage_for(n)
    write = s.checkpoint_bytes / storage                                     # 3
    delta = ck.blocking_checkpoint_s(s.checkpoint_mode, s.checkpoint_bytes, storage,
                                     staged_bytes_per_gpu, s.host_copy_bytes_per_s)
    persist = write if s.checkpoint_mode == "async" else np.zeros_like(write)
    tau, tau_steps = _interval_s(s, step, delta, mtbf, persist)              # 4
    restart = ck.restart_s(s.checkpoint_bytes, storage, s.relaunch_s)        # 5
    lost = ck.lost_work_s(tau, delta, persist)
    wall = ck.expected_wall_s(useful, tau, delta, restart, lost, lam,        # 6
                              s.unexpected_fraction)
    power = (en.gpu_power_w(s.tdp_w, busy_fraction, s.idle_power_fraction)
             if s.tdp_w is not None else np.full_like(step, np.nan))
    hours = en.gpu_hours(n, wall)
    shape = np.broadcast(step, n).shape
    out = {
        "train_steps": float(s.train_steps),
        "train_tokens": float(s.train_steps) * s.tokens_per_step,
        "useful_s": useful, "wall_s": wall, "days": wall / SECONDS_PER_DAY, "gpu_hours": hours,
        "energy_mwh": en.energy_j(n, wall, power, s.node_other_w_per_gpu, s.pue)
        / en.JOULES_PER_MWH,
        "cost": en.cost(hours, s.gpu_hour_price),
        "expected_interruptions": fl.expected_interruptions(s.interruptions_per_gpu_hour, n,
                                                            wall),
        "mtbf_s": mtbf, "checkpoint_bytes": s.checkpoint_bytes, "checkpoint_s": delta,
        "checkpoint_write_s": write, "checkpoint_interval_s": tau,
        "checkpoint_interval_steps": tau_steps, "restart_s": restart, "lost_work_s": lost,
        "gpu_power_w": power, "goodput": useful / wall,
    }
    return TrainRun(**{k: np.broadcast_to(np.asarray(v, dtype=float), shape).copy()
                       for k, v in out.items()})
