"""The registry of the time model's fitted constants: every number set by a fit, with its value
(read live from the module or spec file that holds it), unit, meaning, source and the rows or
measurements that set it.

Two kinds of evidence set them (``evidence``):

* ``dev rows``: end-to-end step times of the published runs in ``training_runs_dev.csv`` /
  ``moe_runs_dev.csv`` (the constants the forward-looking report refits, :mod:`validation.forward`);
* ``kernel measurements`` / ``own runs``: kernel benchmarks or the single-H200 eager runs
  (``hardware_specs/calibration/h200``), not the dev rows.

The list is rendered by ``plan validate --forward`` and by ``benchmarks/constants_doc.py`` into
``docs/constants.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.compute import layer as compute
from perfmodel.hardware import overlap
from perfmodel.moe import dispatch as moe_dispatch
from perfmodel.moe import experts as moe
from perfmodel.moe import imbalance as moe_imbalance
from perfmodel.spec.specs import load_gpu

__all__ = ["FittedConstant", "constants_markdown", "constants_records", "fitted_constants",
           "published_defaults"]


@dataclass(frozen=True)
class FittedConstant:
    """One fitted constant: ``name`` (where it lives), ``value`` (in ``unit``), ``meaning``,
    ``source`` (the fit script), ``rows`` (what set it) and ``evidence`` (dev rows, kernel
    measurements or own runs)."""

    name: str
    value: float
    unit: str
    meaning: str
    source: str
    rows: str
    evidence: str


_FIT = "benchmarks/fit_time_model.py"
_MOE_FIT = "benchmarks/moe_time_refit.py --grid"
_EAGER_FIT = "benchmarks/fit_eager_host.py"
_NEMO_ROWS = "NeMo 24.07 + DGX Cloud NeMo 24.09 + Megatron-Bridge 25.09/25.11 H100 rows (overlap on)"


def _gpu_fraction(name: str) -> float:
    return float(load_gpu(name).sustained_gemm_fraction)


def _dense_constants() -> list[FittedConstant]:
    return [
        FittedConstant("compute.SUSTAINED_GEMM_FRACTION['hopper']",
                       compute.SUSTAINED_GEMM_FRACTION["hopper"], "1",
                       "GEMM rate of a node training at its power limit / one-GPU MAMF (Hopper)",
                       _FIT, _NEMO_ROWS, "dev rows"),
        FittedConstant("gpus/b200.toml sustained_gemm_fraction", _gpu_fraction("b200"), "1",
                       "the same, B200 fp8 GEMMs (bf16 GEMMs: the published SimuMax "
                       "table, hardware_specs/kernels/b200-bf16-gemm.csv)", _FIT,
                       "R0162-R0165, R0175-R0178 (Megatron-Bridge 25.09/25.11)", "dev rows"),
        FittedConstant("gpus/gb200.toml sustained_gemm_fraction", _gpu_fraction("gb200"), "1",
                       "the same, GB200", _FIT,
                       "R0158-R0161, R0169-R0174 (Megatron-Bridge 25.09/25.11)", "dev rows"),
        FittedConstant("gpus/gb300.toml sustained_gemm_fraction", _gpu_fraction("gb300"), "1",
                       "the same, GB300", _FIT, "R0154-R0157 (Megatron-Bridge 25.11)",
                       "dev rows"),
        FittedConstant("compute.LOW_PRECISION_GEMM_RATIO", compute.LOW_PRECISION_GEMM_RATIO, "1",
                       "fp8 GEMM efficiency / bf16 efficiency at the same shape (2x peak)",
                       _FIT, "FP8 rows of " + _NEMO_ROWS, "dev rows"),
        FittedConstant("compute.LOW_PRECISION_RECIPES['mxfp8'].gemm_ratio",
                       compute.LOW_PRECISION_RECIPES["mxfp8"].gemm_ratio, "1",
                       "MXFP8 GEMM efficiency / tensor-wise fp8 efficiency", _FIT + " mxfp8",
                       "7 FP8-CS / FP8-MX row pairs (R0154/55 ... R0177/78)", "dev rows"),
        FittedConstant("overlap.OVERLAP_SLOWDOWN['hopper'] (and 'blackwell')",
                       overlap.OVERLAP_SLOWDOWN["hopper"], "1",
                       "compute slowdown while overlapped communication runs (bound 0.05..0.4)",
                       _FIT, _NEMO_ROWS, "dev rows"),
    ]


def _moe_constants() -> list[FittedConstant]:
    moe_rows = "moe_runs_dev.csv (94-98 expressible rows, 8 models)"
    return [
        FittedConstant("moe.MOE_EXPERT_HOST_S", moe.MOE_EXPERT_HOST_S, "s",
                       "host time exposed per local expert, MoE layer pass and micro-batch",
                       _MOE_FIT, moe_rows, "dev rows"),
        FittedConstant("moe.TE_GROUPED_GEMM_SLOWDOWN", moe.TE_GROUPED_GEMM_SLOWDOWN, "1",
                       "extra device time of TE's multi-stream grouped GEMM over one GEMM",
                       _MOE_FIT, moe_rows, "dev rows"),
        FittedConstant("moe.MOE_A2A_OVERLAP_HIDDEN", moe.MOE_A2A_OVERLAP_HIDDEN, "1",
                       "share of the all-to-all the EP overlap hides",
                       "benchmarks/moe_time_refit.py",
                       "7 overlapped MoE rows (DeepSeek-V3 1024 H100, Qwen3-235B, Qwen3-30B)",
                       "dev rows"),
        FittedConstant("moe.MOE_HOST_SYNC_S", moe.MOE_HOST_SYNC_S, "s",
                       "host time per MoE layer pass at the dispatcher sync (fit puts it at 0)",
                       "benchmarks/moe_time_refit.py", moe_rows, "dev rows"),
        FittedConstant("dispatch.TE_KERNEL_HOST_S", moe_dispatch.TE_KERNEL_HOST_S, "s",
                       "host time per TE kernel of a synced layer (fit keeps it at 0)",
                       "benchmarks/moe_time_refit.py", moe_rows, "dev rows"),
    ]


def _own_constants() -> list[FittedConstant]:
    h200 = "hardware_specs/calibration/h200/e2e_dev.csv (single-H200 eager steps)"
    return [
        FittedConstant("compute.CPU_FWD_LAUNCH_S", compute.CPU_FWD_LAUNCH_S, "s",
                       "eager PyTorch CPU cost per forward kernel", _EAGER_FIT, h200, "own runs"),
        FittedConstant("compute.CPU_BWD_LAUNCH_S", compute.CPU_BWD_LAUNCH_S, "s",
                       "eager PyTorch CPU cost per backward kernel", _EAGER_FIT, h200,
                       "own runs"),
        FittedConstant("compute.CHECKPOINT_CPU_S", compute.CHECKPOINT_CPU_S, "s",
                       "CPU cost per checkpointed layer (saved-tensor hooks, RNG state)",
                       _EAGER_FIT, h200, "own runs"),
        FittedConstant("compute.COMPOSE_P", compute.COMPOSE_P, "1",
                       "exponent of the smooth max of device and launch time", _EAGER_FIT, h200,
                       "own runs"),
        FittedConstant("compute.LOW_PRECISION_TILE_K0", compute.LOW_PRECISION_TILE_K0, "1",
                       "per-tile fixed work of a Hopper fp8 GEMM, in reduction lengths",
                       "benchmarks/fp8_shape_probe.py",
                       "benchmarks/published_fp8_gemm_h800.csv (tile-lang H800 K sweep)",
                       "kernel measurements"),
    ]


def published_defaults() -> list[FittedConstant]:
    """Defaults taken from published measurements, not fitted (``evidence`` "published
    measurements"; ``source`` the paper, ``rows`` what it measured)."""
    return [
        FittedConstant("imbalance.TYPICAL_IMBALANCE", moe_imbalance.TYPICAL_IMBALANCE, "1",
                       "MoE routing imbalance of learned, load-balanced routing: tokens of the "
                       "busiest expert / mean per expert (the plan's default for a dropless "
                       "model; --moe-imbalance 1 for benchmarks that force balance)",
                       "Fedus et al. 2022 (Switch Transformer), Sec. 2.2 and Table 1; Wang et "
                       "al. 2024, arXiv:2408.15664, Table 1 and Fig. 3",
                       "capacity factor 1.25 with < 1 % dropped tokens; MaxVio_batch 0.1-0.3 "
                       "with loss-free balancing", "published measurements"),
    ]


def fitted_constants() -> list[FittedConstant]:
    """Every fitted constant of the time model, dev-row constants first."""
    return [*_dense_constants(), *_moe_constants(), *_own_constants()]


def constants_records() -> list[dict]:
    """:func:`fitted_constants` as JSON-ready dicts."""
    return [c.__dict__.copy() for c in fitted_constants()]


def constants_markdown() -> str:
    """The registry as a Markdown table (``docs/constants.md``)."""
    head = ("| constant | value | unit | meaning | set by | fit | evidence |\n"
            "|---|---|---|---|---|---|---|\n")
    body = "".join(f"| `{c.name}` | {c.value:.4g} | {c.unit} | {c.meaning} | {c.rows} | "
                   f"`{c.source}` | {c.evidence} |\n" for c in fitted_constants())
    n_dev = sum(c.evidence == "dev rows" for c in fitted_constants())
    published = ("\n## Defaults from published measurements\n\nNot fitted: taken from the "
                 "papers named, and settable by the user.\n\n"
                 "| constant | value | unit | meaning | measured | source |\n"
                 "|---|---|---|---|---|---|\n" + "".join(
                     f"| `{c.name}` | {c.value:.4g} | {c.unit} | {c.meaning} | {c.rows} | "
                     f"{c.source} |\n" for c in published_defaults()))
    return (f"{n_dev} constants are fitted to the end-to-end dev rows; the others to kernel "
            "measurements or the single-H200 runs.\n\n" + head + body + published)
