"""Shared test set-up: a non-interactive matplotlib backend and hypothesis settings."""

import os

import matplotlib

matplotlib.use("Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hypothesis import settings

settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import pytest

import search.api
from perfmodel.spec.frameworks import load_framework


@pytest.fixture
def what_if_stack(monkeypatch):
    """Plans with no framework use the what-if stack (``ideal``) instead of the GPU's default
    release: for tests of the model and the search themselves, whose numbers were set under
    the planner's own switches and must not follow a release's choices."""
    ideal = load_framework("ideal")
    monkeypatch.setattr(search.api, "default_framework", lambda gpu, model=None: (ideal, None))
