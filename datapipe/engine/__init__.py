"""The engine: plans a run into phases, runs their tasks through an executor, and finishes the run folder.

The map: ``plan`` (the run spec), ``phases`` (the run as data), ``runner`` (the loop), ``executors/``
(the seam, in-process, and Ray in ``executors/ray/``), ``worker`` (``run_task``, the one task wrapper
every executor runs), ``run_record`` (identity and input checks), ``work_files`` (the phases' names and
the global steps' files under ``_work/``), ``finish`` (counts, stats.duckdb, conservation), ``tasks/``
(the task bodies, no Ray). Only the CLI imports the engine (tests/test_imports.py)."""
