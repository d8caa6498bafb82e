"""Regenerate the forward-looking validation files: per-fold refitted constants
(``hardware_specs/validation/forward_folds.json``) and per-row out-of-sample predictions
(``hardware_specs/validation/residuals.csv``, also the residual table of the search's 80 %
intervals, :mod:`search.intervals`). The splits and what is refitted: :mod:`validation.forward`.

Run: ``python -m benchmarks.forward_refit`` (a few minutes: every row on each grid value).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pandas as pd

from benchmarks.moe_time_refit import _memoize_gemm_lookup
from validation import forward as fw


def _tables(rows: list[fw.Row]) -> dict:
    """Each row's prediction on the fraction grid and on the MoE host grid (shipped elsewhere)."""
    shipped = np.array([fw.predict_row(r, {}) for r in rows])
    frac = np.repeat(shipped[:, None], len(fw.FRACTION_GRID), axis=1)
    host = np.repeat(shipped[:, None], len(fw.HOST_GRID), axis=1)
    for i, r in enumerate(rows):
        part = fw.part_of(r.gpu)
        if part:
            frac[i] = [fw.predict_row(r, {"fraction": {part: f}}) for f in fw.FRACTION_GRID]
        if r.kind == "moe":
            host[i] = [fw.predict_row(r, {"moe_host_s": h}) for h in fw.HOST_GRID]
    return {"shipped": shipped, "fraction": frac, "host": host}


def _warm(row: fw.Row, consts: dict, train: np.ndarray, rows: list[fw.Row]) -> bool:
    """Whether the constants acting on the row had training rows (forward: else a cold start)."""
    part = fw.part_of(row.gpu)
    if part and part not in consts["fitted_parts"]:
        return False
    return row.kind == "dense" or any(t and r.kind == "moe" for t, r in zip(train, rows))


def _fold_records(rows, tables, split, key, test) -> tuple[dict, list[dict]]:
    train = fw.training_mask(rows, split, key, test)
    consts = fw.fit_constants(rows, train, tables)
    out = []
    for i in np.flatnonzero(test):
        r = rows[i]
        acts = bool(fw.part_of(r.gpu)) or r.kind == "moe"
        pred = fw.predict_row(r, consts) if acts else tables["shipped"][i]
        out.append({"row_id": r.row_id, "kind": r.kind, "split": split, "fold": key,
                    "release": r.release, "date": r.date, "model": r.model, "gpu": r.gpu,
                    "generation": r.generation, "precision": r.precision,
                    "framework": r.framework, "measured_s": r.measured_s, "predicted_s": pred,
                    "insample_s": tables["shipped"][i],
                    "error": pred / r.measured_s - 1.0,
                    "insample_error": tables["shipped"][i] / r.measured_s - 1.0,
                    "warm": _warm(r, consts, train, rows)})
    fold = {"split": split, "held_out": key, "train_rows": int(train.sum()),
            "test_rows": int(test.sum()), **consts}
    return fold, out


def main() -> None:
    t0 = time.time()
    _memoize_gemm_lookup()
    rows = fw.all_rows()
    tables = _tables(rows)
    print(f"{len(rows)} rows, surrogate tables in {time.time() - t0:.0f} s", flush=True)
    folds, records = [], []
    for split, key, test in fw.folds(rows):
        fold, recs = _fold_records(rows, tables, split, key, test)
        folds.append(fold)
        records += recs
        e = np.array([x["error"] for x in recs])
        print(f"{split:8s} {key:28s} n={len(recs):3d} MAPE {np.abs(e).mean():.2%} "
              f"bias {e.mean():+.2%}  {fold['fraction']} host {fold['moe_host_s']:.1e}",
              flush=True)
    fw.FOLDS_PATH.write_text(json.dumps({"folds": folds}, indent=1) + "\n")
    pd.DataFrame(records).to_csv(fw.RESIDUALS_PATH, index=False, float_format="%.6g")
    print(f"wrote {fw.FOLDS_PATH.name}, {fw.RESIDUALS_PATH.name} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
    sys.exit(0)
