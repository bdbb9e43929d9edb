"""Packing tokenized documents into fixed-length rows (the ``concat`` mode).

Documents (each already ending in EOS) are laid end to end in the run's deterministic
order and cut every ``row_len`` tokens, so no token is wasted; a document may cross
a row boundary. Each row records where documents start in it, so loaders can reset
position ids and build document masks. Only the very last row of a split is padded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from datapipe.shard_format import ShardMeta


@dataclass
class PackedRows:
    tokens: np.ndarray  # (rows, row_len)
    doc_start_splits: np.ndarray  # (rows + 1,)
    doc_start_values: np.ndarray
    n_tokens: np.ndarray  # (rows,)


@dataclass
class ConcatPacker:
    """Streams documents in and full rows out; carries the unfinished row between calls."""

    row_len: int
    pad_id: int
    dtype: np.dtype
    _carry: np.ndarray = field(init=False)
    _carry_starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._carry = np.empty(0, dtype=self.dtype)

    def add(self, flat: np.ndarray, doc_offsets: np.ndarray) -> PackedRows:
        """Add documents given as one flat token array and their offsets (n_docs + 1)."""
        base = len(self._carry)
        stream = np.concatenate([self._carry, flat.astype(self.dtype, copy=False)])
        starts = np.concatenate([np.asarray(self._carry_starts, dtype=np.int64), doc_offsets[:-1] + base])
        n_rows = len(stream) // self.row_len
        cut = n_rows * self.row_len
        rows = _rows(stream[:cut], starts[starts < cut], n_rows, self.row_len)
        self._carry = stream[cut:].copy()
        self._carry_starts = (starts[starts >= cut] - cut).tolist()
        return rows

    def finish(self) -> PackedRows:
        """The last, padded row (if any tokens are left)."""
        n = len(self._carry)
        if n == 0:
            return _rows(np.empty(0, self.dtype), np.empty(0, np.int64), 0, self.row_len)
        row = np.full(self.row_len, self.pad_id, dtype=self.dtype)
        row[:n] = self._carry
        packed = _rows(row, np.asarray(self._carry_starts, np.int64), 1, self.row_len)
        packed.n_tokens[0] = n
        self._carry = np.empty(0, dtype=self.dtype)
        self._carry_starts = []
        return packed


def _rows(stream: np.ndarray, starts: np.ndarray, n_rows: int, row_len: int) -> PackedRows:
    row_of_start = starts // row_len
    splits = np.searchsorted(row_of_start, np.arange(n_rows + 1), side="left").astype(np.int32)
    return PackedRows(
        tokens=stream.reshape(n_rows, row_len),
        doc_start_splits=splits,
        doc_start_values=(starts % row_len).astype(np.int32),
        n_tokens=np.full(n_rows, row_len, dtype=np.int32),
    )


def concat_rows(parts: list[PackedRows], row_len: int, dtype: np.dtype) -> PackedRows:
    parts = [p for p in parts if len(p.n_tokens)]
    if not parts:
        return PackedRows(np.empty((0, row_len), dtype), np.zeros(1, np.int32), np.empty(0, np.int32),
                          np.empty(0, np.int32))
    splits = [parts[0].doc_start_splits]
    for p in parts[1:]:
        splits.append(p.doc_start_splits[1:] + splits[-1][-1])
    return PackedRows(np.concatenate([p.tokens for p in parts]), np.concatenate(splits),
                      np.concatenate([p.doc_start_values for p in parts]), np.concatenate([p.n_tokens for p in parts]))


def take_rows(rows: PackedRows, lo: int, hi: int) -> PackedRows:
    s = rows.doc_start_splits
    return PackedRows(rows.tokens[lo:hi], s[lo : hi + 1] - s[lo], rows.doc_start_values[s[lo] : s[hi]],
                      rows.n_tokens[lo:hi])


@dataclass
class ShardBuffer:
    """Collects packed rows and hands out full shards of ``rows_per_shard`` rows."""

    rows_per_shard: int
    row_len: int
    dtype: np.dtype
    pending: list[PackedRows] = field(default_factory=list)
    count: int = 0

    def add(self, rows: PackedRows) -> Iterator[PackedRows]:
        self.pending.append(rows)
        self.count += len(rows.n_tokens)
        while self.count >= self.rows_per_shard:
            merged = concat_rows(self.pending, self.row_len, self.dtype)
            yield take_rows(merged, 0, self.rows_per_shard)
            rest = take_rows(merged, self.rows_per_shard, len(merged.n_tokens))
            self.pending, self.count = [rest], len(rest.n_tokens)

    def finish(self) -> Iterator[PackedRows]:
        if self.count:
            yield concat_rows(self.pending, self.row_len, self.dtype)
        self.pending, self.count = [], 0


def shard_meta_for(meta: ShardMeta, rows: PackedRows) -> ShardMeta:
    return replace(meta, documents=int(len(rows.doc_start_values)))
