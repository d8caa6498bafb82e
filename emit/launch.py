"""Write a planned configuration as the launch settings of the framework that will run it.

Four formats, each in the form that framework documents and parses itself:

* ``megatron``: Megatron-LM ``pretrain_gpt.py`` arguments, one per line (``#`` lines are
  comments; ``$(grep -v '^#' megatron.args)`` on the command line). Names as in Megatron-LM
  ``megatron/training/arguments.py`` (main, Megatron-Core 0.16).
* ``bridge``: a Megatron-Bridge YAML override of the recipe's ``ConfigContainer`` (sections
  ``model``, ``train``, ``ddp``, ``optimizer``, ``dist``, ``checkpoint``, ``dataset``,
  ``comm_overlap``, ``mixed_precision``), the form its example scripts read with
  ``--config-file`` and merge with OmegaConf (docs: "Megatron-LM to Megatron Bridge Guide").
* ``torchtitan``: a TOML job config (``--job.config_file``) with the field names of
  ``torchtitan/config/job_config.py`` (torchtitan 0.2; 0.3 replaced TOML files by Python
  config registries).
* ``deepspeed``: a DeepSpeed JSON config (``deepspeed.initialize(config=...)``), keys as in
  ``deepspeed/runtime/config.py`` and the ZeRO / pipeline / AutoTP config models.

Every planned choice is written: degrees, interleaving, uneven first / last stages, schedule,
ZeRO stage / distributed optimizer / FSDP, recompute granularity, sequence and context
parallelism, precision recipe, micro-batch and accumulation, and the model's architecture
(RoPE base, GQA groups, QKV bias, norm, activation, tied embeddings) where the format carries
it. Where the framework cannot run the plan, :func:`refusals` says why (one reason a line) and
:func:`emit` raises :class:`~perfmodel.spec.specs.SpecError` instead of writing something else;
:func:`launch_settings` adds the nearest configuration the search finds for that framework
(``search.plan(..., framework=...)``). Nothing is silently downgraded.

Fields that newer configurations carry are read with ``getattr`` and written only when present:
``ParallelConfig.first_stage_layers`` / ``last_stage_layers`` / ``embedding_as_layer`` /
``loss_as_layer`` (uneven stages) and a precision recipe name (``fp8-cs``, ``fp8-delayed``,
``fp8-block``, ``mxfp8``, ``nvfp4``) in ``TrainingSpec.precision`` or
``TrainingSpec.low_precision_recipe``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emit.moe import megatron_bridge_moe_fields, megatron_moe_args, torchtitan_moe_fields
from hardware_specs import KINDS, find_preset
from perfmodel.core.errors import SpecError
from perfmodel.core.files import atomic_write, refuse_input_as_output, shown
from perfmodel.parallel.config import ParallelConfig
from perfmodel.parallel.layers import (
    balanced_chunk_layers,
    balanced_stage_layers,
    megatron_layout,
    stage_layer_table,
)
from perfmodel.spec.frameworks import (
    FrameworkSpec,
    capability_refusals,
    explicit_layout_allowed,
    load_framework,
)
from perfmodel.spec.hybrid import mamba_heads
from perfmodel.spec.specs import ModelSpec, TrainingSpec, load_model

__all__ = ["CP_COMM_TYPE", "FILE_NAMES", "FORMATS", "FORMAT_FRAMEWORK", "Launch", "check_emit_dir",
           "check_outputs", "emit", "hierarchical_sizes", "launch_from_result",
           "launch_settings", "plan_inputs", "precision_recipe", "refusals", "stage_layers",
           "write_emit_dir"]

FORMATS = ("megatron", "bridge", "torchtitan", "deepspeed")
#: Each format's newest shipped framework preset (``hardware_specs/frameworks``): what the file
#: is checked against, and what ``plan --emit X`` plans for without ``--framework`` (a
#: ``--framework`` of the same stack replaces it).
FORMAT_FRAMEWORK = {"megatron": "megatron-lm", "bridge": "bridge-26.02",
                    "torchtitan": "torchtitan", "deepspeed": "deepspeed"}
FORMAT_STACK = {"megatron": "megatron", "bridge": "megatron", "torchtitan": "torchtitan",
                "deepspeed": "deepspeed"}
#: File written per format by ``--emit-dir``.
FILE_NAMES = {"megatron": "megatron.args", "bridge": "bridge.yaml",
              "torchtitan": "torchtitan.toml", "deepspeed": "deepspeed.json"}

#: Precision recipe -> (Megatron --fp8-format, --fp8-recipe) (``_add_transformer_engine_args``).
_MEGATRON_FP8 = {"fp8-delayed": ("hybrid", "delayed"), "fp8-cs": ("hybrid", "tensorwise"),
                 "fp8-block": ("e4m3", "blockwise"), "mxfp8": ("e4m3", "mxfp8")}
#: Precision recipe -> Megatron-Bridge mixed-precision recipe name
#: (``megatron/bridge/training/mixed_precision.py``, registered functions).
_BRIDGE_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed",
                     "fp8-delayed": "bf16_with_fp8_delayed_scaling_mixed",
                     "fp8-cs": "bf16_with_fp8_current_scaling_mixed",
                     "fp8-block": "bf16_with_fp8_subchannel_scaling_mixed",
                     "mxfp8": "bf16_with_mxfp8_mixed", "nvfp4": "bf16_with_nvfp4_mixed"}
_BRIDGE_ACT = {"gelu": "gelu (torch.nn.functional.gelu)", "swiglu": "SwiGLU (F.silu, gated)",
               "relu2": "squared ReLU (megatron.core.activations.squared_relu)"}
#: Megatron-Core's ``cp_comm_type`` of each planned ``cp_comm``: the string reaches Transformer
#: Engine unchanged (``TEDotProductAttention``), whose ``attn_forward_func_with_cp`` accepts
#: ``"p2p"``, ``"all_gather"``, ``"a2a"`` and ``"a2a+p2p"`` (Megatron-LM's --help spells the
#: second "allgather", which Transformer Engine rejects: "Unsupported communication type").
CP_COMM_TYPE = {"p2p": "p2p", "a2a": "a2a", "allgather": "all_gather", "a2a+p2p": "a2a+p2p"}
#: Nearest recipe a framework may run instead, in order of preference.
_NEAREST_RECIPE = {"fp8-delayed": ("fp8-cs", "fp8-block", "mxfp8", "bf16"),
                   "fp8-cs": ("fp8-delayed", "fp8-block", "mxfp8", "bf16"),
                   "fp8-block": ("fp8-cs", "mxfp8", "fp8-delayed", "bf16"),
                   "mxfp8": ("fp8-block", "fp8-cs", "fp8-delayed", "bf16"),
                   "nvfp4": ("mxfp8", "fp8-block", "fp8-cs", "fp8-delayed", "bf16"),
                   "fp16": ("bf16",), "fp32": ("bf16",), "bf16": ("fp32",)}
#: torchtitan llama3 flavors (``torchtitan/models/llama3/__init__.py``) of our presets.
_TORCHTITAN_FLAVOR = {"llama3.1-8b": ("llama3", "8B"), "llama3.1-70b": ("llama3", "70B"),
                      "llama3.1-405b": ("llama3", "405B")}


def precision_recipe(training: TrainingSpec) -> str:
    """The planned precision as a recipe name: plain ``fp8`` is FP8 with delayed scaling
    (Megatron-LM's ``--fp8-recipe`` default and Transformer Engine's default recipe), plain
    ``fp4`` is NVFP4; a recipe name (``fp8-cs`` ...) is kept."""
    p = training.precision_name
    return {"fp8": "fp8-delayed", "fp4": "nvfp4"}.get(p, p)


def _base_precision(recipe: str) -> str:
    """The TrainingSpec precision a recipe belongs to (for searching an alternative)."""
    if recipe.startswith("fp8") or recipe == "mxfp8":
        return "fp8"
    return "fp4" if recipe == "nvfp4" else recipe


def stage_layers(config: ParallelConfig, model: ModelSpec) -> list[int]:
    """Transformer layers of each of the ``pp*vp`` model chunks, in model order (chunk ``i``
    runs on pipeline rank ``i % pp``): the one layout the time and memory models use
    (:func:`perfmodel.parallel.layers.stage_layer_table`), from the configuration's
    ``first_stage_layers`` / ``last_stage_layers`` / ``embedding_as_layer`` / ``loss_as_layer``,
    or Megatron-LM's layout (:func:`perfmodel.parallel.layers.megatron_layout`) where it names none and
    ``pp*vp`` does not divide the layers; a per-stage layout (``stage_layers``, chosen by
    :mod:`search.strategies.dp`) splits each rank's layers evenly over its chunks.
    """
    L, pp, vp = model.num_layers, config.pp, config.vp
    if getattr(config, "stage_layers", None):  # a per-stage layout of search/dp.py
        return balanced_chunk_layers(config.stage_layers, vp)
    first, last, emb, loss = _layout_fields(config)
    if not (first or last or emb or loss) and L % (pp * vp):
        lay = megatron_layout(L, pp, vp, explicit=True)
        if not bool(lay["valid"][0]):
            raise SpecError(f"no Megatron-LM layout of {L} layers on pp={pp}, vp={vp}")
        if bool(lay["explicit"][0]):  # the balanced explicit layout, heavier chunks first

            return balanced_chunk_layers(balanced_stage_layers(L, pp, vp)[0, :pp], vp)
        first, last = int(lay["first"][0]), int(lay["last"][0])
        emb, loss = bool(lay["embedding_as_layer"][0]), bool(lay["loss_as_layer"][0])
    try:
        t = stage_layer_table(L, pp, vp, first, last, emb, loss)
    except ValueError as err:
        raise SpecError(str(err)) from None
    return [int(t[i % pp, i // pp]) for i in range(pp * vp)]


def _explicit_layout(config: ParallelConfig, model: ModelSpec) -> bool:
    """Whether the configuration runs the balanced explicit layout (it names no layout, and
    only ``--pipeline-model-parallel-layout`` splits its layers: :func:`megatron_layout`'s
    fifth option) or a per-stage one (``stage_layers``)."""

    if getattr(config, "stage_layers", None):
        return True
    L, pp, vp = model.num_layers, config.pp, config.vp
    if any(_layout_fields(config)) or L % (pp * vp) == 0:
        return False
    return bool(megatron_layout(L, pp, vp, explicit=True)["explicit"][0])


def _layout_fields(config: ParallelConfig) -> tuple[int, int, bool, bool]:
    """(first, last, embedding_as_layer, loss_as_layer) of a configuration (0 / False: unset)."""
    return (int(getattr(config, "first_stage_layers", None) or 0),
            int(getattr(config, "last_stage_layers", None) or 0),
            bool(getattr(config, "embedding_as_layer", False)),
            bool(getattr(config, "loss_as_layer", False)))


def _block_recompute(config: ParallelConfig) -> tuple[int | None, str]:
    """Megatron-LM's ``--recompute-method block --recompute-num-layers N`` of a per-stage
    recompute (``stage_recompute_layers``, :mod:`search.strategies.dp`): N layers of every chunk (the
    first N, ``transformer_block.py``), and a comment when the stages' counts are not one N for
    every stage (Megatron-LM has no per-stage count: the largest is written, which recomputes at
    least as much). ``(None, "")`` without one."""
    r = getattr(config, "stage_recompute_layers", None)
    if r is None or config.recompute != "full":
        return None, ""
    vp = config.vp
    n = max(k // vp for k in r)
    lay = config.stage_layers
    if all(k == min(n * vp, s) for k, s in zip(r, lay, strict=True)):
        return n, ""
    return n, (f"# per-stage recompute layers {list(r)} are not one count per chunk; "
               f"--recompute-num-layers {n} recomputes at least as many")


def _is_uneven(chunks: list[int]) -> bool:
    return len(set(chunks)) > 1


def _layout(chunks: list[int]) -> str:
    """Megatron-Core ``pipeline_model_parallel_layout`` of the chunks: stages split by ``|``,
    ``E`` the embedding, ``t*k`` k decoder layers, ``L`` the loss
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py``)."""
    stages = [f"t*{k}" if k else "" for k in chunks]
    stages[0] = ",".join(x for x in ("E", stages[0]) if x)
    stages[-1] = ",".join(x for x in (stages[-1], "L") if x)
    return "|".join(stages)


def _framework_for(fmt: str, framework: FrameworkSpec | str | None) -> FrameworkSpec:
    """The user's framework when it is of the format's stack, else the format's preset."""
    if framework is not None:
        fw = load_framework(framework)
        if fw.stack == FORMAT_STACK[fmt]:
            return fw
    return load_framework(FORMAT_FRAMEWORK[fmt])


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise SpecError(f"--emit {fmt!r}: expected one of {', '.join(FORMATS)}")


def refusals(fmt: str, config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
             framework: FrameworkSpec | str | None = None, recipe: str | None = None) -> list[str]:
    """Why ``fmt``'s framework cannot run this plan, one reason per item (empty: it can)."""
    _check_format(fmt)
    fw = _framework_for(fmt, framework)
    c, name = config, fw.name
    recipe = recipe or precision_recipe(training)
    why: list[str] = []
    if c.zero_stage not in fw.zero_stages:
        alt = {1: " (torchtitan shards with FSDP: ZeRO-2 or ZeRO-3)"}.get(c.zero_stage, "")
        why.append(f"{name} has no ZeRO-{c.zero_stage}: it runs ZeRO "
                   f"{'/'.join(map(str, fw.zero_stages))}{alt}")
    elif c.pp > 1 and c.zero_stage > fw.max_zero_stage_with_pp:
        why.append(f"{name} does not run ZeRO-{c.zero_stage} with pipeline parallelism (pp={c.pp}): "
                   f"at most ZeRO-{fw.max_zero_stage_with_pp} with pp > 1")
    if c.pp > 1 and c.schedule not in fw.schedules:
        why.append(f"{name} has no '{c.schedule}' pipeline schedule: it runs "
                   f"{', '.join(fw.schedules)}")
    if c.recompute not in fw.recompute:
        why.append(f"{name} has no '{c.recompute}' recompute: it runs {', '.join(fw.recompute)}")
    if c.sequence_parallel and fw.sequence_parallel == "off":
        why.append(f"{name} has no Megatron-style sequence parallelism (planned with tp={c.tp})")
    if c.tp > 1 and not c.sequence_parallel and fw.sequence_parallel == "required":
        why.append(f"{name} always runs tensor parallelism with sequence parallelism "
                   f"(planned tp={c.tp} without it)")
    if c.cp > 1 and not fw.context_parallel:
        why.append(_no_cp_reason(fw, c))
    try:
        chunks = stage_layers(c, model)
    except SpecError as e:
        why.append(str(e))
        chunks = []
    if chunks and _is_uneven(chunks) and not fw.uneven_pipeline:
        why.append(f"{name} splits layers evenly over pipeline stages (planned "
                   f"{chunks[0]}/{chunks[1]}/.../{chunks[-1]} layers)")
    elif (chunks and not getattr(c, "stage_layers", None) and _explicit_layout(c, model)
          and fw.stack == "megatron" and not explicit_layout_allowed(fw)):
        why.append(f"{name} has no --pipeline-model-parallel-layout (Megatron-Core >= 0.13) for "
                   f"the balanced layout of {model.num_layers} layers on pp {c.pp} x vp {c.vp}")
    if recipe not in fw.precisions:
        why.append(f"{name} has no {recipe} precision: it runs {', '.join(fw.precisions)}")
    if fw.stack == "torchtitan":
        why += _torchtitan_round_refusals(c, training)
    if fw.context_parallel and fmt in ("megatron", "bridge"):
        why += _hierarchy_refusal(c)
    # what the release adds or lacks ([capabilities]: etp rule, cp with MoE, uneven interleaving)
    why += capability_refusals(fw, model, {"tp": c.tp, "pp": c.pp, "vp": c.vp, "cp": c.cp,
                                           "ep": c.ep, "etp": c.expert_tp, "dp": c.dp,
                                           "cp_comm": c.cp_comm})
    return why


def hierarchical_sizes(c: ParallelConfig) -> list[int]:
    """Megatron's ``--hierarchical-context-parallel-sizes`` of an ``a2a+p2p`` plan: the all-to-
    all (inner) group first, the ring (outer) second (``ModelParallelConfig.
    hierarchical_context_parallel_sizes``; ``parallel_state.create_hierarchical_groups``)."""
    return [int(c.cp_a2a), c.cp // int(c.cp_a2a)]


def _hierarchy_refusal(c: ParallelConfig) -> list[str]:
    """An ``a2a+p2p`` plan needs its hierarchical sizes (``cp_a2a``) to be written."""
    if c.cp > 1 and c.cp_comm == "a2a+p2p" and c.cp_a2a is None:
        return [(f"cp_comm 'a2a+p2p' (cp {c.cp}) names no hierarchical sizes: give cp_a2a, or "
                 "plan it with a cluster, which places the all-to-all inside the NVLink domain")]
    return []


def _no_cp_reason(fw: FrameworkSpec, c: ParallelConfig) -> str:
    """One line: why a stack without context parallelism cannot run ``c``'s cp."""
    if fw.stack != "deepspeed":
        return f"{fw.name} has no context parallelism (planned cp={c.cp})"
    if c.cp_comm == "a2a":
        # deepspeed/sequence/layer.py DistributedAttention wraps the model's attention over a
        # sequence-parallel group the training script builds: no ds_config field sets it up
        return (f"{fw.name} runs Ulysses (planned cp={c.cp}, cp_comm a2a) only through "
                "DistributedAttention in the model code (deepspeed.sequence.layer), which a "
                "ds_config cannot switch on")
    if c.cp_comm != "p2p":
        return (f"{fw.name} has no {c.cp_comm} context parallelism (planned cp={c.cp}; "
                "DeepSpeed-Ulysses is all-to-all over heads, set up in the model code)")
    return (f"{fw.name} has no ring context parallelism (planned cp={c.cp}; DeepSpeed-Ulysses "
            "is all-to-all over heads, a different scheme)")


def _torchtitan_round_refusals(c: ParallelConfig, training: TrainingSpec) -> list[str]:
    """torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` and
    ``ScheduleInterleavedZeroBubble`` run the micro-batches in rounds of ``max(1, m // pp)``
    and raise unless ``m`` is a multiple of the number of rounds
    (``torch/distributed/pipelining/schedules.py``)."""
    if c.pp == 1 or c.schedule not in ("interleaved", "zb"):
        return []
    m = training.global_batch_size // (c.dp * c.micro_batch_size)
    rounds = max(1, m // c.pp)
    if m % rounds == 0:
        return []
    return [(f"torchtitan's {c.schedule} schedule runs micro-batches in rounds of "
             f"max(1, m // pp) = {rounds}: m = {m} is not a multiple of it (pp={c.pp})")]


# ------------------------------------------------------------------------------------------
# Megatron-LM
# ------------------------------------------------------------------------------------------
def megatron_args(config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
                  recipe: str | None = None) -> str:
    """Megatron-LM ``pretrain_gpt.py`` arguments for the plan, one per line."""
    recipe = recipe or precision_recipe(training)
    chunks = stage_layers(config, model)
    # the arguments in Megatron-LM's own grouping: architecture, parallelism and layout, data
    # parallelism and batch, recompute and memory, precision, then the MoE / MLA flags
    a = _megatron_model_args(model, training)
    a += _megatron_parallel_args(config, model, training, chunks)
    a += _megatron_data_parallel_args(config, training)
    block, block_note = _block_recompute(config)
    a += _megatron_recompute_args(config, training, block)
    a += _megatron_precision_args(recipe)
    a += megatron_moe_args(config, model, training)  # MoE / MLA flags (emit.moe)
    head = _megatron_head(config, model, training, chunks, block_note)
    return _join_lines(head + a)


def _megatron_model_args(m: ModelSpec, training: TrainingSpec) -> list[str]:
    """The architecture: shape, hybrid (Mamba) layers, attention, embeddings, norm, MLP."""
    a: list[str] = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
    ]
    if m.head_dim is not None:
        a.append(f"--kv-channels {m.head_dim}")
    if m.is_hybrid:  # pretrain_mamba.py (perfmodel.compute.mamba)
        a += [f"--hybrid-override-pattern {m.hybrid_override_pattern}",
              f"--mamba-state-dim {m.mamba_state_dim}", f"--mamba-head-dim {m.mamba_head_dim}",
              f"--mamba-num-groups {m.mamba_num_groups}", f"--mamba-num-heads {mamba_heads(m)}"]
    if m.kv_heads != m.num_attention_heads:
        a += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    a += [f"--seq-length {training.seq_len}",
          f"--max-position-embeddings {max(m.max_seq_len, training.seq_len)}"]
    if m.position_embedding == "rope":
        a += ["--position-embedding-type rope", f"--rotary-base {int(m.rope_base)}"]
    elif m.position_embedding == "none":
        a.append("--position-embedding-type none")
    else:
        a.append("--position-embedding-type learned_absolute")
    a.append("--normalization " + ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    if m.activation == "swiglu":
        a.append("--swiglu")
    elif m.activation == "relu2":
        a.append("--squared-relu")
    if not m.linear_bias:
        a.append("--disable-bias-linear")
        if m.qkv_bias:
            a.append("--add-qkv-bias")
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    a.append("--attention-backend " + ("flash" if training.flash_attention else "unfused"))
    return a


def _megatron_parallel_args(c: ParallelConfig, m: ModelSpec, training: TrainingSpec,
                            chunks: list[int]) -> list[str]:
    """Tensor, pipeline and context parallelism, sequence parallelism and the layout."""
    a = [f"--tensor-model-parallel-size {c.tp}",
         f"--pipeline-model-parallel-size {c.pp}",
         f"--context-parallel-size {c.cp}"]
    if c.cp > 1 and c.cp_comm != "p2p":  # Megatron-Core >= 0.10; p2p is the default
        a.append(f"--cp-comm-type {CP_COMM_TYPE[c.cp_comm]}")
        if c.cp_comm == "a2a+p2p":  # the a2a (inner) size first, the ring's second
            a.append("--hierarchical-context-parallel-sizes "
                     + " ".join(map(str, hierarchical_sizes(c))))
    if c.sequence_parallel:
        a.append("--sequence-parallel")
    # the layout as Megatron-LM names it (megatron/training/arguments.py): an even split, or
    # lighter first / last stages, or the embedding / loss counted as layers; with interleaving
    # the chunk count per rank (--num-virtual-stages-per-pipeline-rank) where the layout is uneven
    uneven = _is_uneven(chunks)
    first, last, emb, loss = _layout_fields(c)
    per_stage = _explicit_layout(c, m)
    if per_stage:  # any per-stage counts (search/dp.py, the balanced explicit layout): the
        # layout string, which sets vp too
        a.append(f"--pipeline-model-parallel-layout {_layout(chunks)}")
    elif uneven and not (first or last or emb or loss):  # Megatron-LM's default layout, named
        first, last = (chunks[0] if c.vp == 1 else 0), (chunks[-1] if c.vp == 1 else 0)
        if c.vp > 1:
            a.append(f"--pipeline-model-parallel-layout {_layout(chunks)}")
    if per_stage:
        pass
    elif c.vp > 1 and not uneven:
        a.append(f"--num-layers-per-virtual-pipeline-stage {chunks[0]}")
    elif c.vp > 1 and (first or last or emb or loss):
        a.append(f"--num-virtual-stages-per-pipeline-rank {c.vp}")
    if first:
        a.append(f"--decoder-first-pipeline-num-layers {first}")
    if last:
        a.append(f"--decoder-last-pipeline-num-layers {last}")
    if emb:
        a.append("--account-for-embedding-in-pipeline-split")
    if loss:
        a.append("--account-for-loss-in-pipeline-split")
    if c.pp > 1 and not training.overlap_p2p_comm:
        a.append("--no-overlap-p2p-communication")
    return a


def _megatron_data_parallel_args(c: ParallelConfig, training: TrainingSpec) -> list[str]:
    """Data parallelism (ZeRO-1 = distributed optimizer, ZeRO-2/3 = Megatron-FSDP), the
    overlaps of its and tensor parallelism's communication, and the batch."""
    a: list[str] = []
    if c.zero_stage == 1:
        a.append("--use-distributed-optimizer")
    elif c.zero_stage >= 2:
        strategy = "optim_grads" if c.zero_stage == 2 else "optim_grads_params"
        a += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
              "--ckpt-format fsdp_dtensor"]
    if training.overlap_grad_reduce and c.dp > 1:
        a.append("--overlap-grad-reduce")
        if c.zero_stage >= 1:
            a.append("--overlap-param-gather")
    if training.overlap_tp_comm and c.tp > 1 and c.sequence_parallel:
        a.append("--tp-comm-overlap")
    if "optimizer" in training.offload:  # HybridDeviceOptimizer (megatron/core/optimizer)
        a += ["--optimizer-cpu-offload",
              f"--optimizer-offload-fraction {training.optimizer_offload_fraction:g}"]
    a += [f"--micro-batch-size {c.micro_batch_size}",
          f"--global-batch-size {training.global_batch_size}"]
    return a


def _megatron_recompute_args(c: ParallelConfig, training: TrainingSpec,
                             block: int | None) -> list[str]:
    """Recompute (block: the first ``block`` layers of every chunk), the fused loss, CPU
    activation offloading and the weight-gradient accumulation fusion."""
    a: list[str] = []
    if block is not None:  # the first N layers of every chunk (search/dp.py layouts)
        a += ["--recompute-granularity full", "--recompute-method block",
              f"--recompute-num-layers {block}"]
    elif c.recompute == "full":
        a += ["--recompute-granularity full", "--recompute-method uniform",
              "--recompute-num-layers 1"]
    elif c.recompute == "selective":
        mods = " ".join(getattr(training, "recompute_modules", ("core_attn",)))
        a += ["--recompute-granularity selective", f"--recompute-modules {mods}"]
    if getattr(training, "cross_entropy", "fp32") == "fused":  # TE's in-place loss kernel
        a += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl te"]
    n_off = getattr(training, "cpu_offload_layers", 0)
    if n_off:  # Megatron-Core CPU activation offloading (TE cpu_offload context per layer)
        a += ["--cpu-offloading", f"--cpu-offloading-num-layers {n_off}"]
    if not getattr(training, "fsdp_gradient_accumulation_fusion", True) and c.zero_stage >= 3:
        a.append("--no-gradient-accumulation-fusion")  # wgrad added to main_grad by the hook
    return a


def _megatron_precision_args(recipe: str) -> list[str]:
    """The 16-bit dtype and the FP8 / FP4 recipe."""
    a: list[str] = []
    if recipe == "fp16":
        a.append("--fp16")
    elif recipe != "fp32":
        a.append("--bf16")
    if recipe in _MEGATRON_FP8:
        fmt, rec = _MEGATRON_FP8[recipe]
        a += [f"--fp8-format {fmt}", f"--fp8-recipe {rec}"]
    elif recipe == "nvfp4":
        a += ["--fp4-format e2m1", "--fp4-recipe nvfp4"]
    return a


def _megatron_head(c: ParallelConfig, m: ModelSpec, training: TrainingSpec, chunks: list[int],
                   block_note: str) -> list[str]:
    """The comment lines above the arguments: how to launch them, and what they plan."""
    m_count = training.global_batch_size // (c.dp * c.micro_batch_size)
    script = "pretrain_mamba.py" if m.is_hybrid else "pretrain_gpt.py"
    head = [
        f"# Megatron-LM (Megatron-Core 0.16) arguments for {script}; '#' lines are comments:",
        f"#   torchrun ... {script} $(grep -v '^#' megatron.args) --data-path ... ",
        (f"# launch on dp*tp*pp*cp = {c.dp}*{c.tp}*{c.pp}*{c.cp} = {c.gpus} GPUs: Megatron "
         f"derives data parallel {c.dp} from the world size;"),
        (f"# {m_count} micro-batches of {c.micro_batch_size} per step (gradient accumulation), "
         f"schedule {'interleaved 1F1B' if c.vp > 1 else '1F1B'}"),
    ]
    if _is_uneven(chunks) or getattr(c, "stage_layers", None):
        head.append(f"# layers per pipeline chunk: {'/'.join(map(str, chunks))}")
    if block_note:
        head.append(block_note)
    return head


# ------------------------------------------------------------------------------------------
# Megatron-Bridge
# ------------------------------------------------------------------------------------------
def _bridge_sections(config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
                     recipe: str) -> dict[str, Any]:
    c, m = config, model
    chunks = stage_layers(c, m)
    # the model section: architecture, parallelism, the layout's split, recompute, p2p overlap
    mdl = _bridge_model_fields(c, m, training)
    mdl.update(_bridge_layout_fields(c, m, chunks))
    mdl.update(_bridge_recompute_fields(c, training))
    if c.pp > 1:
        mdl["overlap_p2p_comm"] = bool(training.overlap_p2p_comm)
    ddp = _bridge_ddp(c, training)
    mdl.update(megatron_bridge_moe_fields(c, m, training))  # MoE part (emit.moe)
    # the other sections: batch, data parallelism (Megatron-FSDP for ZeRO-2/3), TP overlap,
    # precision
    out: dict[str, Any] = {
        "model": mdl,
        "train": {"micro_batch_size": c.micro_batch_size,
                  "global_batch_size": training.global_batch_size},
        "dataset": {"sequence_length": training.seq_len},
        "ddp": ddp,
        "optimizer": {"use_distributed_optimizer": c.zero_stage == 1,
                      **_bridge_optimizer(training)},
    }
    if c.zero_stage >= 2:
        out["dist"] = {"use_megatron_fsdp": True}
        out["checkpoint"] = {"ckpt_format": "fsdp_dtensor"}
    if c.tp > 1 and c.sequence_parallel:
        out["comm_overlap"] = {"tp_comm_overlap": bool(training.overlap_tp_comm)}
    out["mixed_precision"] = _BRIDGE_PRECISION.get(recipe)  # None: fp32
    return out


def _bridge_model_fields(c: ParallelConfig, m: ModelSpec,
                         training: TrainingSpec) -> dict[str, Any]:
    """The model section's architecture (hybrid Mamba fields included) and parallel sizes."""
    mdl: dict[str, Any] = {
        "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.kv_heads,
    }
    if m.is_hybrid:  # MambaModelProvider fields (perfmodel.compute.mamba)
        mdl.update({"hybrid_override_pattern": m.hybrid_override_pattern,
                    "mamba_state_dim": m.mamba_state_dim, "mamba_head_dim": m.mamba_head_dim,
                    "mamba_num_groups": m.mamba_num_groups, "mamba_num_heads": mamba_heads(m)})
    if m.head_dim is not None:
        mdl["kv_channels"] = m.head_dim
    mdl.update({
        "seq_length": training.seq_len,
        "position_embedding_type": ("learned_absolute" if m.position_embedding == "learned"
                                    else m.position_embedding),
    })
    if m.position_embedding == "rope":
        mdl["rotary_base"] = float(m.rope_base)
    mdl.update({
        "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
        "gated_linear_unit": m.activation == "swiglu",
        "add_bias_linear": m.linear_bias,
        "add_qkv_bias": m.linear_bias or m.qkv_bias,
        "share_embeddings_and_output_weights": m.tied_embeddings,
        "attention_backend": "flash" if training.flash_attention else "unfused",
        "tensor_model_parallel_size": c.tp,
        "pipeline_model_parallel_size": c.pp,
        "virtual_pipeline_model_parallel_size": c.vp if c.vp > 1 else None,
        "context_parallel_size": c.cp,
        "sequence_parallel": c.sequence_parallel,
    })
    if c.cp > 1 and c.cp_comm != "p2p":  # TransformerConfig.cp_comm_type (left out: p2p)
        mdl["cp_comm_type"] = CP_COMM_TYPE[c.cp_comm]
        if c.cp_comm == "a2a+p2p":  # ModelParallelConfig.hierarchical_context_parallel_sizes
            mdl["hierarchical_context_parallel_sizes"] = hierarchical_sizes(c)
    return mdl


def _bridge_layout_fields(c: ParallelConfig, m: ModelSpec, chunks: list[int]) -> dict[str, Any]:
    """The model section's pipeline split, in one of Megatron-Core's exclusive forms
    (``TransformerConfig.__post_init__``: a layout "cannot be set with other pipeline layout
    arguments", first / last counts not with the embedding / loss accounting): a layout string
    (which implies vp), or the split the plan names (lighter first / last stages, or the
    embedding / loss counted as layers, vp kept), or Megatron-LM's default uneven split."""
    first, last, emb, loss = _layout_fields(c)
    if _explicit_layout(c, m) or (_is_uneven(chunks) and c.vp > 1
                                  and not (first or last or emb or loss)):
        # per-stage counts (search/dp.py, balanced), or an unnamed interleaved uneven split
        return {"virtual_pipeline_model_parallel_size": None,  # implied by the layout
                "pipeline_model_parallel_layout": _layout(chunks)}
    out: dict[str, Any] = {}
    if not (first or last or emb or loss) and _is_uneven(chunks):  # vp == 1
        first, last = chunks[0], chunks[-1]
    if first:
        out["num_layers_in_first_pipeline_stage"] = first
    if last:
        out["num_layers_in_last_pipeline_stage"] = last
    if emb:
        out["account_for_embedding_in_pipeline_split"] = True
    if loss:
        out["account_for_loss_in_pipeline_split"] = True
    return out


def _bridge_recompute_fields(c: ParallelConfig, training: TrainingSpec) -> dict[str, Any]:
    """The model section's recompute (block: the first N layers of every chunk)."""
    block, _ = _block_recompute(c)
    if block is not None:
        return {"recompute_granularity": "full", "recompute_method": "block",
                "recompute_num_layers": block}
    if c.recompute == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform",
                "recompute_num_layers": 1}
    if c.recompute == "selective":
        return {"recompute_granularity": "selective",
                "recompute_modules": list(getattr(training, "recompute_modules",
                                                  ("core_attn",)))}
    return {"recompute_granularity": None}


def _bridge_ddp(c: ParallelConfig, training: TrainingSpec) -> dict[str, Any]:
    """The ``ddp`` section: distributed optimizer (ZeRO-1) or Megatron-FSDP (ZeRO-2/3), and
    the overlaps of gradient reduction and parameter gathering."""
    ddp: dict[str, Any] = {"use_distributed_optimizer": c.zero_stage == 1,
                           "overlap_grad_reduce": bool(training.overlap_grad_reduce and c.dp > 1),
                           "overlap_param_gather": bool(training.overlap_grad_reduce
                                                        and c.dp > 1 and c.zero_stage >= 1)}
    if c.zero_stage >= 2:
        ddp.update(use_megatron_fsdp=True, data_parallel_sharding_strategy=(
            "optim_grads" if c.zero_stage == 2 else "optim_grads_params"))
    return ddp


def _bridge_optimizer(training: TrainingSpec) -> dict[str, Any]:
    """The ``optimizer`` section's CPU offload (Megatron-Core OptimizerConfig
    ``optimizer_cpu_offload``, ``optimizer_offload_fraction``); empty without it."""
    if "optimizer" not in training.offload:
        return {}
    return {"optimizer_cpu_offload": True,
            "optimizer_offload_fraction": training.optimizer_offload_fraction}


def _join_lines(lines: list[str]) -> str:
    """The file's text, one entry per line: a control character inside an entry (a newline in
    a name that reached a ``#`` comment) is escaped, so it cannot start a line of its own."""
    return "".join(shown(line, limit=len(line) * 10 + 10) + "\n" for line in lines)


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v))  # a double-quoted YAML string


def bridge_yaml(config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
                recipe: str | None = None) -> str:
    """A Megatron-Bridge ``ConfigContainer`` override (YAML) for the plan."""
    c = config
    recipe = recipe or precision_recipe(training)
    sections = _bridge_sections(c, model, training, recipe)
    m_count = training.global_batch_size // (c.dp * c.micro_batch_size)
    lines = [
        "# Megatron-Bridge ConfigContainer override: the recipe's example script reads it with",
        "#   torchrun ... pretrain_<recipe>.py --config-file bridge.yaml",
        (f"# launch on dp*tp*pp*cp = {c.dp}*{c.tp}*{c.pp}*{c.cp} = {c.gpus} GPUs (data "
         f"parallel {c.dp} follows from the world size); {m_count} micro-batches per step"),
        (f"# activation {_BRIDGE_ACT[model.activation]}: a callable, set by the recipe's model "
         "provider (Bridge's YAML overrides leave callables alone)"),
    ]
    for sec, body in sections.items():
        if isinstance(body, dict):
            lines.append(f"{sec}:")
            lines += [f"  {k}: {_yaml_scalar(v)}" for k, v in body.items()]
        else:
            lines.append(f"{sec}: {_yaml_scalar(body)}")
    return _join_lines(lines)


# ------------------------------------------------------------------------------------------
# torchtitan
# ------------------------------------------------------------------------------------------
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def _torchtitan_fqns(chunks: list[int]) -> list[list[str]]:
    """``parallelism.module_fqns_per_model_part``: the module names of each model chunk of
    torchtitan's decoder models (``tok_embeddings``, ``layers.<i>``, ``norm``, ``output``)."""
    parts, start = [], 0
    for i, k in enumerate(chunks):
        part = [f"layers.{j}" for j in range(start, start + k)]
        start += k
        if i == 0:
            part.insert(0, "tok_embeddings")
        if i == len(chunks) - 1:
            part += ["norm", "output"]
        parts.append(part)
    return parts


def torchtitan_toml(config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
                    recipe: str | None = None) -> str:
    """A torchtitan TOML job config for the plan. ZeRO-3 is FSDP resharding after forward,
    ZeRO-2 FSDP without resharding, ZeRO-0 DDP replication; the stage split is written out
    (``module_fqns_per_model_part``) so that torchtitan's default split does not replace it."""
    c, m = config, model
    recipe = recipe or precision_recipe(training)
    chunks = stage_layers(c, m)
    if c.zero_stage >= 2:
        replicate, shard = 1, c.dp
        if c.zero_stage == 3 and training.hsdp_shard:  # HSDP (perfmodel.comm.hsdp)
            shard = math.gcd(c.dp, training.hsdp_shard)
            replicate = c.dp // shard
        reshard = "always" if c.zero_stage == 3 else "never"
    else:
        replicate, shard, reshard = c.dp, 1, "default"
    # zb is ZB-H1 with one model chunk per rank: torch.distributed.pipelining's
    # ScheduleInterleavedZeroBubble (ZB1P, looped stages, any count per rank); ZBVZeroBubble
    # and DualPipeV are V schedules that pipeline_module_split builds only with 2 chunks a rank
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                "zb": "InterleavedZeroBubble"}[c.schedule]
    local_batch = training.global_batch_size // c.dp
    name, flavor = _TORCHTITAN_FLAVOR.get(m.name, ("llama3", m.name))
    sec: dict[str, dict[str, Any]] = {
        "model": {"name": name, "flavor": flavor},
        "training": {"local_batch_size": local_batch,
                     "global_batch_size": training.global_batch_size,
                     "seq_len": training.seq_len,
                     "mixed_precision_param": "float32" if recipe == "fp32" else "bfloat16"},
        "parallelism": {
            "data_parallel_replicate_degree": replicate,
            "data_parallel_shard_degree": shard,
            "fsdp_reshard_after_forward": reshard,
            "tensor_parallel_degree": c.tp,
            "disable_loss_parallel": False,
            "enable_async_tensor_parallel": bool(training.overlap_tp_comm and c.tp > 1),
            "pipeline_parallel_degree": c.pp,
            "pipeline_parallel_schedule": schedule,
            "pipeline_parallel_microbatch_size": c.micro_batch_size,
            "context_parallel_degree": c.cp,
        },
        "activation_checkpoint": {"mode": c.recompute},
    }
    if c.recompute == "selective":
        # op-level selective recompute (matmul outputs saved, the rest recomputed); the default
        # option "2" would recompute every second layer in full instead
        sec["activation_checkpoint"]["selective_ac_option"] = "op"
    sec["parallelism"].update(torchtitan_moe_fields(c, m))  # expert parallel (emit.moe)
    if c.pp > 1:
        sec["parallelism"]["module_fqns_per_model_part"] = _torchtitan_fqns(chunks)
    if recipe == "fp8-cs":
        sec["model"]["converters"] = ["quantize.linear.float8"]
        sec["quantize.linear.float8"] = {"recipe_name": "tensorwise"}
    elif recipe == "mxfp8":
        sec["model"]["converters"] = ["quantize.linear.mx"]
        sec["quantize.linear.mx"] = {"recipe_name": "mxfp8_cublas"}
    arch = (f"dim={m.hidden_size} n_layers={m.num_layers} n_heads={m.num_attention_heads} "
            f"n_kv_heads={m.kv_heads} ffn_hidden={m.ffn_hidden_size} vocab_size={m.vocab_size} "
            f"rope_theta={m.rope_base:g}")
    m_count = training.global_batch_size // (c.dp * c.micro_batch_size)
    head = [
        "# torchtitan job config: torchrun ... -m torchtitan.train --job.config_file torchtitan.toml",
        (f"# launch on dp*tp*pp*cp = {c.dp}*{c.tp}*{c.pp}*{c.cp} = {c.gpus} GPUs; {m_count} "
         f"micro-batches of {c.micro_batch_size} per step"),
    ]
    if m.name not in _TORCHTITAN_FLAVOR:
        head.append(f"# flavor '{flavor}' is not shipped with torchtitan: register it in "
                    f"torchtitan/models/{name} with {arch}")
    if not (m.position_embedding == "rope" and m.norm == "rmsnorm"
            and m.activation == "swiglu" and not m.linear_bias and not m.tied_embeddings):
        head.append(f"# torchtitan's {name} is RoPE + RMSNorm + SwiGLU without biases, untied: "
                    f"this model ({m.position_embedding}, {m.norm}, {m.activation}, bias "
                    f"{m.linear_bias}, tied {m.tied_embeddings}) needs a model definition of "
                    "your own (a TrainSpec)")
    lines = head
    for name_, body in sec.items():
        lines.append("")
        lines.append(f"[{name_}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return _join_lines(lines)


# ------------------------------------------------------------------------------------------
# DeepSpeed
# ------------------------------------------------------------------------------------------
def deepspeed_json(config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
                   recipe: str | None = None) -> str:
    """A DeepSpeed JSON config for the plan (ZeRO stage, batch and accumulation, precision,
    AutoTP degree, pipeline stages and activation checkpointing)."""
    c = config
    recipe = recipe or precision_recipe(training)
    chunks = stage_layers(c, model)
    accum = training.global_batch_size // (c.dp * c.micro_batch_size)
    zero: dict[str, Any] = {"stage": c.zero_stage,
                            "overlap_comm": bool(training.overlap_grad_reduce)}
    if c.zero_stage >= 2:
        zero["contiguous_gradients"] = True
    zero.update(_deepspeed_offload(c, training))
    cfg: dict[str, Any] = {
        "train_batch_size": training.global_batch_size,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "zero_optimization": zero,
        "bf16": {"enabled": recipe == "bf16"},
        "fp16": {"enabled": recipe == "fp16"},
    }
    if c.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": c.tp}
    if c.pp > 1:
        # PipelineModule(num_stages=pp, partition_method=...) builds the stages in code; this
        # section is what the pipeline engine reads from the config
        cfg["pipeline"] = {"stages": c.pp,
                           "partition": "parameters" if _is_uneven(chunks) else "uniform",
                           "activation_checkpoint_interval": 1 if c.recompute == "full" else 0}
    if c.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": c.tp > 1,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    notes = [f"launch on dp*tp*pp = {c.dp}*{c.tp}*{c.pp} = {c.gpus} GPUs"]
    if c.pp > 1:
        notes.append(f"build deepspeed.pipe.PipelineModule(layers, num_stages={c.pp}, "
                     f"partition_method='{cfg['pipeline']['partition']}')"
                     + (f" for layers {'/'.join(map(str, chunks))} per stage"
                        if _is_uneven(chunks) else ""))
    if c.recompute == "full":
        notes.append("wrap each layer in deepspeed.checkpointing.checkpoint")
    cfg["_comment"] = "; ".join(notes)
    return json.dumps(cfg, indent=2) + "\n"


def _deepspeed_offload(c: ParallelConfig, training: TrainingSpec) -> dict[str, Any]:
    """``zero_optimization.offload_optimizer`` / ``offload_param`` to pinned host memory
    (DeepSpeed ``runtime/zero/offload_config.py``; ``offload_param`` needs stage 3)."""
    out: dict[str, Any] = {}
    if "optimizer" in training.offload and c.zero_stage >= 1:
        out["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if "params" in training.offload and c.zero_stage == 3:
        out["offload_param"] = {"device": "cpu", "pin_memory": True}
    return out


_EMITTERS: dict[str, Callable[..., str]] = {
    "megatron": megatron_args, "bridge": bridge_yaml, "torchtitan": torchtitan_toml,
    "deepspeed": deepspeed_json,
}


def emit(fmt: str, config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
         framework: FrameworkSpec | str | None = None, recipe: str | None = None) -> str:
    """Launch settings in ``fmt``; raises :class:`SpecError` (one line naming the reasons) when
    that framework cannot run the plan."""
    why = refusals(fmt, config, model, training, framework, recipe)
    if why:
        raise SpecError(f"{_framework_for(fmt, framework).name} cannot run this plan: "
                        + "; ".join(why))
    return _EMITTERS[fmt](config, model, training, recipe)


@dataclass
class Launch:
    """One format's launch settings: ``text`` (what ``--emit`` prints) or ``refused`` (one line)
    with ``alternative`` (the nearest configuration that framework runs, with its settings)."""

    format: str
    framework: str
    file: str
    text: str | None = None
    refused: str | None = None
    alternative: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "framework": self.framework, "file": self.file,
                "text": self.text, "refused": self.refused, "alternative": self.alternative}

    def message(self) -> str:
        """One line for a refused format: the reason and the alternative."""
        if self.refused is None:
            return ""
        msg = self.refused
        alt = self.alternative
        if alt and alt.get("config"):
            c = alt["config"]
            msg += (f"; nearest that {self.framework} runs: dp={c['dp']} tp={c['tp']} "
                    f"pp={c['pp']} vp={c['vp']} cp={c['cp']} zero={c['zero_stage']} "
                    f"mbs={c['micro_batch_size']} recompute={c['recompute']} "
                    f"sp={'on' if c['sequence_parallel'] else 'off'} schedule={c['schedule']}"
                    f"{' ' + alt['precision'] if alt.get('precision_changed') else ''}, step "
                    f"{alt['step_time_s']:.3g} s"
                    + (f" vs {alt['planned_step_time_s']:.3g} s planned"
                       if alt.get("planned_step_time_s") is not None else "")
                    + f" (plan ... --framework {self.framework} --emit {self.format})")
        elif alt and alt.get("error"):
            msg += f"; and the search finds nothing {self.framework} runs: {alt['error']}"
        return msg


def _nearest_recipe(recipe: str, fw: FrameworkSpec) -> str:
    if recipe in fw.precisions:
        return recipe
    for r in _NEAREST_RECIPE.get(recipe, ()):
        if r in fw.precisions:
            return r
    return fw.precisions[0]


def launch_settings(
    config: ParallelConfig, model: ModelSpec, training: TrainingSpec,
    formats: tuple[str, ...] | list[str] = FORMATS, *,
    framework: FrameworkSpec | str | None = None,
    replan: Callable[[str, str], Any] | None = None,
    planned_step_time_s: float | None = None,
) -> dict[str, Launch]:
    """:class:`Launch` per format. ``replan(framework_name, precision)`` returns the
    ``SearchResult`` of the same problem restricted to that framework (``search.plan(...,
    framework=...)``); without it, refused formats carry no alternative."""
    out: dict[str, Launch] = {}
    for fmt in formats:
        _check_format(fmt)
        fw = _framework_for(fmt, framework)
        L = Launch(format=fmt, framework=fw.name, file=FILE_NAMES[fmt])
        why = refusals(fmt, config, model, training, fw)
        if not why:
            L.text = _EMITTERS[fmt](config, model, training)
        else:
            L.refused = f"{fw.name} cannot run this plan: " + "; ".join(why)
            if replan is not None:
                L.alternative = _alternative(fmt, fw, model, training, replan,
                                             planned_step_time_s)
        out[fmt] = L
    return out


def _alternative(fmt: str, fw: FrameworkSpec, model: ModelSpec, training: TrainingSpec,
                 replan: Callable[[str, str], Any], planned_step_time_s: float | None,
                 ) -> dict[str, Any]:
    recipe = _nearest_recipe(precision_recipe(training), fw)
    precision = _base_precision(recipe)
    try:
        # the recipe name, not the bare dtype: plain "fp8" means delayed scaling, which a
        # framework that runs only current scaling (torchtitan) refuses
        r = replan(fw.name, recipe)
    except SpecError as e:
        return {"framework": fw.name, "error": str(e)}
    if not r.fits_any:
        return {"framework": fw.name, "error": r.why_nothing_fits()}
    row = r.best_row
    cfg = ParallelConfig(**row["config"])
    alt_training = training.model_copy(update={
        "precision": precision, "low_precision_recipe": recipe if recipe != precision else None})
    alt: dict[str, Any] = {
        "framework": fw.name, "config": row["config"], "step_time_s": row["step_time_s"],
        "planned_step_time_s": planned_step_time_s,
        "precision": recipe, "precision_changed": recipe != precision_recipe(training),
        "mfu": row["mfu"], "text": None,
    }
    why = refusals(fmt, cfg, model, alt_training, fw, recipe)
    if why:
        alt["refused"] = "; ".join(why)
    else:
        alt["text"] = _EMITTERS[fmt](cfg, model, alt_training, recipe)
    return alt


def training_from_setup(setup: dict[str, Any]) -> TrainingSpec:
    """The TrainingSpec a :class:`~search.result.SearchResult` was planned with."""
    fields = TrainingSpec.model_fields
    kw = {k: v for k, v in setup.items() if k in fields}
    kw.update({k: v for k, v in (setup.get("training_switches") or {}).items() if k in fields})
    return TrainingSpec(**kw)


def launch_from_result(result: Any, model: ModelSpec | str, formats: tuple[str, ...] |
                       list[str] = FORMATS, *, framework: FrameworkSpec | str | None = None,
                       replan: Callable[[str, str], Any] | None = None) -> dict[str, Launch]:
    """:func:`launch_settings` of a search result's best configuration.

    >>> from search import plan                                    # doctest: +SKIP
    >>> r = plan("llama3.1-8b", "dgx-h100", gpus=64, global_batch_size=256)  # doctest: +SKIP
    >>> print(launch_from_result(r, "llama3.1-8b")["torchtitan"].text)       # doctest: +SKIP
    """

    if not result.fits_any:
        raise SpecError(result.why_nothing_fits())
    row = result.best_row
    config = ParallelConfig(**row["config"])
    return launch_settings(config, load_model(model), training_from_setup(result.setup),
                           formats, framework=framework or result.setup.get("framework"),
                           replan=replan, planned_step_time_s=row["step_time_s"])


def check_emit_dir(folder: str | Path, inputs: list[Any]) -> None:
    """:class:`SpecError` when ``--emit-dir`` is empty or a file it would write (or remove) is
    one of the command's ``inputs`` (``--model D/torchtitan.toml --emit-dir D``)."""
    refuse_input_as_output(folder, [], "--emit-dir")
    for name in FILE_NAMES.values():
        refuse_input_as_output(Path(folder) / name, inputs, "--emit-dir")


def write_emit_dir(folder: str | Path, launches: dict[str, Launch], inputs: list[Any]) -> None:
    """Write each format's file that this plan has into ``folder`` (atomically: temporary file
    and rename), and remove the files of the formats it has none for, which an earlier plan
    may have left (a folder never mixes two plans' files)."""
    check_emit_dir(folder, inputs)
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    for fmt, name in FILE_NAMES.items():
        launch = launches.get(fmt)
        if launch is not None and launch.text is not None:
            atomic_write(d / name, launch.text)
        else:
            (d / name).unlink(missing_ok=True)


#: ``search.plan`` arguments that name files the command reads.
_PLAN_INPUT_KEYS = ("model", "cluster", "training", "framework", "profile", "calibration")


def plan_inputs(plan_kwargs: dict[str, Any]) -> list[Any]:
    """The files (or folders) a plan reads: its path arguments, and the shipped file of each
    preset it names."""
    out: list[Any] = []
    for key in _PLAN_INPUT_KEYS:
        v = plan_kwargs.get(key)
        preset = find_preset(key, v) if key in KINDS and isinstance(v, str) and v else None
        out.append(preset or v)
    return out


def check_outputs(inputs: list[Any], *, csv: str | Path | None = None,
                  emit_dir: str | Path | None = None) -> None:
    """Before the search: :class:`SpecError` when ``--csv`` or a file ``--emit-dir`` would
    write is one of the ``inputs`` (``--csv m.toml`` replaced the model file), or is empty."""
    if csv is not None:
        refuse_input_as_output(csv, inputs, "--csv")
    if emit_dir is not None:
        check_emit_dir(emit_dir, inputs)
