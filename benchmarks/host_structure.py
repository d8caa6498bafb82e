"""Host-side structure of the calibration script's eager training step, measured on this CPU.

The H200 eager model (:mod:`perfmodel.compute.layer`, host terms) charges the CPU time that eager
PyTorch spends dispatching a step. Only one model of ``hardware_specs/calibration/h200/
e2e_dev.csv`` is host-bound (gpt-125m), so those rows cannot say how the host time splits into
a per-step part (autocast, the loss, the autograd engine start, ``optimizer.step``'s Python,
``zero_grad``) and a per-layer part. This script measures that split on the code that was
timed: ``benchmarks/calibrate_gpu.py``'s own ``GPT`` (imported, not copied), one step exactly as
its ``e2e`` runs it (``torch.autocast(bfloat16)`` forward, ``logits.float()`` cross-entropy,
``backward``, fused AdamW ``step``, ``zero_grad(set_to_none=True)``), at tiny dimensions
(hidden 16, 2 heads, seq 8, vocab 64, micro-batch 1), so that the work of every op is negligible
and the phase time is dispatch only. For ``layers`` in 1, 2, 4, 8, 16 and recompute 0 / 1 it
records the thread CPU time of each phase (forward incl. loss, backward, optimizer step,
zero_grad; median of ``--reps`` steps, one intra-op thread) and fits ``t = a + b * layers`` per
phase by least squares. The kernel counts per phase come from the same step recorded under
``TorchDispatchMode`` (:func:`harness.eager_inventory.record_step`), so ``b / kernels per
layer`` is the host cost of one dispatched op.

Output: ``hardware_specs/calibration/host_structure_cpu.csv`` (one row per phase: intercept,
slope, kernels per layer, per-kernel cost, with the machine and library versions) and the raw
timings ``host_structure_cpu_raw.csv``. Run on demand (a few minutes):
``python benchmarks/host_structure.py [--reps 15] [--rounds 8] [--device cpu|cuda] [--out DIR]``
(``--device cuda`` on the GPU machine measures its own host with the kernels launched). Not a unit test: timings
depend on the machine.
"""

from __future__ import annotations

import argparse
import csv
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.eager_inventory import load_script, record_step

H, NH, SEQ, VOCAB = 16, 2, 8, 64
LAYERS = (1, 2, 4, 8, 16)
PHASES = ("fwd", "bwd", "opt", "zero_grad")


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return cpu


class _Step:
    """The script's model, optimizer and data at tiny dims; :meth:`run` times one step's phases."""

    def __init__(self, cg, layers: int, recompute: bool, device: str = "cpu"):
        import torch

        torch.manual_seed(0)
        self.dev = torch.device(device)
        with self.dev:
            self.model = cg.GPT(layers, H, NH, VOCAB, SEQ, recompute)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.idx = torch.randint(0, VOCAB, (1, SEQ), device=self.dev)
        self.tgt = torch.randint(0, VOCAB, (1, SEQ), device=self.dev)

    def run(self) -> tuple[float, ...]:
        import torch
        import torch.nn.functional as F

        # CPU: this thread's CPU time (not the wait for a busy core). CUDA: wall time of the
        # launching host (the backward runs on the engine's device thread), GPU idle at start.
        cuda = self.dev.type == "cuda"
        clock = time.perf_counter_ns if cuda else time.thread_time_ns
        if cuda:
            torch.cuda.synchronize()
        t0 = clock()
        with torch.autocast(self.dev.type, dtype=torch.bfloat16):
            logits = self.model(self.idx)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), self.tgt.view(-1))
        t1 = clock()
        loss.backward()
        t2 = clock()
        self.opt.step()
        t3 = clock()
        self.opt.zero_grad(set_to_none=True)
        t4 = clock()
        return tuple((b - a) * 1e-9 for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4)))


def time_phases(cg, configs, reps: int, rounds: int, device: str = "cpu"
                ) -> dict[tuple, dict[str, float]]:
    """Thread CPU seconds of each phase per ``(layers, recompute)`` config: the median over
    ``reps`` steps, the smallest of ``rounds`` such medians; the configs take turns within a
    round, so a disturbance by other processes hits them alike."""
    steps = {c: _Step(cg, *c, device=device) for c in configs}
    for st in steps.values():  # warm-up
        for _ in range(3):
            st.run()
    best = {c: {p: float("inf") for p in PHASES} for c in configs}
    for _ in range(rounds):
        for c, st in steps.items():
            samples = [st.run() for _ in range(reps)]
            for j, p in enumerate(PHASES):
                best[c][p] = min(best[c][p], statistics.median(s[j] for s in samples))
    return best


def kernel_counts(layers: int, recompute: bool) -> dict[str, int]:
    """Dispatched non-view aten ops per phase of one recorded step."""
    inv = record_step("gpt", layers, H, NH, VOCAB, SEQ, recompute=recompute)
    return {p: len(inv.kernels(p)) for p in ("fwd", "bwd", "opt")}


def fit_line(x, y) -> tuple[float, float, float]:
    """Least-squares ``y = a + b x``: (a, b, rms residual)."""
    A = np.stack([np.ones(len(x)), np.asarray(x, float)], axis=1)
    coef, *_ = np.linalg.lstsq(A, np.asarray(y, float), rcond=None)
    res = np.asarray(y) - A @ coef
    return float(coef[0]), float(coef[1]), float(np.sqrt(np.mean(res**2)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the host structure of the "
                    "GPU machine itself (wall time of the launching host at tiny dims)")
    ap.add_argument("--out", type=Path, default=ROOT / "hardware_specs" / "calibration")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cg = load_script()
    machine = _machine()
    info = {"device": args.device, "machine": machine, "torch": torch.__version__, "python": platform.python_version(),
                "hidden": H, "heads": NH, "seq": SEQ, "vocab": VOCAB, "reps": args.reps,
                "rounds": args.rounds}
    raw, summary = [], []
    configs = [(L, rc) for rc in (False, True) for L in LAYERS]
    times = time_phases(cg, configs, args.reps, args.rounds, args.device)
    for rc in (False, True):
        per_phase: dict[str, list[tuple[int, float, int]]] = {p: [] for p in PHASES}
        for L in LAYERS:
            t = times[L, rc]
            k = kernel_counts(L, rc)
            for p in PHASES:
                per_phase[p].append((L, t[p], k.get(p, 0)))
                raw.append({"recompute": int(rc), "layers": L, "phase": p, "seconds": f"{t[p]:.4e}",
                                "kernels": k.get(p, 0)})
            print(f"recompute {int(rc)} layers {L:2d}: "
                  + "  ".join(f"{p} {t[p] * 1e6:7.0f} us ({k.get(p, 0)} ops)" for p in PHASES),
                  flush=True)
        for p in PHASES:
            Ls = [r[0] for r in per_phase[p]]
            a, b, rms = fit_line(Ls, [r[1] for r in per_phase[p]])
            ka, kb, _ = fit_line(Ls, [r[2] for r in per_phase[p]])
            summary.append(dict(recompute=int(rc), phase=p, intercept_s=f"{a:.4e}",
                                per_layer_s=f"{b:.4e}", rms_s=f"{rms:.2e}",
                                kernels_fixed=f"{ka:.1f}", kernels_per_layer=f"{kb:.1f}",
                                per_kernel_s=f"{b / kb:.4e}" if kb > 0 else "", **info))
            print(f"  {p:9s} a = {a * 1e6:7.1f} us  b = {b * 1e6:6.1f} us/layer  "
                  f"(rms {rms * 1e6:.1f} us; ops {ka:.0f} + {kb:.0f}/layer)")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in ((f"host_structure_{args.device}.csv", summary),
                       (f"host_structure_{args.device}_raw.csv", raw)):
        with open(args.out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("wrote", args.out / f"host_structure_{args.device}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
