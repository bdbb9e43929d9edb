"""The GPU checks, prepared on a CPU machine and run in one call on a GPU machine."""
