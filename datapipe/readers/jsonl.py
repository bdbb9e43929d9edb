"""JSON Lines (optionally gzip/zstd/bz2-compressed): one document per line.

Every line is read with a bounded buffer (``limits.max_record_bytes``), checked for nesting
depth before it is parsed (``limits.max_json_depth``), and anything that goes wrong with one
line becomes a reject of that line: the lines after it are still read.

Split (engine/splits.py): a plain JSONL is cut into byte ranges anywhere. A range owns the lines
that *start* in it (Hadoop style): it skips the partial line at its start and reads through the
line straddling its end (``streams.LineRange``), so planning reads nothing. Record ids use global
line numbers (``#L<n>``), so a range needs the number of newlines before it: a parallel pre-pass
counts each range's newlines once (``prepass_count``) and a range adds up the counts of the ranges
before it. Compressed JSONL (.gz/.zst/.bz2/.xz) cannot be entered mid-stream without an index: one task.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from datapipe.readers.base import MAX_REJECT_TEXT, BatchBuilder, InputFile, LimitExceeded, ReadBatch, describe_error
from datapipe.readers.code_repos import TableOptions
from datapipe.readers.jsondepth import depth_exceeds, may_exceed_depth, must_check_before_parsing
from datapipe.readers.rows import add_table_row, row_builder, table_options, text_field
from datapipe.readers.spec import ReaderSpec
from datapipe.readers.streams import (
    ByteStream,
    LineRange,
    LineTooLong,
    bounded_lines,
    count_newlines,
    open_maybe_compressed,
)
from datapipe.storage.uri import PROBE_BUFFER

COMPRESSED = (".gz", ".zst", ".bz2", ".xz")
PROBE_MAX_BYTES = 256 << 20  # what validate's field probe reads of a file at most (decompressed)


def read_jsonl(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    src = file.source
    limits = file.limits
    opts = table_options(file)
    rows = row_builder(file, batch_size)  # code/paper rows carry their kind's columns
    out = rows or BatchBuilder(file, batch_size)
    field = text_field(file, opts)

    def add(record: str, obj: dict, text: str, url: str | None) -> None:
        if rows is not None:
            add_table_row(rows, file, opts, record, obj, text, url)
        else:
            out.add(record, text, url)

    lineno = file.first_record  # lines before this range (0 for a whole file): numbers are global
    try:
        with _open(file) as stream:
            if isinstance(stream, LineRange) and stream.skipped:
                lineno += 1  # the partial line skipped at the start is the previous range's
            lines = bounded_lines(stream, limits.max_record_bytes, limits.max_file_decompressed_bytes, head=MAX_REJECT_TEXT)
            first = lineno + 1
            for lineno, raw in enumerate(lines, start=first):
                if isinstance(raw, LineTooLong):
                    out.reject(
                        f"L{lineno}",
                        "record_too_large",
                        f"line of {raw.size:,} bytes > limits.max_record_bytes={limits.max_record_bytes:,}",
                        raw.head.decode("utf-8", "replace"),
                    )
                elif raw and not raw.isspace():  # blank lines are not records (isspace stops early; strip copies)
                    _parse_line(out, lineno, raw, field, src.url_field, limits.max_json_depth, add)
                if out.full():
                    yield out.flush()  # type: ignore[misc]
    except LimitExceeded as exc:  # a decompression bomb: the rest of the file is one reject
        out.reject(f"L{lineno + 1}-", exc.reason, f"reading stopped after line {lineno}: {exc.detail}")
    except Exception as exc:  # unreadable or truncated file: the rest of it is one reject
        out.reject(f"L{lineno + 1}-", "unreadable_input", f"reading stopped after line {lineno}: {describe_error(exc)}")
    if (last := out.flush()) is not None:
        yield last


def _open(file: InputFile) -> ByteStream | LineRange:
    """The whole file, or the lines that start in its byte range (a split plain JSONL)."""
    if file.ranged:
        return LineRange(str(file.path), file.start, file.end)
    return open_maybe_compressed(file.path)


def _parse_line(
    out: BatchBuilder,
    lineno: int,
    raw: bytes,
    text_field: str,
    url_field: str | None,
    max_depth: int,
    add: Callable[[str, dict, str, str | None], None],
) -> None:
    record = f"L{lineno}"
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte order mark (Windows tools write one at the start of a file)
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        out.reject(record, "invalid_utf8", describe_error(exc), raw[:MAX_REJECT_TEXT].decode("utf-8", "replace"))
        return
    deep = f"JSON nesting deeper than limits.max_json_depth={max_depth}"
    if must_check_before_parsing() and may_exceed_depth(raw, max_depth) and _raw_depth_exceeds(raw, max_depth):
        out.reject(record, "too_deeply_nested", deep, line)
        return
    try:
        obj = json.loads(line)
    except RecursionError:  # deeper than the parser can recurse (about 1,000 levels)
        out.reject(record, "too_deeply_nested", deep, line)
        return
    except ValueError as exc:
        out.reject(record, "malformed_json", describe_error(exc), line)
        return
    if depth_exceeds(obj, max_depth):
        out.reject(record, "too_deeply_nested", deep, line)
        return
    if not isinstance(obj, dict):
        out.reject(record, "malformed_record", f"expected a JSON object, got {type(obj).__name__}", line)
        return
    text = obj.get(text_field)
    if text is None:
        out.reject(record, "missing_text_field", f"no {text_field!r} field; fields: {sorted(obj)[:20]}", line)
        return
    if not isinstance(text, str):
        out.reject(record, "malformed_record", f"{text_field!r} is {type(text).__name__}, not a string", line)
        return
    url = obj.get(url_field) if url_field else None
    mark = out.mark()
    try:
        add(record, obj, text, url if isinstance(url, str) else None)
    except Exception as exc:  # a bug or surprise in one record's columns must not end the file
        out.rollback(mark)
        out.reject(record, "record_error", describe_error(exc), line)


def _raw_depth_exceeds(raw: bytes, max_depth: int) -> bool:
    """Exact depth of the raw text (strings skipped), for when the parser's recursion is not guarded."""
    depth = 0
    in_string = escaped = False
    for b in raw:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x7B, 0x5B):
            depth += 1
            if depth > max_depth:
                return True
        elif b in (0x7D, 0x5D):
            depth -= 1
    return False


def split_points(path: Path, size: int, target: int, cuts: list[int]) -> list[int]:
    """Any byte cut of a plain file will do (a range owns the lines starting in it); none of a compressed one."""
    return [0] if path.name.lower().endswith(COMPRESSED) else cuts


def first_fields(path: Path, max_record_bytes: int, records: int = 20) -> set[str] | None:
    """Field names of the first ``records`` JSON objects (None when no line is one).

    Memory is bounded as the reader's is: a line is held only up to ``max_record_bytes`` (a longer
    one is skipped chunk by chunk, ``bounded_lines``), so one 1.5 GiB line in a small gzip costs
    ``max_record_bytes`` + a chunk, not gigabytes; and the probe reads (decompresses) at most
    ``PROBE_MAX_BYTES`` or 4 records' worth, whichever is more (about a second), then decides on
    what it saw.
    """
    names: set[str] = set()
    seen = 0
    with open_maybe_compressed(path, PROBE_BUFFER) as stream:  # an object: its first bytes only
        try:
            cap = max(PROBE_MAX_BYTES, 4 * max_record_bytes)
            # read PROBE_BUFFER at a time: an object in object storage is asked for its first bytes only
            for raw in bounded_lines(stream, max_record_bytes, cap, head=0, chunk=PROBE_BUFFER):
                if isinstance(raw, LineTooLong):
                    continue  # the reader rejects it as record_too_large: it names no field
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    names |= set(obj)
                    seen += 1
                    if seen >= records:
                        break
        except LimitExceeded:
            pass  # read enough: decide on the records seen so far
    return names if seen else None


SPEC = ReaderSpec(
    "jsonl",
    read_jsonl,
    TableOptions,
    suffixes=(".jsonl.gz", ".jsonl.zst", ".jsonl.bz2", ".jsonl.xz", ".json.gz", ".jsonl", ".ndjson", ".json"),
    streamed=True,
    split_points=split_points,
    prepass_count=count_newlines,
    named_fields=True,
    probe_fields=first_fields,
)
