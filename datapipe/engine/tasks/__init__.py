"""The work of one task, as plain functions with no Ray: map, reduce and pack bodies, their sinks and isolation."""
