"""What a sweep runs: a TOML file of lists whose cartesian product is the set of scenarios.

```toml
models = ["llama3.1-8b", "llama3.1-70b"]
clusters = ["dgx-h100", "dgx-b200"]
gpus = [64, 128, 256]
global_batch = [512, 1024]
seq_len = [4096, 8192]
precision = ["bf16", "fp8"]          # optional; so are framework, strategy, objective
top = 1                              # configurations kept per scenario (rank 1 is the best)
train_tokens = 15e12                 # optional: adds the run figures (days, GPU-hours)

[overrides]                          # hardware fields of the cluster preset, each a list
"gpu.hbm_gib" = [80, 141, 192]
"cluster.tiers.1.bw_gbit_per_s" = [400, 800]
```

A scenario is one element of the product; its :attr:`Scenario.id` is a hash of its parameters,
so the same scenario has the same id in every run (which is what makes a sweep resumable).
:func:`check_spec` refuses a bad spec with one line (:class:`SpecError`) before any work: an
unknown key, an empty list, a preset or override that does not exist, or more scenarios than
``max_scenarios`` unless the caller confirms.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from perfmodel.spec.frameworks import load_framework
from perfmodel.spec.specs import (
    ClusterSpec,
    SpecError,
    format_validation_error,
    load_cluster,
    load_model,
    load_training,
    read_toml,
)

__all__ = [
    "MAX_SCENARIOS",
    "OVERRIDE_PREFIXES",
    "Scenario",
    "SweepSpec",
    "apply_overrides",
    "check_spec",
    "load_sweep_spec",
    "scenario_cluster",
]

#: More scenarios than this need an explicit confirmation (``--yes``, ``yes=True``): at a
#: fraction of a second to a few seconds of search each, 10^5 scenarios are a day of one core.
MAX_SCENARIOS = 100_000

#: Where an override key points: ``gpu.<field>`` is a field of the cluster's GPU,
#: ``cluster.<field>`` one of the cluster (``cluster.tiers.1.bw_gbit_per_s``: the second tier).
OVERRIDE_PREFIXES = ("gpu", "cluster")

#: The two ways to give a tier's bandwidth (perfmodel.spec.specs.LinkTier): setting one clears the other.
_BANDWIDTH_KEYS = ("bw_gbyte_per_s", "bw_gbit_per_s")

PosInt = Annotated[int, Field(gt=0)]
Number = int | float
Strategy = Literal["grid", "dp", "nsga2", "ga"]
Objective = Literal["time", "memory", "cost"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _nonempty(name: str, v: Any) -> Any:
    if isinstance(v, (list, tuple)) and len(v) == 0:
        raise ValueError(f"{name} is an empty list: give at least one value")
    return v if isinstance(v, (list, tuple)) else [v]


class SweepSpec(_Frozen):
    """Lists of scenario parameters (a single value stands for a one-element list)."""

    models: tuple[str, ...] = Field(min_length=1)
    clusters: tuple[str, ...] = Field(min_length=1)
    gpus: tuple[PosInt, ...] = Field(min_length=1)
    global_batch: tuple[PosInt, ...] = Field(min_length=1)
    seq_len: tuple[PosInt, ...] = Field(min_length=1)
    precision: tuple[str | None, ...] = (None,)
    framework: tuple[str | None, ...] = (None,)
    strategy: tuple[Strategy, ...] = Field(default=("grid",), min_length=1)
    objective: tuple[Objective, ...] = Field(default=("time",), min_length=1)
    top: Annotated[int, Field(ge=1, le=100)] = 1
    train_tokens: Annotated[float, Field(gt=0)] | None = None
    overrides: dict[str, tuple[Number, ...]] = Field(default_factory=dict)

    @field_validator("models", "clusters", "gpus", "global_batch", "seq_len", "precision",
                     "framework", "strategy", "objective", mode="before")
    @classmethod
    def _as_list(cls, v: Any, info: Any) -> Any:
        return _nonempty(info.field_name, v)

    @field_validator("overrides", mode="before")
    @classmethod
    def _flat_overrides(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        flat = _flatten(v)
        for key, values in flat.items():
            _check_override_key(key)
            flat[key] = _nonempty(f"overrides '{key}'", values)
            if any(isinstance(x, bool) for x in flat[key]):
                raise ValueError(f"overrides '{key}' = {flat[key]!r}: expected numbers")
        return flat

    @property
    def dims(self) -> dict[str, tuple[Any, ...]]:
        """The product's axes in a fixed order: scenario fields, then the override keys."""
        return {"model": self.models, "cluster": self.clusters, "gpus": self.gpus,
                "global_batch": self.global_batch, "seq_len": self.seq_len,
                "precision": self.precision, "framework": self.framework,
                "strategy": self.strategy, "objective": self.objective,
                **{f"override:{k}": v for k, v in sorted(self.overrides.items())}}

    @property
    def size(self) -> int:
        """Number of scenarios (the product of the list lengths), without building them."""
        return math.prod(len(v) for v in self.dims.values())

    def scenarios(self) -> Iterator[Scenario]:
        """Every scenario, lazily, in the order of the product."""
        keys = list(self.dims)
        for values in itertools.product(*self.dims.values()):
            d = dict(zip(keys, values))
            ov = tuple((k[len("override:"):], d.pop(k)) for k in keys if k.startswith("override:"))
            yield Scenario(**d, overrides=ov, top=self.top, train_tokens=self.train_tokens)


class Scenario(_Frozen):
    """One point of the sweep: everything one search needs (sent to the workers as is)."""

    model: str
    cluster: str
    gpus: PosInt
    global_batch: PosInt
    seq_len: PosInt
    precision: str | None = None
    framework: str | None = None
    strategy: Strategy = "grid"
    objective: Objective = "time"
    overrides: tuple[tuple[str, Number], ...] = ()
    top: PosInt = 1
    train_tokens: float | None = None

    @property
    def id(self) -> str:
        """A stable 16-hex-digit hash of the parameters (same scenario, same id, any run)."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"gpu": {"hbm_gib": [..]}}`` (dotted TOML keys) -> ``{"gpu.hbm_gib": [..]}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def _check_override_key(key: str) -> None:
    head, _, rest = key.partition(".")
    if head not in OVERRIDE_PREFIXES or not rest:
        raise ValueError(f"override '{key}': expected gpu.<field> or cluster.<field> "
                         "(e.g. gpu.hbm_gib, cluster.tiers.1.bw_gbit_per_s)")


def _set_path(data: dict[str, Any], path: list[str], value: Number, key: str) -> None:
    """Set ``data[path[0]][path[1]]...`` (list indices as integers) to ``value``."""
    node: Any = data
    for i, part in enumerate(path[:-1]):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            where = ".".join(path[:i + 1])
            raise SpecError(f"override '{key}': the cluster has no '{where}'") from None
    if not isinstance(node, dict):
        raise SpecError(f"override '{key}': '{'.'.join(path)}' is not a field")
    last = path[-1]
    if last in _BANDWIDTH_KEYS:  # one bandwidth per tier: the other unit is dropped
        for other in _BANDWIDTH_KEYS:
            node[other] = None
    node[last] = value


def apply_overrides(cluster: ClusterSpec, overrides: tuple[tuple[str, Number], ...]
                    ) -> ClusterSpec:
    """``cluster`` with hardware fields replaced and re-validated (one-line SpecError if the
    key does not exist or the value is out of range)."""
    if not overrides:
        return cluster
    data = cluster.model_dump()
    for key, value in overrides:
        head, _, rest = key.partition(".")
        path = (["gpu"] if head == "gpu" else []) + rest.split(".")
        _set_path(data, path, value, key)
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        keys = ", ".join(f"{k} = {v!r}" for k, v in overrides)
        raise SpecError(f"cluster '{cluster.name}' with overrides ({keys}): "
                        f"{format_validation_error(err)}") from None


@functools.lru_cache(maxsize=256)
def scenario_cluster(cluster: str, overrides: tuple[tuple[str, Number], ...]) -> ClusterSpec:
    """The cluster preset with the scenario's overrides (cached: many scenarios share one)."""
    return apply_overrides(load_cluster(cluster), overrides)


def load_sweep_spec(spec: str | Path | dict | SweepSpec) -> SweepSpec:
    """A :class:`SweepSpec` from a TOML path, a dict or itself; one-line SpecError if bad."""
    if isinstance(spec, SweepSpec):
        return spec
    source = "sweep spec"
    if not isinstance(spec, dict):
        path = Path(spec)
        if not path.exists():
            raise SpecError(f"sweep spec '{path}' does not exist")
        spec, source = read_toml(path), str(path)
    try:
        return SweepSpec.model_validate(spec)
    except ValidationError as err:
        raise SpecError(format_validation_error(err, source)) from None


def check_spec(spec: SweepSpec, *, yes: bool = False, max_scenarios: int = MAX_SCENARIOS
               ) -> None:
    """Refuse, with one line, what would fail or run away: a scenario count above
    ``max_scenarios`` (unless ``yes``), and every model, cluster, framework, precision and
    override value that does not load. Cheap: loads each name once, runs no search."""
    n = spec.size
    if n > max_scenarios and not yes:
        raise SpecError(f"the sweep has {n:,} scenarios, more than {max_scenarios:,}: "
                        "pass --yes (yes=True) to run them all")
    for m in spec.models:
        load_model(m)
    for fw in spec.framework:
        if fw is not None:
            load_framework(fw)
    for p in spec.precision:
        if p is not None:
            load_training(precision=p)
    for c in spec.clusters:
        cluster = load_cluster(c)
        for key, values in spec.overrides.items():
            for v in values:
                apply_overrides(cluster, ((key, v),))
