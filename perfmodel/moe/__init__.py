"""perfmodel.moe.experts."""
