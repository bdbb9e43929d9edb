"""The packed token shard format: the one contract between packing and training loaders.

A shard is an uncompressed Arrow IPC *file* (random access, memory-mappable) with
one row per packed sequence:

``input_ids``   fixed_size_list<uint16|uint32>[row_len]  the tokens; row_len is seq_len,
                or seq_len + 1 when packed for next-token labels
``doc_starts``  list<int32>  positions in the row where a document starts (a row that
                continues a document from the previous row has no 0 entry)
``n_tokens``    int32        tokens in the row that are not padding (padding sits at the end)

Schema metadata (keys prefixed ``datapipe.``) carries everything a loader must check
before mixing shards: tokenizer fingerprint, vocabulary size, lengths, special ids,
packing mode, counts and a checksum of the token buffer. This module depends only on
pyarrow and numpy, so training jobs can import it; writing shards (atomically, recorded for a
run folder) is ``tokens/shard_writer.py``'s.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa

from datapipe.errors import DatapipeError

FORMAT_VERSION = 1
META_KEY = b"datapipe.shard"

# --- the manifest: one row per shard file, beside the shards -----------------------------------
SHARDS_DIR = "shards"  # in the run folder: <run>/shards/<source>/<split>-NNNNN.arrow
MANIFEST_NAME = "manifest.parquet"  # <run>/shards/manifest.parquet
# The same rows as JSON columns beside it, stamped with the Parquet file's sha256: a training process
# reads this copy with the standard library, neither mapping pyarrow's Parquet and filesystem
# libraries nor allocating from Arrow's memory pool (~3-18 MiB it would keep for its whole life, for
# one small read); a copy whose stamp is not the sha256 of the Parquet file beside it (an older run,
# a manifest rewritten by hand) is ignored.
MANIFEST_COPY_NAME = "manifest.json"  # {"parquet_sha256": ..., "columns": {name: [values]}}
MANIFEST_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("source", pa.string()),
        ("split", pa.string()),
        ("rows", pa.int64()),
        ("tokens", pa.int64()),
        ("documents", pa.int64()),
        ("sha256", pa.string()),
        ("tokenizer_fingerprint", pa.string()),
        ("seq_len", pa.int64()),
        ("row_len", pa.int64()),
        ("packing", pa.string()),
    ]
)
# The columns a loader needs (manifests of older runs may lack the others).
MANIFEST_COLUMNS = ("path", "source", "split", "rows", "tokens", "sha256", "tokenizer_fingerprint", "seq_len", "row_len")


def shard_file_name(source: str, split: str, index: int) -> str:
    """A shard file's path under the shards folder: ``<source>/<split>-NNNNN.arrow``."""
    return f"{source}/{split}-{index:05d}.arrow"


def manifest_row(
    path: str,
    source: str,
    split: str,
    rows: int,
    tokens: int,
    documents: int,
    sha256: str,
    tokenizer_fingerprint: str,
    seq_len: int,
    row_len: int,
    packing: str,
) -> dict[str, object]:
    """One manifest row (``path`` relative to the run folder), in ``MANIFEST_SCHEMA``'s order."""
    return {
        "path": path,
        "source": source,
        "split": split,
        "rows": rows,
        "tokens": tokens,
        "documents": documents,
        "sha256": sha256,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "seq_len": seq_len,
        "row_len": row_len,
        "packing": packing,
    }


class ShardCorrupt(DatapipeError, ValueError):
    """A shard's bytes break the format contract or disagree with the manifest.

    The message names the shard and what is wrong. It takes one message argument (plus the
    optional shard name) so that torch's DataLoader can re-raise it with its own type in
    the main process."""

    def __init__(self, message: str, shard: str | None = None) -> None:
        super().__init__(message)
        self.shard = shard


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 halves the bytes read per token whenever the vocabulary fits."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


@dataclass(frozen=True)
class ShardMeta:
    tokenizer_fingerprint: str
    vocab_size: int
    seq_len: int
    row_len: int
    eos_id: int
    pad_id: int
    bos_id: int | None
    packing: str
    source: str
    split: str
    dtype: str
    rows: int = 0
    tokens: int = 0
    documents: int = 0
    checksum: str = ""
    format_version: int = FORMAT_VERSION

    def to_metadata(self) -> dict[bytes, bytes]:
        return {META_KEY: json.dumps(asdict(self), sort_keys=True).encode()}

    @classmethod
    def from_schema(cls, schema: pa.Schema) -> ShardMeta:
        raw = (schema.metadata or {}).get(META_KEY)
        if raw is None:
            raise ValueError("not a datapipe token shard: schema metadata has no datapipe.shard entry")
        data = json.loads(raw)
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"shard format version {data.get('format_version')} is not supported (expected {FORMAT_VERSION})")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def compatibility_key(self) -> tuple:
        """What must agree between shards that one loader mixes."""
        return (
            self.tokenizer_fingerprint,
            self.vocab_size,
            self.seq_len,
            self.row_len,
            self.eos_id,
            self.pad_id,
            self.bos_id,
            self.dtype,
        )


def shard_schema(meta: ShardMeta) -> pa.Schema:
    value_type = pa.uint16() if meta.dtype == "uint16" else pa.uint32()
    return pa.schema(
        [
            pa.field("input_ids", pa.list_(pa.field("item", value_type, nullable=False), meta.row_len), nullable=False),
            pa.field("doc_starts", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
            pa.field("n_tokens", pa.int32(), nullable=False),
        ],
        metadata=meta.to_metadata(),
    )


def open_shard(path: str | os.PathLike[str]) -> tuple[pa.Table, ShardMeta]:
    """Memory-map a shard; no token bytes are read until they are touched."""
    source = pa.memory_map(str(path), "r")
    table = pa.ipc.open_file(source).read_all()
    return table, ShardMeta.from_schema(table.schema)


def tokens_view(table: pa.Table) -> np.ndarray:
    """The (rows, row_len) token matrix as a zero-copy numpy view over the mapped file.

    A shard written by ``write_shard`` has one buffer per record batch; a shard
    with several batches gives a view per batch, so this concatenates only then.
    """
    col = table.column("input_ids")
    row_len = col.type.list_size
    parts = []
    for chunk in col.chunks:
        flat = chunk.flatten().to_numpy(zero_copy_only=True)  # flatten() honours slice offsets
        parts.append(flat.reshape(-1, row_len))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty((0, row_len))


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
