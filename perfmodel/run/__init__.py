"""Whole-run terms above one step: interruptions, checkpoints, energy and cost, and the recipe
:func:`train_run` that composes them into time to train and goodput."""

from perfmodel.run.checkpoint import daly_interval_s, young_interval_s
from perfmodel.run.failures import INTERRUPTIONS_PER_GPU_HOUR, expected_interruptions
from perfmodel.run.train import (
                                 BOUNDED,
                                 RunSettings,
                                 TrainRun,
                                 run_settings,
                                 train_run,
                                 train_run_bounds,
)

__all__ = [
    "BOUNDED",
    "INTERRUPTIONS_PER_GPU_HOUR",
    "RunSettings",
    "TrainRun",
    "daly_interval_s",
    "expected_interruptions",
    "run_settings",
    "train_run",
    "train_run_bounds",
    "young_interval_s",
]
