"""The one user-error type of the project."""

from __future__ import annotations

__all__ = ["SpecError"]


class SpecError(ValueError):
    """A user error in a spec or configuration; the message is one line, fit for a CLI."""
