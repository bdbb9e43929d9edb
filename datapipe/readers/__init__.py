"""Reader registry: input format -> function reading one input file into document batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

from datapipe.readers.base import InputFile, ReadBatch
from datapipe.readers.jsonl import read_jsonl
from datapipe.readers.parquet import read_parquet

Reader = Callable[[InputFile, int], Iterator[ReadBatch]]

READERS: dict[str, Reader] = {
    "jsonl": read_jsonl,
    "parquet": read_parquet,
}

# Typed options a format's reader accepts under `sources[i].options` (validated before any work;
# the reader re-validates the same dict with the same model to get defaults).
READER_OPTIONS: dict[str, type[BaseModel]] = {}

# Longest suffix first, so ".warc.wet.gz" wins over ".gz".
_SUFFIXES: list[tuple[str, str]] = [
    (".jsonl.gz", "jsonl"), (".jsonl.zst", "jsonl"), (".jsonl.bz2", "jsonl"), (".jsonl.xz", "jsonl"),
    (".json.gz", "jsonl"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
    (".parquet", "parquet"), (".pq", "parquet"),
]


def infer_format(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, fmt in _SUFFIXES:
        if name.endswith(suffix):
            return fmt
    return None


__all__ = ["READERS", "READER_OPTIONS", "InputFile", "ReadBatch", "Reader", "infer_format"]
