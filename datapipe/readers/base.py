"""The reader contract: one input file in, batches of documents (and rejects) out.

A reader never raises for bad data: a malformed record becomes a reject row with a
reason, and a file that cannot be read (or breaks off half-way) becomes one reject
row for the unread rest, so the run goes on and nothing is silently lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from datapipe.config import SourceConfig
from datapipe.limits import DEFAULT_LIMITS, ReadLimits
from datapipe.schema import BASE_SCHEMA, doc_id

MAX_REJECT_TEXT = 65536  # raw bytes kept of a malformed record: enough to debug, bounded


@dataclass(frozen=True)
class ReadBatch:
    docs: pa.Table  # BASE_SCHEMA (+ reader-specific provenance columns)
    rejects: pa.Table | None = None  # BASE_SCHEMA + reason, detail


@dataclass(frozen=True)
class InputFile:
    path: Path
    name: str  # how ids and provenance name the file: relative to the pipeline file when inside it
    source: SourceConfig
    limits: ReadLimits = DEFAULT_LIMITS  # the pipeline's `limits:` caps


@dataclass
class BatchBuilder:
    """Accumulates documents and rejects row by row and flushes them as Arrow batches."""

    file: InputFile
    batch_size: int
    docs: dict[str, list] = field(default_factory=lambda: {f: [] for f in BASE_SCHEMA.names})
    rejects: dict[str, list] = field(default_factory=lambda: {f: [] for f in (*BASE_SCHEMA.names, "reason", "detail")})

    def add(self, record: int | str, text: str | None, url: str | None = None, path: str | None = None) -> None:
        self._append(self.docs, record, text, url, path)

    def reject(self, record: int | str, reason: str, detail: str, text: str | None = None) -> None:
        self._append(self.rejects, record, text[:MAX_REJECT_TEXT] if text else text, None, None)
        self.rejects["reason"].append(reason)
        self.rejects["detail"].append(detail[:2000])

    def _append(self, cols: dict[str, list], record: int | str, text: str | None, url: str | None,
                path: str | None) -> None:
        src = self.file.source
        cols["id"].append(doc_id(src.name, self.file.name, record))
        cols["source"].append(src.name)
        cols["kind"].append(src.kind)
        cols["text"].append(text)
        cols["url"].append(url)
        cols["path"].append(path if path is not None else self.file.name)

    def full(self) -> bool:
        return len(self.docs["id"]) + len(self.rejects["id"]) >= self.batch_size

    def flush(self) -> ReadBatch | None:
        if not self.docs["id"] and not self.rejects["id"]:
            return None
        docs = pa.Table.from_pydict(self.docs, schema=BASE_SCHEMA)
        rejects = None
        if self.rejects["id"]:
            schema = BASE_SCHEMA.append(pa.field("reason", pa.string())).append(pa.field("detail", pa.string()))
            rejects = pa.Table.from_pydict(self.rejects, schema=schema)
        for cols in (self.docs, self.rejects):
            for v in cols.values():
                v.clear()
        return ReadBatch(docs, rejects)


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]

