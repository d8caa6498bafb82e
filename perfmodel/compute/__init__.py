"""perfmodel.compute.layer."""
