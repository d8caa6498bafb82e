"""nccl-tests output turned into a tier's measured bus-bandwidth table."""

import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.core.errors import SpecError
from perfmodel.spec.specs import load_cluster
from validation.nccl_tests import busbw_table, parse_nccl_tests, table_toml

HEADER = "# nThread 1 nGpus {n} minBytes 8 maxBytes 134217728 step: 2(factor)\n# Using devices\n"
RANK = "#  Rank  {i} Group  0 Pid   4349 on  host device  {i} [0x01] NVIDIA A100 80GB PCIe\n"
COLS = ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong\n")
# all-reduce of 128 MiB on 8 GPUs: algbw 7.20 GB/s -> busbw 7.20 * 2*7/8 = 12.6 GB/s
ROWS = ("    67108864      16777216     float     sum      -1   9500.0    7.06   12.36      0"
        "   9510.0    7.06   12.35      0\n"
        "   134217728      33554432     float     sum      -1  18640.0    7.20   12.60      0"
        "  18650.0    7.20   12.60      0\n# Avg bus bandwidth    : 6.1\n")


def log(n: int, binary: str = "all_reduce_perf", rows: str = ROWS) -> str:
    return (f"# Collective test starting: {binary}\n" + HEADER.format(n=n)
            + "".join(RANK.format(i=i) for i in range(n)) + COLS + rows)


def test_largest_message_busbw_and_ranks():
    assert parse_nccl_tests(log(8)) == ("all_reduce", 8, 12.6)
    assert parse_nccl_tests(log(4, "alltoall_perf"))[:2] == ("all_to_all", 4)


def test_old_format_without_root_column():
    rows = ("   134217728      33554432     float     sum   18640.0    7.20   12.60  0e+00"
            "  18650.0    7.20   12.60  0e+00\n")
    assert parse_nccl_tests(log(2, rows=rows))[2] == 12.6


def test_errors_name_the_problem():
    with pytest.raises(SpecError, match="no nccl-tests result rows"):
        parse_nccl_tests(log(8, rows=""))
    with pytest.raises(SpecError, match="names no collective"):
        parse_nccl_tests(HEADER.format(n=8) + ROWS)
    with pytest.raises(SpecError, match="1 rank"):
        parse_nccl_tests(log(1))


def test_table_round_trips_through_a_cluster_file(tmp_path):
    table = busbw_table([parse_nccl_tests(log(8)), ("all_reduce", 2, 20.5)])
    assert table == {"all_reduce": {8: 12.6, 2: 20.5}}
    preset = load_cluster("pcie-a100-8")
    text = (f'name = "box"\ngpu = "a100-pcie-80gb"\ngpus_per_node = 8\nnum_nodes = 1\n'
            f'[[tiers]]\nname = "pcie4"\nkind = "pcie"\ndomain_size = 8\n'
            f"bw_gbyte_per_s = {preset.tiers[0].bw_gbyte_per_s}\n" + table_toml(table))
    path = tmp_path / "box.toml"
    path.write_text(text)
    assert load_cluster(path).tiers[0].busbw_gbyte_per_s == {"all_reduce": {2: 20.5, 8: 12.6}}


def test_cli_prints_the_table(tmp_path):
    path = tmp_path / "ar.log"
    path.write_text(log(8))
    res = CliRunner().invoke(app, ["calibrate-links", str(path)])
    assert res.exit_code == 0 and "all_reduce = { 8 = 12.6 }" in res.output
    res = CliRunner().invoke(app, ["calibrate-links", str(path), "--collective", "allreduce"])
    assert res.exit_code == 2 and "expected one of" in res.output
