"""Opening input files as byte streams, decompressing by extension."""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def open_maybe_compressed(path: Path) -> IO[bytes]:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith(".zst"):
        import pyarrow as pa

        return pa.input_stream(str(path), compression="zstd")  # type: ignore[return-value]
    return path.open("rb")


class LineTooLong:
    """Stands in for a line longer than the cap: its head (for the reject row) and its full size."""

    __slots__ = ("head", "size")

    def __init__(self, head: bytes, size: int) -> None:
        self.head = head
        self.size = size


class InputTooLarge(Exception):
    """More bytes were decompressed from one input file than `limits.max_file_decompressed_bytes`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit:,} bytes decompressed from this file "
                         f"(limits.max_file_decompressed_bytes); the rest is not read")
        self.limit = limit


CHUNK = 1 << 20  # read size: large enough that splitting in C dominates, small enough to bound memory


def bounded_lines(stream: IO[bytes], max_line: int, max_total: int, head: int = 65536,
                  chunk: int = CHUNK) -> Iterator[bytes | LineTooLong]:
    """The lines of a byte stream (without their b"\\n"), never holding more than ``max_line`` bytes
    of one line nor ``chunk`` bytes of input beyond it.

    A line longer than ``max_line`` comes out as one ``LineTooLong`` (its first ``head`` bytes and
    its size) after the rest of it has been skipped chunk by chunk, so a 1.5 GiB line costs
    ``max_line`` + ``chunk`` bytes of memory, not 1.5 GiB. More than ``max_total`` bytes read raises
    ``InputTooLarge`` (a decompression bomb). Cost is linear in the input.
    """
    total = 0
    pending: list[bytes] = []  # pieces of the current line, before its newline
    pending_size = 0
    skipping: LineTooLong | None = None  # the current line is over the cap: counted, not kept
    for data in _blocks(stream, chunk):
        total += len(data)
        if total > max_total:
            raise InputTooLarge(max_total)
        pieces = data.split(b"\n")  # in C: the Python loop below does little per line
        rest = pieces.pop()  # after the last newline: the start of a line that goes on
        for piece in pieces:
            if skipping is not None:
                skipping.size += len(piece)
                yield skipping
                skipping = None
            elif pending:
                pending.append(piece)
                pending_size += len(piece)
                line = b"".join(pending)
                pending, pending_size = [], 0
                yield line if len(line) <= max_line else LineTooLong(line[:head], len(line))
            elif len(piece) <= max_line:
                yield piece
            else:
                yield LineTooLong(piece[:head], len(piece))
        if not rest:
            continue
        if skipping is not None:
            skipping.size += len(rest)
        elif pending_size + len(rest) > max_line:
            skipping = LineTooLong(_head([*pending, rest], head), pending_size + len(rest))
            pending, pending_size = [], 0
        else:
            pending.append(rest)
            pending_size += len(rest)
    if skipping is not None:
        yield skipping
    elif pending:
        yield b"".join(pending)


def _head(pieces: list[bytes], n: int) -> bytes:
    """The first n bytes of the pieces joined, without joining them all."""
    out, size = [], 0
    for piece in pieces:
        if size >= n:
            break
        out.append(piece[:n - size])
        size += len(out[-1])
    return b"".join(out)


def _blocks(stream: IO[bytes], size: int) -> Iterator[bytes]:
    """Blocks of about ``size`` bytes. Built from read1() calls (what the decompressor has ready),
    so when a stream breaks off (truncated gzip) the bytes before the break still come out
    before the error: read(size) would drop the whole block."""
    read1 = getattr(stream, "read1", None)
    if read1 is None:
        while data := stream.read(size):
            yield data
        return
    while True:
        parts: list[bytes] = []
        have = 0
        try:
            while have < size:
                piece = read1(size - have)
                if not piece:
                    break
                parts.append(piece)
                have += len(piece)
        except Exception:
            if parts:
                yield b"".join(parts)
            raise
        if not parts:
            return
        yield parts[0] if len(parts) == 1 else b"".join(parts)
        if have < size:
            return
