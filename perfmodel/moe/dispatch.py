"""Host-side cost of the MoE token dispatcher and the switches that change it.

The GPU work of an MoE layer is priced in :mod:`perfmodel.compute.layer`; what the framework switches
change is mostly the *host* (CPU) side of each layer: how many kernels the CPU launches for the
router and the dispatcher's preprocess, which of them a CUDA graph replays as one launch, and
whether the dispatcher stops the CPU with a device-to-host sync each layer pass.

Switches (``TrainingSpec`` fields, Megatron-Core flags in brackets):

* ``moe_token_dispatcher`` = ``alltoall`` | ``allgather`` | ``flex``
  (``--moe-token-dispatcher-type``) and, for ``flex``, ``moe_flex_backend`` = ``deepep`` |
  ``hybridep`` (``--moe-flex-dispatcher-backend``);
* ``moe_router_fusion`` (``--moe-router-fusion``, Transformer Engine's fused router kernels);
* ``cuda_graph_scope`` (``--cuda-graph-impl transformer_engine --cuda-graph-scope ...``):
  ``attn``, ``moe_router``, ``moe_preprocess`` are priced here;
* ``moe_pad_expert_input_to_capacity`` with the model's capacity factor (token drop, fixed
  split sizes: no sync).

What each one does, from the source:

* **Sync.** Dropless, the dispatchers need the per-expert token counts on the host (the
  all-to-all split sizes, the grouped GEMM's ``m_splits``): ``MoEAlltoAllTokenDispatcher``
  copies them to the host and synchronises at its ``cuda_sync_point``; the flex dispatcher's
  HybridEP backend "sizes buffers dynamically (CPU sync in dispatch)" unless the expert inputs are
  padded to capacity, and DeepEP's ``fused_dispatch`` returns the received counts to the host.
  Only ``drop_and_pad`` (``--moe-pad-expert-input-to-capacity`` with a capacity factor) fills the
  counts on the host (``torch.full(capacity * ...)``) and leaves the sync out
  (:func:`dispatch_syncs`). At a sync the GPU queue drains, so the host work that follows it
  (Transformer Engine's per-expert ``GroupedLinear`` setup, :data:`perfmodel.moe.experts.MOE_EXPERT_HOST_S`)
  is exposed in series with the layer; without the sync the CPU runs ahead and the same host work
  competes only with the GPU time (it joins the launch side of the phase's max).
* **Router and preprocess kernels.** The router (softmax / top-k, the aux-loss bookkeeping) and
  the EP preprocess are many tiny kernels the GPU runs faster than the CPU launches them, right
  before the sync that waits for them: 72 kernels, 31 with ``--moe-router-fusion``, 17 with
  DeepEP's fused preprocess (:func:`router_preprocess_kernels`), each exposing
  :data:`MOE_ROUTER_KERNEL_HOST_S` (derived from the study's router-fusion step, not fitted):
  :func:`router_host_s`, in series with the layer like the per-expert host time
  (:func:`static_host_s`).
* **CUDA graphs.** ``moe_router`` (with ``moe_preprocess``) replays the router, the preprocess
  and the shared experts as one graph launch per pass (:func:`router_host_s`: one kernel's
  worth); ``attn`` replays the attention block (norm, QKV / MLA projections, RoPE, core
  attention, output projection, bias-dropout-add): :func:`graph_saved_launches` takes its
  launches off the launching thread. The study also implies a large host time of un-graphed TE
  modules (:data:`TE_KERNEL_HOST_S`, about 60 us a kernel) that the dev rows do not support
  across models, so it is a hook at 0. The routed experts stay eager (dynamic shapes; the
  ``moe`` scope needs token drop and is not accepted).
* **Flex dispatch.** DeepEP / HybridEP fuse the global permute into the dispatch kernel
  ("eliminating the need to explicitly copy the tokens top-k times"), leaving one permute-copy
  kernel per pass instead of two (:func:`permute_copy_kernels`). Their different link bandwidths
  and SM counts (DeepEP on GB200 EP32: about 400 GB/s dispatch, 190 GB/s combine with 24 SMs;
  HybridEP "higher bandwidth with fewer SMs") are published for one system only, so the
  dispatch keeps the link model of :mod:`perfmodel.moe.experts` (not priced separately).

References
----------
Megatron-Core ``megatron/core/transformer/moe/token_dispatcher.py``
(``MoEAlltoAllTokenDispatcher.preprocess`` / ``_maybe_dtoh_and_synchronize``,
``_HybridEPManager.setup_metadata``, ``_DeepepManager.dispatch``);
Megatron-LM ``docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md``
(Sec. 2.1.4 router kernels 72 -> 31, Sec. 2.2.1 DeepEP router + preprocess 17 kernels, Sec. 2.3
partial CUDA graphs and their scopes, Sec. 2.1.1 flex dispatch fuses the global permute);
Transformer Engine ``pytorch/graph.py`` (``make_graphed_callables``).
"""

from __future__ import annotations

from perfmodel.spec.specs import ModelSpec, TrainingSpec

__all__ = [
    "ATTENTION_KERNELS_BWD",
    "ATTENTION_KERNELS_FWD",
    "FLEX_ROUTER_PREPROCESS_KERNELS",
    "MLA_EXTRA_KERNELS_FWD",
    "MOE_ROUTER_KERNEL_HOST_S",
    "ROUTER_KERNELS_FUSED",
    "ROUTER_KERNELS_UNFUSED",
    "SHARED_EXPERT_KERNELS_BWD",
    "SHARED_EXPERT_KERNELS_FWD",
    "TE_KERNEL_HOST_S",
    "attention_kernels",
    "dispatch_syncs",
    "graph_saved_launches",
    "graphs_router",
    "permute_copy_kernels",
    "router_host_s",
    "router_preprocess_kernels",
    "shared_expert_kernels",
    "static_host_s",
]

ROUTER_KERNELS_UNFUSED = 72
"""Kernels of the MoE router and EP preprocess per layer pass without router fusion (the
Megatron-LM DeepSeek-V3 GB200 study, Sec. 2.1.4: "reducing the total number of kernels in the
router part from 72 to 31")."""

ROUTER_KERNELS_FUSED = 31
"""The same with ``--moe-router-fusion`` (Transformer Engine PR 1883), ibid."""

FLEX_ROUTER_PREPROCESS_KERNELS = 17
"""Router + preprocess kernels with the flex dispatcher (DeepEP's fused EP preprocess: "further
reducing the number of kernels in the router and preprocess parts to 17", ibid. Sec. 2.2.1;
HybridEP's preprocess is fused the same way, taken equal)."""

ATTENTION_KERNELS_FWD = 6
"""Launches of a (GQA) attention block's forward that an ``attn`` CUDA graph replays: input
norm, QKV GEMM, RoPE, core attention, output-projection GEMM, bias-dropout-add (the kernels
:mod:`perfmodel.compute.layer` counts for this part of the layer; plus 2 input quantisations under
fp8 / fp4)."""

ATTENTION_KERNELS_BWD = 10
"""The same block's backward: QKV and projection dgrad + wgrad (4), attention backward,
RoPE, norm and dropout backward, two residual-gradient sums (plus 2 gradient quantisations
under fp8 / fp4)."""

MLA_EXTRA_KERNELS_FWD = 4
"""Extra forward launches of multi-latent attention (DeepSeek-V3): the q and kv down- and
up-projections replace the one QKV GEMM, with their two norms (backward: twice as many)."""


MOE_ROUTER_KERNEL_HOST_S = 6.9e-6
"""Host time exposed per router / preprocess kernel, MoE layer pass and micro-batch [s],
derived (not fitted to the dev rows) from the Megatron-LM DeepSeek-V3 GB200 study's router-fusion
step: 72 -> 31 kernels raised 529.55 to 540.00 TFLOP/s on the same configuration (TP1 PP8 VPP4
EP32, GBS 2048, 256 GPUs; the baseline's 16.56 s at 494.46 TFLOP/s puts the steps at 15.46 and
15.16 s), 0.30 s a step over the 8 decoder layers x 64 micro-batches x 2 passes of a pipeline
rank (x 1.03 for the interleaved schedule's fill): 0.30 / (1054 x 41) = 6.9 us. These kernels run
right before the dispatcher's device-to-host sync, which waits for them, so their launch time is
exposed; a CUDA graph of ``moe_router`` + ``moe_preprocess`` replays them as one launch."""


TE_KERNEL_HOST_S = 0.0
"""Host time exposed per kernel of a Transformer Engine module (attention block, shared
experts) in a layer pass that waits at the dispatcher's sync [s]: a named hook, **0 in the
shipped model**. The Megatron-LM DeepSeek-V3 GB200 study implies about 60 us (same configuration
as :data:`MOE_ROUTER_KERNEL_HOST_S`, 1054 layer passes a step on the slowest rank):

* "CUDA Graphs" (attn + moe_router + moe_preprocess, DeepEP in place): 610.71 -> 663.27 TFLOP/s,
  13.40 -> 12.34 s, 1.007 ms a pass; less the router / preprocess (16 x 6.9 us) 0.897 ms for
  MLA attention's 16 kernels a pass (fp8: 12 forward, 20 backward), 15 of them saved: 60 us;
* "CUDA Graphs capture shared expert": 797.67 -> 829.93 TFLOP/s, 0.377 ms a pass for the shared
  expert's 6 kernels (fp8: 5 forward, 7 backward): 63 us.

Applied to the dev rows at 60 us (per-expert host time refitted) it helps the 61 rows whose
switches are stated (MAPE 11.0 -> 10.7 %) but the rows whose recipe is unknown (25.09, NeMo 2.0
docs) get up to 20 % too slow, and the whole set goes from 11.1 to 11.5 % (leave-one-model-out
11.1 -> 11.6 %; fitted per fold it stays at 0 in 7 of 8 folds): one study on one model and CPU
does not carry to the rest,
so the term is left at 0 and ``attn`` graphs change only the launch count
(:func:`graph_saved_launches`). Set it to 6e-5 to reproduce the study's CUDA-graph step."""


def router_host_s(training: TrainingSpec) -> float:
    """Host time of the router and EP preprocess exposed per MoE layer pass [s]:
    :func:`router_preprocess_kernels` x :data:`MOE_ROUTER_KERNEL_HOST_S`, or one graph launch's
    worth when ``moe_router`` is in ``cuda_graph_scope``.

    Example: alltoall with router fusion, no graphs: 31 x 6.9 us = 0.214 ms; flex: 17 x 6.9 us
    = 0.117 ms; graphed: 6.9 us.
    """
    n = 1 if graphs_router(training) else router_preprocess_kernels(training)
    return n * MOE_ROUTER_KERNEL_HOST_S


SHARED_EXPERT_KERNELS_FWD = 3
"""Shared-expert forward kernels: fc1 GEMM, gated activation, fc2 GEMM (+2 quantisations under
fp8 / fp4)."""

SHARED_EXPERT_KERNELS_BWD = 5
"""Its backward: fc2 and fc1 dgrad + wgrad, activation backward (+2 quantisations)."""


def shared_expert_kernels(model: ModelSpec, pass_: str, low_precision: bool) -> int:
    """Kernels of the shared experts per MoE layer pass (0 without shared experts).

    Example: DeepSeek-V3 fp8 forward 3 + 2 = 5, backward 5 + 2 = 7."""
    if not model.shared_ffn_size:
        return 0
    n = SHARED_EXPERT_KERNELS_FWD if pass_ == "fwd" else SHARED_EXPERT_KERNELS_BWD
    return n + (2 if low_precision else 0)


def static_host_s(model: ModelSpec, training: TrainingSpec, pass_: str,
                  low_precision: bool) -> float:
    """Host time of a synced MoE layer's static, graphable parts exposed per pass [s]:
    :data:`TE_KERNEL_HOST_S` x (the attention block's kernels unless ``attn`` is graphed, plus
    the shared experts' unless ``moe_router`` is: Megatron-Core captures the shared experts with
    the router when they are not overlapped) + :func:`router_host_s`. 0 without a sync.

    Example: Qwen3-30B fp8 forward, no graphs: 8 x 60 us + 31 x 6.9 us = 0.694 ms; with
    ``attn``, ``moe_router``, ``moe_preprocess``: 6.9 us.
    """
    if not dispatch_syncs(model, training):
        return 0.0
    scope = training.cuda_graph_scope
    n = 0 if "attn" in scope else attention_kernels(model, pass_, low_precision)
    if not graphs_router(training):
        n += shared_expert_kernels(model, pass_, low_precision)
    return n * TE_KERNEL_HOST_S + router_host_s(training)


def dispatch_syncs(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether each MoE layer pass stops the host with a device-to-host sync of the token
    counts: True unless the expert inputs are padded to capacity (token drop with
    ``moe_pad_expert_input_to_capacity`` and a capacity factor), for every dispatcher
    (alltoall: ``cuda_sync_point``; flex HybridEP / DeepEP: dynamic buffer sizes and host
    counts; allgather: ``tokens_per_expert`` to the host for ``m_splits``). False for a dense
    model.

    References
    ----------
    Megatron-Core ``token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher.preprocess``:
    ``drop_and_pad`` -> ``torch.full``, ``cuda_sync_point = "no_sync"``;
    ``_HybridEPManager.setup_metadata``: ``num_permuted_tokens`` fixed only when padding).
    """
    if not model.is_moe:
        return False
    padded = training.moe_pad_expert_input_to_capacity and model.moe_capacity_factor is not None
    return not padded


def router_preprocess_kernels(training: TrainingSpec) -> int:
    """Kernels the host launches per MoE layer pass for the router and the dispatcher's
    preprocess, before CUDA graphs: 17 with the flex dispatcher (fused preprocess), else 31
    with ``moe_router_fusion``, 72 without.

    Example: alltoall with router fusion launches 31, flex 17, alltoall unfused 72.
    """
    if training.moe_token_dispatcher == "flex":
        return FLEX_ROUTER_PREPROCESS_KERNELS
    return ROUTER_KERNELS_FUSED if training.moe_router_fusion else ROUTER_KERNELS_UNFUSED


def graphs_router(training: TrainingSpec) -> bool:
    """Whether the router (and with it the preprocess and the shared experts) is replayed as a
    CUDA graph: ``moe_router`` in ``cuda_graph_scope`` (Megatron-Core requires
    ``moe_preprocess`` to come with ``moe_router``)."""
    return "moe_router" in training.cuda_graph_scope


def attention_kernels(model: ModelSpec, pass_: str, low_precision: bool) -> int:
    """Launches of one attention block's forward (``pass_ = "fwd"``) or backward (``"bwd"``):
    :data:`ATTENTION_KERNELS_FWD` / :data:`ATTENTION_KERNELS_BWD`, plus
    :data:`MLA_EXTRA_KERNELS_FWD` (twice in the backward) for MLA, plus 2 quantisations under
    fp8 / fp4.

    Example: GQA fp8 forward 6 + 2 = 8; MLA bf16 backward 10 + 8 = 18.
    """
    fwd = pass_ == "fwd"
    n = ATTENTION_KERNELS_FWD if fwd else ATTENTION_KERNELS_BWD
    if model.is_mla:
        n += MLA_EXTRA_KERNELS_FWD * (1 if fwd else 2)
    return n + (2 if low_precision else 0)


def graph_saved_launches(model: ModelSpec, training: TrainingSpec, pass_: str,
                         low_precision: bool) -> float:
    """Host launches per layer and pass that an ``attn`` CUDA graph takes off the launching
    thread: the attention block's :func:`attention_kernels` cost one graph launch, so it saves
    ``n - 1`` in every layer (0 without ``attn`` in ``cuda_graph_scope``). The router /
    preprocess graph is priced by :func:`router_host_s`.

    Example: GQA fp8 forward with ``("attn",)``: 8 - 1 = 7; MLA bf16 backward: 18 - 1 = 17.
    """
    if "attn" not in training.cuda_graph_scope:
        return 0.0
    saved = float(attention_kernels(model, pass_, low_precision) - 1)
    return saved * model.attention_layer_fraction if model.is_hybrid else saved


def permute_copy_kernels(training: TrainingSpec) -> int:
    """Token permute / unpermute copy kernels per MoE layer pass: 2 for the alltoall and
    allgather dispatchers (global permute before the exchange, local sort after it), 1 for flex
    (DeepEP / HybridEP fuse the global permute into the dispatch kernel; Megatron-LM DeepSeek-V3
    GB200 study, Sec. 2.1.1)."""
    return 1 if training.moe_token_dispatcher == "flex" else 2
