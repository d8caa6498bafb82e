"""Communication volume: bytes each GPU sends per training step, per parallel dimension.

Counting convention (NCCL's): a ring all-reduce of an ``S``-byte buffer over ``n`` GPUs sends
``2(n-1)/n * S`` bytes from each GPU; an all-gather (output ``S``) or reduce-scatter (input ``S``)
sends ``(n-1)/n * S``; a point-to-point send of ``S`` bytes sends ``S``.

Per step, for a configuration with micro-batch size ``b``, ``m`` micro-batches, sequence length
``s``, hidden size ``h``, ``L`` layers, ``P`` parameters of the largest pipeline stage:

* **dp** gradient reduction over the ``dp*cp`` GPUs that hold the same weights (context-parallel
  ranks share weights, so Megatron-LM reduces over dp x cp), of this GPU's shard ``P/tp``:
  ZeRO-0 all-reduce; ZeRO-1 reduce-scatter + all-gather of the updated parameters (the same bytes);
  ZeRO-2 a reduce-scatter after every micro-batch (gradients are not kept whole) + one all-gather;
  ZeRO-3 the same reduce-scatters + a parameter all-gather before every micro-batch's forward
  and backward. With ``m = 1`` ZeRO-3 moves 1.5x ZeRO-1/2 (ZeRO paper Sec. 7.2.3). Gradients
  are reduced in 16 bits for bf16/fp16/fp8/fp4 training (Megatron-LM's default
  ``grad_reduce_in_fp32=False``) and in fp32 for fp32 training; gradient compression replaces
  the gradient reduction (see :func:`dp_ops`).
* **tp** 2 all-reduces of the ``b*(s/cp)*h`` activations per layer in the forward (after
  attention and after the MLP) and 2 in the backward (of the input gradients), 2 more when full
  recomputation repeats the forward; with sequence parallelism each all-reduce becomes an
  all-gather + reduce-scatter pair, the same bytes.
* **pp** per micro-batch and model chunk, one send of activations forward and one of gradients
  backward at each stage boundary (``b*(s/cp)*h``, divided by ``tp`` with sequence
  parallelism); the reported GPU is the busiest (an inner stage: ``2*vp*m`` sends).
* **cp** ring attention: per layer, ``cp-1`` sends of this GPU's K and V chunk in the forward and
  ``cp-1`` sends of K, V and dK, dV in the backward (``2*b*(s/cp)*kv_heads*head_dim`` elements per
  K+V chunk, heads split by ``tp``), plus the forward's again under full recomputation.

References
----------
NCCL-tests ``doc/PERFORMANCE.md``; Rajbhandari et al. 2020, "ZeRO", SC20, Sec. 7.2 (communication
volume 2 Psi for stages 1-2, 3 Psi for stage 3); Shoeybi et al. 2019, "Megatron-LM", Sec. 3 and
Fig. 4 (two all-reduces forward and two backward per layer); Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", Sec. 4.2.2 (sequence parallelism: all-gather
+ reduce-scatter, same bandwidth); Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC21, Sec. 2.2 and 3.2 (pipeline sends, interleaving
multiplies them by v); Liu et al. 2023, "Ring Attention with Blockwise Transformers"; Megatron-LM
context-parallel docs and Transformer Engine ``AttnFuncWithCPAndKVP2P`` (K/V forward, K/V + dK/dV
backward); Megatron-LM ``DistributedDataParallelConfig.grad_reduce_in_fp32`` (default False).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from perfmodel.comm.cp_a2a import a2a_buffer_bytes
from perfmodel.core.codes import Compression, CpComm, Recompute
from perfmodel.hardware.collectives import bytes_per_gpu
from perfmodel.moe import experts as moe
from perfmodel.moe.experts import expert_params_per_gpu, uses_dispatcher
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, TrainingSpec

__all__ = [
    "INDEX_BYTES",
    "QUANT_BLOCK_ELEMS",
    "CollectiveOp",
    "activation_bytes_per_elem",
    "comm_bytes_per_gpu",
    "compressed_grad_bytes_per_elem",
    "cp_a2a_buffers",
    "cp_a2a_bytes_per_layer",
    "cp_allgather_bytes_per_layer",
    "cp_kv_chunk_bytes",
    "cp_sends_per_layer",
    "dp_ops",
    "ep_dispatch_bytes",
    "expert_dp_ops",
    "grad_bytes_per_elem",
    "largest_stage_params",
    "param_bytes_per_elem",
    "params_per_gpu",
    "pp_activation_bytes",
    "pp_sends_per_microbatch",
    "pp_tied_embedding_bytes",
    "replicated_layer_params",
    "sequence_parallel_grad_params",
    "tp_activation_bytes",
    "tp_boundary_bytes",
    "tp_collectives_per_layer",
    "zero_ops",
]

INDEX_BYTES = 4  # int32 index per kept top-k value (Lin et al. 2018, DGC)
QUANT_BLOCK_ELEMS = (
    2048  # one fp32 scale per block for int8 / 1-bit (Dettmers et al. 2022 block size)
)
_SCALE_BYTES = 4


class CollectiveOp(NamedTuple):
    """One kind of collective issued ``count`` times per step on a ``buffer_bytes`` buffer
    (NCCL convention: full buffer per GPU) over the group of ``group_size`` GPUs."""

    collective: str
    buffer_bytes: np.ndarray
    count: np.ndarray
    group_size: np.ndarray


# --------------------------------------------------------------------------------------------
# Data types
# --------------------------------------------------------------------------------------------
def activation_bytes_per_elem(training: TrainingSpec) -> float:
    """Bytes per activation element exchanged: 4 for fp32 training, else 2 (bf16/fp16; fp8/fp4
    recipes keep activations between layers in bf16, Transformer Engine)."""
    return 4.0 if training.precision == "fp32" else 2.0


def grad_bytes_per_elem(training: TrainingSpec) -> float:
    """Bytes per gradient element reduced across data parallel: 4 when the gradients accumulate
    in fp32 (fp32 training, or Megatron-LM's fp32 main-grad buffer, ``grad_reduce_in_fp32``, the
    default), 2 with a bf16/fp16 buffer (``--grad-reduce-in-bf16``; NeMo's performance recipes).
    The memory model counts the same buffer (:func:`perfmodel.memory.breakdown.state_bytes_per_param`)."""
    return 4.0 if training.precision == "fp32" or training.grad_reduce_in_fp32 else 2.0


def param_bytes_per_elem(training: TrainingSpec) -> float:
    """Bytes per parameter element all-gathered under ZeRO: the model-weight dtype (4 for fp32,
    else 2: Megatron-LM's distributed optimizer gathers bf16/fp16 parameters; 1 with fp8 model
    parameters, ``fp8_params``, which it gathers in fp8)."""
    if training.fp8_params and training.precision in ("fp8", "fp4"):
        return 1.0
    return 4.0 if training.precision == "fp32" else 2.0


# --------------------------------------------------------------------------------------------
# Parameters held by one GPU
# --------------------------------------------------------------------------------------------
def _stage_layers(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Transformer layers of the pipeline rank holding most (Megatron-LM's layout,
    :func:`perfmodel.parallel.layers.stage_layer_counts`; ``L/pp`` for the even split)."""
    return batch.layer_counts(model.num_layers)["max_rank"].astype(np.float64)


def largest_stage_params(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Parameters of the largest pipeline stage (before tensor-parallel splitting).

    ``L/pp`` layers, plus on the first stage the input embeddings and on the last the final norm
    and the output layer; with tied embeddings and ``pp > 1`` the last stage keeps its own copy
    of the word embedding for the logits (Megatron-LM, Narayanan et al. 2021 Sec. 5.1 notes the
    embedding on the first and last stage).

    References
    ----------
    Narayanan et al. 2021, Sec. 5.1 (parameter count); Megatron-LM ``language_model`` embedding
    placement (first/last stage).
    """
    pp = batch.pp.astype(np.float64)
    layers = _stage_layers(model, batch) * model.layer_params()
    embed = float(model.embedding_params())
    word = float(model.vocab_size * model.hidden_size)
    out_own = float(model.output_params())
    last_multi = model.norm_params() + (out_own if out_own else word)  # last stage, pp > 1
    single = embed + model.norm_params() + out_own  # pp == 1: everything on one stage
    extra = np.where(pp > 1, np.maximum(embed, last_multi), single)
    return layers + extra


def replicated_layer_params(model: ModelSpec) -> int:
    """Parameters of one layer that tensor parallelism replicates instead of splitting: the two
    norms, the biases of the row-parallel linears (attention output, MLP down projection, added
    after the reduction) and the MoE router (Megatron-LM ``RowParallelLinear``, ``TopKRouter``)."""
    h = model.hidden_size
    # routed experts' biases belong to the experts (sharded by ep*etp, see perfmodel.moe.experts)
    row_bias = 2 * h if model.linear_bias else 0
    router = model.router_params() if model.is_moe else 0
    return model.norms_per_layer * model.norm_params() + row_bias + router


def sequence_parallel_grad_params(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Replicated parameters whose gradient is a partial sum under sequence parallelism (each
    tensor-parallel rank sees only its sequence slice): norms and row-parallel biases of the
    stage's layers, plus the final norm on the last stage (the largest stage of the two).

    References
    ----------
    Korthikanti et al. 2022, Sec. 4.2.2; Megatron-LM ``finalize_model_grads``
    (``_allreduce_layernorm_grads``: parameters flagged ``sequence_parallel``).
    """
    h = model.hidden_size
    per_layer = model.norms_per_layer * model.norm_params() + (2 * h if model.linear_bias else 0)
    return _stage_layers(model, batch) * per_layer + model.norm_params()


def params_per_gpu(model: ModelSpec, batch: ConfigBatch) -> np.ndarray:
    """Parameters held by one GPU of the largest stage.

    Tensor parallelism splits the attention, MLP and vocabulary matrices (and column-parallel
    biases) ``tp`` ways; norms, row-parallel biases, the router (:func:`replicated_layer_params`)
    and learned position embeddings are replicated on every tensor-parallel rank (Megatron-LM:
    ``VocabParallelEmbedding`` for words, a plain embedding for positions). First stage: layers
    + word embedding / tp + positions; last (``pp > 1``): layers + final norm + output layer / tp
    (a tied model's copy of the word embedding); ``pp == 1``: all of them. The largest of the
    two end stages. Without replicated parameters this is ``largest_stage_params / tp``.

    References
    ----------
    Shoeybi et al. 2019, Sec. 3 (what is split); Narayanan et al. 2021, Sec. 5.1.
    """
    tp = batch.tp.astype(np.float64)
    pp = batch.pp.astype(np.float64)
    rep = float(replicated_layer_params(model))
    # routed experts are split by ep*etp, not tp: perfmodel.moe.experts.expert_params_per_gpu
    layer = (model.layer_params() - model.routed_expert_params_per_layer() - rep) / tp + rep
    layers = _stage_layers(model, batch) * layer
    h, v = model.hidden_size, model.vocab_size
    pos = float(model.embedding_params() - v * h)
    word = v * h / tp
    out = model.output_params() / tp
    first = word + pos
    last = model.norm_params() + np.where(model.output_params() > 0, out, word)
    single = word + pos + model.norm_params() + out
    return layers + np.where(pp > 1, np.maximum(first, last), single)


# --------------------------------------------------------------------------------------------
# Data parallel
# --------------------------------------------------------------------------------------------
def compressed_grad_bytes_per_elem(training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """Bytes per gradient element in the gradient reduction, by ``grad_compression``.

    none: the gradient dtype; top-k: ``ratio * (value + int32 index)``; int8: ``1`` + an fp32
    scale per :data:`QUANT_BLOCK_ELEMS`; 1-bit: ``1/8`` + the same scales.

    References
    ----------
    Lin et al. 2018, "Deep Gradient Compression", ICLR (top-k values + indices); Seide et al. 2014,
    "1-Bit SGD"; Tang et al. 2021, "1-bit Adam", ICML (compressed all-reduce with per-chunk scale);
    Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization" (block size 2048).
    """
    g = grad_bytes_per_elem(training)
    scale = _SCALE_BYTES / QUANT_BLOCK_ELEMS
    c = batch.grad_compression
    return np.select(
        [c == 1, c == 2, c == 3],
        [batch.topk_ratio * (g + INDEX_BYTES), 1.0 + scale, 1.0 / 8.0 + scale],
        default=g,
    )


def dp_ops(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch) -> dict[str, CollectiveOp]:
    """Data-parallel collectives of one step, over the ``dp*cp`` group (counts are 0 where a kind
    does not apply).

    ``grad_all_reduce``: ZeRO-0 (dense or quantized gradients).
    ``grad_sparse_all_gather``: ZeRO-0 with top-k: sparse vectors cannot be summed in a ring
    reduce-scatter without densifying, so each GPU's (value, index) pairs are all-gathered and the
    per-GPU volume grows with ``n`` (DGC, Lin et al. 2018; Shi et al. 2019 "gTop-k", Sec. 3).
    ``grad_reduce_scatter``: ZeRO >= 1 (once per step for ZeRO-1, once per micro-batch for ZeRO-2/3,
    whose sharded gradient cannot accumulate a whole gradient).
    ``param_all_gather``: ZeRO-1/2, once per step after the optimizer.
    ``zero3_param_all_gather``: ZeRO-3, before each micro-batch's forward and backward (``2m``),
    and once more for the recomputed forward under full recompute (``3m``).

    References
    ----------
    Rajbhandari et al. 2020 (ZeRO), Sec. 5 and 7.2; PyTorch FSDP (Zhao et al. 2023, VLDB, Sec. 3.3:
    all-gather in forward and in backward, reduce-scatter per backward).
    """
    psi = params_per_gpu(model, batch)
    n = (batch.dp * batch.cp).astype(np.float64)
    return zero_ops(psi, n, training, batch)


def expert_dp_ops(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                  ) -> dict[str, CollectiveOp]:
    """The collectives of :func:`dp_ops` for the routed experts' parameters
    (:func:`perfmodel.moe.experts.expert_params_per_gpu`), over the expert-data-parallel group
    (``tp*cp*dp / (ep*etp)`` GPUs): Megatron-Core reduces expert gradients and shards their
    distributed-optimizer states over ``expt_dp`` (``parallel_state.get_expert_data_parallel_group``).
    All counts are 0 for a dense model."""

    return zero_ops(expert_params_per_gpu(model, batch), batch.expert_dp.astype(np.float64),
                    training, batch)


def zero_op_counts(batch: ConfigBatch) -> dict[str, np.ndarray]:
    """How many of each collective of :func:`zero_ops` a step issues, per configuration (0
    where a kind does not apply): the counts of :func:`dp_ops` and :func:`expert_dp_ops`."""
    m = batch.num_microbatches.astype(np.float64)
    z = batch.zero_stage
    topk = batch.grad_compression == Compression.TOPK
    zeros = np.zeros(len(batch))
    one = np.ones(len(batch))
    return {
        "grad_all_reduce": np.where((z == 0) & ~topk, one, zeros),
        "grad_sparse_all_gather": np.where((z == 0) & topk, one, zeros),
        "grad_reduce_scatter": np.select([z == 1, z >= 2], [one, m], zeros),
        "param_all_gather": np.where((z == 1) | (z == 2), one, zeros),
        "zero3_param_all_gather": np.where(
            z == 3, (2 + (batch.recompute == Recompute.FULL)) * m, zeros),
    }


def zero_ops(psi: np.ndarray, n: np.ndarray, training: TrainingSpec, batch: ConfigBatch
             ) -> dict[str, CollectiveOp]:
    """Gradient-reduction and ZeRO collectives of ``psi`` parameters per GPU over a group of
    ``n`` GPUs (the body of :func:`dp_ops`; counts: :func:`zero_op_counts`)."""
    gc = compressed_grad_bytes_per_elem(training, batch)
    w = param_bytes_per_elem(training)
    count = zero_op_counts(batch)
    return {
        "grad_all_reduce": CollectiveOp("all_reduce", psi * gc, count["grad_all_reduce"], n),
        "grad_sparse_all_gather": CollectiveOp(
            "all_gather", n * psi * gc, count["grad_sparse_all_gather"], n),
        "grad_reduce_scatter": CollectiveOp(
            "reduce_scatter", psi * gc, count["grad_reduce_scatter"], n),
        "param_all_gather": CollectiveOp("all_gather", psi * w, count["param_all_gather"], n),
        "zero3_param_all_gather": CollectiveOp(
            "all_gather", psi * w, count["zero3_param_all_gather"], n),
    }


# --------------------------------------------------------------------------------------------
# Tensor, pipeline and context parallel
# --------------------------------------------------------------------------------------------
def tp_activation_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """Buffer of one tensor-parallel all-reduce: ``b * (s/cp) * h`` activations [bytes]
    (Shoeybi et al. 2019, Sec. 3; the all-gather output / reduce-scatter input with sequence
    parallelism, Korthikanti et al. 2022, Sec. 4.2.2)."""
    tokens = batch.micro_batch_size * (training.seq_len / batch.cp)
    return tokens * model.hidden_size * activation_bytes_per_elem(training)


def tp_collectives_per_layer(batch: ConfigBatch, model: ModelSpec | None = None
                             ) -> tuple[np.ndarray, np.ndarray]:
    """All-reduce-equivalents per layer per micro-batch: (forward, backward incl. recompute).

    Forward 2 (attention output, MLP output; the ``g`` operators of Shoeybi et al. 2019 Fig. 4),
    backward 2 (the ``f`` operators), plus 2 under full recomputation (the repeated forward,
    Korthikanti et al. 2022 Sec. 5, Table 2). Selective recomputation repeats no communication.
    """
    blocks = float(model.norms_per_layer) if model is not None else 2.0  # hybrid: 1 a layer
    fwd = np.full(batch.tp.shape, blocks)
    bwd = blocks + np.where(batch.recompute == Recompute.FULL, blocks, 0.0)
    if model is not None and model.is_moe:
        # MoE layers with expert parallelism (or etp != tp): the router takes the sequence-
        # parallel slice and the tokens travel by the dispatcher (perfmodel.moe.experts), so the MLP's
        # collective is gone in the MoE layers (ep = 1, etp = tp: experts behind the tp
        # all-gather as a dense MLP)

        gone = np.where(uses_dispatcher(batch), model.moe_layer_fraction, 0.0)
        fwd = fwd - gone
        bwd = bwd - gone * np.where(batch.recompute == Recompute.FULL, 2.0, 1.0)
    return fwd, bwd


def tp_boundary_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """Tensor-parallel bytes per step outside the transformer layers, on the busier end stage.

    Per micro-batch, in all-reduce equivalents of the ``b*(s/cp)*h`` activations:

    * first stage, vocabulary-parallel word embedding: its output all-reduced (1); with sequence
      parallelism and learned positions Megatron all-reduces, adds the positions and splits the
      sum along the sequence, whose backward all-gathers the gradient (1.5); with sequence
      parallelism and no learned positions the all-reduce becomes a reduce-scatter forward and
      an all-gather backward (1);
    * last stage, column-parallel output layer: the ``f`` operator, an all-reduce of its input
      gradient (or all-gather forward + reduce-scatter backward with sequence parallelism) (1);
      and the vocabulary-parallel cross-entropy: 3 all-reduces of one fp32 value per token
      (maximum logit, target logit, sum of exponentials).

    Per step, with sequence parallelism: one all-reduce of the partial gradients of the
    replicated parameters (:func:`sequence_parallel_grad_params`); with ZeRO-2/3 each rank holds
    and reduces only its ``1/(dp*cp)`` gradient shard (the sums commute).

    References
    ----------
    Megatron-LM ``VocabParallelEmbedding``, ``LanguageModelEmbedding`` (``reduce_scatter_embeddings``
    only without learned positions, else ``scatter_to_sequence_parallel_region``),
    ``ColumnParallelLinear`` (output layer), ``vocab_parallel_cross_entropy`` (three all-reduces),
    ``finalize_model_grads._allreduce_layernorm_grads``; Shoeybi et al. 2019, Sec. 3.
    """
    tp = batch.tp
    sp = np.asarray(batch.sequence_parallel, dtype=bool)
    m = batch.num_microbatches.astype(np.float64)
    one = bytes_per_gpu("all_reduce", tp_activation_bytes(model, training, batch), tp)
    learned = model.position_embedding == "learned"
    embed = np.where(sp & learned, 1.5, 1.0) * one
    tokens = batch.micro_batch_size * (training.seq_len / batch.cp)
    loss = 3.0 * bytes_per_gpu("all_reduce", 4.0 * tokens, tp)
    shard = np.where(batch.zero_stage >= 2, (batch.dp * batch.cp).astype(np.float64), 1.0)
    g = grad_bytes_per_elem(training) / shard
    layers_sp = sequence_parallel_grad_params(model, batch) - model.norm_params()
    sp_first = np.where(sp, bytes_per_gpu("all_reduce", layers_sp * g, tp), 0.0)
    sp_last = np.where(
        sp, bytes_per_gpu("all_reduce", (layers_sp + model.norm_params()) * g, tp), 0.0
    )
    first = m * embed + sp_first
    last = m * (one + loss) + sp_last
    single = m * (embed + one + loss) + sp_last
    return np.where(batch.pp > 1, np.maximum(first, last), single)


def pp_tied_embedding_bytes(
    model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
) -> np.ndarray:
    """Tied embeddings with ``pp > 1``: the first and last stage each hold the word embedding
    and all-reduce its gradient between them once per step (``V*h/tp`` values, over 2 ranks;
    ZeRO-2/3 reduce their ``1/(dp*cp)`` shard). Counted in the ``pp`` dimension.

    References
    ----------
    Megatron-LM ``finalize_model_grads._allreduce_word_embedding_grads``; Narayanan et al. 2021.
    """
    if model.output_params() > 0:
        return np.zeros(batch.tp.shape)
    shard = np.where(batch.zero_stage >= 2, (batch.dp * batch.cp).astype(np.float64), 1.0)
    buf = model.vocab_size * model.hidden_size / batch.tp * grad_bytes_per_elem(training) / shard
    return np.where(batch.pp > 1, bytes_per_gpu("all_reduce", buf, 2.0), 0.0)


def pp_activation_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """One pipeline send per GPU [bytes]: ``b * (s/cp) * h`` activations, divided by ``tp`` with
    sequence parallelism (each tensor-parallel rank holds a ``1/tp`` sequence slice).

    Megatron-LM 2021's scatter/gather optimisation (Narayanan et al. 2021, Sec. 4.1) also splits
    the send by ``tp`` without sequence parallelism; it is not assumed here.
    """
    full = tp_activation_bytes(model, training, batch)
    return np.where(batch.sequence_parallel, full / batch.tp, full)


def pp_sends_per_microbatch(batch: ConfigBatch) -> np.ndarray:
    """Sends per micro-batch by the busiest GPU (forward + backward).

    Each model chunk boundary sends activations forward and gradients backward. An inner stage
    sends ``vp`` forward and ``vp`` backward; with ``pp == 2`` each stage has one fewer (the first
    stage's first chunk receives no gradient to pass on): ``2vp - 1``; with ``pp == 1`` none.

    References
    ----------
    Narayanan et al. 2021, Sec. 2.2.2 (interleaving multiplies communication by ``v``).
    """
    vp = batch.vp.astype(np.float64)
    return np.select([batch.pp >= 3, batch.pp == 2], [2.0 * vp, 2.0 * vp - 1.0], 0.0)


def cp_kv_chunk_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """K and V of this GPU's sequence chunk [bytes]: ``2 * b * (s/cp) * kv_heads/tp * head_dim``
    elements (with grouped-query attention only the ``kv_heads`` heads; a tensor-parallel rank holds
    at least one).

    References
    ----------
    Liu et al. 2023 (Ring Attention); Ainslie et al. 2023 (GQA); Megatron-LM context parallel docs.
    """
    kv_per_rank = np.maximum(model.kv_heads / batch.tp, 1.0)
    tokens = batch.micro_batch_size * (training.seq_len / batch.cp)
    return 2.0 * tokens * kv_per_rank * model.head_size * activation_bytes_per_elem(training)


def cp_a2a_buffers(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                   ) -> dict[str, np.ndarray]:
    """Q, K, V and output buffers of one rank's Ulysses all-to-alls in one layer and
    micro-batch [bytes] (:func:`perfmodel.comm.cp_a2a.a2a_buffer_bytes`): ``b * s/cp`` tokens,
    ``heads/tp`` query heads, ``max(kv_heads/tp, 1)`` K/V heads."""
    tokens = batch.micro_batch_size * (training.seq_len / batch.cp)
    return a2a_buffer_bytes(tokens, model.num_attention_heads / batch.tp,
                            np.maximum(model.kv_heads / batch.tp, 1.0), model.qk_head_size,
                            model.v_head_size, activation_bytes_per_elem(training))


def cp_a2a_bytes_per_layer(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                           ) -> np.ndarray:
    """Bytes one GPU sends through the Ulysses all-to-alls (``cp_comm = "a2a"``) of one layer
    and micro-batch: ``(cp-1)/cp`` of the Q, K, V and output buffers in the forward, the
    backward and a recomputed forward (Jacobs et al. 2023, Sec. 3.2); 0 at cp = 1."""
    buf = cp_a2a_buffers(model, training, batch)
    passes = 2.0 + np.where(batch.recompute == Recompute.FULL, 1.0, 0.0)
    # hierarchical rows (cp_comm "a2a+p2p") exchange inside their inner group of cp_a2a
    group = np.where(batch.cp_comm == CpComm.A2A_P2P, batch.cp_a2a, batch.cp)
    return passes * bytes_per_gpu("all_to_all", sum(buf.values()), group)


def cp_allgather_bytes_per_layer(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                                 ) -> np.ndarray:
    """Bytes one GPU sends through the K/V all-gather attention (``cp_comm = "allgather"``) of
    one layer and micro-batch: the all-gather of K and V (``cp`` chunks gathered) in the
    forward, again in the backward with the reduce-scatter of dK and dV, and once more under
    full recompute, ``(cp-1)/cp`` of the full-sequence K/V each
    (:mod:`perfmodel.comm.cp_allgather`); 0 at cp = 1."""
    full = batch.cp * cp_kv_chunk_bytes(model, training, batch)
    passes = 2.0 + np.where(batch.recompute == Recompute.FULL, 1.0, 0.0)
    return (passes * bytes_per_gpu("all_gather", full, batch.cp)
            + bytes_per_gpu("reduce_scatter", full, batch.cp))


def cp_sends_per_layer(batch: ConfigBatch) -> tuple[np.ndarray, np.ndarray]:
    """K/V-chunk sends per layer per micro-batch: (forward, backward incl. recompute).

    Forward ``cp-1`` (K, V around the ring); backward ``2(cp-1)`` (K, V and the accumulated dK, dV),
    plus ``cp-1`` more under full recomputation. Hierarchical rows (``cp_comm = "a2a+p2p"``)
    run the ring over ``cp / cp_a2a`` ranks (``cp_a2a`` is 1 elsewhere).

    References
    ----------
    Transformer Engine ``AttnFuncWithCPAndKVP2P`` (forward sends KV, backward sends KV and dKV);
    Liu et al. 2023, Sec. 3.
    """
    k = np.maximum(batch.cp // batch.cp_a2a - 1, 0).astype(np.float64)
    bwd = 2.0 * k + np.where(batch.recompute == Recompute.FULL, k, 0.0)
    return k, bwd


# --------------------------------------------------------------------------------------------
# Totals
# --------------------------------------------------------------------------------------------
def comm_bytes_per_gpu(
    model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
) -> dict[str, np.ndarray]:
    """Bytes sent by one GPU (of the busiest pipeline stage) per training step.

    Returns
    -------
    dict with ``dp``, ``tp``, ``pp``, ``cp`` arrays [bytes per GPU per step].

    References
    ----------
    Module docstring; docs/communication.md derives the closed form (exercise 9.5).
    """
    m = batch.num_microbatches.astype(np.float64)
    layers = _stage_layers(model, batch)  # layers held by one GPU (all its chunks)
    # the per-layer and per-collective factors once per distinct value of the fields they
    # read (ConfigBatch.per_distinct; a search batch repeats them), the products per row
    one = batch.per_distinct(_LAYER_FIELDS, lambda b: _layer_bytes(model, training, b))

    # data parallel: sum over the step's collectives
    dp = _dp_bytes(model, training, batch)

    # tensor parallel: all-reduce equivalents per layer per micro-batch
    tp = m * layers * one["tp_n"] * one["tp_one"] + tp_boundary_bytes(model, training, batch)

    # pipeline parallel: sends of the busiest stage
    send = batch.per_distinct(_LAYER_FIELDS, lambda b: {
        "bytes": pp_activation_bytes(model, training, b)})["bytes"]
    pp = m * pp_sends_per_microbatch(batch) * send
    pp = pp + pp_tied_embedding_bytes(model, training, batch)

    # context parallel: ring attention K/V exchanges, the Ulysses all-to-alls, both
    # (hierarchical), or the K/V all-gathers
    cp = m * layers * one["cp_n"] * one["kv_bytes"]
    a2a = batch.cp_comm == CpComm.A2A
    hier = batch.cp_comm == CpComm.A2A_P2P
    if np.any(a2a | hier):
        a2a_b = m * layers * cp_a2a_bytes_per_layer(model, training, batch)
        cp = np.where(a2a, a2a_b, np.where(hier, cp + a2a_b, cp))
    ag = batch.cp_comm == CpComm.ALLGATHER
    if np.any(ag):
        cp = np.where(ag, m * layers * cp_allgather_bytes_per_layer(model, training, batch), cp)

    out = {"dp": np.asarray(dp, dtype=np.float64), "tp": tp, "pp": pp, "cp": cp}
    out["ep"] = ep_dispatch_bytes(model, training, batch)
    return out


#: The fields one layer's tensor- and context-parallel factors read (:func:`_layer_bytes`).
_LAYER_FIELDS = ("tp", "cp", "micro_batch_size", "sequence_parallel", "recompute", "ep", "etp",
                 "cp_a2a")
#: (one pipeline send, :func:`pp_activation_bytes`, reads a subset of them: tp, cp, the
#: micro-batch and sp; the same key spares a second distinct-row pass)
#: The fields one data-parallel collective's bytes read: the buffer and the dp x cp group.
_DP_ONCE_FIELDS = ("tp", "cp", "dp", "pp", "vp", "first_stage_layers", "last_stage_layers",
                   "embedding_as_layer", "loss_as_layer", "grad_compression", "topk_ratio")


def _layer_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch) -> dict:
    """One layer's factors of :func:`comm_bytes_per_gpu`: tensor-parallel all-reduce
    equivalents ``tp_n`` (forward + backward) of ``tp_one`` bytes each, ring sends ``cp_n`` of
    ``kv_bytes`` each."""
    tp_fwd, tp_bwd = tp_collectives_per_layer(batch, model)
    tp_one = bytes_per_gpu("all_reduce", tp_activation_bytes(model, training, batch), batch.tp)
    cp_fwd, cp_bwd = cp_sends_per_layer(batch)
    return {"tp_n": tp_fwd + tp_bwd, "tp_one": tp_one, "cp_n": cp_fwd + cp_bwd,
            "kv_bytes": cp_kv_chunk_bytes(model, training, batch)}


def _dp_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch) -> np.ndarray:
    """Data-parallel bytes per GPU and step: the sum over :func:`dp_ops` (and, MoE,
    :func:`expert_dp_ops`) of count x bytes of one collective; for a dense model the bytes of
    one collective once per distinct :data:`_DP_ONCE_FIELDS` (counts: :func:`zero_op_counts`)."""
    if model.is_moe:
        ops = [*dp_ops(model, training, batch).values(),
               *expert_dp_ops(model, training, batch).values()]
        return sum(op.count * bytes_per_gpu(op.collective, op.buffer_bytes, op.group_size)
                   for op in ops)
    once = batch.per_distinct(_DP_ONCE_FIELDS, lambda b: {
        k: bytes_per_gpu(op.collective, op.buffer_bytes, op.group_size)
        for k, op in dp_ops(model, training, b).items()})
    counts = zero_op_counts(batch)
    return sum(counts[k] * once[k] for k in counts)


def ep_dispatch_bytes(model: ModelSpec, training: TrainingSpec, batch: ConfigBatch
                      ) -> np.ndarray:
    """Expert-parallel token dispatch and combine bytes one GPU sends per step (0 for a dense
    model): per MoE layer of the stage and micro-batch, :func:`perfmodel.moe.experts.a2a_per_layer`
    exchanges of the :func:`perfmodel.moe.experts.dispatch_ops_per_layer` buffers, each sending
    ``(n-1)/n`` of its buffer (all-to-all, all-gather; the combine's reduce-scatter the same).

    References
    ----------
    :mod:`perfmodel.moe.experts`; NCCL-tests ``alltoall.cu`` (bus factor ``(n-1)/n``).
    """
    if not model.is_moe:
        return np.zeros(len(batch))

    m = batch.num_microbatches.astype(np.float64)
    moe_layers = model.num_moe_layers / batch.pp
    fwd, bwd = moe.a2a_per_layer(batch)
    ops = moe.dispatch_ops_per_layer(model, training, batch, activation_bytes_per_elem(training))
    one = sum(bytes_per_gpu(c, buf, n) for c, buf, n in ops.values())
    return m * moe_layers * (fwd + bwd) * one
