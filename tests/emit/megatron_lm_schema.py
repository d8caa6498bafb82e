"""Megatron-LM's command line, for the flags ``emit.launch`` writes, and the mapping of the
parsed arguments onto Megatron-Core's config classes.

Megatron-LM's ``megatron/training/arguments.py`` is not on the package index (the
``megatron-core`` wheel ships ``megatron/core`` only), so this is a schema built from that file
(NVIDIA/Megatron-LM main, commit 000c4ac, functions ``_add_network_size_args``,
``_add_training_args``, ``_add_distributed_args``, ``_add_mixed_precision_args``,
``_add_transformer_engine_args``, ``_add_checkpointing_args``, ``_add_data_args``, ``_add_moe_args``,
``_add_mla_args``; in Megatron-LM 0.16 the MoE flags are generated from Megatron-Core's
``TransformerConfig`` fields of the same name): each flag with its ``type``, ``choices``,
``action`` and ``dest`` as declared there. Unknown flags are errors (``parse_args``), so a
misspelt or invented flag fails the test. ``--moe-layer-freq`` is parsed by a copy of
Megatron-LM's ``moe_freq_type`` / ``_eval_pattern`` (the same character check and ``eval``).

:func:`parse` splits the file the way its usage line does, ``$(grep -v '^#' megatron.args)``:
bash word-splits the command substitution (quotes stay in the words) and expands glob
patterns; bash itself does the splitting.

:func:`core_configs` then builds Megatron-Core's ``TransformerConfig`` and
``DistributedDataParallelConfig`` from the parsed arguments the way Megatron-LM's
``core_transformer_config_from_args`` does (every dataclass field taken from the argument of the
same name, plus the activation / virtual-pipeline / uneven-stage translations of
``validate_args``), so Megatron-Core's own ``__post_init__`` checks the degrees and switches.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
from pathlib import Path

import numpy as np

_INT = {"--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
        "--kv-channels", "--num-query-groups", "--max-position-embeddings", "--rotary-base",
        "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
        "--context-parallel-size", "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank", "--micro-batch-size", "--global-batch-size",
        "--recompute-num-layers", "--seq-length", "--cpu-offloading-num-layers",
        # _add_moe_args / _add_mla_args (TransformerConfig fields in 0.16)
        "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
        "--moe-shared-expert-intermediate-size", "--expert-model-parallel-size",
        "--expert-tensor-parallel-size", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
        "--qk-pos-emb-head-dim", "--v-head-dim"}
_CHOICES = {
    "--position-embedding-type": ["learned_absolute", "rope", "mrope", "relative", "none"],
    "--normalization": ["LayerNorm", "RMSNorm"],
    "--recompute-granularity": ["full", "selective"],
    "--recompute-method": ["uniform", "block"],
    "--data-parallel-sharding-strategy": ["no_shard", "optim", "optim_grads",
                                          "optim_grads_params"],
    "--ckpt-format": ["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"],
    "--attention-backend": ["flash", "fused", "unfused", "local", "auto"],
    "--cross-entropy-fusion-impl": ["native", "te"],
    "--moe-token-dispatcher-type": ["allgather", "alltoall", "flex"],
    "--moe-flex-dispatcher-backend": ["deepep", "hybridep"],
    "--moe-router-dtype": ["fp32", "fp64"],
    "--cuda-graph-impl": ["none", "local", "transformer_engine"],
}
_STORE_TRUE = ["--group-query-attention", "--swiglu", "--squared-relu",
               "--untie-embeddings-and-output-weights", "--sequence-parallel",
               "--use-distributed-optimizer", "--use-megatron-fsdp", "--overlap-grad-reduce",
               "--overlap-param-gather", "--tp-comm-overlap", "--bf16", "--fp16",
               "--account-for-embedding-in-pipeline-split",
               "--account-for-loss-in-pipeline-split", "--cpu-offloading",
               "--cross-entropy-loss-fusion", "--moe-grouped-gemm", "--moe-router-fusion",
               "--moe-pad-expert-input-to-capacity", "--overlap-moe-expert-parallel-comm",
               "--multi-latent-attention", "--optimizer-cpu-offload"]
# (flag, dest, action) for the flags whose dest differs from the flag name
_DEST = [("--disable-bias-linear", "add_bias_linear", "store_false"),
         ("--add-qkv-bias", "add_qkv_bias", "store_true"),
         ("--no-overlap-p2p-communication", "overlap_p2p_comm", "store_false"),
         ("--no-gradient-accumulation-fusion", "gradient_accumulation_fusion", "store_false")]


def _eval_pattern(pattern: str):
    """Megatron-LM ``megatron/training/arguments.py`` ``_eval_pattern``, as written there."""
    if re.compile(r"[^,\d\[\]\(\)\+\*]").search(pattern):
        raise ValueError(f"Invalid pattern: {pattern}")
    return eval(pattern)  # Megatron-LM's own parse, after its character check


def moe_freq_type(x):
    """Megatron-LM ``moe_freq_type``: an int, or a list expression of 0/1 per layer."""
    if isinstance(x, int):
        return x
    return _eval_pattern(x) if "[" in x else int(x)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, exit_on_error=False)
    for f in sorted(_INT):
        p.add_argument(f, type=int, default=None)
    for f, ch in _CHOICES.items():
        p.add_argument(f, type=str, choices=ch, default=None)
    p.add_argument("--recompute-modules", nargs="*", type=str, default=None)
    p.add_argument("--optimizer-offload-fraction", type=float, default=1.0)
    p.add_argument("--moe-layer-freq", type=moe_freq_type, default=1)
    p.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    p.add_argument("--cuda-graph-scope", nargs="+", type=str, default=None)
    p.add_argument("--cp-comm-type", nargs="+", type=str, default=["p2p"])  # _add_distributed_args
    # TransformerConfig's ModelParallelConfig field, by ArgumentGroupFactory (list[int]: nargs "+")
    p.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
    p.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    p.add_argument("--fp8-format", dest="fp8", choices=["e4m3", "hybrid"], default=None)
    p.add_argument("--fp8-recipe", dest="fp8_recipe", default="delayed",
                   choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"])
    p.add_argument("--fp4-format", dest="fp4", choices=["e2m1"], default=None)
    p.add_argument("--fp4-recipe", dest="fp4_recipe", choices=["nvfp4", "custom"],
                   default="nvfp4")
    for f in _STORE_TRUE:
        p.add_argument(f, action="store_true")
    for f, dest, action in _DEST:
        p.add_argument(f, dest=dest, action=action)
    return p


def bash_words(path: Path) -> list[str]:
    """The words bash makes of ``$(grep -v '^#' FILE)`` on a command line, run in the file's
    folder (where ``torchrun`` is started): word splitting and pathname expansion, quotes kept."""
    r = subprocess.run(["bash", "-c", 'printf "%s\\n" $(grep -v "^#" "$1")', "bash", path.name],
                       cwd=path.parent, capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def parse(text: str, folder: Path) -> argparse.Namespace:
    """Parse an emitted ``megatron.args`` file as its usage line passes it to
    ``pretrain_gpt.py`` (written into ``folder``, then split by bash)."""
    f = folder / "megatron.args"
    f.write_text(text)
    return parser().parse_args(bash_words(f))


def core_configs(args: argparse.Namespace, world_size: int):
    """(TransformerConfig, DistributedDataParallelConfig, data-parallel size) from ``args``."""
    import torch
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    cls = MLATransformerConfig if args.multi_latent_attention else TransformerConfig
    kw = {}
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name) and getattr(args, f.name) is not None:
            kw[f.name] = getattr(args, f.name)
    if isinstance(kw.get("cp_comm_type"), list) and len(kw["cp_comm_type"]) == 1:
        kw["cp_comm_type"] = kw["cp_comm_type"][0]  # argument_utils.py: one type for all layers
    if kw.get("hierarchical_context_parallel_sizes"):  # validate_args
        assert args.context_parallel_size == int(np.prod(kw["hierarchical_context_parallel_sizes"]))
    if "a2a+p2p" in (args.cp_comm_type or []):  # validate_args
        assert kw.get("hierarchical_context_parallel_sizes") is not None, \
            "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm"
    if args.num_experts is not None:  # --num-experts: dest num_experts
        kw["num_moe_experts"] = args.num_experts
    if not args.group_query_attention:
        kw.pop("num_query_groups", None)
    if args.swiglu:
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    elif args.squared_relu:
        kw["activation_func"] = squared_relu
    if args.num_layers_per_virtual_pipeline_stage is not None:  # validate_args
        kw["virtual_pipeline_model_parallel_size"] = (
            args.num_layers // args.pipeline_model_parallel_size
            // args.num_layers_per_virtual_pipeline_stage)
    elif args.num_virtual_stages_per_pipeline_rank is not None:  # validate_args, uneven
        kw["virtual_pipeline_model_parallel_size"] = args.num_virtual_stages_per_pipeline_rank
    kw["num_layers_in_first_pipeline_stage"] = args.decoder_first_pipeline_num_layers
    kw["num_layers_in_last_pipeline_stage"] = args.decoder_last_pipeline_num_layers
    if args.attention_backend is not None:
        kw["attention_backend"] = AttnBackend[args.attention_backend]
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32
    kw.update(params_dtype=dtype, pipeline_dtype=dtype)
    tc = cls(**kw)
    ddp_kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(
        DistributedDataParallelConfig) if hasattr(args, f.name) and getattr(args, f.name)
        is not None}
    ddp = DistributedDataParallelConfig(**ddp_kw)
    model_par = (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
                 * args.context_parallel_size)
    assert world_size % model_par == 0, "validate_args: world size % (tp*pp*cp)"
    dp = world_size // model_par
    assert args.global_batch_size % (args.micro_batch_size * dp) == 0, \
        "validate_args: global batch % (micro batch * dp)"
    return tc, ddp, dp
