"""Auditing a run: the commands that read a run folder and its ``stats.duckdb`` after the fact.

- ``sql``: the confined, read-only connection every module here opens (``datapipe sql``);
- ``explain``: one document's signals and the rule that decided it (``datapipe explain``);
- ``mixture``: the token mixture against the target weights (``datapipe stats``);
- ``report``: one self-contained HTML page (``datapipe report``);
- ``summary``: the funnel a finished ``datapipe run`` prints;
- ``views``: the database's views (those of every run, and those stages declare), created at its end.

The database's tables are written at the end of a run by ``datapipe.engine.finish``. This file
imports nothing, so importing one module of the package does not import the others.
"""
