"""DataFrames on request: the one place the model's packages load pandas.

Planning itself (the command line's tables and JSON) works on numpy columns and never needs
pandas, whose import costs about a fifth of a second; the ``to_frame`` / ``top`` / ``pareto``
views that notebooks and validation read build their frame through :func:`data_frame`, which
imports pandas on its first call. This is the one function-local import of pandas in
``perfmodel`` and ``search`` (``tests/test_architecture.py`` pins where third-party imports
inside functions may stand).
"""

from __future__ import annotations

from typing import Any

__all__ = ["data_frame"]


def data_frame(data: Any, columns: list[str] | None = None) -> Any:
    """``pandas.DataFrame(data, columns=columns)``, pandas loaded on the first call."""
    import pandas as pd

    return pd.DataFrame(data, columns=columns)
