"""Forming map tasks from input files: large files split into ranges, tiny files grouped.

One input file used to be one map task, so a 20 GB JSONL used one core. Here each source's
files, in the run's order, become *pieces* of about ``split.target_bytes`` (at most 10% over it):

- plain JSONL: byte ranges ``[start, end)``. A range owns the lines that *start* in it (Hadoop
  style): it skips the partial line at its start and reads through the line straddling its end,
  so any cut works and the planner reads nothing. Record ids use global line numbers (``#L<n>``),
  so a range needs the number of newlines before it: a parallel pre-pass (phase ``lines``, one
  task per range) counts each range's newlines once, and a range adds up the counts of the ranges
  before it (k small marker reads for range k; every byte is counted once: linear, not quadratic).
  Compressed JSONL (.gz/.zst/.bz2/.xz) cannot be entered mid-stream without an index: one task.
- Parquet: ranges of whole row groups (sized by their compressed bytes); record ids are global
  row indexes, which the footer gives for free.
- WARC/WET/WAT gzipped per record: cuts move forward to the next gzip member whose header checks
  out and whose first bytes decompress to ``WARC/1.``; ids are member offsets, so a range
  ``[start, end)`` owns the records whose member starts in it. Plain WARC: cuts move to the next
  ``WARC/1.`` header at a line start whose Content-Length lands on the next header (or the end).
  A file gzipped as one member (or an ARC file) has no such points: one task. Known limit: in a
  hostile file whose record lies about its Content-Length across a cut, the whole-file read may
  frame the bytes around the cut differently (the checked boundary makes this unlikely, not impossible).
- Whole files smaller than the target are grouped, consecutively within a source, until the
  group reaches the target: a thousand 100 KB files are a handful of tasks, not a thousand.

An input in object storage is planned without a download: its size comes from the store's
listing, and the few bytes planning looks at (a Parquet footer, a window after each WARC cut) are
ranged reads (``storage.input_stat``, ``storage.open_input``). A JSONL needs no read at all.

Ranges and groups keep the run's global order (sources, then sorted files, then ranges), so row
keys, dedup's "earliest" survivor and packing order are those of an unsplit run: outputs are
identical, only the task layout differs.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from datapipe.pipeline.load import SplitConfig
from datapipe.readers.streams import SCAN, LineRange, count_newlines
from datapipe.storage.uri import folder_stat, input_stat, is_input_file, open_input, parquet_source

__all__ = ["InputRange", "LineRange", "count_newlines", "effective_target", "group_pieces", "plan_file", "task_key"]

COMPRESSED = (".gz", ".zst", ".bz2", ".xz")


@dataclass(frozen=True)
class InputRange:
    """One input file, or a part of it, read by a map task."""

    path: str
    input_name: str
    format: str
    file_index: int  # position among the source's files
    start: int = 0  # byte offset (jsonl, warc) or first row group (parquet)
    end: int | None = None  # exclusive; None: to the end of the file
    part: int = 0  # position among the file's ranges
    parts: int = 1
    nbytes: int = 0  # input bytes it covers, as planned (0: unknown); orders map tasks, largest first

    @property
    def whole(self) -> bool:
        return self.parts == 1


def effective_target(config: SplitConfig, total_bytes: int, cpus: int | None) -> int:
    """The range size for this corpus on this many CPUs: ``target_bytes``, shrunk so that a small
    corpus still gives ``min_tasks_per_cpu`` tasks per CPU, but never below ``min_bytes``
    (per-task overhead: starting a task, building stages, writing files)."""
    target = config.target_bytes
    if cpus and config.min_tasks_per_cpu > 0 and total_bytes > 0:
        # Rounded up: rounded down, a file of total_bytes would need one more (tiny) range.
        want = math.ceil(total_bytes / (config.min_tasks_per_cpu * cpus))
        target = min(target, max(want, min(config.min_bytes, target)))
    return max(target, 1)


def file_size(path: str) -> int:
    # a file here, an object in object storage, or a folder input (its files' sizes summed)
    st = input_stat(path) or folder_stat(path)
    return st.size if st is not None else 0


def plan_file(path: str, input_name: str, fmt: str, file_index: int, target: int) -> list[InputRange]:
    """The ranges of one file (one whole-file range when it is small or cannot be split)."""
    p = Path(path)
    st = input_stat(p)  # an object in object storage: its listed size, nothing downloaded
    if st is None:
        return [InputRange(path, input_name, fmt, file_index)]
    size = st.size
    whole = [InputRange(path, input_name, fmt, file_index, nbytes=size)]
    if fmt == "parquet":
        bounds = _parquet_bounds(p, target)
    elif range_count(size, target) == 1:
        return whole
    elif fmt == "jsonl" and not p.name.lower().endswith(COMPRESSED):
        bounds = even_cuts(size, target)
    elif fmt in ("warc", "wet", "wat"):
        bounds = _warc_bounds(p, size, target)
    else:
        return whole
    bounds = sorted(set(bounds) | {0})
    if len(bounds) < 2:
        return whole
    ends: list[int | None] = [*bounds[1:], None]
    # Parquet bounds are row groups, sized by _parquet_bounds near the target: an even share will do.
    sizes = [size // len(bounds)] * len(bounds) if fmt == "parquet" else [(e or size) - s for s, e in zip(bounds, ends)]
    return [InputRange(path, input_name, fmt, file_index, s, e, k, len(bounds), n)
            for k, (s, e, n) in enumerate(zip(bounds, ends, sizes))]


def even_cuts(size: int, target: int) -> list[int]:
    """Start offsets of ``range_count(size, target)`` equal ranges. Equal, not ``target`` each plus
    a remainder: a short last range finishes early and leaves its core idle while the others work
    (2 GB in 256 MiB ranges on 2 CPUs: 7 full ranges and a 0.45 one, so at best 1.86 of 2 cores
    busy; 8 equal ranges: 2)."""
    n = range_count(size, target)
    return [size * k // n for k in range(n)]


# How far a range may exceed the target rather than add one more range to its file. A corpus of two
# equal halves on 2 CPUs gets a target of a sixth: the half a few bytes larger than three targets
# would become 4 ranges and the other 3 (the last wave of tasks then has one core idle: the whole
# shared corpus's final map phase took 20 s instead of 17). With the slack both halves make 3.
RANGE_SLACK = 0.1


def range_count(size: int, target: int) -> int:
    """Ranges a file of ``size`` bytes is cut into: each at most ``target`` x (1 + ``RANGE_SLACK``)."""
    return max(1, math.ceil(size / target - RANGE_SLACK))


def group_pieces(ranges: list[InputRange], target: int, group: bool) -> list[tuple[InputRange, ...]]:
    """Tasks of one source in order: each range of a split file alone; whole small files grouped."""
    tasks: list[tuple[InputRange, ...]] = []
    current: list[InputRange] = []
    size = 0
    for r in ranges:
        n = (r.nbytes or file_size(r.path)) if r.whole else 0  # planned size; a folder's is summed here
        if not group or not r.whole or n >= target or not is_input_file(r.path):
            if current:
                tasks.append(tuple(current))
                current, size = [], 0
            tasks.append((r,))
            continue
        if current and size + n > target:
            tasks.append(tuple(current))
            current, size = [], 0
        current.append(r)
        size += n
    if current:
        tasks.append(tuple(current))
    return tasks


def task_key(source: str, pieces: tuple[InputRange, ...]) -> str:
    """Names every output of a task. A lone whole file keeps the key it always had."""
    first, last = pieces[0], pieces[-1]
    if len(pieces) > 1:
        return f"{source}/{first.file_index:05d}..{last.file_index:05d}"
    if not first.whole:
        return f"{source}/{first.file_index:05d}.part{first.part:04d}"
    return f"{source}/{first.file_index:05d}"


# --- Parquet: row groups ----------------------------------------------------------

def _parquet_bounds(path: Path, target: int) -> list[int]:
    try:
        meta = pq.ParquetFile(parquet_source(path)).metadata  # the footer only
    except Exception:  # noqa: BLE001 - unreadable: one task, and the reader makes it a reject
        return [0]
    bounds, size = [0], 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        n = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        if size and size + n > target:
            bounds.append(g)
            size = 0
        size += n
    return bounds


def parquet_first_row(path: str, first_group: int) -> int:
    meta = pq.ParquetFile(parquet_source(path)).metadata
    return sum(meta.row_group(g).num_rows for g in range(first_group))


# --- WARC: record boundaries ---------------------------------------------------------

_GZIP = b"\x1f\x8b\x08"
_PROBE = 16 << 10  # first window after a cut (a record boundary is usually that close)


def _warc_bounds(path: Path, size: int, target: int) -> list[int]:
    with open_input(path, buffer=0) as f:  # on a store: one ranged read per window, nothing read ahead
        head = f.read(64)
        gzipped = head.startswith(b"\x1f\x8b")
        if _arc_like(head, gzipped):
            return [0]
        bounds = [0]
        for cut in even_cuts(size, target)[1:]:
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


def _windows(f, start: int, size: int, overlap: int) -> Iterator[tuple[int, int, bytes]]:  # type: ignore[no-untyped-def]
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


def _next_member(f, cut: int, size: int) -> int | None:  # type: ignore[no-untyped-def]
    """The first offset >= cut where a gzip member starts that decompresses to a WARC header."""
    for pos, width, data in _windows(f, cut, size, 4096):
        i = data.find(_GZIP)
        while 0 <= i < width:
            try:  # the window holds the member's first 4 KiB (its overlap): no second read
                out = zlib.decompressobj(31).decompress(data[i:i + 4096], 16)
            except zlib.error:
                out = b""
            if out.startswith(b"WARC/1."):
                return pos + i
            i = data.find(_GZIP, i + 1)
    return None


def _next_header(f, cut: int, size: int) -> int | None:  # type: ignore[no-untyped-def]
    """The first offset >= cut of a ``WARC/1.`` line whose Content-Length leads to the next header."""
    for pos, width, data in _windows(f, cut - 1, size, 8192):
        i = data.find(b"\nWARC/1.")
        while 0 <= i < width:
            at = pos + i + 1
            if at >= cut and _header_chains(f, at, size):
                return at
            i = data.find(b"\nWARC/1.", i + 1)
    return None


def _header_chains(f, at: int, size: int) -> bool:  # type: ignore[no-untyped-def]
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
