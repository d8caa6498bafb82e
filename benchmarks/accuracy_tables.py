"""Regenerate the README's accuracy tables from the tool's own output.

``python benchmarks/accuracy_tables.py`` rewrites, in README.md, the text between each pair of
markers ``<!-- accuracy:NAME -->`` / ``<!-- /accuracy:NAME -->`` (NAME = summary, groups, tuned,
rows) with what ``plan validate`` / ``plan validate --tuned`` compute now
(:func:`validation.validate.training_runs_report`, :func:`validation.validate.group_table`,
:func:`validation.validate.tuned_report`). ``--check`` only reports whether the README is current.
About a minute (the tuned-recipe searches).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from validation.validate import group_table, summary, training_runs_report, tuned_report

README = Path(__file__).resolve().parents[1] / "README.md"


def _pct(x: float, sign: bool = True) -> str:
    return f"{x:+.1%}" if sign else f"{x:.1%}"


def sections() -> dict[str, str]:
    report, skipped = training_runs_report()
    s = summary(report)
    groups = group_table(report)
    within = int((groups["bias"].abs() <= 0.07).sum())
    out = {"summary": (
        f"**{s['rows']} rows: MAPE {s['mape']:.1%}, worst row {s['max_abs_error']:.1%} "
        f"({s['worst_row']}); {within} of {len(groups)} groups within +-7 % mean signed "
        f"error.** Not expressible: "
        + ", ".join(f"{r.row_id} ({r.reason})" for r in skipped.itertuples()) + ".")}
    lines = ["| source | GPU | precision | rows | bias | MAPE |", "|---|---|---|---:|---:|---:|"]
    for g in groups.itertuples():
        flag = "" if abs(g.bias) <= 0.07 else " (out)"
        lines.append(f"| {g.source} | {g.gpu_type} | {g.precision} | {g.rows} | "
                     f"{_pct(g.bias)}{flag} | {_pct(g.mape, False)} |")
    out["groups"] = "\n".join(lines)
    t = tuned_report()
    ok = t["ratio"].between(0.90, 1.15)
    lines = [(f"**{int(ok.sum())} of {len(t)} settings ({ok.mean():.1%}) within 0.90 <= measured "
              "/ best <= 1.15.**"), "",
             ("| source | model | GPU | GPUs | GBS | seq | precision | measured [s] | "
              "best predicted [s] | ratio | best config |"),
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for r, good in zip(t.itertuples(), ok, strict=True):
        lines.append(f"| {r.source} | {r.model} | {r.gpu_type} | {r.gpus} | {r.global_batch} | "
                     f"{r.seq_len} | {r.precision} | {r.measured_s:.4g} | "
                     f"{r.predicted_best_s:.4g} | {r.ratio:.3f}{'' if good else ' (out)'} | "
                     f"{r.best_config} |")
    out["tuned"] = "\n".join(lines)
    lines = [("| row | source | model | GPU | GPUs | config | measured [s] | predicted [s] | "
              "error |"), "|---|---|---|---|---:|---|---:|---:|---:|"]
    for r in report.itertuples():
        lines.append(f"| {r.row_id} | {r.source} | {r.model} | {r.gpu_type} | {r.gpus} | "
                     f"{r.config} | {r.measured_s:.4g} | {r.predicted_s:.4g} | "
                     f"{_pct(r.error)} |")
    out["rows"] = "\n".join(lines)
    return out


def render(text: str, new: dict[str, str]) -> str:
    for name, body in new.items():
        pat = re.compile(rf"(<!-- accuracy:{name} -->\n).*?(\n<!-- /accuracy:{name} -->)",
                         re.DOTALL)
        if not pat.search(text):
            raise SystemExit(f"README.md has no <!-- accuracy:{name} --> markers")
        text = pat.sub(lambda m, b=body: m.group(1) + b + m.group(2), text)
    return text


def main() -> None:
    text = README.read_text()
    new = render(text, sections())
    if "--check" in sys.argv:
        print("README accuracy tables are current" if new == text else "README is stale")
        raise SystemExit(0 if new == text else 1)
    README.write_text(new)
    print("README.md accuracy tables rewritten")


if __name__ == "__main__":
    main()
