"""The C heap's thresholds (perfmodel.core.heap): set on glibc, nothing elsewhere."""

import platform
import sys

import pytest

from perfmodel.core import heap


def test_keep_freed_heap_sets_glibc_thresholds():
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    assert heap.keep_freed_heap() is True


def test_keep_freed_heap_is_a_no_op_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap.keep_freed_heap() is False
