"""A tiny mixture-of-experts model trained with expert parallelism on CPU gloo ranks, to check
the planner's all-to-all volume and the correctness of expert-parallel training.

Model: token embedding, ``L`` residual MoE blocks (RMS-scaled input, router, ``E`` SwiGLU experts,
top-``k`` with softmax gates over the chosen experts), output head, cross-entropy. Routing is
force-balanced (token ``t`` takes experts ``(t*k + j) mod E``, Megatron's
``--moe-router-force-load-balancing`` idea: gates are learned, the choice is fixed), so every
expert receives the same number of tokens and the bytes are exact.

Expert parallel with ``dp = ep = world`` (etp = 1, expert-dp = 1): rank ``r`` holds experts
``r*E/ep ... (r+1)*E/ep - 1``; each block dispatches its routed token copies with
``all_to_all_single`` (forward: dispatch and combine; backward: their gradients, through the
autograd function :class:`_AllToAll`), every call's bytes to other ranks counted. Dense
parameters are replicated and their gradients all-reduced; each rank's loss is divided by the
world size so that the sum over ranks is the global mean loss. The single-process reference runs
the same model with every expert local on the whole batch.

``python -m harness.moe_ep`` runs both and prints measured versus predicted bytes and the losses.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from perfmodel.comm.comm_volume import ep_dispatch_bytes
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, TrainingSpec

__all__ = ["MoEHarnessConfig", "predicted_a2a_bytes", "run", "run_single"]


@dataclass(frozen=True)
class MoEHarnessConfig:
    ep: int = 2
    num_experts: int = 4
    top_k: int = 2
    hidden: int = 32
    ffn: int = 48
    layers: int = 2
    vocab: int = 64
    seq_len: int = 16
    micro_batch: int = 2
    steps: int = 3
    lr: float = 0.1
    seed: int = 0


def predicted_a2a_bytes(cfg: MoEHarnessConfig) -> float:
    """The planner's dispatch + combine bytes per GPU per step for this run (fp32 training:
    4-byte activations), :func:`perfmodel.comm.comm_volume.ep_dispatch_bytes`."""

    model = ModelSpec(name="tiny-moe", num_layers=cfg.layers, hidden_size=cfg.hidden,
                      num_attention_heads=1, ffn_hidden_size=cfg.ffn, vocab_size=cfg.vocab,
                      activation="swiglu", norm="rmsnorm", position_embedding="rope",
                      tied_embeddings=False, linear_bias=False, num_experts=cfg.num_experts,
                      moe_top_k=cfg.top_k)
    training = TrainingSpec(global_batch_size=cfg.ep * cfg.micro_batch, seq_len=cfg.seq_len,
                            precision="fp32")
    batch = ConfigBatch.from_arrays(dp=cfg.ep, ep=cfg.ep, etp=1, micro_batch_size=cfg.micro_batch,
                                    num_microbatches=1)
    return float(ep_dispatch_bytes(model, training, batch)[0])


def _params(cfg: MoEHarnessConfig):
    import torch

    g = torch.Generator().manual_seed(cfg.seed)
    h, f, e = cfg.hidden, cfg.ffn, cfg.num_experts

    def w(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).requires_grad_()

    p = {"embed": w(cfg.vocab, h, scale=0.5), "head": w(h, cfg.vocab, scale=h ** -0.5)}
    for i in range(cfg.layers):
        p[f"router{i}"] = w(h, e, scale=h ** -0.5)
        p[f"fc1_{i}"] = w(e, h, 2 * f, scale=h ** -0.5)
        p[f"fc2_{i}"] = w(e, f, h, scale=f ** -0.5)
    data = torch.randint(0, cfg.vocab, (cfg.steps, cfg.ep * cfg.micro_batch, cfg.seq_len + 1),
                         generator=g)
    return p, data


def _route(cfg: MoEHarnessConfig, tokens: int, offset: int):
    """Force-balanced expert choice: global token ``t`` takes ``(t*k + j) mod E``."""
    import torch

    t = torch.arange(tokens) + offset
    return (t[:, None] * cfg.top_k + torch.arange(cfg.top_k)[None, :]) % cfg.num_experts


def _experts(x, fc1, fc2, expert_of_row, first_expert: int):
    """SwiGLU experts on rows sorted by expert (each row with its expert id)."""
    import torch

    pieces = []
    for j in range(fc1.shape[0]):
        rows = (expert_of_row == first_expert + j).nonzero(as_tuple=True)[0]
        gate, up = (x[rows] @ fc1[j]).chunk(2, dim=-1)
        pieces.append((rows, (torch.nn.functional.silu(gate) * up) @ fc2[j]))
    out = torch.zeros(x.shape[0], fc2.shape[-1], dtype=x.dtype)
    for rows, y in pieces:
        out = out.index_put((rows,), y)
    return out


class _Counter:
    bytes_sent = 0.0


def _make_all_to_all(group, rank: int, counter: _Counter):
    import torch
    import torch.distributed as dist

    class _AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, send_splits, recv_splits):
            ctx.splits = (send_splits, recv_splits)
            out = x.new_empty(sum(recv_splits), x.shape[1])
            row = x.shape[1] * x.element_size()
            counter.bytes_sent += row * sum(n for j, n in enumerate(send_splits) if j != rank)
            dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
            return out

        @staticmethod
        def backward(ctx, grad):
            send_splits, recv_splits = ctx.splits
            out = grad.new_empty(sum(send_splits), grad.shape[1])
            row = grad.shape[1] * grad.element_size()
            counter.bytes_sent += row * sum(n for j, n in enumerate(recv_splits) if j != rank)
            dist.all_to_all_single(out, grad.contiguous(), send_splits, recv_splits, group=group)
            return out, None, None

    return _AllToAll.apply


def _loss(cfg: MoEHarnessConfig, p, batch, offset: int, rank: int = 0, world: int = 1, a2a=None):
    """Forward and loss; experts ``rank*E/world ...`` local; ``a2a`` None: all local."""
    import torch

    tokens_in, target = batch[:, :-1].reshape(-1), batch[:, 1:].reshape(-1)
    x = p["embed"][tokens_in]
    n, k, e = x.shape[0], cfg.top_k, cfg.num_experts
    local = e // world
    choice = _route(cfg, n, offset)  # (n, k)
    for i in range(cfg.layers):
        hdn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        logits = hdn @ p[f"router{i}"]
        gates = torch.softmax(logits.gather(1, choice), dim=-1)  # (n, k)
        flat_e = choice.reshape(-1)
        order = torch.argsort(flat_e * n * k + torch.arange(n * k), stable=True)
        rows = hdn.repeat_interleave(k, dim=0)[order]  # permute: grouped by expert
        sorted_e = flat_e[order]
        if a2a is None:
            y = _experts(rows, p[f"fc1_{i}"], p[f"fc2_{i}"], sorted_e, 0)
        else:
            owner = sorted_e // local
            send = [int((owner == r).sum()) for r in range(world)]
            # split sizes and expert ids travel first (metadata, not counted: Megatron's
            # dispatcher exchanges them too, a few bytes per expert)
            counts = torch.tensor(send, dtype=torch.int64)
            recv_counts = torch.empty_like(counts)
            import torch.distributed as dist

            dist.all_to_all_single(recv_counts, counts)
            recv = recv_counts.tolist()
            ids = torch.empty(sum(recv), dtype=torch.int64)
            dist.all_to_all_single(ids, sorted_e.contiguous(), recv, send)
            got = a2a(rows, send, recv)  # dispatch
            fc1 = p[f"fc1_{i}"][rank * local:(rank + 1) * local]
            fc2 = p[f"fc2_{i}"][rank * local:(rank + 1) * local]
            out = _experts(got, fc1, fc2, ids, rank * local)
            y = a2a(out, recv, send)  # combine
        unperm = torch.empty_like(y).index_put((order,), y)  # unpermute
        x = x + (unperm.view(n, k, -1) * gates[..., None]).sum(1)
    return torch.nn.functional.cross_entropy(x @ p["head"], target)


def run_single(cfg: MoEHarnessConfig) -> list[float]:
    """Losses of the single-process reference (all experts local, whole batch)."""
    import torch

    torch.manual_seed(cfg.seed)
    p, data = _params(cfg)
    losses = []
    for s in range(cfg.steps):
        loss = _loss(cfg, p, data[s], 0)
        losses.append(float(loss.detach()))
        for v in p.values():
            v.grad = None
        loss.backward()
        with torch.no_grad():
            for v in p.values():
                v -= cfg.lr * v.grad
    return losses


def _worker(rank: int, cfg: MoEHarnessConfig, store: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=cfg.ep)
    counter = _Counter()
    a2a = _make_all_to_all(None, rank, counter)
    p, data = _params(cfg)
    mb, world, local = cfg.micro_batch, cfg.ep, cfg.num_experts // cfg.ep
    losses, per_step = [], []
    for s in range(cfg.steps):
        before = counter.bytes_sent
        part = data[s][rank * mb:(rank + 1) * mb]
        loss = _loss(cfg, p, part, rank * mb * cfg.seq_len, rank, world, a2a)
        for v in p.values():
            v.grad = None
        (loss / world).backward()
        glob = loss.detach().clone()
        dist.all_reduce(glob)
        losses.append(float(glob) / world)
        per_step.append(counter.bytes_sent - before)
        with torch.no_grad():
            for name, v in p.items():
                if name.startswith("fc"):  # expert shards: only the local experts' rows count
                    g = torch.zeros_like(v.grad)
                    g[rank * local:(rank + 1) * local] = v.grad[rank * local:(rank + 1) * local]
                    dist.all_reduce(g)  # assemble the full expert tensors on every rank
                    v -= cfg.lr * g
                else:
                    dist.all_reduce(v.grad)
                    v -= cfg.lr * v.grad
    if rank == 0:
        Path(out).write_text(json.dumps({"losses": losses, "a2a_bytes_per_step": per_step}))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def run(cfg: MoEHarnessConfig | None = None) -> dict:
    """Run the expert-parallel job and the reference; measured vs predicted."""
    import torch.multiprocessing as mp

    cfg = cfg or MoEHarnessConfig()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        mp.start_processes(_worker, args=(cfg, str(Path(tmp) / "store"), out), nprocs=cfg.ep,
                           start_method="spawn", join=True)
        res = json.loads(Path(out).read_text())
    res["single_losses"] = run_single(cfg)
    res["predicted_a2a_bytes_per_step"] = predicted_a2a_bytes(cfg)
    res["config"] = asdict(cfg)
    return res


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
