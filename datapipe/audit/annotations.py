"""What a run's ``annotate`` stages asked and what it cost: totals for ``datapipe stats`` and the report.

Read from the aggregate ``agg_annotations`` (the map tasks' counts of the stage's columns, which
every document carries from the point it passed the stage: ``Annotate.aggregates``) and run.json (which stages, their prefixes and
prices). Token counts are what the server reported per request, each request counted once (a document answered by an
identical request of another carries 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from datapipe.audit.textout import data_table, make_console


@dataclass(frozen=True)
class AnnotationTotals:
    position: int  # the stage's place in the pipeline (1-based)
    prefix: str
    model: str
    documents: int  # that reached the stage
    sampled: int
    answered: int  # valid answers
    errors: dict[str, int]  # error code -> documents (not_sampled left out)
    prompt_tokens: int
    completion_tokens: int
    cost: float | None  # with prices configured
    currency: str | None


def annotate_stages(run: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(position, options) of each annotate stage in run.json's config."""
    out = []
    for i, entry in enumerate((run.get("config") or {}).get("stages") or [], start=1):
        if isinstance(entry, dict) and isinstance(entry.get("annotate"), dict):
            out.append((i, entry["annotate"]))
    return out


def annotation_totals(con: Any, run: dict[str, Any]) -> list[AnnotationTotals]:
    """One row per annotate stage of the run (``con``: a connection to its stats.duckdb), from the
    aggregate ``agg_annotations`` (``Annotate.aggregates``)."""
    out = []
    for position, options in annotate_stages(run):
        p = str(options.get("prefix") or "llm")
        rows = con.execute(
            "SELECT error, asked, documents, prompt_tokens, completion_tokens FROM agg_annotations WHERE prefix = ?", [p]
        ).fetchall()
        if not rows:  # no document reached the stage
            continue
        errors: dict[str, int] = {}
        for error, _, n, _, _ in rows:
            if error is not None and error != "not_sampled":
                errors[str(error)] = errors.get(str(error), 0) + int(n)
        pt = sum(int(r[3]) for r in rows)
        ct = sum(int(r[4]) for r in rows)
        prices = options.get("prices") or None
        cost = None
        if prices:
            cost = pt / 1e6 * float(prices["prompt"]) + ct / 1e6 * float(prices["completion"])
        out.append(
            AnnotationTotals(
                position,
                p,
                str(options.get("model")),
                sum(int(n) for _, asked, n, _, _ in rows if asked),
                sum(int(n) for e, asked, n, _, _ in rows if asked and (e or "") != "not_sampled"),
                sum(int(n) for e, asked, n, _, _ in rows if asked and e is None),
                dict(sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))),
                pt,
                ct,
                cost,
                str(prices.get("currency", "USD")) if prices else None,
            )
        )
    return out


def cost_text(t: AnnotationTotals) -> str:
    return f"{t.cost:,.4f} {t.currency}" if t.cost is not None else "- (no prices)"


def rows(totals: list[AnnotationTotals]) -> list[tuple[Any, ...]]:
    """Table rows: stage, model, documents, sampled, answered, errors, prompt and completion tokens, cost."""
    return [
        (
            f"{t.position} annotate ({t.prefix}_)",
            t.model,
            t.documents,
            t.sampled,
            t.answered,
            ", ".join(f"{k} {v}" for k, v in t.errors.items()) or "-",
            t.prompt_tokens,
            t.completion_tokens,
            cost_text(t),
        )
        for t in totals
    ]


HEADER = ("stage", "model", "documents", "sampled", "answered", "errors", "prompt tokens", "completion tokens", "cost")


def print_annotations(totals: list[AnnotationTotals], console: Console | None = None) -> None:
    if not totals:
        return
    console = console or make_console()
    numbers = ("documents", "sampled", "answered", "prompt tokens", "completion tokens")
    table = data_table(HEADER, title="LLM annotation", right=numbers)
    for row in rows(totals):
        table.add_row(*[f"{v:,}" if isinstance(v, int) else str(v) for v in row])
    console.print(table)


def run_annotation_totals(run_dir: Path) -> list[AnnotationTotals]:
    from datapipe.audit.sql import read_run_json, reading

    run = read_run_json(Path(run_dir))
    if not annotate_stages(run):
        return []
    from datapipe.audit.aggregates import ensure_tables

    with reading(Path(run_dir), aggregates_only=True) as con:
        ensure_tables(con, run)
        return annotation_totals(con, run)
