"""Search parallel configurations: the space, strategies (grid, NSGA-II, GA), results, API.

``search.plan(model, cluster, ...)`` is the entry point; ``plan`` on the command line maps onto it;
both take the fields of :class:`search.request.PlanRequest`.
"""

from search.api import evaluate_config, make_problem, plan
from search.request import PlanRequest
from search.result import Diagnostic, SearchResult
from search.space import Problem, SearchSpace, make_space
from search.strategies.evolutionary import GeneticSearch
from search.strategies.grid import GridSearch
from search.strategies.nsga2 import NSGA2Search

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

