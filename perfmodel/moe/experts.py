"""Mixture-of-experts terms: expert-parallel token dispatch, expert shapes and parameters.

Layout (Megatron-Core MoE parallel folding, ``parallel_state.initialize_model_parallel`` with
``expert_tensor_parallel_size``): the attention of a pipeline stage runs on ``tp x cp x dp``
GPUs, its experts on the same GPUs laid out as ``etp x ep x expert-dp`` (innermost first), so
``expert-dp = tp*cp*dp / (ep*etp)``. An expert-parallel group is ``ep`` GPUs ``etp`` ranks apart;
an expert-data-parallel group ``expert-dp`` GPUs ``ep*etp`` apart. Megatron requires sequence
parallelism with MoE and tp > 1, so each GPU routes ``T = b*s/(cp*tp)`` tokens per layer.

Per MoE layer and micro-batch (balanced routing, ``k`` = top-k, ``E`` experts, ``f`` the expert
FFN size, ``imb`` the load-imbalance factor):

* **dispatch / combine** (``alltoall`` dispatcher): the ``T*k`` routed copies of ``h`` values
  are exchanged in the ep group (a fraction ``(ep-1)/ep`` leaves the GPU), once to dispatch and
  once to combine in the forward, and the same two in the backward (their gradients); full
  recompute repeats the forward's. With ``etp > 1`` the received tokens are all-gathered in the
  etp group before the experts and reduce-scattered after them. These replace the MLP's tensor-
  parallel all-gather / reduce-scatter in the MoE layers (with ep = 1 the experts are fed by
  that sequence-parallel all-gather, as a dense MLP is). The ``allgather`` dispatcher
  instead all-gathers the group's ``T`` tokens over ``ep*etp`` GPUs and reduce-scatters them back
  (no top-k copies, but every GPU receives every token).
* **experts**: each GPU holds ``E/ep`` experts, each ``1/etp`` of the FFN, and runs them as a
  grouped GEMM of ``M = ep*etp*T*k/E * imb`` rows per expert (the busiest GPU sets the pace).
* **parameters**: routed experts are sharded ``ep*etp`` ways (not by tp), their gradients
  reduced and their optimizer states sharded over expert-dp.

References
----------
Megatron-Core ``megatron/core/transformer/moe/token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher``,
``MoEAllGatherTokenDispatcher``), ``experts.py`` (``TEGroupedMLP``), ``moe/README.md`` (MoE
parallel folding); Liu et al. 2024, "MoE Parallel Folding" (arXiv:2504.14960); Lepikhin et al.
2021 (GShard), Sec. 3 (dispatch/combine all-to-all); DeepSeek-AI 2024 (DeepSeek-V3 report),
Sec. 3.2 (all-to-all overlap).
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.codes import Recompute
from perfmodel.hardware import collectives as coll
from perfmodel.moe import dispatch as moe_dispatch
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.topology import GroupPlacement
from perfmodel.spec.specs import ModelSpec, TrainingSpec

__all__ = [
    "MOE_A2A_OVERLAP_HIDDEN",
    "MOE_EXPERT_HOST_S",
    "MOE_HOST_SYNC_S",
    "TE_GROUPED_GEMM_SLOWDOWN",
    "a2a_overlap_applies",
    "a2a_overlap_exposed_s",
    "a2a_overlap_extra_inflight",
    "a2a_per_layer",
    "all_to_all_tiered_time",
    "dispatch_ops_per_layer",
    "effective_ffn_size",
    "expert_output_bias_traffic",
    "expert_params_per_gpu",
    "expert_rows_per_gpu",
    "grouped_gemm_slowdown",
    "local_experts",
    "moe_activation_extra_bytes",
    "moe_dispatch_buffer_bytes",
    "moe_host_exposed_s",
    "routed_tokens_per_gpu",
    "tokens_per_gpu",
    "uses_dispatcher",
]


MOE_HOST_SYNC_S = 0.0
"""Host time exposed per MoE layer pass (forward or backward) and micro-batch, independent of
the expert count [s]: the dispatcher's device-to-host copy of the per-expert token counts
(the all-to-all split sizes) stops the CPU from running ahead. Fitted together with
:data:`MOE_EXPERT_HOST_S` on ``moe_runs_dev.csv``: the fit puts it at 0 once the per-expert
term is there (see ``docs/moe.md``), so it is kept as a named hook at 0."""

MOE_EXPERT_HOST_S = 7e-5
"""Host time exposed per *local expert*, MoE layer pass (forward or backward) and micro-batch
[s]. After the dispatcher's device-to-host sync (``tokens_per_expert`` to the host: the grouped
GEMM's ``m_splits``) the GPU queue is empty, and Transformer Engine's ``GroupedLinear`` then does
its per-expert host work (split of the input, per-expert fp8 quantisers and workspaces, one
cuBLAS GEMM per expert in ``general_grouped_gemm``, for fc1 and fc2; in the backward dgrad and
wgrad) before the GPU has anything to run, so the host time per local expert adds to the
layer's device time (``compute`` adds it to the phase's GPU side; adding it after the max of
device and launch time instead fits worse: 11.3 against 11.1 % MAPE, leave-one-model-out 11.5
against 11.3 %). ``E/ep`` local experts: DeepSeek-V3 with ep 8 has 32, Qwen3-235B with ep 64 has
2. Fitted on ``moe_runs_dev.csv`` (94 rows, 8 models) with the dispatcher switches each row
names (:mod:`perfmodel.moe.dispatch`), jointly with :data:`TE_GROUPED_GEMM_SLOWDOWN`
(``python -m benchmarks.moe_time_refit --grid``): 0.07 ms on the 98 rows with the rows' own fp8
recipes and TE's quantisation casts on the routed experts' top-k rows: MAPE 10.40 %,
64 % within 10 %, leave-one-model-out 11.2 % (folds 0.07-0.11 ms, slowdown 0-0.3; (0.08 ms,
0.20) fits as well); 0.09 ms before those casts (10.33 % on 94 rows, leave-one-model-out 11.0 %); docs/moe.md, "Compute"). Alone it was
0.13 ms (11.2 %): then it also carried device time that grows with the micro-batch's tokens (the
multi-stream grouped GEMM), so fewer, larger micro-batches looked too cheap to the search.
Megatron-Core's remedies confirm the effect: ``--moe-pad-expert-input-to-capacity`` (no sync),
CUDA graphs of ``moe_router`` / ``moe_preprocess``, TE's device-side grouped GEMM (``m_splits``
on the GPU).

What the dev rows say about where the time sits (docs/moe.md): the term behaves as time in
series with the device, not as host time the GPU hides. Overlapping it with the GPU time of its
pass (the launch side of the phase's smooth max) fits worse in every form tried: everywhere
14.4 %, only in the un-synced backward 12.1 %, per expert ``E*max(0, c - g_e) + min(c, g_e)``
(flow shop of host and device per expert) 12 %+. And the padded token-drop rows of NeMo 25.09
(Megatron-Bridge's ``apply_moe_token_drop``: capacity factor 1, padded, no sync) need it too:
dropping it for them (:func:`perfmodel.moe.dispatch.dispatch_syncs`) makes 13 of their 14 rows
14-31 % too fast (MAPE 10.45 -> 11.7 %; only Qwen3-30B on 8 B200, E0013, wants it off), and
keeping it for the padded Grok-1 rows improves them (11.0 -> 10.0 %): so it is kept without the
sync too (:func:`moe_host_exposed_s`), and the 25.09 rows keep the dropless switches (with
``apply_moe_token_drop``'s padding they lose the router / preprocess host time as well: 10.33 ->
10.45 %)."""


TE_GROUPED_GEMM_SLOWDOWN = 0.30
"""Extra device time of Transformer Engine's grouped GEMM over the calibrated single-GEMM time
of the same per-expert shape, as a fraction of it, where a GPU holds more than one local expert
(the routed experts' ``GroupedLinear`` GEMMs, forward, dgrad and wgrad). TE runs a "grouped" GEMM
as one cuBLAS GEMM per expert spread over 4 compute streams (``multi_stream_cublas_gemm``:
``num_streams = 4``, an event fork from the caller's stream and a join back after the last
expert), not as one grouped kernel: every expert's GEMM pays its own wave tail, 4 small GEMMs
share the SMs at once, and the join waits for the slowest stream. TE itself deprecates the path
("Please migrate to nvte_multi_tensor_gemm (with CUTLASS Grouped GEMM support)"), and the
partial-CUDA-graph write-up of Megatron-LM's MoE path on Blackwell shows the per-expert kernels
and the gap after them. Fitted on ``moe_runs_dev.csv`` jointly with :data:`MOE_EXPERT_HOST_S`
(benchmarks/moe_time_refit.py; docs/moe.md, "Compute"): the
per-expert host term alone has to carry work that grows with the tokens of a micro-batch, which
made larger micro-batches look too cheap to the search. One local expert (Mixtral, Grok-1,
Llama-4 Scout at ep = E) is a plain GEMM on the caller's stream: factor 1.

References
----------
Transformer Engine ``transformer_engine/common/gemm/cublaslt_gemm.cu``
(``multi_stream_cublas_gemm``, ``nvte_multi_stream_cublas_gemm``), ``common/include/
transformer_engine/gemm.h`` (``num_streams = 4``), ``pytorch/cpp_extensions/gemm.py``
(``general_grouped_gemm``)."""


def grouped_gemm_slowdown(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Factor on the routed experts' grouped-GEMM device time: ``1 +``
    :data:`TE_GROUPED_GEMM_SLOWDOWN` where a GPU holds more than one local expert (``E/ep > 1``),
    else 1 (and 1 for a dense model).

    Example: Qwen3-30B-A3B (128 experts) at ep 8: 16 local experts, factor 1.30; Mixtral-8x7B at
    ep 8: one expert, factor 1.
    """
    return np.where(local_experts(model, batch) > 1.0, 1.0 + TE_GROUPED_GEMM_SLOWDOWN, 1.0)


def local_experts(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Routed experts one GPU holds per MoE layer: ``E / ep`` (0 for a dense model)."""
    if not model.is_moe:
        return np.zeros(len(batch))
    return model.num_experts / batch.ep.astype(np.float64)


def moe_host_exposed_s(model: ModelSpec, batch: ConfigBatch,
                       training: TrainingSpec | None = None) -> np.ndarray:
    """Time per MoE layer pass and micro-batch that the GPU spends in series with the layer's
    work for the experts and the dispatcher's sync [s]: ``MOE_EXPERT_HOST_S * E/ep`` always,
    plus ``MOE_HOST_SYNC_S`` where the dispatcher syncs (0 for a dense model). With the experts'
    inputs padded to capacity (``training.moe_pad_expert_input_to_capacity`` and a capacity
    factor) the split sizes are fixed on the host (``torch.full(capacity * tp * ep)``), the
    dispatcher's ``cuda_sync_point`` stays ``"no_sync"`` and the sync part goes
    (:func:`perfmodel.moe.dispatch.dispatch_syncs`), but Transformer Engine's ``GroupedLinear``
    still runs one quantise and one GEMM per local expert on its 4 streams, and the per-expert
    part stays: the padded token-drop rows (NeMo 25.09 Qwen3 / DeepSeek-V3 on B200 and GB200,
    Megatron-Bridge's presets with local full-iteration CUDA graphs; Grok-1) are 14-31 % too fast
    without it (see :data:`MOE_EXPERT_HOST_S`; MAPE 10.45 -> 10.33 % with it kept). The host time
    of the layer's static parts (router, preprocess, attention, shared experts; what CUDA graphs
    remove) is :func:`perfmodel.moe.dispatch.static_host_s`.

    References
    ----------
    Megatron-Core ``token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher.preprocess``:
    ``tokens_per_expert`` copied to the host for the all-to-all splits and ``m_splits``; the
    ``drop_and_pad`` branch without it);
    Transformer Engine ``pytorch/module/grouped_linear.py`` (per-expert quantise / GEMM loop),
    ``common/gemm/cublaslt_gemm.cu`` (``multi_stream_cublas_gemm``).
    """
    if not model.is_moe:
        return np.zeros(len(batch))
    syncs = training is None or moe_dispatch.dispatch_syncs(model, training)
    return (MOE_HOST_SYNC_S if syncs else 0.0) + MOE_EXPERT_HOST_S * local_experts(model, batch)


def tokens_per_gpu(training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """Tokens one GPU routes per MoE layer and micro-batch: ``b * s / (cp * tp)`` (sequence
    parallel slice; Megatron requires sequence parallelism for MoE with tp > 1)."""
    return batch.micro_batch_size * training.seq_len / (batch.cp * batch.tp).astype(np.float64)


def routed_tokens_per_gpu(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                          ) -> np.ndarray:
    """Routed token copies one GPU sends into the dispatch: ``T * top_k``."""
    return tokens_per_gpu(training, batch) * model.moe_top_k


def expert_rows_per_gpu(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                        ) -> np.ndarray:
    """Rows of one local expert's GEMMs on the busiest GPU: ``ep*etp*T*k/E * imbalance``.

    With ep = 1 and etp = tp this is ``b*s/cp * k / E``, the all-experts-local shape.
    """
    ep, etp = batch.ep.astype(np.float64), batch.etp.astype(np.float64)
    return ep * etp * routed_tokens_per_gpu(model, training, batch) / model.num_experts * (
        model.load_imbalance)


def expert_output_bias_traffic(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                               bytes_per_value: float, pass_: str
                               ) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes and kernels of the routed experts' output bias per MoE layer and micro-batch
    (``(bytes, kernels)``; zero without linear biases). Megatron-Core's ``TEGroupedMLP`` builds
    ``linear_fc2`` with ``skip_bias_add=True`` and adds the bias scaled by the routing
    probability outside the grouped GEMM, as PyTorch ops per local expert
    (``_apply_bias``: ``torch.cat([t + b * p for ...])``): forward, per output value of the
    ``etp*T*k*imb`` rows x ``h``, ``b*p`` written (1 value), ``t + bp`` read 2 and written 1, the
    ``cat`` read and written 1 each: 5 values, ``2*E/ep + 1`` kernels; backward, ``g*p`` and
    ``g*b`` each written and reduced (2 x 3 values: the bias and probability gradients) and the
    split's gradient concatenated (2): 8 values, ``4*E/ep + 1`` kernels. Example: GPT-OSS-120B,
    ep 64 (2 local experts), T*k = 16384 * 4 rows, h 2880, bf16: forward 65536 * 2880 * 5 * 2 =
    1.89 GB in 5 kernels.

    References
    ----------
    Megatron-Core ``transformer/moe/experts.py`` (``TEGroupedMLP.__init__``: ``linear_fc2``
    with ``bias=add_bias_linear, skip_bias_add=True``; ``TEGroupedMLP._apply_bias``, called
    after ``linear_fc2`` in ``forward``); the fc1 bias is added inside Transformer Engine's
    ``GroupedLinear`` (``skip_bias_add=False``).
    """
    n = len(batch)
    if not model.is_moe or not model.linear_bias:
        return np.zeros(n), np.zeros(n)
    rows = batch.etp * routed_tokens_per_gpu(model, training, batch) * model.load_imbalance
    elems = rows * model.hidden_size
    e_local = local_experts(model, batch)
    if pass_ == "fwd":
        return 5.0 * bytes_per_value * elems, 2.0 * e_local + 1.0
    return 8.0 * bytes_per_value * elems, 4.0 * e_local + 1.0


def expert_params_per_gpu(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Routed-expert parameters one GPU holds: ``L/pp`` layers' share of the routed experts,
    split ``ep*etp`` ways (0 for a dense model)."""
    per_layer = model.routed_expert_params_per_layer()
    return model.num_layers / batch.pp * per_layer / (batch.ep * batch.etp).astype(np.float64)


def effective_ffn_size(model: ModelSpec) -> float:
    """FFN size that gives the MLP activation elements per token of the average layer:
    ``(1-phi) f + phi (k * imb * f_expert + f_shared)`` with ``phi`` the MoE-layer fraction.

    Per GPU an MoE layer holds ``etp*T*k*imb`` routed rows of ``f_expert/etp`` intermediate
    values, which is ``b*s/cp * k*imb*f_expert / tp`` like a dense MLP of ``k*imb*f_expert``
    split by tp; so the dense formulas apply with this size. ``ffn_hidden_size`` for a dense
    model.
    """
    if not model.is_moe:
        if model.is_hybrid:  # the dense MLP in its share of the layers (perfmodel.compute.mamba)
            return model.dense_mlp_fraction * model.ffn_hidden_size
        return float(model.ffn_hidden_size)
    phi = model.moe_layer_fraction
    moe = model.moe_top_k * model.load_imbalance * model.expert_ffn_size + model.shared_ffn_size
    return model.dense_mlp_fraction * model.ffn_hidden_size + phi * moe


def moe_activation_extra_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                               bytes_per_value: float, gemm_input_bytes: float | None = None
                               ) -> np.ndarray:
    """Activation bytes an MoE layer keeps beyond a dense MLP's, averaged over the layers, per
    micro-batch and GPU: the permuted (dispatched) expert input (``etp*T*k*imb * h`` values),
    the permuted routing probabilities the experts apply (fp32, one per routed row), and the fp32
    router logits and probabilities (``2 * 4 * T * E`` bytes). The permuted input is the first
    expert GEMM's input: under Transformer Engine's fp8 / fp4 recipes ``GroupedLinear`` saves its
    fp8 cast (``gemm_input_bytes``, 1 byte; :func:`perfmodel.memory.breakdown.fp8_gemm_input_bytes`).

    The expert output is not kept: Megatron-Core (2025 on, the releases of the validation rows'
    Megatron-Bridge) applies the probabilities inside the experts (``TEGroupedMLP``'s weighted
    SwiGLU on ``permuted_probs``), so the combine's ``unpermute`` takes no probabilities and is a
    pure gather whose backward needs only the index map. (Megatron-Core of 2024 multiplied them in
    ``unpermute`` and kept the expert output, ``etp*T*k*imb * h`` more values.)

    References
    ----------
    Megatron-Core ``moe/token_dispatcher.py`` (``combine_postprocess``: ``unpermute`` without
    probs; ``token_permutation`` returns ``permuted_probs`` to the experts), ``moe/experts.py``
    (``bias_act_func`` with ``weighted_bias_swiglu_impl(..., permuted_probs)``),
    ``fusions/fused_bias_swiglu.py`` (``WeightedSwiGLUFunction`` saves input and weights),
    ``router.py``; Transformer Engine ``pytorch/module/grouped_linear.py`` (saved ``inputmats``).
    """
    if not model.is_moe:
        return np.zeros(len(batch))
    rows = batch.etp * routed_tokens_per_gpu(model, training, batch) * model.load_imbalance
    g_in = bytes_per_value if gemm_input_bytes is None else gemm_input_bytes
    per_layer = rows * (model.hidden_size * g_in + 4.0) + 8.0 * tokens_per_gpu(
        training, batch) * model.num_experts
    return model.moe_layer_fraction * per_layer


def moe_dispatch_buffer_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                              bytes_per_value: float) -> np.ndarray:
    """Transient dispatch buffers of the layer being computed: the all-to-all send and receive
    buffers (``2 * T*k*imb * h``) and, with etp > 1, the etp-gathered tokens."""
    if not model.is_moe:
        return np.zeros(len(batch))
    rt = routed_tokens_per_gpu(model, training, batch) * model.load_imbalance
    return (2.0 + np.where(batch.etp > 1, batch.etp, 0.0)) * rt * model.hidden_size * (
        bytes_per_value)


# --------------------------------------------------------------------------------------------
# Communication
# --------------------------------------------------------------------------------------------
def uses_dispatcher(batch: ConfigBatch) -> np.ndarray:
    """Whether the MoE layers move tokens by the dispatcher (ep > 1, or an expert tensor
    parallel group other than tp); else (ep = 1, etp = tp) the experts sit behind the tensor-
    parallel all-gather like a dense MLP and the tp term carries their communication."""
    return (batch.ep > 1) | (batch.etp != batch.tp)


def a2a_per_layer(batch: ConfigBatch) -> tuple[np.ndarray, np.ndarray]:
    """Dispatch-or-combine exchanges per MoE layer per micro-batch: (forward, backward incl.
    recompute). Forward 2 (dispatch, combine), backward 2 (their gradients), plus 2 when full
    recomputation repeats the forward (Megatron recomputes the whole layer)."""
    fwd = np.full(batch.tp.shape, 2.0)
    return fwd, 2.0 + np.where(batch.recompute == Recompute.FULL, 2.0, 0.0)


def dispatch_ops_per_layer(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                           bytes_per_value: float) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """The collectives of one dispatch (or one combine): ``name -> (collective, buffer bytes
    [NCCL convention], group size)``; the group is ``ep`` (stride etp) for ``a2a`` and ``etp``
    (stride 1) for ``etp_gather``, ``ep*etp`` (stride 1) for the all-gather dispatcher."""
    h = model.hidden_size
    ep, etp = batch.ep.astype(np.float64), batch.etp.astype(np.float64)
    if training.moe_token_dispatcher == "allgather":
        buf = ep * etp * tokens_per_gpu(training, batch) * h * bytes_per_value
        return {"allgather": ("all_gather", np.where(ep * etp > 1, buf, 0.0), ep * etp)}
    rt = routed_tokens_per_gpu(model, training, batch)
    # the busiest rank receives (dispatch) and sends back (combine) imbalance x the mean tokens:
    # its exchange sets the all-to-all's time (perfmodel.moe.imbalance)
    a2a_buf = np.where(ep > 1, rt * model.load_imbalance * h * bytes_per_value, 0.0)
    # with ep = 1 and etp = tp the tp group's sequence-parallel all-gather feeds the experts
    # (counted in the tp term, see uses_dispatcher)
    gather_buf = np.where((etp > 1) & uses_dispatcher(batch),
                          etp * rt * model.load_imbalance * h * bytes_per_value, 0.0)
    return {"a2a": ("all_to_all", a2a_buf, ep), "etp_gather": ("all_gather", gather_buf, etp)}


MOE_A2A_OVERLAP_HIDDEN = 0.6
"""Fraction of the all-to-all time that fits under the layer's compute which Megatron-Core's
expert-parallel overlap (``--overlap-moe-expert-parallel-comm``, Megatron-Bridge
``moe_a2a_overlap``) actually hides. The overlap runs the dispatch / combine of one micro-batch
next to the attention / expert compute of another (the merged forward-backward of the 1F1B steady
state), so the warm-up and cool-down micro-batches have no partner, each exchange hides only
behind the sub-module it is paired with, and the communication kernels (NCCL or DeepEP, 20-32
SMs) slow the compute they run beside. Fitted on ``moe_runs_dev.csv`` with
:data:`MOE_EXPERT_HOST_S` (the 7 overlapped rows: DeepSeek-V3 on 1024 H100, Qwen3-235B on 256
H100 / B300, Qwen3-30B on 16 H100): 0.6; leave-one-model-out folds 0.55-0.7 (docs/moe.md).
At 1.0 (the whole window hides) those rows were 15-21 % too fast."""


def a2a_overlap_exposed_s(a2a_s, compute_s) -> np.ndarray:
    """Exposed dispatch + combine time [s] with the all-to-all overlap:
    ``a2a - MOE_A2A_OVERLAP_HIDDEN * min(a2a, compute)`` (``a2a``, ``compute``: the layer's
    exchanges and its forward + backward compute per micro-batch).

    References
    ----------
    Megatron-Core ``moe/README.md`` ("EP A2A overlap": merged forward-backward of two
    micro-batches); DeepSeek-AI 2024 (DeepSeek-V3 report), Sec. 3.2.1 (DualPipe overlap).
    """
    a2a = np.asarray(a2a_s, dtype=np.float64)
    return a2a - MOE_A2A_OVERLAP_HIDDEN * np.minimum(a2a, np.asarray(compute_s, dtype=np.float64))


def all_to_all_tiered_time(size_bytes, group: GroupPlacement) -> np.ndarray:
    """All-to-all time [s] of a ``size_bytes`` buffer (per GPU, NCCL convention) on a placed
    group: each GPU sends ``1/n`` of its buffer to every other member at once; the members in
    its own scale-up domain (``intra_size``) are reached over NVLink, the rest through its own
    port of the outer tier, and the slower of the two sets the time:
    ``max((m-1)/n * S / B_nvlink, (n-m)/n * S / B_outer) + (n-1) * alpha``.

    Where the group's tier carries a measured nccl-tests table, the pairwise all-to-all at its
    bus bandwidth instead (:meth:`GroupPlacement.measured_bw_bytes_per_s`).

    References
    ----------
    Thakur et al. 2005, Sec. 3.6 (pairwise exchange); NCCL ``alltoall`` over NVLink + NET
    (one NIC per GPU, rail-optimised); DeepEP README (intranode NVLink and internode RDMA
    all-to-all bandwidths measured separately).
    """
    s = np.asarray(size_bytes, dtype=np.float64)
    n = np.maximum(group.size, 1.0)
    m = np.minimum(group.intra_size, n)
    intra = (m - 1.0) / n * s / group.intra_bw_bytes_per_s
    outer_bw = np.where(group.tier > 0, group.p2p_bw_bytes_per_s, group.intra_bw_bytes_per_s)
    inter = (n - m) / n * s / outer_bw
    t = np.maximum(intra, inter) + np.maximum(n - 1.0, 0.0) * group.latency_s
    # a measured nccl-tests alltoall bus bandwidth of the group's tier replaces both links
    measured = group.measured_bw_bytes_per_s("all_to_all")
    at_busbw = coll.all_to_all_time(s, n, np.where(np.isfinite(measured), measured, 1e30),
                                    group.latency_s)
    t = np.where(np.isfinite(measured), at_busbw, t)
    return np.where((n > 1) & (s > 0), t, 0.0)


def dispatch_time_per_layer(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch,
                            groups: dict[str, GroupPlacement], bytes_per_value: float
                            ) -> np.ndarray:
    """Link time [s] of one dispatch (or one combine) on the placed groups ``ep`` (size ep,
    stride etp), ``etp`` (size etp, stride 1) and ``ep_etp`` (size ep*etp, stride 1)."""
    ops = dispatch_ops_per_layer(model, training, batch, bytes_per_value)
    if "allgather" in ops:
        _, buf, _ = ops["allgather"]
        g = groups["ep_etp"]
        t = coll.all_gather_time(buf, g.size, g.bw_for("all_gather"), g.latency_s)
        return np.where(buf > 0, t, 0.0)
    _, a2a_buf, _ = ops["a2a"]
    _, gather_buf, _ = ops["etp_gather"]
    g = groups["etp"]
    gather = np.where(gather_buf > 0,
                      coll.all_gather_time(gather_buf, g.size, g.bw_for("all_gather"), g.latency_s),
                      0.0)
    return all_to_all_tiered_time(a2a_buf, groups["ep"]) + gather


# --------------------------------------------------------------------------------------------
# Where the all-to-all overlap runs (Megatron-Core's combined 1F1B)
# --------------------------------------------------------------------------------------------
def a2a_overlap_applies(training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """Whether ``--overlap-moe-expert-parallel-comm`` runs for each configuration: the switch
    is on (``training.overlap_moe_comm``), ep > 1, the alltoall or flex dispatcher, no full
    recomputation, and with pp > 1 an interleaved schedule (vp > 1). Megatron-Core refuses the
    others (``TransformerConfig.__post_init__``: "virtual_pipeline_model_parallel_size must be
    specified when pipeline_model_parallel_size > 1", "disable full recomputation when enabling
    overlap_moe_expert_parallel_comm", ep > 1, alltoall/flex dispatcher): only
    ``combined_1f1b_schedule_for_no_pipelining`` (pp = 1) and
    ``..._for_interleaved_pipelining`` overlap, the plain 1F1B schedule does not. Where it does
    not apply the dispatch and combine stay exposed (and ``--emit`` leaves the flag out).

    References
    ----------
    Megatron-Core ``transformer/transformer_config.py`` (the asserts above),
    ``pipeline_parallel/combined_1f1b.py``, ``pipeline_parallel/schedules.py``.
    """
    n = len(batch)
    if not training.overlap_moe_comm or training.moe_token_dispatcher not in ("alltoall", "flex"):
        return np.zeros(n, dtype=bool)
    full = np.asarray(batch.recompute) == 2  # perfmodel.parallel.config.RECOMPUTE: none, selective, full
    return (batch.ep > 1) & ~full & ((batch.pp == 1) | (batch.vp > 1))


def a2a_overlap_extra_inflight(training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """Micro-batches a stage holds in flight beyond its schedule's count when the all-to-all
    overlap runs [whole-stage micro-batches]: with pp = 1 the combined 1F1B runs the forward of
    micro-batch i+1 with the backward of micro-batch i, so two micro-batches' activations are
    alive (+1); interleaved, Megatron-Core adds one warm-up forward (``num_warmup_microbatches
    + 1``), one more model chunk (+1/vp). Capped by the micro-batches there are.

    References
    ----------
    Megatron-Core ``pipeline_parallel/combined_1f1b.py``
    (``combined_1f1b_schedule_for_no_pipelining``: one forward, then paired forward/backward)
    and ``schedules.py`` (``get_pp_rank_microbatches``: ``if overlap_moe_expert_parallel_comm:
    num_warmup_microbatches += 1``).
    """
    on = a2a_overlap_applies(training, batch)
    pp, vp = batch.pp.astype(np.float64), batch.vp.astype(np.float64)
    extra = np.where(pp == 1, 1.0, 1.0 / vp)
    return np.where(on & (batch.num_microbatches > 1), extra, 0.0)
