"""What the NeMo 25.09 / 25.11 MoE rows on DGX B200 say against their 26.02 / 26.02.01 siblings
(docs/moe.md "The 25.x B200 rows against their 26.x siblings").

Four checks, each printed as a table; nothing in the model is changed:

1. **Per pipeline slot.** Rows of one model on B200 with the same layout but different releases
   (and micro-batch counts ``m``): measured and predicted step time less the predicted per-step
   part (``dp_comm + optimizer``), over the ``m*v + pp - 1`` slots of the schedule. Where the
   model prices two releases alike the measured slots show whether the release differs.
2. **Error by release and GPU** of the Megatron-Bridge rows (mean signed error, count).
3. **E0035 against the v0.2.1 B200 preset.** E0035 (25.11 GPT-OSS-120B, 64 B200, MBS 4, GBS 512)
   matched no preset because the table prints ep 8; the release tag's
   ``GPT_OSS_120B_B200_BF16_BASE_CONFIG`` (``configs/gpt_oss/workload_base_configs.py``) has the
   row's GPUs, MBS, GBS and tp / pp / cp / vp with ep 64 and ``recompute_modules=["layernorm",
   "moe_act"]``. The row as published and as the preset, and the tokens/s per GPU of the ep-64
   (E0055) and ep-8 (E0074) B200 rows of 26.x. A what-if, not applied.
4. **Per-rank deduplication of the flex dispatch** (what-if, not applied): DeepEP / HybridEP send
   a token once per destination rank (``is_token_in_rank``), the alltoall dispatcher once per
   routed expert; priced by scaling the flex all-to-all buffer by the expected distinct ranks
   over top-k (uniform routing; DeepSeek-V3's group-limited routing, 4 of 8 groups, at ep <= 8).

Run: ``python -m benchmarks.b200_release_probe`` (about 20 s).
"""

from __future__ import annotations

import math

import pandas as pd

from perfmodel.moe import experts as moe
from perfmodel.step.evaluate import TIME_TERMS, evaluate
from validation import validate_moe as vm
from validation.validate import VALIDATION_DIR

#: Same model, B200, same layout, different release (earlier first).
SLOT_GROUPS = (("DeepSeek-V3 p16 ep8", ("E0003", "E0004", "E0016", "E0040", "E0059")),
               ("Qwen3-235B p8 ep8", ("E0008", "E0009", "E0025", "E0045")),
               ("GPT-OSS-120B p1 ep8", ("E0035", "E0074")))


def _case(df: pd.DataFrame, rid: str, **overrides):
    r = df[df["row_id"] == rid].iloc[0].copy()
    for k, v in overrides.items():
        r[k] = v
    return r, vm.moe_case_from_row(r, df)


def _eval(r, case) -> tuple[float, dict]:
    model, batch = vm.timed_model_and_batch(r, case)
    res = evaluate(model, case.training, case.cluster, batch)
    return float(res.step_time_s[0]), {k: float(res.time_s[k][0]) for k in TIME_TERMS}


def slot_table(df: pd.DataFrame) -> pd.DataFrame:
    """Check 1: measured and predicted seconds per pipeline slot."""
    rows = []
    for label, ids in SLOT_GROUPS:
        for rid in ids:
            r, c = _case(df, rid)
            pred, terms = _eval(r, c)
            cfg = c.config
            slots = cfg.num_microbatches * cfg.vp + cfg.pp - 1
            fixed = terms["dp_comm"] + terms["optimizer"]
            rows.append({"group": label, "row": rid,
                         "release": str(r["release"]).replace("NeMo container ", ""),
                         "dispatcher": c.training.moe_token_dispatcher
                         + ("/" + c.training.moe_flex_backend
                            if c.training.moe_token_dispatcher == "flex" else ""),
                         "m": cfg.num_microbatches, "slots": slots,
                         "measured_slot_s": (c.measured_step_s - fixed) / slots,
                         "predicted_slot_s": (pred - fixed) / slots,
                         "error": pred / c.measured_step_s - 1.0})
    return pd.DataFrame(rows)


def release_table(report: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """Check 2: mean signed error of the Megatron-Bridge rows by release and GPU."""
    rel = df.set_index("row_id")["release"]
    r = report.assign(release=report["row_id"].map(rel).str.replace("NeMo container ", ""))
    r = r[r["release"].isin(["25.09", "25.11", "26.02", "26.02.01"])]
    return r.groupby(["release", "gpu"])["error"].agg(["mean", "count"]).reset_index()


def gptoss_preset_table(df: pd.DataFrame) -> pd.DataFrame:
    """Check 3: E0035 as published (ep 8) and as the v0.2.1 B200 preset (ep 64 + recompute);
    tokens/s per GPU of the B200 GPT-OSS rows."""
    rows = []
    for label, ov in (("as published: ep 8", {}),
                      ("preset v0.2.1: ep 64", {"expert_parallel": 64}),
                      ("preset v0.2.1: ep 64 + layernorm/moe_act",
                       {"expert_parallel": 64,
                        "activation_recompute": "selective: layernorm+moe_act"})):
        r, c = _case(df, "E0035", **ov)
        pred, terms = _eval(r, c)
        rows.append({"row": "E0035", "reading": label, "measured_s": c.measured_step_s,
                     "predicted_s": pred, "error": pred / c.measured_step_s - 1.0,
                     "ep_comm_s": terms["ep_comm"], "dp_comm_s": terms["dp_comm"],
                     "tok_s_gpu": float(r["tokens_per_sec_per_gpu"])})
    for rid in ("E0055", "E0074"):
        r, c = _case(df, rid)
        pred, terms = _eval(r, c)
        rows.append({"row": rid, "reading": f"{r['release']} ep {int(r['expert_parallel'])}",
                     "measured_s": c.measured_step_s, "predicted_s": pred,
                     "error": pred / c.measured_step_s - 1.0, "ep_comm_s": terms["ep_comm"],
                     "dp_comm_s": terms["dp_comm"],
                     "tok_s_gpu": float(r["tokens_per_sec_per_gpu"])})
    return pd.DataFrame(rows)


def distinct_ranks(num_experts: int, top_k: int, ep: int, groups: int | None = None,
                   group_topk: int | None = None) -> float:
    """Expected EP ranks a token is sent to under uniform routing: ``ep * (1 - C(E - E/ep, k) /
    C(E, k))``; with group-limited routing (``groups`` groups, ``group_topk`` chosen, ep <=
    groups so each rank holds whole groups) ``ep * (1 - C(G - G/ep, g) / C(G, g))``. Example:
    Qwen3 (128, 8) at ep 8: 5.34; DeepSeek-V3 (8 groups, 4 chosen) at ep 8: 4.0."""
    if groups and group_topk and ep <= groups:
        per = groups // ep
        return ep * (1.0 - math.comb(groups - per, group_topk) / math.comb(groups, group_topk))
    per = num_experts // ep
    return ep * (1.0 - math.comb(num_experts - per, top_k) / math.comb(num_experts, top_k))


def dedup_whatif() -> tuple[dict, pd.DataFrame]:
    """Check 4: the MoE report with the flex all-to-all buffer scaled by distinct ranks / top-k."""
    orig = moe.dispatch_ops_per_layer

    def patched(model, training, batch, bpv):
        ops = orig(model, training, batch, bpv)
        if training.moe_token_dispatcher != "flex":
            return ops
        ds = model.name.lower().startswith("deepseek")
        f = distinct_ranks(model.num_experts, model.moe_top_k, int(batch.ep[0]),
                           8 if ds else None, 4 if ds else None) / model.moe_top_k
        name, buf, group = ops["a2a"]
        return {**ops, "a2a": (name, buf * f, group)}

    moe.dispatch_ops_per_layer = patched
    try:
        report, _ = vm.moe_runs_report()
    finally:
        moe.dispatch_ops_per_layer = orig
    return vm.moe_summary(report), report


def main() -> None:
    pd.set_option("display.width", 200)
    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv")
    print("1. seconds per pipeline slot (step less dp_comm + optimizer, over m*v + pp - 1)")
    print(slot_table(df).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    base, _ = vm.moe_runs_report()
    print("\n2. mean signed error by release and GPU (Megatron-Bridge rows)")
    print(release_table(base, df).to_string(index=False, float_format=lambda x: f"{x:+.3f}"))
    print("\n3. E0035 against the 25.11 B200 preset (what-if, not applied)")
    print(gptoss_preset_table(df).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("\n4. flex dispatch deduplicated per rank (what-if, not applied)")
    s, _ = dedup_whatif()
    print(f"   base: {vm.moe_summary(base)}\n   dedup: {s}")


if __name__ == "__main__":
    main()
