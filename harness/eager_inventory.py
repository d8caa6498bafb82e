"""Record the eager kernels of one training step of the calibration script's own models.

The H200 eager model (:mod:`perfmodel.compute.eager`) counts, per kernel family, the kernels and HBM
bytes of plain eager PyTorch. This module records them from the code that was timed:
``benchmarks/calibrate_gpu.py`` (imported from the repository, not copied: ``Block`` / ``GPT``
and ``LlamaBlock`` / ``Llama``), one step as the script's ``e2e`` / ``e2e_llama`` runs it
(``torch.autocast(bfloat16)`` forward, ``logits.float()`` cross-entropy, backward, fused
AdamW ``step``), under a :class:`torch.utils._python_dispatch.TorchDispatchMode` that sees
every aten op with its inputs and outputs.

Run on CPU. What differs from the CUDA run, and what is assumed:

* CPU autocast casts ``linear`` (``addmm`` / ``mm``) and ``scaled_dot_product_attention`` to
  bf16 like CUDA autocast does (both are in the lower-precision lists of
  ``aten/src/ATen/autocast_mode.cpp`` for the two devices); elementwise ops follow type
  promotion on both, so the fp32 residual stream, the fp32 RMSNorm / LayerNorm (fp32 input and
  weight) and the fp32 RoPE products (fp32 cos / sin buffers) are recorded as they run on CUDA.
  The recorder checks this: the GEMM outputs must be bf16.
* Attention: the CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) stands for
  CUDA's flash kernel; its kernels are counted as the CUDA launches (fwd 1, bwd 3:
  FlashAttention-2's ``dot(dO, O)`` preprocessing, main and dq-convert kernels).
* Embedding backward, ``nll_loss`` and the fused AdamW are one dispatcher op each here; their
  CUDA kernel counts are taken from the CUDA sources in :mod:`perfmodel.compute.eager`.

Bytes of an op = bytes of its tensor inputs + bytes of its outputs (each streamed once; an
expanded, stride-0 input counts the storage it reads), which is what a memory-bound kernel moves.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "calibrate_gpu.py"

#: ops that create views or metadata only (no kernel on the device)
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "slice", "select",
    "split", "split_with_sizes", "chunk", "unsqueeze", "squeeze", "as_strided", "alias", "detach",
    "unbind", "_reshape_alias", "lift_fresh", "unflatten", "flatten", "view_as", "narrow",
    "_to_copy_noop", "empty", "empty_strided", "new_empty_strided", "new_empty", "empty_like",
    "_local_scalar_dense", "is_same_size", "_has_compatible_shallow_copy_type", "set_",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "unsafe_split",
})


def load_script():
    """The calibration script as a module (its ``OUT`` folder pointed at a temporary dir)."""
    os.environ.setdefault("OUT", tempfile.mkdtemp(prefix="calib_out_"))
    spec = importlib.util.spec_from_file_location("calibrate_gpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class OpRecord:
    phase: str  # fwd / bwd / opt
    name: str  # aten op name without overload
    in_bytes: int
    out_bytes: int
    in_dtypes: tuple
    out_dtypes: tuple
    out_shapes: tuple


@dataclass
class Inventory:
    ops: list[OpRecord] = field(default_factory=list)

    def kernels(self, phase: str | None = None) -> list[OpRecord]:
        return [o for o in self.ops if o.name not in VIEW_OPS
                and (phase is None or o.phase == phase)]

    def by_name(self, phase: str | None = None) -> dict[str, tuple[int, int]]:
        """``{op: (count, bytes)}`` of the kernel ops."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for o in self.kernels(phase):
            out[o.name][0] += 1
            out[o.name][1] += o.in_bytes + o.out_bytes
        return {k: (v[0], v[1]) for k, v in out.items()}


def _nbytes(x) -> int:
    import torch

    if isinstance(x, torch.Tensor):  # an expanded (stride-0) view reads only its storage
        return min(x.numel() * x.element_size(), x.untyped_storage().nbytes())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


def _tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def record_step(kind: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
                micro_batch: int = 1, recompute: bool = False, kv_heads: int | None = None,
                ffn: int | None = None) -> Inventory:
    """One training step of the script's ``GPT`` (``kind="gpt"``) or ``Llama``
    (``kind="llama"``) on CPU, every aten op recorded (forward, backward, optimizer)."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    cg = load_script()
    torch.manual_seed(0)
    if kind == "gpt":
        model = cg.GPT(layers, hidden, heads, vocab, seq, recompute)
    else:
        model = cg.Llama(layers, hidden, heads, kv_heads or heads, ffn or 4 * hidden, vocab, seq,
                         recompute)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    idx = torch.randint(0, vocab, (micro_batch, seq))
    tgt = torch.randint(0, vocab, (micro_batch, seq))
    inv = Inventory()
    phase = ["fwd"]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            ins = list(args) + list((kwargs or {}).values())
            inv.ops.append(OpRecord(
                phase[0], name, _nbytes(ins), _nbytes(out),
                tuple(str(t.dtype) for t in _tensors(ins)),
                tuple(str(t.dtype) for t in _tensors(out)),
                tuple(tuple(t.shape) for t in _tensors(out))))
            return out

    class FusedRMSNorm(torch.autograd.Function):
        """CUDA's ``aten::_fused_rms_norm`` / ``_fused_rms_norm_backward`` (PyTorch >= 2.9,
        ``layer_norm.cpp`` ``rms_norm_symint``; on CPU rms_norm decomposes): recorded as the
        one op each that CUDA runs, computed by the composite with recording off."""

        @staticmethod
        def forward(ctx, x, w, eps):
            with torch.utils._python_dispatch._disable_current_modes():
                xf = x.detach()
                rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + (eps or 1e-6))
                y = xf * rstd * w
            ctx.save_for_backward(x, w, rstd)
            inv.ops.append(OpRecord(phase[0], "_fused_rms_norm", _nbytes([x, w]),
                                    _nbytes([y, rstd]), (str(x.dtype),), (str(y.dtype),),
                                    (tuple(y.shape),)))
            return y

        @staticmethod
        def backward(ctx, gy):
            x, w, rstd = ctx.saved_tensors
            with torch.utils._python_dispatch._disable_current_modes():
                xh = x * rstd
                gw = (gy * xh).sum(dim=tuple(range(gy.dim() - 1)))
                gxh = gy * w
                gx = rstd * (gxh - xh * (gxh * xh).mean(-1, keepdim=True))
            inv.ops.append(OpRecord(phase[0], "_fused_rms_norm_backward",
                                    _nbytes([gy, x, rstd, w]), _nbytes([gx, gw]),
                                    (str(gy.dtype),), (str(gx.dtype),), (tuple(gx.shape),)))
            return gx, gw, None

    orig_rms = F.rms_norm

    def rms_norm(x, shape, weight=None, eps=None):
        return FusedRMSNorm.apply(x, weight, eps)

    F.rms_norm = rms_norm
    try:
        _run(model, opt, idx, tgt, vocab, phase, Recorder)
    finally:
        F.rms_norm = orig_rms
    for o in inv.ops:  # the CUDA-autocast check: weight GEMMs run in bf16
        if o.name in ("addmm", "mm", "bmm") and o.phase == "fwd":
            assert o.out_dtypes == ("torch.bfloat16",), o
    return inv


def _run(model, opt, idx, tgt, vocab, phase, Recorder):
    import torch
    import torch.nn.functional as F

    with Recorder():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, vocab), tgt.view(-1))
        phase[0] = "bwd"
        loss.backward()
        phase[0] = "opt"
        opt.step()
        opt.zero_grad(set_to_none=True)


def main():  # pragma: no cover - a printout for docs/compute.md
    import sys

    kind = sys.argv[1] if len(sys.argv) > 1 else "llama"
    if kind == "gpt":
        inv = record_step("gpt", 1, 64, 4, 256, 32)
    else:
        inv = record_step("llama", 1, 64, 4, 256, 32, kv_heads=2, ffn=128)
    for ph in ("fwd", "bwd", "opt"):
        print(f"== {ph}")
        for o in inv.kernels(ph):
            print(f"  {o.name:40s} in {o.in_bytes:8d} out {o.out_bytes:8d} {o.in_dtypes} -> "
                  f"{o.out_dtypes} {o.out_shapes}")


if __name__ == "__main__":  # pragma: no cover
    main()
