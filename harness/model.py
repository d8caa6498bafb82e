"""A small GPT-style decoder built from a :class:`~perfmodel.spec.specs.ModelSpec`.

The layer structure follows the spec exactly, so the planner's parameter, FLOP, memory and
communication formulas apply to it unchanged:

* attention with a fused, *group-major* QKV projection: for each key/value head ``g`` the rows are
  ``[q heads of group g (n_rep * head_dim), k_g (head_dim), v_g (head_dim)]``. A column-parallel
  shard over ``tp`` (``tp`` dividing ``num_kv_heads``) therefore holds whole groups, and the block
  needs one input-gradient all-reduce for Q, K and V together (Megatron-LM's 2 all-reduces per
  attention, Shoeybi et al. 2019, Sec. 3); GQA when ``num_kv_heads < num_attention_heads``;
* MLP ``gelu`` / ``relu2`` (two matrices) or ``swiglu`` (gate and up fused in one matrix with
  interleaved rows, so any row shard holds matching gate/up pairs);
* ``layernorm`` or ``rmsnorm``; ``learned`` or ``rope`` positions; biases per ``linear_bias``;
* tied embeddings are *not* shared parameters: as in Megatron-LM, the last stage holds its own
  copy of the embedding matrix initialised equal, and the worker sums the two gradients
  (:func:`tied_pairs`), which keeps the two copies identical through training.

Layers live in an ``nn.ModuleDict`` keyed ``"0" .. "L-1"`` so that a pipeline stage is made by
deleting the layers it does not own (:func:`make_stage`); embeddings are ``None`` off the first
stage and the final norm and head ``None`` off the last one.

References
----------
Radford et al. 2019 (GPT-2); Shoeybi et al. 2019, "Megatron-LM", Sec. 3 (tensor-parallel layout);
Ainslie et al. 2023, "GQA"; Shazeer 2020, "GLU variants" (SwiGLU); Su et al. 2021 (RoPE).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from perfmodel.spec.specs import ModelSpec

__all__ = ["Block", "TinyGPT", "build_model", "make_stage", "tied_pairs", "tiny_spec"]


def tiny_spec(
    *,
    num_layers: int = 4,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    num_kv_heads: int | None = None,
    ffn_hidden_size: int | None = None,
    vocab_size: int = 256,
    seq_len: int = 32,
    activation: str = "gelu",
    norm: str = "layernorm",
    position_embedding: str = "learned",
    tied_embeddings: bool = False,
    linear_bias: bool = True,
    name: str = "harness-tiny",
) -> ModelSpec:
    """The harness's default tiny model (4 layers, hidden 64, 4 heads, vocab 256, seq 32).

    Untied embeddings by default: a tied model on one pipeline stage would hold the second copy
    the harness uses for tying (see the module docstring), which the planner does not count.
    """
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_kv_heads=num_kv_heads,
        ffn_hidden_size=ffn_hidden_size or 4 * hidden_size,
        vocab_size=vocab_size,
        max_seq_len=seq_len,
        activation=activation,
        norm=norm,
        position_embedding=position_embedding,
        tied_embeddings=tied_embeddings,
        linear_bias=linear_bias,
    )


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5)


def _rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding on ``x`` of shape (B, H, T, hd), rotate-half convention."""
    t, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(t, dtype=torch.float32), inv)  # (T, hd/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    """Causal self-attention with fused group-major QKV (GQA when kv_heads < heads)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, hd = spec.hidden_size, spec.head_size
        self.hd = hd
        self.n_rep = spec.num_attention_heads // spec.kv_heads
        self.rope = spec.position_embedding == "rope"
        self.selective = False  # set by set_recompute("selective")
        rows = (spec.num_attention_heads + 2 * spec.kv_heads) * hd
        self.qkv = nn.Linear(h, rows, bias=spec.linear_bias)
        # row-parallel output: its bias is added after the tensor-parallel reduction (Megatron
        # RowParallelLinear), so it is a separate parameter outside the sharded linear
        self.o = nn.Linear(spec.num_attention_heads * hd, h, bias=False)
        self.o_bias = nn.Parameter(torch.zeros(h)) if spec.linear_bias else None

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.rope:
            q, k = _rope(q), _rope(k)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_rep > 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 = local kv-group count (all groups, or this tensor-parallel rank's share)
        g = self.qkv(x).view(b, t, -1, self.n_rep + 2, self.hd)
        q = g[:, :, :, : self.n_rep].reshape(b, t, -1, self.hd).transpose(1, 2)
        k = g[:, :, :, self.n_rep].transpose(1, 2)
        v = g[:, :, :, self.n_rep + 1].transpose(1, 2)
        if self.selective:  # Korthikanti et al. 2022: recompute only the core attention
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        out = self.o(y.transpose(1, 2).reshape(b, t, -1))
        return out if self.o_bias is None else out + self.o_bias


class MLP(nn.Module):
    """``fc1`` -> activation -> ``fc2``; for swiglu ``fc1`` holds gate/up rows interleaved."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, f = spec.hidden_size, spec.ffn_hidden_size
        self.act = spec.activation
        self.fc1 = nn.Linear(h, 2 * f if spec.gated_mlp else f, bias=spec.linear_bias)
        self.fc2 = nn.Linear(f, h, bias=False)  # row-parallel: bias added after the reduction
        self.fc2_bias = nn.Parameter(torch.zeros(h)) if spec.linear_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        if self.act == "swiglu":
            gate, up = y.view(*y.shape[:-1], -1, 2).unbind(-1)
            y = F.silu(gate) * up
        elif self.act == "relu2":
            y = F.relu(y).square()
        else:
            y = F.gelu(y, approximate="tanh")
        out = self.fc2(y)
        return out if self.fc2_bias is None else out + self.fc2_bias


class Block(nn.Module):
    """Pre-norm transformer block; ``full`` recompute checkpoints the whole block."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.ln1 = _norm(spec)
        self.attn = Attention(spec)
        self.ln2 = _norm(spec)
        self.mlp = MLP(spec)
        self.full_recompute = False

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and torch.is_grad_enabled():
            # the whole block is recomputed, its last collective included, as Megatron-LM's
            # full recompute does (torch's default non-reentrant checkpoint stops early, after
            # the last tensor the backward needs, skipping the final reduction)
            with set_checkpoint_early_stop(False):
                return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


class TinyGPT(nn.Module):
    """Decoder-only transformer following ``spec``; tokens (B, T) -> logits (B, T, V)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.tok = nn.Embedding(spec.vocab_size, h)
        self.pos = (
            nn.Embedding(spec.max_seq_len, h) if spec.position_embedding == "learned" else None
        )
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.num_layers)})
        self.norm = _norm(spec)
        self.head = nn.Linear(h, spec.vocab_size, bias=False)
        self.seq_scatter = None  # sequence parallel: callable splitting the embeddings (apply_tp)
        self._init_weights(spec)
        if spec.tied_embeddings:
            with torch.no_grad():
                self.head.weight.copy_(self.tok.weight)

    def _init_weights(self, spec: ModelSpec) -> None:
        """GPT-2 init: N(0, 0.02), output projections scaled by 1/sqrt(2L), zero biases."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = (
                0.02 / math.sqrt(2 * spec.num_layers)
                if name.endswith(("o.weight", "fc2.weight"))
                else 0.02
            )
            nn.init.normal_(p, 0.0, std)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:  # first stage: token ids -> hidden
            t = x.shape[1]
            h = self.tok(x)
            if self.pos is not None:
                h = h + self.pos(torch.arange(t, device=x.device))
            # Megatron-SP: split the summed embeddings along the sequence (set by apply_tp)
            x = h if self.seq_scatter is None else self.seq_scatter(h)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is not None:  # last stage: hidden -> logits
            x = self.head(self.norm(x))
        return x


def set_recompute(model: nn.Module, mode: str) -> None:
    """Activation recompute ``none`` / ``selective`` (core attention) / ``full`` (whole block)."""
    if mode not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be none, selective or full (got {mode!r})")
    for m in model.modules():
        if isinstance(m, Block):
            m.full_recompute = mode == "full"
        if isinstance(m, Attention):
            m.selective = mode == "selective"


def build_model(spec: ModelSpec, seed: int = 0) -> TinyGPT:
    """The full model with a deterministic fp32 initialisation (same on every rank)."""
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(seed)
        return TinyGPT(spec)


def make_stage(full: TinyGPT, stage: int, num_stages: int) -> TinyGPT:
    """A copy of ``full`` holding only pipeline stage ``stage`` of ``num_stages`` (equal layers)."""
    m = copy.deepcopy(full)
    per = len(m.layers) // num_stages
    for k in list(m.layers.keys()):
        if not stage * per <= int(k) < (stage + 1) * per:
            del m.layers[k]
    if stage != 0:
        m.tok = None
        m.pos = None
    if stage != num_stages - 1:
        m.norm = None
        m.head = None
    return m


def tied_pairs(stage_modules: list[TinyGPT]) -> tuple[nn.Parameter | None, nn.Parameter | None]:
    """(input embedding weight, output head weight) held by these local stage modules, or None."""
    emb = next((m.tok.weight for m in stage_modules if m.tok is not None), None)
    head = next((m.head.weight for m in stage_modules if m.head is not None), None)
    return emb, head
