"""What the fused attention kernel does beyond the calibrated causal flash attention: the
sliding-window layers' skipped tiles and the exponential unit's floor on the forward.

* **Sliding window** (Megatron-Core ``window_size`` / ``window_attn_skip_freq``, GPT-OSS:
  128 tokens on every other layer): cuDNN's fused attention (Transformer Engine
  ``FusedAttention``, sliding window since cuDNN 9.2) visits only the key tiles that intersect
  the band, ``ceil(W/T) + 1`` of ``T``-wide tiles per query tile against ``(s/T + 1)/2`` for the
  causal square (:func:`window_tile_fraction`).
* **Which kernel** (:func:`te_attention_backend`, Transformer Engine's
  ``get_attention_backend``): cuDNN's fused attention wherever it is eligible on Hopper and
  later (the calibration's kernel: PyTorch >= 2.10 SDPA prefers cuDNN on sm90 / sm100 once the
  bundled cuDNN passes 9.15, and the H200 table's 606 TFLOP/s causal forward at head dim 128 is
  above anything flash-attn 2 reaches on Hopper); the ``flash-attn`` 2 package where a recipe
  turns cuDNN off (``NVTE_FUSED_ATTN=0``: DGX Cloud's Grok-1 and Nemotron-4 340B recipes on
  NeMo 24.09 / 24.12, which ship no flash-attn 3); the unfused path where neither qualifies.
  flash-attn 2 issues Ampere ``mma.sync`` MMAs, not Hopper's ``wgmma``: on H100 it plateaus at
  a third of the dense peak (:data:`FLASH_ATTN_2_PEAK_FRACTION`,
  :func:`flash_attn2_slowdown`).
* **Exponential floor** (FlashAttention-4, Zadouri et al. 2026): the forward computes one
  ``exp`` per score on the special function units (16 ``MUFU.EX2`` per clock and SM from Volta
  to Blackwell, 32 on Blackwell Ultra), whose rate did not grow with the tensor cores; per MMA
  FLOP that is 16/4096 on Hopper and 16/8192 on Blackwell, so at head dim 64 a Blackwell
  forward is bound by the exponentials, not the MMAs (:func:`attention_exp_floor_s`).

References
----------
Zadouri, Hoehnerbach, Shah, Liu, Thakkar, Dao 2026, "FlashAttention-4: Algorithm and Kernel
Pipelining Co-Design for Asymmetric Hardware Scaling" (Together AI blog: B200 forward bound by the
exponential, 1605 TFLOP/s at head dim 128, up to 1.3x cuDNN 9.13; SFU count unchanged from
H100); NVIDIA technical blog "Making Softmax More Efficient with NVIDIA Blackwell Ultra" (2026:
doubled ``MUFU.EX2`` throughput over Blackwell); NVIDIA H100 whitepaper (4096 dense bf16 FLOP per
clock and SM); cudnn-frontend PR 505 (cuDNN sliding-window backward timings); Transformer Engine
PR 992 / 1212 (cuDNN sliding window); Megatron-Core ``transformer/utils.py``
(``is_layer_window_attention``); Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao 2024,
"FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision"
(arXiv:2407.08608), Figs. 4 and 6 (H100 SXM5 BF16 forward / backward TFLOP/s of flash-attn 2,
cuDNN and FA3); Transformer Engine ``pytorch/attention/dot_product_attention/utils.py``
(``get_attention_backend``) and ``common/fused_attn/fused_attn.cpp``
(``nvte_get_fused_attn_backend``: non-vanilla softmax from cuDNN 9.13.1, sliding window from
9.2); PyTorch ``sdp_utils.cpp`` ``check_prefer_cudnn_attention``.
"""

from __future__ import annotations

import numpy as np

from perfmodel.hardware.overlap import gpu_generation
from perfmodel.spec.specs import GPUSpec, ModelSpec

__all__ = [
    "ATTENTION_BACKENDS",
    "ATTENTION_EXP_UTILISATION",
    "ATTENTION_TILE",
    "FLASH_ATTN_2_PEAK_FRACTION",
    "FLASH_ATTN_2_REFERENCE_SEQ",
    "SFU_EXP_PER_CLOCK_SM",
    "attention_exp_floor_s",
    "exp_per_mma_flop",
    "flash_attn2_peak_fraction",
    "flash_attn2_slowdown",
    "te_attention_backend",
    "window_layer_factor",
    "window_tile_fraction",
]

ATTENTION_TILE = 128
"""Key / query tile of the fused attention kernels [tokens] (cuDNN and FlashAttention tile the
sequence in blocks of 128 on Hopper and Blackwell)."""

ATTENTION_EXP_UTILISATION = 0.549
"""Share of the exponential unit's rate that a fused attention forward sustains where it is
exp-bound: cuDNN 9.13 on B200 at head dim 128 (FlashAttention-4's 1605 TFLOP/s is "up to 1.3x"
cuDNN's: >= 1235 TFLOP/s), where one score costs 512 MMA FLOP and one exp, and B200's exp rate is
16 per clock and SM against 8192 FLOP: 1235 / 2250 = 0.549. Derived from the cited numbers, not
fitted on the validation rows."""

_TENSOR_FLOP_PER_CLOCK_SM = {"volta": 1024.0, "ampere": 2048.0, "hopper": 4096.0,
                             "blackwell": 8192.0}
"""Dense 16-bit tensor FLOP per clock and SM (NVIDIA whitepapers: V100 125 TFLOPS = 80 SMs x
1024 x 1.53 GHz, A100 312 = 108 x 2048 x 1.41, H100 989 = 132 x 4096 x 1.83; B200 2250 = 148 x
8192 x 1.855)."""


SFU_EXP_PER_CLOCK_SM = 16.0
"""``MUFU.EX2`` exponentials per clock and SM where the GPU spec does not state its own
(``GPUSpec.sfu_exp_per_clock_sm``; the Blackwell Ultra presets state 32): 16 from Volta to
Blackwell (CUDA C++ Programming Guide, arithmetic instruction throughput; FlashAttention-4)."""


def exp_per_mma_flop(gpu: GPUSpec) -> float:
    """Exponentials per dense 16-bit MMA FLOP of the GPU: its SFU exponentials per clock and
    SM (``gpu.sfu_exp_per_clock_sm``, else :data:`SFU_EXP_PER_CLOCK_SM`; B300 / GB300: 32)
    over its tensor FLOP per clock and SM; 0 for other parts (no floor)."""
    gen = gpu_generation(gpu)
    if gen not in _TENSOR_FLOP_PER_CLOCK_SM:
        return 0.0
    sfu = gpu.sfu_exp_per_clock_sm or SFU_EXP_PER_CLOCK_SM
    return sfu / _TENSOR_FLOP_PER_CLOCK_SM[gen]


def attention_exp_floor_s(gpu: GPUSpec, batch_heads, seq, causal: bool = True) -> np.ndarray:
    """Least time [s] of an attention forward over ``batch_heads`` heads of ``seq`` queries and
    keys: one exponential per score (``bh*s^2``, halved when causal) at the GPU's exp rate,
    ``peak_bf16 * exp_per_mma_flop * ATTENTION_EXP_UTILISATION``; 0 where the rate is unknown.

    Example: B200 (2250 TFLOP/s, 1/512 exp per FLOP): 4 x 64 heads x 4096^2 / 2 = 2.15e9 exps
    at 4.39e12 * 0.549 per s = 0.89 ms, twice the MMA-bound time at head dim 64.
    """
    r = exp_per_mma_flop(gpu)
    n_exp = np.asarray(batch_heads, float) * np.asarray(seq, float) ** 2 * (0.5 if causal else 1.0)
    if r <= 0:
        return np.zeros_like(n_exp)
    return n_exp / (gpu.peak_flops("bf16") * r * ATTENTION_EXP_UTILISATION)


def window_tile_fraction(seq, window, tile: int = ATTENTION_TILE) -> np.ndarray:
    """Attention work of a sliding-window layer over the causal layer's: the key tiles a query
    tile visits, ``ceil(W/T) + 1``, over the causal average ``(s/T + 1)/2``, at most 1.

    Example: s 4096, W 128: 2 / 16.5 = 0.121; W 511: 5 / 16.5 = 0.303 (cuDNN, cudnn-frontend
    PR 505: 171 us against 558 us causal, 0.306).
    """
    s = np.asarray(seq, dtype=np.float64)
    visited = np.ceil(float(window) / tile) + 1.0
    return np.minimum(1.0, visited / ((s / tile + 1.0) / 2.0))


def window_layer_factor(model: ModelSpec, seq) -> np.ndarray:
    """Attention work of the average layer over full causal attention: ``1 - f + f * r`` with
    ``f`` the windowed share of the layers (:attr:`ModelSpec.window_layer_fraction`) and ``r``
    :func:`window_tile_fraction` (1 without a window)."""
    f = model.window_layer_fraction
    if f <= 0:
        return np.ones_like(np.asarray(seq, dtype=np.float64))
    return 1.0 - f + f * window_tile_fraction(seq, model.attention_window)


ATTENTION_BACKENDS = ("cudnn", "flash-attn-2", "unfused")
"""Transformer Engine's DotProductAttention backends the model prices: ``cudnn``
(FusedAttention, sub-backend F16_arbitrary_seqlen), ``flash-attn-2`` (FlashAttention with the
flash-attn 2 package) and ``unfused`` (UnfusedDotProductAttention: the scores materialised,
:class:`~perfmodel.spec.specs.TrainingSpec` ``flash_attention = False``)."""

FLASH_ATTN_2_PEAK_FRACTION = {
    "fwd": ((64, 322.0 / 989.0), (128, 333.0 / 989.0), (256, 297.0 / 989.0)),
    "bwd": ((64, 287.0 / 989.0), (128, 318.0 / 989.0)),
}
"""flash-attn 2 on H100 SXM5 (BF16, sequence 8k, where its rate has plateaued), as a fraction
of the 989 TFLOP/s dense peak, by head dim: forward 322 (d 64, non-causal panel), 333 (d 128,
causal), 297 TFLOP/s (d 256, causal); backward 287 (d 64), 318 TFLOP/s (d 128). cuDNN in the
same figures: 412 / 529 / 497 forward, 432 / 518 backward; FA3 646 / 602 / 628 forward.
Source: FlashAttention-3 (Shah et al. 2024), Figs. 4 and 6. Read from the paper, not fitted."""


def flash_attn2_peak_fraction(head_dim, pass_: str) -> np.ndarray:
    """flash-attn 2's sustained fraction of the dense 16-bit peak on Hopper for ``pass_``
    (``fwd`` / ``bwd``) at ``head_dim``: :data:`FLASH_ATTN_2_PEAK_FRACTION` interpolated in
    ``log2(head_dim)``, held constant outside the measured head dims.

    Example: d 128 forward 333/989 = 0.337; d 192 forward halfway (in log2) between 0.337 and
    0.300: 0.316; d 192 backward 318/989 = 0.322 (no measurement above d 128).
    """
    if pass_ not in FLASH_ATTN_2_PEAK_FRACTION:
        raise ValueError(f"pass {pass_!r}: expected 'fwd' or 'bwd'")
    pts = FLASH_ATTN_2_PEAK_FRACTION[pass_]
    x = np.log2(np.maximum(np.asarray(head_dim, dtype=np.float64), 1.0))
    return np.interp(x, [np.log2(d) for d, _ in pts], [f for _, f in pts])


FLASH_ATTN_2_REFERENCE_SEQ = 8192
"""Sequence length [tokens] of :data:`FLASH_ATTN_2_PEAK_FRACTION`; the FlashAttention-3
benchmarks hold batch x seqlen = 16k tokens and heads x head_dim = 2048 (Sec. 4.1), so at 8k:
batch 2 and 2048/d heads."""


def flash_attn2_slowdown(cal, gpu: GPUSpec, backend: str, head_dim, pass_: str) -> float:
    """How much longer a flash-attn 2 ``pass_`` takes than the calibrated (cuDNN) kernel, at
    least 1: the calibration's causal rate at the FlashAttention-3 benchmark shape
    (:data:`FLASH_ATTN_2_REFERENCE_SEQ`, ``bh = 2 * 2048/d``) over flash-attn 2's rate there
    (:func:`flash_attn2_peak_fraction` of the dense bf16 peak). Applied to the calibrated time
    at every shape, so flash-attn 2 keeps the calibration's dependence on heads and sequence
    and matches the published rate at the published shape. 1 unless ``backend`` is
    ``flash-attn-2`` on Hopper or Blackwell (there FA2's Ampere ``mma.sync`` kernels use
    neither ``wgmma`` nor ``tcgen05``; Blackwell takes the Hopper fraction, an assumption with
    no published measurement behind it); on Ampere and older flash-attn 2 is the native kernel
    and the calibrated time stands.

    Example: H100, d 128: the shipped calibration runs the forward at 580 TFLOP/s at s 8192,
    bh 32 (FLOPs ``4*bh*s^2*d/2``, x2.5 backward), flash-attn 2 at 333: 1.74x; backward 438
    against 318: 1.38x.
    """
    if backend != "flash-attn-2" or gpu_generation(gpu) not in ("hopper", "blackwell"):
        return 1.0
    s = float(FLASH_ATTN_2_REFERENCE_SEQ)
    d = float(head_dim)
    bh = 16384.0 / s * 2048.0 / d
    flops = (1.0 if pass_ == "fwd" else 2.5) * 4.0 * bh * s**2 * d / 2.0
    cal_rate = flops / float(cal.attention_time_s(bh, s, d, pass_, causal=True))
    fa2_rate = float(flash_attn2_peak_fraction(d, pass_)) * gpu.peak_flops("bf16")
    return max(1.0, cal_rate / fa2_rate)


def te_attention_backend(gpu: GPUSpec, *, nvte_fused_attn: bool = True,
                         nvte_flash_attn: bool = True, softmax_type: str = "vanilla",
                         cudnn_version: tuple[int, ...] | None = None,
                         mla: bool = False) -> str:
    """The backend Transformer Engine's ``DotProductAttention`` selects for causal bf16
    self-attention in training (:data:`ATTENTION_BACKENDS`), after ``get_attention_backend``:

    * the environment (``NVTE_FUSED_ATTN``, ``NVTE_FLASH_ATTN``) switches a backend off;
    * below sm80 (Volta) neither fused nor flash-attn 2 runs;
    * a non-vanilla softmax (``learnable`` attention sinks, ``off-by-one``) turns FlashAttention
      off, and cuDNN supports it from 9.13.1 (``nvte_get_fused_attn_backend``: "pre-9.13.1:
      vanilla; 9.13.1+: vanilla, off-by-one, learnable"); ``cudnn_version`` None: recent enough;
    * flash-attn 2 has no MLA (q/k head dim != v head dim);
    * both eligible: cuDNN on Hopper and later ("FusedAttention preference on Hopper+ for
      performance reasons"), flash-attn 2 before;
    * flash-attn 3 is taken as not installed (NeMo containers through 24.12 ship flash-attn 2
      only).

    Example: H100 with ``NVTE_FUSED_ATTN=0`` (DGX Cloud Grok-1): ``flash-attn-2``; GPT-OSS's
    learnable sinks on cuDNN 9.13.1 (NeMo 25.11): ``cudnn``; the same on cuDNN 9.11 (NeMo
    25.09): ``unfused``.
    """
    gen = gpu_generation(gpu)
    if gen == "volta":  # "Disabling FlashAttention 2 / FusedAttention for compute capability < sm80"
        return "unfused"
    vanilla = softmax_type == "vanilla"
    cudnn_ok = vanilla or cudnn_version is None or tuple(cudnn_version) >= (9, 13, 1)
    fused = nvte_fused_attn and cudnn_ok
    flash = nvte_flash_attn and vanilla and not mla
    if fused and (gen in ("hopper", "blackwell") or not flash):
        return "cudnn"
    if flash:
        return "flash-attn-2"
    return "unfused"
