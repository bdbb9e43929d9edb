"""Opening input files as byte streams, decompressing by extension.

An input in object storage (named by its mirror path, see ``datapipe/storage/uri.py``) is read in
place from the store through :func:`datapipe.storage.uri.open_input`: ranged reads, no download."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from datapipe.readers.base import LimitExceeded
from datapipe.storage.input_reads import recording
from datapipe.storage.uri import READ_BUFFER, open_input, remote_of


class Readable(Protocol):
    """What reading lines or blocks needs of a stream: ``read`` (``read1`` is used when there)."""

    def read(self, size: int = ..., /) -> bytes: ...


class ByteStream(Readable, Protocol):
    """A readable binary stream: a file, a GzipFile / BZ2File / LZMAFile, a pyarrow NativeFile.
    Not ``IO[bytes]``: that is a class, and GzipFile (a BufferedIOBase) does not derive from it."""

    def close(self) -> object: ...

    def __iter__(self) -> Iterator[bytes]: ...

    def __enter__(self) -> ByteStream: ...

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /) -> object: ...


def open_maybe_compressed(path: Path, buffer: int | None = None) -> ByteStream:
    """``buffer``: bytes per request for an object in object storage (a small one when only the
    first records are read). In a task recording its reads (storage/input_reads.py) a local file
    is opened through ``open_input`` too, so the (compressed) bytes read are hashed."""
    if remote_of(path) is not None or recording():
        return _remote_maybe_compressed(path, buffer or READ_BUFFER)
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith(".zst"):
        import pyarrow as pa

        return pa.input_stream(str(path), compression="zstd")
    return path.open("rb")


def _remote_maybe_compressed(path: Path, buffer: int) -> ByteStream:
    raw = open_input(path, buffer)
    name = path.name.lower()
    if name.endswith(".gz"):
        return _Owning(gzip.GzipFile(fileobj=raw, mode="rb"), raw)
    if name.endswith(".bz2"):
        return _Owning(bz2.BZ2File(raw, "rb"), raw)
    if name.endswith(".xz"):
        return _Owning(lzma.LZMAFile(raw, "rb"), raw)
    if name.endswith(".zst"):
        import pyarrow as pa

        return _Owning(pa.input_stream(raw, compression="zstd"), raw)
    return raw


class _Owning:
    """A decompressing stream that also closes the object stream under it (given a file object,
    gzip/bz2/lzma leave it open)."""

    def __init__(self, stream: Any, raw: ByteStream) -> None:
        self._stream, self._raw = stream, raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._stream)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._raw.close()

    def __enter__(self) -> _Owning:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LineTooLong:
    """Stands in for a line longer than the cap: its head (for the reject row) and its full size."""

    __slots__ = ("head", "size")

    def __init__(self, head: bytes, size: int) -> None:
        self.head = head
        self.size = size


CHUNK = 1 << 20  # read size: large enough that splitting in C dominates, small enough to bound memory


def bounded_lines(
    stream: Readable, max_line: int, max_total: int, head: int = 65536, chunk: int = CHUNK
) -> Iterator[bytes | LineTooLong]:
    """The lines of a byte stream (without their b"\\n"), never holding more than ``max_line`` bytes
    of one line nor ``chunk`` bytes of input beyond it.

    A line longer than ``max_line`` comes out as one ``LineTooLong`` (its first ``head`` bytes and
    its size) after the rest of it has been skipped chunk by chunk, so a 1.5 GiB line costs
    ``max_line`` + ``chunk`` bytes of memory, not 1.5 GiB. More than ``max_total`` bytes read raises
    ``LimitExceeded`` (``input_too_large``: a decompression bomb). Cost is linear in the input.
    """
    total = 0
    pending: list[bytes] = []  # pieces of the current line, before its newline
    pending_size = 0
    skipping: LineTooLong | None = None  # the current line is over the cap: counted, not kept
    for data in _blocks(stream, chunk):
        total += len(data)
        if total > max_total:
            raise LimitExceeded(
                "input_too_large",
                f"more than {max_total:,} bytes decompressed from this file (limits.max_file_decompressed_bytes); "
                f"the rest is not read",
            )
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
        out.append(piece[: n - size])
        size += len(out[-1])
    return b"".join(out)


def _blocks(stream: Readable, size: int) -> Iterator[bytes]:
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


# --- byte ranges of a plain file (split inputs, engine/splits.py) --------------------

SCAN = 1 << 20  # bytes read at a time when looking for a record boundary or counting newlines
TAIL = 64 << 10  # bytes read at a time past a range's end, looking for the end of its last line


def count_newlines(path: str, start: int, end: int | None) -> int:
    """Newline bytes in ``[start, end)``: one range's share of the line-numbering pre-pass."""
    n = 0
    with open_input(path, stop=end) as f:
        f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            data = f.read(SCAN * 8 if left is None else min(SCAN * 8, left))
            if not data:
                break
            n += data.count(b"\n")
            if left is not None:
                left -= len(data)
    return n


class LineRange:
    """A binary stream over the lines of a JSONL file that start in ``[start, end)``.

    ``skipped`` tells whether a partial line was skipped at the start (then the first line's
    number is one more than the newlines before ``start``)."""

    def __init__(self, path: str, start: int, end: int | None) -> None:
        self.f = open_input(path, stop=end)  # a local file, or an object read in place (ranged reads)
        # One underlying read at most per call (read1): on a store, read() would keep requesting
        # past the range's end to fill its size, and a seek back would fetch the range again.
        self._read = getattr(self.f, "read1", self.f.read)
        self._pending = b""  # read past the skipped partial line, served first
        self.end = end
        self.skipped = False
        self.pos = start
        self._tail = False  # past ``end``: reading the rest of the straddling line
        self._done = False
        if start > 0:
            self.f.seek(start - 1)
            if self.f.read(1) != b"\n":
                self.skipped = True
                self._skip_partial()

    def _skip_partial(self) -> None:
        while True:
            data = self._read(TAIL)  # a line's rest is usually short: no read far beyond it
            if not data:
                self._done = True
                return
            i = data.find(b"\n")
            if i >= 0:
                self.pos += i + 1
                self._pending = data[i + 1 :]  # kept, not sought back to: no second fetch of it
                break
            self.pos += len(data)
        if self.end is not None and self.pos >= self.end:
            self._done = True  # the line that starts here belongs to the next range

    def read(self, size: int = SCAN) -> bytes:
        if self._done:
            return b""
        if self.end is not None and not self._tail and self.pos >= self.end:
            self._tail = True
        if self._tail:  # only up to the newline ending the line that started before ``end``
            data = self._next(min(size, TAIL))  # small reads: a file on a store is fetched as read
            i = data.find(b"\n")
            if i >= 0 or not data:
                self._done = True
                data = data[: i + 1] if i >= 0 else data
            self.pos += len(data)
            return data
        want = size if self.end is None else min(size, self.end - self.pos)
        data = self._next(want)
        if not data:
            self._done = True
        self.pos += len(data)
        if self.end is not None and self.pos >= self.end and data.endswith(b"\n"):
            self._done = True  # the range ends exactly at a line start
        return data

    def _next(self, n: int) -> bytes:
        if self._pending:
            data, self._pending = self._pending[:n], self._pending[n:]
            return data
        return self._read(n)

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> LineRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each JSON object line of a (gzipped) JSONL file; other lines are
    skipped. For tools reading example text (train-tokenizer, train-classifier), not for pipeline
    inputs, where every bad line must become a reject (readers/jsonl.py)."""
    opener: Any = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield n, rec
