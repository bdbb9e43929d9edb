"""Auditing a run: the commands that read a run folder and its ``stats.duckdb`` after the fact.

- ``connect(RUN)``: the public Python API, a read-only DuckDB connection for notebooks (below);
- ``sql``: the confined, read-only connection every module here opens (``datapipe sql``);
- ``explain``: one document's signals and the rule that decided it (``datapipe explain``);
- ``mixture``: the token mixture against the target weights (``datapipe stats``);
- ``report``: one self-contained HTML page (``datapipe report``);
- ``summary``: the funnel a finished ``datapipe run`` prints;
- ``views``: the database's views (those of every run, and those stages declare), created at its end;
- ``schema``: the database's tables, declared once; ``aggregates``: the counts the map tasks write.

The database's tables are written at the end of a run by ``datapipe.engine.finish``. This file
imports nothing at import time, so importing one module of the package does not import the others.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["connect"]


def connect(run: str | os.PathLike[str], memory_limit: str | int | None = None) -> Any:
    """A read-only DuckDB connection to a finished run, for notebooks and scripts.

    ``run``: the run folder (a path, or the URI of one in object storage, read in place). The
    connection holds ``documents`` (one row per input document: id, source, kind, lang, status,
    stage, reason, n_chars, n_tokens and every signal), ``kept_docs`` and ``rejected_docs`` (the
    same with the text), the views (``funnel``, ``mixture``, ``shards``, ``contamination``, the
    stages' own) and the ``agg_`` tables (counts per source, language, stage, reason...). It is the
    connection ``datapipe sql`` uses: read-only, no file outside the run, at most ``memory_limit``
    (default $DATAPIPE_SQL_MEMORY_LIMIT, else a quarter of the machine's memory) and 4 threads.

    Results come as DuckDB relations: ``.arrow()`` (a pyarrow Table), ``.df()`` (pandas), ``.pl()``
    (Polars, where installed), ``.fetchall()``::

        import datapipe.audit
        con = datapipe.audit.connect("out/demo")
        con.sql("select stage, reason, count(*) from documents group by all").df()

    Close it (or use ``with``) when done. Raises ``datapipe.audit.sql.AuditError`` for a folder that
    is not a finished run.
    """
    from datapipe.audit.sql import AuditError
    from datapipe.audit.sql import connect as confined
    from datapipe.storage.uri import StorageError, local_run_dir

    try:
        folder = local_run_dir(os.fspath(run))
    except StorageError as exc:
        raise AuditError(str(exc)) from None
    return confined(folder, text_views=True, memory_limit=memory_limit)
