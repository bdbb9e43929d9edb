"""Row keys: how the map tasks and a global stage's steps name a document of the map outputs.

A row key is ``shard_ordinal << 32 | row``, ``row`` the document's position in its shard's map
output: one int64 per document, ordered as the run is (shard order, then position), so the lowest
key of a group is its earliest document. The layout is defined here only: the map task makes the
keys (``shuffle``'s first key, the keys ``apply`` gets), ``ParquetReduceInputs`` reads documents by
them, and the stage contract turns them back into shards (``datapipe.stages.global_stage.drop_rows``).
"""

from __future__ import annotations

import numpy as np

ROW_KEY_SHIFT = 32  # a shard's map output holds fewer than 2**32 documents


def row_key(shard: int, row: int) -> int:
    """The key of the document at position ``row`` of the shard's map output."""
    return (shard << ROW_KEY_SHIFT) + row


def row_keys(shard: int, first_row: int, n: int) -> np.ndarray:
    """The keys of ``n`` consecutive documents of a shard's map output, from position ``first_row``."""
    return row_key(shard, first_row) + np.arange(n, dtype=np.int64)


def shard_of(keys: np.ndarray) -> np.ndarray:
    """The shard ordinal of each row key (int64)."""
    return np.asarray(keys, dtype=np.int64) >> ROW_KEY_SHIFT


def row_of(keys: np.ndarray) -> np.ndarray:
    """The position of each row key's document in its shard's map output (int64)."""
    return np.asarray(keys, dtype=np.int64) & ((1 << ROW_KEY_SHIFT) - 1)
