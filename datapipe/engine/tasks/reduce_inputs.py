"""``ReduceInputs`` as the engine writes map outputs: one Parquet file per shard, a batch per row group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.stages.global_stage import ReduceInputs
from datapipe.stages.row_keys import row_of, shard_of


@dataclass(frozen=True)
class ParquetReduceInputs(ReduceInputs):
    # Opens a file of ``files`` for ``read_rows`` (a remote run folder: in place, so only the row
    # groups read cross the store: ``RunFolder.parquet``). None: opened as it is.
    open_file: Callable[[str], pq.ParquetFile] | None = None
    # Shard ordinal -> its map output (None: it has none), asked only for the shards ``read_rows`` reads;
    # None: ``files`` and ``shards`` list them. A partition task of a step that may read any document
    # does not list every shard of the run up front (a loop over the run's shards in every task).
    locate: Callable[[int], str | None] | None = None

    def read_rows(self, row_keys: np.ndarray, columns: list[str]) -> pa.Table:
        """The given columns of the documents with these row keys, in the order of ``row_keys``."""

        row_keys = np.asarray(row_keys, dtype=np.int64)
        order = np.argsort(row_keys, kind="stable")
        sorted_keys = row_keys[order]
        shards = shard_of(sorted_keys)
        by_ordinal = dict(zip(self.shards, self.files))
        parts = []
        for ordinal in np.unique(shards):
            rows = row_of(sorted_keys[shards == ordinal])
            path = by_ordinal.get(int(ordinal)) if self.locate is None else self.locate(int(ordinal))
            if path is None:
                raise KeyError(f"rows of shard {int(ordinal)} asked, and its map output is not among this task's inputs")
            parts.append(_read_row_groups_of(path, rows, columns, self.open_file))
        if not parts:
            return pa.table({c: pa.array([], pa.null()) for c in columns})
        merged = pa.concat_tables(parts)
        return merged.take(pa.array(np.argsort(order, kind="stable")))

    def read_shard(self, ordinal: int, columns: list[str]) -> pa.Table:
        """Every row of one shard's map output (in place from a remote run folder, like ``read_rows``)."""
        path = self.files[self.shards.index(ordinal)]
        file = self.open_file(path) if self.open_file is not None else pq.ParquetFile(path)
        return file.read(columns=columns)


def _read_row_groups_of(
    path: str, rows: np.ndarray, columns: list[str], open_file: Callable[[str], pq.ParquetFile] | None = None
) -> pa.Table:
    """``columns`` of a Parquet file's rows ``rows`` (sorted), reading only the row groups that hold
    them. Map outputs are written a batch (at most ``batch_size`` documents) per row group, and a
    MinHash partition needs a few rows of each shard: reading whole columns made that cost grow
    with partitions x corpus (bench/scaling/scale.py: shuffle1's CPU per document)."""
    file = open_file(path) if open_file is not None else pq.ParquetFile(path)
    meta = file.metadata
    starts = np.zeros(meta.num_row_groups + 1, np.int64)
    starts[1:] = np.cumsum([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
    group_of = np.searchsorted(starts, rows, side="right") - 1
    groups = np.unique(group_of)
    table = file.read_row_groups(groups.tolist(), columns=columns)
    # Where each chosen group begins in ``table``: the groups are read in order, back to back.
    begins = np.zeros(len(groups), np.int64)
    begins[1:] = np.cumsum(starts[groups + 1] - starts[groups])[:-1]
    local = rows - starts[group_of] + begins[np.searchsorted(groups, group_of)]
    return table.take(pa.array(local))
