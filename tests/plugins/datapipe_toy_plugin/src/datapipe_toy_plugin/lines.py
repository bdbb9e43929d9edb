"""The ``lines`` input format (``.lines`` files): one document per line; a blank line is no record."""

from __future__ import annotations

from collections.abc import Iterator

from datapipe.readers.base import BatchBuilder, InputFile, ReadBatch, describe_error
from datapipe.readers.spec import ReaderSpec


def read_lines(file: InputFile, batch_size: int) -> Iterator[ReadBatch]:
    out = BatchBuilder(file, batch_size)
    with open(file.path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            try:
                out.add(f"L{n}", line.decode("utf-8"))
            except UnicodeDecodeError as exc:  # bad input is a reject with a reason, never a crash
                out.reject(f"L{n}", "invalid_utf8", describe_error(exc), line.decode("utf-8", "replace"))
            if out.full():
                yield out.flush()  # type: ignore[misc]
    if (last := out.flush()) is not None:
        yield last


SPEC = ReaderSpec("lines", read_lines, suffixes=(".lines",))
