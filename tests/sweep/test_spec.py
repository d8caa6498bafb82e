"""Sweep specs: the product of the lists, stable scenario ids, overrides of hardware fields,
and every bad spec refused with one line and exit 2 before any search runs."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.spec.specs import SpecError, load_cluster
from sweep.spec import MAX_SCENARIOS, apply_overrides, check_spec, load_sweep_spec

runner = CliRunner()

BASE = {"models": ["gpt3-125m"], "clusters": ["dgx-h100"], "gpus": [8], "global_batch": [16],
        "seq_len": [2048]}


def _toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_scenarios_are_the_product_with_stable_ids():
    spec = load_sweep_spec({**BASE, "gpus": [8, 16], "precision": ["bf16", "fp8"],
                            "overrides": {"gpu.hbm_gib": [80, 141, 192]}})
    scenarios = list(spec.scenarios())
    assert spec.size == len(scenarios) == 2 * 2 * 3
    ids = [s.id for s in scenarios]
    assert len(set(ids)) == len(ids)
    again = load_sweep_spec({**BASE, "gpus": [16, 8], "precision": ["fp8", "bf16"],
                             "overrides": {"gpu.hbm_gib": [192, 141, 80]}})
    assert sorted(s.id for s in again.scenarios()) == sorted(ids)  # order of lists: same ids


def test_a_single_value_is_a_one_element_list():
    spec = load_sweep_spec({**BASE, "gpus": 8, "precision": "bf16"})
    assert spec.gpus == (8,) and spec.precision == ("bf16",)


def test_overrides_replace_hardware_fields_and_revalidate():
    c = load_cluster("dgx-h100")
    assert c.tiers[1].bw_gbyte_per_s is None and c.tiers[1].bw_gbit_per_s is not None
    o = apply_overrides(c, (("gpu.hbm_gib", 192), ("cluster.tiers.1.bw_gbyte_per_s", 100.0)))
    assert o.gpu.hbm_gib == 192 and o.gpu.hbm_bytes == 192 * 2**30
    assert o.tiers[1].bw_gbyte_per_s == 100.0 and o.tiers[1].bw_gbit_per_s is None  # one unit
    assert o.tiers[1].bw_bytes_per_s == 100e9
    assert o.tiers[0] == c.tiers[0] and o.num_nodes == c.num_nodes
    domain = apply_overrides(c, (("cluster.tiers.0.domain_size", 72),))
    assert domain.scale_up_size == 72


def test_nested_toml_tables_are_dotted_override_keys(tmp_path):
    path = _toml(tmp_path / "s.toml", 'models = ["gpt3-125m"]\nclusters = ["dgx-h100"]\n'
                 "gpus = [8]\nglobal_batch = [16]\nseq_len = [2048]\n"
                 '[overrides]\n"gpu.hbm_gib" = [80, 141]\ncluster.tiers.1.bw_gbit_per_s = [800]\n')
    spec = load_sweep_spec(path)
    assert spec.overrides == {"gpu.hbm_gib": (80, 141), "cluster.tiers.1.bw_gbit_per_s": (800,)}


@pytest.mark.parametrize("extra, words", [
    ({"modles": ["x"]}, "unknown key 'modles'"),
    ({"gpus": []}, "gpus is an empty list"),
    ({"overrides": {"gpu.hbm_gib": []}}, "empty list"),
    ({"overrides": {"nic.speed": [1]}}, "expected gpu.<field> or cluster.<field>"),
    ({"strategy": ["exhaustive"]}, "strategy"),
    ({"top": 0}, "top"),
])
def test_malformed_specs_are_one_line_errors(extra, words):
    with pytest.raises(SpecError, match=words.replace(".", r"\.").replace("<", ".")):
        load_sweep_spec({**BASE, **extra})


@pytest.mark.parametrize("extra, words", [
    ({"models": ["gpt3-125m", "llama9-1t"]}, "unknown model preset 'llama9-1t'"),
    ({"clusters": ["dgx-h1000"]}, "unknown cluster preset 'dgx-h1000'"),
    ({"framework": ["megatron-1999"]}, "megatron-1999"),
    ({"precision": ["fp9"]}, "precision = 'fp9'"),
    ({"overrides": {"gpu.hbm_gibs": [80]}}, "unknown key 'gpu.hbm_gibs'"),
    ({"overrides": {"gpu.hbm_gib": [-1]}}, "hbm_gib = -1"),
    ({"overrides": {"cluster.tiers.7.latency_us": [1]}}, "has no 'tiers.7'"),
])
def test_specs_that_do_not_load_are_refused_before_any_search(extra, words):
    with pytest.raises(SpecError, match=words.replace(".", r"\.")):
        check_spec(load_sweep_spec({**BASE, **extra}))


def test_too_many_scenarios_need_yes():
    n = 10_000
    spec = load_sweep_spec({**BASE, "gpus": list(range(1, n + 1)),
                            "global_batch": list(range(1, n + 1))})  # 10^8 scenarios
    assert spec.size == n * n > MAX_SCENARIOS
    with pytest.raises(SpecError, match="100,000,000 scenarios.*--yes"):
        check_spec(spec)
    check_spec(spec, yes=True)  # counted, not built


def _one_line_exit_2(args):
    r = runner.invoke(app, args)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("plan: error: "), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    return lines[0]


_BODY = ('models = ["gpt3-125m"]\nclusters = ["dgx-h100"]\ngpus = [8]\nglobal_batch = [16]\n'
         'seq_len = [2048]\n')


@pytest.mark.parametrize("body, words", [
    (_BODY + 'colour = "red"\n', "unknown key 'colour'"),
    (_BODY.replace('["gpt3-125m"]', "[]"), "models is an empty list"),
    (_BODY.replace("gpt3-125m", "no-such-model"), "unknown model preset"),
    (_BODY.replace("[2048]", "[2048"), "not valid TOML"),
])
def test_cli_bad_spec_exit_2_one_line_nothing_written(tmp_path, body, words):
    out = tmp_path / "r.parquet"
    line = _one_line_exit_2(["sweep", str(_toml(tmp_path / "s.toml", body)), "--out", str(out)])
    assert words in line
    assert not out.exists() and not Path(f"{out}.parts").exists()


def test_cli_huge_sweep_without_yes(tmp_path):
    gpus = ", ".join(str(g) for g in range(1, 10_001))
    body = (f'models = ["gpt3-125m"]\nclusters = ["dgx-h100"]\ngpus = [{gpus}]\n'
            f"global_batch = [{gpus}]\nseq_len = [2048]\n")
    line = _one_line_exit_2(["sweep", str(_toml(tmp_path / "s.toml", body)), "--out",
                             str(tmp_path / "r.parquet")])
    assert "100,000,000 scenarios" in line and "--yes" in line


def test_cli_workers_with_scheduler_is_refused(tmp_path):
    body = ('models = ["gpt3-125m"]\nclusters = ["dgx-h100"]\ngpus = [8]\nglobal_batch = [16]\n'
            "seq_len = [2048]\n")
    line = _one_line_exit_2(["sweep", str(_toml(tmp_path / "s.toml", body)), "--out",
                             str(tmp_path / "r.parquet"), "--scheduler", "tcp://127.0.0.1:1",
                             "--workers", "2"])
    assert "--workers" in line
