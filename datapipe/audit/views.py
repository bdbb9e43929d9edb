"""The views of a run's audit database ``stats.duckdb``, derived from its tables at the end of a run.

Every run has ``funnel`` (per stage and reason), ``shards`` (the manifest with ``fill``), ``mixture``
(kept documents and tokens by source x lang x script x license class, from ``agg_documents``) and ``contamination``
(benchmark n-gram hits; empty without a ``decontaminate`` stage): built from whatever columns
``documents`` has, so they exist and keep their columns in every run. A stage adds views of its own
with ``Stage.audit_views(columns)``: a new stage's view needs no change here or in the engine.
``datapipe.engine.finish`` writes the tables, ``create_table_views`` and the SQL of ``document_views``,
which ``datapipe.audit.documents`` creates on every connection, over the run's Parquet files.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datapipe.stages.base import Stage

# Registered by ``datapipe.audit.sql.connect`` on every connection that asks for the text: not in
# the database, but a view of that name would be hidden behind them.
_TEXT_VIEWS = ("kept_docs", "rejected_docs")


def create_table_views(con: Any) -> None:
    """The views over the database's own small tables: ``funnel`` and ``shards``."""
    # Every stage appears, also one that dropped nothing (reason NULL, dropped 0). docs_in counts the
    # documents reaching the stage, skipped those of them it passed untouched (kind not in its kinds);
    # drop_share is of the documents the stage judged (docs_in - skipped).
    con.execute("""CREATE VIEW funnel AS
        SELECT s.position, s.stage, s.docs_in, s.skipped, r.reason, coalesce(r.dropped, 0)::BIGINT AS dropped,
               s.docs_in - s.dropped AS docs_out,
               round(coalesce(r.dropped, 0) / nullif(s.docs_in - s.skipped, 0), 6) AS drop_share
        FROM stages s LEFT JOIN stage_reasons r USING (position)
        ORDER BY s.position, r.reason""")
    # fill: the share of token slots that are not padding (what best-fit packing costs).
    con.execute("""CREATE VIEW shards AS
        SELECT *, round(tokens / nullif(rows * row_len, 0), 6) AS fill FROM shard_files ORDER BY path""")


def document_views(con: Any, columns: set[str], stages: Iterable[type[Stage]] = ()) -> dict[str, str]:
    """The views on ``documents``, name -> SELECT, in creation order: mixture, contamination, then the
    stages' own (audit/documents.py creates them on every connection)."""
    return {
        "mixture": mixture_view_sql(),
        "contamination": contamination_view_sql(columns),
        **stage_views(con, columns, stages, taken={"documents", "mixture", "contamination"}),
    }


def stage_views(con: Any, columns: set[str], stages: Iterable[type[Stage]], taken: Iterable[str] = ()) -> dict[str, str]:
    """The views the stages declare, name -> SELECT. A name already in the database (a table, a view
    of every run) or taken by another stage type is a ValueError naming the stage: a view must never
    stand in for another one silently."""
    names = set(taken) | {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
    }
    names |= set(_TEXT_VIEWS)
    views: dict[str, str] = {}
    owner: dict[str, str] = {}
    for cls in dict.fromkeys(stages):  # a stage type used twice (classify) declares its views once
        for name, select in cls.audit_views(columns).items():
            if name in names or name in views:
                by = f"stage {owner[name]!r}" if name in owner else "the audit database"
                raise ValueError(f"stage {cls.name!r} declares the audit view {name!r}, a name {by} already has")
            views[name], owner[name] = select, cls.name
    return views


def contamination_view_sql(columns: set[str]) -> str:
    """``contamination``: documents holding benchmark n-grams, per benchmark and source.

    ``dropped`` were rejected as ``contaminated``; ``kept`` survived the run (flagged with
    ``action: flag``, or below the thresholds); ``items`` distinct benchmark items matched. The
    view exists in every run: empty without a ``decontaminate`` stage.
    """
    if "contam_hits" not in columns:
        return """SELECT NULL::VARCHAR AS benchmark, NULL::VARCHAR AS source, 0::BIGINT AS documents, 0::BIGINT AS dropped,
                   0::BIGINT AS kept, 0::BIGINT AS items, 0::BIGINT AS ngram_hits, NULL::FLOAT AS max_frac WHERE false"""
    return """SELECT contam_benchmark AS benchmark, source, count(*)::BIGINT AS documents,
               count(*) FILTER (WHERE reason = 'contaminated')::BIGINT AS dropped,
               count(*) FILTER (WHERE status = 'kept')::BIGINT AS kept,
               count(DISTINCT contam_item)::BIGINT AS items, sum(contam_hits)::BIGINT AS ngram_hits,
               round(max(contam_frac), 4) AS max_frac
        FROM documents WHERE contam_hits > 0 GROUP BY ALL ORDER BY documents DESC, benchmark, source"""


def mixture_view_sql() -> str:
    """``mixture``: kept documents and tokens by source x lang x script x license class, with shares.

    Read from the aggregate ``agg_documents`` (the map tasks' counts, ``audit/schema.py``), never from
    the documents: a few rows per task. ``script`` and ``license_class`` come from stages that a run
    may not have: a NULL or empty value is grouped as 'unknown', so the view exists in every run.
    ``rehydrated_tokens``: tokens weighted by the near-duplicate cluster each kept document survived
    (minhash's dup_count), what FineWeb-2 upsamples by; equal to tokens in a run without minhash.
    """
    names = ("source", "lang", "script", "license_class")
    keys = ", ".join(f"coalesce(nullif({k}, ''), 'unknown') AS {k}" for k in names)
    return f"""WITH g AS (
            SELECT {keys}, sum(documents)::BIGINT AS documents, sum(tokens)::BIGINT AS tokens,
                   sum(chars)::BIGINT AS chars, sum(rehydrated_tokens)::BIGINT AS rehydrated_tokens
            FROM agg_documents WHERE status = 'kept' GROUP BY ALL)
        SELECT *, round(tokens / nullif(sum(tokens) OVER (), 0), 6) AS token_share,
               round(documents / sum(documents) OVER (), 6) AS doc_share
        FROM g ORDER BY tokens DESC, documents DESC, source, lang, script, license_class"""
