"""Eager kernel families (perfmodel/eager.py): hand-computed bytes, and the inventory checked
against a recorded step of the calibration script's own models (harness/eager_inventory.py)."""

import numpy as np
import pytest

from perfmodel.compute import eager
from perfmodel.compute import layer as compute
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, load_gpu, load_training


def _sum(terms):
    return float(sum(np.sum(t.nbytes) for t in terms)), sum(t.kernels for t in terms)


def test_rope_hand_computed():
    # 1 token, width 2 (E = 2), head_dim 2, seq 1: 4 table reads of 4 bytes = 16 bytes
    b, k = _sum(eager.rope(1, 2, 1, 2, 2.0, "fwd"))
    assert (b, k) == (4 * 6 * 2 / 2 + 16 + 2 * 12 * 2 / 2 + 8 * 2, 7)  # 24 + 16 + 24 + 16
    assert b == 80
    b, k = _sum(eager.rope(1, 2, 1, 2, 2.0, "bwd"))
    assert k == 16
    assert b == pytest.approx(52 * 2 + 16)  # (28 + 12 * 2) * E + table
    # without autocast (bf16 tables) no casts in the backward: 12 kernels
    assert _sum(eager.rope(1, 2, 1, 2, 2.0, "bwd", wide_b=2.0))[1] == 12


def test_gqa_repeat_hand_computed():
    assert _sum(eager.gqa_repeat(1, 8, 2, 4.0, 2.0, "fwd")) == (60.0, 2)
    assert _sum(eager.gqa_repeat(1, 8, 2, 4.0, 2.0, "bwd")) == (68.0, 3)
    assert eager.gqa_repeat(1, 8, 8, 4.0, 2.0, "fwd") == []


def test_sdpa_casts_and_swiglu_hand_computed():
    assert _sum(eager.sdpa_casts(1, 8, 8, 4.0, 2.0, "fwd")) == (96.0, 2)
    assert eager.sdpa_casts(1, 8, 8, 2.0, 2.0, "fwd") == []
    assert _sum(eager.swiglu(1, 4, 2.0, "fwd")) == (40.0, 2)
    assert _sum(eager.swiglu(1, 4, 2.0, "bwd")) == (104.0, 4)


def test_common_families_hand_computed():
    # norms: 1 token, h = 4, fp32: forward 2 x 32 bytes, backward 2 x (48 + 32), 2 / 4 kernels
    assert _sum(eager.norms(1, 4, 4.0, "fwd")) == (64.0, 2)
    assert _sum(eager.norms(1, 4, 4.0, "bwd")) == (160.0, 4)
    # autocast: 16 weights in 4 tensors: forward 2 x 24 + 96, backward 4 x 24 + 96
    assert _sum(eager.autocast_casts(1, 1, 4, 16, 4, 4.0, 2.0, 4.0, "fwd")) == (144.0, 6)
    assert _sum(eager.autocast_casts(1, 1, 4, 16, 4, 4.0, 2.0, 4.0, "bwd")) == (192.0, 8)
    assert _sum(eager.residual_adds(1, 4, 4.0, 2.0, "fwd")) == (80.0, 2)
    assert _sum(eager.residual_adds(1, 4, 4.0, 2.0, "bwd")) == (96.0, 2)
    assert _sum(eager.gelu(1, 4, 2.0, "fwd")) == (16.0, 1)
    assert _sum(eager.gelu(1, 4, 2.0, "bwd")) == (24.0, 1)
    assert _sum(eager.bias_grads(1, (12, 4, 16, 4), 2.0)) == (72.0, 4)


def test_cross_entropy_hand_computed():
    # 1 token, vocab 8, h = 2, fp32 weights, bf16: norm 16, casts 12 + 96 + 48, log_softmax
    # (GPT-sized rows: no L2 misses) 8 * 8 = 64 -> 236 bytes over 5 kernels
    b, k = _sum(eager.cross_entropy(1, 8, 2, 4.0, 2.0, 4.0, True, "fwd"))
    assert k == 5 and b == pytest.approx(16 + 12 + 96 + 48 + 64)
    # backward: casts 48 + 96 + 12, nll 32, log_softmax 3 * 4 * 8 = 96, norm 2 x 40
    b, k = _sum(eager.cross_entropy(1, 8, 2, 4.0, 2.0, 4.0, True, "bwd"))
    assert k == 7 and b == pytest.approx(48 + 96 + 12 + 32 + 96 + 80)


def test_log_softmax_rereads_only_beyond_l2():
    # GPT's 50,304 fp32 columns: 264 rows x 201 KB = 53.1 MB in flight, 1.3 % misses
    fwd_gpt = _sum(eager.log_softmax(1, 50304, "fwd"))[0] / 50304
    assert fwd_gpt == pytest.approx(4 * (2 + 2 * (1 - 50 * 2**20 / (264 * 4 * 50304))))
    assert fwd_gpt < 8.2
    # Llama 3's 128,256: 61.3 % of the re-reads miss L2 -> 12.9 bytes per element
    assert _sum(eager.log_softmax(1, 128256, "fwd"))[0] / 128256 == pytest.approx(12.9, abs=0.01)
    assert _sum(eager.log_softmax(1, 128256, "bwd"))[0] / 128256 == pytest.approx(14.45, abs=0.01)


# ---------------------------------------------------------------- against a recorded step
H, NH, NKV, FFN, V, S = 64, 4, 2, 96, 256, 32
GEMM_OR_ATTN = {"mm", "addmm", "bmm", "_scaled_dot_product_flash_attention_for_cpu",
                "_scaled_dot_product_flash_attention_for_cpu_backward"}
#: CUDA kernels of one recorded op where that is not one (slice_backward = zeros + copy_;
#: the norm backwards = dX kernel + the weight-gradient reduction; FA-2 backward = 3)
CUDA_KERNELS = {"slice_backward": 2, "native_layer_norm_backward": 2,
                "_fused_rms_norm_backward": 2,
                "_scaled_dot_product_flash_attention_for_cpu_backward": 3}


def _llama():
    return ModelSpec(name="tiny-llama", num_layers=1, hidden_size=H, num_attention_heads=NH,
                     num_kv_heads=NKV, ffn_hidden_size=FFN, vocab_size=V, max_seq_len=S,
                     activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     tied_embeddings=False, linear_bias=False)


def _gpt():
    return ModelSpec(name="tiny-gpt", num_layers=1, hidden_size=H, num_attention_heads=NH,
                     ffn_hidden_size=4 * H, vocab_size=V, max_seq_len=S)


@pytest.fixture(scope="module")
def recorded():
    pytest.importorskip("torch")
    from harness import eager_inventory as ei

    if not ei.SCRIPT.exists():
        pytest.skip("benchmarks/calibrate_gpu.py not in this checkout")
    out = {}
    for kind, kw in (("llama", {"kv_heads": NKV, "ffn": FFN}), ("gpt", {})):
        for rc in (False, True):
            out[kind, rc] = tuple(ei.record_step(kind, n, H, NH, V, S, recompute=rc, **kw)
                                  for n in (1, 2))
    return out


def _cuda_kernels(inv, phase):
    return sum(CUDA_KERNELS.get(o.name, 1) for o in inv.kernels(phase))


def _layer_ops(one, two, phase):
    """The ops of one layer: those of the 2-layer step beyond the 1-layer step's (the layers
    come first in the forward and last-but-embedding in the backward)."""
    a, b = one.kernels(phase), two.kernels(phase)
    n = len(b) - len(a)
    return b[1:1 + n] if phase == "fwd" else b[-1 - n:-1] if phase == "bwd" else b[:n]


def _analytic_phases(model, recompute=0):
    phases = []

    class Rec(compute._Phase):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            phases.append(self)

    training = load_training(seq_len=S, precision="bf16", optimizer="adamw", global_batch_size=1)
    orig = compute._Phase
    compute._Phase = Rec
    try:
        compute.compute_times(model, training, load_gpu("h200-sxm-141gb"),
                              ConfigBatch.from_arrays(micro_batch_size=1, recompute=recompute),
                              kernels="eager")
    finally:
        compute._Phase = orig
    return phases[0], phases[1], phases[2]  # layer forward, backward, full recompute


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("kind", ["llama", "gpt"])
def test_layer_kernel_count_matches_recorded_step(recorded, kind, recompute):
    """The CUDA kernels one more layer adds to the recorded step (forward; backward with the
    checkpoint's recompute) equal the model's launch count of a layer."""
    one, two = recorded[kind, recompute]
    fwd, bwd, rec = _analytic_phases(_llama() if kind == "llama" else _gpt(), 2 * recompute)
    assert _cuda_kernels(two, "fwd") - _cuda_kernels(one, "fwd") == fwd.launches[0]
    model_bwd = bwd.launches[0] + (rec.launches[0] if recompute else 0.0)
    assert _cuda_kernels(two, "bwd") - _cuda_kernels(one, "bwd") == model_bwd


def _is_llama_family(o):
    """Recorded ops of the families in eager.layer_terms: RoPE / GQA / SDPA-cast ops have 4-5-d
    outputs (heads split out), SwiGLU's are 3-d with the ffn (or 2 x ffn) width."""
    if o.name in GEMM_OR_ATTN:
        return False
    dims = [len(s) for s in o.out_shapes]
    return max(dims) >= 4 or any(len(s) == 3 and s[-1] in (FFN, 2 * FFN) for s in o.out_shapes)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_llama_families_bytes_match_recorded_step(recorded, phase):
    one, two = recorded["llama", False]
    ops = [o for o in _layer_ops(one, two, phase) if _is_llama_family(o)]
    rec_bytes = sum(o.in_bytes + o.out_bytes for o in ops)
    rec_kernels = sum(CUDA_KERNELS.get(o.name, 1) for o in ops)
    b, k = _sum(eager.llama_terms(_llama(), S, 1, S, 2.0, True, phase))
    assert k == rec_kernels
    assert b == pytest.approx(rec_bytes, rel=0.03)
