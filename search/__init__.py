"""Search parallel configurations: the space, strategies (grid, NSGA-II, GA), results, API.

``search.plan(model, cluster, ...)`` is the entry point; ``plan`` on the command line maps onto it;
both take the fields of :class:`search.request.PlanRequest`. ``search.NSGA2Search`` is imported
on first use (it brings pymoo).
"""

from search.api import evaluate_config, make_problem, plan, strategy_class
from search.request import PlanRequest
from search.result import Diagnostic, SearchResult
from search.space import Problem, SearchSpace, make_space
from search.strategies.evolutionary import GeneticSearch
from search.strategies.grid import GridSearch

__all__ = [
    "Diagnostic",
    "GeneticSearch",
    "GridSearch",
    "NSGA2Search",
    "PlanRequest",
    "Problem",
    "SearchResult",
    "SearchSpace",
    "evaluate_config",
    "make_problem",
    "make_space",
    "plan",
]


def __getattr__(name: str):
    """``NSGA2Search``, imported when first asked for (PEP 562)."""
    if name == "NSGA2Search":
        return strategy_class("nsga2")
    raise AttributeError(f"module 'search' has no attribute {name!r}")
