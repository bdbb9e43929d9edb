"""The corpus-wide ``sample.max_docs`` cap: the k sampled documents with the smallest seeded hash.

A bottom-k sample, exact and deterministic whatever the sharding, the order or the cluster. Each map
task before the stage's combine step keeps its own k smallest ``(hash, id)`` pairs so far and writes
the hash (a column) only of the documents that entered them: in input order, which the hash does
not follow, about k x (1 + ln(n / k)) of a task's n sampled documents, never more than n; the others
have k smaller pairs in that task alone, so they cannot be among the corpus's k. The combine step
streams those two columns of every map output, keeping the k smallest pairs: memory O(k + one
batch), reading O(tasks x k x log n) hashes, however large the corpus. The k-th pair is the
threshold every map task after it reads (one row), asking only for documents at or below it. Ties
of the 64-bit hash are broken by id.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

THRESHOLD_SCHEMA = pa.schema([("hash", pa.uint64()), ("id", pa.string())])


def sample_hash(doc_id: str, seed: int) -> int:
    """The seeded 64-bit hash of an id that both ``sample.fraction`` and ``sample.max_docs`` read."""
    digest = hashlib.blake2b(doc_id.encode(), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "big")


class BottomK:
    """The k smallest (hash, id) pairs of everything added, holding at most k of them (a max-heap)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._heap: list[tuple[int, _Desc]] = []  # (-hash, id reversed): the largest pair on top

    def add(self, hashes: pa.Array | pa.ChunkedArray, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Pairs of one batch, in order; null hashes (documents not sampled) are skipped. Returns where a
        pair entered the k smallest when it was added: a pair that did not has k smaller ones here, so it
        is in no bottom-k of a corpus that holds these pairs."""
        h = np.asarray(pc.fill_null(hashes, 0).to_numpy(zero_copy_only=False), np.uint64)
        candidate = np.asarray(pc.is_valid(hashes).to_numpy(zero_copy_only=False), bool)
        if len(self._heap) >= self.k:
            # Most pairs of a large corpus cannot enter: drop them in numpy before any Python loop.
            candidate &= h <= np.uint64(-self._heap[0][0])
        entered = np.zeros(len(h), bool)
        rows = np.flatnonzero(candidate)
        id_list = pc.take(ids, pa.array(rows, pa.int64())).to_pylist() if len(rows) else []
        for row, doc_id in zip(rows.tolist(), id_list):
            item = (-int(h[row]), _Desc(doc_id))
            if len(self._heap) < self.k:
                heapq.heappush(self._heap, item)
            elif item > self._heap[0]:  # (hash, id) smaller than the largest kept pair
                heapq.heapreplace(self._heap, item)
            else:
                continue
            entered[row] = True
        return entered

    def threshold(self) -> pa.Table:
        """The k-th smallest pair (one row), or no row where fewer than k were added (all are in)."""
        if len(self._heap) < self.k:
            return THRESHOLD_SCHEMA.empty_table()
        h, i = self._heap[0]
        return pa.table({"hash": pa.array([-h], pa.uint64()), "id": pa.array([i.value], pa.string())})

    def pairs(self) -> list[tuple[int, str]]:
        """The kept pairs, smallest first (for tests and reports)."""
        return sorted((-h, i.value) for h, i in self._heap)


class _Desc:
    """An id ordered backwards, so the max-heap of (-hash, id) has the largest (hash, id) on top."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __lt__(self, other: _Desc) -> bool:
        return self.value > other.value

    def __gt__(self, other: _Desc) -> bool:
        return self.value < other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def picked(hashes: Iterable[int | None], ids: Iterable[str], threshold: pa.Table | None) -> list[bool]:
    """Which documents are asked: sampled (a hash) and at or below the threshold (none: every sampled one)."""
    if threshold is None or threshold.num_rows == 0:
        return [h is not None for h in hashes]
    top = (threshold["hash"][0].as_py(), threshold["id"][0].as_py())
    return [h is not None and (h, i) <= top for h, i in zip(hashes, ids)]
