"""``datapipe view``: a read-only web app over one run folder, or two compared."""

from __future__ import annotations

from pathlib import Path

import click

from datapipe.cli.options import RUN_DIR, as_program


@click.command()
@click.argument("run_dir", type=RUN_DIR)
@click.argument("run_b", type=RUN_DIR, required=False)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Any address other than loopback needs the random token the server prints "
    "(every request without it is refused).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port (0: any free one).")
@click.option("--no-browser", is_flag=True, help="Print the URL only; do not open a browser.")
@click.option(
    "--memory-limit",
    metavar="SIZE",
    help="The SQL page's memory limit per query, as `datapipe sql` (default: $DATAPIPE_SQL_MEMORY_LIMIT or a quarter of memory).",
)
@click.option(
    "--sql-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="The SQL page's time limit per query (default: $DATAPIPE_SQL_TIMEOUT or 60).",
)
def view(
    run_dir: Path, run_b: Path | None, host: str, port: int, no_browser: bool, memory_limit: str | None, sql_timeout: float | None
) -> None:
    """Browse RUN_DIR in a web browser: every document with why it was kept or dropped.

    \b
    Pages (each view's URL can be bookmarked):
      /            the funnel by stage and reason, sources x languages, the mixture, distributions
      /documents   documents filtered by status, stage, reason, source, lang, text and any signal's
                   range, with a histogram of a signal (drag across it to filter)
      /documents/ID  one document: text, signals, the rule that decided it, edits, duplicates
      /sql         read-only SQL, as `datapipe sql` (CSV download)
      /shards      the shard manifest; any packed row decoded as the loader yields it
      /compare     with RUN_B: the documents the two runs decided differently

    Read-only. Listens on 127.0.0.1 unless --host says otherwise. A run folder in object storage
    (s3://...) is read in place; a run still going is labelled as such.
    """
    if as_program():  # the process is ours: pyarrow's first conversion need not import pandas
        from datapipe.runtime.arrow_pandas import arrow_without_pandas

        arrow_without_pandas()
    from datapipe.view.launch import serve

    folders = [run_dir] + ([run_b] if run_b is not None else [])
    serve(folders, host, port, browser=not no_browser, memory_limit=memory_limit, sql_timeout=sql_timeout, echo=click.echo)
