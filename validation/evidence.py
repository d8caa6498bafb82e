"""Which published runs back a plan's efficiency: its calibration group.

A plan's MFU is only as good as the published runs its kernel efficiencies were checked on.
:func:`calibration_evidence` finds them in the dev split of published runs
(``hardware_specs/validation/training_runs_dev.csv``): the rows on the plan's GPU type of the
plan's precision class (16-bit, fp8, fp4) and kind of model (dense or mixture-of-experts), narrowed
to the rows of the plan's software stack (``--framework``) when there are any. A bf16 MoE plan is
never shown dense fp8 runs as its evidence: with no row of its class and kind, it says there is
none. For each group (source x GPU
x precision, as in ``plan validate``) it gives the row ids, the measured MFU range under the
tool's own MFU convention (the model FLOPs the plan counts, over the measured step time) and the
model's mean signed error on those rows. A GPU without any published row says so: its
efficiency is then transferred from another part's measurement by datasheet (the calibration
source is named).

Nothing here is fitted: it reports the evidence the efficiency rests on.
"""

from __future__ import annotations

import functools
import json

from hardware_specs import ROOT as SPECS_ROOT

__all__ = ["TABLE_PATH", "calibration_evidence", "evidence_line"]

#: The per-row numbers (:mod:`validation.evidence_table`, which writes them): a plan reads them
#: instead of evaluating the dev rows again.
TABLE_PATH = SPECS_ROOT / "validation" / "evidence_rows.json"


def _precision_family(precision: str) -> str:
    """The precision family a plan's precision is matched on against the calibration rows:
    every fp8 recipe (MXFP8 included) is ``fp8``, ``fp4``, bf16 / fp16 ``16-bit``, anything
    else itself (``fp32``). Coarser than the calibration groups
    (:func:`validation.calibrate.group_key`, which keep FP8-MX apart): evidence from any fp8
    recipe counts for a plan in another."""
    p = str(precision).lower()
    if "fp4" in p:
        return "fp4"
    if "fp8" in p:
        return "fp8"
    return "16-bit" if p in ("bf16", "fp16") else p


@functools.lru_cache(maxsize=1)
def _rows() -> tuple[dict, ...]:
    """The shipped per-row table (:mod:`validation.evidence_table`), in file order."""
    return tuple(json.loads(TABLE_PATH.read_text()))


@functools.lru_cache(maxsize=32)
def calibration_evidence(gpu_name: str, framework: str | None = None,
                         precision: str | None = None, moe: bool | None = None) -> dict:
    """The published runs a plan on ``gpu_name`` (under ``framework`` and ``precision``, of a
    mixture-of-experts model when ``moe``) is calibrated on.

    Returns ``{"gpu", "matched_by", "kind", "groups": [...]}``; each group has ``source``,
    ``gpu_type``, ``precision``, ``rows`` (ids), ``measured_mfu_min`` / ``_max`` (fractions,
    the tool's MFU convention) and ``bias`` (mean signed error of the predicted step time).
    ``groups`` is empty when the dev split has no run on that GPU of that precision class and
    kind of model (``kind``: "16-bit dense", "fp8 MoE", ...).
    """
    on_gpu = [x for x in _rows() if x["gpu_type"] == gpu_name]
    kind = []
    if precision is not None:
        cls = _precision_family(precision)
        on_gpu = [x for x in on_gpu if _precision_family(x["precision"]) == cls]
        kind.append(cls)
    if moe is not None:
        on_gpu = [x for x in on_gpu if x["moe"] == bool(moe)]
        kind.append("MoE" if moe else "dense")
    matched_by = " ".join(kind) or "GPU type"
    if framework is not None and any(x["framework"] == framework for x in on_gpu):
        on_gpu = [x for x in on_gpu if x["framework"] == framework]
        matched_by += f", framework {framework}"
    groups: dict[tuple, dict] = {}
    for x in on_gpu:
        if x["error"] is None:  # no finite positive prediction
            continue
        src, gpu, prec = x["source"], x["gpu_type"], x["precision"]
        g = groups.setdefault((src, gpu, prec), {"source": src, "gpu_type": gpu,
                                                 "precision": prec, "rows": [], "mfu": [],
                                                 "err": []})
        g["rows"].append(x["row_id"])
        g["mfu"].append(x["measured_mfu"])
        g["err"].append(x["error"])
    out = []
    for g in groups.values():
        out.append({"source": g["source"], "gpu_type": g["gpu_type"],
                    "precision": g["precision"], "rows": g["rows"],
                    "measured_mfu_min": min(g["mfu"]), "measured_mfu_max": max(g["mfu"]),
                    "bias": sum(g["err"]) / len(g["err"])})
    out.sort(key=lambda g: -len(g["rows"]))
    return {"gpu": gpu_name, "matched_by": matched_by, "kind": " ".join(kind), "groups": out}


def _ids(rows: list[str]) -> str:
    return ", ".join(rows) if len(rows) <= 3 else f"{rows[0]} ... {rows[-1]}"


def evidence_line(evidence: dict, calibration_source: str = "") -> str:
    """One line for the plan header: the calibration group(s) and their measured MFU range."""
    groups = evidence["groups"]
    if not groups:
        kind = evidence.get("kind") or ""
        return (f"calibrated on: no published {kind + ' ' if kind else ''}run on "
                f"{evidence['gpu']} in the dev split; kernel efficiency "
                f"{calibration_source or 'transferred by datasheet'}")
    parts = [f"{g['source']} / {g['gpu_type']} / {g['precision']} ({len(g['rows'])} runs "
             f"{_ids(g['rows'])}: measured MFU {g['measured_mfu_min']:.1%}-"
             f"{g['measured_mfu_max']:.1%}, model error {g['bias']:+.1%})" for g in groups[:2]]
    more = f" and {len(groups) - 2} more groups" if len(groups) > 2 else ""
    return (f"calibrated on ({evidence['matched_by']}): " + "; ".join(parts) + more)
