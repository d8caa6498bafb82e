"""The one error a user sees: a spec or option that cannot be planned (one line, exit 2)."""


class SpecError(ValueError):
    """A user error in a spec or configuration; the message is one line, fit for a CLI."""
