"""Launch settings for the mixture-of-experts part of a configuration (kept apart from
:mod:`emit.launch`, which calls these when the model is MoE or uses MLA).

* Megatron-LM (names from ``megatron/training/arguments.py``, ``_add_moe_args`` and
  ``_add_mla_args``): ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  ``--moe-shared-expert-intermediate-size``, ``--moe-layer-freq`` (a Python list expression for
  dense leading layers), ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``,
  ``--moe-token-dispatcher-type``, ``--moe-grouped-gemm``, ``--moe-router-dtype``,
  ``--moe-expert-capacity-factor`` / ``--moe-pad-expert-input-to-capacity`` (token dropping),
  ``--overlap-moe-expert-parallel-comm``; MLA ``--multi-latent-attention``, ``--q-lora-rank``,
  ``--kv-lora-rank``, ``--qk-head-dim``, ``--qk-pos-emb-head-dim``, ``--v-head-dim``.
* Megatron-Bridge / NeMo 2 (``GPTModelProvider`` / ``TransformerConfig`` fields, as
  ``model.<field>=<value>`` overrides): ``num_moe_experts``, ``moe_router_topk``,
  ``expert_model_parallel_size``, ``expert_tensor_parallel_size``, ``moe_token_dispatcher_type``,
  ``moe_grouped_gemm``.
* torchtitan (``[parallelism]`` of ``torchtitan/config/job_config.py``):
  ``expert_parallel_degree``, ``expert_tensor_parallel_degree``.
"""

from __future__ import annotations

from perfmodel.compute.layer import full_iteration_graphed
from perfmodel.moe.experts import a2a_overlap_applies
from perfmodel.parallel.config import ConfigBatch, ParallelConfig
from perfmodel.spec.specs import ModelSpec, TrainingSpec

__all__ = ["megatron_bridge_moe_fields", "megatron_bridge_moe_overrides", "megatron_moe_args",
           "torchtitan_moe_fields", "torchtitan_moe_lines"]


def _layer_freq(model: ModelSpec) -> str:
    """``--moe-layer-freq``: ``1`` when every layer is MoE, else the per-layer 0/1 pattern as
    the Python list expression Megatron-LM's ``moe_freq_type`` evaluates (Megatron's integer
    form puts MoE at layers 0, k, 2k, ..., Llama 4 at k-1, 2k-1, ...). Layer ``i`` is MoE when
    ``i >= d`` and ``(i - d + 1) % k == 0``.

    The expression is one shell word that bash passes through unchanged when the args file is
    word-split by ``$(grep -v '^#' megatron.args)``: no quotes (a command substitution keeps
    them, and ``_eval_pattern`` allows only ``,0-9[]()+*``), no spaces, and a leading ``(`` so
    that pathname expansion matches no ordinary file name (a bare ``[0,1]`` would match a file
    called ``0`` or ``1``)."""
    d, k = model.moe_dense_layers, model.moe_layer_freq
    pattern = [0] * d + [1 if (i + 1) % k == 0 else 0 for i in range(model.num_layers - d)]
    if all(pattern):
        return "1"
    n, rest = divmod(model.num_layers - d, k)
    block = "[1]" if k == 1 else f"([0]*{k - 1}+[1])"
    terms = [f"[0]*{d}" if d else "", f"{block}*{n}" if n else "", f"[0]*{rest}" if rest else ""]
    return "(" + "+".join(t for t in terms if t) + ")"


def _etp_flag(config: ParallelConfig, training: TrainingSpec) -> list[str]:
    """``--expert-tensor-parallel-size``: only where the release has MoE parallel folding
    (Megatron-Core 0.10 added it; 0.8 / 0.9 split the experts by tp and have no such flag, 0.10
    deprecates their ``--moe-extended-tp``: "Deprecated. Use --expert-tensor-parallel-size
    instead"); ``training.moe_parallel_folding``."""
    if not training.moe_parallel_folding:
        return []
    return [f"--expert-tensor-parallel-size {config.expert_tp}"]


def megatron_moe_args(config: ParallelConfig, model: ModelSpec, training: TrainingSpec
                      ) -> list[str]:
    """Megatron-LM flags for the MoE and MLA parts ([] for a dense, non-MLA model)."""
    args: list[str] = []
    if model.is_mla:
        args += ["--multi-latent-attention", f"--kv-lora-rank {model.kv_lora_rank}",
                 f"--qk-head-dim {model.head_size}",
                 f"--qk-pos-emb-head-dim {model.qk_rope_head_dim}",
                 f"--v-head-dim {model.v_head_size}"]
        if model.q_lora_rank:
            args.append(f"--q-lora-rank {model.q_lora_rank}")
    if not model.is_moe:
        return args
    c = config
    args += [
        f"--num-experts {model.num_experts}",
        f"--moe-router-topk {model.moe_top_k}",
        f"--moe-ffn-hidden-size {model.expert_ffn_size}",
        f"--moe-layer-freq {_layer_freq(model)}",
        f"--expert-model-parallel-size {c.ep}",
        *_etp_flag(c, training),
        f"--moe-token-dispatcher-type {training.moe_token_dispatcher}",
        "--moe-grouped-gemm",
        f"--moe-router-dtype {model.moe_router_dtype}",
    ]
    args += _dispatch_switch_args(training, model)
    if model.shared_ffn_size:
        args.append(f"--moe-shared-expert-intermediate-size {model.shared_ffn_size}")
    if model.moe_capacity_factor is not None:
        args.append(f"--moe-expert-capacity-factor {model.moe_capacity_factor}")
        if training.moe_pad_expert_input_to_capacity:
            args.append("--moe-pad-expert-input-to-capacity")
    if _a2a_overlap_runs(training, c):
        args.append("--overlap-moe-expert-parallel-comm")
    return args


def megatron_bridge_moe_fields(config: ParallelConfig, model: ModelSpec,
                               training: TrainingSpec) -> dict[str, object]:
    """Megatron-Bridge ``model`` (``GPTModelProvider``) fields of the MoE part ({} when dense)."""
    if not model.is_moe:
        return {}
    c = config
    out: dict[str, object] = {
        "num_moe_experts": model.num_experts, "moe_router_topk": model.moe_top_k,
        "moe_ffn_hidden_size": model.expert_ffn_size,
        "expert_model_parallel_size": c.ep, "expert_tensor_parallel_size": c.expert_tp,
        "moe_token_dispatcher_type": training.moe_token_dispatcher, "moe_grouped_gemm": True,
        "moe_router_fusion": training.moe_router_fusion,
    }
    if not training.moe_parallel_folding:  # no such field before Megatron-Core 0.10 (_etp_flag)
        del out["expert_tensor_parallel_size"]
    if training.moe_token_dispatcher == "flex":
        out["moe_flex_dispatcher_backend"] = training.moe_flex_backend
    if training.cuda_graph_scope:
        out["cuda_graph_impl"] = "transformer_engine"
        out["cuda_graph_scope"] = list(training.cuda_graph_scope)
    elif full_iteration_graphed(model, training):
        out["cuda_graph_impl"] = "local"
        out["cuda_graph_scope"] = "full_iteration"
    if model.shared_ffn_size:
        out["moe_shared_expert_intermediate_size"] = model.shared_ffn_size
    return out


def megatron_bridge_moe_overrides(config: ParallelConfig, model: ModelSpec,
                                  training: TrainingSpec) -> list[str]:
    """Megatron-Bridge recipe overrides (``model.<field>=<value>``) for the MoE part."""
    return [f"model.{k}={v}"
            for k, v in megatron_bridge_moe_fields(config, model, training).items()]


def torchtitan_moe_fields(config: ParallelConfig, model: ModelSpec) -> dict[str, int]:
    """torchtitan ``[parallelism]`` keys for expert parallelism ({} for a dense model)."""
    if not model.is_moe:
        return {}
    return {"expert_parallel_degree": config.ep,
            "expert_tensor_parallel_degree": config.expert_tp}


def torchtitan_moe_lines(config: ParallelConfig, model: ModelSpec) -> list[str]:
    """torchtitan ``[parallelism]`` lines for expert parallelism ([] for a dense model)."""
    if not model.is_moe:
        return []
    return [f"expert_parallel_degree = {config.ep}",
            f"expert_tensor_parallel_degree = {config.expert_tp}"]


def _dispatch_switch_args(training: TrainingSpec, model: ModelSpec) -> list[str]:
    """Megatron-LM flags of the dispatcher switches the plan assumes
    (:mod:`perfmodel.moe.dispatch`): the flex backend, router fusion, partial CUDA graphs (or
    the full-iteration graph, :func:`perfmodel.compute.layer.full_iteration_graphed`)."""
    args: list[str] = []
    if training.moe_token_dispatcher == "flex":
        args.append(f"--moe-flex-dispatcher-backend {training.moe_flex_backend}")
    if training.moe_router_fusion:
        args.append("--moe-router-fusion")
    if training.cuda_graph_scope:
        args += ["--cuda-graph-impl transformer_engine",
                 "--cuda-graph-scope " + " ".join(training.cuda_graph_scope)]
    elif full_iteration_graphed(model, training):  # one graph for the whole step
        args += ["--cuda-graph-impl local", "--cuda-graph-scope full_iteration"]
    return args


def _a2a_overlap_runs(training: TrainingSpec, c: ParallelConfig) -> bool:
    """Whether Megatron-Core runs the all-to-all overlap for this plan
    (:func:`perfmodel.moe.experts.a2a_overlap_applies`)."""

    if not training.overlap_moe_comm:
        return False
    if c.num_microbatches is None:  # the rule does not depend on it
        c = c.model_copy(update={"num_microbatches": 1})
    return bool(a2a_overlap_applies(training, ConfigBatch.from_configs([c]))[0])
