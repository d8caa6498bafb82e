"""Write a chosen configuration as launch settings for the frameworks people run.

* Megatron-LM: command-line arguments (names as in ``megatron/training/arguments.py``:
  ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--num-layers-per-virtual-pipeline-stage``, ``--context-parallel-size``,
  ``--sequence-parallel``, ``--micro-batch-size``, ``--global-batch-size``,
  ``--use-distributed-optimizer``, ``--recompute-granularity``, ``--recompute-method``,
  ``--recompute-num-layers``, ``--bf16``/``--fp16``, ``--fp8-format``, ``--overlap-grad-reduce``,
  ``--overlap-param-gather``, ``--tp-comm-overlap``). Megatron has no data-parallel flag: d is the
  world size over t*p*cp, so the launcher's GPU count carries it. ZeRO-2/3 are not Megatron
  features: they are emitted as the distributed optimizer (stage 1) with a comment.
* torchtitan: a TOML ``[parallelism]`` section (``data_parallel_replicate_degree``,
  ``data_parallel_shard_degree``, ``fsdp_reshard_after_forward``, ``tensor_parallel_degree``,
  ``pipeline_parallel_degree``, ``pipeline_parallel_schedule``,
  ``pipeline_parallel_microbatch_size``, ``context_parallel_degree``) plus ``[training]``
  (``local_batch_size``, ``global_batch_size``, ``seq_len``) and ``[activation_checkpoint]``
  (``mode``), names from ``torchtitan/config/job_config.py``.
* DeepSpeed: a JSON config (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps``, ``zero_optimization.stage``, ``bf16``/``fp16``,
  ``tensor_parallel.autotp_size`` for AutoTP training). Pipeline parallelism in DeepSpeed is set
  in code (``PipelineModule(num_stages=...)``), so it is written as a ``_comment``.
"""

from __future__ import annotations

import json

from perfmodel.config import ParallelConfig
from perfmodel.specs import ModelSpec, TrainingSpec

FORMATS = ("megatron", "torchtitan", "deepspeed")


def megatron_args(config: ParallelConfig, model: ModelSpec, training: TrainingSpec) -> str:
    """Megatron-LM command-line arguments for ``config`` (one flag per line)."""
    c = config
    args: list[str] = [
        f"--num-layers {model.num_layers}",
        f"--hidden-size {model.hidden_size}",
        f"--num-attention-heads {model.num_attention_heads}",
        f"--ffn-hidden-size {model.ffn_hidden_size}",
        f"--seq-length {training.seq_len}",
        f"--max-position-embeddings {max(model.max_seq_len, training.seq_len)}",
        f"--tensor-model-parallel-size {c.tp}",
        f"--pipeline-model-parallel-size {c.pp}",
        f"--context-parallel-size {c.cp}",
        f"--micro-batch-size {c.micro_batch_size}",
        f"--global-batch-size {training.global_batch_size}",
    ]
    if model.kv_heads != model.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    if model.activation == "swiglu":
        args.append("--swiglu")
    elif model.activation == "relu2":
        args.append("--squared-relu")
    if model.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if model.position_embedding == "rope":
        args.append("--position-embedding-type rope")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.linear_bias:
        args.append("--disable-bias-linear")
    # Megatron-LM's uneven pipeline layout (perfmodel.pipeline.stage_layer_counts)
    layout = [f"--decoder-first-pipeline-num-layers {c.first_stage_layers}"
              if c.first_stage_layers else "",
              f"--decoder-last-pipeline-num-layers {c.last_stage_layers}"
              if c.last_stage_layers else "",
              "--account-for-embedding-in-pipeline-split" if c.embedding_as_layer else "",
              "--account-for-loss-in-pipeline-split" if c.loss_as_layer else ""]
    layout = [x for x in layout if x]
    if c.vp > 1 and (layout or model.num_layers % (c.pp * c.vp)):
        args.append(f"--num-virtual-stages-per-pipeline-rank {c.vp}")
    elif c.vp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {model.num_layers // (c.pp * c.vp)}")
    args += layout
    if c.sequence_parallel:
        args.append("--sequence-parallel")
    if c.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if c.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif c.recompute == "selective":
        args.append("--recompute-granularity selective")
    prec = training.precision
    if prec == "fp16":
        args.append("--fp16")
    elif prec in ("bf16", "fp8", "fp4"):
        args.append("--bf16")
    if prec == "fp8":
        args.append("--fp8-format hybrid")
    if training.overlap_grad_reduce and c.dp > 1:
        args.append("--overlap-grad-reduce")
        if c.zero_stage >= 1:
            args.append("--overlap-param-gather")
    if training.overlap_tp_comm and c.tp > 1:
        args.append("--tp-comm-overlap")
    header = [f"# data parallel d={c.dp}: launch on dp*tp*pp*cp = {c.gpus} GPUs"]
    if c.zero_stage >= 2:
        header.append(f"# ZeRO-{c.zero_stage} has no Megatron flag; the distributed optimizer "
                      "(ZeRO-1) is the closest")
    return "\n".join(header + [a + " \\" for a in args[:-1]] + [args[-1]]) + "\n"


def torchtitan_toml(config: ParallelConfig, model: ModelSpec, training: TrainingSpec) -> str:
    """A torchtitan TOML fragment with ``[training]``, ``[parallelism]`` and
    ``[activation_checkpoint]``. ZeRO-3 maps to FSDP over the data-parallel ranks
    (``data_parallel_shard_degree``) resharding after forward; ZeRO-2 to FSDP without
    resharding; ZeRO-0/1 to DDP replication (torchtitan has no separate ZeRO-1)."""
    c = config
    if c.zero_stage >= 2:
        replicate, shard = 1, c.dp
        reshard = "always" if c.zero_stage == 3 else "never"
    else:
        replicate, shard, reshard = c.dp, 1, "default"
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                "zb": "InterleavedZeroBubble"}[c.schedule]
    local_batch = c.micro_batch_size * (c.num_microbatches or 1)
    lines = [
        "[training]",
        f"local_batch_size = {local_batch}",
        f"global_batch_size = {training.global_batch_size}",
        f"seq_len = {training.seq_len}",
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{reshard}"',
        f"tensor_parallel_degree = {c.tp}",
        f"pipeline_parallel_degree = {c.pp}",
        f'pipeline_parallel_schedule = "{schedule}"',
        f"pipeline_parallel_microbatch_size = {c.micro_batch_size}",
        f"context_parallel_degree = {c.cp}",
        "",
        "[activation_checkpoint]",
        f'mode = "{c.recompute}"',
        "",
    ]
    return "\n".join(lines)


def deepspeed_json(config: ParallelConfig, model: ModelSpec, training: TrainingSpec) -> str:
    """A DeepSpeed JSON config for ``config``."""
    c = config
    accum = training.global_batch_size // (c.dp * c.micro_batch_size)
    cfg: dict = {
        "train_batch_size": training.global_batch_size,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "zero_optimization": {"stage": c.zero_stage, "overlap_comm": True},
        "bf16": {"enabled": training.precision in ("bf16", "fp8", "fp4")},
        "fp16": {"enabled": training.precision == "fp16"},
        "gradient_clipping": 1.0,
    }
    if c.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": c.tp}
    if c.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": c.tp > 1,
                                           "contiguous_memory_optimization": False}
    notes = []
    if c.pp > 1:
        notes.append(f"pipeline parallel: build deepspeed.pipe.PipelineModule(num_stages={c.pp})")
    if c.cp > 1:
        notes.append(f"context parallel {c.cp}: use DeepSpeed-Ulysses sequence parallel size {c.cp}")
    if notes:
        cfg["_comment"] = "; ".join(notes)
    return json.dumps(cfg, indent=2) + "\n"


def emit(fmt: str, config: ParallelConfig, model: ModelSpec, training: TrainingSpec) -> str:
    """Launch settings in ``fmt`` (megatron, torchtitan or deepspeed)."""
    fn = {"megatron": megatron_args, "torchtitan": torchtitan_toml, "deepspeed": deepspeed_json}
    if fmt not in fn:
        from perfmodel.specs import SpecError

        raise SpecError(f"--emit {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fn[fmt](config, model, training)
