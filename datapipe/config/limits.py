"""Per-record caps that keep one hostile input from exhausting a worker.

A real crawl holds records that are huge, deeply nested or built to explode when
expanded. Each reader checks these caps and rejects what exceeds them with a reason
(``record_too_large``, ``too_deeply_nested``, ...) instead of running out of memory or
time. The defaults keep a 2-core, 24 GB machine safe with one task per core while
leaving every legitimate document we have seen far below them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MiB = 1 << 20
GiB = 1 << 30


class ReadLimits(BaseModel):
    """`limits:` in a pipeline file. Every value is per record (or per input file where named so)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_record_bytes: int = Field(
        64 * MiB,
        ge=1024,
        le=4 * GiB,
        description="Largest record (JSONL line, WARC payload, archive member, Parquet text cell) read, in bytes. "
        "A Python str of it costs up to 4x and Arrow copies it again: 64 MiB stays well under 1 GB "
        "per task, while the longest real documents (whole books, dumps) are a few MiB.",
    )
    max_file_decompressed_bytes: int = Field(
        256 * GiB,
        ge=MiB,
        description="Bytes decompressed from one input file before the rest is rejected: stops a "
        "decompression bomb from running for hours (real inputs are < 10 GB per file).",
    )
    max_json_depth: int = Field(
        64,
        ge=2,
        le=10_000,
        description="Nesting depth of one JSON record: real documents are 2-5 deep; Python's parser "
        "recurses and fails near 1,000.",
    )
    max_html_depth: int = Field(
        512,
        ge=16,
        le=2048,
        description="Element nesting depth of one HTML page: real pages stay under 100; 100,000 nested "
        "elements made extraction take minutes (its cost grows with elements x depth). At most "
        "2048: the depth check is a CSS chain of that many selectors, whose own cost grows fast past it.",
    )
    max_tex_expansions: int = Field(
        100_000,
        ge=100,
        description="Macro expansions in one LaTeX document: a real paper needs a few thousand; more means "
        "a runaway or hostile macro.",
    )
    max_record_errors: int = Field(
        10,
        ge=0,
        description="Documents of one task a stage may reject as record_error (it raised on them) before the "
        "stage counts as broken and the task fails: a few poison records are data, many are a bug.",
    )
    max_record_error_fraction: float = Field(
        0.01,
        ge=0,
        le=1,
        description="The same budget as a share of the documents the stage saw in the task, when that is larger.",
    )
    max_archive_members: int = Field(
        1_000_000, ge=1, description="Members read from one archive (tar, zip): a large monorepo has a few 100,000 files."
    )


DEFAULT_LIMITS = ReadLimits()
