"""What the langid stage adds to a run's audit: its confidence (``lang_score``) in bins, for the
distribution ``datapipe view`` draws with the stage's ``min_score`` on it (``stages/report_section.py``).

Its own module, as classify's bins are in ``stages/classify/report.py``: the viewer reads the bin width
from here.
"""

from __future__ import annotations

from datapipe.stages.report_section import Aggregate, column

# Bins this wide: score_bin = floor(lang_score * 100), as classify's scores.
LANG_SCORE_BINS = 100


def lang_score_aggregate(columns: set[str]) -> Aggregate:
    """``agg_lang_scores``: documents per status and ``lang_score`` bin 0.01 wide (the distribution
    ``datapipe view`` draws with ``min_score`` on it); documents without a score (rejected before the
    stage, or not judged: code) are not counted."""
    score = column(columns, "lang_score", "DOUBLE")
    return Aggregate(
        "lang_scores",
        f"""SELECT {column(columns, "status")} AS status, floor({score} * {LANG_SCORE_BINS})::BIGINT AS score_bin,
                   count(*)::BIGINT AS documents
            FROM documents WHERE {score} IS NOT NULL GROUP BY ALL""",
        (("status", "VARCHAR"), ("score_bin", "BIGINT"), ("documents", "BIGINT")),
        merge={"documents": "sum"},
        order="status, score_bin",
    )
