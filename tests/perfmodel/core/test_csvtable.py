"""CSV tables as numpy columns (perfmodel.core.csvtable), as pandas read them."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware_specs import ROOT
from perfmodel.core.csvtable import group_mean, read_columns, to_float


def test_columns_comments_blank_lines_and_short_rows():
    text = "# source: x\na,b,c\n\n1,2,3 # note\n4,5\n"
    cols = read_columns(text, comment="#")
    assert list(cols) == ["a", "b", "c"]
    assert cols["a"].tolist() == ["1", "4"]
    assert cols["c"].tolist() == ["3 ", ""]
    assert np.isnan(to_float(cols["c"])[1]) and to_float(cols["c"])[0] == 3.0


@pytest.mark.parametrize("text, why", [("", "No columns"), ("a,b\n1,2,3\n", "line 2, saw 3")])
def test_bad_tables_are_value_errors(text, why):
    with pytest.raises(ValueError, match=why):
        read_columns(text)


def test_group_mean_by_hand():
    # keys 1, 0, 1 -> sorted 0, 1; means 2 / 1 = 2 and (1 + 3) / 2 = 2
    keys, mean = group_mean(np.array([[1.0], [0.0], [1.0]]), np.array([1.0, 2.0, 3.0]))
    assert keys.tolist() == [[0.0], [1.0]] and mean.tolist() == [2.0, 2.0]


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60))
def test_group_mean_is_pandas_to_the_bit(seed, n):
    """Many rows per key, values of very different sizes: the compensated sum in row order
    gives pandas' ``groupby().mean()`` exactly."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 3, (n, 2)).astype(float)
    values = rng.normal(size=n) * 10.0 ** rng.integers(-8, 8, n)
    df = pd.DataFrame({"a": keys[:, 0], "b": keys[:, 1], "v": values})
    ref = df.groupby(["a", "b"], as_index=False)["v"].mean()
    uniq, mean = group_mean(keys, values)
    assert np.array_equal(uniq, ref[["a", "b"]].to_numpy())
    assert np.array_equal(mean, ref["v"].to_numpy())


SHIPPED_CSV = sorted([*(ROOT / "calibration" / "h200").glob("*.csv"),
                      *(ROOT / "kernels").glob("*.csv"), ROOT / "validation" / "residuals.csv"])


@pytest.mark.parametrize("path", SHIPPED_CSV, ids=lambda p: p.name)
def test_shipped_tables_parse_as_pandas_parses_them(path):
    """Every number of the shipped tables is the float pandas' parser gives, to the bit."""
    ref = pd.read_csv(path, comment="#")
    cols = read_columns(path.read_text(encoding="utf-8"), comment="#")
    assert list(cols) == list(ref.columns)
    for name in ref.select_dtypes("number").columns:
        assert np.array_equal(to_float(cols[name]), ref[name].to_numpy(dtype=np.float64),
                              equal_nan=True), name
