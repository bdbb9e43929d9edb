"""Where a task's rows go: Parquet files and token files written to a temporary name and renamed
on close, so a reader (and resume) only ever sees complete files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
        self._tmp: Path | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = temp_path_for(self.path)
            # zstd: text compresses 3-4x; dictionary-encoded source/kind columns cost nothing.
            self._writer = pq.ParquetWriter(self._tmp, table.schema, compression=self.compression)
        else:
            table = table.select(self._writer.schema.names).cast(self._writer.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

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


class ShuffleSink:
    """A shard's shuffle rows, sorted by partition and written one row group per partition,
    so each partition task reads only its own row groups (Parquet statistics skip the rest)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parts: list[pa.Table] = []

    def write(self, table: pa.Table) -> None:
        if table.num_rows:
            self.parts.append(table)

    def close(self) -> None:
        if not self.parts:
            self.path.unlink(missing_ok=True)
            return
        table = pa.concat_tables(self.parts).sort_by([("part", "ascending")])
        part = table["part"].to_numpy()
        bounds = np.flatnonzero(np.diff(part)) + 1
        with atomic_path(self.path) as tmp, pq.ParquetWriter(tmp, table.schema, compression="zstd") as writer:
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(part)]):
                writer.write_table(table.slice(lo, hi - lo))
        self.parts = []

    def abort(self) -> None:
        self.parts = []


class TokenSink:
    """Per-shard token lists (id, split, tokens) as an Arrow IPC file for the packing phase."""

    SCHEMA = pa.schema([("id", pa.string()), ("split", pa.string()), ("tokens", TOKENS_TYPE)])

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tokens = 0
        self.split_tokens: dict[str, int] = {}
        self._ctx = atomic_path(path)
        self._tmp = self._ctx.__enter__()
        self._writer = pa.ipc.new_file(str(self._tmp), self.SCHEMA)

    def write(self, ids: pa.Array, split: pa.Array, tokens: pa.LargeListArray) -> None:
        self._writer.write_table(pa.table([ids, split, tokens], schema=self.SCHEMA))
        lengths = pc.list_value_length(tokens)  # .values ignores a slice's offset
        self.tokens += int(pc.sum(lengths).as_py() or 0)
        for name in ("train", "val"):  # per split: parallel packing places its ranges from these
            n = int(pc.sum(pc.if_else(pc.equal(split, name), lengths, 0)).as_py() or 0)
            self.split_tokens[name] = self.split_tokens.get(name, 0) + n

    def close(self) -> None:
        self._writer.close()
        self._ctx.__exit__(None, None, None)

    def abort(self) -> None:
        self._writer.close()
        self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
