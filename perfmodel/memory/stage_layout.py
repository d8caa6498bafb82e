"""Per-stage pipeline layouts: arbitrary layer counts per stage and block recompute per stage.

A configuration may carry ``stage_layers`` (transformer layers on each pipeline rank) and
``stage_recompute_layers`` (how many of them recompute fully), the layouts that the
dynamic-programming searcher (:mod:`search.strategies.dp`) chooses. This module gives the time and memory
of each stage of such a layout, composed from the same per-layer terms that
:func:`perfmodel.step.evaluate.evaluate` and :func:`perfmodel.memory.breakdown.memory_breakdown` use for the even
split, so that an even layout with no block recompute predicts exactly what the even split does
(a test checks it).

Stage ``s`` of ``n_s`` layers of which ``r_s`` recompute (Megatron-LM ``--recompute-granularity
full --recompute-method block --recompute-num-layers N``: the first N layers of each chunk are
checkpointed, the rest keep all their activations):

* time of one micro-batch: ``n_s * t_keep + r_s * (t_full - t_keep)`` plus the embedding on the
  first stage and the logits + loss on the last (``t_keep``: a layer without recompute, or with
  selective recompute when that is the configuration's mode; ``t_full``: a fully recomputed
  layer, its extra forward and tensor-parallel collectives included);
* memory: the stage's parameters (``n_s`` layers, the embedding on the first, final norm and
  output layer on the last) under ZeRO, ``inflight_s * ((n_s - r_s) a_keep + r_s a_full)`` of
  activations plus one layer's full activations while a checkpointed layer is recomputed, the
  embedding / logits buffers, the buffers of :func:`perfmodel.memory.breakdown.memory_breakdown`, and its
  allocator allowance.

References
----------
Megatron-LM ``transformer_block.py`` (``_checkpointed_forward``, method ``block``) and
``pipeline_parallel_layer_layout.py`` (``--pipeline-model-parallel-layout``); Korthikanti et
al. 2022, Table 2 (activations by recompute mode); Narayanan et al. 2021, Sec. 2.2 (in-flight
micro-batches per stage).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from perfmodel.core.codes import Recompute
from perfmodel.memory import breakdown as mem
from perfmodel.moe import experts as moe
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.layers import (
    moe_variants,
    stage_counts,
    stage_moe_layers,
    typed_layer_costs,
    without_layout,
)
from perfmodel.pipeline.schedules import inflight_microbatches
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = [
    "layout_memory_breakdown",
    "stage_memory_bytes",
]



def _col(x, ndim: int) -> np.ndarray:
    """A per-configuration array broadcast against ``ndim`` trailing axes."""
    x = np.asarray(x)
    return x.reshape(x.shape + (1,) * ndim)


def stage_memory_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    batch: ConfigBatch,
    stage,
    layers,
    recomputed,
    *,
    flash_attention: bool = True,
    dropout: bool | None = None,
    moe_layers=None,
) -> dict[str, np.ndarray]:
    """Memory per GPU of pipeline stage ``stage`` holding ``layers`` transformer layers of which
    ``recomputed`` are fully recomputed (fused kernels, Megatron-LM).

    MoE models: ``moe_layers`` (same shape as ``layers``) of the stage's layers are MoE
    (:func:`stage_moe_layers` for a layout); a dense and an MoE layer then each have their own
    parameters and activations (the same memory terms on :func:`moe_variants`), the stage holds
    the routed experts of its MoE layers only (DeepSeek-V3's dense leading layers lighten
    stage 0), and the dispatch buffers where it has an MoE layer. ``None``: every layer is the
    model's average layer (its routed experts in the MoE share of the non-leading layers).

    ``stage``, ``layers`` and ``recomputed`` are arrays of shape ``(n, ...)`` (n = len(batch),
    any trailing axes, broadcast), so a search evaluates every stage and layer count of every
    configuration at once. Composed of :mod:`perfmodel.memory.breakdown`'s terms in the order of
    :func:`perfmodel.memory.breakdown.memory_breakdown`: parameters (:func:`~perfmodel.memory.breakdown.stage_params`)
    under ZeRO (:func:`~perfmodel.memory.breakdown.zero_state_bytes`), activations
    (:func:`~perfmodel.memory.breakdown.layer_activation_bytes` per in-flight micro-batch of
    :func:`~perfmodel.pipeline.schedules.inflight_microbatches`), buffers and the allocator allowance;
    one private function a step, on the operands of :class:`_StageMemoryContext`.

    Returns a dict of arrays [bytes]: ``weights``, ``gradients``, ``optimizer``,
    ``activations``, ``other`` (incl. the allowance), ``peak``.
    """
    ctx = _stage_memory_context(model, training, cluster, batch, stage, layers, recomputed,
                                flash_attention, dropout, moe_layers)
    # 1. Parameters of this stage, routed experts apart.
    par = _stage_param_counts(ctx)
    # 2. Model states by ZeRO stage.
    states = _stage_state_bytes(ctx, par)
    # 3. Activations: kept layers, checkpointed layers, one layer being recomputed.
    e = 4.0 if ctx.precision == "fp32" else 2.0
    act = _stage_activation_bytes(ctx, e)
    # 4. Other buffers: workspaces, ZeRO-2/3 buckets, ZeRO-3 live layers, fp8 weight caches.
    other = _stage_other_bytes(ctx, par, states, e)
    # the optimizer step's fp32 gradient copy (16-bit buffers), live once activations are freed
    # (memory_breakdown leaves the experts' copy out too: it only raises the peak past the
    # activations)
    copy_b = mem.optimizer_grad_copy_bytes(ctx.precision, training.grad_reduce_in_fp32)
    o = states.o + mem.optimizer_grad_copy_excess_bytes(copy_b, ctx.zero, ctx.shard,
                                                        par.params, act)
    allocated = states.w + states.g + o + act + other
    # the allowance covers what the step allocates and frees (activations and buffers)
    allowance = mem.allocator_allowance_bytes(cluster.gpu, act + other)
    return {"weights": states.w, "gradients": states.g, "optimizer": o, "activations": act,
            "other": other + allowance, "peak": allocated + allowance,
            "allowance": allowance}


@dataclasses.dataclass(frozen=True)
class _StageMemoryContext:
    """What every step of :func:`stage_memory_bytes` reads: the specs; ``nd`` trailing axes;
    per configuration, broadcast against them (:func:`_col`), the float64 parallel sizes
    ``tp pp vp cp dp``, micro-batch size ``b`` and count ``m``, the codes ``zero``, ``rc``,
    ``sched``, ``sp`` (bool), ``r`` (divisor of the sequence-parallel parts), ``shard``
    (``dp * cp``); per stage, ``stage``, its ``n_l`` layers, ``n_r`` recomputed, ``first`` /
    ``last`` (bool); ``s`` tokens per sequence on this GPU, ``h``, ``v``; ``drop`` (1.0 with
    dropout masks); ``typed`` (dense and MoE layers costed apart: ``n_m`` MoE layers,
    ``dense_m`` / ``moe_m`` the two :func:`moe_variants`)."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    batch: ConfigBatch
    nd: int
    tp: np.ndarray
    pp: np.ndarray
    vp: np.ndarray
    cp: np.ndarray
    dp: np.ndarray
    zero: np.ndarray
    b: np.ndarray
    m: np.ndarray
    rc: np.ndarray
    sp: np.ndarray
    sched: np.ndarray
    stage: np.ndarray
    n_l: np.ndarray
    n_r: np.ndarray
    r: np.ndarray
    shard: np.ndarray
    s: np.ndarray
    h: float
    v: float
    precision: str
    flash_attention: bool
    dropout: bool
    drop: float
    first: np.ndarray
    last: np.ndarray
    typed: bool
    n_m: np.ndarray | None
    dense_m: ModelSpec | None
    moe_m: ModelSpec | None


def _stage_memory_context(model, training, cluster, batch, stage, layers, recomputed,
                          flash_attention, dropout, moe_layers) -> _StageMemoryContext:
    """The operands of :class:`_StageMemoryContext` (arguments as :func:`stage_memory_bytes`)."""
    stage = np.asarray(stage, dtype=np.float64)
    nd = max(stage.ndim, np.ndim(layers), np.ndim(recomputed)) - 1
    c = batch
    f64 = np.float64
    tp, pp, vp, cp, dp = (_col(np.asarray(x, dtype=f64), nd) for x in (c.tp, c.pp, c.vp, c.cp,
                                                                        c.dp))
    sp = _col(np.asarray(c.sequence_parallel, dtype=bool), nd)
    if dropout is None:
        dropout = model.position_embedding == "learned"
    typed = typed_layer_costs(model) and moe_layers is not None
    dense_m, moe_m = moe_variants(model) if typed else (None, None)
    return _StageMemoryContext(
        model=model, training=training, cluster=cluster, batch=c, nd=nd,
        tp=tp, pp=pp, vp=vp, cp=cp, dp=dp, zero=_col(c.zero_stage, nd),
        b=_col(np.asarray(c.micro_batch_size, dtype=f64), nd),
        m=_col(np.asarray(c.num_microbatches, dtype=f64), nd),
        rc=_col(c.recompute, nd), sp=sp, sched=_col(c.schedule, nd), stage=stage,
        n_l=np.asarray(layers, dtype=f64), n_r=np.asarray(recomputed, dtype=f64),
        r=np.where(sp, tp, 1.0), shard=dp * cp, s=training.seq_len / cp,
        h=float(model.hidden_size), v=float(model.vocab_size), precision=training.precision,
        flash_attention=flash_attention, dropout=dropout, drop=1.0 if dropout else 0.0,
        first=stage == 0, last=stage == pp - 1, typed=typed,
        n_m=np.asarray(moe_layers, dtype=f64) if typed else None,
        dense_m=dense_m, moe_m=moe_m,
    )


@dataclasses.dataclass(frozen=True)
class _StageParamCounts:
    """A stage's parameters per GPU [count]: ``params`` (routed experts apart), ``experts``
    (its routed expert parameters), ``sp_`` / ``sp_d`` / ``sp_m`` (:func:`perfmodel.memory.breakdown.
    stage_params` of the model and, typed, of its dense and MoE variants), ``n_d`` dense layers
    (typed), ``moe_count`` MoE layers, ``n_exp_layer`` one MoE layer's routed experts on this
    GPU, ``expert_dp``."""

    sp_: dict
    sp_d: dict | None
    sp_m: dict | None
    n_d: np.ndarray | None
    params: np.ndarray
    experts: np.ndarray
    moe_count: np.ndarray
    n_exp_layer: np.ndarray
    expert_dp: np.ndarray


def _stage_param_counts(ctx: _StageMemoryContext) -> _StageParamCounts:
    """Step 1 of :func:`stage_memory_bytes`: the stage's parameters [count], routed experts
    apart (split ``ep * etp`` ways, sharded over expert-dp). The layout counts every layer of a
    stage as MoE in the model's share (affine in the layer count, as search/dp.py needs):
    DeepSeek-style dense leading layers are not subtracted on stage 0, which overstates its
    experts by at most those layers'. Typed: a dense and an MoE layer, each with its own
    parameters.

    References
    ----------
    As :func:`perfmodel.memory.breakdown.stage_params` (Narayanan et al. 2021, Sec. 2-3; Megatron-LM
    ``theoretical_memory_usage.py``).
    """
    model, c, nd, f64 = ctx.model, ctx.batch, ctx.nd, np.float64
    tp, pp, n_l = ctx.tp, ctx.pp, ctx.n_l
    sp_d = sp_m = n_d = None
    if ctx.typed:  # a dense and an MoE layer, each with its own parameters
        n_d = n_l - ctx.n_m
        sp_d, sp_m = mem.stage_params(ctx.dense_m, tp, pp), mem.stage_params(ctx.moe_m, tp, pp)
        layer_params = n_d * sp_d["layer"] + ctx.n_m * sp_m["layer"]
    sp_ = mem.stage_params(model, tp, pp)
    if not ctx.typed:
        layer_params = n_l * sp_["layer"]
    params = (layer_params + np.where(ctx.first, sp_["embedding"], 0.0)
              + np.where(ctx.last, model.norm_params() + sp_["output"], 0.0))
    ep_etp = _col((c.ep * c.etp).astype(f64), nd)
    expert_dp = _col(c.expert_dp.astype(f64), nd)
    per_moe_layer = model.num_experts * model.expert_params() if model.is_moe else 0.0
    other_layers = model.num_layers - model.moe_dense_layers
    moe_share = model.num_moe_layers / other_layers if model.is_moe and other_layers else 0.0
    n_exp_layer = per_moe_layer / ep_etp  # one MoE layer's routed experts on this GPU
    moe_count = ctx.n_m if ctx.typed else n_l * moe_share  # MoE layers of the stage
    return _StageParamCounts(sp_=sp_, sp_d=sp_d, sp_m=sp_m, n_d=n_d, params=params,
                             experts=moe_count * n_exp_layer, moe_count=moe_count,
                             n_exp_layer=n_exp_layer, expert_dp=expert_dp)


@dataclasses.dataclass(frozen=True)
class _StageStateBytes:
    """A stage's weights ``w``, gradients ``g``, optimizer states ``o`` [bytes] and the bytes
    per parameter of its weights ``wb`` and gradients ``gb``; ``fp8_params``: fp8 weights."""

    wb: float
    gb: float
    fp8_params: bool
    w: np.ndarray
    g: np.ndarray
    o: np.ndarray


def _stage_state_bytes(ctx: _StageMemoryContext, par: _StageParamCounts) -> _StageStateBytes:
    """Step 2 of :func:`stage_memory_bytes`: model states by ZeRO stage [bytes] (Megatron-LM:
    16-bit weights, main grads in fp32 unless reduced in bf16, fp8 weights with fp8_params):
    :func:`perfmodel.memory.breakdown.zero_state_bytes` of the stage's parameters over ``dp * cp`` and of
    its routed experts over expert-dp.

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 5 and Table 1; Megatron-LM
    ``theoretical_memory_usage.py``.
    """
    training, precision = ctx.training, ctx.precision
    wb, gb, ob = mem.state_bytes_per_param(precision, training.optimizer,
                                           fp32_main_grads=training.grad_reduce_in_fp32)
    fp8_params = training.fp8_params and precision in ("fp8", "fp4")
    if fp8_params:
        wb = 1.0
    w, g, o = mem.zero_state_bytes(par.params, ctx.shard, ctx.zero, wb, gb, ob)
    we, ge, oe = mem.zero_state_bytes(par.experts, par.expert_dp, ctx.zero, wb, gb, ob)
    return _StageStateBytes(wb=wb, gb=gb, fp8_params=fp8_params, w=w + we, g=g + ge, o=o + oe)


def _layer_activation_kwargs(ctx: _StageMemoryContext, e: float) -> dict:
    """The keyword operands of :func:`perfmodel.memory.breakdown.layer_activation_bytes` for the model's
    average layer on this GPU (``e`` bytes per saved value)."""
    model = ctx.model
    return {"tp": ctx.tp, "sequence_parallel": ctx.sp,
            "ffn_hidden_size": moe.effective_ffn_size(model),
            "num_kv_heads": model.kv_heads, "head_dim": model.head_size,
            "gated_mlp": model.gated_mlp, "flash": ctx.flash_attention, "dropout": ctx.dropout,
            "bytes_per_value": e, "gemm_input_bytes": mem.fp8_gemm_input_bytes(ctx.precision)}


def _layer_kept_and_all_bytes(ctx: _StageMemoryContext, mdl: ModelSpec, kw: dict
                              ) -> tuple[np.ndarray, np.ndarray]:
    """One layer of ``mdl`` (the model or one of its :func:`moe_variants`): the activations it
    keeps under the configuration's mode (selective, or none for a layer that is not
    checkpointed) and all of them (no recompute) [bytes], each with the MoE extras (dispatched
    tokens, expert outputs, router scores; 0 for a dense layer).

    References
    ----------
    Korthikanti et al. 2022, Table 2 (:func:`perfmodel.memory.breakdown.layer_activation_bytes`,
    :func:`perfmodel.memory.breakdown.selective_recompute_freed_bytes`);
    :func:`perfmodel.moe.experts.moe_activation_extra_bytes`.
    """
    rc, training, s, b, h = ctx.rc, ctx.training, ctx.s, ctx.b, ctx.h
    e, gi = kw["bytes_per_value"], kw["gemm_input_bytes"]
    kw = {**kw, "ffn_hidden_size": moe.effective_ffn_size(mdl)}
    a = ctx.model.num_attention_heads
    keep = mem.layer_activation_bytes(s, b, h, a, recompute=np.where(rc == Recompute.SELECTIVE,
                                                                      Recompute.SELECTIVE, 0), **kw)
    # what selective recomputation of the training's modules does not keep
    freed = np.where(rc == Recompute.SELECTIVE, mem.selective_recompute_freed_bytes(
        mdl, training.recompute_modules, s, b, tp=ctx.tp, sequence_parallel=ctx.sp,
        bytes_per_value=e, gemm_input_bytes=gi), 0.0)
    keep = keep - freed
    full = mem.layer_activation_bytes(s, b, h, a, recompute=0, **kw)
    extra = _col(moe.moe_activation_extra_bytes(mdl, training, ctx.batch, e, gi), ctx.nd)
    return keep + extra, full + extra


def _stage_activation_bytes(ctx: _StageMemoryContext, e: float) -> np.ndarray:
    """Step 3 of :func:`stage_memory_bytes`: the stage's activations [bytes]. Per in-flight
    micro-batch (:func:`perfmodel.pipeline.schedules.inflight_microbatches`, plus
    :func:`perfmodel.moe.experts.a2a_overlap_extra_inflight`), its kept layers' activations and its
    checkpointed layers' inputs; one layer's whole activations while a checkpointed layer is
    recomputed; the embedding's token ids and dropout mask on the first stage, the final norm
    and output-layer inputs and the fp32 logits on the last, plus one micro-batch's 16-bit
    logits. Typed: each layer type's own kept activations in the stage's mix; the recomputed
    layer an MoE layer where the stage has one.

    References
    ----------
    Korthikanti et al. 2022, Table 2; Narayanan et al. 2021, Sec. 2.2.
    """
    kw = _layer_activation_kwargs(ctx, e)
    s, b, h, a = ctx.s, ctx.b, ctx.h, ctx.model.num_attention_heads
    n_l, n_r, m = ctx.n_l, ctx.n_r, ctx.m
    act_ckpt = mem.layer_activation_bytes(s, b, h, a, recompute=Recompute.FULL, **kw)
    if ctx.typed:  # each layer type's own activations; the recomputed ones of the stage's mix
        dense_keep, dense_all = _layer_kept_and_all_bytes(ctx, ctx.dense_m, kw)
        moe_keep, moe_all = _layer_kept_and_all_bytes(ctx, ctx.moe_m, kw)
        frac = np.where(n_l > 0, ctx.n_m / np.maximum(n_l, 1.0), 0.0)
        act_keep = (1.0 - frac) * dense_keep + frac * moe_keep
        act_all = np.where(ctx.n_m > 0, moe_all, dense_all)
    else:
        act_keep, act_all = _layer_kept_and_all_bytes(ctx, ctx.model, kw)
    infl = inflight_microbatches(ctx.pp, m, ctx.sched, ctx.vp, stage=ctx.stage)
    a2a_extra = _col(moe.a2a_overlap_extra_inflight(ctx.training, ctx.batch), ctx.nd)
    infl = np.minimum(infl + a2a_extra, np.maximum(m, infl))
    mb = np.ceil(infl)
    sb = s * b
    logit = sb * ctx.v / ctx.tp
    embed_act = 8.0 * sb + ctx.drop * sb * h / ctx.r
    final_act = 2 * e * sb * h / ctx.r
    return (infl * ((n_l - n_r) * act_keep + n_r * act_ckpt) + np.where(n_r > 0, act_all, 0.0)
            + np.where(ctx.first, mb * embed_act, 0.0)
            + np.where(ctx.last, mb * (final_act + 4.0 * logit) + 2.0 * logit, 0.0))


def _stage_other_bytes(ctx: _StageMemoryContext, par: _StageParamCounts,
                       states: _StageStateBytes, e: float) -> np.ndarray:
    """Step 4 of :func:`stage_memory_bytes`: other buffers [bytes]. Workspaces
    (:data:`perfmodel.memory.breakdown.LIBRARY_WORKSPACE_BYTES`, GPUs only), ZeRO-2/3 gradient buckets
    (two of :data:`perfmodel.memory.breakdown.BUCKET_PARAMS`), ZeRO-3's
    :data:`perfmodel.memory.breakdown.ZERO3_LIVE_LAYERS` live layers, fp8 weight caches
    (:func:`perfmodel.memory.breakdown.fp8_weight_cache_bytes`); MoE: the experts' low-precision copies,
    ZeRO-3 live experts and the dispatch buffers
    (:func:`perfmodel.moe.experts.moe_dispatch_buffer_bytes`).

    References
    ----------
    As :func:`perfmodel.memory.breakdown.memory_breakdown`'s step 4 (docs/memory.md).
    """
    model, precision, zero, shard = ctx.model, ctx.precision, ctx.zero, ctx.shard
    params, sp_, wb, gb, fp8_params = par.params, par.sp_, states.wb, states.gb, states.fp8_params
    gpu_part = mem.is_gpu(ctx.cluster.gpu)
    other = (mem.LIBRARY_WORKSPACE_BYTES if gpu_part else 0.0) + 0.0 * params
    other = other + np.where(zero >= 2, 2.0 * np.minimum(mem.BUCKET_PARAMS, params) * gb, 0.0)
    other = other + np.where((zero >= 3) & (shard > 1),
                             sp_["layer"] * (wb + gb) * mem.ZERO3_LIVE_LAYERS, 0.0)
    if ctx.typed:
        other = other + mem.fp8_weight_cache_bytes(precision, par.n_d, par.sp_d["gemm_layer"],
                                                   zero, shard, fp8_params)
        other = other + mem.fp8_weight_cache_bytes(precision, ctx.n_m, par.sp_m["gemm_layer"],
                                                   zero, shard, fp8_params)
    else:
        other = other + mem.fp8_weight_cache_bytes(precision, ctx.n_l, sp_["gemm_layer"], zero,
                                                   shard, fp8_params)
    if model.is_moe:  # experts' low-precision copies, ZeRO-3 live experts, dispatch buffers
        other = other + mem.fp8_weight_cache_bytes(precision, par.moe_count, par.n_exp_layer,
                                                   zero, par.expert_dp, fp8_params)
        other = other + np.where((zero >= 3) & (shard > 1),
                                 par.n_exp_layer * (wb + gb) * mem.ZERO3_LIVE_LAYERS, 0.0)
        dispatch = _col(moe.moe_dispatch_buffer_bytes(model, ctx.training, ctx.batch, e), ctx.nd)
        other = other + (np.where(ctx.n_m > 0, dispatch, 0.0) if ctx.typed else dispatch)
    return other


def layout_memory_breakdown(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    batch: ConfigBatch,
    *,
    flash_attention: bool = True,
    dropout: bool | None = None,
    headroom: float = 0.0,
) -> dict[str, np.ndarray]:
    """:func:`perfmodel.memory.breakdown.memory_breakdown`'s dict for a batch with per-stage layouts:
    the stage that needs most (over every stage, not only the first and last), its terms,
    ``peak_stage`` its index and ``fits``. Rows without a layout go through
    ``memory_breakdown`` unchanged."""
    lay = batch.has_layout
    out = mem.even_memory_breakdown(model, training, cluster, without_layout(batch),
                               flash_attention=flash_attention, dropout=dropout,
                               headroom=headroom)
    out = {k: np.array(v, copy=True) for k, v in out.items()}
    idx = np.flatnonzero(lay)
    sub = batch.take(idx)
    layers, rec = stage_counts(model, sub)
    stage = np.broadcast_to(np.arange(layers.shape[1])[None, :], layers.shape)
    moe_layers = stage_moe_layers(model, sub, layers) if typed_layer_costs(model) else None
    st = stage_memory_bytes(model, training, cluster, sub, stage, layers, rec,
                            flash_attention=flash_attention, dropout=dropout,
                            moe_layers=moe_layers)
    peak = np.where(stage < sub.pp[:, None], st["peak"], -np.inf)
    k = np.argmax(peak, axis=1)
    rows = np.arange(len(idx))
    for name in ("weights", "gradients", "optimizer", "activations", "other", "peak"):
        out[name][idx] = st[name][rows, k]
    allowance = st["allowance"][rows, k]
    out["allocator_allowance"][idx] = allowance
    out["peak_allocated"][idx] = out["peak"][idx] - allowance
    out["peak_stage"][idx] = k
    out["fits"][idx] = out["peak"][idx] <= mem.usable_hbm_bytes(cluster.gpu, headroom)
    return out


