"""Parquet files of a run read in place on object storage: the footer once per process, then only the
row groups a task asks for.

A task on one node often needs a part of a file another node wrote: a shuffle partition its row
group of each merged file, a MinHash partition a few rows of each map output, a map task its
shard's decisions. Downloading the whole file into the node's mirror moved every such file
through the store once per node that read any of it, so the bytes moved grew with the nodes.
Here an object is opened once per process (one HEAD), its footer read once (one GET of exactly
its length when the marker recorded it, else two: the last 8 bytes, then the footer) and kept
with the open file; each read of row groups is then one ranged GET per run of adjacent row
groups (``pre_buffer`` coalesces the column chunks of a row group, which lie back to back).

:func:`rows_where` is what the readers share: the rows of some files whose ``column`` equals a
value, reading only the row groups whose statistics can hold it, in file and row order (what a
``pyarrow.dataset`` scan with that filter returns, without opening every file's footer per read).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.storage.uri import StorageError, _fail, resolve, retrying

PARQUET_TAIL = 8  # a Parquet file ends with its footer's length (4 bytes, little-endian) and b"PAR1"
CACHED_FILES = 512  # open objects (and their footers) a process keeps

_open: OrderedDict[tuple[str, int], tuple[Any, pq.FileMetaData]] = OrderedDict()
_lock = threading.Lock()


# A local run is read through a buffer of this many bytes per column, not with its column chunks read
# whole (pyarrow's ``pre_buffer``, right for one ranged GET on a store, costs a local reader every
# column chunk of the row groups it reads at once): a merge or partition task reads up to 256 runs at
# once, and each held ~1.1 MiB more pre-buffered, ~300 MiB of a 256-input merge
# (bench/scaling/crawl_proportions.py), for the same CPU.
LOCAL_READ_BUFFER = 64 << 10


def local_parquet(path: Any) -> pq.ParquetFile:
    """A local Parquet file of a run opened for reading a few rows of each of many at once (see
    ``LOCAL_READ_BUFFER``)."""
    return pq.ParquetFile(path, pre_buffer=False, buffer_size=LOCAL_READ_BUFFER)


def footer_length(path: Any) -> int | None:
    """The length of a local Parquet file's footer (its metadata), from its last 8 bytes; None when it
    is not a Parquet file. Recorded in markers so a reader elsewhere fetches the footer in one request."""
    try:
        with open(path, "rb") as f:
            f.seek(-PARQUET_TAIL, 2)
            tail = f.read(PARQUET_TAIL)
    except OSError:
        return None
    if tail[4:] != b"PAR1":
        return None
    return int.from_bytes(tail[:4], "little")


def remote_parquet(uri: str, size: int, footer: int | None = None) -> pq.ParquetFile:
    """A Parquet object of ``size`` bytes opened in place: its footer from this process's cache or
    read now (``footer``: its length, when known), its row groups read on demand, coalesced."""
    key = (uri, size)
    with _lock:
        hit = _open.get(key)
        if hit is not None:
            _open.move_to_end(key)
    if hit is None:
        hit = _open_object(uri, size, footer)
        with _lock:
            _open[key] = hit
            while len(_open) > CACHED_FILES:
                _open.popitem(last=False)
    f, meta = hit
    return pq.ParquetFile(f, metadata=meta, pre_buffer=True)


def _open_object(uri: str, size: int, footer: int | None) -> tuple[Any, pq.FileMetaData]:
    fs, path = resolve(uri)
    try:
        f = retrying(uri, "opening", lambda: fs.open_input_file(path))
        if footer is None:
            tail = retrying(uri, "reading", lambda: f.read_at(PARQUET_TAIL, size - PARQUET_TAIL))
            if tail[4:] != b"PAR1":
                raise StorageError(f"{uri}: not a Parquet file (no PAR1 at its end)")
            footer = int.from_bytes(tail[:4], "little")
        n = footer + PARQUET_TAIL
        body = retrying(uri, "reading", lambda: f.read_at(n, size - n))
    except FileNotFoundError:
        raise StorageError(f"{uri}: no such object (a marker names it)") from None
    except OSError as exc:
        raise _fail(uri, "reading", exc) from None
    # The footer alone parses as a file: pyarrow reads metadata from the end of what it is given.
    return f, pq.read_metadata(pa.BufferReader(body))


def forget(uri: str) -> None:
    """Drop what this process keeps of an object (it was found damaged and is to be rewritten)."""
    with _lock:
        for key in [k for k in _open if k[0] == uri]:
            del _open[key]


def rows_where(files: list[pq.ParquetFile], column: str, value: int, columns: list[str] | None = None) -> pa.Table | None:
    """The rows of ``files`` whose ``column`` equals ``value``, in file order then row order, with
    the first file's schema (None: no files). Only row groups whose min/max statistics admit
    ``value`` are read (all of a row group without statistics)."""
    if not files:
        return None
    schema = files[0].schema_arrow
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    tables = []
    for f in files:
        groups = _groups_holding(f, column, value)
        if not groups:
            continue
        table = f.read_row_groups(groups, columns=columns)
        table = table.filter(pc.equal(table[column], value))
        if table.num_rows:
            tables.append(table.cast(schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _groups_holding(f: pq.ParquetFile, column: str, value: int) -> list[int]:
    meta = f.metadata
    # The Parquet leaf column of ``column`` (its Arrow field index differs after a nested column).
    col = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == column), -1)
    groups = []
    for rg in range(meta.num_row_groups):
        info = meta.row_group(rg)
        if not info.num_rows:
            continue
        stats = info.column(col).statistics if col >= 0 else None
        if stats is None or not stats.has_min_max or stats.min <= value <= stats.max:
            groups.append(rg)
    return groups
