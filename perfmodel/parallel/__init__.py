"""perfmodel.parallel."""
