"""PlanRequest declares every option once: the command line's options, search.plan's keywords
and the problem all come from its fields; its checks and the parser's are one line."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import typer
from pydantic import Field, ValidationError
from typer.testing import CliRunner

import search.api
from cli import main as cli
from cli.main import PlanCommand, app, command_signature, main
from perfmodel.core.codes import RECOMPUTE, SCHEDULE
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import PRECISIONS
from search.api import evaluate_config, make_problem, plan
from search.request import PlanRequest, cli_of
from tests.search.test_space import fake_evaluate

runner = CliRunner()

#: Fields that are no command-line option (objects, callbacks, seeds, micro-batch counts).
API_ONLY = {name for name, f in PlanRequest.model_fields.items() if not cli_of(f).show}
#: Options of the command that are not search.plan's (where the report goes).
OUTPUT_ONLY = set(PlanCommand.model_fields) - set(PlanRequest.model_fields)


def _cli_params() -> dict[str, object]:
    return {p.name: p for p in typer.main.get_command(app).params}


def test_each_option_is_one_field():
    fields = set(PlanRequest.model_fields)
    api_keywords = set(inspect.signature(plan).parameters)
    assert api_keywords == fields
    assert set(inspect.signature(make_problem).parameters) == fields
    assert set(_cli_params()) == (fields - API_ONLY) | OUTPUT_ONLY
    assert API_ONLY == {"num_microbatches", "seed", "evaluator", "progress"}
    assert OUTPUT_ONLY == {"json_out", "csv", "list_presets", "emit", "emit_dir"}


def test_api_keeps_its_signature():
    sig = inspect.signature(plan).parameters
    assert [n for n, p in sig.items() if p.default is p.empty] == ["model", "cluster"]
    assert (sig["training"].default, sig["strategy"].default, sig["top"].default,
            sig["uneven_layers"].default, sig["seed"].default) == (None, "grid", 10, True, 0)
    assert sig["gpus"].kind is inspect.Parameter.KEYWORD_ONLY


def test_cli_passes_every_request_option_to_the_api(monkeypatch):
    seen = {}

    def fake_plan(**kwargs):
        seen.update(kwargs)
        raise SpecError("stop here")

    monkeypatch.setattr(search.api, "plan", fake_plan)
    r = runner.invoke(app, ["--gpus", "8", "--global-batch", "16", "--zero", "1",
                            "--precision", "fp8", "--max-memory", "70GiB", "--training", "t.toml"])
    assert r.exit_code == 2 and r.stderr == "plan: error: stop here\n"
    assert set(seen) == (set(PlanRequest.model_fields) - API_ONLY) | {"progress"}
    assert (seen["gpus"], seen["global_batch_size"], seen["zero_stage"]) == (8, 16, 1)
    assert seen["precision"] == "fp8" and type(seen["precision"]) is str
    assert seen["max_memory_bytes"] == 70 * 2**30 and seen["training"] == "t.toml"


def test_choices_come_from_the_registries():
    params = _cli_params()

    def names(name):
        return [m.value for m in params[name].type_descriptor.annotation]

    assert names("precision") == list(PRECISIONS)
    assert names("recompute") == list(RECOMPUTE)
    assert names("schedule") == list(SCHEDULE)
    assert names("strategy") == list(search.api.STRATEGIES)


def test_help_documents_every_option_with_its_field_text():
    out = runner.invoke(app, ["--help"], terminal_width=400).stdout
    for name, field in PlanCommand.model_fields.items():
        if cli_of(field).show:
            assert cli._flag(name, field) in out
            assert " ".join(field.description.split()) in " ".join(out.split())


def test_a_field_added_to_a_subclass_is_an_option():
    class Extended(PlanCommand):
        knob_bytes: int | None = Field(None, description="a new knob [bytes]")

    got = {}

    def command(ctx: typer.Context, **options):
        got.update(options)

    command.__signature__ = command_signature(Extended)
    extended = typer.Typer(add_completion=False, rich_markup_mode=None)
    extended.command()(command)
    assert "--knob-bytes" in runner.invoke(extended, ["--help"]).stdout
    assert "a new knob [bytes]" in runner.invoke(extended, ["--help"]).stdout
    assert runner.invoke(extended, ["--knob-bytes", "3"]).exit_code == 0
    assert got["knob_bytes"] == 3 and got["top"] == 10


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"gpus": "64"}, "gpus = '64'"),
        ({"tp": [1, 2.5]}, "tp = 2.5"),
        ({"seed": -1}, "seed = -1"),
        ({"strategy": 7}, "strategy = 7"),
        ({"kernels": None}, "kernels = None"),
        ({"bogus": 1}, "'bogus'"),
    ],
)
def test_request_errors_are_one_line_naming_field_and_value(options, needle):
    with pytest.raises(SpecError) as e:
        PlanRequest(**options)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_request_keeps_values_as_given():
    r = PlanRequest(gpus=np.int64(8), pp=range(1, 3), zero=1, mbs=[1, 2], sp=True)
    assert type(r.gpus) is np.int64 and r.pp == range(1, 3)
    assert (r.zero_stage, r.micro_batch_size, r.sequence_parallel) == (1, [1, 2], True)
    with pytest.raises(ValidationError, match="frozen"):
        r.top = 3


def test_make_problem_and_evaluate_config_take_the_request_fields():
    p = make_problem("gpt3-1.3b", "dgx-a100-80g", gpus=8, global_batch_size=64, tp=2,
                     evaluator=fake_evaluate)
    assert list(p.space.values["tp"]) == [2]
    with pytest.raises(SpecError, match="did you mean 'gpus'"):
        evaluate_config("gpt3-1.3b", "dgx-a100-80g", gpu=8)


@pytest.mark.parametrize(
    "args, line",
    [
        (["--gpus", "abc"], "--gpus 'abc': expected a whole number"),
        (["--gpus=abc"], "--gpus 'abc': expected a whole number"),
        (["--top", "0"], "--top '0': expected a whole number of at least 1"),
        (["--zero", "5"], "--zero '5': expected a whole number from 0 to 3"),
        (["--memory-headroom", "nan"], "--memory-headroom 'nan': expected a number from 0.0 to 0.9"),
        (["--objective", "speed"], "--objective 'speed': expected one of time, memory, cost"),
        (["--tpo", "3"], "No such option: --tpo"),
        (["validate", "--no-typed-back", "--bogus"], "No such option: --bogus"),
    ],
)
def test_parser_errors_are_one_line(args, line):
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"plan: error: {line}") and r.stderr.count("\n") == 1


def test_main_parser_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--gpus", "abc"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "plan: error: --gpus 'abc': expected a whole number\n"
