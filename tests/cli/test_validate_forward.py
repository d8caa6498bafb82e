"""``plan validate --forward``: the forward-looking section, for people and programs."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_forward_json_has_targets_constants_and_coverage():
    r = runner.invoke(app, ["validate", "--forward", "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)["forward"]
    assert {t["target"] for t in f["targets"]} >= {"forward_dense_mape", "lomo_moe_mape"}
    assert any(c["name"] == "compute.LOW_PRECISION_GEMM_RATIO" for c in f["constants"])
    assert 0.0 < f["intervals"]["coverage"] <= 1.0
    assert f["summary"]["forward_dense"]["in_sample"]["rows"] > 0


def test_forward_tables_for_people():
    r = runner.invoke(app, ["validate", "--forward"])
    assert r.exit_code == 0, r.output
    assert "fitted constants" in r.stdout and "80% intervals" in r.stdout
