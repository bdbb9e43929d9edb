"""``datapipe train-tokenizer`` and ``train-classifier``: models trained on a run's documents or on files."""

from __future__ import annotations

from pathlib import Path

import click

from datapipe.cli.options import fail, heartbeat


@click.command("train-tokenizer")
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
        fail("give exactly one of --run RUN or --files GLOB...")
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


@click.command("train-classifier")
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
            fail("--labels replaces --positive and --negative: give one or the other")
        if run_dir is None:
            fail("--labels is SQL over a run: give the run with --run RUN")
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
        with heartbeat("train-classifier: reading labels and training"):
            fitted = fit_labels(run_dir, labels, out_dir / f"{name}.bin", params)
        click.echo(
            f"wrote {fitted.model} (sha256 {fitted.meta['model_sha256'][:12]}...), a {fitted.meta['task']} "
            f"of {fitted.meta['source']}"
        )
        for line in fit_report_lines(fitted.evaluation, fitted.meta):
            click.echo(line)
        return
    if not positive or not negative:
        fail("give --positive and --negative examples, or --labels SQL")
    if positive_label == negative_label:
        fail("--positive-label and --negative-label must differ")
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
    with heartbeat("train-classifier: reading examples and training"):
        result = train(list(positive), list(negative), run_dir, options, log=lambda m: click.echo(m, err=True))
    counts = ", ".join(f"{lang} {sum(c['train'] for c in d.values())}" for lang, d in result.meta["counts"].items())
    click.echo(f"wrote {result.model} (sha256 {result.meta['model_sha256'][:12]}...), trained on {counts} examples")
    for line in report_lines(result.evaluation):
        click.echo(line)
