"""Safe, streaming reads of tar / zip / gzip inputs: members come out as bytes in memory.

Nothing is ever extracted to a path taken from an archive. Links, devices and member paths
that are absolute or climb out with ``..`` are reported as problems, never followed. Caps on
each member and on the decompressed total stop decompression bombs: a member over its cap is
reported and skipped; an archive over its total stops. A corrupt or truncated archive ends
the iteration with one problem item, so the caller turns it into a reject and the run goes on.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import posixpath
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MiB = 1 << 20


@dataclass(frozen=True)
class Caps:
    member_bytes: int = 16 * MiB  # one decompressed member
    archive_bytes: int = 1024 * MiB  # everything decompressed from one input file


@dataclass(frozen=True)
class Member:
    """One archive member: its data, or (data None) the reason it was not read."""

    name: str  # normalized relative POSIX path (or the raw name when unsafe)
    data: bytes | None = None
    reason: str | None = None  # unsafe_member_path | link_member | member_too_large | corrupt_archive | ...
    detail: str = ""


class ArchiveTooLarge(Exception):
    pass


class _CountingReader(io.RawIOBase):
    """Decompressed-byte counter in front of a stream: raises once the archive cap is passed."""

    TAIL = 256 << 10  # recent bytes kept, to look at the block where tarfile stopped

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        self.inner, self.limit, self.count = inner, limit, 0
        self.tail = bytearray()

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        data = self.inner.read(len(b))
        self.count += len(data)
        if self.count > self.limit:
            raise ArchiveTooLarge(f"more than {self.limit} bytes decompressed")
        b[: len(data)] = data
        self.tail += data
        if len(self.tail) > 2 * self.TAIL:
            del self.tail[: len(self.tail) - self.TAIL]
        return len(data)

    def block_at(self, offset: int, size: int = 512) -> bytes | None:
        start = offset - (self.count - len(self.tail))
        return bytes(self.tail[start: start + size]) if start >= 0 else None


_MAGIC: list[tuple[bytes, Callable[[IO[bytes]], IO[bytes]]]] = [
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
    return "compressed" if stream is not None else "plain"


def _decompressor(head: bytes, f: IO[bytes]) -> IO[bytes] | None:
    for magic, opener in _MAGIC:
        if head.startswith(magic):
            return opener(f)
    return None


def _open_decompressed(raw: IO[bytes]) -> IO[bytes]:
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
    if kind == "zip":
        yield from _iter_zip(path, caps, want)
    elif kind == "tar":
        yield from _iter_tar(path, caps, want)
    else:
        yield from _iter_single(path, caps, want, compressed=kind == "compressed")


def _iter_tar(path: Path, caps: Caps, want: Callable[[str], bool] | None) -> Iterator[Member]:
    with path.open("rb") as raw:
        counted = _CountingReader(_open_decompressed(raw), caps.archive_bytes)
        try:
            # "r|": a forward-only stream; tarfile never seeks and never touches the file system.
            buffered = io.BufferedReader(counted, 1 << 16)
            with tarfile.open(fileobj=buffered, mode="r|") as tar:
                for info in tar:
                    member = _tar_member(tar, info, caps, want)
                    if member is not None:
                        yield member
            # tarfile ends quietly at an invalid header after the first one; a real end is a zero block.
            block = counted.block_at(tar.offset)
            if block and block.count(0) != len(block):
                raise tarfile.ReadError(f"invalid tar header at offset {tar.offset}: archive damaged")
        except ArchiveTooLarge as exc:
            yield Member("", reason="archive_too_large", detail=f"stopped: {exc} (cap {caps.archive_bytes})")
        except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
            yield Member("", reason="corrupt_archive", detail=f"{type(exc).__name__}: {exc}")


def _tar_member(tar: tarfile.TarFile, info: tarfile.TarInfo, caps: Caps,
                want: Callable[[str], bool] | None) -> Member | None:
    if info.isdir():
        return None
    name = safe_name(info.name)
    if name is None:
        return Member(info.name, reason="unsafe_member_path", detail=f"absolute or escaping path {info.name!r}")
    if want is not None and not want(name):
        return None
    if info.issym() or info.islnk():
        return Member(name, reason="link_member", detail=f"link to {info.linkname!r} not followed")
    if not info.isfile():
        return Member(name, reason="special_member", detail="device, fifo or other non-regular member")
    if info.size > caps.member_bytes:
        return Member(name, reason="member_too_large", detail=f"{info.size} bytes > cap {caps.member_bytes}")
    f = tar.extractfile(info)
    data = f.read(caps.member_bytes + 1) if f is not None else b""
    if len(data) < info.size:
        raise EOFError(f"member {name!r} truncated: {len(data)} of {info.size} bytes")
    return Member(name, data)


def _iter_zip(path: Path, caps: Caps, want: Callable[[str], bool] | None) -> Iterator[Member]:
    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                name = safe_name(info.filename)
                if name is None:
                    yield Member(info.filename, reason="unsafe_member_path",
                                 detail=f"absolute or escaping path {info.filename!r}")
                    continue
                if want is not None and not want(name):
                    continue
                if stat.S_ISLNK(info.external_attr >> 16):
                    yield Member(name, reason="link_member", detail="symlink member not followed")
                    continue
                # file_size is what the archive claims; the read below is capped whatever it says.
                if info.file_size > caps.member_bytes:
                    yield Member(name, reason="member_too_large", detail=f"{info.file_size} bytes > cap {caps.member_bytes}")
                    continue
                try:
                    with zf.open(info) as f:
                        data = f.read(caps.member_bytes + 1)
                except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
                    yield Member(name, reason="corrupt_member", detail=f"{type(exc).__name__}: {exc}")
                    continue
                if len(data) > caps.member_bytes:
                    yield Member(name, reason="member_too_large", detail=f"more than cap {caps.member_bytes} bytes")
                    continue
                total += len(data)
                if total > caps.archive_bytes:
                    yield Member(name, reason="archive_too_large", detail=f"stopped: more than {caps.archive_bytes} bytes")
                    return
                yield Member(name, data)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        yield Member("", reason="corrupt_archive", detail=f"{type(exc).__name__}: {exc}")


def _iter_single(path: Path, caps: Caps, want: Callable[[str], bool] | None, compressed: bool) -> Iterator[Member]:
    name = path.name
    for ext in (".gz", ".bz2", ".xz"):
        if compressed and name.lower().endswith(ext):
            name = name[: -len(ext)]
    if want is not None and not want(name):
        return
    try:
        with path.open("rb") as raw:
            data = _open_decompressed(raw).read(caps.member_bytes + 1)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        yield Member(name, reason="corrupt_archive", detail=f"{type(exc).__name__}: {exc}")
        return
    if len(data) > caps.member_bytes:
        yield Member(name, reason="member_too_large", detail=f"more than cap {caps.member_bytes} bytes")
        return
    yield Member(name, data)
