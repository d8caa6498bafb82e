"""Hybrid Mamba2 / attention / MLP / MoE stacks (Nemotron-H, Nemotron-3): the layer pattern,
the Mamba2 shapes and parameters, the parallelism they allow, and the Hugging Face fields.

A hybrid model is a list of single-mixer layers, one letter each (Megatron-Core
``MambaModel``, ``--hybrid-override-pattern``; ``mamba_hybrid_layer_allocation.Symbols``):
``M`` a Mamba2 layer, ``*`` an attention-only layer, ``-`` an MLP-only layer, ``E`` an MoE-only
layer. Their kernel times are in :mod:`perfmodel.compute.mamba`, their activations in
:mod:`perfmodel.memory.hybrid`.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.errors import SpecError

LETTERS = "M*-E"


# --------------------------------------------------------------------------------------------
# Pattern and shapes
# --------------------------------------------------------------------------------------------
def check_hybrid(model) -> None:
    """Raise ValueError (a one-line message naming field and value) for an inconsistent hybrid
    spec: unknown letters, a pattern length other than ``num_layers``, MoE letters without
    experts (or experts without MoE letters), the transformer-only MoE layout fields, or Mamba2
    dims whose heads do not divide into groups (``MambaMixer`` asserts)."""
    p = model.hybrid_override_pattern
    bad = [(i, c) for i, c in enumerate(p) if c not in LETTERS]
    if bad:
        i, c = bad[0]
        raise ValueError(f"hybrid_override_pattern {p!r}: letter {c!r} at position {i} is not "
                         f"one of M (Mamba2), * (attention), - (MLP), E (MoE)")
    if len(p) != model.num_layers:
        raise ValueError(f"hybrid_override_pattern has {len(p)} letters, num_layers "
                         f"({model.num_layers}) must equal it")
    n_e = p.count("E")
    if n_e and model.num_experts <= 1:
        raise ValueError(f"hybrid_override_pattern has {n_e} MoE layers ('E'): give "
                         f"num_experts > 1 (got {model.num_experts})")
    if model.num_experts > 1 and not n_e:
        raise ValueError(f"num_experts ({model.num_experts}) > 1 but hybrid_override_pattern "
                         "has no MoE layer ('E')")
    if model.moe_dense_layers or model.moe_layer_freq != 1:
        raise ValueError(f"moe_dense_layers ({model.moe_dense_layers}) and moe_layer_freq "
                         f"({model.moe_layer_freq}) do not apply to a hybrid pattern: place "
                         "the 'E' letters")
    if "M" in p:
        if model.mamba_num_heads is None and (model.mamba_expand * model.hidden_size
                                              % model.mamba_head_dim):
            raise ValueError(f"mamba_head_dim ({model.mamba_head_dim}) must divide "
                             f"mamba_expand * hidden_size ({model.mamba_expand} * "
                             f"{model.hidden_size}) unless mamba_num_heads is given")
        heads = mamba_heads(model)
        if heads % model.mamba_num_groups:
            raise ValueError(f"mamba_num_groups ({model.mamba_num_groups}) must divide "
                             f"mamba_num_heads ({heads})")


def mamba_heads(model) -> int:
    """Mamba2 heads ``H``: ``mamba_num_heads``, else ``expand * h / head_dim``."""
    if model.mamba_num_heads is not None:
        return model.mamba_num_heads
    return model.mamba_expand * model.hidden_size // model.mamba_head_dim


def mamba_d_inner(model) -> int:
    """``d_inner = H * P`` (``MambaMixer``: heads given override ``expand * d_model``)."""
    return mamba_heads(model) * model.mamba_head_dim


def mamba_in_proj_size(model) -> int:
    """Output features of ``in_proj``: ``2*d_inner + 2*G*N + H`` (z, x, B, C, dt; Megatron-Core
    ``ssm/mamba_mixer.py`` ``MambaMixer.__init__``)."""
    return (2 * mamba_d_inner(model) + 2 * model.mamba_num_groups * model.mamba_state_dim
            + mamba_heads(model))


def mamba_conv_dim(model) -> int:
    """Channels of the causal conv1d: ``d_inner + 2*G*N`` (x, B, C; Megatron-Core
    ``ssm/mamba_mixer.py`` ``conv_dim``)."""
    return mamba_d_inner(model) + 2 * model.mamba_num_groups * model.mamba_state_dim


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------
def mamba_params_per_layer(model) -> int:
    """Parameters of one Mamba2 mixer (its pre-norm not included):
    ``h*(2di + 2GN + H)`` in_proj + ``conv_dim*(K + 1)`` conv1d weight and bias + ``3H``
    (dt_bias, A_log, D) + ``di`` grouped RMSNorm + ``di*h`` out_proj.

    Example (Nemotron-3 Nano: h 2688, H 64, P 64, G 8, N 128, K 4): 27,697,152 + 30,720 + 192
    + 4,096 + 11,010,048 = 38,742,208.

    References
    ----------
    Megatron-Core ``ssm/mamba_mixer.py`` (``MambaMixer.__init__``: ``in_proj``,
    ``conv1d_weight`` / ``conv1d_bias``, ``dt_bias``, ``A_log``, ``D`` without
    ``D_has_hdim``, ``norm``, ``out_proj``; ``bias=False``, ``conv_bias=True``).
    """
    h, di, H = model.hidden_size, mamba_d_inner(model), mamba_heads(model)
    in_proj = h * mamba_in_proj_size(model)
    conv = mamba_conv_dim(model) * (model.mamba_conv_kernel + 1)
    return in_proj + conv + 3 * H + di + di * h


def hybrid_layer_params(model) -> float:
    """Parameters of the average layer of a hybrid pattern: ``(n_* attention + n_- MLP + n_E
    MoE block + n_M Mamba2 mixer) / L`` plus one pre-norm per layer (an integer when it
    divides)."""
    n = model.hybrid_layer_counts
    total = n["M"] * (mamba_params_per_layer(model) if n["M"] else 0)
    total += n["*"] * (model.attention_params_per_layer() if n["*"] else 0)
    total += n["-"] * model.mlp_params_per_layer()
    total += n["E"] * (model.moe_layer_params() if n["E"] else 0)
    avg = total / model.num_layers
    avg = int(avg) if float(avg).is_integer() else avg
    return avg + model.norm_params()


# --------------------------------------------------------------------------------------------
# Parallelism
# --------------------------------------------------------------------------------------------
def unsupported_parallelism(model, tp, cp):
    """Per configuration, why a hybrid model cannot run it ('' when it can): tp must divide the
    Mamba2 heads and groups (``MambaMixer`` asserts ``nheads % tp == 0``, ``ngroups % tp ==
    0``); cp > 1 is not modelled (Megatron-Core's ``MambaContextParallel`` all-to-all is not
    priced here). Vectorised over ``tp`` / ``cp`` arrays; '' everywhere for a transformer."""
    tp = np.asarray(tp)
    cp = np.asarray(cp)
    out = np.full(np.broadcast(tp, cp).shape, "", dtype=object)
    if not model.is_hybrid or "M" not in model.hybrid_override_pattern:
        return out
    H, G = mamba_heads(model), model.mamba_num_groups
    bad_tp = (H % tp != 0) | (G % tp != 0)
    out = np.where(bad_tp, f"tp must divide mamba_num_heads ({H}) and mamba_num_groups ({G})",
                   out)
    return np.where(cp > 1, "cp > 1 with Mamba2 layers: Megatron-Core's MambaContextParallel "
                    "all-to-all is not modelled", out)


# --------------------------------------------------------------------------------------------
# Hugging Face config.json (NemotronHConfig)
# --------------------------------------------------------------------------------------------
_HF_HYBRID_INT_KEYS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                       "conv_kernel", "expand", "chunk_size",
                       "moe_shared_expert_intermediate_size", "n_routed_experts")


def hf_hybrid_fields(data: dict, name: str) -> dict:
    """Hybrid fields of a Hugging Face ``NemotronHConfig`` (Nemotron-H, Nemotron-3):
    ``hybrid_override_pattern``, ``mamba_num_heads``, ``mamba_head_dim``, ``ssm_state_size``,
    ``n_groups``, ``conv_kernel``, ``expand``, ``chunk_size``; the MLP activation
    ``mlp_hidden_act`` (``relu2``); no position embedding (NoPE attention); RMSNorm; MoE
    ``moe_shared_expert_intermediate_size`` (one shared expert of that size). Wrong JSON types
    raise SpecError naming the key; ``moe_latent_size`` (latent MoE) is refused."""
    for key in _HF_HYBRID_INT_KEYS:
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SpecError(f"{name}: {key} = {v!r}: expected an integer")
    pattern = data["hybrid_override_pattern"]
    if not isinstance(pattern, str):
        raise SpecError(f"{name}: hybrid_override_pattern = {pattern!r}: expected a string")
    if data.get("moe_latent_size"):
        raise SpecError(f"{name}: moe_latent_size = {data['moe_latent_size']!r}: latent MoE "
                        "(Nemotron-3 Super / Ultra: routed experts in a projected space) is not "
                        "modelled")
    keys = {"mamba_num_heads": "mamba_num_heads", "mamba_head_dim": "mamba_head_dim",
            "ssm_state_size": "mamba_state_dim", "n_groups": "mamba_num_groups",
            "conv_kernel": "mamba_conv_kernel", "expand": "mamba_expand",
            "chunk_size": "mamba_chunk_size"}
    # NemotronHRMSNorm everywhere (the config names its epsilon norm_eps, not rms_norm_eps)
    out = {"hybrid_override_pattern": pattern, "position_embedding": "none", "norm": "rmsnorm"}
    out.update({ours: int(data[k]) for k, ours in keys.items() if data.get(k) is not None})
    act = data.get("mlp_hidden_act")
    if act is not None:
        if act not in ("relu2", "silu", "gelu"):
            raise SpecError(f"{name}: mlp_hidden_act = {act!r}: expected relu2, silu or gelu")
        # NemotronHMLP is up -> act -> down, never gated: two matrices for any activation
        out["activation"] = "relu2" if act == "relu2" else "gelu"
    shared = data.get("moe_shared_expert_intermediate_size")
    if shared and "E" in pattern:
        out["num_shared_experts"] = 1
        out["moe_shared_ffn_hidden_size"] = int(shared)
    return out
