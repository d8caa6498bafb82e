"""``plan validate --forward``: the forward-looking section (out-of-sample errors by release,
model and GPU generation, the fitted constants, the intervals' coverage), for people and
programs."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from validation.constants import constants_records
from validation.forward import forward_report


def forward_section(json_out: bool) -> None:
    """Print the forward-looking section (``--json``: one JSON document)."""
    doc = {"forward": {**forward_report(), "constants": constants_records()}}
    if json_out:
        typer.echo(json.dumps(doc, indent=2, default=float))
        return
    out = Console(highlight=False)
    f = doc["forward"]
    _print_constants(out, f["constants"])
    _print_folds(out, f["folds"])
    _print_groups(out, f["groups"])
    _print_summary(out, f)


def _print_constants(out: Console, constants: list[dict]) -> None:
    t = Table(title="fitted constants", title_justify="left")
    for col in ("constant", "value", "unit", "set by", "evidence"):
        t.add_column(col, justify="right" if col == "value" else "left")
    for c in constants:
        t.add_row(c["name"], f"{c['value']:.4g}", c["unit"], c["rows"], c["evidence"])
    out.print(t)


def _print_folds(out: Console, folds: list[dict]) -> None:
    t = Table(title="out-of-sample by fold (in-sample beside; bias = mean signed error)",
              title_justify="left")
    for col in ("split", "held out", "kind", "rows", "MAPE", "bias", "in-sample MAPE",
                "in-sample bias"):
        t.add_column(col, justify="left" if col in ("split", "held out", "kind") else "right")
    for r in folds:
        t.add_row(r["split"], str(r["fold"]), r["kind"], str(r["rows"]), f"{r['mape']:.1%}",
                  f"{r['bias']:+.1%}", f"{r['insample_mape']:.1%}", f"{r['insample_bias']:+.1%}")
    out.print(t)


def _print_groups(out: Console, groups: list[dict]) -> None:
    t = Table(title="forward by release x GPU x precision (groups of >= 3 rows)",
              title_justify="left")
    for col in ("kind", "release", "GPU", "precision", "rows", "bias", "MAPE", "in-sample bias"):
        t.add_column(col, justify="right" if col in ("rows", "bias", "MAPE", "in-sample bias")
                     else "left")
    for g in groups:
        t.add_row(g["kind"], g["release"][:28], g["gpu"], g["precision"], str(g["rows"]),
                  f"{g['bias']:+.1%}", f"{g['mape']:.1%}", f"{g['insample_bias']:+.1%}")
    out.print(t)


def _print_summary(out: Console, f: dict) -> None:
    for key, s in f["summary"].items():
        o, i = s["out_of_sample"], s["in_sample"]
        c = s["out_of_sample_with_cold"]
        cold = (f", {s['cold_rows']} cold-start rows apart (with them {c['mape']:.1%}, "
                f"{c['bias']:+.1%})" if s["cold_rows"] else "")
        out.print(f"{key}: {o['rows']} rows, out-of-sample MAPE {o['mape']:.1%} (bias "
                  f"{o['bias']:+.1%}); in-sample {i['mape']:.1%} ({i['bias']:+.1%}){cold}")
    for t in f["targets"]:
        out.print(f"target {t['target']}: {t['measured']:.1%} (<= {t['threshold']:.0%}: "
                  f"{'met' if t['met'] else 'NOT met'})")
    iv = f["intervals"]
    out.print(f"80% intervals: {iv['coverage']:.0%} of {iv['rows']} forward rows inside "
              f"(leave one out), median half-width {iv['median_half_width']:.1%}")
