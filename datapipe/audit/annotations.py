"""What a run's ``annotate`` stages asked and what it cost: totals for ``datapipe stats`` and the report.

Read from the ``documents`` table (every document, kept or rejected, carries the stage's columns
from the point it passed it) and run.json (which stages, their prefixes and prices). Token counts
are what the server reported per request, each request counted once (a document answered by an
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
    """One row per annotate stage of the run (``con``: a connection to its stats.duckdb)."""
    columns = {r[0] for r in con.execute("DESCRIBE documents").fetchall()}
    out = []
    for position, options in annotate_stages(run):
        p = str(options.get("prefix") or "llm")
        error, model = f'"{p}_error"', f'"{p}_model"'
        if f"{p}_error" not in columns:  # no document reached the stage
            continue
        docs, sampled, answered, pt, ct = con.execute(
            f"SELECT count(*) FILTER ({model} IS NOT NULL), "
            f"count(*) FILTER ({model} IS NOT NULL AND coalesce({error}, '') <> 'not_sampled'), "
            f"count(*) FILTER ({model} IS NOT NULL AND {error} IS NULL), "
            f'coalesce(sum("{p}_prompt_tokens"), 0), coalesce(sum("{p}_completion_tokens"), 0) FROM documents'
        ).fetchone()
        errors = dict(
            con.execute(
                f"SELECT {error}, count(*) FROM documents WHERE {error} IS NOT NULL AND {error} <> 'not_sampled' "
                "GROUP BY 1 ORDER BY 2 DESC, 1"
            ).fetchall()
        )
        prices = options.get("prices") or None
        cost = None
        if prices:
            cost = int(pt) / 1e6 * float(prices["prompt"]) + int(ct) / 1e6 * float(prices["completion"])
        out.append(
            AnnotationTotals(
                position,
                p,
                str(options.get("model")),
                int(docs),
                int(sampled),
                int(answered),
                {str(k): int(v) for k, v in errors.items()},
                int(pt),
                int(ct),
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
    with reading(Path(run_dir)) as con:
        return annotation_totals(con, run)
