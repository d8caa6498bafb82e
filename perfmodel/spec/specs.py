"""Specs: frozen pydantic models for GPUs, clusters, models and training setups, plus loaders.

Spec files are TOML; every key that carries a unit names it (``hbm_gib``, ``bw_gbyte_per_s``,
``bw_gbit_per_s``, ``latency_us``). The models keep the file's numbers and expose SI values
through properties (``hbm_bytes``, ``bw_bytes_per_s``, ``latency_s``), so conversion happens in
exactly one place. Unknown keys are rejected (``extra="forbid"``) so that a typo in a spec file is
an error, not a silently ignored setting.

Loaders accept a preset name (``gpt3-175b``), a path to a TOML file, or a Hugging Face
``config.json`` (local path only). Every user error is raised as :class:`SpecError`, whose message
is one line naming the field, the value and what was expected.
"""

from __future__ import annotations

import copy
import difflib
import functools
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hardware_specs import find_preset, list_presets
from perfmodel.core import units
from perfmodel.core.errors import SpecError
from perfmodel.core.files import parse_json, parse_toml, plain_name, read_text_bounded, shown
from perfmodel.spec.hybrid import check_hybrid, hf_hybrid_fields, hybrid_layer_params

__all__ = [
    "PRECISIONS",
    "PRECISION_RECIPES",
    "RECIPE_PRECISIONS",
    "BusbwCollective",
    "ClusterSpec",
    "Dtype",
    "GPUSpec",
    "LinkTier",
    "ModelSpec",
    "SpecError",
    "TrainingSpec",
    "build_spec",
    "format_validation_error",
    "load_cluster",
    "load_gpu",
    "load_model",
    "load_training",
    "model_from_hf_config",
    "path_exists",
    "read_toml",
    "resolve_spec",
    "spec_path",
]



class Dtype(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    fp4 = "fp4"


#: Largest cluster the planner accepts (2^20 GPUs, beyond any machine built): counts above it
#: are typing errors, and the space's divisor lists stay small.
MAX_GPUS = 2**20

#: Bounds that keep the work of a search and the integer products of the cost models finite
#: (a 10^30 batch overflowed int64; 10^9 layers hung the layer layouts). Far above any model.
MAX_GLOBAL_BATCH = 2**32
"""Largest global batch [sequences]."""
MAX_SEQ_LEN = 2**24
"""Longest training sequence [tokens]."""
MAX_LAYERS = 100_000
"""Most transformer layers of a model."""

PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
PosInt = Annotated[int, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


def _no_control_chars(value: str) -> str:
    """A name goes into reports and emitted files: no newline or other control character."""
    return plain_name(value)


#: A spec's name: text without control characters (a newline in a model name became live
#: tables of an emitted TOML file).
Name = Annotated[str, AfterValidator(_no_control_chars)]


class Spec(BaseModel):
    """Base: frozen, unknown keys rejected, NaN / infinity rejected (a non-finite bandwidth,
    latency or size is a typing error, and would reach the cost models as warnings and
    "nothing fits"), validated on assignment."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True,
                              allow_inf_nan=False)


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------
class PeakTflops(Spec):
    """Dense (no sparsity) peak tensor-core rates in TFLOP/s; fp4 only where the part has it."""

    fp32: PosFloat
    tf32: PosFloat
    bf16: PosFloat
    fp16: PosFloat
    fp8: PosFloat | None = None
    fp4: PosFloat | None = None


class GPUSpec(Spec):
    """One accelerator: dense peak FLOP/s per dtype, HBM capacity and bandwidth."""

    name: Name
    vendor: str = "nvidia"
    peak_tflops: PeakTflops
    hbm_gib: PosFloat
    hbm_tbyte_per_s: PosFloat
    calibration: str | None = Field(
        default=None, description="name of a folder under hardware_specs/calibration"
    )
    launch_overhead_us: NonNegFloat | None = Field(
        default=None,
        description="host time to dispatch one kernel or collective (framework + driver); "
        "None uses the compute model's defaults fitted on the H200 eager runs",
    )
    mamf_tflops: PosFloat | None = Field(
        default=None,
        description="maximum achievable bf16 matmul TFLOP/s, measured (the ceiling a large GEMM "
        "reaches; datasheet peaks assume boost clocks that power limits do not sustain)",
    )
    sm_count: PosInt | None = Field(
        default=None,
        description="streaming multiprocessors (architecture whitepaper); with boost_clock_ghz "
        "it sets the SM-side rate of memory-bound kernels transferred from another part's "
        "calibration (perfmodel.hardware.calibration.Calibration.scaled_to)",
    )
    boost_clock_ghz: PosFloat | None = Field(
        default=None,
        description="the clock the datasheet's tensor peaks are stated at [GHz]",
    )
    sustained_gemm_fraction: Fraction | None = Field(
        default=None,
        description="GEMM throughput of a whole node training at its power limit relative to "
        "the one-GPU matmul ceiling (mamf_tflops); None uses perfmodel.compute.layer's value for the "
        "GPU's generation",
    )
    comm_overlap_slowdown: NonNegFloat | None = Field(
        default=None,
        description="fractional slowdown of compute while overlapped communication runs "
        "(NCCL kernels take SMs and HBM bandwidth); None uses perfmodel.hardware.overlap's value for "
        "the GPU's generation",
    )
    compute_capability: str | None = Field(
        default=None, pattern=r"^\d+\.\d+$",
        description="CUDA compute capability, e.g. '9.0' (Hopper), '10.0' (B200), '10.3' "
        "(B300): which low-precision recipes Transformer Engine runs on the part")
    sfu_exp_per_clock_sm: PosFloat | None = Field(
        default=None,
        description="exponentials (MUFU.EX2) per clock and SM of the special function units; "
        "None uses perfmodel.compute.attention_kernels' 16 (Volta to Blackwell)")
    tdp_w: PosFloat | None = Field(
        default=None,
        description="thermal design power of the board [W] (datasheet maximum): the GPU's "
        "draw while it computes, for the run's energy (perfmodel.run.energy); None: no energy")

    @property
    def compute_capability_tuple(self) -> tuple[int, int] | None:
        """:attr:`compute_capability` as ``(major, minor)``; None when not stated."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    def peak_flops(self, dtype: str | Dtype) -> float:
        """Dense peak in FLOP/s for ``dtype``; raises SpecError if the part lacks it."""
        try:
            key = Dtype(dtype).value
        except ValueError:
            raise SpecError(
                f"dtype = {dtype!r}: expected one of {[d.value for d in Dtype]}"
            ) from None
        v = getattr(self.peak_tflops, key)
        if v is None:
            raise SpecError(f"gpu '{self.name}' has no {key} tensor-core rate (peak_tflops.{key})")
        return v * units.TERA

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * units.GIB

    @property
    def hbm_bw_bytes_per_s(self) -> float:
        return self.hbm_tbyte_per_s * units.TERA


# --------------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------------
BusbwCollective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
"""Collectives a tier's measured bus-bandwidth table may name (nccl-tests ``*_perf``)."""


class LinkTier(Spec):
    """One tier of the interconnect, innermost first.

    ``domain_size`` is the number of GPUs that reach each other through this tier (8 for a DGX's
    NVSwitch, 72 for an NVL72 rack); the outermost tier may leave it empty (the whole cluster).
    Bandwidth is per GPU, unidirectional, given either in GB/s (``bw_gbyte_per_s``) or, as
    networks are quoted, in Gb/s (``bw_gbit_per_s``). ``oversubscription`` >= 1 divides the
    bandwidth available when the whole tier is busy (1 = full bisection, a non-blocking fat tree).
    ``protocol_efficiency`` in (0, 1] is the share of the line rate the collective library's
    protocol delivers as bus bandwidth (NCCL over NVLink: about 0.8, see the A100 / V100 cluster
    presets); 1 leaves the line rate.

    ``busbw_gbyte_per_s`` (optional) is what an nccl-tests run measured on this tier: for each
    collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``) the bus
    bandwidth ``busbw`` [GB/s, 1e9 bytes/s] nccl-tests prints for a group of ``n`` GPUs whose
    outermost tier is this one (``{"all_reduce": {8: 12.6}}``; TOML: a ``[tiers.busbw_gbyte_per_s]``
    table under the tier, ``all_reduce = { 2 = 20.0, 8 = 12.6 }``). Where given it replaces
    ``bandwidth * protocol_efficiency / oversubscription`` for the collectives of such groups
    (:func:`perfmodel.parallel.topology.measured_busbw_bytes_per_s`): what shares the links
    (GPUs behind one PCIe switch, NICs per node, the algorithm NCCL picks) is in the number.
    """

    name: Name
    kind: Literal["nvlink", "infiniband", "roce", "ethernet", "pcie", "gloo", "other"]
    domain_size: PosInt | None = None
    bw_gbyte_per_s: PosFloat | None = None
    bw_gbit_per_s: PosFloat | None = None
    latency_us: NonNegFloat = 0.0
    oversubscription: Annotated[float, Field(ge=1.0)] = 1.0
    protocol_efficiency: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    busbw_gbyte_per_s: dict[BusbwCollective, dict[int, PosFloat]] | None = Field(
        default=None, description="measured nccl-tests bus bandwidth [GB/s] per collective "
        "(all_reduce, all_gather, reduce_scatter, all_to_all) and group size (>= 2) of the "
        "groups whose outermost tier is this one; replaces the analytic bandwidth where given")

    @field_validator("busbw_gbyte_per_s", mode="before")
    @classmethod
    def _group_keys(cls, value: Any) -> Any:
        """TOML table keys are text: ``8 = 12.6`` reads as group size 8."""
        if not isinstance(value, dict):
            return value
        return {c: ({int(k) if isinstance(k, str) and k.isdigit() else k: v
                     for k, v in row.items()} if isinstance(row, dict) else row)
                for c, row in value.items()}

    @model_validator(mode="after")
    def _busbw_groups(self) -> LinkTier:
        for coll, table in (self.busbw_gbyte_per_s or {}).items():
            if not table:
                raise ValueError(f"tier '{self.name}': busbw_gbyte_per_s.{coll} is empty "
                                 "(give at least one group size = GB/s)")
            bad = [n for n in table if n < 2]
            if bad:
                raise ValueError(f"tier '{self.name}': busbw_gbyte_per_s.{coll} group size "
                                 f"({bad[0]}) must be at least 2")
        return self

    @model_validator(mode="after")
    def _one_bandwidth(self) -> LinkTier:
        if (self.bw_gbyte_per_s is None) == (self.bw_gbit_per_s is None):
            raise ValueError(
                f"tier '{self.name}': give exactly one of bw_gbyte_per_s or bw_gbit_per_s "
                f"(got bw_gbyte_per_s={self.bw_gbyte_per_s}, bw_gbit_per_s={self.bw_gbit_per_s})"
            )
        if self.bw_bytes_per_s < 1e3:  # collectives.MIN_BW_BYTES_PER_S: a unit mistake
            key = "bw_gbyte_per_s" if self.bw_gbyte_per_s is not None else "bw_gbit_per_s"
            raise ValueError(
                f"tier '{self.name}': {key} = {getattr(self, key)!r} is below 1 kB/s "
                "(a unit mistake?)"
            )
        return self

    @property
    def bw_bytes_per_s(self) -> float:
        """Per-GPU unidirectional bandwidth [bytes/s], before oversubscription."""
        if self.bw_gbyte_per_s is not None:
            return self.bw_gbyte_per_s * units.GIGA
        return units.gbit_per_s_to_bytes_per_s(self.bw_gbit_per_s)

    @property
    def effective_bw_bytes_per_s(self) -> float:
        """Per-GPU bandwidth [bytes/s] when every GPU uses the tier at once, as the collective
        library delivers it: ``line rate * protocol_efficiency / oversubscription``."""
        return self.bw_bytes_per_s * self.protocol_efficiency / self.oversubscription

    @property
    def latency_s(self) -> float:
        return self.latency_us * units.US


class ClusterSpec(Spec):
    """GPUs, how many per node, how many nodes, and the link tiers innermost first."""

    name: Name
    gpu: GPUSpec
    gpus_per_node: PosInt
    num_nodes: PosInt
    tiers: list[LinkTier] = Field(min_length=1)
    description: str = ""
    # Whole-run terms (perfmodel.run); None takes the documented default of perfmodel.run.
    interruptions_per_gpu_hour: PosFloat | None = Field(
        default=None, description="job interruptions per GPU-hour; None: "
        "perfmodel.run.failures.INTERRUPTIONS_PER_GPU_HOUR (Llama 3's 466 in 54 days on 16K)")
    storage_write_gbyte_per_s: PosFloat | None = Field(
        default=None, description="aggregate checkpoint write (and read) bandwidth of the "
        "storage tier [GB/s]; None: perfmodel.run.checkpoint's 1 GB/s per node")
    gpu_hour_price: PosFloat | None = Field(
        default=None, description="price of one GPU-hour (any currency) for the run's cost")
    pue: Annotated[float, Field(ge=1.0)] | None = Field(
        default=None, description="site power usage effectiveness; None: perfmodel.run.energy.PUE")
    node_other_w_per_gpu: NonNegFloat | None = Field(
        default=None, description="power of a node's CPUs, memory, NICs and fans per GPU [W]; "
        "None: perfmodel.run.energy.NODE_OTHER_W_PER_GPU (DGX H100 datasheet)")
    # Offload to the host (perfmodel.memory.optimizer_offload); None takes that module's default.
    host_link_gbyte_per_s: PosFloat | None = Field(
        default=None, description="device-host copy bandwidth per GPU and direction when every "
        "GPU of the node copies at once [GB/s] (PCIe Gen5 x16 ~55 measured, shared by the GPUs "
        "behind one switch; GB200 NVLink-C2C 450); None: perfmodel.memory.offload's per-GPU value")
    cpu_cores_per_node: PosInt | None = Field(
        default=None, description="host CPU cores of a node that run the offloaded optimizer "
        "step; None: perfmodel.memory.optimizer_offload.CPU_CORES_PER_GPU per GPU")
    cpu_adam_params_per_s_per_core: PosFloat | None = Field(
        default=None, description="parameters one CPU core updates per second with DeepSpeed's "
        "vectorised CPU-Adam; None: perfmodel.memory.optimizer_offload.CPU_ADAM_PARAMS_PER_S_PER_CORE")

    @model_validator(mode="after")
    def _tiers_nest(self) -> ClusterSpec:
        prev = 1
        for i, t in enumerate(self.tiers):
            size = t.domain_size
            if size is None:
                if i != len(self.tiers) - 1:
                    raise ValueError(
                        f"tier '{t.name}': only the outermost tier may omit domain_size"
                    )
                continue
            if size % prev:
                raise ValueError(
                    f"tier '{t.name}': domain_size ({size}) must be a multiple of the inner "
                    f"tier's domain_size ({prev})"
                )
            if i == 0 and size % self.gpus_per_node and self.gpus_per_node % size:
                raise ValueError(
                    f"tier '{t.name}': domain_size ({size}) must divide gpus_per_node "
                    f"({self.gpus_per_node}) or be a multiple of it"
                )
            prev = size
        return self

    @model_validator(mode="after")
    def _bounded(self) -> ClusterSpec:
        if self.gpus_per_node * self.num_nodes > MAX_GPUS:
            raise ValueError(
                f"gpus_per_node * num_nodes ({self.gpus_per_node} * {self.num_nodes}) exceeds "
                f"the limit of {MAX_GPUS:,} GPUs"
            )
        return self

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def scale_up_size(self) -> int:
        """GPUs in the innermost (NVLink) domain."""
        return self.tier_domain_sizes()[0]

    def tier_domain_sizes(self) -> list[int]:
        """Domain size of every tier, the outermost filled in with the total GPU count."""
        total = self.total_gpus
        out = [min(t.domain_size or total, total) for t in self.tiers]
        out[-1] = total
        return out

    def with_gpus(self, gpus: int) -> ClusterSpec:
        """The same cluster scaled to ``gpus`` GPUs (whole nodes, or one partial node)."""
        if gpus <= 0:
            raise SpecError(f"gpus ({gpus}) must be positive")
        if gpus > MAX_GPUS:
            raise SpecError(f"gpus ({gpus}) exceeds the limit of {MAX_GPUS:,} GPUs")
        if gpus <= self.gpus_per_node:
            return self.model_copy(update={"gpus_per_node": gpus, "num_nodes": 1})
        if gpus % self.gpus_per_node:
            raise SpecError(
                f"gpus ({gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node}) "
                f"of cluster '{self.name}'"
            )
        return self.model_copy(update={"num_nodes": gpus // self.gpus_per_node})


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
class PublishedTraining(Spec):
    """A model's published training setup (``[published_training]`` in a model preset)."""

    seq_len: PosInt
    global_batch_size: PosInt
    source: str


class ModelSpec(Spec):
    """A decoder-only transformer.

    ``activation``: ``gelu`` (two FFN matrices), ``swiglu`` (three, gated), ``relu2`` (squared
    ReLU, two matrices; Nemotron-4). ``position_embedding``: ``learned`` adds a max_seq x hidden
    table (GPT-2/3); ``rope`` adds no parameters; ``none`` (Nemotron-H's attention layers, NoPE)
    neither parameters nor kernels. MoE fields default to a dense model; ``hybrid_override_pattern``
    makes it a hybrid Mamba2 / attention / MLP / MoE stack (:mod:`perfmodel.compute.mamba`).
    """

    name: Name
    num_layers: Annotated[int, Field(gt=0, le=MAX_LAYERS)]
    hidden_size: PosInt
    num_attention_heads: PosInt
    num_kv_heads: PosInt | None = None
    head_dim: PosInt | None = None
    ffn_hidden_size: PosInt
    vocab_size: Annotated[int, Field(ge=2)]
    max_seq_len: PosInt = 2048
    activation: Literal["gelu", "swiglu", "relu2"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["learned", "rope", "none"] = "learned"
    tied_embeddings: bool = True
    linear_bias: bool = True
    qkv_bias: bool = Field(default=False, description="bias on the q/k/v projections only "
                           "(Qwen2; Megatron --add-qkv-bias); linear_bias implies it")
    rope_base: PosFloat = Field(default=10000.0, description="RoPE base theta (Su et al. 2021: "
                                "10,000; Llama 3: 500,000); unused with learned positions")
    num_experts: PosInt = 1
    moe_top_k: PosInt = 1
    # Mixture-of-experts layout (Megatron-Core ``TransformerConfig`` names in brackets). Defaults
    # describe the plain case: every layer MoE when num_experts > 1, experts of ffn_hidden_size.
    moe_ffn_hidden_size: PosInt | None = Field(
        default=None, description="FFN size of one routed expert (--moe-ffn-hidden-size); None: "
        "ffn_hidden_size, which then sizes the dense layers' MLP only"
    )
    num_shared_experts: Annotated[int, Field(ge=0)] = Field(
        default=0, description="always-active experts per MoE layer (DeepSeek, Llama 4)"
    )
    moe_shared_ffn_hidden_size: PosInt | None = Field(
        default=None, description="FFN size of all shared experts together "
        "(--moe-shared-expert-intermediate-size); None: num_shared_experts * moe_ffn_hidden_size"
    )
    moe_dense_layers: Annotated[int, Field(ge=0)] = Field(
        default=0, description="leading dense layers (DeepSeek first_k_dense_replace)"
    )
    moe_layer_freq: PosInt = Field(
        default=1, description="after the dense layers, every k-th layer is MoE (Llama 4 "
        "interleave_moe_layer_step: layers k-1, 2k-1, ...)"
    )
    moe_capacity_factor: PosFloat | None = Field(
        default=None, description="token capacity per expert over the balanced share "
        "(--moe-expert-capacity-factor); None = dropless"
    )
    moe_load_imbalance: Annotated[float, Field(ge=1.0)] | None = Field(
        default=None, description="tokens of the busiest expert over the balanced share; None: "
        "the capacity factor (token-dropping), 1.0 when dropless (force-balanced benchmarks)"
    )
    moe_router_dtype: Literal["fp32", "bf16"] = "fp32"
    moe_router_bias: bool = Field(default=False, description="router has a bias (GPT-OSS)")
    fused_elementwise: bool = Field(
        default=True, description="bias + activation, bias + dropout + add and RoPE run as fused "
        "kernels (Megatron's bias_activation_fusion, bias_dropout_fusion, apply_rope_fusion); "
        "False: as separate PyTorch ops (Megatron-Bridge GPTOSSProvider: the clamped GeGLU, "
        "its biases and the learnable-sink attention leave the fusions off)")
    attention_window: PosInt | None = Field(
        default=None, description="left window [tokens] of the sliding-window attention layers "
        "(Megatron-Core window_size[0]; GPT-OSS 128); None: full causal attention")
    window_attn_skip_freq: PosInt | None = Field(
        default=None, description="every n-th layer keeps full attention, the others use the "
        "window (Megatron-Core window_attn_skip_freq; GPT-OSS 2: alternating); None: all "
        "layers windowed when attention_window is set")
    mtp_num_layers: Annotated[int, Field(ge=0)] = Field(
        default=0, description="multi-token prediction layers on the last pipeline stage "
        "(Megatron-Core mtp_num_layers; DeepSeek-V3 recipes: 1); their step time only "
        "(perfmodel.compute.mtp), not counted in the parameters")
    # Multi-head latent attention (DeepSeek-V2/V3): head_dim is the no-RoPE q/k head size.
    q_lora_rank: PosInt | None = None
    kv_lora_rank: PosInt | None = None
    qk_rope_head_dim: Annotated[int, Field(ge=0)] = 0
    v_head_dim: PosInt | None = None
    # Hybrid Mamba2 / attention / MLP / MoE stacks (Megatron-Core MambaModel; perfmodel.compute.mamba).
    hybrid_override_pattern: str | None = Field(
        default=None, description="one letter per layer (Megatron --hybrid-override-pattern): "
        "M Mamba2, * attention, - MLP, E MoE; None: a transformer (attention + MLP every layer)")
    mamba_state_dim: PosInt = Field(default=128, description="SSM state size N "
                                    "(--mamba-state-dim, HF ssm_state_size)")
    mamba_head_dim: PosInt = Field(default=64, description="Mamba2 head size P "
                                   "(--mamba-head-dim, HF mamba_head_dim)")
    mamba_num_groups: PosInt = Field(default=8, description="B/C groups G "
                                     "(--mamba-num-groups, HF n_groups)")
    mamba_num_heads: PosInt | None = Field(default=None, description="Mamba2 heads H "
                                           "(--mamba-num-heads); None: expand*h / head_dim")
    mamba_conv_kernel: PosInt = Field(default=4, description="causal conv1d width (d_conv)")
    mamba_expand: PosInt = Field(default=2, description="d_inner = expand * h when "
                                 "mamba_num_heads is None (MambaMixer expand)")
    mamba_chunk_size: PosInt = Field(default=128, description="SSD chunk length Q "
                                     "(MambaMixer chunk_size)")
    published_params: PosFloat | None = Field(
        default=None, description="published parameter count, for the preset tests"
    )
    published_active_params: PosFloat | None = Field(
        default=None, description="published active parameters per token (MoE), for the tests"
    )
    published_training: PublishedTraining | None = Field(
        default=None, description="the training setup the source publishes: the default "
        "sequence length and global batch when the user gives none"
    )
    source: str = ""

    @model_validator(mode="after")
    def _heads(self) -> ModelSpec:
        kv = self.kv_heads
        if self.num_attention_heads % kv:
            raise ValueError(
                f"num_kv_heads ({kv}) must divide num_attention_heads ({self.num_attention_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size "
                f"({self.hidden_size}) unless head_dim is given"
            )
        if self.moe_top_k > self.num_experts:
            raise ValueError(
                f"moe_top_k ({self.moe_top_k}) must be <= num_experts ({self.num_experts})"
            )
        if self.moe_dense_layers > self.num_layers:
            raise ValueError(
                f"moe_dense_layers ({self.moe_dense_layers}) must be <= num_layers "
                f"({self.num_layers})"
            )
        if self.v_head_dim is not None and self.kv_lora_rank is None:
            raise ValueError(
                f"v_head_dim ({self.v_head_dim}) is an MLA field: give kv_lora_rank too"
            )
        if self.q_lora_rank is not None and self.kv_lora_rank is None:
            raise ValueError(
                f"q_lora_rank ({self.q_lora_rank}) is an MLA field: give kv_lora_rank too"
            )
        if self.hybrid_override_pattern is not None:
            check_hybrid(self)
        return self

    # ---- mixture of experts -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_ffn_size(self) -> int:
        """FFN size of one routed expert."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_ffn_size(self) -> int:
        """FFN size of the shared experts of one MoE layer together (0 without)."""
        if self.moe_shared_ffn_hidden_size is not None:
            return self.moe_shared_ffn_hidden_size
        return self.num_shared_experts * self.expert_ffn_size

    @property
    def num_moe_layers(self) -> int:
        """MoE layers: after ``moe_dense_layers`` dense ones, every ``moe_layer_freq``-th
        (0 for a dense model). Megatron ``--moe-layer-freq``, HF ``first_k_dense_replace``,
        ``interleave_moe_layer_step``."""
        if not self.is_moe:
            return 0
        if self.is_hybrid:
            return self.hybrid_layer_counts["E"]
        return (self.num_layers - self.moe_dense_layers) // self.moe_layer_freq

    @property
    def moe_layer_fraction(self) -> float:
        return self.num_moe_layers / self.num_layers

    @property
    def load_imbalance(self) -> float:
        """Tokens of the busiest expert over the balanced share (see ``moe_load_imbalance``)."""
        if self.moe_load_imbalance is not None:
            return self.moe_load_imbalance
        return self.moe_capacity_factor or 1.0

    # ---- hybrid Mamba2 stacks (perfmodel.compute.mamba) ------------------------------------------
    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_override_pattern is not None

    @property
    def hybrid_layer_counts(self) -> dict[str, int]:
        """Layers of each letter of the hybrid pattern (``M``, ``*``, ``-``, ``E``)."""
        p = self.hybrid_override_pattern or ""
        return {c: p.count(c) for c in "M*-E"}

    @property
    def attention_layer_fraction(self) -> float:
        """Share of the layers with attention: 1 for a transformer, ``n('*') / L`` hybrid."""
        if not self.is_hybrid:
            return 1.0
        return self.hybrid_layer_counts["*"] / self.num_layers

    @property
    def mamba_layer_fraction(self) -> float:
        """Share of the layers that are Mamba2 mixers (0 for a transformer)."""
        if not self.is_hybrid:
            return 0.0
        return self.hybrid_layer_counts["M"] / self.num_layers

    @property
    def dense_mlp_fraction(self) -> float:
        """Share of the layers with a dense MLP: ``1 - phi`` for a transformer (``phi`` the
        MoE-layer fraction), ``n('-') / L`` for a hybrid pattern."""
        if self.is_hybrid:
            return self.hybrid_layer_counts["-"] / self.num_layers
        return 1.0 - self.moe_layer_fraction

    @property
    def norms_per_layer(self) -> int:
        """Pre-norms (and residual blocks) per layer: 2 in a transformer layer (attention, MLP),
        1 in each single-mixer layer of a hybrid pattern (Megatron-Core ``MambaLayer``,
        ``TransformerLayer`` built as attention-only or MLP-only)."""
        return 1 if self.is_hybrid else 2

    # ---- attention geometry -------------------------------------------------------------
    @property
    def window_layer_fraction(self) -> float:
        """Share of the layers whose attention is windowed: 0 without a window, ``1 - 1/n``
        with ``window_attn_skip_freq`` n (Megatron-Core ``is_layer_window_attention``: layer
        numbers divisible by n keep full attention), else 1."""
        if self.attention_window is None:
            return 0.0
        n = self.window_attn_skip_freq
        return 1.0 if n is None else 1.0 - (self.num_layers // n) / self.num_layers

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def qk_head_size(self) -> int:
        """q/k head size of the attention scores (MLA: no-RoPE plus RoPE part)."""
        return self.head_size + self.qk_rope_head_dim

    @property
    def v_head_size(self) -> int:
        return self.v_head_dim or self.head_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def gated_mlp(self) -> bool:
        return self.activation == "swiglu"

    # Parameter counts (Megatron-LM 2021 Sec. 5.1 counts 12*l*h^2*(1 + 13/(12h) + (V+s)/(12lh))
    # for GPT; the terms below generalise it to GQA, gated MLPs, RMSNorm and untied outputs).
    def attention_params_per_layer(self) -> int:
        if self.is_mla:
            return self.mla_params_per_layer()
        h, d = self.hidden_size, self.head_size
        q = h * self.num_attention_heads * d
        kv = 2 * h * self.kv_heads * d
        out = self.num_attention_heads * d * h
        qkv_bias = self.num_attention_heads * d + 2 * self.kv_heads * d
        bias = (qkv_bias + h) if self.linear_bias else (qkv_bias if self.qkv_bias else 0)
        return q + kv + out + bias

    def mla_params_per_layer(self) -> int:
        """Multi-head latent attention (DeepSeek-V2 Sec. 2.1; Megatron ``MLASelfAttention``):
        q down (h x q_lora) + its RMSNorm + q up (q_lora x heads*(d + d_rope)) [or one q
        projection without q_lora], kv down (h x (kv_lora + d_rope)) + its RMSNorm, kv up
        (kv_lora x heads*(d + d_v)), output (heads*d_v x h)."""
        h, nh, r = self.hidden_size, self.num_attention_heads, self.kv_lora_rank
        dq = self.qk_head_size
        if self.q_lora_rank:
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * dq
        else:
            q = h * nh * dq
        kv = h * (r + self.qk_rope_head_dim) + r + r * nh * (self.head_size + self.v_head_size)
        return q + kv + nh * self.v_head_size * h

    def _mlp_params(self, f: int) -> int:
        h = self.hidden_size
        mats = 3 if self.gated_mlp else 2
        bias = ((2 if self.gated_mlp else 1) * f + h) if self.linear_bias else 0
        return mats * h * f + bias

    def mlp_params_per_layer(self) -> int:
        """Parameters of one MLP of ``ffn_hidden_size`` (a dense layer's, or one expert's when
        moe_ffn_hidden_size is not given)."""
        return self._mlp_params(self.ffn_hidden_size)

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return self._mlp_params(self.expert_ffn_size)

    def router_params(self) -> int:
        return self.hidden_size * self.num_experts + (self.num_experts if self.moe_router_bias
                                                      else 0)

    def moe_layer_params(self) -> int:
        """One MoE layer's MLP block: routed experts, shared experts, router."""
        shared = self._mlp_params(self.shared_ffn_size) if self.shared_ffn_size else 0
        return self.num_experts * self.expert_params() + shared + self.router_params()

    def routed_expert_params_per_layer(self) -> float:
        """Routed-expert parameters per layer, averaged over all layers (what expert
        parallelism shards: ``num_moe_layers * E * expert / L``)."""
        return self.num_moe_layers * self.num_experts * self.expert_params() / self.num_layers

    def norm_params(self) -> int:
        """One norm's parameters: LayerNorm has weight and bias, RMSNorm only weight."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    def layer_params(self) -> float:
        """Parameters of one layer, averaged over the layers (an integer when all layers are
        alike): attention + norms + the dense MLP or the MoE block, by the layer pattern."""
        if self.is_hybrid:
            return hybrid_layer_params(self)
        if not self.is_moe:
            return self.attention_params_per_layer() + self.mlp_params_per_layer() + (
                2 * self.norm_params())
        n_moe = self.num_moe_layers
        mlp = n_moe * self.moe_layer_params() + (self.num_layers - n_moe) * (
            self.mlp_params_per_layer())
        avg = mlp / self.num_layers
        avg = int(avg) if float(avg).is_integer() else avg
        return self.attention_params_per_layer() + avg + 2 * self.norm_params()

    def active_param_count(self) -> int:
        """Parameters one token uses: :meth:`param_count` with ``moe_top_k`` routed experts per
        MoE layer instead of all of them (the "active" count of MoE papers)."""
        idle = self.num_moe_layers * (self.num_experts - self.moe_top_k) * self.expert_params()
        return self.param_count() - idle

    def embedding_params(self) -> int:
        pos = self.max_seq_len * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def output_params(self) -> int:
        """The output (logit) layer's own parameters: 0 when tied to the input embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        """Total parameters: embeddings + layers + final norm + untied output layer."""
        return round(
            self.embedding_params()
            + self.num_layers * self.layer_params()
            + self.norm_params()
            + self.output_params()
        )


# --------------------------------------------------------------------------------------------
# Training setup
# --------------------------------------------------------------------------------------------
RecomputeModule = Literal["core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp",
                          "shared_experts"]
"""Sub-modules Megatron-Core's selective recomputation can repeat (``TransformerConfig.
recompute_modules``; its ``moe`` module, the whole MoE layer with its dispatch, is not offered)."""


class TrainingSpec(Spec):
    """Global batch in sequences, sequence length in tokens, precision and optimizer.

    ``precision``: ``fp32`` (everything fp32), ``bf16``/``fp16`` (mixed: 16-bit weights and
    gradients, fp32 master weights and optimizer states), ``fp8``/``fp4`` (Transformer-Engine style:
    low-precision GEMMs, bf16 weights and activations, fp32 master weights and optimizer states).

    Low-precision recipes (Transformer Engine / Megatron ``--fp8-recipe``) are given as the
    precision and stored split into ``precision`` (the GEMM dtype, ``fp8`` or ``fp4``) and
    ``low_precision_recipe``: ``fp8-delayed`` (per-tensor scales from an amax history; TE's
    DelayedScaling, Megatron's default, alias ``fp8``), ``fp8-cs`` (per-tensor current scaling:
    an amax pass before each cast), ``fp8-block`` (1x128 / 128x128 block scales, Hopper),
    ``mxfp8`` (32-element blocks with e8m0 scales, Blackwell) and ``nvfp4`` (16-element blocks,
    fp8 block scales, Blackwell; alias ``fp4``).
    """

    global_batch_size: Annotated[int, Field(gt=0, le=MAX_GLOBAL_BATCH)] = 1536
    seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] = 2048
    precision: Literal["fp32", "bf16", "fp16", "fp8", "fp4"] = "bf16"
    low_precision_recipe: Literal["fp8-delayed", "fp8-cs", "fp8-block", "mxfp8", "nvfp4"] | None = (
        Field(default=None, description="scaling recipe of the fp8/fp4 GEMMs (set from precision)")
    )
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    # Software features that decide what communication is hidden (Megatron-Core / NeMo names in
    # brackets). Defaults describe a current Megatron-Core recipe; Megatron-LM 2021 had none.
    overlap_grad_reduce: bool = Field(
        default=True,
        description="data-parallel communication (gradient reduce, ZeRO gathers) overlaps "
        "compute (--overlap-grad-reduce, --overlap-param-gather, FSDP prefetch)",
    )
    overlap_tp_comm: bool = Field(
        default=False, description="TP collectives overlap GEMMs (--tp-comm-overlap, TE userbuffers)"
    )
    overlap_p2p_comm: bool = Field(
        default=True, description="pipeline sends/receives overlap compute (--overlap-p2p-comm)"
    )
    flash_attention: bool = Field(default=True, description="no s^2 attention scores are stored")
    attention_backend: Literal["cudnn", "flash-attn-2"] = Field(
        default="cudnn", description="fused attention kernel (with flash_attention): 'cudnn' "
        "(Transformer Engine FusedAttention, its choice on Hopper+ and the calibration's "
        "kernel) or 'flash-attn-2' (the flash-attn 2 package: NVTE_FUSED_ATTN=0 without "
        "flash-attn 3; perfmodel.compute.attention_kernels.te_attention_backend)"
    )
    moe_token_dispatcher: Literal["alltoall", "allgather", "flex"] = Field(
        default="alltoall", description="MoE token dispatcher (--moe-token-dispatcher-type): "
        "'flex' = DeepEP / HybridEP fused permute + all-to-all (perfmodel.moe.dispatch)"
    )
    moe_flex_backend: Literal["deepep", "hybridep"] = Field(
        default="deepep", description="backend of the flex dispatcher "
        "(--moe-flex-dispatcher-backend); used only with moe_token_dispatcher = 'flex'"
    )
    moe_router_fusion: bool = Field(
        default=True, description="Transformer Engine's fused router kernels "
        "(--moe-router-fusion; Megatron-Bridge performance recipes set it): 31 router + "
        "preprocess kernels a pass instead of 72 (perfmodel.moe.dispatch)"
    )
    cuda_graph_scope: tuple[Literal["attn", "moe_router", "moe_preprocess", "mamba"], ...] = Field(
        default=(), description="parts replayed as Transformer Engine partial CUDA graphs "
        "(--cuda-graph-impl transformer_engine --cuda-graph-scope ...): their kernels cost one "
        "host launch (perfmodel.moe.dispatch.graph_saved_launches; 'mamba': the Mamba2 "
        "mixers, perfmodel.compute.mamba.mamba_kernels); () = no CUDA graphs"
    )
    moe_parallel_folding: bool = Field(
        default=True, description="the expert groups are laid out by Megatron-Core's MoE "
        "parallel folding (>= 0.10: etp x ep x expert-dp, ep ranks etp apart); False: the "
        "layout before it (0.8 / 0.9: order tp-cp-ep-dp-pp, ep carved out of dp, ep ranks "
        "tp*cp apart, etp = tp; perfmodel.moe.expert_layout)"
    )
    cuda_graph_full_iteration: bool = Field(
        default=False, description="the whole forward-backward step replayed as one CUDA graph "
        "(--cuda-graph-impl local --cuda-graph-scope full_iteration): no host launch cost per "
        "kernel; MoE only where the expert inputs are padded to capacity (no device-to-host "
        "sync), else ignored (perfmodel.compute.layer.full_iteration_graphed)"
    )
    overlap_moe_comm: bool = Field(
        default=False, description="expert-parallel all-to-all overlaps another micro-batch's "
        "compute (--overlap-moe-expert-parallel-comm, DeepSeek-V3 DualPipe-style overlap)"
    )
    moe_pad_expert_input_to_capacity: bool = Field(
        default=False, description="token-dropping MoE pads every expert's input to its "
        "capacity (--moe-pad-expert-input-to-capacity, needs the model's moe_capacity_factor): "
        "fixed split sizes, so the dispatcher has no device-to-host sync"
    )
    fp8_params: bool = Field(
        default=False,
        description="fp8/fp4 recipes keep the model weights in fp8 (Transformer Engine fp8 model "
        "params, --fp8-param-gather; NeMo's bf16_with_fp8_mixed): no bf16 copy, fp8 all-gathers",
    )
    grad_reduce_in_fp32: bool = Field(
        default=True,
        description="gradients accumulate and reduce across data parallel in fp32 (Megatron-LM's "
        "main-grad buffer; --grad-reduce-in-bf16 / NeMo performance recipes' "
        "grad_reduce_in_fp32=False: bf16 buffer and traffic)",
    )
    fsdp_gradient_accumulation_fusion: bool = Field(
        default=True,
        description="under FSDP (zero_stage 3) the weight-gradient GEMMs accumulate into the "
        "main-grad buffer in their epilogue (Megatron-Core gradient_accumulation_fusion, the "
        "default); False: they write a 16-bit param.grad that the backward hook copies into "
        "main_grad, one more memory-bound pass per weight and micro-batch (Megatron-Bridge's "
        "performance configs turn it off when use_megatron_fsdp: 'Disabled to avoid "
        "functional errors'); other configurations keep the fused accumulation")
    fp16_overflow_check: Literal["fused", "per-tensor"] = Field(
        default="fused",
        description="fp16 loss scaling's inf/nan check of the gradients before the step: one fused "
        "pass (Megatron-LM 2021+, Megatron-Core), or apex's per-tensor float(g.float().sum()) of "
        "Megatron-LM 2020 (megatron/fp16/loss_scaler.py), an fp32 copy of every fp16 gradient",
    )
    cpu_offload_layers: int = Field(
        default=0,
        ge=0,
        description="activations of this many transformer layers per pipeline stage are "
        "offloaded to host memory (Megatron-Core --cpu-offloading --cpu-offloading-num-layers; "
        "Megatron-Bridge's FSDP presets' cpu_offloading_num_layers); 0 = off",
    )
    cross_entropy: Literal["fp32", "fused"] = Field(
        default="fp32",
        description="the loss's logits: 'fp32' (Megatron-Core's vocab-parallel cross-entropy "
        "keeps an fp32 softmax) or 'fused' (Transformer Engine parallel_cross_entropy, "
        "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te: gradient written into the "
        "16-bit logits in place)",
    )
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        default=("core_attn",),
        description="what selective recomputation repeats in the backward (Megatron-Core "
        "--recompute-modules; default core_attn): core_attn, layernorm (input and pre-MLP norms), "
        "moe_act (the routed experts' activation), mla_up_proj (MLA up projections and RoPE), "
        "mlp (the dense layers' MLP), shared_experts",
    )
    zero3_gather: Literal["layer", "tensor"] = Field(
        default="layer",
        description="ZeRO-3 all-gather granularity: one per layer (PyTorch FSDP2, Megatron-FSDP) "
        "or one per parameter tensor (DeepSpeed ZeRO-3 as of 2021)",
    )
    moe_imbalance: Annotated[float, Field(ge=1.0)] | None = Field(
        default=None, description="MoE routing imbalance: tokens of the busiest expert over the "
        "mean; capped at the capacity factor where tokens are dropped (perfmodel.moe.imbalance); "
        "None: the model's moe_load_imbalance")
    hsdp_shard: Annotated[int, Field(ge=0)] = Field(
        default=0, description="hybrid sharding (HSDP): ZeRO-3 states sharded within groups of "
        "this many data-parallel ranks and replicated across dp / N groups (torchtitan "
        "data_parallel_shard_degree; the shard degree is gcd(N, dp)); 0: shard over all of dp")
    offload: tuple[Literal["optimizer", "params", "activations"], ...] = Field(
        default=(), description="what goes to host memory: 'optimizer' (ZeRO-Offload, "
        "Megatron --optimizer-cpu-offload), 'params' (ZeRO-Infinity offload_param, ZeRO-3), "
        "'activations' (--cpu-offloading; see cpu_offload_layers); () = none")
    optimizer_offload_fraction: Fraction = Field(
        default=1.0, description="share of the optimizer states (and their step) on the host "
        "with 'optimizer' offload (Megatron --optimizer-offload-fraction)")

    @model_validator(mode="before")
    @classmethod
    def _split_recipe(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "precision" not in data:
            return data
        prec = data["precision"]
        if not isinstance(prec, str):
            return data
        data = dict(data)
        old = data.get("low_precision_recipe")
        if prec in PRECISION_RECIPES:
            dtype, recipe = PRECISION_RECIPES[prec]
            data["precision"] = dtype
            keep = prec == dtype and old in PRECISION_RECIPES and PRECISION_RECIPES[old][0] == dtype
            data["low_precision_recipe"] = old if keep else recipe
        elif prec in ("fp32", "bf16", "fp16"):
            data["low_precision_recipe"] = None
        return data

    @model_validator(mode="after")
    def _check_graph_scope(self) -> TrainingSpec:
        scope = self.cuda_graph_scope
        if "moe_preprocess" in scope and "moe_router" not in scope:
            raise ValueError(f"cuda_graph_scope {scope!r}: 'moe_preprocess' needs 'moe_router' "
                             "(Megatron-Core TransformerConfig)")
        if len(set(scope)) != len(scope):
            raise ValueError(f"cuda_graph_scope {scope!r}: a part is named twice")
        return self

    @model_validator(mode="after")
    def _check_recipe(self) -> TrainingSpec:
        r = self.low_precision_recipe
        if r is not None and PRECISION_RECIPES[r][0] != self.precision:
            raise ValueError(f"low_precision_recipe ({r}) needs precision "
                             f"{PRECISION_RECIPES[r][0]}, got {self.precision}")
        if r is None and self.precision in ("fp8", "fp4"):
            object.__setattr__(self, "low_precision_recipe",
                               PRECISION_RECIPES[self.precision][1])
        return self

    @property
    def precision_name(self) -> str:
        """The precision as the user names it: the recipe for fp8/fp4, else the dtype."""
        return self.low_precision_recipe or self.precision

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


#: ``--precision`` names of the low-precision recipes: name -> (GEMM dtype, recipe).
PRECISION_RECIPES = {
    "fp8": ("fp8", "fp8-delayed"),
    "fp8-delayed": ("fp8", "fp8-delayed"),
    "fp8-cs": ("fp8", "fp8-cs"),
    "fp8-block": ("fp8", "fp8-block"),
    "mxfp8": ("fp8", "mxfp8"),
    "fp4": ("fp4", "nvfp4"),
    "nvfp4": ("fp4", "nvfp4"),
}
PRECISIONS = ("fp32", "bf16", "fp16", *PRECISION_RECIPES)
#: The precisions a framework preset or a launch config names: the plain dtypes and each recipe
#: of :data:`PRECISION_RECIPES` once, by its own name (``fp8-delayed``, not the alias ``fp8``).
RECIPE_PRECISIONS = ("fp32", "bf16", "fp16", "fp8-cs", "fp8-delayed", "fp8-block", "mxfp8", "nvfp4")


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------
def _tier_label(data: Any, i: int) -> str:
    """``tier 1 (InfiniBand 'ib')`` for ``tiers.1`` of a cluster file's data."""
    kinds = {"nvlink": "NVLink", "infiniband": "InfiniBand", "roce": "RoCE",
             "ethernet": "Ethernet", "pcie": "PCIe", "gloo": "gloo", "other": "other"}
    try:
        t = data["tiers"][i]
        kind = kinds.get(str(t.get("kind")), str(t.get("kind", "")))
        return f"tier {i} ({kind} '{t['name']}')" if "name" in t else f"tier {i} ({kind})"
    except (TypeError, KeyError, IndexError, AttributeError):
        return f"tier {i}"


def _fields_at(cls: Any, loc: tuple) -> list[str]:
    """Field names of the (nested) spec class at ``loc`` (for 'did you mean')."""
    for part in loc:
        if isinstance(part, int) or cls is None:
            continue
        f = getattr(cls, "model_fields", {}).get(part)
        if f is None:
            return []
        ann = f.annotation
        cls = next((a for a in (ann, *getattr(ann, "__args__", ()))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if cls is None:
            for a in getattr(ann, "__args__", ()):
                cls = next((b for b in getattr(a, "__args__", ())
                            if isinstance(b, type) and issubclass(b, BaseModel)), None)
                if cls is not None:
                    break
    return list(getattr(cls, "model_fields", {})) if cls is not None else []


def format_validation_error(err: ValidationError, source: str = "", data: Any = None,
                            cls: Any = None) -> str:
    """One line naming the field, the value and what was expected.

    With the spec's ``data``, a cluster tier is named as ``tier 1 (InfiniBand 'ib')`` rather
    than ``tiers.1``; with its class ``cls``, an unknown key gets the closest field name.
    """
    parts = []
    for e in err.errors():
        locs = list(e["loc"])
        where = ""
        if len(locs) >= 2 and locs[0] == "tiers" and isinstance(locs[1], int):
            where, locs = _tier_label(data, locs[1]) + ": ", locs[2:]
        loc = ".".join(str(x) for x in locs) or "(spec)"
        msg = e["msg"]
        start = len(parts)
        if e["type"] == "extra_forbidden":
            key = str(e["loc"][-1])
            close = difflib.get_close_matches(key, _fields_at(cls, e["loc"][:-1]), n=1,
                                              cutoff=0.6) if cls is not None else []
            hint = f"; did you mean '{close[0]}'?" if close else ""
            parts.append(f"unknown key '{loc}' (value {shown(repr(e.get('input')), 100)}): not a field of this "
                         f"spec{hint}")
        elif e["type"] == "missing":
            parts.append(f"missing key '{loc}'")
        elif e["type"] in ("value_error", "assertion_error") and loc == "(spec)":
            msg = msg.removeprefix("Value error, ")
            if where and msg.startswith("tier '"):  # the label already names the tier
                msg = msg.split(": ", 1)[-1]
            parts.append(msg)
        elif e["type"] == "finite_number":
            parts.append(f"{loc} = {shown(repr(e.get('input')), 100)}: expected a finite number (not NaN or "
                         "infinity)")
        else:
            parts.append(f"{loc} = {shown(repr(e.get('input')), 100)}: {msg.removeprefix('Value error, ')}")
        parts[start:] = [where + x for x in parts[start:]]
    prefix = f"{source}: " if source else ""
    return shown(prefix + "; ".join(parts), limit=4000)  # one line, whatever the keys hold


def _tuples_from_lists(cls: type[Spec], data: Any) -> Any:
    """TOML and JSON have no tuples: a list given for a field declared as a tuple is one (strict
    validation would refuse it)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for name, f in cls.model_fields.items():
        v = out.get(name)
        if isinstance(v, list) and (
            get_origin(f.annotation) is tuple
            or any(get_origin(a) is tuple for a in get_args(f.annotation))
        ):
            out[name] = tuple(v)
    return out


def build_spec(cls: type[Spec], data: dict[str, Any], source: str) -> Any:
    """Validate what a file (or a dict) holds, strictly: no coercion, so ``gpus_per_node =
    true`` or ``num_nodes = "128"`` is an error naming the field, not 1 or 128 (an int is
    still accepted where a float is expected)."""
    try:
        return cls.model_validate(_tuples_from_lists(cls, data), strict=True)
    except ValidationError as err:
        raise SpecError(format_validation_error(err, source, data, cls)) from None


def read_toml(path: Path) -> dict[str, Any]:
    """The table a TOML file holds (size-bounded read; :class:`SpecError` naming the file if it
    cannot be read or parsed)."""
    return parse_toml(read_text_bounded(path, "TOML"), str(path))


def _read_preset(path: Path) -> dict[str, Any]:
    """A shipped preset file, parsed once per process (a copy: callers may change it)."""
    return copy.deepcopy(_parsed_preset(str(path)))


@functools.lru_cache(maxsize=256)
def _parsed_preset(path: str) -> dict[str, Any]:
    return read_toml(Path(path))


def spec_path(value: Any, what: str) -> Path:
    """``value`` as a path: :class:`SpecError` unless it is text or a path (``None``, a number
    or a list given as a model raised TypeError)."""
    value = getattr(value, "value", value)  # an Enum member
    if not isinstance(value, (str, Path)):
        raise SpecError(f"{what} = {shown(repr(value), 60)}: expected a preset name, a file path "
                        "or a spec object")
    if str(value) == "":
        raise SpecError(f"{what} '': expected a preset name or a file path")
    return Path(value)


def path_exists(p: Path) -> bool:
    """Whether ``p`` exists (False for a name the OS refuses, e.g. one over 255 bytes)."""
    try:
        return p.exists()
    except (OSError, ValueError):
        return False


def resolve_spec(kind: str, name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """Read a preset by name or a file by path; return (data, source label).

    A preset is a plain name of the shipped list (``llama3.1-8b``); anything else must be a
    path to an existing file (``./secret`` is never looked up among the presets)."""
    p = spec_path(name_or_path, kind)
    if p.suffix in (".toml", ".json") or path_exists(p):
        if not path_exists(p):
            raise SpecError(f"{kind} file '{shown(p)}' does not exist")
        if p.suffix == ".json":
            return parse_json(read_text_bounded(p, "JSON"), str(p)), str(p)
        return read_toml(p), str(p)
    name = str(name_or_path).lower()
    names = list_presets(kind)
    path = find_preset(kind, name) if name in names else None
    if path is None:
        if any(sep in name for sep in ("/", "\\")) or name.startswith("."):
            raise SpecError(f"{kind} '{shown(name_or_path)}': no such file, and not a preset name "
                            f"(see plan --list)")
        close = list(
            dict.fromkeys(
                [n for n in names if name in n]
                + difflib.get_close_matches(name[:200], names, n=3, cutoff=0.4)
            )
        )[:3]
        hint = f"; closest: {', '.join(close)}" if close else f"; known: {', '.join(names)}"
        raise SpecError(f"unknown {kind} preset '{shown(name_or_path)}'{hint}")
    return _read_preset(path), f"preset {kind} '{name}'"


def load_gpu(spec: str | Path | GPUSpec) -> GPUSpec:
    """A GPU from a preset name (``h100-sxm5-80gb``), a TOML path or a GPUSpec."""
    if isinstance(spec, GPUSpec):
        return spec
    data, src = resolve_spec("gpu", spec)
    return build_spec(GPUSpec, data, src)


def load_cluster(spec: str | Path | ClusterSpec, gpus: int | None = None) -> ClusterSpec:
    """A cluster from a preset name (``dgx-a100-80g``), a TOML path or a ClusterSpec.

    In a file, ``gpu`` is a GPU preset name or an inline table; ``num_nodes`` may be replaced by
    ``total_gpus``. ``gpus`` rescales the cluster (``--gpus N``): a shipped preset is a node
    type sized by ``gpus``; a file describes a cluster that exists, so ``gpus`` beyond what it
    holds (``num_nodes x gpus_per_node``) is refused.
    """
    src = None
    if isinstance(spec, ClusterSpec):
        cluster = spec
    else:
        data, src = resolve_spec("cluster", spec)
        data = dict(data)
        gpu = data.get("gpu")
        if isinstance(gpu, str):
            data["gpu"] = load_gpu(gpu)
        elif isinstance(gpu, dict):
            data["gpu"] = build_spec(GPUSpec, gpu, f"{src} [gpu]")
        if "total_gpus" in data:
            total = data.pop("total_gpus")
            gpn = data.get("gpus_per_node", 1)
            if (not isinstance(total, int) or isinstance(total, bool) or total <= 0
                    or not isinstance(gpn, int) or isinstance(gpn, bool) or total % gpn):
                raise SpecError(
                    f"{src}: total_gpus ({total}) must be a positive multiple of gpus_per_node ({gpn})"
                )
            data["num_nodes"] = total // gpn
        cluster = build_spec(ClusterSpec, data, src)
    if gpus is not None:
        if src is not None and not src.startswith("preset ") and gpus > cluster.total_gpus:
            raise SpecError(
                f"gpus ({gpus}) exceeds what cluster file '{shown(src)}' holds: num_nodes "
                f"({cluster.num_nodes}) x gpus_per_node ({cluster.gpus_per_node}) = "
                f"{cluster.total_gpus} GPUs")
        cluster = cluster.with_gpus(gpus)
    return cluster


_HF_ACT = {
    "silu": "swiglu",
    "swiglu": "swiglu",
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu",
    "relu2": "relu2",
}


def _hf_moe_fields(data: dict[str, Any]) -> dict[str, Any]:
    """MoE and MLA fields of a Hugging Face config (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3,
    GPT-OSS, Llama 4 text config); empty for a dense model.

    Keys: experts ``num_local_experts`` (Mixtral, GPT-OSS, Llama 4), ``num_experts`` (Qwen),
    ``n_routed_experts`` (DeepSeek); top-k ``num_experts_per_tok`` / ``experts_per_token``;
    expert FFN ``moe_intermediate_size`` (Qwen, DeepSeek; Mixtral, GPT-OSS and Llama 4 use
    ``intermediate_size``, Llama 4 its dense layers ``intermediate_size_mlp``); shared experts
    ``n_shared_experts`` (DeepSeek), ``shared_expert_intermediate_size`` (Qwen2-MoE), one for
    Llama 4; dense leading layers ``first_k_dense_replace`` and ``moe_layer_freq`` (DeepSeek),
    ``decoder_sparse_step`` (Qwen), ``interleave_moe_layer_step`` (Llama 4); MLA ranks
    ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``.
    """
    out: dict[str, Any] = {}
    e = data.get("num_local_experts") or data.get("num_experts") or data.get("n_routed_experts")
    mt = str(data.get("model_type", ""))
    if e and int(e) > 1:
        out["num_experts"] = int(e)
        out["moe_top_k"] = int(data.get("num_experts_per_tok") or data.get("experts_per_token")
                               or 1)
        if data.get("moe_intermediate_size"):
            out["moe_ffn_hidden_size"] = int(data["moe_intermediate_size"])
        if mt.startswith("llama4"):
            out["ffn_hidden_size"] = int(data.get("intermediate_size_mlp")
                                         or data["intermediate_size"])
            out["moe_ffn_hidden_size"] = int(data["intermediate_size"])
            out["num_shared_experts"] = 1  # Llama4TextMoe.shared_expert
            out["moe_layer_freq"] = int(data.get("interleave_moe_layer_step") or 1)
        if data.get("n_shared_experts"):
            out["num_shared_experts"] = int(data["n_shared_experts"])
        if data.get("shared_expert_intermediate_size"):
            out["num_shared_experts"] = 1
            out["moe_shared_ffn_hidden_size"] = int(data["shared_expert_intermediate_size"])
        if data.get("first_k_dense_replace"):
            out["moe_dense_layers"] = int(data["first_k_dense_replace"])
        freq = data.get("moe_layer_freq") or data.get("decoder_sparse_step")
        if isinstance(freq, int) and freq > 1:
            out["moe_layer_freq"] = freq
        if mt == "gpt_oss":
            out["moe_router_bias"] = True
    window = data.get("sliding_window")
    types = data.get("layer_types") or []
    if data.get("use_sliding_window") is False:  # Qwen2/Qwen3 configs name one and disable it
        window = None
    if isinstance(window, int) and window > 0 and (not types or "sliding_attention" in types):
        out["attention_window"] = int(window)
        n_full = sum(t == "full_attention" for t in types)
        if n_full:  # HF layer_types: every n-th layer full (GPT-OSS: sliding, full, ...)
            out["window_attn_skip_freq"] = max(1, round(len(types) / n_full))
    if data.get("kv_lora_rank"):
        out["kv_lora_rank"] = int(data["kv_lora_rank"])
        if data.get("q_lora_rank"):
            out["q_lora_rank"] = int(data["q_lora_rank"])
        out["head_dim"] = int(data["qk_nope_head_dim"])
        out["qk_rope_head_dim"] = int(data.get("qk_rope_head_dim") or 0)
        out["v_head_dim"] = int(data["v_head_dim"])
    return out


_HF_INT_KEYS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "max_position_embeddings", "num_local_experts",
    "num_experts_per_tok", "n_layer", "n_embd", "n_head", "n_inner", "n_positions",
    # MoE / MLA keys (_hf_moe_fields)
    "num_experts", "n_routed_experts", "experts_per_token", "moe_intermediate_size",
    "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace",
    "intermediate_size_mlp", "interleave_moe_layer_step", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
)
_HF_BOOL_KEYS = ("tie_word_embeddings", "attention_bias")


def _hf_check_types(data: dict[str, Any], name: str) -> None:
    """Refuse a config.json value of the wrong JSON type, naming the file's own key: a string
    ``"n_embd": "768"`` would otherwise give an FFN of ``4 * "768"`` = 768768768768."""
    for key in _HF_INT_KEYS:
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SpecError(f"{name}: {key} = {shown(repr(v), 40)}: expected an integer")
    for key in _HF_BOOL_KEYS:
        v = data.get(key)
        if v is not None and not isinstance(v, bool):
            raise SpecError(f"{name}: {key} = {shown(repr(v), 40)}: expected true or false")
    v = data.get("rope_theta", 10000.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(f"{name}: rope_theta = {shown(repr(v), 40)}: expected a number")
    v = data.get("layer_types")
    if v is not None and not (isinstance(v, list) and all(isinstance(t, str) for t in v)):
        raise SpecError(f"{name}: layer_types = {shown(v, 40)}: expected a list of strings")


def model_from_hf_config(data: dict[str, Any], name: str = "hf-model") -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` dict (Llama-style or GPT-2-style keys;
    MoE and MLA keys of Mixtral, Qwen3-MoE, DeepSeek-V3, GPT-OSS, Llama 4: see
    :func:`_hf_moe_fields`). A multimodal config's ``text_config`` is what is read."""
    name = plain_name(name, "model name")
    if not isinstance(data, dict):
        raise SpecError(f"{name}: a Hugging Face config is a JSON object, not "
                        f"{type(data).__name__} {shown(data, 40)}")
    if isinstance(data.get("text_config"), dict) and "num_hidden_layers" not in data:
        data = data["text_config"]
    _hf_check_types(data, name)
    try:
        fields = _hf_fields(data, name)
    except KeyError as err:
        raise SpecError(f"{name}: missing key {shown(err.args[0])!r}") from None
    return build_spec(ModelSpec, fields, name)


def _hf_fields(data: dict[str, Any], name: str) -> dict[str, Any]:
    """ModelSpec fields of a (type-checked) Hugging Face config."""
    if "num_hidden_layers" in data:  # Llama / Mistral / Qwen style
        act = data.get("hidden_act", "silu")
        if not isinstance(act, str) or act not in _HF_ACT:
            raise SpecError(f"{name}: hidden_act = {shown(repr(act), 40)}: expected one of "
                            f"{sorted(_HF_ACT)}")
        fields = {
            "name": name,
            "num_layers": data["num_hidden_layers"],
            "hidden_size": data["hidden_size"],
            "num_attention_heads": data["num_attention_heads"],
            "num_kv_heads": data.get("num_key_value_heads"),
            "head_dim": data.get("head_dim"),
            "ffn_hidden_size": data["intermediate_size"],
            "vocab_size": data["vocab_size"],
            "max_seq_len": data.get("max_position_embeddings", 4096),
            "activation": _HF_ACT[act],
            "norm": "rmsnorm" if "rms_norm_eps" in data else "layernorm",
            "position_embedding": "rope",
            "tied_embeddings": bool(data.get("tie_word_embeddings", False)),
            "linear_bias": bool(data.get("attention_bias", False)),
            # Qwen2 has q/k/v biases and no attention_bias key (transformers' Qwen2Attention)
            "qkv_bias": data.get("model_type") == "qwen2" and "attention_bias" not in data,
            "rope_base": float(data.get("rope_theta", 10000.0)),
        }
        fields.update(_hf_moe_fields(data))
        if data.get("hybrid_override_pattern") is not None:  # Nemotron-H / Nemotron-3

            fields.update(hf_hybrid_fields(data, name))
    elif "n_layer" in data:  # GPT-2 style
        h = data["n_embd"]
        fields = {
            "name": name,
            "num_layers": data["n_layer"],
            "hidden_size": h,
            "num_attention_heads": data["n_head"],
            "ffn_hidden_size": data.get("n_inner") or 4 * h,
            "vocab_size": data["vocab_size"],
            "max_seq_len": data.get("n_positions", 1024),
            "activation": "gelu",
            "norm": "layernorm",
            "position_embedding": "learned",
            "tied_embeddings": bool(data.get("tie_word_embeddings", True)),
            "linear_bias": True,
        }
    else:
        raise SpecError(
            f"{name}: not a recognised Hugging Face config (need num_hidden_layers or n_layer)"
        )
    return fields


def load_model(spec: str | Path | ModelSpec) -> ModelSpec:
    """A model from a preset name (``gpt3-175b``), a TOML path, or a HF ``config.json`` path."""
    if isinstance(spec, ModelSpec):
        return spec
    data, src = resolve_spec("model", spec)
    if Path(str(spec)).suffix == ".json":
        p = Path(str(spec))
        label = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
        plain_name(label, f"{shown(src)}: model name (the file's folder)")
        return model_from_hf_config(data, name=label or "hf-model")
    return build_spec(ModelSpec, data, src)


def _plain_value(v: Any) -> Any:
    """An Enum member as its value, a numpy scalar (``np.int64(16)``) as the Python number."""
    v = getattr(v, "value", v)
    return v.item() if isinstance(v, np.generic) else v


def load_training(spec: str | Path | TrainingSpec | dict | None = None, **overrides) -> TrainingSpec:
    """A training setup from a TOML path, a dict or defaults, with keyword overrides."""
    if isinstance(spec, TrainingSpec):
        data = spec.model_dump()
    elif spec is None:
        data = {}
    elif isinstance(spec, dict):
        data = dict(spec)
    else:
        data = read_toml(spec_path(spec, "training"))
    data.update({k: _plain_value(v) for k, v in overrides.items() if v is not None})
    return build_spec(TrainingSpec, data, "training")
