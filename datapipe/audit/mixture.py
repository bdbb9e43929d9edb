"""``datapipe stats``: a run's token mixture against the pipeline's target weights.

For a token budget, each source's sampling ratio is the number of times its train
tokens must be read to give it its target share: above 1 the source is repeated
(epochs, upsampling), below 1 only that fraction of it is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from datapipe.audit.aggregates import ensure_tables
from datapipe.audit.documents import column_names
from datapipe.audit.sql import read_run_json, reading
from datapipe.audit.textout import data_table, make_console
from datapipe.config.mixture import REPEAT_COLUMN, mixture_weights, repeat_rules
from datapipe.errors import UsageError

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_tokens(text: str) -> int:
    """'2.5B' -> 2_500_000_000; plain integers (with _ or ,) too."""
    m = re.fullmatch(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([KMBGT]?)\s*", text.upper())
    if not m:
        raise UsageError(f"not a token count: {text!r} (examples: 5000000, 300M, 2.5B)")
    return int(float(m.group(1).replace("_", "").replace(",", "")) * _SUFFIX[m.group(2)])


@dataclass(frozen=True)
class SourceMix:
    source: str
    documents: int
    tokens: int  # kept documents' tokens (EOS/BOS included), train and val
    train_tokens: int  # what a loader samples from: the train shards
    share: float  # of all kept tokens
    target: float | None  # normalized target weight; None when the pipeline sets no mixture
    ratio: float | None  # target tokens in the budget / train tokens; None without a budget

    @property
    def advice(self) -> str:
        if self.ratio is None:
            return ""
        if self.train_tokens == 0:
            return "no train tokens" if self.target else "-"
        if self.ratio >= 1:
            return f"{self.ratio:.2f} epochs" if self.ratio > 1.0005 else "1 epoch"
        return f"{self.ratio:.1%} of it"


@dataclass(frozen=True)
class MixtureReport:
    sources: list[SourceMix]
    budget: int | None
    max_budget_one_epoch: int | None  # the largest budget with no source repeated, at the target weights
    groups: list[tuple]  # rows of the mixture view: source, lang, script, license_class, docs, tokens, share
    limiting: list[str] = field(default_factory=list)  # the source(s) that run out first at that budget
    # With the weighted sources that have no train tokens set to weight 0 (the others renormalized).
    max_budget_without_starved: int | None = None
    # Sources with mixture repeats, per bucket: source, bucket column, bucket, docs, tokens, repeat,
    # tokens after repeats (train and val; see bucket_rows).
    buckets: list[tuple] = field(default_factory=list)

    @property
    def starved(self) -> list[SourceMix]:
        """Sources with a target weight but no train tokens: no budget can give them their share."""
        return [r for r in self.sources if r.target and r.train_tokens == 0]


def configured_sources(run: dict) -> list[str]:
    """The source names of a run's pipeline, in pipeline order (also those that kept nothing)."""
    config = run.get("config") or {}
    return [s["name"] for s in config.get("sources") or [] if isinstance(s, dict) and s.get("name")]


def mixture_report(run_dir: Path, budget: int | None = None, warn: Any = None, verify: bool = False) -> MixtureReport:
    """From the run's small tables and aggregates (``agg_documents``, ``agg_buckets``): no document is read.
    ``verify``: the run's documents files are checked against their recorded sha256 first."""
    run = read_run_json(Path(run_dir))
    weights = mixture_weights((run.get("config") or {}).get("mixture"))
    with reading(Path(run_dir), aggregates_only=True, verify=verify) as con:
        ensure_tables(con, run, warn)
        docs = {
            s: (d, t)
            for s, d, t in con.execute(
                "SELECT source, sum(documents), sum(tokens) FROM agg_documents WHERE status = 'kept' GROUP BY source"
            ).fetchall()
        }
        train = dict(con.execute("SELECT source, sum(tokens) FROM shards WHERE split = 'train' GROUP BY source").fetchall())
        groups = con.execute("SELECT source, lang, script, license_class, documents, tokens, token_share FROM mixture").fetchall()
        buckets = bucket_rows(con, run)
    # Every source of the pipeline is listed, also one that kept nothing (it shows 0, not nothing).
    names = list(dict.fromkeys([*weights, *configured_sources(run), *sorted(docs)]))
    total = sum(t for _, t in docs.values()) or 1
    wsum = sum(weights.values())
    rows = []
    for name in names:
        d, t = docs.get(name, (0, 0))
        tr = int(train.get(name) or 0)
        target = weights.get(name, 0.0) / wsum if wsum else None
        share_for_budget = target if target is not None else t / total
        ratio = None
        if budget is not None:
            ratio = share_for_budget * budget / tr if tr else float("inf") if share_for_budget else 0.0
        rows.append(SourceMix(name, int(d), int(t), tr, t / total, target, ratio))
    limits = {
        r.source: r.train_tokens / (r.target if r.target is not None else r.share)
        for r in rows
        if (r.target if r.target is not None else r.share) > 0
    }
    max_budget = int(min(limits.values())) if limits else None
    limiting = [s for s, v in limits.items() if max_budget is not None and int(v) == max_budget]
    fed = {r.source: r.target for r in rows if r.target and r.train_tokens}
    without = None
    if wsum and fed and len(fed) < sum(1 for r in rows if r.target):
        fed_sum = sum(fed.values())
        without = int(min(r.train_tokens / (fed[r.source] / fed_sum) for r in rows if r.source in fed))
    return MixtureReport(rows, budget, max_budget, groups, limiting, without, buckets)


def bucket_rows(con: Any, run: dict) -> list[tuple]:
    """Per source with mixture repeats and per bucket of the column its ranges name: kept documents,
    their tokens, the configured repeat and the tokens after repeats (``mixture_repeat``, which also
    holds rehydration by dup_count), from the aggregates. A document without a bucket is in bucket None."""
    rules = repeat_rules((run.get("config") or {}).get("mixture"))
    if not rules or REPEAT_COLUMN not in column_names(con):
        return []
    buckets = (
        {r[0] for r in con.execute("SELECT DISTINCT bucket_column FROM agg_buckets").fetchall()}
        if _has(con, "agg_buckets")
        else set()
    )
    out = []
    for source, rule in rules.items():
        if rule.column in buckets:
            rows = con.execute(
                """SELECT bucket, sum(documents), sum(tokens), sum(repeated_tokens) FROM agg_buckets
                   WHERE status = 'kept' AND source = ? AND bucket_column = ? GROUP BY bucket ORDER BY bucket DESC NULLS LAST""",
                [source, rule.column],
            ).fetchall()
        else:  # no document has the column: one row, bucket None
            rows = con.execute(
                """SELECT NULL, sum(documents), sum(tokens), sum(repeated_tokens) FROM agg_documents
                   WHERE status = 'kept' AND source = ? HAVING count(*) > 0""",
                [source],
            ).fetchall()
        for b, d, t, after in rows:
            out.append((source, rule.column, b, int(d), int(t), rule.repeat_of(b), int(after)))
    return out


def _has(con: Any, table: str) -> bool:
    row = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [table]).fetchall()
    return bool(row[0][0])


def budget_line(report: MixtureReport) -> str | None:
    """The largest one-epoch budget, naming the source that limits it (or that kept no train tokens)."""
    if report.max_budget_one_epoch is None:
        return None
    head = f"Largest budget at these weights with no source repeated: {report.max_budget_one_epoch:,} train tokens"
    starved = report.starved
    if starved:
        named = "; ".join(
            f"{r.source} (target {r.target:.1%}) has no train tokens: "
            + ("it kept no documents" if r.documents == 0 else f"its {r.documents:,} kept documents are all in val")
            for r in starved
        )
        without = (
            f" With {'them' if len(starved) > 1 else 'it'} at weight 0 the largest is {report.max_budget_without_starved:,}."
            if report.max_budget_without_starved
            else ""
        )
        return (
            f"{head}, because {named}. Any budget would repeat it without end: give it weight 0 or fix its "
            f'inputs (why it dropped documents: datapipe sql RUN "select stage, reason, count(*) from documents '
            f"where source = '{starved[0].source}' group by all\").{without}"
        )
    if report.max_budget_one_epoch == 0 and not any(r.train_tokens for r in report.sources):
        return f"{head}: the run has no train shards (no `tokenize` section, or every document went to val)."
    return f"{head} ({', '.join(report.limiting)} runs out first)."


def print_mixture(report: MixtureReport, console: Console | None = None) -> None:
    console = console or make_console()
    has_target = any(r.target is not None for r in report.sources)
    cols = ["source", "docs", "tokens", "share", "target", "train tokens"]
    if report.budget is not None:
        cols += ["needed", "sampling"]
    table = data_table(cols, title="Mixture per source (kept tokens)", right=[c for c in cols if c not in ("source", "sampling")])
    for r in report.sources:
        cells = [
            r.source,
            f"{r.documents:,}",
            f"{r.tokens:,}",
            f"{r.share:.1%}",
            f"{r.target:.1%}" if r.target is not None else "-",
            f"{r.train_tokens:,}",
        ]
        if report.budget is not None:
            weight = r.target if r.target is not None else r.share
            cells += [f"{int(weight * report.budget):,}", r.advice]
        table.add_row(*cells)
    console.print(table)
    if report.budget is not None:
        console.print(
            f"Budget {report.budget:,} tokens; needed = target x budget; sampling = needed / train tokens "
            f"(above 1: repeat the source, below 1: use that part of it)."
        )
    if not has_target:
        console.print("The pipeline sets no `mixture` weights: the natural shares are the target.")
    line = budget_line(report)
    if line:
        console.print(line)
    if report.buckets:
        upsampled = data_table(
            ("source", "bucket", "docs", "tokens before", "repeat", "tokens after"),
            title="Repeats by classifier bucket (kept documents, train and val)",
            right=("docs", "tokens before", "repeat", "tokens after"),
        )
        for source, column, b, d, t, k, after in report.buckets:
            upsampled.add_row(source, "-" if b is None else f"{column}={b}", f"{d:,}", f"{t:,}", str(k), f"{after:,}")
        console.print(upsampled)
        console.print(
            "Train tokens above count each document as many times as the shards hold it (tokens after repeats); "
            "rehydrate multiplies the repeat by dup_count."
        )
    groups = data_table(
        ("source", "lang", "script", "license", "docs", "tokens", "share"),
        title="Mixture by source x lang x script x license class",
        right=("docs", "tokens", "share"),
    )
    for source, lang, script, lclass, d, t, share in report.groups:
        groups.add_row(source, lang, script, lclass, f"{d:,}", f"{t:,}", f"{(share or 0):.1%}")
    console.print(groups)
