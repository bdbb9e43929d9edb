"""The reader contract: one input file in, batches of documents (and rejects) out.

A reader never raises for bad data: a malformed record becomes a reject row with a
reason, and a file that cannot be read (or breaks off half-way) becomes one reject
row for the unread rest, so the run goes on and nothing is silently lost.

Strings Arrow cannot store (lone surrogates such as the JSON escape ``\ud800``, which
Python strings may hold but UTF-8 cannot encode) are caught here, in the path every
reader shares: ``flush`` moves such a document to the rejects as ``invalid_unicode``, so
no stage ever sees one and one such record never fails its task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from datapipe.config.limits import DEFAULT_LIMITS, ReadLimits
from datapipe.config.sections import SourceConfig
from datapipe.schema import BASE_SCHEMA, doc_id

MAX_REJECT_TEXT = 65536  # raw bytes kept of a malformed record: enough to debug, bounded
FLUSH_CHARS = 64 << 20  # a batch is full at this much text too: 1,024 records near the record cap would be GBs


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
    # A part of the file (engine/splits.py): readers whose spec declares split points (jsonl, parquet,
    # warc) read only it, numbering records as in the whole file; the others never get a range.
    start: int = 0  # byte offset, or the spec's split unit (first row group for Parquet)
    end: int | None = None  # exclusive; None: to the end
    first_record: int = 0  # the spec's prepass_count before ``start`` (JSONL: newlines, for global line numbers)
    ranged: bool = False


@dataclass
class BatchBuilder:
    """Accumulates documents and rejects row by row and flushes them as Arrow batches."""

    file: InputFile
    batch_size: int
    docs: dict[str, list] = field(default_factory=lambda: {f: [] for f in BASE_SCHEMA.names})
    rejects: dict[str, list] = field(default_factory=lambda: {f: [] for f in (*BASE_SCHEMA.names, "reason", "detail")})

    chars: int = 0  # text held since the last flush

    def add(self, record: int | str, text: str | None, url: str | None = None, path: str | None = None) -> None:
        self._append(self.docs, record, text, url, path)
        if text:
            self.chars += len(text)

    def reject(self, record: int | str, reason: str, detail: str, text: str | None = None) -> None:
        self._append(self.rejects, record, text[:MAX_REJECT_TEXT] if text else text, None, None)
        self.rejects["reason"].append(reason)
        self.rejects["detail"].append(detail[:2000])

    def _append(self, cols: dict[str, list], record: int | str, text: str | None, url: str | None, path: str | None) -> None:
        src = self.file.source
        cols["id"].append(doc_id(src.name, self.file.name, record))
        cols["source"].append(src.name)
        cols["kind"].append(src.kind)
        cols["text"].append(text)
        cols["url"].append(url)
        cols["path"].append(path if path is not None else self.file.name)

    def mark(self) -> tuple[int, int]:
        """Row counts now, to undo a record that failed half-way through being added."""
        return len(self.docs["id"]), len(self.rejects["id"])

    def rollback(self, mark: tuple[int, int]) -> None:
        for lists, n in ((self._doc_lists(), mark[0]), (self._reject_lists(), mark[1])):
            for values in lists:
                del values[n:]

    def _doc_lists(self) -> list[list]:
        """Every per-document column list (subclasses add their provenance columns)."""
        return list(self.docs.values())

    def _reject_lists(self) -> list[list]:
        return list(self.rejects.values())

    def full(self) -> bool:
        return len(self.docs["id"]) + len(self.rejects["id"]) >= self.batch_size or self.chars >= FLUSH_CHARS

    def flush(self) -> ReadBatch | None:
        if not self.docs["id"] and not self.rejects["id"]:
            return None
        try:
            return self._build()
        except (UnicodeEncodeError, pa.ArrowException, TypeError, ValueError, OverflowError):
            self._quarantine()  # rare: only then is each row looked at
            return self._build()

    def _doc_types(self) -> list[pa.DataType]:
        """Arrow types of _doc_lists(), in order (a reject row has the same plus reason and detail)."""
        return list(BASE_SCHEMA.types)

    def _quarantine(self) -> None:
        """Move documents with a value Arrow cannot store to the rejects: a string UTF-8 cannot
        encode (lone surrogates) as ``invalid_unicode``, anything else (a value of the wrong type
        in a provenance column) as ``record_error``. Then make every reject row storable: such
        strings keep the bad code point as a ``\\udXXX`` escape, other bad values become null."""
        doc_cols, types = self._doc_lists(), self._doc_types()
        names = [*self.docs, *getattr(self, "extra_docs", {})]  # ColumnsBuilder's provenance columns
        bad: list[tuple[int, str, str]] = []
        for i in range(len(self.docs["id"])):
            for name, values, typ in zip(names, doc_cols, types):
                problem = _unstorable(values[i], typ)
                if problem is not None:
                    bad.append((i, "invalid_unicode" if problem[0] else "record_error", f"{name}: {problem[1]}"))
                    break
        moved = []
        for i, reason, detail in reversed(bad):  # popped from the end so earlier indices stay valid
            row = [values.pop(i) for values in doc_cols]
            row[3] = row[3][:MAX_REJECT_TEXT] if isinstance(row[3], str) else row[3]  # bounded as in reject()
            moved.append((row, reason, detail))
        for row, reason, detail in reversed(moved):
            self._move_to_rejects(row, reason, detail)
        base = len(self.docs)
        reject_types = [*types[:base], pa.string(), pa.string(), *types[base:]]
        for values, typ in zip(self._reject_lists(), reject_types):
            for j, v in enumerate(values):
                if _unstorable(v, typ) is not None:
                    values[j] = _escaped(v) if isinstance(v, str) and _unencodable(v) else None

    def _move_to_rejects(self, row: list, reason: str, detail: str) -> None:
        """One quarantined document row (in _doc_lists order) becomes a reject row, columns kept."""
        base = len(self.docs)
        for values, v in zip(self.rejects.values(), [*row[:base], reason, detail]):
            values.append(v)
        extra = self._reject_lists()[len(self.rejects) :]
        for values, v in zip(extra, row[base:]):
            values.append(v)

    def _build(self) -> ReadBatch:
        docs = pa.Table.from_pydict(self.docs, schema=BASE_SCHEMA)
        rejects = None
        if self.rejects["id"]:
            schema = BASE_SCHEMA.append(pa.field("reason", pa.string())).append(pa.field("detail", pa.string()))
            rejects = pa.Table.from_pydict(self.rejects, schema=schema)
        for cols in (self.docs, self.rejects):
            for v in cols.values():
                v.clear()
        self.chars = 0
        return ReadBatch(docs, rejects)


def _unencodable(value: object) -> str | None:
    """Where a string cannot be encoded as UTF-8 (lone surrogates), or None."""
    if not isinstance(value, str) or value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{exc.reason} ({value[exc.start]!r} at character {exc.start})"
    return None


def _unstorable(value: object, typ: pa.DataType) -> tuple[bool, str] | None:
    """Why Arrow cannot store ``value`` as ``typ``: (is it an encoding problem, detail), or None."""
    where = _unencodable(value)
    if where is not None:
        return True, where
    if value is None or isinstance(value, str) and pa.types.is_string(typ):
        return None
    try:
        pa.array([value], typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        return False, describe_error(exc)
    return None


def _escaped(value: str) -> str:
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


class LimitExceeded(Exception):
    """One input passed a cap: ``limits.max_file_decompressed_bytes`` (a decompression bomb), an
    archive's decompressed size, a paper's includes or macro expansions. Raised deep in a reader's
    decoding and caught by the reader itself, whose reject for the rest of the input carries
    ``reason`` and ``detail``: never seen by a user or a caller."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]
