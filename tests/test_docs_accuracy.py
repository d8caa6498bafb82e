"""The accuracy tables of docs/accuracy.md and README.md are what the validation code computes
now (regenerate with ``python benchmarks/accuracy_tables.py``)."""

from __future__ import annotations

import pytest

from benchmarks.accuracy_tables import PAGES, render, rendered_pages


def test_render_replaces_only_marked_text():
    text = "a\n<!-- accuracy:readme -->\nold\n<!-- /accuracy:readme -->\nb\n"
    assert render(text, {"readme": "new"}, "README.md") == (
        "a\n<!-- accuracy:readme -->\nnew\n<!-- /accuracy:readme -->\nb\n")
    assert set(PAGES.values()) == {"README.md", "docs/accuracy.md"}


@pytest.mark.slow
def test_accuracy_pages_are_current():
    """A fresh generation (minutes: the tuned-recipe searches) equals the committed pages."""
    stale = [page for page, (old, new) in rendered_pages().items() if old != new]
    assert not stale, f"stale accuracy tables in {stale}: run python benchmarks/accuracy_tables.py"
