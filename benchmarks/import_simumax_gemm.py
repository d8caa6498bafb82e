"""Convert the measured GEMM table of a SimuMax system file into a shipped kernel table.

SimuMax (github.com/MooreThreads/SimuMax) publishes, with its measurements, one JSON file per
machine whose ``accelerator.op.matmul.accurate_efficient_factor`` maps a GEMM shape to its
measured efficiency (achieved ``2*m*n*k`` FLOP/s over ``accelerator.op.matmul.tflops``). Its
keys name Megatron's three GEMMs of a linear layer by their cuBLAS layout:

* ``TN``: the forward ``y = x W^T`` (m tokens, k input features, n output features);
* ``NN``: the data gradient ``dx = dy W`` (m tokens, k output features, n input features);
* ``NT``: the weight gradient ``dW = dy^T x`` (m output features, k tokens, n input features).

We write each as the shape of its forward GEMM (m tokens, n output, k input features: the
convention of ``hardware_specs/calibration/*/gemm.csv``) with the layout ``fwd`` / ``dgrad`` /
``wgrad``. Usage::

    git -C SimuMax show COMMIT:configs/system/b200_bf16_ceperm.json > b200.json
    python benchmarks/import_simumax_gemm.py b200.json B200 bf16 COMMIT \
        configs/system/b200_bf16_ceperm.json > hardware_specs/kernels/b200-bf16-gemm.csv
"""

from __future__ import annotations

import json
import re
import sys

_KEY = re.compile(r"m=(\d+), k=(\d+), n=(\d+), layout=(TN|NN|NT)")


def forward_shape(m: int, k: int, n: int, layout: str) -> tuple[int, int, int, str]:
    """(m tokens, n output, k input features, our layout) of one SimuMax key's GEMM."""
    if layout == "TN":
        return m, n, k, "fwd"
    if layout == "NN":
        return m, k, n, "dgrad"
    return k, m, n, "wgrad"  # NT: m output features, k tokens, n input features


def main(path: str, gpu: str, dtype: str, commit: str, repo_path: str) -> None:
    """Print the table of the SimuMax system file ``path`` (``repo_path`` in the repository at
    ``commit``) for ``gpu`` (a GPU spec's name) and ``dtype``."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    op = doc["accelerator"]["op"]["matmul"]
    rows: dict = {}
    for key, eff in op["accurate_efficient_factor"].items():
        hit = _KEY.search(key)
        if hit is None:
            continue
        m, n, k, layout = forward_shape(*(int(v) for v in hit.groups()[:3]), hit.group(4))
        fp32_out = "out_dtype=fp32" in key
        rows.setdefault((m, n, k, layout), {}).setdefault(fp32_out, []).append(float(eff))
    # the weight gradient accumulates into Megatron's fp32 main gradient (gradient-accumulation
    # fusion): its fp32-output rows where the file has both
    rows = {shape: v.get(True) or v[False] for shape, v in rows.items()}
    print(f"# Measured {dtype} GEMM efficiency of one NVIDIA {gpu}: achieved 2*m*n*k FLOP/s over "
          f"the dense {dtype} peak of {op['tflops']:g} TFLOP/s.")
    print(f"# source: SimuMax (github.com/MooreThreads/SimuMax) {repo_path}"
          f" at commit {commit}")
    print("# field: accelerator.op.matmul.accurate_efficient_factor, measured on the machine of that")
    print("# file; converted by benchmarks/import_simumax_gemm.py. Shapes as the forward GEMM: m")
    print("# tokens, n output features, k input features; layout fwd (SimuMax TN), dgrad (NN),")
    print("# wgrad (NT, its fp32-output rows: accumulation into the fp32 main gradient). Units:")
    print("# efficiency [-] of peak_tflops [TFLOP/s]; repeated shapes averaged.")
    print("gpu,dtype,peak_tflops,m,n,k,layout,efficiency")
    for (m, n, k, layout), effs in sorted(rows.items()):
        print(f"{gpu},{dtype},{op['tflops']:g},{m},{n},{k},{layout},{sum(effs) / len(effs):.4f}")


if __name__ == "__main__":
    main(*sys.argv[1:6])
