"""What the classify stage adds to a run's audit: score histograms and bucket counts, and the report's
"Classifier scores" and "Classifier buckets" sections over them (``stages/report_section.py``).

Scores are counted in bins 0.01 wide (``score_bin = floor(score * 100)``), with each bin's least and
largest score: the report's ten buckets over 0-1 are exact sums of bins; over a regression score's own
range (one that leaves 0-1) a bin counts in the bucket its lower edge falls in; quartiles are read from
the bins, linearly inside one, so they are within 0.01 of the exact value.
"""

from __future__ import annotations

from datapipe.stages.report_section import Aggregate, ReportSection, literal, quoted

SCORE_BINS_PER_UNIT = 100
_KEYS = ("source", "lang", "kind", "status", "stage")


def _column(columns: set[str], name: str) -> str:
    return quoted(name) if name in columns else "NULL::VARCHAR"


def score_columns(columns: set[str]) -> list[str]:
    return sorted(c for c in columns if c.startswith("cls_"))


def bucket_columns(columns: set[str]) -> list[str]:
    return sorted(c for c in columns if c.startswith("bucket_"))


def aggregates(columns: set[str]) -> list[Aggregate]:
    keys = ", ".join(f"{_column(columns, k)} AS {k}" for k in _KEYS)
    scores = [
        f"""SELECT {literal(c)} AS score, {keys},
                   floor(TRY_CAST({quoted(c)} AS DOUBLE) * {SCORE_BINS_PER_UNIT})::BIGINT AS score_bin,
                   count(*)::BIGINT AS documents, min(TRY_CAST({quoted(c)} AS DOUBLE)) AS least,
                   max(TRY_CAST({quoted(c)} AS DOUBLE)) AS most
            FROM documents WHERE TRY_CAST({quoted(c)} AS DOUBLE) IS NOT NULL GROUP BY ALL"""
        for c in score_columns(columns)
    ]
    key_types = tuple((k, "VARCHAR") for k in _KEYS)
    score_table = Aggregate(
        "scores",
        " UNION ALL ".join(scores),
        (
            ("score", "VARCHAR"),
            *key_types,
            ("score_bin", "BIGINT"),
            ("documents", "BIGINT"),
            ("least", "DOUBLE"),
            ("most", "DOUBLE"),
        ),
        merge={"documents": "sum", "least": "min", "most": "max"},
        order="score, source, lang, kind, status, stage, score_bin",
    )
    tokens = quoted("n_tokens") if "n_tokens" in columns else "NULL::BIGINT"
    repeat = quoted("mixture_repeat") if "mixture_repeat" in columns else "1"
    buckets = [
        f"""SELECT {literal(c)} AS bucket_column, TRY_CAST({quoted(c)} AS BIGINT) AS bucket,
                   {_column(columns, "source")} AS source,
                   {_column(columns, "lang")} AS lang, {_column(columns, "status")} AS status, count(*)::BIGINT AS documents,
                   coalesce(sum({tokens}), 0)::BIGINT AS tokens,
                   coalesce(sum({tokens} * coalesce({repeat}, 1)), 0)::BIGINT AS repeated_tokens
            FROM documents GROUP BY ALL"""
        for c in bucket_columns(columns)
    ]
    bucket_table = Aggregate(
        "buckets",
        " UNION ALL ".join(buckets),
        (
            ("bucket_column", "VARCHAR"),
            ("bucket", "BIGINT"),
            ("source", "VARCHAR"),
            ("lang", "VARCHAR"),
            ("status", "VARCHAR"),
            ("documents", "BIGINT"),
            ("tokens", "BIGINT"),
            ("repeated_tokens", "BIGINT"),
        ),
        merge={"documents": "sum", "tokens": "sum", "repeated_tokens": "sum"},
        order="bucket_column, source, bucket, lang, status",
    )
    return [score_table, bucket_table]


def _histogram_sql(column: str) -> str:
    """Ten buckets over 0-1 (a probability), or over the score's own range where it leaves 0-1."""
    n = SCORE_BINS_PER_UNIT
    return f"""WITH s AS (SELECT * FROM agg_scores WHERE score = {literal(column)}),
        r AS (SELECT min(least) AS lo0, max(most) AS hi0 FROM s),
        w AS (SELECT CASE WHEN lo0 < 0 OR hi0 > 1 THEN lo0 ELSE 0.0 END AS lo,
                     CASE WHEN lo0 < 0 OR hi0 > 1 THEN hi0 ELSE 1.0 END AS hi FROM r),
        g AS (SELECT greatest(least(floor((s.score_bin - w.lo * {n}) * 10 / nullif((w.hi - w.lo) * {n}, 0)), 9), 0)::INTEGER AS k,
                     sum(documents) FILTER (status = 'kept') AS kept,
                     sum(documents) FILTER (status = 'rejected' AND stage = 'classify') AS by_classify,
                     sum(documents) FILTER (status = 'rejected' AND stage <> 'classify') AS later
              FROM s, w GROUP BY k)
        SELECT CASE WHEN w.lo = 0.0 AND w.hi = 1.0
                    THEN printf('%.1f-%.1f', w.lo + k.range * (w.hi - w.lo) / 10, w.lo + (k.range + 1) * (w.hi - w.lo) / 10)
                    ELSE printf('%.2f-%.2f', w.lo + k.range * (w.hi - w.lo) / 10, w.lo + (k.range + 1) * (w.hi - w.lo) / 10) END,
               coalesce(g.kept, 0)::BIGINT, coalesce(g.by_classify, 0)::BIGINT, coalesce(g.later, 0)::BIGINT
        FROM range(10) k, w LEFT JOIN g ON g.k = k.range
        WHERE (SELECT count(*) FROM s) > 0 ORDER BY k.range"""


def _quartiles_sql(column: str) -> str:
    """Per language and kind: documents, the quartiles read from the bins, and those classify dropped."""
    n = SCORE_BINS_PER_UNIT

    def quantile(p: float) -> str:
        at = f"({p} * total)"
        return f"round(arg_min((score_bin + ({at} - (upto - n)) / n) / {n}, score_bin) FILTER (upto >= {at}), 2)"

    return f"""WITH s AS (SELECT coalesce(lang, 'unknown') AS lang, kind, score_bin, sum(documents) AS n,
                      coalesce(sum(documents) FILTER (status = 'rejected' AND stage = 'classify'), 0) AS dropped
                  FROM agg_scores WHERE score = {literal(column)} GROUP BY ALL),
        c AS (SELECT *, sum(n) OVER (PARTITION BY lang, kind ORDER BY score_bin ROWS UNBOUNDED PRECEDING) AS upto,
                     sum(n) OVER (PARTITION BY lang, kind) AS total FROM s)
        SELECT lang, kind, any_value(total)::BIGINT AS documents, {quantile(0.25)}, {quantile(0.5)}, {quantile(0.75)},
               sum(dropped)::BIGINT FROM c GROUP BY lang, kind ORDER BY documents DESC, lang, kind LIMIT 30"""


def _buckets_sql(column: str) -> str:
    """Documents per bucket and language (the 12 languages with most documents), and how many were kept."""
    rows = f"agg_buckets WHERE bucket_column = {literal(column)} AND bucket IS NOT NULL"
    return f"""WITH a AS (SELECT bucket, coalesce(lang, 'unknown') AS lang, documents, status FROM {rows}),
        p AS (PIVOT (SELECT bucket, lang, documents FROM a
                     WHERE lang IN (SELECT lang FROM a GROUP BY lang ORDER BY sum(documents) DESC, lang LIMIT 12))
              ON lang USING sum(documents)::BIGINT GROUP BY bucket),
        t AS (SELECT bucket, sum(documents)::BIGINT AS documents,
                     coalesce(sum(documents) FILTER (status = 'kept'), 0)::BIGINT AS kept FROM a GROUP BY bucket)
        SELECT p.*, t.documents, t.kept FROM p JOIN t USING (bucket) ORDER BY bucket"""


def report_sections(columns: set[str]) -> list[ReportSection]:
    out: list[ReportSection] = []
    scores = score_columns(columns)
    if scores:
        out.append(
            ReportSection(
                "Classifier scores",
                "",
                note="Counted in bins 0.01 wide: the quartiles are read from them (within 0.01).",
            )
        )
    for c in scores:
        out.append(
            ReportSection(
                f"`{c}`",
                _histogram_sql(c),
                kind="bars",
                columns=("score", "kept", "dropped by classify", "dropped later"),
                heading=3,
            )
        )
        out.append(
            ReportSection(
                "",
                _quartiles_sql(c),
                columns=("lang", "kind", "documents", "p25", "median", "p75", "dropped by classify"),
            )
        )
    buckets = bucket_columns(columns)
    if buckets:
        out.append(ReportSection("Classifier buckets", ""))
    out += [ReportSection(f"`{c}`", _buckets_sql(c), heading=3) for c in buckets]
    return out
