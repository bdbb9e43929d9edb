"""Sorted runs: the files a shuffle moves, each sorted by one integer key in a few large row groups.

Every file a shuffle writes (a map task's shuffle rows, a partition's forwarded rows and its outputs, a
merge task's output) is a *run*: its rows sorted by a key column (``part`` for rows on their way to a
partition, ``shard`` for a partition's outputs on their way to the map tasks), the writer's row order
kept inside a key, in row groups of about ``RUN_GROUP_BYTES``. So any contiguous range of keys is one
contiguous byte range of the file (the row groups it overlaps lie back to back), found from the footer's
min/max statistics, and a reader of a range reads that byte range and nothing else: one request on an
object store (``storage/parquet_reads.py`` coalesces adjacent row groups).

Before, a run held a row group per key (33 rows of exact dedup per part at 4,096 partitions): the
bytes written per document grew with the partitions (1.30x from 1x to 16x), every reader parsed a
footer that grew with them, and a merge task paid ~350 us per row group it read, one per (file, key):
tasks x partitions in all (docs/scaling.md, issue 48). Row groups by bytes, not by key, make the file's
size, its footer and a range's reads depend on its rows only.

Order: ``read_range`` returns the rows of several runs sorted by key, then by run (the order the caller
lists them: writer order), then by row: the order a reader would get from every writer's file, read one
after another key by key. A merge of runs (``merge_range``) writes that order, so merging in any tree
gives a reader the same rows in the same order as reading every writer (``tests/engine/test_runs.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.storage.atomic import atomic_path
from datapipe.storage.parquet_reads import local_parquet

# Uncompressed bytes per row group: large enough that a row group's fixed costs (its footer entry, a
# read call: ~0.1-0.3 ms) are small against its rows, small enough that a reader of a key range reads
# little beyond it (at most a row group at each end). bench/crawl_proportions.py chose it.
RUN_GROUP_BYTES = 1 << 20
MIN_GROUP_ROWS = 1024
# Bytes of a Parquet page (and of a dictionary page) in a run: a merge reads its (up to 256) inputs at
# once, each holding a decoded page of every column (1 MiB each by Parquet's defaults), so pages are
# what bounds a merge's memory beyond its buffers (``MERGE_MEMORY_BYTES``).
RUN_PAGE_BYTES = 64 << 10
# Decoded bytes a merge task buffers, about (``split.merge_memory_bytes``, 32 MiB, sets it per run): a merge of
# ``fan_in`` runs reads each in steps of a share of it, so the wider a run's rows, the fewer it reads at a
# time. Before, a step read a whole row group of every input: 256 x ~1 MiB of round 1's 512-byte
# signatures, and a merge task peaked at 2.2-2.6 GiB at a crawl's proportions (docs/scaling.md).
MERGE_MEMORY_BYTES = 32 << 20
MIN_READ_ROWS = 64  # rows an input is read in at least (a read's fixed cost against its rows)


def group_rows(table: pa.Table) -> int:
    """Rows per row group for ``table``: about ``RUN_GROUP_BYTES`` of it."""
    if table.num_rows == 0:
        return MIN_GROUP_ROWS
    per_row = max(1, table.nbytes // table.num_rows)
    return max(MIN_GROUP_ROWS, RUN_GROUP_BYTES // per_row)


def sort_run(table: pa.Table, key: str) -> pa.Table:
    """``table`` sorted by ``key``, rows of one key in their order (a stable sort)."""
    values = table[key]
    if len(values) < 2:
        return table
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if bool(pc.all(pc.greater_equal(arr.slice(1), arr.slice(0, len(arr) - 1))).as_py()):
        return table  # already sorted: most merges' outputs and every run read back
    return table.take(pc.sort_indices(table, [(key, "ascending")]))


def write_run(path: Path, table: pa.Table | None, key: str, compression: str = "zstd") -> int:
    """``table`` as a run at ``path`` (written atomically); none at all when it has no rows (a stale file
    of an earlier attempt is removed). Returns the rows written."""
    if table is None or table.num_rows == 0:
        path.unlink(missing_ok=True)
        return 0
    table = sort_run(table, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        _write_sorted(tmp, table, key, compression)
    return table.num_rows


def _write_sorted(path: Path, table: pa.Table, key: str, compression: str = "zstd") -> None:
    pq.write_table(
        table,
        path,
        row_group_size=group_rows(table),
        compression=compression,
        write_page_checksum=True,
        **key_encoding(table.schema, key),
    )


def key_encoding(schema: pa.Schema, key: str) -> dict[str, Any]:
    """A run's key column delta-encoded (sorted: a few bits a row at any number of keys), the others as
    Parquet's defaults. Dictionary-encoded, the key fell back to plain 4 bytes a row once a row group held
    more distinct keys than a dictionary page takes: a run's bytes per row grew with the partitions."""
    pages = {"data_page_size": RUN_PAGE_BYTES, "dictionary_pagesize_limit": RUN_PAGE_BYTES}
    if not pa.types.is_integer(schema.field(key).type):
        return pages
    return {
        "use_dictionary": [p for p in _leaf_paths(schema) if p != key],
        "column_encoding": {key: "DELTA_BINARY_PACKED"},
        **pages,
    }


@functools.lru_cache(maxsize=64)
def _leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet column paths of ``schema``'s leaves (``a.list.element`` for a list column ``a``)."""
    buf = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), buf)
    leaves = pq.ParquetFile(pa.BufferReader(buf.getvalue())).schema
    return tuple(leaves.column(i).path for i in range(len(leaves)))


class RunSink:
    """Rows gathered batch by batch, written as one run on ``close`` (sorted by ``key``)."""

    def __init__(self, path: Path, key: str = "part") -> None:
        self.path = path
        self.key = key
        self.rows = 0
        self._parts: list[pa.Table] = []

    def write(self, table: pa.Table | None) -> None:
        if table is not None and table.num_rows:
            self._parts.append(table)

    def close(self) -> int:
        table = pa.concat_tables(self._parts, promote_options="permissive") if self._parts else None
        self._parts = []
        self.rows = write_run(self.path, table, self.key)
        return self.rows

    def abort(self) -> None:
        self._parts = []


class SortedRunWriter:
    """Rows added table by table (a partition task's outputs, part after part), written on ``close`` as
    one run at ``path``: the rows ``write_run`` would write of them all concatenated (sorted by ``key``,
    rows of a key in the order added), holding about ``budget`` decoded bytes however many rows come.
    Past the budget the rows held are sorted and spilled to a file under ``scratch`` (local, never
    committed, not a task's output), and ``close`` merges the spills (``merge_range``: key, then spill
    in order, then row: the stable sort of every row added). Before, a partition task concatenated its
    parts' outputs and sorted them whole: 2-3x a round's forwarded rows at once (2.9 GiB for MinHash's
    round 8 at a 10 TB crawl's proportions, bench/scaling/crawl_proportions.py)."""

    def __init__(self, path: Path, key: str, budget: int, scratch: Path) -> None:
        self.path, self.key, self.budget, self.scratch = path, key, budget, scratch
        self.rows = 0
        self._parts: list[pa.Table] = []
        self._held = 0
        self._spills: list[Path] = []
        self._folder: Path | None = None
        self._lo: int | None = None
        self._hi: int | None = None

    def add(self, table: pa.Table | None) -> None:
        if table is None or not table.num_rows:
            return
        bounds = pc.min_max(table[self.key])
        lo, hi = int(bounds["min"].as_py()), int(bounds["max"].as_py())
        self._lo = lo if self._lo is None else min(self._lo, lo)
        self._hi = hi if self._hi is None else max(self._hi, hi)
        self._parts.append(table)
        self._held += table.nbytes
        if self._held >= self.budget:
            self._spill()

    def _spill(self) -> None:
        if not self._parts:
            return
        if self._folder is None:
            import tempfile

            self.scratch.mkdir(parents=True, exist_ok=True)
            self._folder = Path(tempfile.mkdtemp(prefix=f"{self.path.stem}-", dir=self.scratch))
        table = sort_run(pa.concat_tables(self._parts, promote_options="permissive"), self.key)
        self._parts, self._held = [], 0
        spill = self._folder / f"{len(self._spills):06d}.parquet"
        _write_sorted(spill, table, self.key)
        self._spills.append(spill)

    def close(self) -> int:
        """Write the run (none when no rows came: a stale file is removed); returns its rows."""
        try:
            if not self._spills:
                table = pa.concat_tables(self._parts, promote_options="permissive") if self._parts else None
                self._parts = []
                self.rows = write_run(self.path, table, self.key)
                return self.rows
            self._spill()
            # Not pre-buffered: each spill's range is all of it, read whole into memory at once (75 spills of
            # MinHash round 8's forwarded rows held 1.7 GiB).
            files = [local_parquet(p) for p in self._spills]
            schema = pa.unify_schemas([f.schema_arrow for f in files], promote_options="permissive")
            assert self._lo is not None and self._hi is not None
            self.rows = merge_range(files, self.key, self._lo, self._hi + 1, self.path, schema, self.budget)
            for f in files:
                f.close()
            return self.rows
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the rows held and the spills (the task failed, or the run is written)."""
        self._parts, self._held = [], 0
        if self._folder is not None:
            import shutil

            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder, self._spills = None, []


def key_column(f: pq.ParquetFile, key: str) -> int:
    """The Parquet leaf column of ``key`` (its statistics say which row groups hold which keys)."""
    meta = f.metadata
    for i in range(meta.num_columns):
        if meta.schema.column(i).path == key:
            return i
    raise KeyError(f"{key!r} is not a column of a run")


def groups_in(f: pq.ParquetFile, key: str, lo: int, hi: int) -> list[int]:
    """The row groups of run ``f`` that may hold keys in [lo, hi): contiguous, since the run is sorted."""
    meta = f.metadata
    col = key_column(f, key)
    out = []
    for rg in range(meta.num_row_groups):
        info = meta.row_group(rg)
        if not info.num_rows:
            continue
        stats = info.column(col).statistics
        if stats is None or not stats.has_min_max or (stats.max >= lo and stats.min < hi):
            out.append(rg)
    return out


def _slice(table: pa.Table, key: str, lo: int, hi: int) -> pa.Table:
    values = table[key].to_numpy()
    a, b = np.searchsorted(values, [lo, hi], side="left")
    return table.slice(int(a), int(b - a))


def read_range(
    files: Sequence[pq.ParquetFile], key: str, lo: int, hi: int, columns: list[str] | None = None, schema: pa.Schema | None = None
) -> pa.Table | None:
    """The rows of ``files`` (runs, in writer order) with ``lo <= key < hi``, sorted by key, then file,
    then row; None when there are no files. Of each file only the row groups overlapping the range are
    read: one contiguous byte range. ``schema``: the result's (default: the first file's)."""
    if not files:
        return None
    if schema is None:
        schema = files[0].schema_arrow
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
    tables = []
    for f in files:
        groups = groups_in(f, key, lo, hi)
        if not groups:
            continue
        table = _slice(f.read_row_groups(groups, columns=columns), key, lo, hi)
        if table.num_rows:
            tables.append(table.select(schema.names).cast(schema) if table.schema != schema else table)
    if not tables:
        return schema.empty_table()
    table = pa.concat_tables(tables)
    return sort_run(table, key) if len(tables) > 1 and hi - lo > 1 else table


class _RangeReader:
    """One run's rows with keys in [lo, hi), read ``rows`` at a time (a Parquet record batch reader over
    the row groups holding the range: a read decodes about ``rows`` rows, not a whole row group)."""

    def __init__(self, f: pq.ParquetFile, key: str, lo: int, hi: int, rows: int, schema: pa.Schema) -> None:
        self.key, self.lo, self.hi, self.schema = key, lo, hi, schema
        groups = groups_in(f, key, lo, hi)
        self._batches = iter(f.iter_batches(batch_size=rows, row_groups=groups, use_threads=False)) if groups else iter(())
        self.done = False

    def read(self) -> pa.Table | None:
        """Its next rows in range (None: none left)."""
        while not self.done:
            batch = next(self._batches, None)
            if batch is None:
                break
            keys = batch.column(self.key).to_numpy()
            a, b = np.searchsorted(keys, [self.lo, self.hi], side="left")
            if b < len(keys):
                self.done = True  # past the range: the run is sorted
            if b > a:
                table = pa.Table.from_batches([batch.slice(int(a), int(b - a))])
                return table.select(self.schema.names).cast(self.schema) if table.schema != self.schema else table
        self.done = True
        return None


def decoded_row_bytes(f: pq.ParquetFile) -> int:
    """About the bytes a row of run ``f`` takes decoded (in Arrow): each fixed-width column's width, each
    other column its offsets and its bytes in the file uncompressed. Parquet's own uncompressed sizes
    undercount what a reader holds (dictionary indices, not values; nulls as levels): a round's rows of
    58 bytes decoded are 12 in the file, and a merge sized by those held ~5x its budget."""
    meta = f.metadata
    rows = max(1, meta.num_rows)
    stored: dict[str, int] = {}
    for rg in range(meta.num_row_groups):
        info = meta.row_group(rg)
        for c in range(info.num_columns):
            col = info.column(c)
            top = col.path_in_schema.split(".")[0]
            stored[top] = stored.get(top, 0) + col.total_uncompressed_size
    total = 0
    for field in f.schema_arrow:
        try:
            total += max(1, field.type.bit_width // 8)
        except ValueError:  # not fixed width: offsets and values
            total += 8 + stored.get(field.name, 0) // rows
    return max(1, total)


def read_rows(files: Sequence[pq.ParquetFile], budget: int) -> int:
    """Rows to read of each of ``files`` at a time so that a merge buffers about ``budget`` decoded bytes:
    every input holds up to two reads (one being merged, one read ahead)."""
    per_row = max(decoded_row_bytes(f) for f in files[:8])  # a merge's inputs share one schema and rows
    return max(MIN_READ_ROWS, budget // (2 * len(files) * per_row))


def merged(
    files: Sequence[pq.ParquetFile], key: str, lo: int, hi: int, schema: pa.Schema, budget: int = MERGE_MEMORY_BYTES
) -> Iterator[pa.Table]:
    """The rows of ``files`` (runs, in writer order) with keys in [lo, hi), in the order ``read_range`` gives
    (key, then file, then row), as a stream of tables: a k-way merge holding about ``budget`` decoded bytes
    (``read_rows`` rows of each input, and one more read ahead), whatever the fan-in or the row width.

    Each step tops every input up to at least one read, then yields every buffered row below the smallest
    last key among the inputs with more to read (no input can still hold a row below it). A key with more
    rows in one input than a read holds is read on until the input's next key (bounded by a partition's
    rows: ``split.partition_rows`` / ``partition_bytes``)."""
    n = read_rows(files, budget)
    readers = [_RangeReader(f, key, lo, hi, n, schema) for f in files]
    bufs: list[pa.Table | None] = [None] * len(readers)
    while True:
        for i, r in enumerate(readers):
            held = bufs[i]
            if not r.done and (held is None or held.num_rows < n):
                more = r.read()
                if more is not None:
                    bufs[i] = more if held is None else pa.concat_tables([held, more])
        lasts = [int(b[key][-1].as_py()) for b, r in zip(bufs, readers) if b is not None and b.num_rows and not r.done]
        bound = min(lasts) if lasts else hi
        out = []
        for i, b in enumerate(bufs):
            if b is None or not b.num_rows:
                continue
            cut = int(np.searchsorted(b[key].to_numpy(), bound, side="left"))
            if cut:
                out.append(b.slice(0, cut))
                bufs[i] = b.slice(cut) if cut < b.num_rows else None
        if out:
            table = pa.concat_tables(out)
            out = []  # the buffers' rows yielded are released before the next reads (else held twice)
            yield sort_run(table, key) if table.num_columns and len(table[key].chunks) > 1 else table
            del table
            continue
        if not lasts:
            return  # every input read and every row yielded
        # Nothing below the bound: the inputs whose buffer holds only the bound's key read on.
        for i, (b, r) in enumerate(zip(bufs, readers)):
            if b is not None and b.num_rows and not r.done and int(b[key][0].as_py()) == bound:
                more = r.read()
                if more is not None:
                    bufs[i] = pa.concat_tables([b, more])


def merge_range(
    files: Sequence[pq.ParquetFile],
    key: str,
    lo: int,
    hi: int,
    out: Path,
    schema: pa.Schema | None = None,
    budget: int = MERGE_MEMORY_BYTES,
) -> int:
    """The rows of ``files`` (runs, in writer order) with keys in [lo, hi), as one run at ``out``, in the
    order ``read_range`` gives; streamed (``merged``: about ``budget`` decoded bytes held). Returns rows."""
    if not files:
        out.unlink(missing_ok=True)
        return 0
    schema = schema or files[0].schema_arrow
    written = 0
    writer: pq.ParquetWriter | None = None
    pending: list[pa.Table] = []
    held = 0
    step = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        try:
            for table in merged(files, key, lo, hi, schema, budget):
                if writer is None:
                    writer = pq.ParquetWriter(
                        tmp, schema, compression="zstd", write_page_checksum=True, **key_encoding(schema, key)
                    )
                    step = group_rows(table)
                pending.append(table)
                held += table.num_rows
                if held >= step:  # whole row groups of about RUN_GROUP_BYTES, as write_run writes them
                    rows = pa.concat_tables(pending)
                    full = held - held % step
                    for start in range(0, full, step):
                        writer.write_table(rows.slice(start, step))
                    pending, held = ([rows.slice(full)], held - full) if held > full else ([], 0)
                written += table.num_rows
            if writer is not None and held:
                writer.write_table(pa.concat_tables(pending))
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            tmp.unlink(missing_ok=True)
    if not written:
        out.unlink(missing_ok=True)
    return written


def iter_parts(
    files: Sequence[pq.ParquetFile], key: str, lo: int, hi: int, budget: int = MERGE_MEMORY_BYTES
) -> Iterator[tuple[int, pa.Table]]:
    """(key, its rows) of the runs ``files`` with keys in [lo, hi), in key order: what ``iter_keys`` gives
    of ``read_range``'s table, streamed (``merged``: about ``budget`` decoded bytes buffered, plus one
    key's rows), so a partition task holds one part at a time, not all of its rows and their sort."""
    if not files:
        return
    carry: pa.Table | None = None
    for table in merged(files, key, lo, hi, files[0].schema_arrow, budget):
        if carry is not None:
            table = pa.concat_tables([carry, table])
        values = table[key].to_numpy()
        cut = int(np.searchsorted(values, values[-1], side="left"))  # the last key may go on in the next rows
        if cut:
            yield from iter_keys(table.slice(0, cut).combine_chunks(), key)
        carry = table.slice(cut)
    if carry is not None and carry.num_rows:
        yield from iter_keys(carry.combine_chunks(), key)


def iter_keys(table: pa.Table, key: str) -> Iterator[tuple[int, pa.Table]]:
    """(key, its rows) of a table sorted by ``key``, in key order."""
    if not table.num_rows:
        return
    values = table[key].to_numpy()
    cuts = np.flatnonzero(np.diff(values)) + 1
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(values)]):
        yield int(values[a]), table.slice(int(a), int(b - a))


Opener = Callable[[str], pq.ParquetFile]
