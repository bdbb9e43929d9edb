"""``datapipe export``: a run's kept documents in the formats trainers read."""

from __future__ import annotations

import click


@click.command("export")
@click.argument("run_dir", metavar="RUN_DIR")
@click.option(
    "--format",
    "fmt",
    required=True,
    type=click.Choice(["megatron", "hf", "mds", "jsonl"]),
    help="megatron: .bin/.idx per source and split; hf: Arrow stream (or Parquet) files for `datasets`; "
    "mds: MosaicML streaming shards; jsonl: one JSON object per document.",
)
@click.option(
    "--output",
    "-o",
    required=True,
    type=click.Path(file_okay=False),
    help="Export folder, a path or s3:// gs:// hdfs:// URI (new, empty, or an earlier export with the "
    "same options, which is resumed).",
)
@click.option(
    "--columns",
    metavar="COL,...",
    help="Document columns to write (any column of docs/, plus input_ids: the tokens). "
    "Default: hf, mds id,text,input_ids; jsonl id,text; megatron tokens only.",
)
@click.option("--split", "splits", multiple=True, type=click.Choice(["train", "val"]), help="Only this split (repeatable).")
@click.option("--source", "sources", multiple=True, metavar="NAME", help="Only this source (repeatable).")
@click.option(
    "--docs-per-file", type=click.IntRange(min=1), default=100_000, show_default=True, help="Documents per hf/jsonl file."
)
@click.option("--hf-file-format", type=click.Choice(["arrow", "parquet"]), default="arrow", show_default=True)
@click.option(
    "--mds-size-limit",
    type=click.IntRange(min=1, max=(1 << 32) - 1),
    default=1 << 26,
    show_default=True,
    help="Bytes per MDS shard.",
)
@click.option("--fresh", is_flag=True, help="Delete an earlier export's files in --output and start over.")
@click.option("--no-progress", is_flag=True, help="No progress bars (one line per source and split instead).")
@click.option("--allow-incomplete", is_flag=True, help="Export a run whose run.json does not say complete (refused by default).")
def export_cmd(
    run_dir: str,
    fmt: str,
    output: str,
    columns: str | None,
    splits: tuple[str, ...],
    sources: tuple[str, ...],
    docs_per_file: int,
    hf_file_format: str,
    mds_size_limit: int,
    fresh: bool,
    no_progress: bool,
    allow_incomplete: bool,
) -> None:
    """Export RUN_DIR's kept documents for a trainer: Megatron, Hugging Face, MosaicML or JSONL.

    RUN_DIR is a run folder: a path, or an s3:// gs:// hdfs:// URI, whose documents and token
    lists are then read in place from the store. OUTPUT in object storage is written through a
    local staging folder, one file at a time, and resumes from the store.

    \b
    Streams batch by batch; a killed export resumes when the same command runs again (the
    files written so far are listed in OUTPUT/export-manifest.json). What was written (paths,
    counts, sha256) is recorded in RUN_DIR/exports/<format>.json. megatron also writes
    OUTPUT/data_path.<split>.txt: the weighted --data-path string for the run's mixture.
    """
    from datapipe.export import export

    result = export(
        run_dir,
        fmt,
        output,
        columns=[c.strip() for c in columns.split(",") if c.strip()] if columns else None,
        splits=list(splits) or None,
        sources=list(sources) or None,
        docs_per_file=docs_per_file,
        hf_file_format=hf_file_format,
        mds_size_limit=mds_size_limit,
        fresh=fresh,
        log=lambda m: click.echo(m, err=True),
        progress=not no_progress,
        allow_incomplete=allow_incomplete,
    )
    for stream, info in result.streams.items():
        tokens = f"{info['tokens']} tokens, " if info["tokens"] is not None else ""  # none without input_ids
        click.echo(f"{stream}: {info['docs']} documents, {tokens}{info['parts']} file(s)")
    click.echo(
        f"{result.documents} documents in {result.output} ({result.parts_written} files written, "
        f"{result.parts_skipped} already done)"
    )
    for split, data_path in result.extra.get("data_path", {}).items():
        flag = "--data-path" if split == "train" else "--valid-data-path"
        click.echo(f"{flag} {data_path}")
