"""The grid's size limit, lifted on request: ``max_configurations`` (``--max-configurations``,
0 = no limit); past the limit, one line and exit status 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.core.errors import SpecError
from search.api import grid_limit, plan
from search.space import MAX_GRID_CONFIGURATIONS
from tests.search.test_space import fake_evaluate

SMALL = {"model": "gpt3-125m", "cluster": "dgx-h100", "gpus": 8}


def test_grid_limit_of_the_request():
    assert grid_limit(None) == MAX_GRID_CONFIGURATIONS
    assert grid_limit(0) is None
    assert grid_limit(1000) == 1000


def test_a_limit_below_the_space_is_one_line():
    with pytest.raises(SpecError, match=r"limit 10\).*--max-configurations N \(0: none\)"):
        plan(**SMALL, max_configurations=10, evaluator=fake_evaluate)


def test_no_limit_searches_the_whole_space():
    seen = []
    r = plan(**SMALL, max_configurations=0, evaluator=fake_evaluate,
             progress=lambda done, total: seen.append((done, total)))
    assert r.evaluated > 10
    assert seen and seen[-1][0] == seen[-1][1]  # the progress reaches its total


@pytest.mark.parametrize("bad", [-1, 2.5, "many", True])
def test_bad_limits_are_refused(bad):
    with pytest.raises(SpecError, match="max_configurations"):
        plan(**SMALL, max_configurations=bad, evaluator=fake_evaluate)


def test_cli_limit_is_one_line_and_exit_2():
    res = CliRunner().invoke(app, ["--model", "gpt3-125m", "--cluster", "dgx-h100", "--gpus",
                                   "8", "--max-configurations", "10"])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1
    assert "--max-configurations" in res.output
