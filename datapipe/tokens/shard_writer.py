"""Writing one packed token shard (``datapipe/tokens/shard_format.py`` defines the format) and the shards'
manifest: atomically, and recorded as outputs so a run folder in object storage commits them."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict

import numpy as np
import pyarrow as pa

from datapipe.storage.atomic import atomic_path
from datapipe.tokens.shard_format import MANIFEST_COPY_NAME, ShardMeta, file_sha256, shard_schema


def write_manifest(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """The manifest ``table`` as Parquet at ``path`` (what DuckDB and other tools read) and as JSON
    columns beside it stamped with that file's sha256 (what the loader reads: see
    ``shard_format.MANIFEST_COPY_NAME``). The copy is written second, so a copy is never newer than
    the Parquet file it was made from."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    copy = {"parquet_sha256": file_sha256(path), "columns": table.to_pydict()}
    with atomic_path(os.path.join(os.path.dirname(os.fspath(path)), MANIFEST_COPY_NAME)) as tmp:
        tmp.write_text(json.dumps(copy, separators=(",", ":")), encoding="utf-8")


def write_shard(
    path: str | os.PathLike[str],
    tokens: np.ndarray,
    doc_start_splits: np.ndarray,
    doc_start_values: np.ndarray,
    n_tokens: np.ndarray,
    meta: ShardMeta,
    rows_per_batch: int = 4096,
) -> ShardMeta:
    """Write one shard atomically and return the metadata stored in it.

    ``tokens`` is (rows, row_len); row ``i``'s document starts are
    ``doc_start_values[doc_start_splits[i]:doc_start_splits[i+1]]``.
    """
    dtype = np.dtype(meta.dtype)
    tokens = np.ascontiguousarray(tokens, dtype=dtype)
    rows, row_len = tokens.shape
    if row_len != meta.row_len:
        raise ValueError(f"tokens have {row_len} columns, metadata says row_len={meta.row_len}")
    if len(doc_start_splits) != rows + 1 or len(n_tokens) != rows:
        raise ValueError("doc_start_splits must have rows + 1 entries and n_tokens rows entries")
    meta = ShardMeta(
        **{
            **asdict(meta),
            "rows": int(rows),
            "tokens": int(np.sum(n_tokens, dtype=np.int64)),
            "checksum": hashlib.sha256(tokens.data).hexdigest(),
        }
    )  # hashes the buffer, no copy
    schema = shard_schema(meta)
    splits = np.asarray(doc_start_splits, dtype=np.int32)
    values = np.asarray(doc_start_values, dtype=np.int32)
    n_tokens = np.asarray(n_tokens, dtype=np.int32)
    with atomic_path(path) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for lo in range(0, max(rows, 1), rows_per_batch):
                hi = min(rows, lo + rows_per_batch)
                flat = pa.array(tokens[lo:hi].reshape(-1), type=schema.field("input_ids").type.value_type)
                ids = pa.FixedSizeListArray.from_arrays(flat, row_len)
                local = splits[lo : hi + 1] - splits[lo]
                starts = pa.ListArray.from_arrays(
                    pa.array(local, pa.int32()), pa.array(values[splits[lo] : splits[hi]], pa.int32())
                )
                writer.write_batch(pa.record_batch([ids, starts, pa.array(n_tokens[lo:hi], pa.int32())], schema=schema))
    return meta
