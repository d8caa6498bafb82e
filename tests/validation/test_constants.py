"""The registry of fitted constants and its docs page."""

from __future__ import annotations

from benchmarks import constants_doc
from perfmodel.compute import layer as compute
from perfmodel.moe.imbalance import TYPICAL_IMBALANCE
from validation.constants import fitted_constants, published_defaults


def test_registry_reads_the_live_values():
    by_name = {c.name: c for c in fitted_constants()}
    assert by_name["compute.LOW_PRECISION_GEMM_RATIO"].value == compute.LOW_PRECISION_GEMM_RATIO
    assert all(c.unit and c.source and c.rows for c in fitted_constants())


def test_constants_page_is_current():
    assert constants_doc.PAGE.read_text() == constants_doc.page_text()


def test_published_defaults_read_the_live_values():
    by_name = {c.name: c for c in published_defaults()}
    c = by_name["imbalance.TYPICAL_IMBALANCE"]
    assert c.value == TYPICAL_IMBALANCE and c.unit == "1" and "arXiv:2408.15664" in c.source
    assert c.evidence == "published measurements"
