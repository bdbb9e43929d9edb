"""ParquetReduceInputs.read_rows: the rows a global stage asks for, in its order, read from the row groups
that hold them only (a MinHash partition needs a few documents of every shard)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.engine.tasks.reduce_inputs import ParquetReduceInputs
from datapipe.stages.row_keys import ROW_KEY_SHIFT


def _shards(folder: Path, sizes: list[list[int]]) -> list[str]:
    """One Parquet file per shard, one row group per batch size, as a map task writes them."""
    files = []
    for shard, batches in enumerate(sizes):
        path = folder / f"{shard}.parquet"
        with pq.ParquetWriter(path, pa.schema([("row", pa.int64()), ("text", pa.string())])) as writer:
            start = 0
            for n in batches:
                rows = np.arange(start, start + n)
                writer.write_table(pa.table({"row": rows, "text": [f"shard {shard} row {r}" for r in rows]}))
                start += n
        files.append(str(path))
    return files


def test_rows_come_back_in_the_asked_order_across_shards_and_row_groups(tmp_path: Path) -> None:
    sizes = [[7, 1, 13, 5, 20], [3, 30], [50]]
    inputs = ParquetReduceInputs(_shards(tmp_path, sizes), [0, 1, 2], str(tmp_path))
    rng = np.random.default_rng(7)
    for _ in range(50):
        keys = np.concatenate(
            [(shard << ROW_KEY_SHIFT) + rng.choice(sum(b), rng.integers(1, 8), replace=False) for shard, b in enumerate(sizes)]
        )
        rng.shuffle(keys)
        got = inputs.read_rows(keys, ["text"])["text"].to_pylist()
        assert got == [f"shard {k >> ROW_KEY_SHIFT} row {k & ((1 << ROW_KEY_SHIFT) - 1)}" for k in keys]


def test_only_the_row_groups_holding_the_rows_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = ParquetReduceInputs(_shards(tmp_path, [[10] * 10]), [0], str(tmp_path))
    read: list[list[int]] = []
    original = pq.ParquetFile.read_row_groups

    def recording(self, row_groups, *args, **kwargs):
        read.append(list(row_groups))
        return original(self, row_groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", recording)
    got = inputs.read_rows(np.array([95, 3, 41, 47]), ["row"])["row"].to_pylist()
    assert got == [95, 3, 41, 47]
    assert read == [[0, 4, 9]]
