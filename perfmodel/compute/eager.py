"""Eager PyTorch kernels of a Llama-style layer (RMSNorm, RoPE, GQA, SwiGLU) under autocast.

The calibration script's ``LlamaBlock`` (``benchmarks/calibrate_gpu.py``) runs every piece of the
layer as separate PyTorch ops. Each function below is one kernel family of that code: the HBM
bytes it moves (reads + writes, logical tensor sizes) and the kernels it launches, per layer and
pass, for ``tokens`` rows on this GPU. :mod:`perfmodel.compute.layer` prices each family with the
measured memory-bound bandwidth of its kind (``memops.csv``, :meth:`Calibration.membw_bytes_per_s`)
and charges every kernel to the host (:data:`perfmodel.compute.layer.CPU_FWD_LAUNCH_S`).

The inventory was read from a recorded step (``harness/eager_inventory.py``: every aten op of
the script's own ``Llama`` under ``TorchDispatchMode``) and is checked against it in
``tests/perfmodel/compute/test_eager.py``. Dtypes follow CUDA autocast (``aten/src/ATen/autocast_mode.cpp``):
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
    "L2_BYTES",
    "SOFTMAX_ROWS_PER_SM",
    "Term",
    "autocast_casts",
    "bias_grads",
    "cross_entropy",
    "gelu",
    "gqa_repeat",
    "layer_terms",
    "llama_terms",
    "log_softmax",
    "norms",
    "residual_adds",
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


def llama_terms(model, tokens, tp, seq: float, act_b: float, autocast: bool, pass_: str,
                ffn_width=None) -> list[Term]:
    """The Llama-style kernels of one eager layer on this GPU (``pass_`` = fwd or bwd): SwiGLU
    (:func:`swiglu`), RoPE of q and of k (:func:`rope`, one application each), the GQA repeat
    of k and v (:func:`gqa_repeat`) and the casts around attention (:func:`sdpa_casts`). Empty
    for a GPT-2-style layer (learned positions, GELU, multi-head attention)."""
    tp = np.asarray(tp, dtype=np.float64)
    d = model.head_size
    q_w = model.num_attention_heads / tp * d
    kv_w = np.maximum(model.kv_heads / tp, 1.0) * d
    f_gpu = model.ffn_hidden_size / tp if ffn_width is None else ffn_width
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


def norms(tokens, hidden, res_b: float, pass_: str, count: int = 2) -> list[Term]:
    """``count`` LayerNorm / RMSNorm of the fp32 residual stream (fp32 input and weight: no
    autocast cast). Forward one kernel each reading and writing ``res_b*T*h``; backward the dX
    kernel (reads dy and x, writes dx: ``3*res_b*T*h``) and the weight-gradient reduction (reads
    dy and x again: ``2*res_b*T*h``), 2 kernels each.

    Example: 1 token, h = 4, fp32, 2 norms: forward 2 x 32 bytes, backward 2 x (48 + 32) bytes.

    References
    ----------
    PyTorch ``aten/src/ATen/native/cuda/layer_norm_kernel.cu`` (``LayerNormForwardCUDAKernel``,
    ``layer_norm_backward_cuda``: ``ComputeInternalGradients`` / ``GammaBetaBackward``), and
    its RMS variant behind ``aten._fused_rms_norm`` (PyTorch >= 2.9, ``layer_norm.cpp``).
    """
    th = _e(tokens) * hidden
    if pass_ == "fwd":
        return [Term("layernorm", count * 2 * res_b * th, count)]
    return [Term("layernorm", count * 3 * res_b * th, count),
            Term("layernorm", count * 2 * res_b * th, count)]


def autocast_casts(tokens, norm_tokens, hidden, weights, weight_tensors: int, res_b: float,
                   act_b: float, w_b: float, pass_: str) -> list[Term]:
    """Autocast's casts in one layer with fp32 weights. Forward: the fp32 inputs of the two GEMMs
    that read the residual stream's norms (qkv, fc1 / gate_up: ``(res_b + act_b)*T*h`` each) and
    every weight tensor to bf16 (``(w_b + act_b)*weights``; each forward and each recompute: the
    cast cache lives only inside the outermost autocast region). Backward: the fp32 residual
    gradients cast to bf16 for the two GEMMs that write the residual stream (proj / o, fc2 /
    down), the bf16 input gradients of qkv and fc1 cast back to fp32, and every weight gradient
    to fp32 (autograd casts each gradient to its input's dtype).

    Example: 1 token, h = 4, 16 weights in 4 tensors, fp32 -> bf16: forward 2 x 24 + 96 bytes
    over 6 kernels; backward 4 x 24 + 96 bytes over 8 kernels.

    References
    ----------
    ``aten/src/ATen/autocast_mode.cpp`` (``cached_cast``, lower-precision ``linear``);
    ``torch/csrc/autograd/engine.cpp`` (``validate_outputs`` casts gradients).
    """
    th, tnh = _e(tokens) * hidden, _e(norm_tokens) * hidden
    wt = Term("copy", (w_b + act_b) * _e(weights) + 0 * th, weight_tensors)
    if pass_ == "fwd":
        return [Term("copy", 2 * (res_b + act_b) * th, 2), wt]
    return [Term("copy", 2 * (res_b + act_b) * tnh, 2), Term("copy", 2 * (res_b + act_b) * th, 2),
            wt]


def residual_adds(tokens, hidden, res_b: float, act_b: float, pass_: str, count: int = 2
                  ) -> list[Term]:
    """The residual adds ``x + f(x)`` of the fp32 stream and a bf16 branch output: forward reads
    ``res_b + act_b`` and writes ``res_b`` per element; backward sums the two fp32 gradients of
    the stream (``3*res_b``). One kernel each (``count``: 1 in a recompute that stops early).

    Example: 1 token, h = 4: forward (8 + 2) * 4 = 40 bytes per add, backward 48.
    """
    th = _e(tokens) * hidden
    per = (2 * res_b + act_b) if pass_ == "fwd" else 3 * res_b
    return [Term("add", count * per * th, count)]


def gelu(tokens, ffn_width, act_b: float, pass_: str) -> list[Term]:
    """Exact GELU of the bf16 fc1 output (GPT-2): forward reads and writes ``f`` (``2*act_b``),
    ``gelu_backward`` reads the gradient and the input, writes one (``3*act_b``). 1 kernel.

    Example: 1 token, f = 4, bf16: forward 16 bytes, backward 24.
    """
    tf = _e(tokens) * _e(ffn_width)
    return [Term("gelu", (2 if pass_ == "fwd" else 3) * act_b * tf, 1)]


def bias_grads(tokens, widths, act_b: float) -> list[Term]:
    """Bias gradients of the biased Linears (``sum`` of each output gradient over the tokens):
    one reduction per bias reading ``act_b*T*width``.

    Example: 1 token, widths (12, 4, 16, 4), bf16: 72 bytes over 4 kernels.
    """
    return [Term("add", act_b * _e(tokens) * sum(_e(w) for w in widths), len(widths))]


def layer_terms(model, tokens, norm_tokens, tp, ffn_width, qkv_cols, seq: float, act_b: float,
                res_b: float, w_b: float, autocast: bool, pass_: str, early_stop: bool = False
                ) -> list[Term]:
    """Every memory-bound kernel of one eager layer on this GPU (the GEMMs and attention are
    timed apart): the two norms (:func:`norms`), autocast's casts (:func:`autocast_casts`),
    the residual adds (:func:`residual_adds`), GELU (:func:`gelu`) or the Llama-style families
    (:func:`llama_terms`), and in the backward the ``cat`` of dq, dk, dv (the qkv ``split``'s
    backward: reads and writes the qkv width) and the bias gradients (:func:`bias_grads`).
    ``early_stop``: the checkpoint's recompute stops at the last saved tensor (fc2's input),
    so the last residual add is not rerun. ``tokens``: GEMM rows on this GPU, ``norm_tokens``:
    rows of the norm / residual region, ``ffn_width``: MLP intermediate columns on this GPU,
    ``qkv_cols``: output columns of the qkv GEMM."""
    tp = np.asarray(tp, dtype=np.float64)
    h = model.hidden_size
    f_gpu, qkv_w = ffn_width, qkv_cols
    has_bias = model.linear_bias
    weight_tensors = 4 + (4 if has_bias else 0)
    terms = norms(norm_tokens, h, res_b, pass_)
    if autocast:
        terms += autocast_casts(tokens, norm_tokens, h, model.layer_params() / tp,
                                weight_tensors, res_b, act_b, w_b, pass_)
    if pass_ == "fwd":
        terms += residual_adds(norm_tokens, h, res_b, act_b, pass_, 1 if early_stop else 2)
    else:
        terms += residual_adds(norm_tokens, h, res_b, act_b, pass_)
        terms.append(Term("copy", 2 * act_b * _e(tokens) * qkv_w, 1))  # cat of dq, dk, dv
        if has_bias:
            cols = f_gpu * (2 if model.gated_mlp else 1)
            terms += bias_grads(tokens, (qkv_w, h, cols, h), act_b)
    if not model.gated_mlp:
        terms += gelu(tokens, f_gpu, act_b, pass_)
    return terms + llama_terms(model, tokens, tp, seq, act_b, autocast, pass_, f_gpu)


def cross_entropy(tokens, vocab, hidden, res_b: float, act_b: float, w_b: float,
                  autocast: bool, pass_: str) -> list[Term]:
    """The script's loss head around the logit GEMM: final norm (:func:`norms`), under autocast
    the casts of its input and of the (untied or tied) fp32 output weight to bf16 and
    ``logits.float()`` (``(act_b + 4)`` per logit); the fp32 ``log_softmax``
    (:func:`log_softmax`) and ``nll_loss`` (timed as one short kernel by the caller). Backward:
    ``nll_loss_backward`` (zero-filled fp32 gradient + scatter: 4 bytes per logit), the
    ``log_softmax`` backward, the gradient's cast to bf16, the weight and input gradients'
    casts back to fp32, and the norm's backward.

    Example: 1 token, vocab 8, h = 2, fp32 weights, bf16: forward casts 12 + 96 + 48 bytes.

    References
    ----------
    ``benchmarks/calibrate_gpu.py`` (``F.cross_entropy(logits.float().view(-1, vocab), ...)``);
    PyTorch ``aten/src/ATen/native/cuda/Loss.cu`` (``nll_loss_backward``).
    """
    t, v = _e(tokens), _e(vocab)
    th, wv = t * hidden, v * hidden
    if pass_ == "fwd":
        terms = norms(t, hidden, res_b, "fwd", count=1)
        if autocast:
            terms += [Term("copy", (res_b + act_b) * th, 1), Term("copy", (w_b + act_b) * wv, 1),
                      Term("copy", (act_b + F32) * t * v, 1)]
        return terms + log_softmax(t, v, "fwd")
    terms = []
    if autocast:
        terms += [Term("copy", (F32 + act_b) * t * v, 1), Term("copy", (act_b + w_b) * wv, 1),
                  Term("copy", (act_b + res_b) * th, 1)]
    terms += [Term("copy", F32 * t * v, 1)] + log_softmax(t, v, "bwd")
    return terms + [Term("layernorm", 2 * 5 * res_b * th, 2)]
