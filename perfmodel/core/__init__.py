"""perfmodel.core."""
