"""The local calibration cache shared by every `plan verify`: atomic, locked, and a corrupt
cache counts as absent."""

from __future__ import annotations

import json
import os
import platform
import threading
import time

import pytest

from harness import calibrate as cal

HOST = {"machine": platform.machine(), "cpus": os.cpu_count(), "node": platform.node()}
RUN = {"matmul_flops_per_s": {"64": 1e9}, "copy_bytes_per_s": 1e9, "op_overhead_s": 1e-6,
       "gloo_bw_bytes_per_s": 1e9, "gloo_latency_s": 1e-5}


@pytest.fixture
def measured(monkeypatch):
    """_run_one replaced by a slow fake that counts its calls per process count."""
    calls: list[int] = []

    def fake(n, timeout_s):
        calls.append(n)
        time.sleep(0.2)
        return dict(RUN)

    monkeypatch.setattr(cal, "_run_one", fake)
    return calls


@pytest.mark.parametrize("text", ["", "{", "[]", "42", '{"host": 1}', "\x00\xff",
                                  json.dumps({"host": HOST, "runs": {"2": {"x": 1}}}),
                                  json.dumps({"host": HOST, "runs": []})])
def test_corrupt_cache_counts_as_absent(tmp_path, measured, text):
    p = tmp_path / "cal.json"
    p.write_bytes(text.encode("latin-1"))
    assert cal.read_cache(p, HOST)["runs"] == {}
    res = cal.calibrate((2,), p)
    assert measured == [2] and res["runs"]["2"] == RUN
    assert json.loads(p.read_text())["runs"]["2"] == RUN
    cal.local_cluster(2, res)


def test_cache_hit_does_not_rewrite(tmp_path, measured):
    p = tmp_path / "cal.json"
    cal.calibrate((2,), p)
    before = p.stat().st_mtime_ns, p.stat().st_ino
    cal.calibrate((2,), p)
    assert measured == [2] and (p.stat().st_mtime_ns, p.stat().st_ino) == before


def test_concurrent_calibrations_keep_both_results(tmp_path, measured):
    p = tmp_path / "cal.json"
    threads = [threading.Thread(target=cal.calibrate, args=((n,), p)) for n in (2, 4, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads(p.read_text())["runs"]) == ["2", "4"]
    assert sorted(measured) == [2, 4]  # the second "2" waited for the lock and found it
    assert sorted(os.listdir(tmp_path)) == ["cal.json", "cal.json.lock"]
