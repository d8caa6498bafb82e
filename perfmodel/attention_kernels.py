"""What the fused attention kernel does beyond the calibrated causal flash attention: the
sliding-window layers' skipped tiles and the exponential unit's floor on the forward.

* **Sliding window** (Megatron-Core ``window_size`` / ``window_attn_skip_freq``, GPT-OSS:
  128 tokens on every other layer): cuDNN's fused attention (Transformer Engine
  ``FusedAttention``, sliding window since cuDNN 9.2) visits only the key tiles that intersect
  the band, ``ceil(W/T) + 1`` of ``T``-wide tiles per query tile against ``(s/T + 1)/2`` for the
  causal square (:func:`window_tile_fraction`).
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
(``is_layer_window_attention``).
"""

from __future__ import annotations

import numpy as np

from perfmodel.overlap import gpu_generation
from perfmodel.specs import GPUSpec, ModelSpec

__all__ = [
    "ATTENTION_EXP_UTILISATION",
    "ATTENTION_TILE",
    "SFU_EXP_PER_CLOCK_SM",
    "attention_exp_floor_s",
    "exp_per_mma_flop",
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
