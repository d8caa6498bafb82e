"""perfmodel.pipeline.schedules."""
