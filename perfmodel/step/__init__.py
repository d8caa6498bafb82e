"""perfmodel.step.evaluate."""
