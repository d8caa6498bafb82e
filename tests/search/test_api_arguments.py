"""Every bad API argument is a one-line SpecError, never a TypeError, an
AttributeError, an IndexError or an OverflowError; and it is refused before any search work."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.core.errors import SpecError
from search.api import MAX_TOP, evaluate_config, plan

ARGS = ("gpt3-1.3b", "dgx-a100-80g")
KW = {"gpus": 8, "global_batch_size": 64, "seq_len": 2048}


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"gpus": "64"}, "gpus = '64'"),
        ({"gpus": 4.5}, "gpus = 4.5"),
        ({"gpus": True}, "gpus = True"),
        ({"gpus": 0}, "gpus = 0"),
        ({"strategy": 123}, "strategy = 123"),
        ({"strategy": None}, "strategy = None"),
        ({"top": 2.5}, "top = 2.5"),
        ({"top": 0}, "top = 0"),
        ({"top": 10**9}, f"top = {10**9}: expected an integer in [1, {MAX_TOP}]"),
        ({"tp": 10**19}, "tp = 10000000000000000000"),
        ({"tp": "8"}, "tp = '8'"),
        ({"pp": [1, 2.5]}, "pp = 2.5"),
        ({"zero_stage": -1}, "zero_stage = -1"),
        ({"seed": -1}, "seed = -1"),
        ({"seed": 2**64}, "seed = "),
        ({"seed": "0"}, "seed = '0'"),
        ({"global_batch_size": "64"}, "global_batch_size = '64'"),
        ({"seq_len": 2048.0}, "seq_len = 2048.0"),
        ({"precision": 16}, "precision = 16"),
        ({"objective": 1}, "objective = 1"),
        ({"kernels": None}, "kernels = None"),
        ({"num_microbatches": 10**30}, "num_microbatches = "),
    ],
)
def test_bad_argument_is_one_line_spec_error(bad, needle):
    kw = {**KW, **bad}
    if "strategy" in bad and bad["strategy"] is None:
        kw["strategy"] = None
    with pytest.raises(SpecError) as ei:
        plan(*ARGS, **kw)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg


_BAD_VALUES = st.one_of(
    st.text(max_size=4), st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer()),
    st.integers(max_value=0), st.integers(min_value=2**63), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["gpus", "top", "seed", "tp", "pp", "dp", "cp", "vp",
                             "micro_batch_size", "global_batch_size", "seq_len", "strategy"]),
       value=_BAD_VALUES)
def test_any_bad_argument_raises_spec_error_only(name, value):
    kw = {**KW, name: value}
    try:
        plan(*ARGS, **kw)
    except SpecError as err:
        assert "\n" not in str(err)
    # anything else (TypeError, OverflowError, ...) fails the test; some values are valid
    # (seed=0, a list of tp values, gpus=None, ...), and those may return a result


def test_evaluate_config_bad_arguments():
    with pytest.raises(SpecError, match=r"tp = 1\.5"):
        evaluate_config(*ARGS, tp=1.5, **KW)
    with pytest.raises(SpecError, match="gpus = '8'"):
        evaluate_config(*ARGS, tp=1, **{**KW, "gpus": "8"})
