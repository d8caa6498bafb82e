"""Measured bus bandwidth from nccl-tests output, as a cluster tier's ``busbw_gbyte_per_s`` table.

nccl-tests (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``, ``alltoall_perf``)
prints one row per message size: ``size count type redop [root] time algbw busbw #wrong`` for the
out-of-place run, then ``time algbw busbw #wrong`` in place. The table a tier takes is the
out-of-place ``busbw`` [GB/s] of the largest message of each run (the bandwidth term the cost
model needs; the latency term is the tier's ``latency_us``), keyed by collective and by the
number of ranks the run lists (``#  Rank  N ...`` lines).

Usage: ``plan calibrate-links all_reduce_8.log all_reduce_4.log`` prints the TOML table to paste
under the tier (``[tiers.busbw_gbyte_per_s]``).

References
----------
NCCL-tests ``doc/PERFORMANCE.md`` (algorithm and bus bandwidth; ``busbw = algbw * 2(n-1)/n``
for all-reduce, ``algbw * (n-1)/n`` for all-gather and reduce-scatter); NCCL-tests
``src/common.cu`` (the columns of the report).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from perfmodel.core.errors import SpecError
from perfmodel.core.files import read_text_bounded, shown

__all__ = ["BINARY_COLLECTIVES", "busbw_table", "calibrate_links_command", "parse_nccl_tests",
           "table_toml"]

BINARY_COLLECTIVES = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
                      "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "all_to_all"}
"""nccl-tests binaries and the collective (``LinkTier.busbw_gbyte_per_s`` key) each measures."""

_RANK = re.compile(r"^#\s*Rank\s+\d+\b")
_BINARY = re.compile(r"\b(all_reduce_perf|all_gather_perf|reduce_scatter_perf|alltoall_perf)\b")


def _row_busbw(line: str) -> tuple[int, float] | None:
    """(size [bytes], out-of-place busbw [GB/s]) of one result row, None for other lines."""
    tokens = re.sub(r"^(\[\d+\]\s*)+", "", line.strip()).split()
    if len(tokens) < 12 or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    try:  # ... time algbw busbw #wrong (out of place) time algbw busbw #wrong (in place)
        return int(tokens[0]), float(tokens[-6])
    except ValueError:
        return None


def parse_nccl_tests(text: str, collective: str | None = None) -> tuple[str, int, float]:
    """``(collective, ranks, busbw_gbyte_per_s)`` of one nccl-tests run: the collective named
    in the output (or ``collective``), the number of ranks listed, the out-of-place busbw of the
    largest message [GB/s]. :class:`SpecError` when the text holds no result rows.

    Example: ``#  Rank  0 ...`` to ``#  Rank  7 ...`` and a last row ``134217728 33554432 float
    sum -1 1.2e4 11.2 19.6 0 ...`` give ``("all_reduce", 8, 19.6)``.
    """
    lines = text.splitlines()
    found = next((m.group(1) for m in map(_BINARY.search, lines) if m), None)
    name = collective or (BINARY_COLLECTIVES[found] if found else None)
    if name is None:
        raise SpecError("nccl-tests output names no collective (all_reduce_perf, ...): "
                        "give --collective")
    rows = [r for r in map(_row_busbw, lines) if r is not None]
    if not rows:
        raise SpecError("no nccl-tests result rows (size count type redop ... busbw) found")
    ranks = sum(1 for line in lines if _RANK.match(line.strip()))
    if ranks < 2:
        raise SpecError(f"nccl-tests output lists {ranks} rank(s): a bus bandwidth needs 2 or more")
    return name, ranks, max(rows)[1]


def busbw_table(runs: list[tuple[str, int, float]]) -> dict[str, dict[int, float]]:
    """Collective -> group size -> busbw [GB/s] of several runs (the larger of repeats)."""
    out: dict[str, dict[int, float]] = {}
    for name, ranks, busbw in runs:
        row = out.setdefault(name, {})
        row[ranks] = max(busbw, row.get(ranks, 0.0))
    return out


def table_toml(table: dict[str, dict[int, float]]) -> str:
    """The ``[tiers.busbw_gbyte_per_s]`` table of a cluster file, to paste under the tier."""
    lines = ["[tiers.busbw_gbyte_per_s]   # nccl-tests busbw [GB/s] by group size"]
    for name in sorted(table):
        cells = ", ".join(f"{n} = {v:g}" for n, v in sorted(table[name].items()))
        lines.append(f"{name} = {{ {cells} }}")
    return "\n".join(lines) + "\n"


def calibrate_links_command(
    logs: Annotated[list[Path], typer.Argument(help="nccl-tests output files (stdout of "
                                               "all_reduce_perf, all_gather_perf, ...)")],
    collective: Annotated[str | None, typer.Option(
        "--collective", help="collective of every log (all_reduce, all_gather, reduce_scatter, "
        "all_to_all); default: read from each log")] = None,
) -> None:
    """Turn nccl-tests runs into a tier's measured bus-bandwidth table (TOML on stdout)."""
    try:
        if collective is not None and collective not in BINARY_COLLECTIVES.values():
            raise SpecError(f"--collective '{collective}': expected one of "
                            f"{', '.join(BINARY_COLLECTIVES.values())}")
        runs = []
        for log in logs:
            try:
                runs.append(parse_nccl_tests(read_text_bounded(log, "nccl-tests log"), collective))
            except SpecError as e:
                raise SpecError(f"{shown(log)}: {e}") from None
    except SpecError as e:
        typer.echo(f"plan: error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(table_toml(busbw_table(runs)), nl=False)
