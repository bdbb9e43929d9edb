"""A pipeline file loaded and validated against the stage and reader registries, and the run identity it gives."""
