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

:func:`train_run_bounds` carries an interval of the step time through the same terms: the run
at the low and at the high step time, the failure rate, checkpoint cost, checkpoint interval in
steps and GPU power taken as given (:data:`BOUNDED` are the figures that get bounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from perfmodel.core.frames import data_frame
from perfmodel.memory.breakdown import state_bytes_per_param
from perfmodel.run import checkpoint as ck
from perfmodel.run import energy as en
from perfmodel.run import failures as fl
from perfmodel.spec.specs import ClusterSpec, ModelSpec, SpecError, TrainingSpec

__all__ = ["BOUNDED", "RunSettings", "TrainRun", "run_settings", "train_run", "train_run_bounds",
           "train_steps_for"]

SECONDS_PER_DAY = 86_400.0

#: The run figures that follow the step time and carry its interval (:func:`train_run_bounds`).
BOUNDED = ("wall_s", "days", "gpu_hours", "energy_mwh", "cost", "goodput")


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
    #: [low, high] of each :data:`BOUNDED` figure (arrays n x 2) when the step time carries an
    #: interval (:func:`train_run_bounds`), else empty
    bounds: dict[str, np.ndarray] = field(default_factory=dict)

    def figures(self) -> tuple[str, ...]:
        """The names of the per-configuration figures (every field but :attr:`bounds`)."""
        return tuple(f.name for f in fields(self) if f.name != "bounds")

    def columns(self) -> dict[str, np.ndarray]:
        """Every figure as a column, then ``<figure>_low`` / ``<figure>_high`` of the bounded
        ones."""
        out = {k: np.atleast_1d(getattr(self, k)) for k in self.figures()}
        for k, b in self.bounds.items():
            out[f"{k}_low"], out[f"{k}_high"] = b[:, 0], b[:, 1]
        return out

    def row(self, i: int = 0) -> dict[str, Any]:
        """One configuration as a JSON-able dict (the CLI's ``train`` object), with
        ``<figure>_interval`` [low, high] of the bounded figures; what cannot be computed (cost
        without a price, energy without a TDP) is None."""
        out = {k: float(np.asarray(getattr(self, k))[i]) for k in self.figures()}
        row: dict[str, Any] = {k: None if math.isnan(v) else v for k, v in out.items()}
        for k, b in self.bounds.items():
            lo, hi = (float(v) for v in b[i])
            row[f"{k}_interval"] = None if math.isnan(lo) or math.isnan(hi) else [lo, hi]
        return row

    def to_dict(self) -> dict[str, Any]:
        """The first configuration (the best of a search) as a dict: :meth:`row` of 0."""
        return self.row(0)

    def to_dataframe(self):
        """A pandas DataFrame, one row per configuration."""
        return data_frame(self.columns())


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
              busy_fraction=1.0, interval_steps=None) -> TrainRun:
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
    interval_steps : array_like, optional
        Steps between checkpoints, when fixed beforehand (:func:`train_run_bounds`); None: the
        optimum of step 4.

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
    tau, tau_steps = (_interval_s(s, step, delta, mtbf, persist) if interval_steps is None  # 4
                      else (np.asarray(interval_steps, dtype=float) * step,
                            np.asarray(interval_steps, dtype=float)))
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


def train_run_bounds(settings: RunSettings, step_time_s, step_low_s, step_high_s, gpus,
                     staged_bytes_per_gpu=0.0, busy_fraction=1.0) -> TrainRun:
    """:func:`train_run` at ``step_time_s`` with the [low, high] bounds of each
    :data:`BOUNDED` figure for a step time between ``step_low_s`` and ``step_high_s``.

    The bounds are the run's own terms at the two ends of the step time's interval, not a
    scaling of the point: the failure-free time, the checkpoint interval in seconds, the work
    an interruption loses and the interruptions over the longer or shorter wall time all follow
    the step time. Taken as given: the failure rate, the checkpoint's cost and the interval in
    steps chosen for the predicted step time (a run is launched with its save interval in
    steps), and the GPU's power. With the interval in steps fixed, the wall time
    ``T (1 + delta / tau) / (1 - lambda (R + f_u L))`` grows with the step time (``T``,
    ``tau = k t`` and ``L`` all do), hence days, GPU-hours, energy and cost: their bounds are
    the ends'. Goodput ``T / W`` first rises, then falls with the step time (the checkpoint's
    share shrinks, the lost work grows): its bounds are taken over the ends and its maximum
    ``t* = sqrt(D^2 + A D / B) - D`` where it falls inside (``D = delta / k``,
    ``A = 1 - lambda (R + f_u (delta / 2 + persist))``, ``B = lambda f_u k / 2``).

    Parameters
    ----------
    settings, gpus, staged_bytes_per_gpu, busy_fraction :
        As :func:`train_run`.
    step_time_s, step_low_s, step_high_s : array_like
        The predicted step time and the ends of its interval [s].

    Returns
    -------
    TrainRun
        The point's run, with :attr:`TrainRun.bounds`. Example: 10 s steps within [9, 12] s on
        the case of ``train_run``'s test (141 steps between checkpoints): wall time
        10,205.6 s, bounds 9,185.7 s and 12,249.9 s (hand computation in the unit test).

    References
    ----------
    Young 1974 and Daly 2006 (the terms, :mod:`perfmodel.run.checkpoint`); Lei et al. 2018,
    JASA 113(523) (a monotone function of a conformal interval's variable is covered at the
    same level by the function's values at the ends).
    """
    point = train_run(settings, step_time_s, gpus, staged_bytes_per_gpu, busy_fraction)
    k = point.checkpoint_interval_steps
    ends = [train_run(settings, t, gpus, staged_bytes_per_gpu, busy_fraction, k)
            for t in (step_low_s, step_high_s)]
    lo_s = np.minimum(step_low_s, step_high_s)
    hi_s = np.maximum(step_low_s, step_high_s)
    peak = _goodput_peak_s(settings, point, gpus, k)
    top = np.clip(np.where(np.isfinite(peak), peak, hi_s), lo_s, hi_s)
    inner = train_run(settings, top, gpus, staged_bytes_per_gpu, busy_fraction, k)
    bounds = {}
    for name in BOUNDED:
        lo, hi = (np.asarray(getattr(e, name), dtype=float) for e in ends)
        vals = np.stack([lo, hi] + ([inner.goodput] if name == "goodput" else []))
        bounds[name] = np.stack([vals.min(0), vals.max(0)], axis=-1)
    return replace(point, bounds=bounds)


def _goodput_peak_s(s: RunSettings, point: TrainRun, gpus, k) -> np.ndarray:
    """The step time at which goodput peaks for ``k`` steps between checkpoints (the terms of
    ``point``, :func:`train_run_bounds`)."""
    lam = fl.interruptions_per_s(s.interruptions_per_gpu_hour, gpus)
    persist = point.checkpoint_write_s if s.checkpoint_mode == "async" else 0.0
    d = point.checkpoint_s / k
    a = 1.0 - lam * (point.restart_s + s.unexpected_fraction * (0.5 * point.checkpoint_s
                                                                 + persist))
    b = lam * s.unexpected_fraction * k / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(d * d + np.maximum(a, 0.0) * d / b) - d
