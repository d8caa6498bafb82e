"""Step time, throughput, MFU and HFU of a batch of parallel configurations.

:func:`evaluate` is an ordered, commented sum of the terms computed by the other modules:

1. per-layer compute of one micro-batch (:mod:`perfmodel.compute.layer`), with the exposed
   tensor- and context-parallel communication of that layer (:mod:`perfmodel.comm.comm_time`);
2. per-stage time of one micro-batch: layers of the stage, plus embedding (first stage) and
   logits + loss (last stage);
3. the pipeline makespan over ``m`` micro-batches with the schedule's bubble, paced by the slowest
   stage (Narayanan et al. 2021, Sec. 2.2; Qi et al. 2024 for ZB-H1);
4. exposed pipeline p2p, data-parallel gradient reduction and ZeRO-3 gathers (what overlap
   cannot hide, :func:`perfmodel.comm.comm_time.exposed_dp_time_s`);
5. the optimizer step.

Every term is an array over the :class:`~perfmodel.parallel.config.ConfigBatch`; nothing loops per config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel import memory
from perfmodel.comm import comm_time as comm_time_mod
from perfmodel.comm import (
    comm_volume,
    cp_a2a,
    cp_allgather,
    cp_hierarchical,
    cp_ring,
    zero3_deepspeed,
)
from perfmodel.compute import flops, quantise
from perfmodel.compute import layer as compute
from perfmodel.compute.mtp import mtp_stage_s
from perfmodel.core import heap
from perfmodel.core.codes import (
    COMPRESSION,
    CP_COMM,
    RECOMPUTE,
    SCHEDULE,
    CpComm,
    Recompute,
    Schedule,
)
from perfmodel.core.frames import data_frame
from perfmodel.hardware import overlap
from perfmodel.hardware.calibration import KERNEL_MIN_S
from perfmodel.memory import offload
from perfmodel.moe import experts as moe
from perfmodel.moe.imbalance import with_imbalance
from perfmodel.parallel import layers as layers_mod
from perfmodel.parallel.config import ConfigBatch, with_hierarchical_sizes
from perfmodel.parallel.layers import (
    moe_variants,
    typed_layer_costs,
    uniform_recompute,
    without_layout,
)
from perfmodel.parallel.topology import group_placement, parallel_group_tiers, parallel_groups
from perfmodel.spec.specs import ClusterSpec, ModelSpec, TrainingSpec
from perfmodel.step.host_and_sharding import with_sharding_and_offload

# Order of the time terms in the breakdown; they add up to ``step_time_s``.
TIME_TERMS = (
    "compute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "bubble",
    "pp_comm",
    "dp_comm",
    "zero3_comm",
    "optimizer",
    "overlap_slowdown",
    "link_shared",
)
MFU_CONVENTION = (
    "MFU: model FLOPs with the full (non-causal) s x s attention, no recompute, as NVIDIA NeMo / "
    "Megatron-LM report it; HFU: FLOPs the GPUs run (causal attention with flash attention, "
    "recompute counted); both over the dense peak of the GEMM dtype"
)
MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "other", "peak")
COMM_DIMS = ("dp", "tp", "pp", "cp", "ep")
# a batch's megabyte-sized temporaries reuse the pages the previous batch freed
# (perfmodel.core.heap: otherwise, by the order of earlier allocations, a fifth of the CPU time
# can go to page faults); no number depends on it
heap.keep_freed_heap()



@dataclass(frozen=True)
class StepResult:
    """Predictions for every configuration of ``batch`` (arrays of equal length)."""

    batch: ConfigBatch
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    time_s: dict[str, np.ndarray]
    memory_bytes: dict[str, np.ndarray]
    comm_bytes_per_gpu: dict[str, np.ndarray]
    fits: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.batch)

    def take(self, idx) -> StepResult:
        """Sub-result at the given indices or boolean mask."""
        return StepResult(
            batch=self.batch.take(idx),
            step_time_s=self.step_time_s[idx],
            tokens_per_s=self.tokens_per_s[idx],
            model_flops=self.model_flops[idx],
            hardware_flops=self.hardware_flops[idx],
            mfu=self.mfu[idx],
            hfu=self.hfu[idx],
            time_s={k: v[idx] for k, v in self.time_s.items()},
            memory_bytes={k: v[idx] for k, v in self.memory_bytes.items()},
            comm_bytes_per_gpu={k: v[idx] for k, v in self.comm_bytes_per_gpu.items()},
            fits=self.fits[idx],
            extra={k: v[idx] for k, v in self.extra.items()},
        )

    def row(self, i: int) -> dict:
        """One configuration's prediction as a JSON-able dict (the CLI's ``best`` object)."""
        cfg = self.batch.config(i).model_dump()
        return {
            "config": cfg,
            "step_time_s": float(self.step_time_s[i]),
            "tokens_per_s": float(self.tokens_per_s[i]),
            "mfu": float(self.mfu[i]),
            "hfu": float(self.hfu[i]),
            "model_flops": float(self.model_flops[i]),
            "fits": bool(self.fits[i]),
            "memory_bytes": {k: float(self.memory_bytes[k][i]) for k in MEMORY_TERMS},
            "time_s": {k: float(self.time_s[k][i]) for k in TIME_TERMS},
            "comm_bytes_per_gpu": {k: float(self.comm_bytes_per_gpu[k][i]) for k in COMM_DIMS},
        }

    def to_frame(self):
        """A pandas DataFrame, one row per configuration, units in the column names."""

        b = self.batch
        cols = {
            "dp": b.dp,
            "tp": b.tp,
            "pp": b.pp,
            "vp": b.vp,
            "cp": b.cp,
            "ep": b.ep,
            "etp": b.etp,
            "zero_stage": b.zero_stage,
            "micro_batch_size": b.micro_batch_size,
            "num_microbatches": b.num_microbatches,
            "recompute": np.asarray(RECOMPUTE)[b.recompute],
            "sequence_parallel": b.sequence_parallel,
            "schedule": np.asarray(SCHEDULE)[b.schedule],
            "grad_compression": np.asarray(COMPRESSION)[b.grad_compression],
            "cp_comm": np.asarray(CP_COMM)[b.cp_comm],
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "fits": self.fits,
            "peak_memory_bytes": self.memory_bytes["peak"],
        }
        cols.update({f"{k}_time_s": v for k, v in self.time_s.items()})
        cols.update({f"{k}_memory_bytes": v for k, v in self.memory_bytes.items() if k != "peak"})
        cols.update({f"{k}_comm_bytes_per_gpu": v for k, v in self.comm_bytes_per_gpu.items()})
        return data_frame(cols)


def peak_flops_for(cluster: ClusterSpec, precision: str, kernels: str = "fused") -> float:
    """Dense peak FLOP/s used for MFU and HFU: the peak of the math the GEMMs run in, the same
    rate :func:`perfmodel.compute.layer.compute_times` prices them at (fp8 rows use the fp8 peak, as
    NeMo and the validation README do). fp32 training with fused kernels runs its GEMMs on TF32
    tensor cores, so its MFU is over the TF32 peak; eager PyTorch (``allow_tf32`` False) over
    the fp32 CUDA-core peak. Dividing TF32-rate work by the fp32 peak gave an MFU of 616 %."""
    if precision == "fp32":
        return cluster.gpu.peak_flops("fp32" if kernels == "eager" else "tf32")
    dtype = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp4": "fp4"}[precision]
    return cluster.gpu.peak_flops(dtype)


def bottleneck_stage_s(
    num_layers: int,
    pp: np.ndarray,
    layer_s: np.ndarray,
    first_extra_s: np.ndarray,
    last_extra_s: np.ndarray,
    iterations: int = 60,
) -> np.ndarray:
    """Slowest stage [s] of the best contiguous split of ``num_layers`` equal layers over ``pp``
    stages, the first also holding ``first_extra_s`` (embedding) and the last ``last_extra_s``
    (logits and loss).

    This is the layer-partition problem of exercise 9.4 (:func:`perfmodel.parallel.layers.partition_layers`
    solves it by dynamic programming for arbitrary costs) specialised to equal layer costs, where
    it is vectorised: a bottleneck ``T`` is feasible when the stages can hold all layers,
    ``floor((T-e)/c) + (p-2)*floor(T/c) + floor((T-g)/c) >= L``; a bisection on ``T`` finds the
    smallest feasible one for every configuration at once.

    References
    ----------
    Bokhari 1988 (chains-on-chains partitioning); Narayanan et al. 2019 (PipeDream), Sec. 3.1.
    """
    p = pp.astype(np.float64)
    c = np.maximum(layer_s, 1e-30)
    e, g = first_extra_s, last_extra_s
    L = float(num_layers)

    def capacity(t):
        first = np.floor(np.maximum(t - e, -c) / c)
        last = np.floor(np.maximum(t - g, -c) / c)
        mid = np.floor(t / c)
        return np.where(p > 1, first + last + np.maximum(p - 2, 0) * mid, np.floor((t - e - g) / c))

    lo = np.maximum((L * c + e + g) / p, np.maximum(e, g))  # never below the average or an end
    hi = L * c + e + g
    for _ in range(iterations):
        mid_t = 0.5 * (lo + hi)
        ok = capacity(mid_t) >= L
        hi = np.where(ok, mid_t, hi)
        lo = np.where(ok, lo, mid_t)
    return hi


def pipeline_makespan_s(
    t_first_s: np.ndarray,
    t_mid_s: np.ndarray,
    t_last_s: np.ndarray,
    pp: np.ndarray,
    vp: np.ndarray,
    m: np.ndarray,
    schedule: np.ndarray,
    fwd_fraction: np.ndarray,
    w_fraction: np.ndarray,
    t_max_s: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Makespan of one pipelined step and its steady-state (bubble-free) part [s].

    Stage times are forward+backward of one micro-batch on the first, a middle and the last
    stage. The slowest stage paces the steady state (``m * t_max``); the fill and drain add the
    other stages once, divided by ``v`` for the interleaved schedule:
    ``T = m*t_max + (sum_stages - t_max) / v``, which for uniform stages is the
    ``(m + (p-1)/v) * t`` of Narayanan et al. 2021 (Sec. 2.2.1-2.2.2). ZB-H1 (Qi et al. 2024,
    Sec. 3) fills the bubble with deferred weight-gradient work: the fill/drain term shrinks to
    ``max(F + B - W, F, B)/(F + B + W)``, with ``F = fwd_fraction`` and ``W = w_fraction`` of
    the stage time and ``B`` the rest.

    ``t_max_s``, when given, is the slowest stage of an uneven split (see
    :func:`bottleneck_stage_s`); the stage times then only give the total.

    Returns ``(makespan_s, steady_s)``.
    """
    p = pp.astype(np.float64)
    t_max = np.maximum(np.maximum(t_first_s, t_last_s), t_mid_s)
    if t_max_s is not None:
        t_max = t_max_s
    total = np.where(p > 1, t_first_s + t_last_s + np.maximum(p - 2, 0) * t_mid_s, t_first_s)
    fill = total - t_max
    fill = np.where(schedule == Schedule.INTERLEAVED, fill / vp, fill)
    # ZB-H1 (Qi et al. 2024, Sec. 3.1): the fill/drain is (p-1)*max(F+B-W, F, B) instead of
    # (p-1)*(F+B+W), with B the input-gradient and W the weight-gradient part of the backward;
    # the max(.., F, B) bounds come from our simulator (docs/pipeline.md). 1/3 when equal.
    fill = np.where(schedule == Schedule.ZB, fill * zb_fill_factor(fwd_fraction, w_fraction),
                    fill)
    steady = m * t_max
    return steady + fill, steady


def zb_fill_factor(fwd_fraction, w_fraction) -> np.ndarray:
    """ZB-H1's fill / drain per stage as a share of the stage time (Qi et al. 2024, Sec. 3.1):
    ``max(F + B - W, F, B)``, with ``F`` the forward, ``W`` the weight-gradient and ``B`` the
    rest of the backward (the ``max(.., F, B)`` bounds from our simulator, docs/pipeline.md);
    1/3 when the three are equal."""
    f = np.asarray(fwd_fraction, dtype=np.float64)
    w = np.asarray(w_fraction, dtype=np.float64)
    b_in = 1.0 - f - w
    return np.clip(np.maximum(np.maximum(f + b_in - w, f), b_in), 0.0, 1.0)


def zero3_gather_window_s(makespan_s, steady_s, schedule) -> np.ndarray:
    """The compute time that hides the prefetched ZeRO-3 gathers [s]: the steady compute
    (``m`` times the slowest stage), or with ZB-H1 the whole makespan.

    ZB-H1 (Qi et al. 2024, Sec. 3) fills the fill / drain with the stage's own deferred
    weight-gradient passes; what is left idle are gaps between passes already scheduled, whose
    gathers the prefetch has issued and which run on the link whatever the compute stream does.
    This is what keeps the step monotone: the ZB-H1 fill is ``(p - 1) max(F + B - W, F, B)``,
    which grows when the weight-gradient pass ``W`` gets faster; with the steady compute alone
    as the window, gathers longer than it would be exposed by the steady compute's whole
    shrink while the fill grew, and a faster GPU made the step slower (makespan + exposed
    gathers = ``max(makespan, gathers + fill)``). With the makespan as the window the sum is
    ``max(makespan, gathers)``. The other schedules' fill (stages waiting for each other's
    activations, nothing of their own to run) is not in the window; it never grows as a pass
    gets faster (``sum - max`` of the stage times).
    """
    makespan = np.asarray(makespan_s, dtype=np.float64)
    steady = np.asarray(steady_s, dtype=np.float64)
    return np.where(np.asarray(schedule) == Schedule.ZB, np.maximum(makespan, steady), steady)


def _link_streams(comm, tiers, b, m, layers_per_stage, sends, p2p_s, tp_link_s, dp_grad_s,
                  z3_s):
    """Everything one GPU sends per step, as ``name -> (link time [s], tier)`` for
    :func:`perfmodel.comm.comm_time.link_busy_s`: the tensor-parallel collectives and ring-attention
    exchanges of every layer and micro-batch, the pipeline sends (both directions), the
    data-parallel gradient reduction (+ ZeRO-1/2 parameter all-gather) and the ZeRO-3 gathers."""
    per_stage = layers_per_stage * m
    cp_link_s = np.where(b.cp > 1, comm["cp_layer_fwd_s"] + comm["cp_layer_bwd_s"], 0.0)
    return {
        "tp": (per_stage * tp_link_s, tiers["tp"]),
        "cp": (per_stage * cp_link_s, tiers["cp"]),
        "pp": (m * sends * p2p_s, tiers["pp"]),
        "dp": (dp_grad_s + z3_s, tiers["dp_cp"]),
    }


def _busy_on_tier(tier_busy_s: np.ndarray, tier) -> np.ndarray:
    """The busy time of each configuration's own tier ``tier`` (array of indices, -1 none)."""
    t = np.asarray(tier).astype(np.int64)
    if tier_busy_s.size == 0:
        return np.zeros(t.shape)
    idx = np.clip(t, 0, tier_busy_s.shape[0] - 1)
    return np.where(t >= 0, np.take_along_axis(tier_busy_s, idx[None, :], axis=0)[0], 0.0)


def _hidden_comm_s(training, m, layers_per_stage, sends, p2p_s, pp_exposed_s, dp_grad_s,
                   dp_exposed_s, z3_s, zero3_exposed_s):
    """Communication that runs under compute over the step [s]: what the overlapped pipeline
    sends, gradient reduction and ZeRO-3 gathers hide (their link time less their exposed
    part). Blocking (non-overlapped) communication hides nothing."""
    hidden = np.zeros_like(np.asarray(dp_grad_s, dtype=np.float64))
    if training.overlap_p2p_comm:
        hidden = hidden + np.maximum(m * sends * p2p_s - pp_exposed_s, 0.0)
    if training.overlap_grad_reduce:
        hidden = hidden + np.maximum(dp_grad_s - dp_exposed_s, 0.0)
        hidden = hidden + np.maximum(z3_s - zero3_exposed_s, 0.0)
    return hidden


def _offload_s(model, training, cluster, b, layers, ct) -> np.ndarray:
    """Exposed CPU-offload copy time of one micro-batch through a stage of ``layers`` layers
    (:func:`perfmodel.memory.offload.exposed_offload_s`)."""

    act = memory.layer_activation_bytes(
        training.seq_len / b.cp, b.micro_batch_size, model.hidden_size,
        model.num_attention_heads, tp=b.tp, sequence_parallel=b.sequence_parallel,
        ffn_hidden_size=model.ffn_hidden_size, num_kv_heads=model.kv_heads,
        head_dim=model.head_size, gated_mlp=model.gated_mlp, recompute=b.recompute,
        flash=training.flash_attention, dropout=model.position_embedding == "learned",
        gemm_input_bytes=memory.fp8_gemm_input_bytes(training.precision))
    return offload.exposed_offload_s(
        training.cpu_offload_layers, layers, act, ct["layer_fwd_s"], ct["layer_bwd_s"],
        offload.host_link_bytes_per_s(cluster.gpu))


def tp_exposed_s(tp_link_s, layer_compute_s, overlapped: bool, slowdown):
    """Exposed tensor-parallel communication of one layer and the slowdown of the GEMMs that
    hide it [s], as ``(tp_comm_s, tp_overlap_s)``.

    Without overlap the whole link time is exposed. With Transformer Engine userbuffers
    (``--tp-comm-overlap``, ``transformer_engine/pytorch/module/base.py``) the GEMMs are split
    into chunks that hide the collectives: the window is half the layer's compute (the GEMMs of
    forward and backward), what remains is the part longer than it, bounded below by one chunk
    (10 % of the link time); the hiding GEMMs run slower while the communication kernels hold
    SMs (:func:`perfmodel.hardware.overlap.overlap_slowdown_s`).
    """
    if not overlapped:
        return tp_link_s, np.zeros_like(tp_link_s)
    gemm_window_s = layer_compute_s * 0.5
    tp_comm_s = np.maximum(tp_link_s - gemm_window_s, tp_link_s * 0.1)
    return tp_comm_s, overlap.overlap_slowdown_s(tp_link_s - tp_comm_s, gemm_window_s, slowdown)


def cp_exposed_s(model, training, b, ct, comm, slowdown):
    """Exposed ring-attention K/V exchange of one layer and the slowdown of the attention
    kernels that hide the rest [s], as ``(cp_comm_s, cp_overlap_s)``: Transformer Engine's
    ``AttnFuncWithCPAndKVP2P`` runs each ring step's send under the current step's attention
    block (:func:`perfmodel.comm.cp_ring.ring_layer_s`, blocks from the layer's attention time
    ``ct["attn_fwd_s"]`` / ``ct["attn_bwd_s"]``). Full recompute, and selective recompute of
    ``core_attn`` (Megatron-Core checkpoints the whole ``core_attention``, ring included),
    re-run the forward ring. Rows with ``cp_comm = "a2a"`` (Ulysses) expose their all-to-alls
    whole and slow nothing (:func:`perfmodel.comm.cp_a2a.a2a_layer_s`), ``"allgather"`` rows
    their K/V all-gathers and dK/dV reduce-scatters
    (:func:`perfmodel.comm.cp_allgather.allgather_layer_s`), ``"a2a+p2p"`` rows the inner
    group's all-to-alls and what the outer ring leaves
    (:func:`perfmodel.comm.cp_hierarchical.hierarchical_layer_s`)."""
    a = model.attention_layer_fraction if model.is_hybrid else 1.0
    rerun = (b.recompute == Recompute.FULL) | ((b.recompute == Recompute.SELECTIVE)
                                                & ("core_attn" in training.recompute_modules))
    comm_s, overlap_s = cp_ring.ring_layer_s(b.cp, ct["attn_fwd_s"], ct["attn_bwd_s"],
                                             comm["cp_kv_send_s"], comm["cp_kv_dkv_send_s"],
                                             rerun, slowdown, a)
    a2a = b.cp_comm == CpComm.A2A
    if np.any(a2a):  # Ulysses: the all-to-alls before and after the attention core, none hidden
        exposed = cp_a2a.a2a_layer_s(b.cp, comm["cp_qkv_a2a_s"], comm["cp_out_a2a_s"], rerun, a)
        comm_s, overlap_s = np.where(a2a, exposed, comm_s), np.where(a2a, 0.0, overlap_s)
    ag = b.cp_comm == CpComm.ALLGATHER
    if np.any(ag):  # the K/V all-gathers and dK/dV reduce-scatters, none hidden
        exposed = cp_allgather.allgather_layer_s(b.cp, comm["cp_kv_gather_s"],
                                                 comm["cp_dkv_scatter_s"], rerun, a)
        comm_s, overlap_s = np.where(ag, exposed, comm_s), np.where(ag, 0.0, overlap_s)
    hier = b.cp_comm == CpComm.A2A_P2P
    if np.any(hier):  # the inner group's all-to-alls around the outer ring
        exposed, slow = cp_hierarchical.hierarchical_layer_s(
            b.cp, b.cp_a2a, ct["attn_fwd_s"], ct["attn_bwd_s"], comm["cp_kv_send_s"],
            comm["cp_kv_dkv_send_s"], comm["cp_qkv_a2a_s"], comm["cp_out_a2a_s"], rerun,
            slowdown, a)
        comm_s, overlap_s = np.where(hier, exposed, comm_s), np.where(hier, slow, overlap_s)
    return comm_s, overlap_s


def ep_exposed_s(model, training, b, ep_layer_fwd_s, ep_layer_bwd_s, layer_compute_s
                 ) -> np.ndarray:
    """Exposed MoE token dispatch + combine per layer [s], averaged over the layers (MoE
    layers are ``model.moe_layer_fraction`` of them); with ``overlap_moe_comm`` where
    Megatron-Core runs it (:func:`perfmodel.moe.experts.a2a_overlap_applies`) a share of what fits
    under the layer's compute is hidden (:func:`perfmodel.moe.experts.a2a_overlap_exposed_s`)."""
    ep_comm_s = model.moe_layer_fraction * (ep_layer_fwd_s + ep_layer_bwd_s)
    if training.overlap_moe_comm:
        ep_comm_s = np.where(moe.a2a_overlap_applies(training, b),
                             moe.a2a_overlap_exposed_s(ep_comm_s, layer_compute_s), ep_comm_s)
    return ep_comm_s


def head_stage_s(model, layer_s, logits_s) -> np.ndarray:
    """The last stage's head [s]: logits + loss, plus DeepSeek-V3's multi-token prediction
    modules when the model has them (:func:`perfmodel.compute.mtp.mtp_stage_s`; DeepSeek-AI 2024,
    Sec. 2.2)."""
    if model.mtp_num_layers:
        return logits_s + mtp_stage_s(model, layer_s, logits_s)
    return logits_s


def first_mid_last_times_s(n_first, n_mid, n_last, layer_s, embed_s, head_s, pp):
    """Forward + backward of one micro-batch on the first, a middle and the last pipeline
    stage [s], as ``(t_first, t_mid, t_last)``: their layers, the embedding on the first and
    the head on the last; with pp = 1 the one stage holds all three (Narayanan et al. 2021,
    Sec. 2.2)."""
    single = pp == 1
    t_first = np.where(single, n_first * layer_s + embed_s + head_s, n_first * layer_s + embed_s)
    t_last = np.where(single, t_first, n_last * layer_s + head_s)
    t_mid = n_mid * layer_s
    return t_first, t_mid, t_last


def backward_fractions(layer_fwd_s, layer_bwd_s, layer_bwd_gemm_s):
    """Forward and weight-gradient shares of a layer's forward + backward, as
    ``(fwd_fraction, w_fraction)`` for ZB-H1 (Qi et al. 2024, Sec. 3): the weight gradient is
    half the backward GEMM time ``layer_bwd_gemm_s`` (dgrad and wgrad cost the same FLOPs)."""
    denom = np.maximum(layer_fwd_s + layer_bwd_s, 1e-30)
    return layer_fwd_s / denom, 0.5 * layer_bwd_gemm_s / denom


def slowest_stage_s(t_first, t_mid, t_last, n_first, n_mid, n_last):
    """The slowest stage, which paces the steady state of uneven layouts (with or without
    interleaving), as ``(t_max_s, its layers)`` (Narayanan et al. 2021, Sec. 2.2)."""
    t_max = np.maximum(np.maximum(t_first, t_last), t_mid)
    return t_max, np.select([t_max == t_first, t_max == t_last], [n_first, n_last], n_mid)


def amax_exposed_s(training: TrainingSpec, cluster: ClusterSpec, b: ConfigBatch,
                   kernels: str = "fused") -> np.ndarray:
    """Step time of fp8 delayed scaling's amax reductions [s] (0 for other precisions and
    recipes, and for eager PyTorch without Transformer Engine):
    :func:`perfmodel.compute.quantise.amax_reduction_s` with the latency-bound all-reduce of a few
    hundred bytes over Megatron-Core's amax-reduction group, the ``tp*cp*dp`` ranks of a
    pipeline stage (``get_amax_reduction_group(with_context_parallel=True)``; stride 1), at
    the fastest algorithm (:func:`perfmodel.comm.comm_time.all_reduce_auto_time`)."""
    n = len(b)
    if kernels != "fused" or training.precision_name not in quantise.AMAX_REDUCED_RECIPES:
        return np.zeros(n)
    # a search batch has few distinct group sizes: place each once, spread back
    sizes, codes = np.unique((b.tp * b.cp * b.dp).astype(np.float64), return_inverse=True)
    group = group_placement(cluster, sizes, np.ones(len(sizes)))
    ar_s = np.where(sizes > 1, comm_time_mod.all_reduce_auto_time(np.zeros(len(sizes)), group),
                    0.0)
    return quantise.amax_reduction_s(b.num_microbatches, b.vp, ar_s[codes.reshape(n)],
                                     KERNEL_MIN_S)


def stage_comm_shares(layers_per_stage, t_max, tp_comm_s, cp_comm_s, ep_comm_s, tp_overlap_s
                      ) -> dict[str, np.ndarray]:
    """Shares of the slowest stage's time spent in exposed TP, CP and EP communication and in
    the TP-overlap slowdown (``comm``, ``tp``, ``cp``, ``ep``, ``tp_overlap``; 0 for an empty
    stage): how the steady part of the step splits in the breakdown."""
    comm_share = np.where(t_max > 0, (layers_per_stage * (tp_comm_s + cp_comm_s + ep_comm_s))
                          / t_max, 0.0)
    tp_share = np.where(t_max > 0, (layers_per_stage * tp_comm_s) / t_max, 0.0)
    ep_share = np.where(t_max > 0, (layers_per_stage * ep_comm_s) / t_max, 0.0)
    return {"comm": comm_share, "tp": tp_share, "cp": comm_share - tp_share - ep_share,
            "ep": ep_share,
            "tp_overlap": np.where(t_max > 0, (layers_per_stage * tp_overlap_s) / t_max, 0.0)}


def boundary_sends_per_microbatch(schedule, vp) -> np.ndarray:
    """Pipeline sends per micro-batch per stage boundary: one activation forward and one
    gradient backward, ``v`` times each with the interleaved schedule (Narayanan et al. 2021,
    Sec. 2.2.2)."""
    return 2.0 * np.where(schedule == Schedule.INTERLEAVED, vp, 1.0)


def exposed_p2p_s(overlapped: bool, pp, m, sends, p2p_s) -> np.ndarray:
    """Exposed pipeline p2p over the step [s]: every send of the ``m + pp - 1`` slots when
    blocking; only the fill and drain's ``pp - 1`` when overlapped with compute
    (``--overlap-p2p-communication``, Megatron-LM ``schedules.py``)."""
    return np.where(overlapped, (pp - 1) * sends * p2p_s, (m + pp - 1) * sends * p2p_s)


def dp_grad_link_s(b, comm) -> np.ndarray:
    """Link time of the data-parallel gradient reduction (+ ZeRO-1/2 parameter all-gather)
    where dp > 1, plus the routed experts' gradients over expert-dp on the same links
    (:mod:`perfmodel.moe.experts`) [s]."""
    return np.where(b.dp > 1, comm["dp_grad_s"], 0.0) + comm["expert_dp_grad_s"]


def zero3_gather_link_s(b, comm) -> np.ndarray:
    """Link time of the ZeRO-3 parameter gathers, dense and expert, where zero_stage = 3 [s]
    (Rajbhandari et al. 2020, Sec. 5)."""
    z3 = b.zero_stage == 3
    return (np.where(z3, comm["zero3_gather_s"], 0.0)
            + np.where(z3, comm["expert_zero3_gather_s"], 0.0))


def exposed_zero3_gather_s(overlapped: bool, z3_s, steady_s) -> np.ndarray:
    """Exposed ZeRO-3 gathers [s]: prefetched a layer ahead when the framework overlaps
    data-parallel communication (FSDP2, Megatron-FSDP), exposed only beyond the steady
    compute; fully exposed otherwise (DeepSpeed ZeRO-3 of 2021, Narayanan et al. 2021
    Table 2)."""
    if overlapped:
        return np.maximum(z3_s - steady_s, 0.0)
    return z3_s


def stream_span_s(makespan_s, zero3_exposed_s) -> np.ndarray:
    """The time the communication streams of a tier spread over [s]: the makespan plus the
    ZeRO-3 gathers it could not hide, ``makespan + zero3_exposed``.

    The gathers that do not fit under the steady compute run on after it, so they (and the
    streams beside them) spread over the longer time. With the makespan alone, a faster term
    inside it (a faster tensor-parallel link) would shorten the span while the gathers' exposed
    part grew by just as much, and crowd the gradient reduction's window with the same traffic
    as if the step had really shortened: the step grew when a link got faster. With the
    gathers' exposed part in it the span shrinks only as far as the step does, and
    :func:`perfmodel.comm.comm_time.window_share_s` adds at most that to the reduction.
    """
    return np.asarray(makespan_s, dtype=np.float64) + np.asarray(zero3_exposed_s,
                                                                   dtype=np.float64)


def time_breakdown_s(makespan_s, steady_s, shares, pp_exposed_s, dp_exposed_s,
                     zero3_exposed_s, optimizer_s, overlap_s, link_shared_s
                     ) -> dict[str, np.ndarray]:
    """The :data:`TIME_TERMS` breakdown [s]: the steady part split into compute / TP / CP / EP
    by their share of a stage (:func:`stage_comm_shares`), the bubble, the exposed
    communication, the optimizer and the slowdowns; the terms add up to the step time."""
    return {
        "compute": steady_s * (1.0 - shares["comm"] - shares["tp_overlap"]),
        "tp_comm": steady_s * shares["tp"],
        "cp_comm": steady_s * shares["cp"],
        "ep_comm": steady_s * shares["ep"],
        "bubble": makespan_s - steady_s,
        "pp_comm": pp_exposed_s,
        "dp_comm": dp_exposed_s,
        "zero3_comm": zero3_exposed_s,
        "optimizer": optimizer_s,
        "overlap_slowdown": steady_s * shares["tp_overlap"] + overlap_s,
        "link_shared": link_shared_s,
    }


def utilisation(flops_per_step, step_s, gpus, peak_flops) -> np.ndarray:
    """MFU or HFU: the FLOPs of a step over what ``gpus`` GPUs at the dense peak ``peak_flops``
    [FLOP/s] could run in ``step_s`` (Chowdhery et al. 2022, PaLM, App. B; the FLOP counts of
    :data:`MFU_CONVENTION`)."""
    return flops_per_step / (step_s * gpus * peak_flops)


def _exposed_dp_s(training, tier_busy_s, tiers, dp_grad_s, last_bwd_s, makespan_s):
    """Exposed gradient reduction [s]: hidden behind the backward of the last micro-batch when
    overlapped, sharing that window with the other streams of its tier (ZeRO-3 gathers,
    pipeline sends, ring attention; :func:`perfmodel.comm.comm_time.stream_busy_in_window_s`);
    fully exposed otherwise."""
    if not training.overlap_grad_reduce:
        return dp_grad_s
    dp_tier_busy_s = _busy_on_tier(tier_busy_s, tiers["dp_cp"])
    dp_need_s = comm_time_mod.stream_busy_in_window_s(dp_grad_s, dp_tier_busy_s, last_bwd_s,
                                                      makespan_s)
    return comm_time_mod.exposed_dp_time_s(dp_need_s, last_bwd_s)


def _with_layouts(model, training, cluster, b, ct, embed_s, head_s, even, *, kernels,
                  calibration):
    """The stage terms of ``even`` (``t_first, t_mid, t_last, t_max, layers_per_stage,
    layer_bwd_s``) with the rows that have a per-stage layout replaced by the layout's
    (:func:`_layout_stages`); returns them and the layout's hardware FLOPs. The backward that
    hides the gradient reduction is the slowest stage's, whose layers recompute only in part."""
    t_first, t_mid, t_last, t_max, layers_per_stage, layer_bwd_s = even
    lay = b.has_layout
    n = len(b)
    if lay.all():
        st = _layout_stages(model, training, cluster, b, embed_s, head_s, kernels=kernels,
                            calibration=calibration)
    else:  # price only the rows with a layout (the rest keep the even split's terms)
        idx = np.flatnonzero(lay)
        sub = _layout_stages(model, training, cluster, b.take(idx),
                             *(np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))[idx]
                               for x in (embed_s, head_s)),
                             kernels=kernels, calibration=calibration)
        st = {}
        for k, v in sub.items():
            full = np.zeros(n, dtype=np.float64)
            full[idx] = np.broadcast_to(v, idx.shape)
            st[k] = full
    t_first, t_mid, t_last = (np.where(lay, st[k], x) for k, x in
                              (("first", t_first), ("mid", t_mid), ("last", t_last)))
    t_max = np.where(lay, st["max"], t_max)
    layers_per_stage = np.where(lay, st["max_layers"], layers_per_stage)
    full_recompute = lay & (b.recompute == Recompute.FULL)
    layer_bwd_s = np.where(full_recompute, ct["layer_bwd_s"] + st["recompute_share"]
                           * ct["layer_recompute_s"], layer_bwd_s)
    return (t_first, t_mid, t_last, t_max, layers_per_stage, layer_bwd_s,
            st["hardware_flops"])


def _deepspeed_zero3_exposed_s(model, training, cluster, b, ct, layers_per_stage, dp_grad_s,
                               dp_exposed_s, zero3_exposed_s):
    """DeepSpeed ZeRO-3 of 2021 (``zero3_gather="tensor"``): each sub-module's compute hides
    only the next weight's gather, and gradient reduce-scatters wait for the next sub-module
    (:func:`perfmodel.comm.zero3_deepspeed.exposed_times_s`), so on ZeRO-3 rows the reduce-scatters
    are exposed in full. Returns ``(zero3_exposed_s, dp_exposed_s)``."""
    ds = zero3_deepspeed.exposed_times_s(
        model, training, b, parallel_groups(cluster, b, ("dp_cp",))["dp_cp"],
        ct["layer_fwd_s"], ct["layer_bwd_s"], ct["layer_recompute_s"], layers_per_stage)
    z3 = b.zero_stage == 3
    return (np.where(z3, ds["gather_exposed_s"], zero3_exposed_s),
            np.where(z3, dp_grad_s, dp_exposed_s))


@dataclass(frozen=True)
class _StepContext:
    """What every term of one :func:`evaluate` call reads: the specs, the batch, the kernels
    (``"fused"`` or ``"eager"``) and the calibration; ``m`` micro-batches per step and ``pp``,
    ``vp`` as floats; the layers of the first, a middle and the last pipeline rank
    (``n_first``, ``n_mid``, ``n_last``: Megatron-LM's layout, even, uneven first/last, or the
    embedding and the loss counted as layers, :func:`perfmodel.parallel.layers.stage_layer_counts`);
    one layer's kernel times ``ct`` [s] (:func:`perfmodel.compute.layer.compute_times`) and link
    times ``comm`` [s] (:func:`perfmodel.comm.comm_time.comm_times`); the GPU's ``slowdown`` of
    compute next to communication (:func:`perfmodel.hardware.overlap.overlap_slowdown_for`)."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    batch: ConfigBatch
    kernels: str
    calibration: object
    m: np.ndarray
    pp: np.ndarray
    vp: np.ndarray
    n_first: np.ndarray
    n_mid: np.ndarray
    n_last: np.ndarray
    ct: dict[str, np.ndarray]
    comm: dict[str, np.ndarray]
    slowdown: float


def _step_context(model, training, cluster, b, kernels, calibration) -> _StepContext:
    """The inputs of every term (:class:`_StepContext`): the layers per pipeline rank, then the
    compute (:func:`perfmodel.compute.layer.compute_times`) and link times
    (:func:`perfmodel.comm.comm_time.comm_times`) of one layer and one micro-batch."""
    m = b.num_microbatches.astype(np.float64)
    pp = b.pp.astype(np.float64)
    vp = b.vp.astype(np.float64)
    # layers per pipeline rank, Megatron-LM's layout (even, uneven first/last, or the embedding
    # and the loss counted as layers): perfmodel.parallel.layers.stage_layer_counts
    lc = b.layer_counts(model.num_layers)
    n_first, n_mid, n_last = (lc[k].astype(np.float64) for k in ("first", "middle", "last"))
    ct = compute.compute_times(model, training, cluster.gpu, b, kernels=kernels,
                               calibration=calibration)
    comm = comm_time_mod.comm_times(model, training, cluster, b)
    # hybrid sharding and offload to the host (perfmodel.step.host_and_sharding; unchanged
    # without them): the window hiding the gradients' copy is the slowest stage's backward
    bwd_window_s = (np.maximum(np.maximum(n_first, n_mid), n_last)
                    * (ct["layer_bwd_s"] + ct["layer_recompute_s"]))
    ct, comm = with_sharding_and_offload(model, training, cluster, b, ct, comm, bwd_window_s)
    return _StepContext(model=model, training=training, cluster=cluster, batch=b,
                        kernels=kernels, calibration=calibration, m=m, pp=pp, vp=vp,
                        n_first=n_first, n_mid=n_mid, n_last=n_last, ct=ct, comm=comm,
                        slowdown=overlap.overlap_slowdown_for(cluster.gpu))


@dataclass(frozen=True)
class _LayerTerms:
    """One layer, one micro-batch [s]: forward ``fwd_s``, backward ``bwd_s`` (recompute
    included), the tensor-parallel link time ``tp_link_s``, the exposed TP / CP / EP
    communication, ``overlap_s`` (compute slowed by the TP and CP communication it hides) and
    their sum ``total_s``."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    tp_link_s: np.ndarray
    tp_comm_s: np.ndarray
    cp_comm_s: np.ndarray
    ep_comm_s: np.ndarray
    overlap_s: np.ndarray
    total_s: np.ndarray


def _layer_terms_s(c: _StepContext) -> _LayerTerms:
    """Step 1, one layer and one micro-batch [s]: its compute (forward, and backward with the
    recompute), plus what tensor- (:func:`tp_exposed_s`), context- (:func:`cp_exposed_s`) and
    expert-parallel (:func:`ep_exposed_s`) communication leaves exposed, plus the slowdown of
    the compute that hides TP and CP communication (Narayanan et al. 2021, Sec. 3; Korthikanti
    et al. 2022, Sec. 5)."""
    model, training, b, ct, comm = c.model, c.training, c.batch, c.ct, c.comm
    layer_fwd_s = ct["layer_fwd_s"]
    layer_bwd_s = ct["layer_bwd_s"] + ct["layer_recompute_s"]
    tp_link_s = comm["tp_layer_fwd_s"] + comm["tp_layer_bwd_s"]
    tp_comm_s, tp_overlap_s = tp_exposed_s(tp_link_s, layer_fwd_s + layer_bwd_s,
                                           training.overlap_tp_comm, c.slowdown)
    cp_comm_s, cp_overlap_s = cp_exposed_s(model, training, b, ct, comm, c.slowdown)
    tp_overlap_s = tp_overlap_s + cp_overlap_s  # both: compute slowed by the comm it hides
    ep_comm_s = ep_exposed_s(model, training, b, comm["ep_layer_fwd_s"], comm["ep_layer_bwd_s"],
                             layer_fwd_s + layer_bwd_s)
    layer_s = (layer_fwd_s + layer_bwd_s + tp_comm_s + cp_comm_s + ep_comm_s
               + tp_overlap_s)
    return _LayerTerms(fwd_s=layer_fwd_s, bwd_s=layer_bwd_s, tp_link_s=tp_link_s,
                       tp_comm_s=tp_comm_s, cp_comm_s=cp_comm_s, ep_comm_s=ep_comm_s,
                       overlap_s=tp_overlap_s, total_s=layer_s)


@dataclass(frozen=True)
class _StageTerms:
    """One micro-batch, forward + backward [s]: the embedding ``embed_s``, logits + loss
    ``logits_s``, the last stage's head ``head_s`` (:func:`head_stage_s`) and the first, a
    middle and the last stage's time."""

    embed_s: np.ndarray
    logits_s: np.ndarray
    head_s: np.ndarray
    first_s: np.ndarray
    mid_s: np.ndarray
    last_s: np.ndarray


def _stage_terms_s(c: _StepContext, layer: _LayerTerms) -> _StageTerms:
    """Step 2, the per-stage time of one micro-batch (forward + backward) [s]: the stage's
    layers, the embedding on the first and the head on the last stage (:func:`first_mid_last_times_s`,
    Narayanan et al. 2021, Sec. 2.2), plus the exposed CPU activation-offload copies with fused
    kernels (:func:`_offload_s`)."""
    ct = c.ct
    embed_s = ct["embed_fwd_s"] + ct["embed_bwd_s"]
    logits_s = ct["logits_fwd_s"] + ct["logits_bwd_s"]
    head_s = head_stage_s(c.model, layer.total_s, logits_s)
    t_first, t_mid, t_last = first_mid_last_times_s(c.n_first, c.n_mid, c.n_last, layer.total_s, embed_s,
                                           head_s, c.pp)
    if c.training.cpu_offload_layers and c.kernels == "fused":  # CPU activation offloading
        t_first, t_mid, t_last = (t + _offload_s(c.model, c.training, c.cluster, c.batch, n, ct)
                                  for t, n in ((t_first, c.n_first), (t_mid, c.n_mid),
                                               (t_last, c.n_last)))
    return _StageTerms(embed_s=embed_s, logits_s=logits_s, head_s=head_s, first_s=t_first,
                       mid_s=t_mid, last_s=t_last)


@dataclass(frozen=True)
class _PipelineTerms:
    """The pipelined step [s]: ``makespan_s`` and its steady (bubble-free) part ``steady_s``;
    the slowest stage's layers ``layers_per_stage`` and their backward per layer
    ``layer_bwd_s`` (the window that hides the gradient reduction); the stage's
    communication shares (:func:`stage_comm_shares`); the hardware FLOPs of per-stage layouts
    ``hardware_flops_layout`` [FLOP] (None without layouts)."""

    makespan_s: np.ndarray
    steady_s: np.ndarray
    zero3_window_s: np.ndarray
    layers_per_stage: np.ndarray
    layer_bwd_s: np.ndarray
    shares: dict[str, np.ndarray]
    hardware_flops_layout: np.ndarray | None


def _pipeline_terms_s(c: _StepContext, layer: _LayerTerms, stages: _StageTerms
                      ) -> _PipelineTerms:
    """Step 3, the pipeline makespan over ``m`` micro-batches with the schedule's bubble, paced
    by the slowest stage (:func:`slowest_stage_s`, or a per-stage layout's,
    :func:`_with_layouts`; :func:`pipeline_makespan_s`, Narayanan et al. 2021, Sec. 2.2; ZB-H1's
    forward and weight-gradient shares from :func:`backward_fractions`, Qi et al. 2024), and
    how the slowest stage splits into compute and communication (:func:`stage_comm_shares`)."""
    b = c.batch
    t_first, t_mid, t_last = stages.first_s, stages.mid_s, stages.last_s
    layer_bwd_s = layer.bwd_s
    fwd_fraction, w_fraction = backward_fractions(layer.fwd_s, layer_bwd_s, c.ct["layer_bwd_s"])
    t_max, layers_per_stage = slowest_stage_s(t_first, t_mid, t_last, c.n_first, c.n_mid,
                                              c.n_last)
    hflops_layout = None
    if b.stage_layers is not None and np.any(b.has_layout):  # per-stage layouts
        (t_first, t_mid, t_last, t_max, layers_per_stage, layer_bwd_s,
         hflops_layout) = _with_layouts(
            c.model, c.training, c.cluster, b, c.ct, stages.embed_s, stages.head_s,
            (t_first, t_mid, t_last, t_max, layers_per_stage, layer_bwd_s),
            kernels=c.kernels, calibration=c.calibration)
    makespan_s, steady_s = pipeline_makespan_s(t_first, t_mid, t_last, c.pp, c.vp, c.m,
                                               b.schedule, fwd_fraction, w_fraction,
                                               t_max_s=t_max)
    shares = stage_comm_shares(layers_per_stage, t_max, layer.tp_comm_s, layer.cp_comm_s,
                               layer.ep_comm_s, layer.overlap_s)
    return _PipelineTerms(makespan_s=makespan_s, steady_s=steady_s,
                          zero3_window_s=zero3_gather_window_s(makespan_s, steady_s, b.schedule),
                          layers_per_stage=layers_per_stage, layer_bwd_s=layer_bwd_s,
                          shares=shares, hardware_flops_layout=hflops_layout)


@dataclass(frozen=True)
class _P2PTerms:
    """Pipeline p2p: ``sends`` per micro-batch per stage boundary, the link time ``link_s`` of
    one send [s] (0 where pp = 1) and the exposed p2p over the step ``exposed_s`` [s]."""

    sends: np.ndarray
    link_s: np.ndarray
    exposed_s: np.ndarray


def _p2p_terms_s(c: _StepContext) -> _P2PTerms:
    """Step 4a, pipeline p2p [s]: the sends of a micro-batch (:func:`boundary_sends_per_microbatch`)
    and what stays exposed when blocking or overlapped (:func:`exposed_p2p_s`)."""
    sends = boundary_sends_per_microbatch(c.batch.schedule, c.vp)
    p2p_s = np.where(c.pp > 1, c.comm["pp_p2p_s"], 0.0)
    pp_exposed_s = exposed_p2p_s(c.training.overlap_p2p_comm, c.pp, c.m, sends, p2p_s)
    return _P2PTerms(sends=sends, link_s=p2p_s, exposed_s=pp_exposed_s)


@dataclass(frozen=True)
class _DataParallelTerms:
    """Data-parallel communication over the step [s]: the link time of the gradient reduction
    ``grad_link_s`` (+ ZeRO-1/2 parameter all-gather) and of the ZeRO-3 gathers
    ``zero3_link_s``, each tier's port busy time ``tier_busy_s`` (tiers x configs), and what
    stays exposed, ``dp_exposed_s`` and ``zero3_exposed_s``."""

    grad_link_s: np.ndarray
    zero3_link_s: np.ndarray
    tier_busy_s: np.ndarray
    dp_exposed_s: np.ndarray
    zero3_exposed_s: np.ndarray


def _dp_terms_s(c: _StepContext, layer: _LayerTerms, pipe: _PipelineTerms, p2p: _P2PTerms
                ) -> _DataParallelTerms:
    """Steps 4b-4c [s]: the data-parallel gradient reduction (and ZeRO-1/2 parameter
    all-gather, :func:`dp_grad_link_s`), sharing its window with the other streams on its tier
    (:func:`_link_streams`, :func:`perfmodel.comm.comm_time.link_busy_s`, :func:`_exposed_dp_s`);
    the ZeRO-3 parameter gathers (:func:`zero3_gather_link_s`, :func:`exposed_zero3_gather_s`;
    DeepSpeed ZeRO-3 of 2021, :func:`_deepspeed_zero3_exposed_s`)."""
    model, training, cluster, b, comm = c.model, c.training, c.cluster, c.batch, c.comm
    dp_grad_s = dp_grad_link_s(b, comm)
    z3_s = zero3_gather_link_s(b, comm)
    tiers = parallel_group_tiers(cluster, b, ("tp", "cp", "pp", "dp_cp"))
    streams = _link_streams(comm, tiers, b, c.m, pipe.layers_per_stage, p2p.sends, p2p.link_s,
                            layer.tp_link_s, dp_grad_s, z3_s)
    tier_busy_s = comm_time_mod.link_busy_s(streams, len(cluster.tiers))
    last_bwd_s = pipe.layers_per_stage * pipe.layer_bwd_s
    # 4c. ZeRO-3 parameter gathers, then the gradient reduction, whose tier's other streams
    # spread over the makespan stretched by the gathers it could not hide (:func:`stream_span_s`).
    zero3_exposed_s = exposed_zero3_gather_s(training.overlap_grad_reduce, z3_s,
                                             pipe.zero3_window_s)
    dp_exposed_s = _exposed_dp_s(training, tier_busy_s, tiers, dp_grad_s, last_bwd_s,
                                 stream_span_s(pipe.makespan_s, zero3_exposed_s))
    if training.zero3_gather == "tensor":  # DeepSpeed ZeRO-3 of 2021
        zero3_exposed_s, dp_exposed_s = _deepspeed_zero3_exposed_s(
            model, training, cluster, b, c.ct, pipe.layers_per_stage, dp_grad_s, dp_exposed_s,
            zero3_exposed_s)
    return _DataParallelTerms(grad_link_s=dp_grad_s, zero3_link_s=z3_s, tier_busy_s=tier_busy_s,
                              dp_exposed_s=dp_exposed_s, zero3_exposed_s=zero3_exposed_s)


def _comm_overlap_slowdown_s(c: _StepContext, pipe: _PipelineTerms, p2p: _P2PTerms,
                             dp: _DataParallelTerms) -> np.ndarray:
    """Step 6, compute slowed by the communication it hides over the step [s] (NCCL kernels
    hold SMs and HBM): the hidden pipeline sends, gradient reduction and ZeRO-3 gathers
    (:func:`_hidden_comm_s`) next to the makespan's compute
    (:func:`perfmodel.hardware.overlap.overlap_slowdown_s`)."""
    hidden_s = _hidden_comm_s(c.training, c.m, pipe.layers_per_stage, p2p.sends, p2p.link_s,
                              p2p.exposed_s, dp.grad_link_s, dp.dp_exposed_s, dp.zero3_link_s,
                              dp.zero3_exposed_s)
    return overlap.overlap_slowdown_s(hidden_s, pipe.makespan_s, c.slowdown)


def step_time_s(makespan_s, pp_comm_s, dp_comm_s, zero3_comm_s, optimizer_s, overlap_s, amax_s,
                tier_busy_s) -> tuple[np.ndarray, np.ndarray]:
    """The step time [s] and its shared-link part, as ``(step_s, link_shared_s)``.

    The sum of the pipeline makespan, the exposed pipeline p2p, data-parallel and ZeRO-3
    communication, the optimizer step, the overlap slowdown and fp8's amax reductions
    (``amax_s``); then step 4d, shared links: each tier's port must carry all its streams
    (``tier_busy_s``, tiers x configs); the stream-by-stream exposed terms assumed each had the
    link to itself. Whatever does not fit in the step so far is exposed too (the optimizer step
    cannot overlap the gradient traffic; :func:`perfmodel.comm.comm_time.shared_link_excess_s`).
    """
    step_s = (makespan_s + pp_comm_s + dp_comm_s + zero3_comm_s + optimizer_s
              + overlap_s + amax_s)
    link_shared_s = comm_time_mod.shared_link_excess_s(tier_busy_s, step_s, optimizer_s)
    return step_s + link_shared_s, link_shared_s


def _flops_and_utilisation(c: _StepContext, step_s, hardware_flops_layout
                           ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Model and hardware FLOPs of a step [FLOP] and their utilisation of the GPUs' dense peak
    (:func:`peak_flops_for`, :func:`utilisation`; :data:`MFU_CONVENTION`), as
    ``(model_flops, hardware_flops, mfu, hfu)``. Flash attention skips the masked upper
    triangle of causal attention: the hardware runs the causal count. Unfused attention
    computes (and masks) the whole s x s square. Rows with a per-stage layout take the
    layout's hardware FLOPs (:func:`_layout_stages`)."""
    model, training, b = c.model, c.training, c.batch
    gpus = b.gpus.astype(np.float64)
    model_flops = flops.model_flops_per_step(model, training)
    hardware_flops = flops.hardware_flops_per_step(model, training, b.recompute,
                                                   causal=training.flash_attention)
    if hardware_flops_layout is not None:
        hardware_flops = np.where(b.has_layout, hardware_flops_layout, hardware_flops)
    peak_flops = peak_flops_for(c.cluster, training.precision, c.kernels)
    return (model_flops, hardware_flops, utilisation(model_flops, step_s, gpus, peak_flops),
            utilisation(hardware_flops, step_s, gpus, peak_flops))


def _memory_and_comm_bytes(c: _StepContext
                           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Memory per GPU by term [bytes] and whether it fits
    (:func:`perfmodel.memory.breakdown.memory_breakdown`), and the bytes each GPU sends per step by
    parallel dimension (:func:`perfmodel.comm.comm_volume.comm_bytes_per_gpu`), as
    ``(memory_bytes, comm_bytes_per_gpu, fits)``."""
    training, b = c.training, c.batch
    mem = memory.memory_breakdown(c.model, training, c.cluster, b, kernels=c.kernels,
                                  flash_attention=training.flash_attention)
    vol = comm_volume.comm_bytes_per_gpu(c.model, training, b)
    return ({k: np.asarray(mem[k], dtype=np.float64) for k in MEMORY_TERMS},
            {k: np.asarray(vol[k], dtype=np.float64) for k in COMM_DIMS},
            np.asarray(mem["fits"], dtype=bool))


def _extra_terms_s(c: _StepContext, tier_busy_s, layer: _LayerTerms, stages: _StageTerms
                   ) -> dict[str, np.ndarray]:
    """``StepResult.extra`` [s]: per-tier port busy time over the step (not a term of the sum:
    it runs under the others), and the one-layer and head terms that per-stage layouts re-use
    (:func:`_layout_stages`), one value per configuration."""
    m = c.m
    extra = {f"link_busy_{t.name}_s": tier_busy_s[i] for i, t in enumerate(c.cluster.tiers)}
    return {**extra, "layer_s": np.asarray(layer.total_s, dtype=np.float64),
            "layer_fwd_s": np.asarray(layer.fwd_s, dtype=np.float64) + 0.0 * m,
            "embed_s": np.asarray(stages.embed_s, dtype=np.float64) + 0.0 * m,
            "logits_s": np.asarray(stages.logits_s, dtype=np.float64) + 0.0 * m,
            "head_s": np.asarray(stages.head_s, dtype=np.float64) + 0.0 * m}


def evaluate(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    batch: ConfigBatch,
    *,
    kernels: str = "fused",
    calibration=None,
) -> StepResult:
    """Predict step time, throughput, MFU, memory and communication for every config of
    ``batch``.

    Parameters
    ----------
    model, training, cluster : specs (see :mod:`perfmodel.spec.specs`).
    batch : configurations, ``num_microbatches`` filled in (see :func:`resolve_config`).
    kernels : ``"fused"`` (Megatron-LM / Transformer Engine kernels) or ``"eager"`` (plain
        PyTorch eager, as in the H200 single-GPU calibration runs).
    calibration : a :class:`perfmodel.hardware.calibration.Calibration`, or None for the GPU's shipped one
        (or datasheet scaling when there is none).

    The recipe: the inputs (:func:`_step_context`: compute and link times of one layer), one
    layer (:func:`_layer_terms_s`: :func:`tp_exposed_s`, :func:`cp_exposed_s`,
    :func:`ep_exposed_s`), the stages (:func:`_stage_terms_s`: :func:`head_stage_s`,
    :func:`first_mid_last_times_s`, :func:`_offload_s`), the pipeline (:func:`_pipeline_terms_s`:
    :func:`backward_fractions`, :func:`slowest_stage_s`, :func:`pipeline_makespan_s`,
    :func:`stage_comm_shares`), the exposed communication (:func:`_p2p_terms_s`:
    :func:`boundary_sends_per_microbatch`, :func:`exposed_p2p_s`; :func:`_dp_terms_s`:
    :func:`dp_grad_link_s`, :func:`zero3_gather_link_s`, :func:`_exposed_dp_s`,
    :func:`exposed_zero3_gather_s`), the optimizer, the overlap slowdown
    (:func:`_comm_overlap_slowdown_s`), fp8's amax reductions (:func:`amax_exposed_s`), the sum
    with the shared links (:func:`step_time_s`), then :func:`time_breakdown_s`, MFU / HFU
    (:func:`_flops_and_utilisation`) and memory (:func:`_memory_and_comm_bytes`).

    References
    ----------
    Narayanan et al. 2021 (SC21), Sec. 2-3 (pipeline and tensor parallel time);
    Korthikanti et al. 2022, Sec. 5 (recompute and sequence parallelism);
    Qi et al. 2024 (zero-bubble schedules).
    """
    # MoE routing imbalance (--moe-imbalance): the busiest expert's rows (perfmodel.moe.imbalance)
    model = with_imbalance(model, training.moe_imbalance,
                           training.moe_pad_expert_input_to_capacity)
    # a2a+p2p rows without their a2a size: the largest the NVLink domain takes
    batch = with_hierarchical_sizes(batch, model, cluster.scale_up_size)
    c = _step_context(model, training, cluster, batch, kernels, calibration)
    # 1. one layer, one micro-batch: compute, plus what TP/CP/EP communication leaves exposed.
    layer = _layer_terms_s(c)
    # 2. per-stage time of one micro-batch (forward + backward).
    stages = _stage_terms_s(c, layer)
    # 3. pipeline makespan with the schedule's bubble, paced by the slowest stage.
    pipe = _pipeline_terms_s(c, layer, stages)
    # 4a. pipeline p2p.
    p2p = _p2p_terms_s(c)
    # 4b-4c. data-parallel gradient reduction (and ZeRO-1/2 parameter all-gather), sharing its
    # window with the other streams on its tier (shared links, 4d); ZeRO-3 parameter gathers.
    dp = _dp_terms_s(c, layer, pipe, p2p)
    # 5. optimizer step over this GPU's shard.
    optimizer_s = c.ct["optimizer_s"]
    # 6. compute slowed by the communication it hides (NCCL kernels hold SMs and HBM).
    overlap_s = _comm_overlap_slowdown_s(c, pipe, p2p, dp)
    # 4e. fp8 delayed scaling: the amax all-reduce of every model chunk's forward and backward,
    # in series on each rank (counted with the data-parallel group's communication).
    amax_s = amax_exposed_s(training, cluster, batch, kernels)
    # the sum of the terms, then 4d. shared links: what the tiers' ports cannot carry in it.
    step_s, link_shared_s = step_time_s(pipe.makespan_s, p2p.exposed_s, dp.dp_exposed_s,
                                        dp.zero3_exposed_s, optimizer_s, overlap_s, amax_s,
                                        dp.tier_busy_s)
    time_s = time_breakdown_s(pipe.makespan_s, pipe.steady_s, pipe.shares, p2p.exposed_s,
                              dp.dp_exposed_s + amax_s, dp.zero3_exposed_s, optimizer_s,
                              overlap_s, link_shared_s)
    # Throughput, utilisation, memory (and whether it fits) and bytes sent.
    model_flops, hardware_flops, mfu, hfu = _flops_and_utilisation(c, step_s,
                                                                   pipe.hardware_flops_layout)
    memory_bytes, comm_bytes_per_gpu, fits = _memory_and_comm_bytes(c)
    tokens = float(training.global_batch_size * training.seq_len)
    n = len(batch)
    return StepResult(
        batch=batch,
        step_time_s=step_s,
        tokens_per_s=tokens / step_s,
        model_flops=np.broadcast_to(np.asarray(model_flops, dtype=np.float64), (n,)),
        hardware_flops=np.broadcast_to(np.asarray(hardware_flops, dtype=np.float64), (n,)),
        mfu=mfu,
        hfu=hfu,
        time_s=time_s,
        memory_bytes=memory_bytes,
        comm_bytes_per_gpu=comm_bytes_per_gpu,
        fits=fits,
        extra=_extra_terms_s(c, dp.tier_busy_s, layer, stages),
    )


def _layout_stages(model, training, cluster, b, embed_s, logits_s, *, kernels, calibration
                   ) -> dict[str, np.ndarray]:
    """Stage times of per-stage layouts (``stage_layers``, ``stage_recompute_layers``).

    One layer's time without and with full recompute comes from :func:`evaluate` itself on the
    batch without layouts (``extra["layer_s"]``), so a layout uses the very per-layer terms of
    the even split (:mod:`perfmodel.memory.stage_layout`). Returns ``first``, ``mid`` (mean of the middle
    stages), ``last``, ``max`` (the slowest stage), ``max_layers`` (its layers),
    ``recompute_share`` (the share of them recomputed) and ``hardware_flops`` (recomputed
    forwards of the recomputed layers only).
    """

    kw = {"kernels": kernels, "calibration": calibration}
    keep_b, full_b = layers_mod.without_layout(b, "keep"), layers_mod.without_layout(b, "full")
    layers, rec = layers_mod.stage_counts(model, b)
    if layers_mod.typed_layer_costs(model):  # a dense and an MoE layer each at its own time
        lt = layer_times_by_type(model, training, cluster, b, average=False, **kw)
        t = layers_mod.stage_times_s(layers, rec, lt["dense_keep"], lt["dense_full"], embed_s,
                                 logits_s, b.pp, layers_mod.stage_moe_layers(model, b, layers),
                                 lt["moe_keep"], lt["moe_full"])
    else:
        keep_s = evaluate(model, training, cluster, keep_b, **kw).extra["layer_s"]
        full_s = evaluate(model, training, cluster, full_b, **kw).extra["layer_s"]
        t = layers_mod.stage_times_s(layers, rec, keep_s, full_s, embed_s, logits_s, b.pp)
    pp = b.pp.astype(np.int64)
    rows = np.arange(len(b))
    total = t.sum(axis=1)
    first, last = t[:, 0], t[rows, pp - 1]
    mid = np.where(pp > 2, (total - first - last) / np.maximum(pp - 2, 1), first)
    k = np.argmax(t, axis=1)
    causal = training.flash_attention  # as in evaluate: flash attention runs the causal half
    h_keep = flops.hardware_flops_per_step(model, training, keep_b.recompute, causal=causal)
    h_full = flops.hardware_flops_per_step(model, training, full_b.recompute, causal=causal)
    frac = rec.sum(axis=1) / model.num_layers
    n_k = layers[rows, k].astype(np.float64)
    return {"first": first, "mid": mid, "last": last, "max": t[rows, k],
            "max_layers": n_k, "recompute_share": rec[rows, k] / np.maximum(n_k, 1.0),
            "hardware_flops": h_keep + frac * (h_full - h_keep)}


def layer_times_by_type(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                        batch: ConfigBatch, *, kernels: str = "fused", calibration=None,
                        average: bool = True) -> dict[str, np.ndarray]:
    """One layer's forward + backward time of one micro-batch [s], by type and recompute:
    ``keep`` / ``full`` (the model's average layer, :func:`perfmodel.step.evaluate.evaluate`'s
    ``extra["layer_s"]``) and, for an MoE model, ``dense_keep``, ``dense_full``, ``moe_keep``,
    ``moe_full`` from the same evaluation of :func:`moe_variants` (an MoE layer's all-to-all
    on the tier its ep group spans, grouped GEMMs, router and host terms included; a dense
    layer's MLP and its tensor-parallel collectives). ``average=False`` leaves out the
    average layer's."""

    kw = {"kernels": kernels, "calibration": calibration}
    if uniform_recompute(batch):
        # every layer of a row recomputes as the row says (no per-stage block recompute): one
        # evaluation per type, its time both ``keep`` and ``full`` (a stage's time is then
        # ``layers * keep + recomputed * 0``, the same as with the two apart, at half the cost)
        keep_b = full_b = without_layout(batch)
    else:
        keep_b, full_b = without_layout(batch, "keep"), without_layout(batch, "full")

    def layer_s(m, b):
        return evaluate(m, training, cluster, b, **kw).extra["layer_s"]

    out = {}
    typed = typed_layer_costs(model)
    if average or not typed:
        out = {"keep": layer_s(model, keep_b)}
        out["full"] = out["keep"] if full_b is keep_b else layer_s(model, full_b)
    if typed:
        for name, var in zip(("dense", "moe"), moe_variants(model)):
            out[f"{name}_keep"] = layer_s(var, keep_b)
            out[f"{name}_full"] = (out[f"{name}_keep"] if full_b is keep_b
                                   else layer_s(var, full_b))
    return out
