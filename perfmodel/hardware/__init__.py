"""perfmodel.hardware."""
