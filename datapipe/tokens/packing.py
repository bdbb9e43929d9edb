"""Packing tokenized documents into fixed-length rows.

``concat``: documents (each already ending in EOS) are laid end to end in the run's
deterministic order and cut every ``row_len`` tokens, so no token is wasted; a document
may cross a row boundary. Only the very last row of a split is padded.

``bestfit``: whole documents are placed into rows by best-fit-decreasing over a bounded
window of documents (so packing streams), and rows are padded at the end. A document
longer than a row is cut into row-sized chunks; its tail opens a row of its own, so it
is never mistaken for a new document.

Each row records where documents start in it, so loaders can reset position ids and
build document masks.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from datapipe.tokens.shard_format import ShardMeta


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
        return self.add_pieces(flat, doc_offsets[:-1])

    def add_pieces(self, flat: np.ndarray, starts: np.ndarray) -> PackedRows:
        """Add a stretch of the token stream and the positions in it where documents start (a stretch
        may begin inside a document: how a range task of parallel packing starts mid-stream)."""
        base = len(self._carry)
        stream = np.concatenate([self._carry, flat.astype(self.dtype, copy=False)])
        starts = np.concatenate([np.asarray(self._carry_starts, dtype=np.int64), np.asarray(starts, dtype=np.int64) + base])
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


@dataclass
class BestFitPacker:
    """Best-fit-decreasing over windows of ``window`` documents; same input, same rows.

    Within a window, documents are placed longest first, each into the open row with the
    least room that still holds it (ties: the row opened first). Rows come out ordered by
    their first piece's position in the input, so shards stay close to input order.
    """

    row_len: int
    pad_id: int
    dtype: np.dtype
    window: int = 4096
    _docs: list[np.ndarray] = field(default_factory=list)

    def add(self, flat: np.ndarray, doc_offsets: np.ndarray) -> PackedRows:
        parts = []
        for a, b in zip(doc_offsets[:-1].tolist(), doc_offsets[1:].tolist()):
            self._docs.append(flat[a:b].astype(self.dtype))  # a copy: the caller's buffer may be unmapped
            if len(self._docs) >= self.window:
                parts.append(self._pack())
        return concat_rows(parts, self.row_len, self.dtype)

    def finish(self) -> PackedRows:
        return self._pack()

    def _pack(self) -> PackedRows:
        docs, self._docs = self._docs, []
        L = self.row_len
        # A row is a list of pieces (doc index, chunk index, start offset in doc, length).
        rows: list[list[tuple[int, int, int, int]]] = []
        room: list[tuple[int, int]] = []  # sorted (free tokens, row index) of rows that can take more
        whole: list[tuple[int, int]] = []
        for i, doc in enumerate(docs):
            n = len(doc)
            if n <= L:
                whole.append((n, i))
                continue
            full, tail = divmod(n, L)
            rows.extend([[(i, c, c * L, L)] for c in range(full)])
            if tail:  # must sit at position 0: a row start is a segment start, a mid-row position is not
                rows.append([(i, full, full * L, tail)])
                room.append((L - tail, len(rows) - 1))
        room.sort()
        whole.sort(key=lambda t: (-t[0], t[1]))
        for n, i in whole:
            k = bisect.bisect_left(room, (n, -1))
            if k == len(room):
                rows.append([(i, 0, 0, n)])
                if n < L:
                    bisect.insort(room, (L - n, len(rows) - 1))
                continue
            free, r = room.pop(k)
            rows[r].append((i, 0, 0, n))
            if free > n:
                bisect.insort(room, (free - n, r))
        for row in rows:  # a tail stays first; whole documents follow in input order
            row[1:] = sorted(row[1:])
        rows.sort(key=lambda r: r[0][:2])
        tokens = np.full((len(rows), L), self.pad_id, dtype=self.dtype)
        n_tokens = np.zeros(len(rows), dtype=np.int32)
        splits = np.zeros(len(rows) + 1, dtype=np.int32)
        starts: list[int] = []
        for j, row in enumerate(rows):
            pos = 0
            for i, _, off, n in row:
                tokens[j, pos : pos + n] = docs[i][off : off + n]
                if off == 0:
                    starts.append(pos)
                pos += n
            n_tokens[j] = pos
            splits[j + 1] = len(starts)
        return PackedRows(tokens, splits, np.asarray(starts, dtype=np.int32), n_tokens)


def make_packer(mode: str, row_len: int, pad_id: int, dtype: np.dtype, window: int) -> ConcatPacker | BestFitPacker:
    if mode == "bestfit":
        return BestFitPacker(row_len, pad_id, dtype, window)
    if mode == "concat":
        return ConcatPacker(row_len, pad_id, dtype)
    raise ValueError(f"unknown packing mode {mode!r}; allowed: concat, bestfit")


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
        return PackedRows(np.empty((0, row_len), dtype), np.zeros(1, np.int32), np.empty(0, np.int32), np.empty(0, np.int32))
    splits = [parts[0].doc_start_splits]
    for p in parts[1:]:
        splits.append(p.doc_start_splits[1:] + splits[-1][-1])
    return PackedRows(
        np.concatenate([p.tokens for p in parts]),
        np.concatenate(splits),
        np.concatenate([p.doc_start_values for p in parts]),
        np.concatenate([p.n_tokens for p in parts]),
    )


def take_rows(rows: PackedRows, lo: int, hi: int) -> PackedRows:
    s = rows.doc_start_splits
    return PackedRows(rows.tokens[lo:hi], s[lo : hi + 1] - s[lo], rows.doc_start_values[s[lo] : s[hi]], rows.n_tokens[lo:hi])


_NO_TOKENS = np.empty((0, 0), np.uint8)


@dataclass
class ShardBuffer:
    """Collects packed rows and hands out full shards of ``rows_per_shard`` rows.

    Rows are copied into one shard-sized array as they come (a shard is written from it as is):
    concatenating the pending parts once a shard was full held the parts, the merged copy and the
    rest (a view keeping the merged copy alive) at once, about three shards of tokens at the peak.
    """

    rows_per_shard: int
    row_len: int
    dtype: np.dtype
    count: int = 0
    _tokens: np.ndarray | None = field(default=None, repr=False)
    _meta: list[PackedRows] = field(default_factory=list, repr=False)  # each added part, tokens left out

    def add(self, rows: PackedRows) -> Iterator[PackedRows]:
        n, i = len(rows.n_tokens), 0
        while i < n:
            if self._tokens is None:  # a fresh array per shard: a yielded shard stays valid
                self._tokens = np.empty((self.rows_per_shard, self.row_len), self.dtype)
            take = min(n - i, self.rows_per_shard - self.count)
            part = take_rows(rows, i, i + take)
            self._tokens[self.count : self.count + take] = part.tokens
            self._meta.append(replace(part, tokens=_NO_TOKENS))  # not a view: it would keep the input alive
            self.count += take
            i += take
            if self.count == self.rows_per_shard:
                yield self._take()

    def finish(self) -> Iterator[PackedRows]:
        if self.count:
            yield self._take()

    def _take(self) -> PackedRows:
        assert self._tokens is not None
        shard = concat_rows(self._meta, self.row_len, self.dtype)
        shard.tokens = self._tokens[: self.count]
        self._tokens, self._meta, self.count = None, [], 0
        return shard


def shard_meta_for(meta: ShardMeta, rows: PackedRows) -> ShardMeta:
    return replace(meta, documents=int(len(rows.doc_start_values)))
