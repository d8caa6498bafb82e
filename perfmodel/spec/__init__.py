"""perfmodel.spec."""
