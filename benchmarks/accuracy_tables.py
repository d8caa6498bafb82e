"""Generate the accuracy tables of docs/accuracy.md and README.md from the validation code.

``python benchmarks/accuracy_tables.py`` rewrites the text between each pair of markers
``<!-- accuracy:NAME -->`` / ``<!-- /accuracy:NAME -->`` with what the validation functions
compute now: in docs/accuracy.md NAME = summary, groups, tuned, rows, moe_summary, moe_models,
moe_tuned (:func:`validation.validate.training_runs_report`, :func:`validation.validate.group_table`,
:func:`validation.validate.tuned_report`, :func:`validation.validate_moe.moe_runs_report`,
:func:`validation.validate_moe.moe_tuned_report`), and in README.md NAME = readme (a small table of
the same numbers). ``--check`` only reports whether the pages are current (exit 1 if not);
``tests/test_docs_accuracy.py`` runs the same check. A few minutes (the tuned-recipe searches).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from validation.validate import group_table, summary, training_runs_report, tuned_report
from validation.validate_moe import (
    moe_runs_report,
    moe_summary,
    moe_tuned_report,
    moe_tuned_summary,
)

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"summary": "docs/accuracy.md", "groups": "docs/accuracy.md", "tuned": "docs/accuracy.md",
         "rows": "docs/accuracy.md", "moe_summary": "docs/accuracy.md",
         "moe_models": "docs/accuracy.md", "moe_tuned": "docs/accuracy.md",
         "readme": "README.md"}
#: The band of the tuned-recipe check: measured / best predicted step time.
TUNED_BAND = (0.90, 1.15)


@dataclass(frozen=True)
class Reports:
    """Every validation table the pages show, computed once."""

    dense: pd.DataFrame
    dense_skipped: pd.DataFrame
    tuned: pd.DataFrame
    moe: pd.DataFrame
    moe_skipped: pd.DataFrame
    moe_tuned: pd.DataFrame


def compute_reports() -> Reports:
    """Run the validation functions (a few minutes)."""
    dense, dense_skipped = training_runs_report()
    moe, moe_skipped = moe_runs_report()
    return Reports(dense, dense_skipped, tuned_report(), moe, moe_skipped, moe_tuned_report())


def _pct(x: float, sign: bool = True) -> str:
    return f"{x:+.1%}" if sign else f"{x:.1%}"


def _table(header: list[str], align: str, rows: list[list[str]]) -> str:
    """A Markdown table; ``align`` has one character per column, l or r."""
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join(["| " + " | ".join(header) + " |", rule,
                      *("| " + " | ".join(r) + " |" for r in rows)])


def _tuned_ok(ratio: pd.Series) -> pd.Series:
    return ratio.between(*TUNED_BAND)


def dense_sections(rep: Reports) -> dict[str, str]:
    """The dense model's summary line, group table, tuned-recipe table and row table."""
    s = summary(rep.dense)
    groups = group_table(rep.dense)
    within = int((groups["bias"].abs() <= 0.07).sum())
    out = {"summary": (
        f"**{s['rows']} rows: MAPE {s['mape']:.1%}, worst row {s['max_abs_error']:.1%} "
        f"({s['worst_row']}); {within} of {len(groups)} groups within +-7 % mean signed "
        "error.** Not expressible: "
        + ", ".join(f"{r.row_id} ({r.reason})" for r in rep.dense_skipped.itertuples()) + ".")}
    out["groups"] = _table(
        ["source", "GPU", "precision", "rows", "bias", "MAPE"], "lllrrr",
        [[g.source, g.gpu_type, g.precision, str(g.rows),
          _pct(g.bias) + ("" if abs(g.bias) <= 0.07 else " (out)"), _pct(g.mape, False)]
         for g in groups.itertuples()])
    t = rep.tuned
    ok = _tuned_ok(t["ratio"])
    out["tuned"] = (
        f"**{int(ok.sum())} of {len(t)} settings ({ok.mean():.1%}) within {TUNED_BAND[0]:.2f} <= "
        f"measured / best <= {TUNED_BAND[1]:.2f}.**\n\n" + _table(
            ["source", "model", "GPU", "GPUs", "GBS", "seq", "precision", "measured [s]",
             "best predicted [s]", "ratio", "best config"], "lllrrrlrrrl",
            [[r.source, r.model, r.gpu_type, str(r.gpus), str(r.global_batch), str(r.seq_len),
              r.precision, f"{r.measured_s:.4g}", f"{r.predicted_best_s:.4g}",
              f"{r.ratio:.3f}" + ("" if good else " (out)"), r.best_config]
             for r, good in zip(t.itertuples(), ok, strict=True)]))
    out["rows"] = _table(
        ["row", "source", "model", "GPU", "GPUs", "config", "measured [s]", "predicted [s]",
         "error"], "llllrlrrr",
        [[r.row_id, r.source, r.model, r.gpu_type, str(r.gpus), r.config, f"{r.measured_s:.4g}",
          f"{r.predicted_s:.4g}", _pct(r.error)] for r in rep.dense.itertuples()])
    return out


def moe_sections(rep: Reports) -> dict[str, str]:
    """The MoE summary line, the per-model table and the tuned-recipe table."""
    s = moe_summary(rep.moe)
    skipped = ", ".join(f"{r.row_id}" for r in rep.moe_skipped.itertuples()) or "none"
    out = {"moe_summary": (
        f"**{s['rows']} rows: MAPE {s['mape']:.1%}, {s['within_10pct']:.0%} of rows within 10 %, "
        f"worst row {s['max_abs_error']:.1%} ({s['worst_row']}); "
        f"{int(rep.moe['fits'].sum())} of {s['rows']} published recipes predicted to fit.** "
        f"Not expressible: {skipped}.")}
    by = rep.moe.assign(abs_error=rep.moe["error"].abs()).groupby("model", sort=True)
    out["moe_models"] = _table(
        ["model", "rows", "mean error", "MAPE", "worst"], "lrrrr",
        [[name, str(len(g)), _pct(g["error"].mean()), _pct(g["abs_error"].mean(), False),
          _pct(g["abs_error"].max(), False)] for name, g in by])
    t = rep.moe_tuned
    ts = moe_tuned_summary(t)
    k = ts["misses_by_kind"]
    out["moe_tuned"] = (
        f"**{ts['within']} of {ts['settings']} settings ({ts['fraction']:.0%}) within "
        f"{TUNED_BAND[0]:.2f} <= measured / best <= {TUNED_BAND[1]:.2f}.** Outside: "
        f"{k['recipe']} where the published recipe's own time is off by more than 10 %, "
        f"{k['gain']} where the search claims more than 1.15x over it, {k['both']} both, "
        f"{k['split']} where only the product is outside.\n\n" + _table(
            ["model", "GPU", "GPUs", "GBS", "precision", "measured [s]", "best predicted [s]",
             "ratio", "recipe error", "search gain", "best config"], "llrrlrrrrrl",
            [[r.model, r.gpu, str(r.gpus), str(r.global_batch), r.precision,
              f"{r.measured_s:.4g}", f"{r.predicted_best_s:.4g}",
              f"{r.ratio:.3f}" + ("" if r.ok else " (out)"),
              _pct(r.recipe_predicted_s / r.measured_s - 1.0), f"{r.search_gain:.2f}",
              r.best_config] for r in t.itertuples()]))
    return out


def readme_section(rep: Reports) -> str:
    """The README's small table: one line per check."""
    s, m = summary(rep.dense), moe_summary(rep.moe)
    ok = _tuned_ok(rep.tuned["ratio"])
    mt = moe_tuned_summary(rep.moe_tuned)
    return _table(["check", "cases", "result"], "lrl", [
        ["dense step time (Megatron-LM, NeMo, Megatron-Bridge; V100 to GB300)", str(s["rows"]),
         f"MAPE {s['mape']:.1%}, worst {s['max_abs_error']:.1%}"],
        ["mixture-of-experts step time (NeMo, Megatron-Bridge)", str(m["rows"]),
         f"MAPE {m['mape']:.1%}, {m['within_10pct']:.0%} within 10 %"],
        ["dense search: best found vs fastest published recipe", str(len(ok)),
         f"{int(ok.sum())} within {TUNED_BAND[0]:.2f}-{TUNED_BAND[1]:.2f}"],
        ["MoE search: best found vs fastest published recipe", str(mt["settings"]),
         f"{mt['within']} within {TUNED_BAND[0]:.2f}-{TUNED_BAND[1]:.2f}"],
    ])


def sections(rep: Reports | None = None) -> dict[str, str]:
    """Every marked section's new text, by marker name."""
    rep = rep or compute_reports()
    return {**dense_sections(rep), **moe_sections(rep), "readme": readme_section(rep)}


def render(text: str, new: dict[str, str], page: str) -> str:
    """``text`` with the body of every marker pair of ``new`` that belongs to ``page`` replaced."""
    for name, body in new.items():
        if PAGES[name] != page:
            continue
        pat = re.compile(rf"(<!-- accuracy:{name} -->\n).*?(<!-- /accuracy:{name} -->)",
                         re.DOTALL)
        if not pat.search(text):
            raise SystemExit(f"{page} has no <!-- accuracy:{name} --> markers")
        text = pat.sub(lambda m, b=body: m.group(1) + b + "\n" + m.group(2), text)
    return text


def rendered_pages(new: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """Per page: (committed text, freshly generated text)."""
    new = new or sections()
    out = {}
    for page in sorted(set(PAGES.values())):
        text = (ROOT / page).read_text()
        out[page] = (text, render(text, new, page))
    return out


def main() -> None:
    pages = rendered_pages()
    stale = [p for p, (old, new) in pages.items() if old != new]
    if "--check" in sys.argv:
        print("stale: " + ", ".join(stale) if stale else "accuracy tables are current")
        raise SystemExit(1 if stale else 0)
    for page, (_, new) in pages.items():
        (ROOT / page).write_text(new)
    print("accuracy tables rewritten in " + ", ".join(sorted(pages)))


if __name__ == "__main__":
    main()
