"""``plan validate``: the validation report, predicted versus published step times, for people
(rich tables) and programs (``--json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from cli.main import command_line
from cli.validate_forward import forward_section
from perfmodel.core.errors import SpecError
from perfmodel.hardware.profile import load_profile
from validation.requests import typed_options
from validation.runs import read_runs, row_progress
from validation.typed_back import NEWEST_SOURCES, typed_back_report, typed_back_summary
from validation.validate import (
    group_table,
    row_requests,
    summary,
    training_runs_report,
    tuned_report,
)
from validation.validate_moe import (
    moe_doc,
    moe_row_requests,
    moe_tuned_report,
    moe_tuned_summary,
    print_moe_report,
    print_moe_tuned,
)
from validation.vtrain import vtrain_report


def validate_command(
    runs: Path | None = typer.Option(None, "--runs", help="a training-runs CSV with the columns "  # noqa: B008 (typer)
                                     "of the shipped training_runs_dev.csv (default: that file)"),
    vtrain: bool = typer.Option(True, "--vtrain/--no-vtrain", help="also rank the vTrain runs"),
    moe: bool = typer.Option(True, "--moe/--no-moe", help="also the published MoE runs "
                             "(moe_runs_dev.csv)"),
    tuned: bool = typer.Option(False, "--tuned", help="also the tuned-recipe checks: a free "
                               "search per vendor-recipe setting (dense runs, and the MoE runs "
                               "via validation.validate_moe.moe_tuned_report) against the measured "
                               "recipe; about a minute"),
    typed_back: bool = typer.Option(True, "--typed-back/--no-typed-back", help="also the rows "
                                    "of the newest two releases as a user types them, with "
                                    "each row's --framework and with none "
                                    "(validation.typed_back); about 40 s"),
    json_out: bool = typer.Option(False, "--json", help="one JSON document on stdout"),
    profile: str | None = typer.Option(None, "--profile", help="predict under this efficiency "
                                       "profile (shipped name or TOML from `plan calibrate`)"),
    commands: Path | None = typer.Option(None, "--commands", help="only the command lines: "  # noqa: B008 (typer)
                                         "each row's `plan ...` (one line a row, after its id), "
                                         "its spec files written to this folder; the command's "
                                         "--json step time is the one this report gives"),
    forward: bool = typer.Option(False, "--forward", help="only the forward-looking section: "
                                 "errors of constants refitted without the predicted rows (by "
                                 "release, model, GPU generation), the fitted constants and the "
                                 "80% intervals' coverage"),
) -> None:
    """Predicted versus published step times (the validation report)."""
    if forward:
        forward_section(json_out)
        return
    if commands is not None:
        _print_commands(commands, runs, moe and runs is None)
        return
    # 1. the dense published runs (a user error exits 2 with one line)
    report, skipped = _training_runs_or_exit(runs, profile)
    groups_df = group_table(report)
    doc: dict = {"training_runs": summary(report), "rows": report.to_dict("records"),
                 "groups": groups_df.to_dict("records"), "skipped": skipped.to_dict("records")}
    # 2. the optional parts, in the document's order: tuned recipes, vTrain, MoE runs
    tuned_df = tuned_report(runs) if tuned else None
    if tuned_df is not None:
        doc["tuned"] = _tuned_doc(tuned_df)
    if vtrain:
        doc["vtrain"] = _vtrain_doc()
    if moe:
        doc["moe_runs"], moe_report, moe_skipped = moe_doc()
    if typed_back and runs is None:
        doc["typed_back"] = typed_back_summary(typed_back_report())
    if tuned:
        moe_tuned_df = moe_tuned_report()
        doc["moe_tuned"] = {"summary": moe_tuned_summary(moe_tuned_df),
                            "settings": moe_tuned_df.to_dict("records")}
    if json_out:
        typer.echo(json.dumps(doc, indent=2, default=float))
        return
    # 3. the tables for people, in the same order
    out = Console(highlight=False)
    _print_training_runs(out, report, skipped, doc["training_runs"])
    _print_groups(out, groups_df)
    if "typed_back" in doc:
        out.print(typed_back_line(doc["typed_back"]))
    if tuned_df is not None:
        _print_tuned(out, tuned_df, doc["tuned"])
    if moe:
        print_moe_report(out, moe_report, moe_skipped)
    if tuned:
        print_moe_tuned(out, moe_tuned_df)
    if vtrain:
        v = doc["vtrain"]
        out.print(f"vTrain: {v['groups']} groups, mean Spearman {v['mean_spearman']:.3f}, "
                  f"MAPE {v['mape_single_node']:.1%} (one node), "
                  f"{v['mape_multi_node']:.1%} (multi-node)")


def _training_runs_or_exit(runs: Path | None, profile: str | None) -> tuple[
        pd.DataFrame, pd.DataFrame]:
    """:func:`training_runs_report` of ``runs`` under ``profile``; a user error exits 2 with one
    line on stderr."""
    try:
        prof = load_profile(profile)
        table = read_runs(runs)  # validation.runs: the one format of plan validate / calibrate
        with row_progress(len(table)) as progress:
            report, skipped = training_runs_report(table, profile=prof, progress=progress)
        if runs is not None and report.empty:
            raise SpecError(f"--runs {runs}: no row can be predicted"
                            + (f" (row {skipped.iloc[0, 0]}: {skipped.iloc[0, -1]})"
                               if len(skipped) else ""))
        return report, skipped
    except SpecError as e:
        typer.echo(f"plan: error: {e}", err=True)
        raise typer.Exit(2) from None
    except (OSError, KeyError, pd.errors.ParserError) as e:
        typer.echo(f"plan: error: --runs {runs}: cannot read a training-runs table: {e}", err=True)
        raise typer.Exit(2) from None


def row_command(options: dict, folder: Path, stem: str) -> str:
    """The ``plan ...`` command line of a row's request (:mod:`validation.requests`), its spec
    objects written to ``folder`` (:func:`validation.requests.typed_options`)."""
    return command_line(typed_options(options, folder, stem))


def _print_commands(folder: Path, runs: Path | None, moe: bool) -> None:
    """``row_id<TAB>plan ...`` for each row predicted (dense, then MoE); exit 2 with one line
    on a user error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        requests = row_requests(runs)
        if moe:
            requests.update(moe_row_requests())
    except (SpecError, OSError) as e:
        typer.echo(f"plan: error: {e}", err=True)
        raise typer.Exit(2) from None
    for row_id, options in requests.items():
        typer.echo(f"{row_id}\t{row_command(options, folder, safe_stem(row_id))}")


def safe_stem(row_id: str) -> str:
    """A file name stem of a row id (letters, digits, ``-`` and ``_``)."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in row_id)[:60] or "row"


def typed_back_line(s: dict) -> str:
    """One line: the newest releases' rows as a user types them, both ways."""
    return (f"typed back ({', '.join(NEWEST_SOURCES)}: {s['rows']} rows, {s['refused']} refused "
            f"as the command line refuses them): MAPE {s['mape_named']:.1%} with each row's "
            f"--framework named, {s['mape_default']:.1%} with no --framework")


def _tuned_doc(tuned_df: pd.DataFrame) -> dict:
    """The ``tuned`` part of the validation document."""
    ok = tuned_df["ratio"].between(0.90, 1.15)
    return {"settings": len(tuned_df), "within_0.90_1.15": float(ok.mean()),
            "rows": tuned_df.to_dict("records")}


def _vtrain_doc() -> dict:
    """The ``vtrain`` part of the validation document: rank correlation and errors."""
    rows, groups = vtrain_report()
    return {
        "groups": len(groups),
        "mean_spearman": float(groups["spearman"].mean()),
        "mape_single_node": float(rows.loc[rows["set"] == "single", "error"].abs().mean()),
        "mape_multi_node": float(rows.loc[rows["set"] == "multi", "error"].abs().mean()),
    }


def _print_training_runs(out: Console, report: pd.DataFrame, skipped: pd.DataFrame,
                         s: dict) -> None:
    """The published runs' table, its summary line ``s`` and the rows not expressible."""
    t = Table(title="published runs: predicted vs measured step time", title_justify="left")
    for col in ("row", "model", "GPUs", "config", "measured", "predicted", "error"):
        t.add_column(col, justify="right" if col in ("GPUs", "measured", "predicted", "error")
                     else "left")
    for r in report.itertuples():
        t.add_row(r.row_id, r.model, str(r.gpus), r.config, f"{r.measured_s:.4g} s",
                  f"{r.predicted_s:.4g} s", f"{r.error:+.1%}")
    out.print(t)
    if s["rows"]:
        out.print(f"{s['rows']} rows: MAPE {s['mape']:.1%}, worst {s['worst_row']} "
                  f"({s['max_abs_error']:.1%})")
    else:
        out.print("0 rows could be expressed")
    for r in skipped.itertuples():
        out.print(f"not expressible: {r.row_id} {r.model}: {r.reason}")


def _print_groups(out: Console, groups_df: pd.DataFrame) -> None:
    """The table by source x GPU x precision."""
    gt = Table(title="by source x GPU x precision (bias = mean signed error)", title_justify="left")
    for col in ("source", "GPU", "precision", "rows", "bias", "MAPE"):
        gt.add_column(col, justify="right" if col in ("rows", "bias", "MAPE") else "left")
    for g in groups_df.itertuples():
        gt.add_row(g.source, g.gpu_type, g.precision, str(g.rows), f"{g.bias:+.1%}",
                   f"{g.mape:.1%}")
    out.print(gt)


def _print_tuned(out: Console, tuned_df: pd.DataFrame, tuned_doc: dict) -> None:
    """The tuned recipes' table and the share within the band."""
    tt = Table(title="tuned recipes: free search per setting (ratio = measured / predicted "
               "best)", title_justify="left")
    for col in ("model", "GPU", "GPUs", "GBS", "seq", "precision", "measured", "best",
                "ratio", "best config"):
        tt.add_column(col, justify="right" if col in ("GPUs", "GBS", "seq", "measured",
                                                      "best", "ratio") else "left")
    for t in tuned_df.itertuples():
        tt.add_row(t.model, t.gpu_type, str(t.gpus), str(t.global_batch), str(t.seq_len),
                   t.precision, f"{t.measured_s:.4g} s", f"{t.predicted_best_s:.4g} s",
                   f"{t.ratio:.3f}", t.best_config)
    out.print(tt)
    out.print(f"tuned: {tuned_doc['within_0.90_1.15']:.0%} of {len(tuned_df)} settings "
              f"within 0.90 <= measured / best <= 1.15")
