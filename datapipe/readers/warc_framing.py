"""WARC record framing that survives lying headers, garbage and broken gzip members.

FastWARC trusts ``Content-Length``: a record whose length lies either swallows the records
after it (length too large) or stops the file with ``Invalid WARC header`` (too small,
negative, not a number). Here every record's end is checked: after ``Content-Length`` bytes
must come the ``\\r\\n\\r\\n`` terminator and then the next ``WARC/1.x`` header or the end of
the file. When they do not, the record is flagged and reading resynchronises on the next line
that starts a WARC header (searched from the start of the lying record's block, so records a
too-large length would have swallowed are read). Bytes between records that are no record
are reported once, as garbage.

Compressed files are read one gzip member at a time (WARC files are gzipped per record):
a corrupt member becomes a hole in the decompressed stream; only the record(s) it touches are
lost, and reading goes on at the next member's magic bytes. Memory stays bounded by the
per-record cap whatever the headers say: payloads over the cap are skipped, not held.
"""

from __future__ import annotations

import bisect
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

from datapipe.readers.base import LimitExceeded

CHUNK = 1 << 16
MAX_HEADER_BYTES = 1 << 16  # a WARC header block longer than this is not a header
_HEADER_AT = re.compile(rb"WARC/1\.[01]\r?\n[!-9;-~]+:")  # a version line, then a header field


def find_header(buf: bytearray, start: int, stop: int | None = None) -> int:
    """Index in ``buf`` of the first line at or after ``start`` that starts a WARC header, or -1.
    A memchr-speed find of the literal, then a check at each hit: scanning a 60 MB payload for the
    next record costs milliseconds (a regex with a line-start alternation would try every byte)."""
    i = buf.find(b"WARC/1.", start, stop)
    while i >= 0:
        if (i == 0 or buf[i - 1] == 0x0A) and _HEADER_AT.match(buf, i):
            return i
        i = buf.find(b"WARC/1.", i + 1, stop)
    return -1


_GZIP_MAGIC = b"\x1f\x8b\x08"


@dataclass
class Hole:
    """A corrupt gzip member: decompressed output stops at ``at``; reading went on at the next member."""

    at: int  # decompressed offset where the member's output broke off
    member: int  # compressed offset of the broken member
    detail: str
    reported: bool = False


class DecompressedStream:
    """The decompressed bytes of a plain or per-record-gzipped file, with the compressed start of
    the gzip member that produced each byte (what a CDX index points at) and the holes left by
    corrupt members. Keeps only a sliding window in memory."""

    def __init__(self, f: IO[bytes], gzipped: bool, max_total: int = 1 << 62, start: int = 0) -> None:
        self.f, self.gzipped, self.max_total = f, gzipped, max_total  # max_total: limits.max_file_decompressed_bytes
        # start > 0: a split file's range begins at this record boundary (a member start when
        # gzipped). Plain files keep file offsets as positions, so record ids match a whole read.
        f.seek(start)
        self.total = 0
        self.buf = bytearray()
        self.base = 0 if gzipped else start  # decompressed offset of buf[0]
        self.eof = False
        self.holes: list[Hole] = []
        self._starts: list[int] = [0]  # decompressed offsets where a member starts ...
        self._members: list[int] = [start if gzipped else 0]  # ... and that member's compressed offset
        self._comp_pos = start if gzipped else 0  # compressed offset of the next unread input byte
        self._d: zlib._Decompress | None = zlib.decompressobj(31) if gzipped else None
        self._member_start = start if gzipped else 0
        self._pending = b""  # compressed input not yet fed

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def member_of(self, pos: int) -> int:
        """Compressed offset of the member holding decompressed byte ``pos`` (``pos`` for plain files)."""
        if not self.gzipped:
            return pos
        return self._members[bisect.bisect_right(self._starts, pos) - 1]

    def fill(self, upto: int) -> None:
        """Read until the window reaches decompressed offset ``upto`` or the file ends."""
        while self.end < upto and not self.eof:
            self._more()

    def discard(self, before: int) -> None:
        """Forget the bytes before decompressed offset ``before``."""
        n = min(before, self.end) - self.base
        if n > 0:
            del self.buf[:n]
            self.base += n
        if self.gzipped and len(self._starts) > 1024:  # keep the member map short
            i = bisect.bisect_right(self._starts, self.base) - 1
            if i > 0:
                del self._starts[:i], self._members[:i]

    def rewind(self, pos: int) -> None:
        """Go back to decompressed offset ``pos`` after it was discarded: seek to the start of the
        gzip member holding it (the byte itself for plain files) and read forward again. Used once
        per lying record whose true successor lay inside a payload too large to keep."""
        if pos >= self.base:
            return
        i = bisect.bisect_right(self._starts, pos) - 1 if self.gzipped else 0
        comp, dstart = (self._members[i], self._starts[i]) if self.gzipped else (pos, pos)
        if self.gzipped and i < 0:
            raise ValueError(f"cannot go back to offset {pos}: its gzip member is no longer known")
        self.f.seek(comp)
        self.buf, self.base, self.eof = bytearray(), dstart, False
        self.holes = [h for h in self.holes if h.at < dstart]
        if self.gzipped:
            del self._starts[i + 1 :], self._members[i + 1 :]
            self._comp_pos = self._member_start = comp
            self._d, self._pending = zlib.decompressobj(31), b""
        self.fill(pos)
        self.discard(pos)

    def get(self, start: int, stop: int) -> bytes:
        return bytes(self.buf[start - self.base : stop - self.base])

    def find(self, needle: bytes, start: int, stop: int | None = None) -> int:
        i = self.buf.find(needle, max(start - self.base, 0), None if stop is None else stop - self.base)
        return -1 if i < 0 else i + self.base

    def holes_in(self, start: int, stop: int) -> list[Hole]:
        return [h for h in self.holes if start <= h.at < stop and not h.reported]

    def _more(self) -> None:
        if not self.gzipped:
            data = self.f.read(CHUNK)
            if not data:
                self.eof = True
            self.buf += data
            return
        data = self._pending or self.f.read(CHUNK)
        self._pending = b""
        if not data:
            if self._d is not None and self._started():  # the file ends inside a member
                self._hole(f"gzip member at offset {self._member_start} ends early (file truncated)")
            self.eof = True
            return
        d = self._d
        assert d is not None
        try:
            out = d.decompress(data)
        except zlib.error as exc:
            if self._comp_pos == self._member_start and self._only_zeros(data):
                self.eof = True  # zero padding after the last member (some writers align files): not data
                return
            self._hole(f"gzip member at offset {self._member_start} is corrupt: {exc}")
            self._resync_member(data)
            return
        self.buf += out
        self.total += len(out)
        if self.total > self.max_total:  # a decompression bomb: stop (the caller rejects the rest)
            raise LimitExceeded(
                "input_too_large", f"more than limits.max_file_decompressed_bytes {self.max_total} bytes decompressed"
            )
        if d.eof:  # member done: the rest of this chunk starts the next member
            used = len(data) - len(d.unused_data)
            self._comp_pos += used
            self._pending = d.unused_data
            self._new_member()
        else:
            self._comp_pos += len(data)

    def _only_zeros(self, data: bytes) -> bool:
        while data:
            if data.strip(b"\x00"):
                return False
            data = self.f.read(CHUNK)
        return True

    def _started(self) -> bool:
        return self._comp_pos > self._member_start

    def _new_member(self) -> None:
        self._d = zlib.decompressobj(31)
        self._member_start = self._comp_pos
        if self._starts[-1] == self.end:
            self._members[-1] = self._comp_pos
        else:
            self._starts.append(self.end)
            self._members.append(self._comp_pos)

    def _hole(self, detail: str) -> None:
        self.holes.append(Hole(self.end, self._member_start, detail))

    def _resync_member(self, data: bytes) -> None:
        """Skip to the next gzip magic after the broken member's start (in this chunk or later ones)."""
        # Search from the chunk start + 1 when the broken member began in this chunk, else from 0.
        offset_in_chunk = max(self._member_start + 1 - self._comp_pos, 0)
        window = data
        pos = self._comp_pos
        while True:
            i = window.find(_GZIP_MAGIC, offset_in_chunk)
            if i >= 0:
                self._comp_pos = pos + i
                self._pending = window[i:]
                self._new_member()
                return
            keep = window[-2:]
            more = self.f.read(CHUNK)
            if not more:
                self._comp_pos = pos + len(window)
                self._d = None  # nothing left to decompress
                self._pending = b""
                self.eof = True
                return
            pos += len(window) - len(keep)
            window = keep + more
            offset_in_chunk = 0


@dataclass
class Framed:
    """One framed WARC record, or a stretch of bytes that is not one (``garbage``)."""

    start: int  # decompressed offset of the record (or garbage) start
    member: int  # compressed offset of its gzip member
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    payload: bytes | None = None  # the block, when read (None: not needed, or over the cap)
    length: int = 0  # the block length actually found
    problem: str | None = None  # why the framing is wrong (the record is then rejected)
    too_large: bool = False
    garbage: bool = False
    corrupt_member: bool = False  # garbage that is a gzip member which does not decompress


def _parse_header(raw: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    last = None
    for line in raw.decode("utf-8", "replace").splitlines()[1:]:
        if line[:1] in (" ", "\t") and last is not None:
            headers[last] += " " + line.strip()  # folded continuation line
            continue
        name, sep, value = line.partition(":")
        if sep:
            last = name.strip().lower()
            headers[last] = value.strip()
    return headers


class WarcFramer:
    """Iterates framed records over a DecompressedStream, checking each record's end."""

    def __init__(self, stream: DecompressedStream, max_bytes: int, need_payload: Callable[[dict[str, str]], bool]) -> None:
        self.s, self.max_bytes, self.need_payload = stream, max_bytes, need_payload

    def _skip_ws(self, pos: int) -> int:
        s = self.s
        while True:
            s.fill(pos + 64)
            window = s.buf[pos - s.base : pos - s.base + 64]
            skipped = len(window) - len(window.lstrip(b"\r\n\t "))
            pos += skipped
            if skipped < len(window) or not window:
                return pos

    def next_header(self, pos: int) -> int:
        """Offset of the next line starting a WARC header at or after ``pos`` (the end of the file
        when there is none), reading on with bounded memory."""
        s = self.s
        scan = max(pos, s.base)
        while True:
            s.fill(scan + CHUNK)
            i = find_header(s.buf, scan - s.base)
            if i >= 0 and (s.end - (i + s.base) >= 64 or s.eof):
                return i + s.base
            if s.eof:
                return s.end
            scan = max(s.end - 64, pos)  # overlap: a header may straddle two reads
            s.discard(scan)

    def __iter__(self) -> Iterator[Framed]:
        s = self.s
        pos = s.base  # 0, or where a split file's range starts
        while True:
            s.discard(pos)
            pos = self._skip_ws(pos)
            s.fill(pos + 8)
            for h in s.holes:  # corrupt members no record absorbed: one row each
                if not h.reported and h.at <= pos:
                    h.reported = True
                    yield Framed(h.at, h.member, garbage=True, corrupt_member=True, problem=h.detail + "; its records are lost")
            if s.holes:
                s.holes[:] = [h for h in s.holes if not h.reported]  # stays short: many bad members stay linear
            if pos >= s.end:
                return
            if not s.get(pos, pos + 7).startswith(b"WARC/1."):
                nxt = self.next_header(pos)
                yield Framed(
                    pos,
                    s.member_of(pos),
                    garbage=True,
                    length=nxt - pos,
                    problem=f"{nxt - pos} bytes at {'decompressed ' if s.gzipped else ''}offset {pos} are not a WARC record",
                )
                pos = nxt
                continue
            rec = self._record(pos)
            yield rec
            pos = rec.start + rec.length

    def _record(self, start: int) -> Framed:
        """Frame the record at ``start``; ``length`` in the result is where the next one may begin."""
        s = self.s
        s.fill(start + MAX_HEADER_BYTES)
        head_end = s.find(b"\r\n\r\n", start, start + MAX_HEADER_BYTES)
        sep = 4
        if head_end < 0:
            head_end, sep = s.find(b"\n\n", start, start + MAX_HEADER_BYTES), 2
        rec = Framed(start, s.member_of(start))
        if head_end < 0:
            rec.headers = _parse_header(s.get(start, min(s.end, start + MAX_HEADER_BYTES)))
            nxt = self.next_header(start + 7)
            rec.problem = "record header cut off by the end of the file" if nxt >= s.end and s.eof else "record header has no end"
            rec.length = nxt - start
            return rec
        rec.headers = _parse_header(s.get(start, head_end))
        block = head_end + sep
        raw_len = rec.headers.get("content-length")
        declared = int(raw_len) if raw_len is not None and raw_len.isdigit() else None
        if declared is None:
            nxt = self.next_header(block)
            found = nxt - block
            what = "no Content-Length" if raw_len is None else f"Content-Length {raw_len!r}, not a byte count"
            rec.problem = f"record header has {what}; next WARC header found after {found} bytes"
            rec.length = nxt - start
            return rec
        keep = declared <= self.max_bytes and self.need_payload(rec.headers)
        rec.too_large = declared > self.max_bytes
        end = block + declared
        candidate = None
        if keep:
            s.fill(end + 8)
        else:
            candidate = self._skip_to(block, end)
        got = min(end, s.end) - block
        # The end check: terminator, then the next header or the end of the file.
        tail = s.get(block + got, min(s.end, end + 16)) if got == declared else b""
        stripped = tail.lstrip(b"\r\n")
        newlines = len(tail) - len(stripped)
        # A terminator followed by other bytes: this record is whole; those bytes are the next garbage.
        clean = got == declared and (stripped.startswith(b"WARC/1.") or (not stripped and s.end <= end + 16) or newlines >= 2)
        new_holes = s.holes_in(start, end + 4) if s.holes else []
        if new_holes:
            for h in new_holes:
                h.reported = True
            rec.problem = "; ".join(h.detail for h in new_holes) + "; the record's bytes after it are lost"
            nxt = self.next_header(max(new_holes[0].at, block))
            rec.length = nxt - start
            return rec
        if clean:
            rec.length = block + declared + newlines - start
            if keep:
                rec.payload = s.get(block, end)
            return rec
        # The length lies (or the file ends inside the block): find where the next record really starts.
        if candidate is not None and candidate < s.base:
            s.rewind(candidate)  # the first header inside the skipped block: its bytes were not kept
        nxt = self.next_header(block)
        if got < declared and nxt >= s.end:
            rec.problem = f"Content-Length {declared} but the file ends after {got} bytes of the block"
        else:
            rec.problem = (
                f"Content-Length {declared} does not match the record: next WARC header found "
                f"after {nxt - block} bytes of the block"
            )
        rec.length = nxt - start
        rec.too_large = False
        return rec

    def _skip_to(self, block: int, end: int) -> int | None:
        """Read up to ``end`` holding only a window (a payload over the cap is never in memory);
        returns the offset of the first line inside the block that starts a WARC header, where
        reading resumes (after a rewind) if the length turns out to lie."""
        s = self.s
        candidate: int | None = None
        scanned = block
        while True:
            if candidate is None and s.end > scanned:
                i = find_header(s.buf, max(scanned, block) - s.base)
                if i >= 0 and i + s.base < end:
                    candidate = i + s.base
                scanned = max(s.end - 64, block)  # overlap: a header may straddle two reads
            if s.end >= end + 8 or s.eof:
                break
            s.discard(min(max(s.end - 64, block), end))
            s._more()
        return candidate
