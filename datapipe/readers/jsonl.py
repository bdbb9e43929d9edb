"""JSON Lines (optionally gzip/zstd/bz2-compressed): one document per line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from datapipe.readers.base import MAX_REJECT_TEXT, BatchBuilder, InputFile, ReadBatch, describe_error
from datapipe.readers.rows import add_table_row, row_builder, table_options, text_field
from datapipe.readers.streams import open_maybe_compressed


def read_jsonl(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    src = file.source
    opts = table_options(file)
    rows = row_builder(file, batch_size)  # code/paper rows carry their kind's columns
    out = rows or BatchBuilder(file, batch_size)
    field = text_field(file, opts)

    def add(record: str, obj: dict, text: str, url: str | None) -> None:
        if rows is not None:
            add_table_row(rows, file, opts, record, obj, text, url)
        else:
            out.add(record, text, url)

    lineno = 0
    try:
        with open_maybe_compressed(file.path) as stream:
            for lineno, raw in enumerate(stream, start=1):
                if not raw.strip():
                    continue  # blank lines are not records
                _parse_line(out, lineno, raw, field, src.url_field, add)
                if out.full():
                    yield out.flush()  # type: ignore[misc]
    except Exception as exc:  # unreadable or truncated file: the rest of it is one reject
        out.reject(f"L{lineno + 1}-", "unreadable_input",
                   f"reading stopped after line {lineno}: {describe_error(exc)}")
    if (last := out.flush()) is not None:
        yield last


def _parse_line(out: BatchBuilder, lineno: int, raw: bytes, text_field: str, url_field: str | None,
                add: Callable[[str, dict, str, str | None], None]) -> None:
    record = f"L{lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        out.reject(record, "invalid_utf8", describe_error(exc), raw[:MAX_REJECT_TEXT].decode("utf-8", "replace"))
        return
    try:
        obj = json.loads(line)
    except ValueError as exc:
        out.reject(record, "malformed_json", describe_error(exc), line)
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
    add(record, obj, text, url if isinstance(url, str) else None)
