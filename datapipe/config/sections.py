"""The leaves of a pipeline file: its typed sections, and how any YAML file is read.

The layers below the pipeline take these as arguments: a reader its ``SourceConfig``, the
tokenizer its ``TokenizeConfig``, the input splitter its ``SplitConfig``, a stage the source
kinds, a rule set ``read_yaml``. They live here, apart from ``config.py``, because config.py
validates across those layers (it looks up stages, readers and the tokenizer) and so imports
them: were the sections defined there, every reader and stage would import config and config
would import them back. This module imports nothing from datapipe, so the dependency points
one way: pipeline.load -> readers/stages/tokenize -> config.sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

SOURCE_KINDS = ("web", "code", "paper", "text")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceConfig(Strict):
    name: str = Field(pattern=NAME_PATTERN, description="Source name; used in document ids and output folders.")
    kind: Literal["web", "code", "paper", "text"] = Field(
        "text", description="Source kind: which stages and rule sets apply, and how folders and archives are read."
    )
    format: str | None = Field(None, description="Input format; inferred from the file extension when omitted.")
    paths: list[str] = Field(min_length=1, description="Glob patterns, relative to the pipeline file.")
    text_field: str = Field("text", min_length=1, description="JSONL/Parquet field holding the text.")
    url_field: str | None = Field("url", description="JSONL/Parquet field holding the URL, if any.")
    license: str | None = Field(
        None,
        description="SPDX licence expression that covers every document of this source (the license stage reports "
        "it as `declared by source` instead of detecting one); checked against the SPDX ids datapipe knows.",
    )
    license_field: str | None = Field(
        None,
        min_length=1,
        description="JSONL/Parquet field holding each record's SPDX licence expression (`record field`); a record "
        "without a valid one falls back to `license`, then to detection.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Reader options for this format (checked against the reader)."
    )


class TokenizeConfig(Strict):
    tokenizer: str = Field(description="Path to a Hugging Face tokenizer.json, relative to the pipeline file.")
    seq_len: int = Field(2048, ge=8, le=1 << 20, description="Tokens per packed row (one more with labels: true).")
    labels: bool = Field(False, description="Store seq_len + 1 tokens per row, for next-token labels.")
    eos_token: str | None = Field(None, description="End-of-document token; detected from the vocabulary when omitted.")
    pad_token: str | None = Field(None, description="Padding token; the EOS token when omitted.")
    bos_token: str | None = Field(None, description="If set, prepended to every document.")
    val_fraction: float = Field(0.0, ge=0.0, le=0.5, description="Share of documents (by id hash) in the val split.")
    rows_per_shard: int = Field(8192, ge=1, le=1 << 24, description="Packed sequences per Arrow shard file.")
    packing: Literal["concat", "bestfit"] = Field(
        "concat",
        description="concat: documents end to end, cut every row (no padding); bestfit: whole documents "
        "per row by best-fit-decreasing, rows padded.",
    )
    bestfit_window: int = Field(4096, ge=1, le=1 << 22, description="Documents best-fit packing sorts at a time.")


class SplitConfig(Strict):
    """How input files become map tasks (datapipe/engine/splits.py): large files split, tiny ones grouped."""

    # 256 MiB: a range takes tens of seconds to minutes of map work per core, which keeps the per-task
    # overhead (scheduling, building stages, one Parquet file per output) to a few percent, and a
    # 10 TB crawl is ~40,000 tasks: enough for a 1,000-core cluster, few enough for the scheduler.
    target_bytes: int = Field(
        256 << 20, ge=4096, le=1 << 40, description="Bytes of input per map task: larger files are split, smaller grouped."
    )
    # 3 tasks per CPU: a small corpus still keeps every core busy, with slack for uneven ranges.
    min_tasks_per_cpu: float = Field(
        3.0,
        ge=0,
        le=1000,
        description=(
            "When the corpus is small, shrink the target so there are at least this many tasks per CPU (0: never shrink)."
        ),
    )
    min_bytes: int = Field(
        8 << 20,
        ge=4096,
        le=1 << 40,
        description=("The target is never shrunk below this (below it, per-task overhead dominates)."),
    )
    group_small_files: bool = Field(True, description="Read consecutive small files of a source in one task.")
    # 256: a merge task or a partition reads one byte range of at most 256 runs (each a request on an
    # object store); a crawl's 37,253 map tasks then need one merge level, 372,530 two
    # (bench/scaling/crawl_proportions.py, engine/shuffle_plan.py).
    shuffle_fan_in: int = Field(
        256,
        ge=2,
        le=65536,
        description=(
            "Runs a shuffle's merge task or partition task reads at most (one byte range of each): with more "
            "writers than this (map tasks, or the partitions of the round before), merge levels of this fan-in "
            "come first, so a task's inputs stay bounded however large the corpus."
        ),
    )
    # 4M rows: a MinHash partition of band rows peaks ~400-600 MiB and takes tens of seconds
    # (bench/scaling/crawl_proportions.py); the partitions of a round are its rows / this.
    partition_rows: int = Field(
        4_000_000,
        ge=1,
        le=1 << 40,
        description=(
            "Rows a partition task of a global stage's shuffle round holds, about: a round has its rows / this "
            "tasks (at least one part each), so a partition's memory is bounded by this at any corpus size."
        ),
    )
    # 256 MiB: rows wide on disk (a signature, an embedding each) make 4M rows gigabytes; a crawl's
    # MinHash rounds write 4-40 bytes a row (bench/scaling/crawl_proportions.py), so they stay sized by
    # rows and this bounds only wider ones.
    partition_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        le=1 << 40,
        description=(
            "Bytes of shuffle runs (as written, compressed) a partition task reads, about: a round has at least "
            "its bytes / this tasks, so a partition of wide rows (signatures, embeddings) is bounded as well as "
            "one of many narrow rows (partition_rows). A single part is never split."
        ),
    )
    # 32 MiB: a merge's peak is ~10x its buffers (the rows yielded, sorted and written; a page of each
    # input): 256 inputs of 10M band rows in all peaked 1,332 / 799 / 578 MiB at 256 / 64 / 32 MiB for
    # 4.4 / 5.0 / 5.1 CPU s, and at 256 MiB crawl-sized merges reached 2.1-2.5 GiB
    # (bench/scaling/crawl_proportions.py; before: a row group of every input at once, 2.2-2.6 GiB).
    merge_memory_bytes: int = Field(
        32 << 20,
        ge=1 << 20,
        le=1 << 40,
        description=(
            "Decoded bytes a shuffle's merge task buffers, about: it reads each of its (at most shuffle_fan_in) "
            "runs this / (2 x fan-in) bytes of rows at a time, so the wider the rows, the fewer per read; the "
            "task's memory grows with this (about 10x: the rows sorted and written) plus a page of each input, "
            "whatever the rows or the corpus. A partition task reads its parts through the same merge, one part "
            "at a time, and each of its output runs (decisions, state, copies, forwarded rows) holds about this "
            "much before it spills a sorted piece to local scratch space, merged into the run at the end."
        ),
    )


class WorkersConfig(Strict):
    """How long a Ray worker process is reused (datapipe/engine/recycle.py); outputs do not depend on it."""

    # 32 MiB: never-replaced workers started the substrings round tasks ever larger as the corpus grew;
    # at 32 they stay flat for a few fresh workers (bench/scaling/substrings.py; docs/stages/substrings.md
    # has the table).
    recycle_above_mib: int = Field(
        32,
        ge=0,
        le=1 << 20,
        description=(
            "A Ray worker that, after a task and its memory release, holds more than this many MiB above what it "
            "held after its first task (or its first task that grew by 64 MiB or more: what its stages import and "
            "compile; checked at its first task of each phase: what earlier phases left) or above "
            "what it held after its first task of the current phase (that phase's models and caches; checked at "
            "its later tasks) exits after handing over that task's result, and Ray starts a fresh one for the next "
            "task; no task fails or is retried. 0: never for memory."
        ),
    )
    recycle_after_tasks: int = Field(
        0,
        ge=0,
        le=1 << 30,
        description="A Ray worker also exits, the same way, after this many tasks (0: no limit).",
    )


# libyaml's parser with PyYAML's safe constructors: the same values, ~10x faster to parse. A run
# reads the pipeline and each quality rule set once per stage check (24 times for the bench pipeline).
_FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", None)


def read_yaml(path: Path) -> Any:
    """``yaml.safe_load`` of a file whose syntax errors name the file (not ``<unicode string>``)."""
    text = path.read_text(encoding="utf-8")
    if _FAST_SAFE_LOADER is not None:
        try:
            return yaml.load(text, Loader=_FAST_SAFE_LOADER)  # noqa: S506 - a safe loader
        except yaml.YAMLError:
            pass  # parsed again below: PyYAML's own message (with its snippet) for the error
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        for mark in (exc.context_mark, exc.problem_mark):
            if mark is not None:
                mark.name = str(path)
        raise


def yaml_error_text(exc: yaml.YAMLError) -> str:
    """One line: ``p.yaml, line 4, column 3: not valid YAML: expected ',' or '}' (while parsing ...)``."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        m = exc.problem_mark
        text = f"{m.name}, line {m.line + 1}, column {m.column + 1}: not valid YAML: {exc.problem}"
        if exc.context:
            c = exc.context_mark
            text += f" ({exc.context}" + (f" at line {c.line + 1}, column {c.column + 1})" if c is not None else ")")
        return text
    return f"not valid YAML: {' '.join(str(exc).split())}"
