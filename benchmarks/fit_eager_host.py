"""Test the CPU-measured host structure of the eager step against the H200 e2e rows.

``benchmarks/host_structure.py`` measured, on a CPU, how the eager step's host time splits
(``hardware_specs/calibration/host_structure_cpu.csv``). This script turns that into a host model
in units of one forward kernel (:func:`cpu_structure`): a backward kernel costs
``bwd_ratio`` forward kernels, a checkpointed layer ``ckpt_kernels``, a parameter tensor in
``optimizer.step`` + ``zero_grad`` ``param_kernels``, the step's fixed work ``step_kernels``;
the optimizer's host part (:func:`step_host_s`) is composed with its device time by the same
smooth maximum as the other phases. Only the scale is fitted on the H200 rows
(``CPU_FWD_LAUNCH_S``: one forward kernel on the H200's host), optionally with a second scale on
the checkpoint. Objective: mean absolute log ratio predicted / measured over the 29 rows of
``hardware_specs/calibration/h200/e2e_dev.csv``. Reported: in-sample MAPE / worst row and
leave-one-model-out cross-validation, against the shipped model (``perfmodel.compute.layer``:
17 / 38 us per kernel, 1.5 ms per checkpoint, no optimizer host term), and the predictions of
gpt-350m (not in the dev rows) and of the script's Llama models.
Run: ``python benchmarks/fit_eager_host.py`` (about a minute).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodel.compute import layer as compute
from perfmodel.compute.layer import compute_times
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, load_gpu, load_training

GPU = load_gpu("h200-sxm-141gb")
STRUCTURE_CSV = ROOT / "hardware_specs" / "calibration" / "host_structure_cpu.csv"
GPT_LAYER_KERNELS = (20, 35)
"""Forward / backward kernels of the script's GPT layer as :mod:`perfmodel.compute.layer` counts them
(``tests/perfmodel/compute/test_eager.py`` asserts them against a recorded step)."""
GPT_LAYER_TENSORS, GPT_OUTSIDE_TENSORS = 12, 4
"""Parameter tensors of the script's GPT layer (4 weights, 4 biases, 2 LayerNorms x 2) and
outside the layers (token and position embeddings, final LayerNorm x 2; the head is tied)."""
NAMES = ("CPU_FWD_LAUNCH_S", "CPU_BWD_LAUNCH_S", "CHECKPOINT_CPU_S")


def cpu_structure(path=STRUCTURE_CSV) -> dict[str, float]:
    """The host structure in forward kernels, from the CPU fit ``t = a + b * layers``."""
    d = pd.read_csv(path).set_index(["recompute", "phase"])
    b = d["per_layer_s"]
    a = d["intercept_s"]
    kf = d["kernels_fixed"]
    kb = d["kernels_per_layer"]
    c_f = b[0, "fwd"] / GPT_LAYER_KERNELS[0]
    rec_ops = kb[1, "bwd"] - kb[0, "bwd"]  # ops the checkpoint recomputes per layer
    ckpt_s = (b[1, "fwd"] - b[0, "fwd"]) + (b[1, "bwd"] - b[0, "bwd"] - rec_ops * c_f)
    param_s = (b[0, "opt"] + b[0, "zero_grad"]) / GPT_LAYER_TENSORS
    step_s = ((a[0, "fwd"] - kf[0, "fwd"] * c_f)
              + (a[0, "bwd"] - kf[0, "bwd"] * b[0, "bwd"] / kb[0, "bwd"])
              + (a[0, "opt"] - GPT_OUTSIDE_TENSORS * param_s) + a[0, "zero_grad"])
    return {"cpu_fwd_kernel_s": c_f, "bwd_ratio": b[0, "bwd"] / GPT_LAYER_KERNELS[1] / c_f,
                "ckpt_kernels": ckpt_s / c_f, "param_kernels": param_s / c_f,
                "step_kernels": step_s / c_f,
                "per_layer_s": sum(b[0, p] for p in ("fwd", "bwd", "opt", "zero_grad")),
                "fixed_s": sum(a[0, p] for p in ("fwd", "bwd", "opt", "zero_grad"))}


@contextmanager
def host(fwd_s, bwd_s, ckpt_s):
    old = {n: getattr(compute, n) for n in NAMES}
    for n, v in zip(NAMES, (fwd_s, bwd_s, ckpt_s)):
        setattr(compute, n, v)
    try:
        yield
    finally:
        for n, v in old.items():
            setattr(compute, n, v)


def param_tensors(model) -> tuple[int, int]:
    """(per layer, outside the layers) parameter tensors: 4 linear weights, their biases with
    ``linear_bias``, the two norms (LayerNorm: weight and bias); outside: embedding, learned
    positions, final norm, an untied head (GPT: 12, 4; the script's Llama: 6, 3)."""
    nt = 2 if model.norm == "layernorm" else 1
    return (4 + (4 if model.linear_bias else 0) + 2 * nt,
            1 + (model.position_embedding == "learned") + nt + (not model.tied_embeddings))


def step_host_s(model, consts) -> float:
    """Host time of optimizer.step + zero_grad + the step's fixed work [s]."""
    fwd_s, _, _, param_k, step_k = consts
    per_layer, outside = param_tensors(model)
    return fwd_s * (param_k * (model.num_layers * per_layer + outside) + step_k)


def step_s(model, seq, mbs, rc, consts):
    """Predicted step [s]: the composition of tests/validation/test_h200_single_gpu.py, with the
    optimizer phase = smooth max of its device time and :func:`step_host_s`."""
    tr = load_training(seq_len=seq, precision="bf16", optimizer="adamw", global_batch_size=1)
    b = ConfigBatch.from_arrays(micro_batch_size=np.asarray(mbs),
                                recompute=np.where(np.asarray(rc) == 1, 2, 0))
    with host(*consts[:3]):
        t = compute_times(model, tr, GPU, b, kernels="eager")
    opt = compute._overlap_s(t["optimizer_s"], step_host_s(model, consts))
    return (model.num_layers * (t["layer_fwd_s"] + t["layer_bwd_s"] + t["layer_recompute_s"])
            + t["embed_fwd_s"] + t["embed_bwd_s"] + t["logits_fwd_s"] + t["logits_bwd_s"] + opt)


def gpt(name, L, h, nh):
    return ModelSpec(name=name, num_layers=L, hidden_size=h, num_attention_heads=nh,
                     ffn_hidden_size=4 * h, vocab_size=50304, max_seq_len=2048,
                     activation="gelu", norm="layernorm", position_embedding="learned",
                     tied_embeddings=True, linear_bias=True)


def llama(name, L, h, nh, nkv, ffn, vocab):
    return ModelSpec(name=name, num_layers=L, hidden_size=h, num_attention_heads=nh,
                     num_kv_heads=nkv, ffn_hidden_size=ffn, vocab_size=vocab, max_seq_len=4096,
                     activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     tied_embeddings=False, linear_bias=False)


LLAMAS = [llama("llama-1b", 16, 2048, 32, 8, 8192, 128256),
          llama("llama-3b", 28, 3072, 24, 8, 8192, 128256),
          llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000)]
DEV = pd.read_csv(ROOT / "hardware_specs" / "calibration" / "h200" / "e2e_dev.csv")
DEV = DEV[DEV["status"] == "ok"].reset_index(drop=True)


def table(consts) -> pd.DataFrame:
    rows = []
    for name, g in DEV.groupby("name", sort=False):
        r = g.iloc[0]
        m = gpt(name, int(r["layers"]), int(r["hidden"]), int(r["heads"]))
        p = step_s(m, int(r["seq"]), g["micro_batch"].to_numpy(), g["recompute"].to_numpy(),
                   consts)
        rows.append(pd.DataFrame({"name": name, "micro_batch": g["micro_batch"].to_numpy(),
                                  "recompute": g["recompute"].to_numpy(),
                                  "measured_s": g["step_seconds"].to_numpy(), "predicted_s": p}))
    out = pd.concat(rows, ignore_index=True)
    out["error"] = out["predicted_s"] / out["measured_s"] - 1.0
    return out


STRUCT = cpu_structure()
PREVIOUS = (compute.CPU_FWD_LAUNCH_S, compute.CPU_BWD_LAUNCH_S, compute.CHECKPOINT_CPU_S, 0.0, 0.0)


def structured(scale_s, ckpt_scale=1.0):
    """Host constants from the CPU structure at ``scale_s`` per forward kernel."""
    return (scale_s, scale_s * STRUCT["bwd_ratio"], scale_s * STRUCT["ckpt_kernels"] * ckpt_scale,
            STRUCT["param_kernels"], STRUCT["step_kernels"])


def loss(t, mask=None):
    r = np.log(t["predicted_s"] / t["measured_s"]).abs()
    return float((r if mask is None else r[mask]).mean())


def fit(variant, names=None):
    """Fitted parameters (scale [us], checkpoint scale) on the rows of ``names``."""
    def f(x):
        c = structured(x[0] * 1e-6, x[1] if variant == 2 else 1.0)
        t = table(c)
        return loss(t, None if names is None else t["name"].isin(names))
    x0 = [25.0, 1.0]
    res = minimize(f, x0 if variant == 2 else x0[:1] + [1.0], method="Nelder-Mead",
                   options={"xatol": 0.05, "fatol": 1e-5})
    x = res.x
    return (x[0], x[1] if variant == 2 else 1.0)


def consts_of(x):
    return structured(x[0] * 1e-6, x[1])


def report(label, consts):
    t = table(consts)
    e = t["error"]
    mb1 = e[t["micro_batch"] == 1].abs().max()
    print(f"{label}: MAPE {e.abs().mean():.2%}, worst {e.abs().max():.2%} "
          f"({t.loc[e.abs().idxmax(), 'name']} mb {t.loc[e.abs().idxmax(), 'micro_batch']} "
          f"rc {t.loc[e.abs().idxmax(), 'recompute']}), worst mb-1 {mb1:.2%}")
    for r in t[t["micro_batch"] <= 2].itertuples():
        print(f"   {r.name} mb {r.micro_batch} rc {r.recompute}: {r.predicted_s * 1e3:6.1f} ms "
              f"(measured {r.measured_s * 1e3:6.1f}, {r.error:+.1%})")
    return t


def cv(variant):
    models = ("gpt-125m", "gpt-760m", "gpt-2.7b")
    errs = []
    for held in models:
        x = fit(variant, [m for m in models if m != held])
        t = table(consts_of(x))
        m = t["name"] == held
        errs.append(t.loc[m, "error"].abs().to_numpy())
        print(f"   held out {held}: scale {x[0]:.1f} us, ckpt x{x[1]:.2f}: "
              f"MAPE {errs[-1].mean():.2%}")
    return float(np.concatenate(errs).mean())


def predictions(consts):
    m350 = step_s(gpt("gpt-350m", 24, 1024, 16), 2048, [1, 1], [0, 1], consts)
    print(f"   gpt-350m mb 1: recompute 0 {m350[0] * 1e3:.1f} ms, recompute 1 "
          f"{m350[1] * 1e3:.1f} ms")
    for m in LLAMAS:
        for rc in (0, 1):
            p = step_s(m, 4096, [1, 2, 4], [rc] * 3, consts)
            print(f"   {m.name} rc {rc} mb 1/2/4: " + " ".join(f"{x:.4f}" for x in p))


def main() -> int:
    print("CPU structure (host_structure_cpu.csv): " + ", ".join(
        f"{k} {v:.3g}" for k, v in STRUCT.items()))
    print("previous model (17 / 38 us per kernel, 1.5 ms per checkpoint, no step host term):")
    report("  in-sample", PREVIOUS)
    predictions(PREVIOUS)
    for variant in (1, 2):
        x = fit(variant)
        label = ("one scale" if variant == 1 else "scale + checkpoint scale")
        print(f"CPU structure, {label}: scale {x[0]:.2f} us per forward kernel, "
              f"checkpoint x{x[1]:.2f}")
        report("  in-sample", consts_of(x))
        predictions(consts_of(x))
        print(f"  leave-one-model-out MAPE {cv(variant):.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
