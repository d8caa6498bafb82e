"""Eager PyTorch kernels of a Llama-style layer (RMSNorm, RoPE, GQA, SwiGLU) under autocast.

The calibration script's ``LlamaBlock`` (``benchmarks/calibrate_gpu.py``) runs every piece of the
layer as separate PyTorch ops. Each function below is one kernel family of that code: the HBM
bytes it moves (reads + writes, logical tensor sizes) and the kernels it launches, per layer and
pass, for ``tokens`` rows on this GPU. :mod:`perfmodel.compute` prices each family with the
measured memory-bound bandwidth of its kind (``memops.csv``, :meth:`Calibration.membw_bytes_per_s`)
and charges every kernel to the host (:data:`perfmodel.compute.CPU_FWD_LAUNCH_S`).

The inventory was read from a recorded step (``harness/eager_inventory.py``: every aten op of
the script's own ``Llama`` under ``TorchDispatchMode``) and is checked against it in
``tests/perfmodel/test_eager.py``. Dtypes follow CUDA autocast (``aten/src/ATen/autocast_mode.cpp``):
``linear`` and ``scaled_dot_product_attention`` run in bf16, everything else by type promotion,
so with fp32 weights the residual stream and the norms are fp32 (4 bytes), the GEMM outputs bf16
(``act_b``), and RoPE, whose cos / sin are fp32 buffers, is fp32. Autograd casts each gradient
back to its input's dtype (``validate_outputs`` in ``torch/csrc/autograd/engine.cpp``).

Each function returns a list of :class:`Term` (kind of memops bandwidth, total bytes, kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "SOFTMAX_ROWS_PER_SM",
    "L2_BYTES",
    "Term",
    "layer_terms",
    "log_softmax",
    "gqa_repeat",
    "rope",
    "sdpa_casts",
    "swiglu",
]

F32 = 4.0


@dataclass(frozen=True)
class Term:
    """``kernels`` kernels of memops kind ``op`` moving ``nbytes`` in total."""

    op: str
    nbytes: np.ndarray
    kernels: float


def _e(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def rope(tokens, width, seq, head_dim, act_b: float, pass_: str, wide_b: float = F32
         ) -> list[Term]:
    """RoPE of one tensor (q or k: ``width`` = heads x head_dim) as the script's ``rope`` writes
    it: ``x1, x2 = x[..., ::2], x[..., 1::2]`` (strided views of the bf16 GEMM output),
    ``stack((x1*cos - x2*sin, x1*sin + x2*cos), -1)``. cos / sin are fp32 ``[s, d/2]`` buffers
    (each product reads one: ``4 * 4*s*d/2`` bytes),
    so the four products are fp32 (type promotion). ``E = tokens x width`` elements.

    Forward (7 kernels): 4 ``mul`` read ``act_b*E/2`` + the cos/sin table and write ``4*E/2``;
    ``sub`` and ``add`` read ``8*E/2`` and write ``4*E/2``; ``stack`` (a cat kernel) reads and
    writes ``4*E``: ``(2*act_b + 28)*E`` bytes (32 E in bf16).

    Backward (16 kernels; the stack's backward ``unbind`` is a view): 4 fp32 ``mul`` by cos/sin
    (``8*E/2`` each) and 4 casts of their results to the bf16 dtype of ``x1``/``x2`` (autograd,
    ``6*E/2`` each), one ``neg`` (``8*E/2``), two bf16 ``add`` summing the two contributions to
    ``x1`` and ``x2`` (``3*act_b*E/2`` each), two ``slice_backward`` (a zero fill of ``act_b*E``
    and a strided copy of ``act_b*E/2`` in and out: 2 kernels each) and the bf16 ``add`` of the
    two (``3*act_b*E``): ``(28 + 12*act_b)*E`` bytes (52 E in bf16).

    Example: 1 token, width 2, head_dim 2, seq 1, bf16, forward: E = 2, (4 + 28) * 2 = 64 bytes
    + 4 table reads of 4 bytes = 80 bytes.

    References
    ----------
    ``benchmarks/calibrate_gpu.py`` ``rope``, ``LlamaBlock.forward``; PyTorch
    ``tools/autograd/derivatives.yaml`` (``mul``, ``sub``, ``stack``, ``slice``:
    ``slice_backward`` = ``zeros`` + ``copy_``).
    """
    e = _e(tokens) * _e(width)
    w = wide_b  # fp32 under autocast (fp32 cos / sin); act_b without autocast
    table = 4.0 * w * seq * head_dim / 2  # each product reads its cos or sin table
    if pass_ == "fwd":
        return [Term("copy", 4 * (act_b + w) * e / 2 + table, 4),
                Term("add", 2 * 3 * w * e / 2, 2),
                Term("copy", 2 * w * e, 1)]
    casts = [Term("copy", 4 * (w + act_b) * e / 2, 4)] if w != act_b else []
    return [Term("copy", 4 * 2 * w * e / 2 + table, 4),  # products by cos / sin
            *casts,  # autograd casts the products' gradients to x1 / x2's bf16
            Term("copy", 2 * w * e / 2, 1),  # neg
            Term("add", 2 * 3 * act_b * e / 2, 2),
            Term("copy", 2 * 2 * act_b * e, 4),  # slice_backward: zero fill + strided copy
            Term("add", 3 * act_b * e, 1)]


def gqa_repeat(tokens, q_width, kv_width, k_b: float, v_b: float, pass_: str) -> list[Term]:
    """``repeat_interleave`` of k and v to the query heads (the script, as Hugging Face
    ``repeat_kv``; ``unsqueeze.expand.clone``: one copy kernel each), reading the grouped width
    and writing the full one. k leaves RoPE in fp32 (``k_b`` = 4 under autocast), v is the bf16
    GEMM output. Backward: the expand's ``sum`` over the repeats for each (reads full, writes
    grouped) and a ``clone`` of v's gradient (the transposed view made contiguous for the
    ``view`` backward). Nothing when ``q_width == kv_width``.

    Example: 1 token, q 8, kv 2, k fp32, v bf16: forward (4 + 2) * (8 + 2) = 60 bytes, 2 kernels;
    backward 60 + 2 * 2 * 2 = 68 bytes, 3 kernels.

    References
    ----------
    ``benchmarks/calibrate_gpu.py`` ``LlamaBlock.forward``; PyTorch
    ``aten/src/ATen/native/Repeat.cpp`` (``repeat_interleave_symint``); Ainslie et al. 2023.
    """
    t = _e(tokens)
    full, grouped = t * _e(q_width), t * _e(kv_width)
    if np.all(full <= grouped):
        return []
    on = np.where(full > grouped, 1.0, 0.0)
    terms = [Term("copy", on * (k_b + v_b) * (full + grouped), 2)]
    if pass_ == "bwd":
        terms.append(Term("copy", on * 2 * v_b * grouped, 1))
    return terms


def sdpa_casts(tokens, q_width, k_width, wide_b: float, act_b: float, pass_: str) -> list[Term]:
    """Autocast's casts of the fp32 (RoPE'd) q and k to bf16 for
    ``scaled_dot_product_attention`` (k after ``repeat_interleave``: ``k_width`` is the full
    query width under GQA), and in the backward autograd's casts of dq and dk back to fp32.
    v is already bf16. 2 kernels, ``(wide_b + act_b) * tokens * (q_width + k_width)`` bytes.

    Example: 1 token, q 8, k 8: (4 + 2) * 16 = 96 bytes.

    References
    ----------
    ``aten/src/ATen/autocast_mode.cpp`` (``scaled_dot_product_attention`` in the CUDA
    lower-precision list); ``benchmarks/calibrate_gpu.py`` ``LlamaBlock.forward``.
    """
    if wide_b == act_b:
        return []
    return [Term("copy", (wide_b + act_b) * _e(tokens) * (_e(q_width) + _e(k_width)), 2)]


def swiglu(tokens, ffn_width, act_b: float, pass_: str) -> list[Term]:
    """``g, u = gate_up(x).chunk(2, -1); silu(g) * u`` in bf16 (``ffn_width`` = f on this GPU).
    Forward: ``silu`` (reads and writes ``f``), ``mul`` (reads ``2f``, writes ``f``): 2 kernels,
    ``5*act_b*T*f`` bytes. Backward: the product's two ``mul`` (read 2, write 1 each),
    ``silu_backward`` (read 2, write 1) and the ``cat`` of d(gate), d(up) that the chunk's
    backward builds (reads and writes ``2f``): 4 kernels, ``13*act_b*T*f`` bytes.

    Example: 1 token, f = 4, bf16: forward 40 bytes, backward 104 bytes.

    References
    ----------
    ``benchmarks/calibrate_gpu.py`` ``LlamaBlock.forward``; Shazeer 2020 (GLU variants);
    ``tools/autograd/derivatives.yaml`` (``silu``, ``mul``, ``chunk`` -> ``cat``).
    """
    tf = _e(tokens) * _e(ffn_width)
    if pass_ == "fwd":
        return [Term("gelu", 2 * act_b * tf, 1), Term("add", 3 * act_b * tf, 1)]
    return [Term("add", 2 * 3 * act_b * tf, 2), Term("gelu", 3 * act_b * tf, 1),
            Term("copy", 4 * act_b * tf, 1)]


L2_BYTES = 50 * 2**20
"""L2 cache of an H100 / H200 [bytes] (NVIDIA H100 Tensor Core GPU Architecture whitepaper,
2022: 50 MB)."""

SOFTMAX_ROWS_PER_SM = 2 * 132
"""Rows of ``cunn_SoftMaxForward`` in flight on an H200: one 1024-thread block per row
(``SoftMax_getBlockSize``), 2 blocks per SM (2048 threads), 132 SMs (``env.json``)."""


def log_softmax(tokens, vocab, pass_: str, elem_b: float = F32) -> list[Term]:
    """fp32 ``log_softmax`` over vocab-wide rows (``F.cross_entropy(logits.float())``). A row
    of more than 48 KiB does not fit ``cunn_SoftMaxForwardSmem``'s shared memory, so the regular
    ``cunn_SoftMaxForward`` reads the row three times (max, sum of exp, epilogue) and writes it
    once; the re-reads hit L2 while the rows in flight fit it (:data:`SOFTMAX_ROWS_PER_SM` x row
    bytes <= :data:`L2_BYTES`: GPT's 50,304 fp32 columns, 53 MB), else they come from HBM (the
    fraction that does not fit: Llama 3's 128,256 columns, 135 MB in flight, 61 %). The
    backward (``cunn_SoftMaxBackward``) reads the gradient twice (row sum, epilogue) and the
    output once, and writes the input gradient. One kernel each.

    Example: 4096 tokens x 128,256 fp32: miss = 1 - 52.4 MB / 135.4 MB = 0.613, forward
    (4 * (1 + 2 * 0.613) + 4) = 12.9 bytes per element.

    References
    ----------
    PyTorch ``aten/src/ATen/native/cuda/SoftMax.cu`` (``host_softmax``: ``can_use_smem``,
    ``cunn_SoftMaxForward``, ``cunn_SoftMaxBackward``).
    """
    n = _e(tokens) * _e(vocab)
    row = elem_b * _e(vocab)
    miss = np.clip(1.0 - L2_BYTES / (SOFTMAX_ROWS_PER_SM * row), 0.0, 1.0)
    if pass_ == "fwd":
        return [Term("copy", elem_b * (2.0 + 2.0 * miss) * n, 1)]
    return [Term("copy", elem_b * (3.0 + miss) * n, 1)]


def layer_terms(model, tokens, tp, seq: float, act_b: float, autocast: bool, pass_: str
                ) -> list[Term]:
    """The Llama-style kernels of one eager layer on this GPU (``pass_`` = fwd or bwd): SwiGLU
    (:func:`swiglu`), RoPE of q and of k (:func:`rope`, one application each), the GQA repeat
    of k and v (:func:`gqa_repeat`) and the casts around attention (:func:`sdpa_casts`). Empty
    for a GPT-2-style layer (learned positions, GELU, multi-head attention)."""
    tp = np.asarray(tp, dtype=np.float64)
    d = model.head_size
    q_w = model.num_attention_heads / tp * d
    kv_w = np.maximum(model.kv_heads / tp, 1.0) * d
    f_gpu = model.ffn_hidden_size / tp
    terms: list[Term] = []
    if model.gated_mlp:
        terms += swiglu(tokens, f_gpu, act_b, pass_)
    wide = F32 if autocast else act_b
    k_b = act_b
    if model.position_embedding == "rope":
        terms += rope(tokens, q_w, seq, d, act_b, pass_, wide)
        terms += rope(tokens, kv_w, seq, d, act_b, pass_, wide)
        k_b = wide
        k_cast_w = np.where(q_w > kv_w, q_w, kv_w)  # k is cast after the repeat
        terms += sdpa_casts(tokens, q_w, k_cast_w, wide, act_b, pass_)
    terms += gqa_repeat(tokens, q_w, kv_w, k_b, act_b, pass_)
    return terms
