"""Where a WARC/WET/WAT file may be cut into ranges (engine/splits.py asks through the reader spec).

Gzipped per record: cuts move forward to the next gzip member whose header checks out and whose
first bytes decompress to ``WARC/1.``; ids are member offsets, so a range ``[start, end)`` owns
the records whose member starts in it. Plain WARC: cuts move to the next ``WARC/1.`` header at a
line start whose Content-Length lands on the next header (or the end). A file gzipped as one
member (or an ARC file) has no such points: one task. Known limit: in a hostile file whose record
lies about its Content-Length across a cut, the whole-file read may frame the bytes around the cut
differently (the checked boundary makes this unlikely, not impossible).

On object storage every window is a ranged read (``storage.open_input``), nothing read ahead.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from datapipe.readers.streams import SCAN
from datapipe.storage.uri import open_input

_GZIP = b"\x1f\x8b\x08"
_PROBE = 16 << 10  # first window after a cut (a record boundary is usually that close)


def split_points(path: Path, size: int, target: int, cuts: list[int]) -> list[int]:
    """Record boundaries at or after each of ``cuts`` (the first is 0)."""
    with open_input(path, buffer=0) as f:  # on a store: one ranged read per window, nothing read ahead
        head = f.read(64)
        gzipped = head.startswith(b"\x1f\x8b")
        if _arc_like(head, gzipped):
            return [0]
        bounds = [0]
        for cut in cuts[1:]:
            if cut <= bounds[-1]:
                continue
            b = _next_member(f, cut, size) if gzipped else _next_header(f, cut, size)
            if b is None:
                break
            if b > bounds[-1]:
                bounds.append(b)
        return bounds


def _arc_like(head: bytes, gzipped: bool) -> bool:
    if gzipped:
        try:
            head = zlib.decompressobj(31).decompress(head, 16)
        except zlib.error:
            return True  # not something we can enter mid-file safely
    return head.startswith(b"filedesc://")


def _windows(f: IO[bytes], start: int, size: int, overlap: int) -> Iterator[tuple[int, int, bytes]]:
    """(position, width, bytes) of consecutive windows from ``start``: a match is looked for in the
    first ``width`` bytes, the ``overlap`` after them lets one that straddles be found. Windows
    start small and double up to SCAN: a boundary is usually near the cut, and on object storage
    every byte read is fetched."""
    pos, width = start, _PROBE
    while pos < size:
        f.seek(pos)
        data = f.read(width + overlap)
        if not data:
            return
        yield pos, width, data
        pos += width
        width = min(width * 2, SCAN)


def _next_member(f: IO[bytes], cut: int, size: int) -> int | None:
    """The first offset >= cut where a gzip member starts that decompresses to a WARC header."""
    for pos, width, data in _windows(f, cut, size, 4096):
        i = data.find(_GZIP)
        while 0 <= i < width:
            try:  # the window holds the member's first 4 KiB (its overlap): no second read
                out = zlib.decompressobj(31).decompress(data[i : i + 4096], 16)
            except zlib.error:
                out = b""
            if out.startswith(b"WARC/1."):
                return pos + i
            i = data.find(_GZIP, i + 1)
    return None


def _next_header(f: IO[bytes], cut: int, size: int) -> int | None:
    """The first offset >= cut of a ``WARC/1.`` line whose Content-Length leads to the next header."""
    for pos, width, data in _windows(f, cut - 1, size, 8192):
        i = data.find(b"\nWARC/1.")
        while 0 <= i < width:
            at = pos + i + 1
            if at >= cut and _header_chains(f, at, size):
                return at
            i = data.find(b"\nWARC/1.", i + 1)
    return None


def _header_chains(f: IO[bytes], at: int, size: int) -> bool:
    f.seek(at)
    block = f.read(8192)  # a WARC header is rarely longer; up to 64 KiB when it is
    end = block.find(b"\r\n\r\n")
    if end < 0:
        f.seek(at)
        block = f.read(65536)
        end = block.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = None
    for line in block[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
    if length is None:
        return False
    nxt = at + end + 4 + length
    if nxt >= size - 4:
        return True
    f.seek(nxt)
    return f.read(64).lstrip(b"\r\n").startswith(b"WARC/1.")
