"""Each published row as the request a user types: one evaluation path for ``plan validate``
and ``plan``.

A row read by :func:`validation.validate.case_from_row` (dense) or
:func:`validation.validate_moe.moe_case_from_row` (MoE) becomes the keywords of one
:class:`search.request.PlanRequest` (:func:`case_options`): the model, the cluster scaled to the
row's GPUs, its global batch, sequence and precision, the training stack it ran
(``framework``: the row's release preset by name, or that preset carrying the row's own recipe
switches where they differ from it, :func:`row_framework`), the recipe's own settings that are
options (:data:`RECIPE_OPTIONS`: attention kernel, recompute modules, CPU-offloaded layers, ...)
and every parallel dimension pinned with the row's per-stage layout. :func:`predict_options`
evaluates it with :func:`search.api.plan_request`, the function behind ``plan``.

:func:`typed_options` writes the spec objects of those keywords to TOML files (model, cluster,
framework), so that the row becomes a command line (``cli.validate.row_command``)
whose ``--json`` output is the step time ``plan validate`` reports.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from perfmodel.core.errors import SpecError
from perfmodel.parallel.layers import stage_layer_table
from perfmodel.spec.frameworks import FrameworkSpec, load_framework, with_switches_of
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec, load_cluster
from search.api import plan_request
from search.host_sharding import imbalance_defaulted
from search.request import PlanRequest

__all__ = ["case_options", "case_pins", "predict_options", "recipe_options", "row_framework",
           "spec_toml", "typed_options"]

#: Training-setup values a recipe states that are options of their own (``--attention-backend``,
#: ``--recompute-modules``, ...): given where the row's differ from what the request sets
#: without them (the TrainingSpec default, or the framework's).
RECIPE_OPTIONS = ("attention_backend", "recompute_modules", "cpu_offload_layers",
                  "overlap_moe_comm", "moe_pad_expert_input_to_capacity",
                  "cuda_graph_full_iteration")

#: The parallel dimensions a row pins (each a :class:`search.request.PlanRequest` field).
PINNED_DIMS = ("dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "recompute",
               "sequence_parallel", "schedule", "ep")


def case_pins(case: Any, stage_layers: list[int] | None = None) -> dict[str, Any]:
    """The options that pin a case's configuration (``plan --dp ... --stage-layers``):
    every dimension, and the per-rank layer counts where the layout is not the even split
    (``stage_layers`` given, the config's own, or its Megatron-LM uneven split)."""
    c = case.config
    pins = {d: getattr(c, d) for d in PINNED_DIMS}
    pins["etp"] = c.expert_tp
    if c.cp > 1:  # the exchange the run used (the recipes keep Megatron-Core's ring)
        pins["cp_comm"] = c.cp_comm
    if stage_layers is not None:
        pins["stage_layers"] = list(stage_layers)
    elif c.stage_layers is not None:
        pins["stage_layers"] = list(c.stage_layers)
    elif c.first_stage_layers or c.last_stage_layers or c.embedding_as_layer or c.loss_as_layer:
        t = stage_layer_table(case.model.num_layers, c.pp, c.vp, c.first_stage_layers or 0,
                              c.last_stage_layers or 0, bool(c.embedding_as_layer),
                              bool(c.loss_as_layer))
        pins["stage_layers"] = [int(x) for x in np.asarray(t).sum(axis=1)]
    if c.stage_recompute_layers is not None:
        pins["stage_recompute_layers"] = list(c.stage_recompute_layers)
    return pins


#: Switches that act on mixture-of-experts layers only: a dense row need not match them.
MOE_SWITCHES = ("moe_token_dispatcher", "moe_flex_backend", "moe_router_fusion",
                "moe_parallel_folding")


def row_framework(preset: str, training: TrainingSpec, moe: bool = True) -> str | FrameworkSpec:
    """The ``framework`` of a row that ran ``preset``'s release: the preset's name where its
    switches are the row's (a dense row's: but the MoE ones, :data:`MOE_SWITCHES`), else the
    preset carrying the row's switches (:func:`perfmodel.spec.frameworks.with_switches_of`,
    named ``<preset>+recipe``)."""
    fw = load_framework(preset)
    own = fw.training_switches(training.precision)
    if all(getattr(training, k) == v for k, v in own.items()
           if moe or k not in MOE_SWITCHES):
        return preset
    derived = with_switches_of(fw, training)
    return derived.model_copy(update={"name": f"{preset}+recipe"})


def _cluster_option(cluster: ClusterSpec) -> tuple[Any, int]:
    """(cluster, gpus) of a case: the preset's name where scaling it gives the case's cluster."""
    try:
        if load_cluster(cluster.name, cluster.total_gpus) == cluster:
            return cluster.name, cluster.total_gpus
    except SpecError:  # not a preset name: the spec itself
        pass
    return cluster, cluster.total_gpus


def case_options(case: Any, preset: str, *, model: ModelSpec | None = None,
                 stage_layers: list[int] | None = None, profile: Any = None) -> dict[str, Any]:
    """The :class:`search.request.PlanRequest` keywords of a step-scope case run on
    ``preset``'s release (``model``: the model it is timed with, default the case's)."""
    t = case.training
    cluster, gpus = _cluster_option(case.cluster)
    framework = row_framework(preset, t, (model or case.model).is_moe)
    options = {"model": model or case.model, "cluster": cluster, "gpus": gpus,
               "global_batch_size": t.global_batch_size, "seq_len": t.seq_len,
               "precision": t.precision_name, "framework": framework,
               **recipe_options(t, load_framework(framework)),
               **case_pins(case, stage_layers), "top": 1,
               # what the recipe offloads and shards, so that nothing else is searched
               "offload": list(t.offload) or ["none"], "hsdp_shard": t.hsdp_shard}
    if imbalance_defaulted(t, model or case.model, None):
        options["moe_imbalance"] = 1.0  # the benchmark recipes force balanced routing
    if profile is not None:
        options["profile"] = profile
    return options


def recipe_options(training: TrainingSpec, fw: FrameworkSpec) -> dict[str, Any]:
    """The :data:`RECIPE_OPTIONS` where ``training``'s value is not the one the request gets
    without them (the framework's, else the TrainingSpec default)."""
    own = fw.training_switches(training.precision)
    out = {}
    for k in RECIPE_OPTIONS:
        v = getattr(training, k)
        if v != own.get(k, TrainingSpec.model_fields[k].default):
            out[k] = list(v) if isinstance(v, tuple) else v
    return out


def predict_options(options: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Step time [s] and the result row of ``options``, through :func:`search.api.plan_request`."""
    result = plan_request(PlanRequest(**options))
    # one configuration asked for: a row that does not fit is the smallest footprint found
    row = result.rows[0] if result.rows else result.smallest
    if row is None:
        return math.nan, {}
    return float(row["step_time_s"]), row


# --------------------------------------------------------------------------------------------
# The spec objects of a request written as files, so that it can be typed
def _toml_value(v: Any) -> str:
    """One TOML value (inline tables and arrays for nested data)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return repr(f) if math.isfinite(f) else ("inf" if f > 0 else "-inf" if f < 0 else "nan")
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, dict):
        items = [f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None]
        return "{" + ", ".join(items) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def spec_toml(spec: BaseModel) -> str:
    """A spec as a TOML document (its fields set, ``None`` left out), read back by the
    spec's loader."""
    data = spec.model_dump(mode="json", exclude_none=True)
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in data.items())


def typed_options(options: dict[str, Any], folder: str | Path, stem: str) -> dict[str, Any]:
    """``options`` with each spec object (model, cluster, training, framework) written to
    ``folder/<stem>-<field>.toml`` and replaced by that path."""
    out = dict(options)
    for name in ("model", "cluster", "framework"):
        v = out.get(name)
        if isinstance(v, BaseModel):
            path = Path(folder) / f"{stem}-{name}.toml"
            path.write_text(spec_toml(v))
            out[name] = str(path)
    return out
