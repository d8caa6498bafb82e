"""Small CSV tables as columns of numpy arrays (the shipped calibration and kernel tables).

* :func:`read_columns` parses CSV text into ``name -> array of text`` (blank lines skipped,
  ``#`` comments cut when asked, a row with more fields than the header refused, a shorter one
  padded with empty fields).
* :func:`to_float` turns a text column into float64 (NaN where a field is not a number).
* :func:`group_mean` averages values over the distinct key rows, as pandas'
  ``groupby(keys).mean()`` does (sorted keys, compensated sum in row order).
"""

from __future__ import annotations

import csv

import numpy as np

__all__ = ["group_mean", "read_columns", "to_float"]


def read_columns(text: str, comment: str | None = None) -> dict[str, np.ndarray]:
    """Columns of CSV ``text`` with a header row: ``name -> array of str`` (one per row).

    Raises ``ValueError`` (the message says why) for a text without a header, a row with more
    fields than the header, or a line the ``csv`` module refuses. ``comment``: text from this character to the end of a line is
    dropped (a line left empty with it).
    """
    lines = text.splitlines()
    if comment is not None:
        lines = [ln.split(comment, 1)[0] for ln in lines]
    try:
        rows = [(i + 1, r) for i, r in enumerate(csv.reader(lines)) if _filled(r)]
    except csv.Error as err:  # a NUL byte, a field over the csv module's limit
        raise ValueError(str(err)) from None
    if not rows:
        raise ValueError("No columns to parse from file")
    header = rows[0][1]
    body = []
    for line, r in rows[1:]:
        if len(r) > len(header):
            raise ValueError(f"Error tokenizing data: expected {len(header)} fields in line "
                             f"{line}, saw {len(r)}")
        body.append(r + [""] * (len(header) - len(r)))
    return {name: np.array([r[j] for r in body], dtype=object)
            for j, name in enumerate(header)}


def _filled(row: list[str]) -> bool:
    """Whether a parsed line is a row (not a blank line)."""
    return bool(row) and not (len(row) == 1 and not row[0].strip())


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def to_float(column: np.ndarray) -> np.ndarray:
    """A text column as float64; NaN where a field is empty or not a number."""
    return np.array([_number(str(v)) for v in column], dtype=np.float64)


def group_mean(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``keys`` (N, d), sorted, and the mean of ``values`` (N,) over each.

    The sum is Kahan-compensated over the rows of a group in their order, as pandas' grouped
    mean adds them, so the means are the same to the bit.
    """
    uniq, inv = np.unique(np.asarray(keys), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    values = np.asarray(values, dtype=np.float64)
    total = np.zeros(len(uniq))
    comp = np.zeros(len(uniq))
    count = np.bincount(inv, minlength=len(uniq)).astype(np.float64)
    order = np.argsort(inv, kind="stable")
    starts = np.searchsorted(inv[order], np.arange(len(uniq)))
    rank = np.arange(len(inv)) - starts[inv[order]]  # position of each row within its group
    for r in range(int(rank.max(initial=-1)) + 1):
        rows = order[rank == r]
        g = inv[rows]
        y = values[rows] - comp[g]
        t = total[g] + y
        comp[g] = np.where(np.isnan(c := (t - total[g]) - y), 0.0, c)
        total[g] = t
    return uniq, total / count
