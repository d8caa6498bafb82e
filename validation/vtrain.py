"""vTrain's A100 measurements against the model: per (model, GPU count) group, the Spearman
rank correlation of predicted and measured iteration times (its own module: it is the one
user of :mod:`scipy.stats` in validation, which the planner's path does not import)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, TrainingSpec, load_cluster
from perfmodel.step.evaluate import evaluate
from validation.validate import VALIDATION_DIR, era_switches

__all__ = ["vtrain_report"]


def vtrain_report(max_rows: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """vTrain A100 measurements: per (model, GPU count) group, Spearman of predicted vs
    measured iteration time, and the per-row errors.

    vTrain does not state vocabulary, recompute or precision: we assume GPT-2's 50257-token
    vocabulary, no recompute, fp16 mixed precision, Megatron-DeepSpeed without overlap
    (matching vTrain's description of its runs), DGX A100 80GB nodes.
    """
    frames = []
    for fname in ("ground_truth_single.csv", "ground_truth_multi.csv"):
        d = pd.read_csv(VALIDATION_DIR / "vtrain" / fname)
        d.columns = [c.strip() for c in d.columns]
        d = d.rename(columns={
            "# GPUs": "gpus", "global batch": "gb", "micro batch": "mbs",
            "hidden size": "h", "attention heads": "heads", "# layers": "L",
            "sequence length": "s", "tensor parallelism": "t", "data parallelism": "d",
            "pipeline parallelism": "p", "iteration time (ms)": "ms",
        })
        d["set"] = "single" if "single" in fname else "multi"
        frames.append(d)
    d = pd.concat(frames, ignore_index=True)
    if max_rows:
        d = d.head(max_rows)
    preds = np.full(len(d), np.nan)
    for key, g in d.groupby(["h", "heads", "L", "s", "gpus", "gb"]):
        h, heads, L, s, gpus, gb = (int(x) for x in key)
        model = ModelSpec(name=f"vtrain-h{h}-L{L}", num_layers=L, hidden_size=h,
                          num_attention_heads=heads, ffn_hidden_size=4 * h, vocab_size=50257,
                          max_seq_len=s)
        training = TrainingSpec(global_batch_size=gb, seq_len=s, precision="fp16",
                                **era_switches(modern=False))  # Megatron-DeepSpeed of 2021
        cluster = load_cluster("dgx-a100-80g", gpus=gpus)
        nmb = gb // (g["d"].to_numpy() * g["mbs"].to_numpy())
        batch = ConfigBatch.from_arrays(
            dp=g["d"].to_numpy(), tp=g["t"].to_numpy(), pp=g["p"].to_numpy(),
            micro_batch_size=g["mbs"].to_numpy(), num_microbatches=np.maximum(nmb, 1),
            recompute="full",
        )
        res = evaluate(model, training, cluster, batch)
        preds[g.index.to_numpy()] = res.step_time_s * 1e3
    d["predicted_ms"] = preds
    d["error"] = d["predicted_ms"] / d["ms"] - 1.0
    groups = []
    for key, g in d.groupby(["set", "h", "L", "gpus", "gb"]):
        if len(g) < 3:
            continue
        rho = spearmanr(g["predicted_ms"], g["ms"]).statistic
        groups.append({"set": key[0], "hidden": key[1], "layers": key[2], "gpus": key[3],
                       "global_batch": key[4], "n": len(g), "spearman": rho,
                       "mape": float(np.mean(np.abs(g["error"])))})
    return d, pd.DataFrame(groups)
