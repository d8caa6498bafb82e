"""The simulated pipeline step of one resolved configuration, its stages timed by its layout:
the input of the pipeline Gantt chart."""

from __future__ import annotations

from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.layers import (
    stage_counts,
    stage_moe_layers,
    stage_times_s,
    typed_layer_costs,
    without_layout,
)
from perfmodel.pipeline.schedules import simulate
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec
from perfmodel.step.evaluate import evaluate, layer_times_by_type


def layout_timeline(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, config,
                    *, kernels: str = "fused", calibration=None):
    """The simulated pipeline step (:func:`perfmodel.pipeline.schedules.simulate`) of one resolved
    configuration, its stages timed by its layout (the even split when it has none): the input
    of :func:`plots.figures.plot_pipeline_timeline`, the Gantt chart of a search result.

    A stage's forward is its layers' forward (the share ``layer_fwd / layer`` of a layer
    without recompute, applied to the embedding and loss too); the rest of the stage time,
    recompute included, is its backward.
    """
    b = ConfigBatch.from_configs([config])
    kw = {"kernels": kernels, "calibration": calibration}
    keep = evaluate(model, training, cluster, without_layout(b, "keep"), **kw).extra
    full = evaluate(model, training, cluster, without_layout(b, "full"), **kw).extra
    layers, rec = stage_counts(model, b)
    moe_kw = {}
    if typed_layer_costs(model):  # each layer type at its own time, as perfmodel.step.evaluate does
        lt = layer_times_by_type(model, training, cluster, b, average=False, **kw)
        moe_kw = {"moe_layers": stage_moe_layers(model, b, layers),
                  "moe_keep_s": lt["moe_keep"], "moe_full_s": lt["moe_full"]}
        keep = {**keep, "layer_s": lt["dense_keep"]}
        full = {**full, "layer_s": lt["dense_full"]}
    t = stage_times_s(layers, rec, keep["layer_s"], full["layer_s"], keep["embed_s"],
                      keep["logits_s"], b.pp, **moe_kw)[0, :config.pp]
    share = float(keep["layer_fwd_s"][0] / keep["layer_s"][0])
    extra = (full["layer_s"][0] - keep["layer_s"][0]) * rec[0, :config.pp]
    fwd = (t - extra) * share
    return simulate(fwd, t - fwd, int(config.num_microbatches), config.schedule, v=config.vp)
