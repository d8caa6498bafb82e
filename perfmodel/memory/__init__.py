"""perfmodel.memory.breakdown."""
