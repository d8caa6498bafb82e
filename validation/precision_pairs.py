"""The measured FP8 speed-up: published rows that differ only in precision, against the model's.

Two rows pair when they share the source, release, GPU, model, GPU count and layout (tp, pp, vp,
cp, ep, micro- and global batch, sequence) and one is 16-bit, the other fp8: their step-time
ratio bf16 / fp8 is the measured speed-up of that recipe on that GPU, free of everything the two
runs share (network, clocks, framework release). The model's speed-up is the same ratio of its
predictions; ``ratio_error`` = model / measured - 1 (> 0: the model over-credits fp8).

``python -m validation.precision_pairs`` prints the table and the mean per GPU type and source.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from validation.validate import read_runs, training_runs_report
from validation.validate_moe import VALIDATION_DIR, moe_runs_report

__all__ = ["dense_precision_pairs", "moe_precision_pairs", "precision_pairs", "summary_by_gpu"]

_DENSE_KEY = ("source", "software", "gpu_type", "model", "num_gpus", "tensor_parallel",
              "pipeline_parallel", "context_parallel", "virtual_pipeline_stages",
              "micro_batch_size", "global_batch_size", "seq_len")
_MOE_KEY = ("source", "release", "gpu_type", "model", "num_gpus", "tensor_parallel",
            "pipeline_parallel", "context_parallel", "virtual_pipeline_stages",
            "expert_parallel", "expert_tensor_parallel", "micro_batch_size",
            "global_batch_size", "seq_len")


def _pairs(df: pd.DataFrame, report: pd.DataFrame, key: tuple[str, ...], kind: str
           ) -> pd.DataFrame:
    """Pairs of ``df`` rows equal on ``key``, one fp8 and one not, with the report's
    ``measured_s`` / ``predicted_s``."""
    rep = report.set_index("row_id")
    d = df[df["row_id"].isin(rep.index)].copy()
    d["_fp8"] = d["precision"].astype(str).str.lower().str.contains("fp8")
    out = []
    for _, g in d.groupby(list(key), dropna=False):
        lo, hi = g[~g["_fp8"]], g[g["_fp8"]]
        for a in lo["row_id"]:
            for b in hi["row_id"]:
                meas = rep.loc[a, "measured_s"] / rep.loc[b, "measured_s"]
                pred = rep.loc[a, "predicted_s"] / rep.loc[b, "predicted_s"]
                r = g.set_index("row_id").loc[b]
                out.append({"kind": kind, "bf16_row": a, "fp8_row": b,
                            "gpu_type": str(r["gpu_type"]), "model": str(r["model"]),
                            "source": str(r["source"])[:40], "fp8_precision": str(r["precision"]),
                            "measured_speedup": float(meas), "model_speedup": float(pred),
                            "ratio_error": float(pred / meas - 1.0)})
    return pd.DataFrame(out)


def dense_precision_pairs(path=None) -> pd.DataFrame:
    """The pairs of the dense dev split (:func:`validation.validate.training_runs_report`)."""

    return _pairs(read_runs(path), training_runs_report(path)[0], _DENSE_KEY, "dense")


def moe_precision_pairs(path=None) -> pd.DataFrame:
    """The pairs of the MoE dev split (:func:`validation.validate_moe.moe_runs_report`)."""

    df = pd.read_csv(path or VALIDATION_DIR / "moe_runs_dev.csv")
    return _pairs(df, moe_runs_report(path)[0], _MOE_KEY, "moe")


def precision_pairs() -> pd.DataFrame:
    """Both splits' pairs."""
    return pd.concat([dense_precision_pairs(), moe_precision_pairs()], ignore_index=True)


def summary_by_gpu(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per kind, GPU type and model: pairs, mean measured and model speed-up, mean ratio error."""
    return (pairs.groupby(["kind", "gpu_type", "model"])
            .agg(pairs=("fp8_row", "size"), measured_speedup=("measured_speedup", "mean"),
                 model_speedup=("model_speedup", "mean"),
                 ratio_error=("ratio_error", "mean"))
            .reset_index())


if __name__ == "__main__":  # pragma: no cover
    p = precision_pairs()
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(p.round(3).to_string(index=False))
        print()
        print(summary_by_gpu(p).round(3).to_string(index=False))
        print(f"\nmean |ratio error| {np.abs(p['ratio_error']).mean():.1%} over {len(p)} pairs")
