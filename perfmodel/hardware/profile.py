"""Efficiency profiles: a handful of named, bounded corrections fitted to one cluster's runs.

The cost model predicts from datasheets and one GPU's kernel measurements. A real cluster
differs in ways the datasheet does not say: sustained clocks under its power limit, the kernel
library of its framework release, the bus bandwidth NCCL achieves on its fabric, the host work of
its training loop. An :class:`EfficiencyProfile` holds one number for each of these, each with a
physical meaning and bounds; ``plan calibrate`` fits them to a few measured runs
(:mod:`validation.calibrate`) and ``plan --profile`` applies them.

The profile is applied at three hook points that do not depend on how the time model composes
its terms:

* kernel rates: the GPU's :class:`~perfmodel.hardware.calibration.Calibration` with its GEMM efficiency
  scaled (``gemm_16bit`` or ``gemm_fp8``, by the run's precision), its flash-attention rate
  scaled by ``gemm_16bit`` (attention runs in 16 bit under every FP8 recipe) and its memory-bound
  bandwidths scaled by ``membw`` (:meth:`EfficiencyProfile.calibration`);
* link bandwidths: the cluster with its innermost (scale-up, NVLink) tier's bandwidth times
  ``scale_up_bw`` and every outer (scale-out) tier's times ``scale_out_bw``
  (:meth:`EfficiencyProfile.cluster`);
* host time: ``step_overhead_ms`` added to every step (optimizer launch, gradient-norm and
  loss synchronisation, logging, data loading that the loop does not hide), reported as the
  ``host`` time term (:func:`evaluate`).

A profile of neutral values (every scale 1, no overhead) leaves every prediction exactly as the
uncalibrated model gives it.

A profile written by ``plan calibrate`` also carries the out-of-sample residuals of its runs
(:class:`RunResidual`: each run predicted by the profile refitted without it) and the in-sample
and leave-one-out MAPE; ``plan --profile`` takes the 80 % interval of a prediction from them
where they cover its neighbourhood (:mod:`search.intervals`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from perfmodel.core.errors import SpecError
from perfmodel.hardware.calibration import Calibration
from perfmodel.spec.specs import ClusterSpec, Spec, build_spec, resolve_spec

__all__ = [
    "LOW_PRECISIONS",
    "NEUTRAL",
    "PARAMETERS",
    "EfficiencyProfile",
    "Parameter",
    "RunResidual",
    "load_profile",
    "profile_toml",
]

LOW_PRECISIONS = ("fp8", "fp4")


@dataclass(frozen=True)
class Parameter:
    """One profile parameter: its neutral value, bounds, how it is fitted, what it means and
    which runs inform it."""

    name: str
    neutral: float
    lo: float
    hi: float
    log: bool  # fitted as log(value) (a scale) or as the value (an additive time)
    unit: str
    meaning: str
    informed_by: str  # what a run must vary for this parameter to show


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("gemm_16bit", 1.0, 0.5, 1.5, True, "x",
              "achieved / modelled tensor-core throughput of 16-bit (bf16, fp16, tf32) GEMMs and "
              "of flash attention (sustained clock under the power limit, kernel library)",
              "runs at 16-bit precision whose step is mostly GEMMs"),
    Parameter("gemm_fp8", 1.0, 0.5, 1.5, True, "x",
              "achieved / modelled throughput of fp8 / fp4 GEMMs (the recipe's scaling and "
              "casts, the GEMM kernels of the release)",
              "runs at fp8 (or fp4) precision"),
    Parameter("membw", 1.0, 0.5, 1.5, True, "x",
              "achieved / modelled bandwidth of memory-bound kernels (norms, activations, "
              "dropout, casts, cross-entropy, the optimizer step): kernel fusion of the release",
              "runs with a different share of memory-bound work: sequence parallelism on / off, "
              "small hidden size, large vocabulary, short sequences"),
    Parameter("scale_up_bw", 1.0, 0.25, 2.0, True, "x",
              "achieved / datasheet bus bandwidth of the scale-up tier (NVLink / NVSwitch): "
              "tensor- and context-parallel collectives, intra-node data-parallel traffic",
              "runs with a different tensor-parallel size, or single-node data parallelism"),
    Parameter("scale_out_bw", 1.0, 0.25, 2.0, True, "x",
              "achieved / datasheet bus bandwidth of the scale-out network (InfiniBand, RoCE, "
              "Ethernet): data-parallel gradient reduction, pipeline sends across nodes",
              "runs on one node and on many nodes, or with a larger data-parallel share"),
    Parameter("step_overhead_ms", 0.0, 0.0, 2000.0, False, "ms",
              "host time per step that the GPU waits for (optimizer launch, gradient-norm and "
              "loss all-reduces, logging, data loading)",
              "runs with short and long steps (small and large global batch or model)"),
)
_BY_NAME = {p.name: p for p in PARAMETERS}


def _field(name: str) -> dict[str, Any]:
    p = _BY_NAME[name]
    return {"default": p.neutral, "ge": p.lo, "le": p.hi, "description": f"[{p.unit}] {p.meaning}"}


class RunResidual(Spec):
    """One calibration run's out-of-sample residual: its measured step time over the time
    predicted by the profile refitted without it (leave-one-out), with the run's
    neighbourhood keys of :mod:`search.intervals` (GPU generation, precision class, kind)."""

    row_id: str
    generation: str
    precision: Literal["16-bit", "fp8"]
    kind: Literal["dense", "moe"]
    ratio: float = Field(gt=0)


class EfficiencyProfile(Spec):
    """Named efficiency corrections of one cluster and software stack (see module docstring).

    ``uncertainty`` holds the one-sigma uncertainty of each fitted parameter, in the
    parameter's own unit; ``fitted_on`` says on which runs it was fitted; ``residuals`` the
    leave-one-out residuals of those runs, ``in_sample_mape`` and ``loo_mape`` the mean
    absolute error of the runs under the profile fitted on all of them and without each.
    """

    name: str = "neutral"
    description: str = ""
    fitted_on: str = ""
    gemm_16bit: float = Field(**_field("gemm_16bit"))
    gemm_fp8: float = Field(**_field("gemm_fp8"))
    membw: float = Field(**_field("membw"))
    scale_up_bw: float = Field(**_field("scale_up_bw"))
    scale_out_bw: float = Field(**_field("scale_out_bw"))
    step_overhead_ms: float = Field(**_field("step_overhead_ms"))
    uncertainty: dict[str, float] = Field(default_factory=dict)
    in_sample_mape: float | None = Field(default=None, ge=0)
    loo_mape: float | None = Field(default=None, ge=0)
    residuals: tuple[RunResidual, ...] = ()

    def values(self) -> dict[str, float]:
        """Parameter name -> value (the fitted parameters of :data:`PARAMETERS`)."""
        return {p.name: float(getattr(self, p.name)) for p in PARAMETERS}

    @property
    def is_neutral(self) -> bool:
        return all(getattr(self, p.name) == p.neutral for p in PARAMETERS)

    def with_values(self, **values: float) -> EfficiencyProfile:
        """A copy with some parameters replaced (validated)."""
        data = self.model_dump()
        data.update(values)
        return build_spec(EfficiencyProfile, data, f"profile '{self.name}'")

    # ---- hook 1: kernel rates -----------------------------------------------------------
    def gemm_scale(self, precision: str) -> float:
        """GEMM throughput scale for a run at ``precision``."""
        return self.gemm_fp8 if precision in LOW_PRECISIONS else self.gemm_16bit

    def calibration(self, cal: Calibration, precision: str) -> Calibration:
        """``cal`` with its GEMM efficiency times :meth:`gemm_scale`, its flash-attention time
        divided by ``gemm_16bit`` and its memory-bound bandwidths times ``membw``."""
        g, a, m = self.gemm_scale(precision), self.gemm_16bit, self.membw
        if g == 1.0 and a == 1.0 and m == 1.0:
            return cal
        att = {k: (ls, t0 / a, rate * a) for k, (ls, t0, rate) in cal.attention_points.items()}
        return _ProfiledCalibration(**{
            **{f.name: getattr(cal, f.name) for f in fields(cal)},
            "name": f"{cal.name}+profile {self.name}",
            "gemm_scale": cal.gemm_scale * g,
            "attention_points": att,
            "membw_bytes_per_s_table": {k: v * m for k, v in cal.membw_bytes_per_s_table.items()},
        })

    # ---- hook 2: link bandwidths --------------------------------------------------------
    def cluster(self, cluster: ClusterSpec) -> ClusterSpec:
        """``cluster`` with the innermost tier's bandwidth times ``scale_up_bw`` and the outer
        tiers' times ``scale_out_bw`` (latencies unchanged)."""
        if self.scale_up_bw == 1.0 and self.scale_out_bw == 1.0:
            return cluster
        tiers = []
        for i, t in enumerate(cluster.tiers):
            s = self.scale_up_bw if i == 0 else self.scale_out_bw
            key = "bw_gbyte_per_s" if t.bw_gbyte_per_s is not None else "bw_gbit_per_s"
            tiers.append(t.model_copy(update={key: getattr(t, key) * s}))
        return cluster.model_copy(update={"tiers": tiers})

    # ---- hook 3: host time --------------------------------------------------------------
    @property
    def step_overhead_s(self) -> float:
        return self.step_overhead_ms * 1e-3


@dataclass(frozen=True, eq=False)
class _ProfiledCalibration(Calibration):
    """A Calibration sharing its base's GEMM interpolators (same measured points, only the
    scale differs), so that applying a profile costs no re-triangulation."""

    def __post_init__(self) -> None:  # _interp is the base's, already built
        pass


NEUTRAL = EfficiencyProfile()


def load_profile(spec: str | Path | EfficiencyProfile | None) -> EfficiencyProfile | None:
    """A profile from a shipped name (``nemo-24.09``), a TOML path, a profile, or None."""
    if spec is None or isinstance(spec, EfficiencyProfile):
        return spec
    name = getattr(spec, "value", spec)
    if not isinstance(name, (str, Path)):
        raise SpecError(f"profile = {spec!r}: expected a profile name or a TOML path")
    data, src = resolve_spec("profile", name)
    data = dict(data)
    data.setdefault("name", Path(str(name)).stem)
    return build_spec(EfficiencyProfile, data, src)


def _toml_value(v: Any) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else "0.0"
    return str(v)


def profile_toml(profile: EfficiencyProfile, header: str = "") -> str:
    """The profile as a TOML file (``load_profile`` reads it back), ``header`` as comments."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    for key in ("name", "description", "fitted_on", "in_sample_mape", "loo_mape"):
        v = getattr(profile, key)
        if v is not None:
            lines.append(f"{key} = {_toml_value(round(v, 5) if isinstance(v, float) else v)}")
    lines.append("")
    for p in PARAMETERS:
        v = float(getattr(profile, p.name))
        lines.append(f"{p.name} = {_toml_value(round(v, 4))}"
                     f"{' ' * max(1, 10 - len(repr(round(v, 4))))}# {p.unit}, "
                     f"[{p.lo:g}, {p.hi:g}], neutral {p.neutral:g}")
    if profile.uncertainty:
        lines.append("")
        lines.append("[uncertainty]  # one sigma, in each parameter's unit")
        for k, v in profile.uncertainty.items():
            lines.append(f"{k} = {_toml_value(round(float(v), 4))}")
    for r in profile.residuals:  # measured / leave-one-out predicted step time of each run
        lines += ["", "[[residuals]]"] + [
            f"{k} = {_toml_value(round(v, 5) if isinstance(v, float) else v)}"
            for k, v in r.model_dump().items()]
    return "\n".join(lines) + "\n"
