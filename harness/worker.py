"""One torchrun rank of the execution harness: build, parallelize, train a few steps, measure.

Run by :mod:`harness.launch` as
``python -m torch.distributed.run --standalone --nproc-per-node N -m harness.worker --config C --out D``.
The job description ``C`` is a JSON file (see :func:`harness.launch.job_spec`)::

    {"parallel": {dp, tp, pp, vp, cp, zero_stage, micro_batch_size, num_microbatches,
                  recompute, sequence_parallel, schedule},
     "model": {...ModelSpec fields...},
     "training": {"global_batch_size": B, "seq_len": T},
     "harness": {"seed", "lr", "warmup_steps", "timed_steps", "dp_impl", "backend",
                 "inject": {"rank", "kind": "fail" | "hang"}}}

Composition (torchtitan's order, one named step each, per pipeline stage module):

1. mesh ``(pp, dp, tp)`` (rank = tp_rank + tp * (dp_rank + dp * pp_rank), Megatron's order);
2. the full model is built on every rank from the same seed, cut into pipeline stages;
3. recompute flags (``full``: whole block checkpointed, ``selective``: core attention);
4. tensor parallel on ``mesh["tp"]`` (Colwise QKV / fc1, Rowwise o / fc2, vocab-parallel
   embedding and head, Megatron sequence parallel over the norms when ``sequence_parallel``);
5. data parallel on ``mesh["dp"]``: ZeRO-0 DDP, ZeRO-1 ``ZeroRedundancyOptimizer`` (+ DDP),
   ZeRO-2 / ZeRO-3 FSDP2 ``fully_shard(reshard_after_forward=False / True)`` in units of about
   40 M parameters (buckets), gradients reduce-scattered every micro-batch; with tensor-parallel
   (DTensor) parameters DDP and ZeroRedundancyOptimizer do not work, so ZeRO-0/1 use the
   ``flat`` implementation here (one flat all-reduce, or reduce-scatter + sharded AdamW +
   all-gather), which ``dp_impl="flat"`` selects everywhere;
6. ``PipelineStage`` per local stage and a schedule (GPipe, 1F1B, Interleaved1F1B, zero bubble).

Every rank writes ``rank_<r>.json`` before the mandatory ending ``barrier(); destroy_process_group();
os._exit(0)`` (gloo threads otherwise abort the interpreter at exit now and then), or
``rank_<r>.error.json`` with the traceback and exits 1.
"""

from __future__ import annotations

if __name__ == "__main__":  # a rank: watch the launcher before the slow torch import
    from harness.watchdog import start_parent_watchdog

    start_parent_watchdog()  # no rank outlives its launcher (or torchrun) by more than 0.5 s

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

T_START = time.perf_counter()

import torch
import torch.distributed as dist
import torch.distributed.pipelining
import torch.distributed.tensor.parallel
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard  # noqa: F401

from harness.measure import CommMeter, PeakMemMeter
from harness.model import TinyGPT, build_model, make_stage, set_recompute, tied_pairs
from harness.watchdog import process_start_ticks
from perfmodel.memory.breakdown import BUCKET_PARAMS
from perfmodel.spec.specs import ModelSpec

T_IMPORTED = time.perf_counter()

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")


class ConfigRefused(ValueError):
    """A configuration the harness will not run (known broken in torch, or not supported)."""


# ------------------------------------------------------------------------------------------------
# Checks that need no process group (also used by launch.py before spawning anything)
# ------------------------------------------------------------------------------------------------
def dp_implementation(par: dict, dp_impl: str = "auto") -> str:
    """``ddp``/``zero1-torch``/``flat0``/``flat1``/``fsdp-zero2``/``fsdp-zero3``/``none``."""
    dp, tp, zero = par["dp"], par["tp"], par["zero_stage"]
    if dp == 1:
        return "none"
    if zero >= 2:
        return f"fsdp-zero{zero}"
    if zero == 1 and dp_impl == "torch" and tp == 1:
        return "zero1-torch"
    if dp_impl == "flat" or tp > 1 or zero == 1:
        return f"flat{zero}"
    return "ddp"


def check_config(
    par: dict, spec: ModelSpec, global_batch: int, seq_len: int, dp_impl: str = "auto"
) -> None:
    """Raise :class:`ConfigRefused` with a one-line reason for a configuration the harness refuses."""
    dp, tp, pp, vp, cp = par["dp"], par["tp"], par["pp"], par.get("vp", 1), par.get("cp", 1)
    sched = par.get("schedule", "1f1b")
    if cp != 1:
        raise ConfigRefused(f"cp ({cp}) > 1 is not implemented by the harness")
    if par.get("grad_compression", "none") != "none":
        raise ConfigRefused("gradient compression is not implemented by the harness")
    if sched not in SCHEDULES:
        raise ConfigRefused(f"schedule {sched!r} must be one of {SCHEDULES}")
    if spec.kv_heads % tp:
        raise ConfigRefused(f"tp ({tp}) must divide num_kv_heads ({spec.kv_heads}) in the harness")
    if spec.ffn_hidden_size % tp or spec.vocab_size % tp:
        raise ConfigRefused(
            f"tp ({tp}) must divide ffn_hidden_size ({spec.ffn_hidden_size}) and vocab_size "
            f"({spec.vocab_size})"
        )
    if spec.num_layers % (pp * vp):
        raise ConfigRefused(f"pp*vp ({pp}*{vp}) must divide num_layers ({spec.num_layers})")
    if par.get("sequence_parallel") and (seq_len % tp or spec.max_seq_len % tp):
        raise ConfigRefused(f"tp ({tp}) must divide seq_len ({seq_len}) for sequence_parallel")
    if spec.position_embedding == "learned" and spec.max_seq_len < seq_len:
        raise ConfigRefused(f"max_seq_len ({spec.max_seq_len}) < seq_len ({seq_len})")
    mbs, nmb = par["micro_batch_size"], par["num_microbatches"]
    if dp * mbs * nmb != global_batch:
        raise ConfigRefused(
            f"dp*micro_batch_size*num_microbatches ({dp}*{mbs}*{nmb}) must equal "
            f"global_batch_size ({global_batch})"
        )
    impl = dp_implementation(par, dp_impl)
    if sched == "zb" and impl in ("ddp", "zero1-torch"):
        raise ConfigRefused(
            "zero-bubble schedules crash with DDP in torch (pytorch issue 144530: 'rebuilt "
            "parameter indices size is not same as original model parameters size'); use "
            "dp_impl='flat' or ZeRO-2"
        )
    if sched == "zb" and impl == "fsdp-zero3":
        raise ConfigRefused(
            "zero-bubble schedules with FSDP2 reshard_after_forward=True (ZeRO-3) run but train "
            "wrongly in torch 2.13 (pytorch issue 164756); use ZeRO-2 or flat DP"
        )
    if sched == "interleaved" and vp < 2:
        raise ConfigRefused("schedule 'interleaved' needs vp >= 2")
    if sched != "interleaved" and vp != 1:
        raise ConfigRefused(f"vp ({vp}) > 1 needs schedule 'interleaved'")
    if pp == 1 and sched in ("interleaved", "zb"):
        raise ConfigRefused(f"schedule {sched!r} needs pp > 1")


def stage_ids(schedule: str, pp: int, vp: int, pp_rank: int) -> tuple[list[int], int]:
    """Pipeline stages held by ``pp_rank`` and the total stage count."""
    if schedule == "interleaved":
        return [pp_rank + k * pp for k in range(vp)], pp * vp
    return [pp_rank], pp


# ------------------------------------------------------------------------------------------------
# Parallelization steps
# ------------------------------------------------------------------------------------------------
def apply_tp(m: TinyGPT, tp_mesh, sp: bool) -> list[str]:
    """Megatron tensor parallel (+ sequence parallel) with torch.distributed.tensor.parallel.

    As Megatron-LM (Shoeybi et al. 2019; Korthikanti et al. 2022; ``megatron/core``):

    * QKV and ``fc1`` column-parallel, ``o`` and ``fc2`` row-parallel, their biases added after
      the reduction (all-reduce, or reduce-scatter with sequence parallelism);
    * word embedding vocabulary-parallel with its output all-reduced; learned positions
      replicated and added after it; with sequence parallelism the sum is split along the
      sequence (no communication forward, an all-gather of its gradient backward:
      ``scatter_to_sequence_parallel_region``);
    * output layer column-parallel over the vocabulary, logits left sharded for the
      vocabulary-parallel cross-entropy (:func:`vocab_parallel_cross_entropy`);
    * with sequence parallelism the norms (and the row-parallel biases) run on the local
      sequence slice as plain modules; their gradients are partial sums, all-reduced over tp
      once per step (:func:`allreduce_sequence_parallel_grads`, Megatron's
      ``_allreduce_layernorm_grads``).

    Returns the names (in ``m``) of the parameters whose gradients need that all-reduce.
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    if sp:
        block_plan = {
            "attn": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "attn.qkv": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            "mlp": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "mlp.fc1": ColwiseParallel(),
            "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
        }
    else:
        block_plan = {
            "attn.qkv": ColwiseParallel(),
            "attn.o": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(),
            "mlp.fc2": RowwiseParallel(),
        }
    for b in m.layers.values():
        parallelize_module(b, tp_mesh, block_plan)
    plan = {}
    if m.tok is not None:
        m.tok = VocabParallelEmbedding(m.tok, tp_mesh.get_group())
        if sp:

            def seq_scatter(x: torch.Tensor) -> torch.Tensor:
                d = DTensor.from_local(x, tp_mesh, [Replicate()], run_check=False)
                return d.redistribute(tp_mesh, [Shard(1)]).to_local()

            m.seq_scatter = seq_scatter
    if m.head is not None:
        plan["head"] = ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1)
        )
    if plan:
        parallelize_module(m, tp_mesh, plan)
    if not sp:
        return []
    return [
        n
        for n, _ in m.named_parameters()
        if ".ln1." in n
        or ".ln2." in n
        or n.endswith(("o_bias", "fc2_bias"))
        or n.startswith("norm.")
    ]


class _ReduceFromTP(torch.autograd.Function):
    """Megatron ``reduce_from_tensor_model_parallel_region``: all-reduce (sum) forward,
    identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class VocabParallelEmbedding(torch.nn.Module):
    """Megatron-LM's ``VocabParallelEmbedding``: this rank's ``V/tp`` rows of the table as a
    plain local parameter; token ids outside the slice give zero rows; the partial outputs are
    all-reduced over tp. Its gradient is the local ``(V/tp, h)`` slice (torch's
    ``RowwiseParallel`` embedding produces a replicated full-vocabulary ``(V, h)`` gradient
    instead, which Megatron never holds)."""

    def __init__(self, emb: torch.nn.Embedding, group) -> None:
        super().__init__()
        n, r = dist.get_world_size(group), dist.get_rank(group)
        v = emb.weight.shape[0]
        self.group, self.start, self.rows = group, r * (v // n), v // n
        self.weight = torch.nn.Parameter(
            emb.weight.detach()[self.start : self.start + self.rows].clone()
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside[..., None], 0.0)
        return _ReduceFromTP.apply(out, self.group)


class _VocabParallelCE(torch.autograd.Function):
    """Cross-entropy over vocabulary-sharded logits (Megatron ``vocab_parallel_cross_entropy``):
    three all-reduces of one fp32 value per token over tp (max, target logit, sum of exp)."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        v_local = logits.shape[-1]
        lmax = logits.detach().max(dim=-1).values
        dist.all_reduce(lmax, op=dist.ReduceOp.MAX, group=group)
        z = logits - lmax[:, None]
        local = target - vocab_start
        outside = (local < 0) | (local >= v_local)
        idx = local.clamp(0, v_local - 1)
        pred = z.gather(1, idx[:, None]).squeeze(1).masked_fill(outside, 0.0)
        dist.all_reduce(pred, group=group)
        e = z.exp()
        sum_e = e.sum(dim=-1)
        dist.all_reduce(sum_e, group=group)
        ctx.save_for_backward(e.div_(sum_e[:, None]), idx, outside)
        return (sum_e.log() - pred).mean()

    @staticmethod
    def backward(ctx, g):
        softmax, idx, outside = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0])
        grad[rows, idx] -= (~outside).to(grad.dtype)
        return grad * (g / grad.shape[0]), None, None, None


def vocab_parallel_cross_entropy(logits, target, group) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (B, T, V/tp), this rank's vocabulary slice."""
    v_local = logits.shape[-1]
    start = dist.get_rank(group) * v_local
    return _VocabParallelCE.apply(
        logits.reshape(-1, v_local).float(), target.reshape(-1), group, start
    )


def allreduce_sequence_parallel_grads(params: list, group) -> None:
    """Sum the partial (sequence-slice) gradients of sequence-parallel replicated parameters
    over tp: one coalesced all-reduce per step (Megatron ``_allreduce_layernorm_grads``).
    With sharded gradients (ZeRO-2/3) each rank reduces its shard: the sums commute."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    off = 0
    for g in grads:
        g.copy_(flat[off : off + g.numel()].view_as(g))
        off += g.numel()


def apply_dp(m: TinyGPT, impl: str, dp_mesh):
    """Wrap one stage module for data parallelism; returns the module to run."""
    if impl.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard


        reshard = impl == "fsdp-zero3"
        # FSDP units sized like Megatron-LM / DeepSpeed communication buckets (40 M
        # parameters; torchtitan wraps every layer): runs of consecutive layers of at least
        # BUCKET_PARAMS each, the rest (the whole stage of a small model) in the root unit
        group, size = [], 0
        for b in m.layers.values():
            group.append(b)
            size += sum(_local(p).numel() for p in b.parameters())
            if size >= BUCKET_PARAMS:
                fully_shard(group, mesh=dp_mesh, reshard_after_forward=reshard)
                group, size = [], 0
        fully_shard(m, mesh=dp_mesh, reshard_after_forward=reshard)
        m._harness_zero3 = reshard
        return m
    if impl in ("ddp", "zero1-torch"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(m, process_group=dp_mesh.get_group(), broadcast_buffers=False)
    return m


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


class FlatDP:
    """Data parallelism over local (TP-sharded) tensors: ZeRO-0 all-reduce or ZeRO-1.

    ZeRO-0: the gradients are copied into one flat buffer (DDP's bucket copy,
    ``gradient_as_bucket_view=False``), all-reduced (average) and copied back.

    ZeRO-1 as Megatron-LM's distributed optimizer (Rajbhandari et al. 2020, Sec. 5.1, P_os):
    gradients accumulate into one contiguous fp32 buffer (Megatron's ``main_grad``: a
    post-accumulate hook adds each gradient to its slice and frees it), which is reduce-scattered
    (average) in place; AdamW updates this rank's ``1/dp`` slice of the parameters directly (fp32
    parameters need no master copy); the updated slices are all-gathered into the same buffer
    (its gradients are no longer needed) and copied into the parameters. Sends
    2 (dp-1)/dp * P bytes per rank, as the all-reduce.
    """

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        zero: int,
        group,
        opt_kwargs: dict,
        keep_grads: list[torch.nn.Parameter] = (),
    ):
        # keep_grads: parameters whose .grad is still needed after the backward (tp all-reduce of
        # sequence-parallel gradients, tied embeddings); added to the buffer in step()
        self.keep = {id(p) for p in keep_grads}
        self.params = params
        self.zero = zero
        self.group = group
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        numel = sum(_local(p).numel() for p in params)
        self.padded = math.ceil(numel / self.n) * self.n
        self.numel = numel
        if zero != 1:
            self.opt = torch.optim.AdamW(params, **opt_kwargs)
            return
        self.buf = torch.zeros(self.padded, dtype=torch.float32)
        chunk = self.padded // self.n
        lo, hi = self.rank * chunk, (self.rank + 1) * chunk
        self.slices = []  # (param slice as a Parameter sharing storage, buffer offset)
        off = 0
        for p in params:
            lp = _local(p)
            a, b = max(lo, off), min(hi, off + lp.numel())
            if a < b:
                view = lp.detach().view(-1)[a - off : b - off]
                self.slices.append((torch.nn.Parameter(view), a - lo))
            if id(p) not in self.keep:
                p.register_post_accumulate_grad_hook(self._make_hook(off))
            off += lp.numel()
        self.opt = torch.optim.AdamW([sl for sl, _ in self.slices], **opt_kwargs)

    def _make_hook(self, off: int):
        def hook(p: torch.nn.Parameter) -> None:
            g = p.grad
            if hasattr(g, "placements") and g.placements != p.placements:
                g = g.redistribute(p.device_mesh, p.placements)
            g = _local(g)
            self.buf[off : off + g.numel()].add_(g.reshape(-1))
            p.grad = None

        return hook

    def absorb_grads(self) -> None:
        """Add every gradient the autograd hooks did not see to the buffer and free it.

        torch's zero-bubble weight backward (``stage_backward_weight``) assigns ``.grad``
        directly, so the post-accumulate hooks do not run; Megatron-LM's zero-bubble weight pass
        (``WeightGradStore``) accumulates straight into ``main_grad``. Called after each weight
        backward. Kept gradients (sequence-parallel norms, tied embeddings) stay in ``.grad``."""
        off = 0
        for p in self.params:
            if p.grad is not None and id(p) not in self.keep:
                self._make_hook(off)(p)
            off += _local(p).numel()

    def _grads(self) -> list[torch.Tensor]:
        for p in self.params:  # a DTensor grad may come in another placement than its
            # parameter (the vocabulary-parallel embedding's is Replicate): slice it locally
            g = p.grad
            if g is not None and hasattr(g, "placements") and g.placements != p.placements:
                p.grad = g.redistribute(p.device_mesh, p.placements)
        return [
            _local(p.grad) if p.grad is not None else torch.zeros_like(_local(p))
            for p in self.params
        ]

    def step(self) -> None:
        if self.zero == 0:
            flat = torch.zeros(self.padded, dtype=torch.float32)
            torch.cat([t.reshape(-1) for t in self._grads()], out=flat[: self.numel])
            dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.group)
            off = 0
            for p in self.params:
                lp = _local(p)
                g = flat[off : off + lp.numel()].view_as(lp)
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                _local(p.grad).copy_(g)
                off += lp.numel()
            del flat
            self.opt.step()
            return
        chunk = self.padded // self.n
        off = 0
        for p in self.params:  # kept gradients, and any that bypassed the hook (the
            # zero-bubble schedules' weight backward assigns .grad without accumulating)
            if p.grad is not None:
                self._make_hook(off)(p)  # add to the buffer, free
            off += _local(p).numel()
        mine = self.buf[self.rank * chunk : (self.rank + 1) * chunk]
        out = torch.empty(chunk, dtype=torch.float32)
        dist.reduce_scatter_tensor(out, self.buf, op=dist.ReduceOp.AVG, group=self.group)
        mine.copy_(out)
        del out
        for sl, a in self.slices:
            sl.grad = mine[a : a + sl.numel()]
        self.opt.step()
        with torch.no_grad():
            for sl, a in self.slices:
                mine[a : a + sl.numel()].copy_(sl)
                sl.grad = None
            dist.all_gather_into_tensor(self.buf, mine.clone(), group=self.group)
            off = 0
            for p in self.params:
                lp = _local(p)
                lp.copy_(self.buf[off : off + lp.numel()].view_as(lp))
                off += lp.numel()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        if self.zero == 1:
            self.buf.zero_()
        self.opt.zero_grad(set_to_none=True)


def sum_tied_grads(stage_mods: list[TinyGPT], emb_group, spec: ModelSpec) -> None:
    """Tied embeddings: the embedding and head copies get the sum of their gradients."""
    if not spec.tied_embeddings:
        return
    emb, head = tied_pairs(stage_mods)
    if emb is not None and head is not None:
        g = _local(emb.grad) + _local(head.grad)
        _local(emb.grad).copy_(g)
        _local(head.grad).copy_(g)
    elif emb_group is not None and (emb is not None or head is not None):
        p = emb if emb is not None else head
        dist.all_reduce(_local(p.grad), group=emb_group)


# ------------------------------------------------------------------------------------------------
# The rank's main
# ------------------------------------------------------------------------------------------------
def _mesh_and_groups(spec: ModelSpec, dp: int, tp: int, pp: int, vp: int, sched_name: str):
    """Step 1: the ``(pp, dp, tp)`` mesh, this rank's coordinates and local stages, the
    tied-embedding group (first and last stage's ranks) and the process-group -> dimension map
    that the communication meter labels its records with."""
    from torch.distributed.device_mesh import init_device_mesh

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    coords = {d: mesh[d].get_local_rank() for d in ("pp", "dp", "tp")}
    dim_of_group = {mesh[d].get_group().group_name: d for d in ("pp", "dp", "tp")}
    dim_of_group.setdefault(dist.group.WORLD.group_name, "world")
    ids, n_stages = stage_ids(sched_name, pp, vp, coords["pp"])
    emb_group = None
    if spec.tied_embeddings and pp > 1:  # first stage's rank and last stage's rank
        last_owner = (n_stages - 1) % pp
        for d in range(dp):
            for r in range(tp):
                ranks = sorted({r + tp * (d + dp * 0), r + tp * (d + dp * last_owner)})
                g = dist.new_group(ranks)
                if rank in ranks:
                    emb_group = g
                    dim_of_group[g.group_name] = "pp"
    return mesh, coords, ids, n_stages, emb_group, dim_of_group


def _local_batch(spec: ModelSpec, gb: int, seq: int, dp: int, dp_rank: int, seed: int):
    """Step 2: one fixed global batch (the same for every config), this dp rank's rows."""
    gen = torch.Generator().manual_seed(seed + 1)
    data = torch.randint(0, spec.vocab_size, (gb, seq + 1), generator=gen)
    rows = gb // dp
    x = data[dp_rank * rows : (dp_rank + 1) * rows, :-1].contiguous()
    y = data[dp_rank * rows : (dp_rank + 1) * rows, 1:].contiguous()
    return x, y


def _parallel_stages(spec: ModelSpec, par: dict, ids: list[int], n_stages: int, mesh, impl: str,
                     seed: int):
    """Steps 2-5: build the full model from the seed, cut this rank's stages, set recompute,
    apply tensor parallel and wrap data parallel. Returns the wrapped modules, the raw ones
    and, per stage, the names of the sequence-parallel (replicated over tp) parameters."""
    full = build_model(spec, seed=seed)
    mods, raw, sp_names = [], [], []
    for s in ids:
        m = make_stage(full, s, n_stages)
        set_recompute(m, par.get("recompute", "none"))
        names = []
        if par["tp"] > 1:
            names = apply_tp(m, mesh["tp"], bool(par.get("sequence_parallel")))
        raw.append(m)
        sp_names.append(set(names))
        mods.append(apply_dp(m, impl, mesh["dp"]))
    del full
    gc.collect()
    return mods, raw, sp_names


def _optimizer(impl: str, params: list, raw: list, spec: ModelSpec, dp_group, hz: dict,
               keep_grads: list):
    """AdamW in the data-parallel implementation's form: the flat ZeRO-0/1 one, torch's
    ``ZeroRedundancyOptimizer``, or plain AdamW (DDP / FSDP parameters)."""
    opt_kwargs = {"lr": hz.get("lr", 3e-3), "betas": (0.9, 0.95), "weight_decay": 0.0,
                  "foreach": False}
    if impl.startswith("flat"):
        tied = [p for p in tied_pairs(raw) if p is not None] if spec.tied_embeddings else []
        return FlatDP(params, int(impl[-1]), dp_group, opt_kwargs, keep_grads=keep_grads + tied)
    if impl == "zero1-torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=dp_group, **opt_kwargs)
    return torch.optim.AdamW(params, **opt_kwargs)


def _pipeline_schedule(sched_name: str, mods: list, ids: list[int], n_stages: int, pp_group,
                       impl: str, opt, nmb: int, loss_fn):
    """Step 6: one ``PipelineStage`` per local stage and the named schedule."""
    from torch.distributed import pipelining as P

    stage_cls = _ShardedGradStage if impl.startswith("fsdp") else _main_grad_stage_class()
    stages = [stage_cls(m, s, n_stages, torch.device("cpu"), group=pp_group)
              for m, s in zip(mods, ids)]
    if isinstance(opt, FlatDP) and opt.zero == 1:
        for st in stages:  # zero bubble: weight gradients into the main-grad buffer
            st.after_weight_backward = opt.absorb_grads
    if sched_name == "gpipe":
        return P.ScheduleGPipe(stages[0], n_microbatches=nmb, loss_fn=loss_fn)
    if sched_name == "1f1b":
        return P.Schedule1F1B(stages[0], n_microbatches=nmb, loss_fn=loss_fn)
    if sched_name == "interleaved":
        return P.ScheduleInterleaved1F1B(stages, n_microbatches=nmb, loss_fn=loss_fn)
    return P.ScheduleInterleavedZeroBubble(stages, n_microbatches=nmb, loss_fn=loss_fn)


def _no_pipeline_step(m, impl: str, x, y, nmb: int, loss_fn, losses: list) -> None:
    """Gradient accumulation over ``nmb`` micro-batches without a pipeline: the gradient
    sync only on the last one (DDP ``no_sync``), FSDP reduce-scatters every micro-batch."""
    for i, (xm, ym) in enumerate(zip(x.chunk(nmb), y.chunk(nmb))):
        last = i == nmb - 1
        if impl.startswith("fsdp"):  # ZeRO-2/3: reduce-scatter every micro-batch
            m.set_requires_gradient_sync(True)
            m.set_reshard_after_backward(impl == "fsdp-zero3" or last)
        ctx = m.no_sync() if impl in ("ddp", "zero1-torch") and not last else _null()
        with ctx:
            loss = loss_fn(m(xm), ym)
            (loss / nmb).backward()
        losses.append(loss.detach())


def _inject_fault(inject: dict, rank: int, step: int) -> None:
    """The launcher's fault test: fail or hang the named rank at the named step."""
    if inject.get("rank") == rank and step == inject.get("step", 0):
        if inject.get("kind") == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")


def _measured_steps(train_step, mem: PeakMemMeter, warmup: int, timed: int, t: dict):
    """Warm-up steps instrumented (memory on every one, communication on the last one), then
    timed steps uninstrumented with a barrier before and after each."""
    losses_per_step: list[float | None] = []
    comm = CommMeter()
    peaks: list[int] = []
    for step in range(warmup):
        with mem:
            mem.reset_peak()
            if step == warmup - 1:
                with comm:
                    losses_per_step.append(train_step(step))
            else:
                losses_per_step.append(train_step(step))
            peaks.append(mem.peak_bytes)
        if step == 0:
            t["first_step_s"] = time.perf_counter() - T_START
    steady_bytes = mem.cur_bytes
    step_s = []
    for step in range(warmup, warmup + timed):
        dist.barrier()
        t0 = time.perf_counter()
        losses_per_step.append(train_step(step))
        dist.barrier()
        step_s.append(time.perf_counter() - t0)
    return losses_per_step, comm, peaks, steady_bytes, step_s


@dataclass(frozen=True)
class _JobSettings:
    """What every step of :func:`run` reads from the job: ``par`` (the ``parallel`` block) and
    ``hz`` (the ``harness`` block) as given, the validated ``spec``, the global batch ``gb``
    and ``seq_len`` ``seq``, this ``rank`` and the ``world`` size, ``dp tp pp vp``, the
    schedule name, ``nmb`` micro-batches, the data-parallel implementation ``impl`` and the
    ``seed``."""

    par: dict
    hz: dict
    spec: ModelSpec
    gb: int
    seq: int
    rank: int
    world: int
    dp: int
    tp: int
    pp: int
    vp: int
    sched_name: str
    nmb: int
    impl: str
    seed: int


def _job_settings(job: dict) -> _JobSettings:
    """The job's settings, checked as :func:`harness.launch.run_config` checks them
    (:func:`check_config`), and the mesh against the world size; :class:`ConfigRefused`
    otherwise."""
    par = job["parallel"]
    hz = job.get("harness", {})
    spec = ModelSpec.model_validate(job["model"])
    gb, seq = job["training"]["global_batch_size"], job["training"]["seq_len"]
    dp_impl = hz.get("dp_impl", "auto")
    check_config(par, spec, gb, seq, dp_impl)
    rank, world = dist.get_rank(), dist.get_world_size()
    dp, tp, pp, vp = par["dp"], par["tp"], par["pp"], par.get("vp", 1)
    if dp * tp * pp != world:
        raise ConfigRefused(f"dp*tp*pp ({dp}*{tp}*{pp}) must equal the world size ({world})")
    return _JobSettings(
        par=par, hz=hz, spec=spec, gb=gb, seq=seq, rank=rank, world=world, dp=dp, tp=tp, pp=pp,
        vp=vp, sched_name=par.get("schedule", "1f1b"), nmb=par["num_microbatches"],
        impl=dp_implementation(par, dp_impl), seed=hz.get("seed", 0),
    )  # fmt: skip


def _stage_params(raw: list, sp_names: list[set]) -> tuple[list, list]:
    """This rank's parameters (all local stages) and, of them, the sequence-parallel ones
    (replicated over tp, their partial gradients all-reduced once per step)."""
    params = [p for m in raw for p in m.parameters()]
    sp_params = [p for m, ns in zip(raw, sp_names) for n, p in m.named_parameters() if n in ns]
    return params, sp_params


def _metered_optimizer(c: _JobSettings, x, y, params: list, raw: list, sp_params: list, mesh):
    """The memory meter (:class:`PeakMemMeter`) and, built under it, the optimizer
    (:func:`_optimizer`); returns the meter, the optimizer and the local parameter bytes."""
    # tensors made before the meter is entered are tracked explicitly; everything later
    # (optimizer states, FSDP buffers, activations, gradients, p2p buffers) is seen by the mode
    mem = PeakMemMeter()
    mem.track(x, y, params, [b for m in raw for b in m.buffers()])
    with mem:  # mesh["dp"] sliced in here: outside, the measured bytes are 8-16 B lower
        opt = _optimizer(c.impl, params, raw, c.spec, mesh["dp"].get_group(), c.hz, sp_params)
        param_bytes = sum(_local(p).numel() * _local(p).element_size() for p in params)
    return mem, opt, param_bytes


def _loss_fn(tp: int, tp_group):
    """Cross-entropy on the last stage's logits: :func:`vocab_parallel_cross_entropy` when
    they are sharded over the vocabulary (tp > 1), ``F.cross_entropy`` otherwise."""

    def ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if tp > 1:  # logits sharded over the vocabulary
            return vocab_parallel_cross_entropy(logits, target, tp_group)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))

    return ce


@dataclass(frozen=True)
class _TrainStep:
    """One training step of this rank, ``train_step(step)``: the fault injection, forward and
    backward (the pipeline schedule's ``step``, or :func:`_no_pipeline_step`), the tied and
    sequence-parallel gradient sums, the optimizer step and ``zero_grad``; returns the step's
    mean micro-batch loss on the last stage's tp rank 0, else None."""

    c: _JobSettings
    tp_rank: int
    ids: list
    n_stages: int
    mods: list
    raw: list
    emb_group: object
    sp_params: list
    tp_group: object
    opt: object
    sched: object
    loss_fn: object
    x: torch.Tensor
    y: torch.Tensor

    def __call__(self, step: int) -> float | None:
        c, opt = self.c, self.opt
        _inject_fault(c.hz.get("inject") or {}, c.rank, step)
        losses: list = []
        if self.sched is not None:
            args = (self.x,) if 0 in self.ids else ()
            kw = {"target": self.y, "losses": losses} if self.n_stages - 1 in self.ids else {}
            self.sched.step(*args, **kw)
        else:
            _no_pipeline_step(self.mods[0], c.impl, self.x, self.y, c.nmb, self.loss_fn, losses)
        sum_tied_grads(self.raw, self.emb_group, c.spec)
        if self.sp_params:
            allreduce_sequence_parallel_grads(self.sp_params, self.tp_group)
        opt.step()
        if isinstance(opt, FlatDP):
            opt.zero_grad()
        else:
            opt.zero_grad(set_to_none=True)
        if losses and self.tp_rank == 0:
            return float(torch.stack([torch.as_tensor(v).detach().float() for v in losses]).mean())
        return None


def _rank_report(c: _JobSettings, coords: dict, ids: list[int], n_stages: int,
                 dim_of_group: dict, measured: tuple, mem: PeakMemMeter, param_bytes: int,
                 t: dict) -> dict:
    """The rank's ``rank_<r>.json``: coordinates and stages, losses, step times, communication
    records (:meth:`CommMeter.records`), memory (peaks of the warm-up steps, steady state,
    parameters, ``ru_maxrss``) and the phase timestamps."""
    losses_per_step, comm, peaks, steady_bytes, step_s = measured
    return {
        "rank": c.rank,
        "world": c.world,
        "coords": coords,
        "stages": ids,
        "num_stages": n_stages,
        "dp_impl": c.impl,
        "last_stage": n_stages - 1 in ids,
        "losses": losses_per_step,
        "step_times_s": step_s,
        "step_time_s": statistics.median(step_s) if step_s else None,
        "comm": comm.records(dim_of_group),
        "memory": {
            "peak_bytes": int(max(peaks[1:] or peaks)) if peaks else None,
            "peak_first_step_bytes": int(peaks[0]) if peaks else None,
            "steady_bytes": int(steady_bytes),
            "peak_snapshot": mem.peak_snapshot if mem.debug else None,
            "param_bytes": int(param_bytes),
            "ru_maxrss_bytes": _maxrss_bytes(),
        },
        "phases_s": t,
    }


def run(job: dict, out_dir: Path) -> dict:
    """One rank's whole job, as the module docstring's recipe: mesh, data, stages, optimizer,
    schedule, then the instrumented and timed steps (numbered as there); returns the rank's
    report."""
    c = _job_settings(job)
    t = {"imported_s": T_IMPORTED - T_START}
    # 1. mesh (pp, dp, tp), this rank's stages, the tied-embedding group
    mesh, coords, ids, n_stages, emb_group, dim_of_group = _mesh_and_groups(
        c.spec, c.dp, c.tp, c.pp, c.vp, c.sched_name)
    t["mesh_s"] = time.perf_counter() - T_START
    x, y = _local_batch(c.spec, c.gb, c.seq, c.dp, coords["dp"], c.seed)
    # 2-5. full model from the seed, stages, recompute, tensor parallel, data parallel
    mods, raw, sp_names = _parallel_stages(c.spec, c.par, ids, n_stages, mesh, c.impl, c.seed)
    t["parallelized_s"] = time.perf_counter() - T_START
    params, sp_params = _stage_params(raw, sp_names)
    mem, opt, param_bytes = _metered_optimizer(c, x, y, params, raw, sp_params, mesh)
    tp_group = mesh["tp"].get_group()
    ce = _loss_fn(c.tp, tp_group)
    # 6. PipelineStage per local stage and the schedule
    sched = _pipeline_schedule(c.sched_name, mods, ids, n_stages, mesh["pp"].get_group(),
                               c.impl, opt, c.nmb, ce) if c.pp > 1 else None
    t["built_s"] = time.perf_counter() - T_START
    train_step = _TrainStep(c=c, tp_rank=coords["tp"], ids=ids, n_stages=n_stages, mods=mods,
                            raw=raw, emb_group=emb_group, sp_params=sp_params, tp_group=tp_group,
                            opt=opt, sched=sched, loss_fn=ce, x=x, y=y)
    # warm-up steps instrumented, then the timed steps
    measured = _measured_steps(train_step, mem, int(c.hz.get("warmup_steps", 2)),
                               int(c.hz.get("timed_steps", 3)), t)
    t["done_s"] = time.perf_counter() - T_START
    return _rank_report(c, coords, ids, n_stages, dim_of_group, measured, mem, param_bytes, t)


def _sharded_grad_stage_class():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import PipelineStage

    class ShardedGradStage(PipelineStage):
        """ZeRO-2/3 inside a pipeline: gradients reduce-scattered after every micro-batch's
        backward (P_g never holds a whole gradient, Rajbhandari et al. 2020 Sec. 5.2), ZeRO-3
        parameters resharded after it. torch's stage instead accumulates unsharded gradients
        until the last micro-batch (ZeRO-1 memory and traffic)."""

        def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
            m = self.submod
            if backward_type != "full" or not isinstance(m, FSDPModule):
                return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
            m.set_requires_gradient_sync(True)
            m.set_is_last_backward(True)
            m.set_reshard_after_backward(bool(getattr(m, "_harness_zero3", False)))
            names = ("set_is_last_backward", "set_reshard_after_backward",
                     "set_requires_gradient_sync")  # fmt: skip
            for n in names:  # keep torch's stage from switching the sync off again
                setattr(m, n, lambda *a, **k: None)
            try:
                return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
            finally:
                for n in names:
                    delattr(m, n)

    return ShardedGradStage


def _main_grad_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class MainGradStage(PipelineStage):
        """A stage that calls ``after_weight_backward()`` after each weight-gradient pass of a
        zero-bubble schedule (ZeRO-1: :meth:`FlatDP.absorb_grads`)."""

        after_weight_backward = None

        def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward=False):
            super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
            if self.after_weight_backward is not None:
                self.after_weight_backward()

    return MainGradStage


def _ShardedGradStage(*args, **kwargs):
    return _sharded_grad_stage_class()(*args, **kwargs)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _maxrss_bytes() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one rank of the harness (run through torchrun)")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    rank = int(os.environ.get("RANK", "0"))
    pid = os.getpid()  # with its start time: the launcher kills it only while it is this process
    (out / f"rank_{rank}.pid").write_text(f"{pid} {process_start_ticks(pid)}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        job = json.loads(Path(a.config).read_text())
        hz = job.get("harness", {})
        env_inject = os.environ.get("HARNESS_INJECT")  # "rank:kind", e.g. "1:hang"
        if env_inject:
            r, kind = env_inject.split(":")
            hz["inject"] = {"rank": int(r), "kind": kind}
            job["harness"] = hz
        dist.init_process_group(
            hz.get("backend", "gloo"), timeout=timedelta(seconds=float(hz.get("pg_timeout_s", 120)))
        )
        res = run(job, out)
        (out / f"rank_{rank}.json").write_text(json.dumps(res))
    except BaseException as err:  # noqa: BLE001 - report every failure, then exit hard
        (out / f"rank_{rank}.error.json").write_text(
            json.dumps(
                {
                    "rank": rank,
                    "time": time.time(),
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(),
                }
            )
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
