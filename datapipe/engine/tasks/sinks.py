"""Where a task's rows go: Parquet files and token files written to a temporary name and renamed
on close, so a reader (and resume) only ever sees complete files.

Every Parquet file of a run carries a CRC32 of each page (``write_page_checksum``): a reader that
asks (``page_checksum_verification``: the audit's datasets, exports, the tasks reading map
outputs) finds a page damaged on disk when it decodes it, for free, where a bit flipped in a
compressed page otherwise often decodes to other text without any error. Measured on a 700 KB
text column: 23 bytes more per file (a checksum per page header)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.config.mixture import REPEAT_COLUMN
from datapipe.storage.atomic import atomic_path, note_written, temp_path_for
from datapipe.tokens.encode import TOKENS_TYPE


class ParquetSink:
    """A Parquet file written batch by batch to a temporary name and renamed on close.

    It opens on the first non-empty batch, so a shard with nothing to write leaves no file.
    """

    def __init__(self, path: Path, compression: str = "zstd") -> None:
        self.path = path
        self.rows = 0
        self.compression = compression
        # The smallest and largest ``id`` written: recorded in the task's marker (``audit_files``), so
        # `datapipe explain ID` reads only the files whose range holds the id (audit/documents.py).
        self.min_id: str | None = None
        self.max_id: str | None = None
        self._tmp: Path | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = temp_path_for(self.path)
            # zstd: text compresses well; dictionary-encoded source/kind columns cost nothing.
            self._writer = pq.ParquetWriter(self._tmp, table.schema, compression=self.compression, write_page_checksum=True)
        else:
            table = table.select(self._writer.schema.names).cast(self._writer.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows
        if "id" in table.column_names:
            bounds = pc.min_max(table["id"])
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if lo is not None:
                self.min_id = lo if self.min_id is None else min(self.min_id, lo)
                self.max_id = hi if self.max_id is None else max(self.max_id, hi)

    def audit_entry(self, root: Path, status: str) -> dict[str, Any] | None:
        """What the audit database needs of this file, for the marker (None: nothing was written):
        its path in the run folder, status, rows, id range and columns with their Arrow types, so
        the driver builds ``documents`` from markers alone, without opening the file."""
        if self._writer is None:
            return None
        return {
            "path": self.path.relative_to(root).as_posix(),
            "status": status,
            "rows": self.rows,
            "min_id": self.min_id,
            "max_id": self.max_id,
            "columns": [[f.name, str(f.type)] for f in self._writer.schema],
        }

    def close(self) -> None:
        if self._writer is None:
            self.path.unlink(missing_ok=True)  # a stale file from an earlier attempt must not count
            return
        self._writer.close()
        assert self._tmp is not None
        self._tmp.replace(self.path)
        note_written(self.path)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            assert self._tmp is not None
            self._tmp.unlink(missing_ok=True)


class TokenSink:
    """Per-shard token lists (id, split, tokens) as an Arrow IPC file for the packing phase."""

    SCHEMA = pa.schema([("id", pa.string()), ("split", pa.string()), ("tokens", TOKENS_TYPE)])
    # A source with mixture repeats adds each document's count (config/mixture.py), which packing reads.
    REPEAT_SCHEMA = SCHEMA.append(pa.field(REPEAT_COLUMN, pa.int32()))

    def __init__(self, path: Path, repeats: bool = False, compress: bool = False) -> None:
        self.path = path
        self.tokens = 0
        self.split_tokens: dict[str, int] = {}
        self.repeats = repeats
        self._ctx = atomic_path(path)
        self._tmp = self._ctx.__enter__()
        # ``compress`` (a run folder in object storage): the file is uploaded, and a pack task on
        # another node downloads it; zstd makes it several times smaller (uint32 ids of a small
        # vocabulary, int64 offsets) for little CPU. A local run folder keeps it uncompressed
        # (memory-mapped reads, no CPU spent).
        options = pa.ipc.IpcWriteOptions(compression="zstd" if compress else None)
        self._writer = pa.ipc.new_file(str(self._tmp), self.REPEAT_SCHEMA if repeats else self.SCHEMA, options=options)

    def write(self, ids: pa.Array, split: pa.Array, tokens: pa.LargeListArray, repeat: pa.Array | None = None) -> None:
        if self.repeats:
            assert repeat is not None
            self._writer.write_table(pa.table([ids, split, tokens, repeat], schema=self.REPEAT_SCHEMA))
        else:
            self._writer.write_table(pa.table([ids, split, tokens], schema=self.SCHEMA))
        lengths = pc.list_value_length(tokens)  # .values ignores a slice's offset
        self.tokens += int(pc.sum(lengths).as_py() or 0)  # the kept documents' tokens, each once
        if repeat is not None:  # per split, what the packed shards will hold: each document its count of times
            lengths = pc.multiply(pc.cast(lengths, pa.int64()), pc.cast(repeat, pa.int64()))
        for name in ("train", "val"):  # per split: parallel packing places its ranges from these
            n = int(pc.sum(pc.if_else(pc.equal(split, name), lengths, 0)).as_py() or 0)
            self.split_tokens[name] = self.split_tokens.get(name, 0) + n

    def close(self) -> None:
        self._writer.close()
        self._ctx.__exit__(None, None, None)

    def abort(self) -> None:
        self._writer.close()
        self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
