"""The strategies' tests are about the search: they plan under the what-if stack."""

import pytest


@pytest.fixture(autouse=True)
def _what_if(what_if_stack):
    """Every test here (see ``tests/conftest.py::what_if_stack``)."""
