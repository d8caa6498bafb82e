"""Sweeps: many scenarios (models x clusters x GPU counts x batches x hardware overrides), each
a full search, run on Dask and written as Parquet.

``sweep.sweep(spec, client=None, out=None)`` is the entry point; ``plan sweep SPEC.toml --out
results.parquet`` on the command line maps onto it. Plots are in :mod:`sweep.plots`.
"""

from sweep.run import run_figures, run_scenario, sweep
from sweep.spec import MAX_SCENARIOS, Scenario, SweepSpec, check_spec, load_sweep_spec

__all__ = [
    "MAX_SCENARIOS",
    "Scenario",
    "SweepSpec",
    "check_spec",
    "load_sweep_spec",
    "run_figures",
    "run_scenario",
    "sweep",
]
