"""``datapipe report RUN --html FILE``: one self-contained HTML page about a run.

Every number comes from ``stats.duckdb``'s small tables and the run's aggregates (``agg_`` tables,
``audit/aggregates.py``), never from the documents themselves: a run of billions of documents reports
in the time a small one does. The funnel, mixture, lengths and languages are every run's; a stage adds
its own sections as data (``Stage.report_sections``: a heading and SQL over the aggregates), drawn
here by ``render_section``. A run folder written before the tasks wrote aggregates is reported from a
full scan, and the command says so.

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

from datapipe.audit import aggregates
from datapipe.audit.annotations import HEADER as ANNOTATION_HEADER
from datapipe.audit.annotations import annotation_totals
from datapipe.audit.annotations import rows as annotation_rows
from datapipe.audit.documents import column_names, text_beginnings
from datapipe.audit.mixture import bucket_rows, configured_sources
from datapipe.audit.schema import LENGTH_BINS_PER_DECADE
from datapipe.audit.sql import read_run_json, reading
from datapipe.config.mixture import mixture_weights
from datapipe.errors import DatapipeError
from datapipe.stages.report_section import ReportSection
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


def _title(section: ReportSection) -> str:
    """The heading's text, with `code` spans."""
    parts = html.escape(section.title).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def render_section(con: Any, section: ReportSection, run_dir: Path) -> list[str]:
    """A section's HTML: its heading, note, chart and table; nothing when its query has no row."""
    rows: list[tuple[Any, ...]] = []
    header = list(section.columns)
    if section.sql:
        cursor = con.execute(section.sql)
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
        if not rows:
            return []
        header = header or names
    out = [f"<h{section.heading}>{_title(section)}</h{section.heading}>"] if section.title else []
    if section.note:
        out.append(f"<p>{html.escape(section.note)}</p>")
    if not section.sql:
        return out
    if section.kind == "bars":
        series = [Series(name, COLORS[i % len(COLORS)]) for i, name in enumerate(header[1:])]
        out.append(hbar_chart([(str(r[0]), [float(v or 0) for v in r[1:]]) for r in rows], series))
    if section.texts:
        header, rows = _with_texts(con, run_dir, header, rows, section.texts)
    out.append(table(header, rows))
    return out


def _with_texts(
    con: Any, run_dir: Path, header: list[str], rows: list[tuple[Any, ...]], columns: tuple[str, ...]
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Each id column named in ``columns`` followed by the beginning of its document's text, read from
    the few files whose id range holds the ids (``documents.text_beginnings``)."""
    at = [header.index(c) for c in columns if c in header]
    texts = text_beginnings(con, run_dir, [r[i] for r in rows for i in at if r[i] is not None])
    new_header: list[str] = []
    for i, name in enumerate(header):
        new_header += [name, "its text"] if i in at else [name]
    new_rows = [
        tuple(v for i, value in enumerate(r) for v in ((value, texts.get(value, "")) if i in at else (value,))) for r in rows
    ]
    return new_header, new_rows


def _log_hist(con: Any, measure: str) -> tuple[list[tuple[float, float]], list[float]]:
    """Kept documents' lengths on log-spaced bins (lengths span 5 orders of magnitude), from ``agg_lengths``."""
    per = LENGTH_BINS_PER_DECADE
    rows = con.execute(
        "SELECT bin, sum(documents) FROM agg_lengths WHERE status = 'kept' AND measure = ? GROUP BY bin ORDER BY bin", [measure]
    ).fetchall()
    if not rows:
        return [], []
    counts = dict(rows)
    lo, hi = rows[0][0], rows[-1][0]
    bins: list[tuple[float, float]] = [(round(10 ** (b / per)), round(10 ** ((b + 1) / per))) for b in range(lo, hi + 1)]
    return bins, [float(counts.get(b, 0)) for b in range(lo, hi + 1)]


def _numbers(con: Any, run: dict[str, Any]) -> dict[str, Any]:
    """The page's figures, from the run's small tables and the aggregates (no document is read)."""
    return {
        "cards": con.execute(
            "SELECT coalesce(sum(documents), 0)::BIGINT, coalesce(sum(documents) FILTER (status = 'kept'), 0)::BIGINT, "
            "coalesce(sum(documents) FILTER (status = 'rejected'), 0)::BIGINT, "
            "coalesce(sum(tokens) FILTER (status = 'kept'), 0)::BIGINT FROM agg_documents"
        ).fetchall()[0],
        "stages": con.execute(
            "SELECT position, stage, docs_in, docs_in - dropped, dropped FROM stages ORDER BY position"
        ).fetchall(),
        "funnel": con.execute(
            "SELECT position, stage, reason, dropped, drop_share FROM funnel WHERE dropped > 0 ORDER BY position, dropped DESC"
        ).fetchall(),
        "mixture": con.execute(
            "SELECT source, lang, script, license_class, documents, tokens, token_share FROM mixture"
        ).fetchall(),
        "langs": con.execute(
            "SELECT coalesce(lang, 'unknown') AS l, coalesce(sum(documents) FILTER (status = 'kept'), 0)::BIGINT, "
            "coalesce(sum(documents) FILTER (status = 'rejected'), 0)::BIGINT FROM agg_documents GROUP BY l "
            "ORDER BY sum(documents) DESC, l LIMIT 25"
        ).fetchall(),
        "shards": con.execute(
            "SELECT source, split, count(*), sum(rows), sum(tokens), "
            "round(sum(tokens) / nullif(sum(rows * row_len), 0), 4) FROM shards "
            "GROUP BY ALL ORDER BY source, split"
        ).fetchall(),
        "repeats": bucket_rows(con, run),
        "chars": _log_hist(con, "chars"),
        "tokens": _log_hist(con, "tokens"),
        "annotations": annotation_totals(con, run),
    }


def build_report(run_dir: Path, warn: Any = None) -> str:
    """The page, from ``stats.duckdb``'s small tables and aggregates: the funnel, the mixture, lengths and
    languages, then each stage's own sections (``Stage.report_sections``), annotation and shards."""
    run = read_run_json(Path(run_dir))
    with reading(Path(run_dir), aggregates_only=True) as con:
        aggregates.ensure_tables(con, run, warn)
        n = _numbers(con, run)
        columns = column_names(con)
        staged = [
            part
            for cls in dict.fromkeys(aggregates.stage_types(run))
            for section in cls.report_sections(columns)
            for part in render_section(con, section, Path(run_dir))
        ]
    name = html.escape(str(run.get("name", Path(run_dir).name)))
    sections = [
        f"<h1>datapipe run <code>{name}</code></h1>",
        f"<p class='meta'>fingerprint {html.escape(str(run.get('fingerprint', '')))} &middot; status "
        f"{html.escape(str(run.get('status', '')))} &middot; finished {html.escape(str(run.get('finished', '')))}</p>",
        "<div class='cards'>"
        + "".join(
            f"<div><b>{v:,}</b><span>{k}</span></div>"
            for k, v in zip(("documents in", "kept", "rejected", "kept tokens"), n["cards"])
        )
        + "</div>",
        *_funnel(n),
        *_mixture(n, run),
        "<h2>Document lengths (kept)</h2>",
        histogram(n["chars"][0], n["chars"][1], "characters per document (log bins)", COLORS[0]) if n["chars"][0] else "",
        histogram(n["tokens"][0], n["tokens"][1], "tokens per document (log bins)", COLORS[2]) if n["tokens"][0] else "",
        table(["characters from", "to", "documents"], [(lo, hi, int(c)) for (lo, hi), c in zip(*n["chars"])]),
        "<h2>Languages</h2>",
        hbar_chart(
            [(lang, [float(k), float(r)]) for lang, k, r in n["langs"]],
            [Series("kept", COLORS[0]), Series("rejected", COLORS[1])],
        ),
        table(["lang", "kept", "rejected"], n["langs"]),
        *staged,
        *(
            ["<h2>LLM annotation</h2>", table(list(ANNOTATION_HEADER), annotation_rows(n["annotations"]))]
            if n["annotations"]
            else []
        ),
        "<h2>Shards</h2>",
        table(["source", "split", "shards", "rows", "tokens", "fill"], n["shards"]) if n["shards"] else "<p>No shards.</p>",
    ]
    return PAGE.format(title=f"datapipe report: {name}", body="\n".join(sections))


def _funnel(n: dict[str, Any]) -> list[str]:
    return [
        "<h2>Funnel</h2>",
        hbar_chart(
            [(f"{p} {s}", [float(k), float(d)]) for p, s, _, k, d in n["stages"]],
            [Series("kept by the stage", COLORS[0]), Series("dropped", COLORS[1])],
        ),
        table(["#", "stage", "in", "out", "dropped"], n["stages"]),
        table(["#", "stage", "reason", "dropped", "share of stage input"], n["funnel"]) if n["funnel"] else "",
    ]


def _mixture(n: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """Kept tokens per source against the target weights, and per source x lang x script x license class."""
    mixture = n["mixture"]
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
    out = [
        "<h2>Mixture</h2>",
        hbar_chart(mix_rows, [Series(s, color_of[s]) for s in sources]) if mix_rows else "<p>No kept documents.</p>",
        table(["source", "kept tokens", "share", "target weight"], source_rows),
        table(["source", "lang", "script", "license class", "documents", "tokens", "token share"], mixture),
    ]
    if n["repeats"]:
        out += [
            "<h3>Repeats by classifier bucket (mixture repeat)</h3>",
            table(
                ["source", "bucket column", "bucket", "kept documents", "tokens before", "repeat", "tokens after"],
                n["repeats"],
            ),
        ]
    return out


class ReportError(DatapipeError):
    """The HTML page cannot be written (a folder that cannot be made, no permission, a full disk)."""


def write_report(run_dir: Path, out: Path, warn: Any = None) -> Path:
    page = build_report(run_dir, warn)
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
