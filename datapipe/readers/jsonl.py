"""JSON Lines (optionally gzip/zstd/bz2-compressed): one document per line."""

from __future__ import annotations

import json
from collections.abc import Iterator

from datapipe.readers.base import MAX_REJECT_TEXT, BatchBuilder, InputFile, ReadBatch, describe_error
from datapipe.readers.streams import open_maybe_compressed


def read_jsonl(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    src = file.source
    out = BatchBuilder(file, batch_size)
    lineno = 0
    try:
        with open_maybe_compressed(file.path) as stream:
            for lineno, raw in enumerate(stream, start=1):
                if not raw.strip():
                    continue  # blank lines are not records
                _parse_line(out, lineno, raw, src.text_field, src.url_field)
                if out.full():
                    yield out.flush()  # type: ignore[misc]
    except Exception as exc:  # unreadable or truncated file: the rest of it is one reject
        out.reject(f"L{lineno + 1}-", "unreadable_input",
                   f"reading stopped after line {lineno}: {describe_error(exc)}")
    if (last := out.flush()) is not None:
        yield last


def _parse_line(out: BatchBuilder, lineno: int, raw: bytes, text_field: str, url_field: str | None) -> None:
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
    out.add(record, text, url if isinstance(url, str) else None)
