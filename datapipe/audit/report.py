"""``datapipe report RUN --html FILE``: one self-contained HTML page about a run.

Charts are inline SVG written here (no JavaScript, no CDN, no fonts to fetch), so the page
opens offline and can be mailed or archived as one file. Every chart has its numbers in
a table next to it.
"""

from __future__ import annotations

import html
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datapipe.audit.annotations import HEADER as ANNOTATION_HEADER
from datapipe.audit.annotations import annotation_totals
from datapipe.audit.annotations import rows as annotation_rows
from datapipe.audit.mixture import bucket_rows, configured_sources
from datapipe.audit.sql import read_run_json, reading
from datapipe.config.mixture import mixture_weights
from datapipe.errors import DatapipeError
from datapipe.storage.atomic import atomic_path

COLORS = ["#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]
BAR_H, LABEL_W, CHART_W = 22, 190, 520  # LABEL_W: the least room for labels; longer labels get more
FONT_PX = 12


@dataclass(frozen=True)
class Series:
    name: str
    color: str


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.3g}"


def text_width(text: str, font_px: int = FONT_PX) -> float:
    """A generous estimate of a label's width in sans-serif: wide (CJK) characters count one em.

    No fonts are measured (the page is static), so the estimate errs on the wide side: a
    label must never be cut off at the left edge of the chart.
    """
    return sum(font_px if unicodedata.east_asian_width(ch) in "WF" else 0.62 * font_px for ch in text)


def hbar_chart(rows: list[tuple[str, list[float]]], series: list[Series]) -> str:
    """Horizontal stacked bars, one row per label; the label column is as wide as the longest label."""
    top = max((sum(v) for _, v in rows), default=0) or 1
    height = BAR_H * len(rows) + 30
    label_w = max([float(LABEL_W)] + [text_width(label) + 12 for label, _ in rows])
    out = [
        f'<svg width="{label_w + CHART_W + 90:.0f}" height="{height}" role="img" font-family="sans-serif" font-size="{FONT_PX}">'
    ]
    for i, (label, values) in enumerate(rows):
        y = i * BAR_H + 4
        out.append(f'<text x="{label_w - 6:.1f}" y="{y + 14}" text-anchor="end">{html.escape(label)}</text>')
        x = label_w
        for v, s in zip(values, series):
            w = CHART_W * v / top
            if w > 0:
                out.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{BAR_H - 6}" '
                    f'fill="{s.color}"><title>{html.escape(label)} {html.escape(s.name)}: {_fmt(v)}</title>'
                    f"</rect>"
                )
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 14}">{_fmt(sum(values))}</text>')
    out.append(_legend(series, height - 12, label_w))
    return "".join(out) + "</svg>"


def histogram(bins: list[tuple[float, float]], counts: list[float], x_label: str, color: str) -> str:
    """Vertical bars over [lo, hi) bins (log-spaced bins are labelled by their lower edge)."""
    w, h, pad = 640, 200, 40
    top = max(counts, default=0) or 1
    bw = (w - pad) / max(len(counts), 1)
    out = [
        f'<svg width="{w}" height="{h + 50}" role="img" font-family="sans-serif" font-size="11">',
        f'<line x1="{pad}" y1="{h}" x2="{w}" y2="{h}" stroke="#888"/>',
        f'<text x="{pad}" y="12">max {_fmt(top)}</text>',
    ]
    for i, ((lo, hi), c) in enumerate(zip(bins, counts)):
        bh = (h - 20) * c / top
        x = pad + i * bw
        out.append(
            f'<rect x="{x + 1:.1f}" y="{h - bh:.1f}" width="{max(bw - 2, 1):.1f}" height="{bh:.1f}" '
            f'fill="{color}"><title>{_fmt(lo)} to {_fmt(hi)}: {_fmt(c)}</title></rect>'
        )
        if i % max(1, len(bins) // 8) == 0:
            out.append(f'<text x="{x:.1f}" y="{h + 14}">{_fmt(lo)}</text>')
    out.append(f'<text x="{w / 2:.0f}" y="{h + 34}" text-anchor="middle">{html.escape(x_label)}</text>')
    return "".join(out) + "</svg>"


def _legend(series: list[Series], y: int, x0: float = LABEL_W) -> str:
    parts, x = [], x0
    for s in series:
        parts.append(
            f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{s.color}"/>'
            f'<text x="{x + 14}" y="{y}">{html.escape(s.name)}</text>'
        )
        x += 20 + text_width(s.name) + 10
    return "".join(parts)


def table(header: list[str], rows: list[tuple[Any, ...]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f'<td class="n">{v:.4f}</td>' if abs(v) < 1 else f'<td class="n">{_fmt(v)}</td>'
        if isinstance(v, int):
            return f'<td class="n">{v:,}</td>'
        return f"<td>{html.escape('' if v is None else str(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _log_hist(con: Any, column: str, per_decade: int = 4) -> tuple[list[tuple[float, float]], list[float]]:
    """Histogram of a positive count column on log-spaced bins (lengths span 5 orders of magnitude)."""
    rows = con.execute(
        f"SELECT floor(log10(greatest({column}, 1)) * {per_decade})::INT AS b, count(*) "
        f"FROM documents WHERE status = 'kept' AND {column} IS NOT NULL GROUP BY b ORDER BY b"
    ).fetchall()
    if not rows:
        return [], []
    counts = dict(rows)
    lo, hi = rows[0][0], rows[-1][0]
    bins: list[tuple[float, float]] = [
        (round(10 ** (b / per_decade)), round(10 ** ((b + 1) / per_decade))) for b in range(lo, hi + 1)
    ]
    return bins, [float(counts.get(b, 0)) for b in range(lo, hi + 1)]


def _contamination(con: Any) -> list[tuple[Any, ...]]:
    """Rows of the ``contamination`` view; none for a run without it (built before the view existed)."""
    if not con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'contamination'").fetchone()[0]:
        return []
    return con.execute(
        "SELECT benchmark, source, documents, dropped, kept, items, ngram_hits, max_frac FROM contamination"
    ).fetchall()


def _classifier_sections(con: Any) -> list[str]:
    """Per classifier score column (``cls_<model>_<label>``): its distribution in ten buckets, kept and
    rejected, and its quartiles per language and kind; nothing when the run has no classify stage."""
    columns = [r[0] for r in con.execute("DESCRIBE documents").fetchall() if str(r[0]).startswith("cls_")]
    if not columns:
        return []
    out = ["<h2>Classifier scores</h2>"]
    for col in columns:
        q = f'"{col}"'
        # ten buckets over 0-1 (a probability), or over the column's range where it leaves 0-1 (a
        # transformers regression score, which may be negative or above 1)
        least, most = con.execute(f"SELECT min({q}), max({q}) FROM documents").fetchone() or (None, None)
        lo, hi = 0.0, 1.0
        if least is not None and most is not None and (least < 0.0 or most > 1.0):
            lo, hi = float(least), float(most)
        width = (hi - lo) / 10 or 1.0
        rows = con.execute(
            f"SELECT least(floor(({q} - ?) / ?), 9)::INT AS b, count(*) FILTER (status = 'kept'), "
            f"count(*) FILTER (status = 'rejected' AND stage = 'classify'), "
            f"count(*) FILTER (status = 'rejected' AND stage <> 'classify') "
            f"FROM documents WHERE {q} IS NOT NULL GROUP BY b ORDER BY b",
            [lo, width],
        ).fetchall()
        by_bucket = {b: (k, c, o) for b, k, c, o in rows}
        digits = 1 if (lo, hi) == (0.0, 1.0) else 2
        hist = [
            (f"{lo + b * width:.{digits}f}-{lo + (b + 1) * width:.{digits}f}", [float(v) for v in by_bucket.get(b, (0, 0, 0))])
            for b in range(10)
        ]
        groups = con.execute(
            f"SELECT coalesce(lang, 'unknown'), kind, count(*), "
            f"round(quantile_cont({q}, 0.25), 4), round(median({q}), 4), round(quantile_cont({q}, 0.75), 4), "
            f"count(*) FILTER (status = 'rejected' AND stage = 'classify') "
            f"FROM documents WHERE {q} IS NOT NULL GROUP BY ALL ORDER BY 3 DESC LIMIT 30"
        ).fetchall()
        out += [
            f"<h3><code>{html.escape(col)}</code></h3>",
            hbar_chart(
                hist, [Series("kept", COLORS[0]), Series("dropped by classify", COLORS[1]), Series("dropped later", COLORS[5])]
            ),
            table(
                ["score", "kept", "dropped by classify", "dropped later"],
                [(label, *(int(v) for v in vals)) for label, vals in hist],
            ),
            table(["lang", "kind", "documents", "p25", "median", "p75", "dropped by classify"], groups),
        ]
    return out


def _bucket_sections(con: Any) -> list[str]:
    """Per classifier bucket column (``bucket_<model>``, ``bucket_<ensemble>``): documents per bucket
    and language (the languages with most documents), and how many of each bucket were kept."""
    columns = [
        r[0]
        for r in con.execute("DESCRIBE documents").fetchall()
        if str(r[0]).startswith("bucket_") and str(r[1]) in ("SMALLINT", "INTEGER", "BIGINT", "TINYINT")
    ]
    if not columns:
        return []
    out = ["<h2>Classifier buckets</h2>"]
    for col in columns:
        q = f'"{col}"'
        counts = con.execute(
            f"SELECT {q}, coalesce(lang, 'unknown'), count(*), count(*) FILTER (status = 'kept') "
            f"FROM documents WHERE {q} IS NOT NULL GROUP BY ALL"
        ).fetchall()
        by_lang: dict[str, int] = {}
        for _, lang, n, _ in counts:
            by_lang[lang] = by_lang.get(lang, 0) + n
        langs = sorted(by_lang, key=lambda x: (-by_lang[x], x))[:12]
        cells: dict[tuple[int, str], int] = {(b, lang): n for b, lang, n, _ in counts}
        kept: dict[int, int] = {}
        for b, _, _, k in counts:
            kept[b] = kept.get(b, 0) + k
        rows = [
            (b, *(cells.get((b, lang), 0) for lang in langs), sum(n for (bb, _), n in cells.items() if bb == b), kept[b])
            for b in sorted(kept)
        ]
        out += [f"<h3><code>{html.escape(col)}</code></h3>", table(["bucket", *langs, "documents", "kept"], rows)]
    return out


def _boilerplate(con: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Per source: lines and characters the boilerplate stage removed; the lines removed most often."""
    columns = {r[0] for r in con.execute("DESCRIBE documents").fetchall()}
    if "lines_removed" not in columns:
        return [], []
    # n_chars is the length after removal, except on a boilerplate_only reject, which kept what came in.
    per_source = con.execute("""
        SELECT source, count(*) FILTER (lines_removed IS NOT NULL), count(*) FILTER (lines_removed > 0),
               coalesce(sum(lines_removed), 0), coalesce(sum(chars_removed), 0),
               round(coalesce(sum(chars_removed), 0) / nullif(sum(n_chars + CASE WHEN reason = 'boilerplate_only'
                     THEN 0 ELSE coalesce(chars_removed, 0) END) FILTER (lines_removed IS NOT NULL), 0), 4),
               count(*) FILTER (reason = 'boilerplate_only')
        FROM documents GROUP BY source ORDER BY source""").fetchall()
    top = con.execute("""SELECT trim(line), count(*) AS n FROM (SELECT unnest(removed_lines) AS line FROM documents)
                         GROUP BY 1 ORDER BY n DESC, 1 LIMIT 15""").fetchall()
    return [r for r in per_source if r[1]], top


def _substrings(con: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Per source and language: spans and characters the substrings stage removed; the spans removed
    from the most documents."""
    columns = {r[0] for r in con.execute("DESCRIBE documents").fetchall()}
    if "substr_chars_removed" not in columns:
        return [], []
    lang = "coalesce(lang, 'unknown')" if "lang" in columns else "'unknown'"
    # n_chars is the length after removal, except on a substring_only reject, which kept what came in.
    per_source = con.execute(f"""
        SELECT source, {lang} AS l, count(*) FILTER (substr_chars_removed IS NOT NULL),
               count(*) FILTER (substr_spans_removed > 0),
               coalesce(sum(substr_spans_removed), 0), coalesce(sum(substr_chars_removed), 0),
               round(coalesce(sum(substr_chars_removed), 0) / nullif(sum(n_chars + CASE WHEN reason = 'substring_only'
                     THEN 0 ELSE coalesce(substr_chars_removed, 0) END) FILTER (substr_chars_removed IS NOT NULL), 0), 4),
               count(*) FILTER (reason = 'substring_only')
        FROM documents GROUP BY source, l ORDER BY source, l""").fetchall()
    top = con.execute("""SELECT left(trim(span), 100), count(*) AS n
                         FROM (SELECT unnest(substr_removed) AS span FROM documents)
                         GROUP BY 1 ORDER BY n DESC, 1 LIMIT 15""").fetchall()
    return [r for r in per_source if r[2]], top


def _rehydration(con: Any) -> list[tuple[Any, ...]]:
    """Per source: kept tokens and tokens weighted by minhash's cluster sizes (``dup_count``, what
    FineWeb-2 upsamples by); nothing for a run without the column."""
    if "dup_count" not in {r[0] for r in con.execute("DESCRIBE documents").fetchall()}:
        return []
    return con.execute("""
        SELECT source, count(*), count(*) FILTER (dup_count > 1), max(dup_count),
               coalesce(sum(n_tokens), 0)::BIGINT, coalesce(sum(n_tokens * coalesce(dup_count, 1)), 0)::BIGINT
        FROM documents WHERE status = 'kept' GROUP BY source ORDER BY source""").fetchall()


def _semantic(con: Any, limit: int = 10) -> list[tuple[Any, ...]]:
    """The kept documents with the most semantic near-duplicates dropped for them (``semantic`` stage):
    the kept one, the group's size, the most and least similar dropped copy; nothing for a run without
    such drops."""
    if "semantic_similarity" not in {r[0] for r in con.execute("DESCRIBE documents").fetchall()}:
        return []
    return con.execute(
        """SELECT dup_of, count(*) + 1 AS size, max(semantic_similarity), min(semantic_similarity),
                  arg_min(id, semantic_similarity) FROM documents WHERE reason = 'near_semantic'
           GROUP BY dup_of ORDER BY size DESC, dup_of LIMIT $n""",
        {"n": limit},
    ).fetchall()


def _with_texts(run_dir: Path, top: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The groups with the beginnings of the kept document's and the least similar copy's texts:
    an example pair to judge the threshold by eye (a connection of its own: it reads the text files)."""
    if not top:
        return []
    ids = [i for row in top for i in (row[0], row[4])]
    with reading(run_dir, text_views=("kept_docs", "rejected_docs")) as con:
        texts = dict(
            con.execute(
                "SELECT id, left(text, 160) FROM (SELECT id, text FROM kept_docs UNION ALL SELECT id, text FROM rejected_docs) "
                "WHERE id IN (SELECT unnest($ids))",
                {"ids": ids},
            ).fetchall()
        )
    return [
        (surv, size, round(hi, 4), round(lo, 4), texts.get(surv, ""), low_id, texts.get(low_id, ""))
        for surv, size, hi, lo, low_id in top
    ]


def build_report(run_dir: Path) -> str:
    run = read_run_json(Path(run_dir))
    with reading(Path(run_dir)) as con:
        total, kept, rejected, tokens = con.execute(
            "SELECT count(*), count(*) FILTER (status = 'kept'), count(*) FILTER (status = 'rejected'), "
            "coalesce(sum(n_tokens) FILTER (status = 'kept'), 0) FROM documents"
        ).fetchone()
        stages = con.execute(
            "SELECT position, stage, docs_in, docs_in - dropped, dropped FROM stages ORDER BY position"
        ).fetchall()
        funnel = con.execute(
            "SELECT position, stage, reason, dropped, drop_share FROM funnel WHERE dropped > 0 ORDER BY position, dropped DESC"
        ).fetchall()
        mixture = con.execute(
            "SELECT source, lang, script, license_class, documents, tokens, token_share FROM mixture"
        ).fetchall()
        langs = con.execute(
            "SELECT coalesce(lang, 'unknown') AS l, count(*) FILTER (status = 'kept'), "
            "count(*) FILTER (status = 'rejected') FROM documents GROUP BY l "
            "ORDER BY count(*) DESC LIMIT 25"
        ).fetchall()
        shards = con.execute(
            "SELECT source, split, count(*), sum(rows), sum(tokens), "
            "round(sum(tokens) / nullif(sum(rows * row_len), 0), 4) FROM shards "
            "GROUP BY ALL ORDER BY source, split"
        ).fetchall()
        contamination = _contamination(con)
        boilerplate, top_lines = _boilerplate(con)
        substrings, top_spans = _substrings(con)
        rehydration = _rehydration(con)
        repeats = bucket_rows(con, run)
        semantic_top = _semantic(con)
        chars_hist = _log_hist(con, "n_chars")
        tokens_hist = _log_hist(con, "n_tokens")
        classifier = _classifier_sections(con)
        annotations = annotation_totals(con, run)
        classifier += _bucket_sections(con)
    semantic = _with_texts(Path(run_dir), semantic_top)
    weights = mixture_weights((run.get("config") or {}).get("mixture"))
    # Every source of the pipeline and of the weights has a row, also one that kept nothing.
    by_source: dict[str, float] = dict.fromkeys([*configured_sources(run), *weights], 0)
    for source, *_, t, _ in mixture:
        by_source[source] = by_source.get(source, 0) + t
    mix_total = sum(by_source.values()) or 1
    wsum = sum(weights.values()) or 1
    source_rows = [
        (s, t, t / mix_total, (weights.get(s, 0) / wsum) if weights else None)
        for s, t in sorted(by_source.items(), key=lambda kv: -kv[1])
    ]
    sources = sorted(by_source)
    color_of = {s: COLORS[i % len(COLORS)] for i, s in enumerate(sources)}
    mix_rows = [
        (f"{s} / {lang} / {script} / {lic}", [float(t) if src == s else 0.0 for src in sources])
        for s, lang, script, lic, _, t, _ in mixture
    ]

    name = html.escape(str(run.get("name", Path(run_dir).name)))
    sections = [
        f"<h1>datapipe run <code>{name}</code></h1>",
        f"<p class='meta'>fingerprint {html.escape(str(run.get('fingerprint', '')))} &middot; status "
        f"{html.escape(str(run.get('status', '')))} &middot; finished {html.escape(str(run.get('finished', '')))}</p>",
        "<div class='cards'>"
        + "".join(
            f"<div><b>{v:,}</b><span>{k}</span></div>"
            for k, v in (("documents in", total), ("kept", kept), ("rejected", rejected), ("kept tokens", tokens))
        )
        + "</div>",
        "<h2>Funnel</h2>",
        hbar_chart(
            [(f"{p} {s}", [float(k), float(d)]) for p, s, _, k, d in stages],
            [Series("kept by the stage", COLORS[0]), Series("dropped", COLORS[1])],
        ),
        table(["#", "stage", "in", "out", "dropped"], stages),
        table(["#", "stage", "reason", "dropped", "share of stage input"], funnel) if funnel else "",
        "<h2>Mixture</h2>",
        hbar_chart(mix_rows, [Series(s, color_of[s]) for s in sources]) if mix_rows else "<p>No kept documents.</p>",
        table(["source", "kept tokens", "share", "target weight"], source_rows),
        table(["source", "lang", "script", "license class", "documents", "tokens", "token share"], mixture),
        *(
            [
                "<h3>Rehydration weights (near-duplicate cluster sizes)</h3>",
                table(
                    ["source", "kept documents", "that stand for a cluster", "largest cluster", "tokens", "rehydrated tokens"],
                    rehydration,
                ),
            ]
            if rehydration
            else []
        ),
        *(
            [
                "<h3>Repeats by classifier bucket (mixture repeat)</h3>",
                table(
                    ["source", "bucket column", "bucket", "kept documents", "tokens before", "repeat", "tokens after"],
                    repeats,
                ),
            ]
            if repeats
            else []
        ),
        *(
            [
                "<h2>Benchmark contamination</h2>",
                table(
                    ["benchmark", "source", "documents", "dropped", "kept", "items", "n-gram hits", "max share"], contamination
                ),
            ]
            if contamination
            else []
        ),
        *(
            [
                "<h2>Semantic near-duplicates</h2>",
                "<p>The kept documents the <code>semantic</code> stage dropped the most copies for, each with its "
                "least similar dropped copy: the pair to read to judge the threshold.</p>",
                table(
                    [
                        "kept (survivor)",
                        "documents",
                        "max cosine",
                        "min cosine",
                        "survivor text",
                        "least similar dropped",
                        "its text",
                    ],
                    semantic,
                ),
            ]
            if semantic
            else []
        ),
        *(
            [
                "<h2>Boilerplate removed</h2>",
                table(
                    [
                        "source",
                        "documents",
                        "that lost lines",
                        "lines removed",
                        "characters removed",
                        "share of characters",
                        "dropped as boilerplate only",
                    ],
                    boilerplate,
                ),
                table(["most removed line (first 100 characters)", "documents"], top_lines),
            ]
            if boilerplate
            else []
        ),
        *(
            [
                "<h2>Repeated spans removed</h2>",
                table(
                    [
                        "source",
                        "lang",
                        "documents",
                        "that lost spans",
                        "spans removed",
                        "characters removed",
                        "share of characters",
                        "dropped as substring only",
                    ],
                    substrings,
                ),
                table(["most removed span (first 100 characters)", "documents"], top_spans),
            ]
            if substrings
            else []
        ),
        "<h2>Document lengths (kept)</h2>",
        histogram(*chars_hist, "characters per document (log bins)", COLORS[0]) if chars_hist[0] else "",
        histogram(*tokens_hist, "tokens per document (log bins)", COLORS[2]) if tokens_hist[0] else "",
        table(["characters from", "to", "documents"], [(lo, hi, int(c)) for (lo, hi), c in zip(*chars_hist)]),
        "<h2>Languages</h2>",
        hbar_chart(
            [(lang, [float(k), float(r)]) for lang, k, r in langs], [Series("kept", COLORS[0]), Series("rejected", COLORS[1])]
        ),
        table(["lang", "kept", "rejected"], langs),
        *classifier,
        *(["<h2>LLM annotation</h2>", table(list(ANNOTATION_HEADER), annotation_rows(annotations))] if annotations else []),
        "<h2>Shards</h2>",
        table(["source", "split", "shards", "rows", "tokens", "fill"], shards) if shards else "<p>No shards.</p>",
    ]
    return PAGE.format(title=f"datapipe report: {name}", body="\n".join(sections))


class ReportError(DatapipeError):
    """The HTML page cannot be written (a folder that cannot be made, no permission, a full disk)."""


def write_report(run_dir: Path, out: Path) -> Path:
    page = build_report(run_dir)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            Path(tmp).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write {out}: {exc.strerror or exc}") from exc
    return out


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }}
h2 {{ border-bottom: 1px solid #ccc; margin-top: 2em; }}
table {{ border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }}
td, th {{ border: 1px solid #ddd; padding: 3px 8px; }} th {{ background: #f4f4f4; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
.cards {{ display: flex; gap: 1em; }} .cards div {{ border: 1px solid #ddd; padding: 0.6em 1em; border-radius: 6px; }}
.cards b {{ display: block; font-size: 1.4em; }} .cards span {{ color: #666; font-size: 0.9em; }}
.meta {{ color: #666; font-size: 0.9em; }}
</style></head>
<body>
{body}
</body></html>
"""
