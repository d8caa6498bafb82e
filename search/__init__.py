"""Search parallel configurations: the space, strategies (grid, NSGA-II, GA), results, API.

``search.plan(model, cluster, ...)`` is the entry point; ``plan`` on the command line maps onto it.
NSGA-II (and so pymoo) is imported only when used.
"""

from search.api import evaluate_config, make_problem, plan
from search.result import Diagnostic, SearchResult
from search.space import Problem, SearchSpace, make_space
from search.strategies.evolutionary import GeneticSearch
from search.strategies.grid import GridSearch

__all__ = [
    "Diagnostic",
    "GeneticSearch",
    "GridSearch",
    "NSGA2Search",
    "Problem",
    "SearchResult",
    "SearchSpace",
    "evaluate_config",
    "make_problem",
    "make_space",
    "plan",
]


def __getattr__(name: str):
    if name == "NSGA2Search":
        from search.strategies.nsga2 import NSGA2Search

        return NSGA2Search
    raise AttributeError(name)
