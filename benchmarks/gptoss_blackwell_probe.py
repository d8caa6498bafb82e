"""What the GPT-OSS-120B rows of ``moe_runs_dev.csv`` say about the per-step and per-micro-batch
time on Blackwell (docs/moe.md "GPT-OSS-120B on Blackwell").

Three checks, each printed as a table:

1. **Pairs of rows with the same layout and micro-batch size but a different micro-batch count**
   (``m``): the measured step ``t = m * slope + fixed`` through the two points, against the
   same two numbers of the prediction. Only meaningful where both rows ran the same recipe;
   the table says which release each row comes from.
2. **The predicted time terms** of the GPT-OSS rows (:data:`perfmodel.step.evaluate.TIME_TERMS`), to
   see where the per-step part sits (``dp_comm``: the routed experts' gradient reduce-scatter
   and parameter all-gather over expert-dp).
3. **A what-if on the B300 scale-out tier**: the rows re-evaluated with DGX B300's compute
   fabric at 400 Gb/s per GPU instead of the preset's 800 Gb/s (ConnectX-8), to size how much of
   the B300 rows' error the scale-out bandwidth would explain. Not a change of the preset: no
   source states the benchmark system's fabric.

Run: ``python -m benchmarks.gptoss_blackwell_probe`` (about 1 minute).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from perfmodel.core.errors import SpecError
from perfmodel.step.evaluate import TIME_TERMS, evaluate
from validation import validate_moe as vm
from validation.validate import VALIDATION_DIR

#: Row pairs (fewer micro-batches first) with the same GPU, layout and micro-batch size.
PAIRS = (("E0035", "E0074"), ("E0037", "E0057"), ("E0039", "E0058"))


def _cases(df: pd.DataFrame, ids) -> dict:
    out = {}
    for rid in ids:
        r = df[df["row_id"] == rid].iloc[0]
        out[rid] = (r, vm.moe_case_from_row(r, df))
    return out


def _step_s(r, case, cluster=None) -> tuple[float, dict]:
    if cluster is not None:
        case = dataclasses.replace(case, cluster=cluster)
    model, batch = vm.timed_model_and_batch(r, case)
    res = evaluate(model, case.training, case.cluster, batch)
    return float(res.step_time_s[0]), {k: float(res.time_s[k][0]) for k in TIME_TERMS}


def _rel(r) -> str:
    return str(r["release"]).replace("NeMo container ", "")


def slope_table(df: pd.DataFrame) -> pd.DataFrame:
    """Check 1: measured and predicted slope (per micro-batch) and fixed part of each pair."""
    rows = []
    for a, b in PAIRS:
        cs = _cases(df, (a, b))
        (ra, ca), (rb, cb) = cs[a], cs[b]
        ma, mb = ca.config.num_microbatches, cb.config.num_microbatches
        pa, pb = _step_s(ra, ca)[0], _step_s(rb, cb)[0]
        meas_slope = (cb.measured_step_s - ca.measured_step_s) / (mb - ma)
        pred_slope = (pb - pa) / (mb - ma)
        rows.append({"pair": f"{a}/{b}", "gpu": ra["gpu_type"],
                     "releases": f"{_rel(ra)} / {_rel(rb)}",
                     "m": f"{ma}/{mb}", "measured_slope_s": meas_slope,
                     "measured_fixed_s": ca.measured_step_s - ma * meas_slope,
                     "predicted_slope_s": pred_slope, "predicted_fixed_s": pa - ma * pred_slope})
    return pd.DataFrame(rows)


def terms_table(df: pd.DataFrame) -> pd.DataFrame:
    """Check 2: the predicted terms of every expressible GPT-OSS-120B row."""
    ids = df.loc[df["model"] == "GPT-OSS-120B", "row_id"]
    rows = []
    for rid in ids:
        r = df[df["row_id"] == rid].iloc[0]
        try:
            case = vm.moe_case_from_row(r, df)
        except SpecError:
            continue
        step, terms = _step_s(r, case)
        rows.append({"row": rid, "gpu": r["gpu_type"], "ep": case.config.ep,
                     "m": case.config.num_microbatches, "measured_s": case.measured_step_s,
                     "predicted_s": step, "error": step / case.measured_step_s - 1.0,
                     **{k: v for k, v in terms.items() if v > 5e-3}})
    return pd.DataFrame(rows).fillna(0.0)


def b300_whatif(df: pd.DataFrame, gbit_per_s: float = 400.0) -> pd.DataFrame:
    """Check 3: B300 rows with the scale-out tier at ``gbit_per_s`` per GPU."""
    rows = []
    for rid in df.loc[df["gpu_type"].astype(str).str.upper() == "B300", "row_id"]:
        r = df[df["row_id"] == rid].iloc[0]
        try:
            case = vm.moe_case_from_row(r, df)
        except SpecError:
            continue
        c = case.cluster
        slow = c.model_copy(update={"tiers": [c.tiers[0], c.tiers[1].model_copy(
            update={"bw_gbit_per_s": gbit_per_s})]})
        now, _ = _step_s(r, case)
        alt, _ = _step_s(r, case, slow)
        rows.append({"row": rid, "model": r["model"], "error_800": now / case.measured_step_s - 1,
                     f"error_{int(gbit_per_s)}": alt / case.measured_step_s - 1})
    return pd.DataFrame(rows)


def main() -> None:
    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv")
    pd.set_option("display.width", 200)
    pd.set_option("display.float_format", lambda v: f"{v:.3f}")
    print("1. slope / fixed part of row pairs\n", slope_table(df).to_string(index=False))
    print("\n2. predicted terms [s]\n", terms_table(df).to_string(index=False))
    print("\n3. B300 scale-out what-if\n", b300_whatif(df).to_string(index=False))


if __name__ == "__main__":
    main()
