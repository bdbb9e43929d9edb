"""What a task read of its input files: for each open, the file's identity when it was opened and a
sha256 of every byte read from it, taken while the reader read them (no second read).

A task runs inside :func:`recording_reads`; meanwhile ``storage.uri.open_input`` (and what opens
inputs through it: JSONL, WARC and Parquet readers, the newline pre-pass) hands out streams whose
raw reads pass through :class:`HashingRaw`. Each open becomes one :class:`ReadRecord`: the byte
*extents* read, in the order they were read (contiguous reads merged; a reader that seeks starts a
new extent), and the sha256 of those bytes in that order. Reading the same extents again in the
same order (:func:`extents_sha256`) tells whether the file still holds what the task read, without
caring how the reader moved through it. Read-ahead counts: bytes a buffer fetched but the reader
never used are hashed too, which is harmless (they were read from the file).

The task's marker keeps the records (``reads``); ``engine/input_identity.py`` checks them at the
end of a run and at every resume. One task runs at a time in a process (Ray workers, in-process
runs), so one list suffices, as for ``storage.atomic.recording_writes``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

_reads: list[ReadRecord] | None = None  # the current task's records while recording_reads is active
# Inputs the current task could not read because of their store (``uri.InputUnavailable``), noted as
# they are raised: a reader may catch one as it catches unreadable bytes, and the task raises it again.
_unavailable: list[BaseException] | None = None


@dataclass
class ReadRecord:
    """One open of one input file by a task."""

    path: str  # as the run lists the input: a resolved local path, or the object's URI
    identity: dict[str, Any]  # bytes, mtime_ns, change (see storage.uri.input_identity) when it was opened
    hashed: bool = True  # False: the reader read the file by its own means (archives, folders): identity only
    extents: list[list[int]] = field(default_factory=list)  # [start, end) byte ranges, in read order
    _hash: Any = field(default_factory=hashlib.sha256, repr=False)

    def add(self, pos: int, data: Any) -> None:
        n = len(data)
        if not n:
            return
        if self.extents and self.extents[-1][1] == pos:
            self.extents[-1][1] = pos + n
        else:
            self.extents.append([pos, pos + n])
        self._hash.update(data)

    def as_dict(self) -> dict[str, Any]:
        out = {"path": self.path, **self.identity}
        if self.hashed:
            out.update({"extents": self.extents, "sha256": self._hash.hexdigest()})
        return out


@contextlib.contextmanager
def recording_reads() -> Iterator[list[ReadRecord]]:
    """Collect a record of every input opened meanwhile (the reads of one task)."""
    global _reads, _unavailable
    previous, _reads = _reads, []
    outer, _unavailable = _unavailable, []
    try:
        yield _reads
    finally:
        _reads, _unavailable = previous, outer


def recording() -> bool:
    return _reads is not None


def note_unavailable(exc: BaseException) -> None:
    """An input the current task cannot read because of its store (no-op outside a task)."""
    if _unavailable is not None:
        _unavailable.append(exc)


def unavailable() -> BaseException | None:
    """The first input failure of the current task's store that was noted (see ``note_unavailable``)."""
    return _unavailable[0] if _unavailable else None


def note_read(path: str, identity: dict[str, Any], hashed: bool = True) -> ReadRecord | None:
    """A new record in the current task's list (None when no task is recording)."""
    if _reads is None:
        return None
    record = ReadRecord(path, identity, hashed)
    _reads.append(record)
    return record


class HashingRaw(io.RawIOBase):
    """A raw stream passing every byte read through its record's hash, with the offset it came from."""

    def __init__(self, raw: Any, record: ReadRecord) -> None:
        self.raw = raw
        self.record = record
        self.pos = raw.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self.raw.readinto(b)
        if n:
            self.record.add(self.pos, memoryview(b)[:n])
            self.pos += n
        return n or 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = self.raw.seek(pos, whence)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
        super().close()


def extents_sha256(opener: Callable[[], IO[bytes]], extents: list[list[int]], chunk: int = 8 << 20) -> str | None:
    """The sha256 of the bytes at ``extents`` of the file ``opener`` opens, read again in that order;
    None when the file is shorter than an extent (it cannot hold what was read)."""
    digest = hashlib.sha256()
    with opener() as f:
        for start, end in extents:
            f.seek(start)
            left = end - start
            while left > 0:
                data = f.read(min(chunk, left))
                if not data:
                    return None
                digest.update(data)
                left -= len(data)
    return digest.hexdigest()
