"""The engine: plans a run into phases, runs their tasks through an executor, and finishes the run folder.

The map: ``plan`` (the run spec), ``phases`` (the run as data), ``runner`` (the loop), ``executors``
(in-process or Ray), ``run_record`` (identity and input checks), ``worker`` (what a worker does around a
task), ``faults`` (test hooks), ``finish`` (counts, stats.duckdb, conservation), ``tasks/`` (the task
bodies, no Ray). Nothing here is imported by stages or the loader."""
