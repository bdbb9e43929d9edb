"""Safe, streaming reads of tar / zip / gzip inputs: members come out as bytes in memory.

Nothing is ever extracted to a path taken from an archive. Links, devices and member paths
that are absolute or climb out with ``..`` are reported as problems, never followed. Caps on
each member and on the decompressed total stop decompression bombs: a member over its cap is
reported and skipped, never inflated past the cap; an archive over its total, or with more
members than ``max_members``, stops with one problem item for the rest. A corrupt or truncated
archive ends the iteration with one problem item (members read before it are kept), so the
caller turns it into a reject and the run goes on. An archive without a single file member is
one ``empty_archive`` item.

Names: every member name comes out as valid UTF-8 text (bytes that are not UTF-8 written
``\\xNN``, the same on every run), and ``MemberIds`` turns members into record ids that are
unique and stable for any archive: repeated, escaped and unsafe names get the member's ordinal.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import lzma
import posixpath
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypedDict

from datapipe.readers.base import LimitExceeded
from datapipe.readers.streams import Readable

MiB = 1 << 20


@dataclass(frozen=True)
class Caps:
    member_bytes: int = 16 * MiB  # one decompressed member
    archive_bytes: int = 1024 * MiB  # everything decompressed from one input file
    max_members: int = 1_000_000  # file members read from one archive (limits.max_archive_members)


# Names of the archives read here: an input so named is a folder packed, its format from the source kind.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")

# Problems that end an archive: one row stands for every member not read.
ARCHIVE_PROBLEMS = ("corrupt_archive", "archive_too_large", "too_many_members", "empty_archive")


@dataclass(frozen=True)
class Member:
    """One archive member: its data, or (data None) the reason it was not read."""

    name: str  # normalized relative POSIX path (or the raw name when unsafe); "" for archive-level problems
    data: bytes | None = None
    reason: str | None = None  # unsafe_member_path | link_member | member_too_large | corrupt_archive | ...
    detail: str = ""
    ordinal: int = -1  # position among the archive's entries (every entry counted): stable for the file
    escaped: bool = False  # the raw name was not UTF-8: ``name`` writes those bytes as \\xNN
    size: int | None = None  # the size the archive declares, when it says


class MemberAt(TypedDict):
    """Where a member sits: the keyword arguments of ``Member`` that every row about it shares."""

    ordinal: int
    escaped: bool


class _SizedAt(MemberAt):
    size: int | None  # the size the archive declares for the entry


def clean_name(raw: str) -> tuple[str, bool]:
    """``raw`` as valid UTF-8 text, and whether it had to be escaped. tarfile and os.walk hand
    undecodable bytes over as surrogate escapes, which no Arrow column (and no id) can hold."""
    try:
        raw.encode("utf-8")
        return raw, False
    except UnicodeEncodeError:
        try:
            data = raw.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = raw.encode("utf-8", "surrogatepass")
        return data.decode("utf-8", "backslashreplace"), True


class MemberIds:
    """Record ids for archive members, unique and stable for any archive.

    The first member with a clean, safe name is that name (``src/a.py``); a repeated name, a
    name that had to be escaped and an unsafe one get ``//<ordinal>`` (``a.py//3``), and
    archive-level problems are ``//<reason>``. A normalized member path never contains ``//``,
    so these can never collide with a real member's name (``a.py~2`` is just a name)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, m: Member) -> str:
        if not m.name or m.reason in ARCHIVE_PROBLEMS:
            return f"//{m.reason or 'archive'}"
        if m.reason == "unsafe_member_path":
            return f"//unsafe/{m.ordinal}"  # the raw path stays out of the id: it is in the detail
        if m.escaped or m.name in self.seen:
            return f"{m.name}//{m.ordinal}"
        self.seen.add(m.name)
        return m.name


class _CountingReader(io.RawIOBase):
    """Decompressed-byte counter in front of a stream: raises once the archive cap is passed."""

    TAIL = 256 << 10  # recent bytes kept, to look at the block where tarfile stopped

    def __init__(self, inner: Readable, limit: int) -> None:
        self.inner, self.limit, self.count = inner, limit, 0
        self.tail = bytearray()

    def readable(self) -> bool:
        return True

    # BufferedReader passes a memoryview; typeshed's RawIOBase.readinto takes any WriteableBuffer (no slicing).
    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        data = self.inner.read(len(b))
        self.count += len(data)
        if self.count > self.limit:
            raise LimitExceeded("archive_too_large", f"more than {self.limit} bytes decompressed")
        b[: len(data)] = data
        self.tail += data
        if len(self.tail) > 2 * self.TAIL:
            del self.tail[: len(self.tail) - self.TAIL]
        return len(data)

    def block_at(self, offset: int, size: int = 512) -> bytes | None:
        start = offset - (self.count - len(self.tail))
        return bytes(self.tail[start : start + size]) if start >= 0 else None


_MAGIC: list[tuple[bytes, Callable[[IO[bytes]], Readable]]] = [
    (b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f, mode="rb")),
    (b"BZh", lambda f: bz2.BZ2File(f, "rb")),
    (b"\xfd7zXZ\x00", lambda f: lzma.LZMAFile(f, "rb")),
]


def sniff(path: Path) -> str:
    """'zip', 'tar' (any compression), 'compressed' (one compressed file) or 'plain'."""
    with path.open("rb") as f:
        head = f.read(6)
        if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
            return "zip"
        f.seek(0)
        stream = _decompressor(head, f)
        try:
            block = (stream or f).read(512)
        except (OSError, EOFError, lzma.LZMAError):
            return "compressed" if stream is not None else "plain"
    if len(block) >= 262 and block[257:262] == b"ustar":
        return "tar"
    if len(block) == 512 and block.count(0) == 512:
        return "tar"  # an empty tar is only its end-of-archive zero blocks
    return "compressed" if stream is not None else "plain"


def _decompressor(head: bytes, f: IO[bytes]) -> Readable | None:
    for magic, opener in _MAGIC:
        if head.startswith(magic):
            return opener(f)
    return None


def _open_decompressed(raw: IO[bytes]) -> Readable:
    """The decompressed stream of ``raw`` by its magic bytes (``raw`` itself when not compressed)."""
    head = raw.read(6)
    raw.seek(0)
    return _decompressor(head, raw) or raw


def safe_name(name: str) -> str | None:
    """The member path as a clean relative POSIX path, or None when it is absolute or escapes."""
    name = name.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return None
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../") or norm == ".":
        return None
    return norm


def iter_archive(path: Path, caps: Caps = Caps(), want: Callable[[str], bool] | None = None) -> Iterator[Member]:
    """Members of a tar/zip/gzip file in archive order. ``want(name)`` False skips reading a member
    (it is not yielded): a cheap first pass that only needs license files."""
    kind = sniff(path)
    entries = [0]  # file entries seen (whether wanted or not): none at all is an empty archive
    if kind == "zip":
        members = _iter_zip(path, caps, want, entries)
    elif kind == "tar":
        members = _iter_tar(path, caps, want, entries)
    else:
        members = _iter_single(path, caps, want, kind == "compressed", entries)
    ended = False
    for m in members:
        ended = ended or m.reason in ARCHIVE_PROBLEMS
        yield m
    if entries[0] == 0 and not ended:
        yield Member("", reason="empty_archive", detail=f"{kind} input holds no file member")


def _too_many(caps: Caps) -> Member:
    return Member(
        "",
        reason="too_many_members",
        detail=f"more than limits.max_archive_members {caps.max_members} file members: the rest is not read",
    )


def _iter_tar(path: Path, caps: Caps, want: Callable[[str], bool] | None, entries: list[int]) -> Iterator[Member]:
    with path.open("rb") as raw:
        counted = _CountingReader(_open_decompressed(raw), caps.archive_bytes)
        try:
            # "r|": a forward-only stream; tarfile never seeks and never touches the file system.
            buffered = io.BufferedReader(counted, 1 << 16)
            with tarfile.open(fileobj=buffered, mode="r|") as tar:
                for ordinal, info in enumerate(tar):
                    if info.isdir():
                        continue
                    entries[0] += 1
                    if entries[0] > caps.max_members:
                        yield _too_many(caps)
                        return
                    member = _tar_member(tar, info, caps, want, ordinal)
                    if member is not None:
                        yield member
                    # tarfile keeps every TarInfo otherwise: memory grows per member (``members`` is
                    # TarFile's own list, set in __init__ but absent from typeshed's stub)
                    tar.members.clear()  # type: ignore[attr-defined]
            # tarfile ends quietly at an invalid header after the first one, and at a stream cut
            # between members; a real end is a zero block.
            block = counted.block_at(tar.offset)
            if block and block.count(0) != len(block):
                raise tarfile.ReadError(f"invalid tar header at offset {tar.offset}: archive damaged")
            if entries[0] and (block is None or len(block) < 512):
                raise EOFError(f"archive ends at offset {tar.offset} without its end-of-archive block (truncated)")
        except LimitExceeded as exc:
            yield Member("", reason=exc.reason, detail=f"stopped: {exc.detail} (cap {caps.archive_bytes})")
        except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
            yield Member("", reason="corrupt_archive", detail=f"{type(exc).__name__}: {exc}")


def _tar_member(
    tar: tarfile.TarFile, info: tarfile.TarInfo, caps: Caps, want: Callable[[str], bool] | None, ordinal: int
) -> Member | None:
    raw, escaped = clean_name(info.name)
    name = safe_name(info.name)  # on the raw name: the \\xNN escapes must not read as path separators
    name = clean_name(name)[0] if name is not None else None
    if name is None:
        return Member(
            raw, reason="unsafe_member_path", detail=f"absolute or escaping path {raw!r}", ordinal=ordinal, escaped=escaped
        )
    if want is not None and not want(name):
        return None
    at: _SizedAt = {"ordinal": ordinal, "escaped": escaped, "size": info.size}
    if info.issym() or info.islnk():
        kind = "symlink" if info.issym() else "hard link"
        return Member(name, reason="link_member", detail=f"{kind} to {clean_name(info.linkname)[0]!r} not followed", **at)
    if not info.isfile():
        return Member(name, reason="special_member", detail="device, fifo or other non-regular member", **at)
    if info.size > caps.member_bytes:
        return Member(name, reason="member_too_large", detail=f"{info.size} bytes > cap {caps.member_bytes}", **at)
    f = tar.extractfile(info)
    data = f.read(caps.member_bytes + 1) if f is not None else b""
    if len(data) < info.size:
        raise EOFError(f"member {name!r} truncated: {len(data)} of {info.size} bytes")
    return Member(name, data, **at)


def _zip_entry_count(path: Path) -> int | None:
    """Entries the zip's end record announces (None when it has none): read before ZipFile, which
    loads the whole central directory into memory at open."""
    try:
        with path.open("rb") as f:
            end = zipfile._EndRecData(f)  # type: ignore[attr-defined]
        return int(end[zipfile._ECD_ENTRIES_TOTAL]) if end else None  # type: ignore[attr-defined]
    except (OSError, AttributeError, IndexError, TypeError, ValueError):
        return None


def _iter_zip(path: Path, caps: Caps, want: Callable[[str], bool] | None, entries: list[int]) -> Iterator[Member]:
    total = 0
    announced = _zip_entry_count(path)
    if announced is not None and announced > caps.max_members:
        # A directory of millions of entries: read the first ones from their local headers instead.
        yield from _iter_zip_local(path, caps, want, entries, f"central directory announces {announced} entries")
        return
    try:
        with zipfile.ZipFile(path) as zf:
            for ordinal, info in enumerate(zf.infolist()):
                if info.is_dir():
                    continue
                entries[0] += 1
                if entries[0] > caps.max_members:
                    yield _too_many(caps)
                    return
                raw, escaped = clean_name(info.filename)
                name = safe_name(info.filename)
                name = clean_name(name)[0] if name is not None else None
                if name is None:
                    yield Member(
                        raw,
                        reason="unsafe_member_path",
                        detail=f"absolute or escaping path {raw!r}",
                        ordinal=ordinal,
                        escaped=escaped,
                    )
                    continue
                if want is not None and not want(name):
                    continue
                at: _SizedAt = {"ordinal": ordinal, "escaped": escaped, "size": info.file_size}
                if stat.S_ISLNK(info.external_attr >> 16):
                    yield Member(name, reason="link_member", detail="symlink member not followed", **at)
                    continue
                mode = info.external_attr >> 16  # Unix mode when written on Unix; file-type bits are often 0
                if stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                    yield Member(name, reason="special_member", detail="device, fifo or other non-regular member", **at)
                    continue
                # file_size is what the archive claims; the read below is capped whatever it says.
                if info.file_size > caps.member_bytes:
                    yield Member(
                        name, reason="member_too_large", detail=f"{info.file_size} bytes > cap {caps.member_bytes}", **at
                    )
                    continue
                try:
                    with zf.open(info) as f:
                        data = f.read(caps.member_bytes + 1)
                except (
                    zipfile.BadZipFile,
                    OSError,
                    EOFError,
                    NotImplementedError,
                    RuntimeError,
                    ValueError,
                    zlib.error,
                    lzma.LZMAError,
                ) as exc:
                    yield Member(name, reason="corrupt_member", detail=f"{type(exc).__name__}: {exc}", **at)
                    continue
                if len(data) > caps.member_bytes:
                    yield Member(
                        name,
                        reason="member_too_large",
                        detail=f"more than cap {caps.member_bytes} bytes (the archive claims {info.file_size})",
                        **at,
                    )
                    continue
                total += len(data)
                if total > caps.archive_bytes:
                    yield Member(name, reason="archive_too_large", detail=f"stopped: more than {caps.archive_bytes} bytes")
                    return
                yield Member(name, data, **at)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        if entries[0] == 0:  # no central directory (a cut zip): read the local headers in order instead
            yield from _iter_zip_local(path, caps, want, entries, f"{type(exc).__name__}: {exc}")
        else:
            yield Member("", reason="corrupt_archive", detail=f"{type(exc).__name__}: {exc}")


_LOCAL = struct.Struct("<4sHHHHHIIIHH")


def _iter_zip_local(path: Path, caps: Caps, want: Callable[[str], bool] | None, entries: list[int], why: str) -> Iterator[Member]:
    """Members of a zip whose central directory is gone (truncated): local headers read front to
    back, stored and deflated members with sizes in their header. Whatever follows the first
    member that cannot be read this way is one corrupt_archive item."""
    total = 0
    with path.open("rb") as f:
        for ordinal in itertools.count():
            head = f.read(_LOCAL.size)
            if len(head) < _LOCAL.size or head[:4] != b"PK\x03\x04":
                break
            _, _, flags, method, _, _, _, csize, usize, nlen, xlen = _LOCAL.unpack(head)
            rawname = f.read(nlen).decode("utf-8" if flags & 0x800 else "cp437", "surrogateescape")
            f.seek(xlen, 1)
            if flags & 0x8 or method not in (0, 8):
                break  # sizes in a trailing descriptor, or a method we do not stream: stop here
            entries[0] += 1
            if entries[0] > caps.max_members:
                yield _too_many(caps)
                return
            start = f.tell()
            raw, escaped = clean_name(rawname)
            name = safe_name(rawname)
            name = clean_name(name)[0] if name is not None else None
            at: _SizedAt = {"ordinal": ordinal, "escaped": escaped, "size": usize}
            if rawname.endswith("/"):
                entries[0] -= 1
            elif name is None:
                yield Member(raw, reason="unsafe_member_path", detail=f"absolute or escaping path {raw!r}", **at)
            elif want is None or want(name):
                if usize > caps.member_bytes:
                    yield Member(name, reason="member_too_large", detail=f"{usize} bytes > cap {caps.member_bytes}", **at)
                else:
                    comp = f.read(csize)
                    if len(comp) < csize:
                        break
                    try:
                        data = comp if method == 0 else zlib.decompressobj(-15).decompress(comp, caps.member_bytes + 1)
                    except zlib.error as exc:
                        yield Member(name, reason="corrupt_member", detail=f"error: {exc}", **at)
                    else:
                        total += len(data)
                        if total > caps.archive_bytes:
                            yield Member(
                                name, reason="archive_too_large", detail=f"stopped: more than {caps.archive_bytes} bytes"
                            )
                            return
                        yield (
                            Member(name, data, **at)
                            if len(data) <= caps.member_bytes
                            else Member(name, reason="member_too_large", detail=f"more than cap {caps.member_bytes} bytes", **at)
                        )
            f.seek(start + csize)
    yield Member("", reason="corrupt_archive", detail=f"{why}; members before the damage were read from their local headers")


def _iter_single(
    path: Path, caps: Caps, want: Callable[[str], bool] | None, compressed: bool, entries: list[int]
) -> Iterator[Member]:
    name = clean_name(path.name)[0]
    for ext in (".gz", ".bz2", ".xz"):
        if compressed and name.lower().endswith(ext):
            name = name[: -len(ext)]
    if path.stat().st_size == 0 or (compressed and _decompressed_empty(path)):
        return  # nothing in it: iter_archive says empty_archive
    entries[0] += 1
    if want is not None and not want(name):
        return
    try:
        with path.open("rb") as raw:
            data = _open_decompressed(raw).read(caps.member_bytes + 1)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        yield Member(name, reason="corrupt_archive", detail=f"{type(exc).__name__}: {exc}")
        return
    if len(data) > caps.member_bytes:
        yield Member(name, reason="member_too_large", detail=f"more than cap {caps.member_bytes} bytes")
        return
    yield Member(name, data, ordinal=0)


def _decompressed_empty(path: Path) -> bool:
    try:
        with path.open("rb") as raw:
            return _open_decompressed(raw).read(1) == b""
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return False  # corrupt: reading it says so
