"""Reading benchmark files: JSONL (optionally gzipped), Parquet or CSV, one item per row.

An item's text is the strings under its configured fields. A field may be a dotted path into
nested objects (``other.solution``); lists and objects under a field are flattened to all their
string leaves (CMRC's ``answers: [{text, answer_start}]``, AGIEval's ``options: [...]``), numbers
become their decimal text. Each leaf stays a separate text unit, so an n-gram never spans the
boundary between, say, a question and its options.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datapipe.errors import EXIT_USAGE, DatapipeError

FORMATS = ("jsonl", "parquet", "csv")


class BenchmarkError(DatapipeError, ValueError):
    """A benchmark file that cannot be read; the message names the file (and line)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Item:
    benchmark: str
    item_id: str
    texts: tuple[str, ...]


def file_format(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, fmt in (
        (".jsonl", "jsonl"),
        (".jsonl.gz", "jsonl"),
        (".json.gz", "jsonl"),
        (".ndjson", "jsonl"),
        (".parquet", "parquet"),
        (".csv", "csv"),
        (".csv.gz", "csv"),
    ):
        if name.endswith(suffix):
            return fmt
    return None


def _open_text(path: Path) -> io.TextIOBase:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return io.StringIO(raw.decode("utf-8-sig"))


def records(path: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The rows of one benchmark file as dicts (JSONL lines that are empty are skipped)."""
    fmt = file_format(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        yield from (table.slice(0, limit) if limit else table).to_pylist()
        return
    with _open_text(path) as f:
        if fmt == "csv":
            for i, row in enumerate(csv.DictReader(f)):
                if limit is not None and i >= limit:
                    return
                yield row
            return
        n = 0
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if limit is not None and n >= limit:
                return
            n += 1
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkError(f"{path}:{lineno}: not a JSON object: {exc}") from None
            if not isinstance(rec, dict):
                raise BenchmarkError(f"{path}:{lineno}: not a JSON object")
            yield rec


def leaves(value: Any) -> list[str]:
    """Every string leaf of a value (lists and objects flattened), numbers as text, nulls dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in leaves(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in leaves(v)]
    return [str(value)]


_MISSING = object()


def get_field(record: dict[str, Any], field: str) -> Any:
    """A field by name, or by dotted path into nested objects; ``_MISSING`` when absent."""
    if field in record:
        return record[field]
    value: Any = record
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def has_field(record: dict[str, Any], field: str) -> bool:
    return get_field(record, field) is not _MISSING


def items(name: str, files: list[Path], fields: list[str], id_field: str | None) -> Iterator[Item]:
    """The items of one benchmark; ids from ``id_field``, else ``<file name>#<row>`` (1-based)."""
    for path in files:
        for row, rec in enumerate(records(path), start=1):
            texts: list[str] = []
            for f in fields:
                v = get_field(rec, f)
                if v is not _MISSING:
                    texts.extend(leaves(v))
            rid = get_field(rec, id_field) if id_field else _MISSING
            item_id = str(rid) if rid is not _MISSING and rid is not None else f"{path.name}#{row}"
            yield Item(name, item_id, tuple(t for t in texts if t))
