"""``datapipe sql``, ``explain``, ``stats`` and ``report``: reading a finished run folder."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from datapipe.cli.options import RUN_DIR, heartbeat

VERIFY_HELP = (
    "First check every documents file of the run against the sha256 its task recorded (reads them "
    "all once) and refuse a damaged one by name. Without it, each page read is checked against its "
    "own checksum as it is decoded."
)
STATS_VERIFY_HELP = (
    "First check every documents file of the run against the sha256 its task recorded (reads them "
    "all once) and refuse a damaged one by name. Without it, stats reads only the run's database "
    "(the aggregates its tasks wrote), no documents file."
)


@click.command()
@click.argument("run_dir", type=RUN_DIR)
@click.argument("query")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="table for people, csv or json (one object per row, JSON Lines) for other tools.",
)
@click.option(
    "--memory-limit",
    metavar="SIZE",
    help="Memory the query may use, e.g. 500MB, 2GB (default: $DATAPIPE_SQL_MEMORY_LIMIT, else a quarter "
    "of this machine's memory or of its cgroup's limit, at most 16GB).",
)
@click.option(
    "--timeout",
    metavar="SECONDS",
    type=float,
    help="Stop the query after this many seconds (default: $DATAPIPE_SQL_TIMEOUT, else 3600; 0: no limit).",
)
@click.option(
    "--max-rows",
    type=click.IntRange(min=0),
    metavar="N",
    help="Print at most N rows and say when there were more (default: 200 for a table, all for csv "
    "and json, which stream); 0 for all.",
)
@click.option("--verify", is_flag=True, help=VERIFY_HELP)
def sql(
    run_dir: Path, query: str, fmt: str, memory_limit: str | None, timeout: float | None, max_rows: int | None, verify: bool
) -> None:
    """Run one read-only SQL QUERY (SELECT, or EXPLAIN of one) against RUN_DIR/stats.duckdb.

    The connection reads only this run: it cannot write any file or read files outside
    the run's own tables and documents. Cells are printed verbatim.

    \b
    Limits, so that a runaway query (a cross join, a sort of billions of rows) cannot take
    a shared machine down: the query may use --memory-limit of memory (nothing spills to
    disk) and at most 4 threads, and runs at most --timeout seconds (an hour by default);
    past a limit it ends with an error that names it. Ctrl-C stops the query at once (exit
    status 130). The process itself takes 100 to 200MB more.

    \b
    Tables: documents (one row per input document: id, source, kind, lang, license,
    status, stage, reason, detail, n_chars, n_tokens, signals...), stages, and the
    counts the tasks wrote: agg_documents, agg_lengths and the stages' agg_ tables.
    Views: funnel, shards, mixture, contamination, and those the run's stages add.
    Views with the text: kept_docs, rejected_docs.
    Example:
      datapipe sql out/demo "select stage, reason, count(*) from documents group by all"
    """
    from datapipe.audit.limits import INTERRUPTED_MESSAGE
    from datapipe.audit.sql import TABLE_MAX_ROWS, QueryInterrupted, query_result, write_result

    if max_rows is None:
        max_rows = TABLE_MAX_ROWS if fmt == "table" else 0
    # A query over billions of rows runs for minutes: with its result going to a file, say it is alive
    # (on stderr; on a terminal the lines would land in the middle of streamed rows).
    alive = heartbeat("sql: query running", when=not sys.stdout.isatty())
    try:
        with alive, query_result(run_dir, query, memory_limit=memory_limit, timeout=timeout, verify=verify) as result:
            cut = write_result(result, fmt, sys.stdout, max_rows=max_rows or None)
    except KeyboardInterrupt:  # before the query ran, or after: the same one line as during it
        raise QueryInterrupted(INTERRUPTED_MESSAGE) from None
    if cut is not None and fmt != "table":  # a table says so under its rows
        click.echo(f"note: printed the first {cut} rows only (--max-rows {max_rows}); there are more", err=True)


@click.command()
@click.argument("run_dir", type=RUN_DIR)
@click.argument("doc_id")
def explain(run_dir: Path, doc_id: str) -> None:
    """Show every signal of document DOC_ID in RUN_DIR and the stage and rule that kept or dropped it.

    \b
    The same data in SQL:
      datapipe sql RUN "select * from documents where id = 'web_zh/a.jsonl#L3'"
    """
    from datapipe.audit.explain import explain as explain_doc

    explain_doc(run_dir, doc_id, sys.stdout)


@click.command()
@click.argument("run_dir", type=RUN_DIR)
@click.option(
    "--budget", metavar="TOKENS", help="Training token budget (e.g. 300M, 2.5B): print the sampling ratio each source needs."
)
@click.option("--verify", is_flag=True, help=STATS_VERIFY_HELP)
def stats(run_dir: Path, budget: str | None, verify: bool) -> None:
    """Print RUN_DIR's token mixture against the pipeline's `mixture` weights (and, for annotate
    stages, the documents answered and the prompt and completion tokens, with a cost where priced).

    \b
    With --budget, each source's sampling ratio: target share x budget / its train tokens
    (above 1: epochs, the source is repeated; below 1: the fraction of it used).
    """
    from datapipe.audit.annotations import print_annotations, run_annotation_totals
    from datapipe.audit.mixture import mixture_report, parse_tokens, print_mixture

    tokens = parse_tokens(budget) if budget is not None else None
    report = mixture_report(run_dir, tokens, warn=lambda line: click.echo(line, err=True), verify=verify)
    print_mixture(report)
    print_annotations(run_annotation_totals(run_dir))  # annotate stages: answers, tokens, cost


@click.command()
@click.argument("run_dir", type=RUN_DIR)
@click.option(
    "--html",
    "html_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="The HTML file to write.",
)
def report(run_dir: Path, html_file: Path) -> None:
    """Write one self-contained HTML page about RUN_DIR: funnel, mixture, lengths, languages, the
    stages' own sections, shards.

    Charts are inline SVG: the page opens offline, with nothing fetched. Every number comes from
    the counts the run's tasks wrote (the agg_ tables of stats.duckdb), so no document is read
    (a run folder of an older datapipe is read in full instead, and the command says so).
    """
    from datapipe.audit.report import write_report

    path = write_report(run_dir, html_file, warn=lambda line: click.echo(line, err=True))
    click.echo(f"wrote {path}")
