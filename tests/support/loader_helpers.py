"""Small synthetic runs for loader tests: shards written with write_shard plus a manifest
with the columns the real pipeline writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.tokens.shard_format import ShardMeta, file_sha256
from datapipe.tokens.shard_writer import write_shard

FINGERPRINT = "tok-test-v1"


def make_run(
    root: Path,
    sources: dict[str, list[int]],
    seq_len: int = 16,
    split: str = "train",
    label_token: bool = True,
    fingerprint: str = FINGERPRINT,
    seed: int = 0,
    vocab_size: int = 1000,
    padded_last: bool = True,
    max_starts: int = 2,
) -> Path:
    """Write shards for each source (one shard per entry of rows) and the manifest.

    Token 0 of every row encodes its identity: (source id * 1_000_000 + shard * 1_000 + row)
    split over two tokens so tests can recover (source, shard, row) from a sample. Tokens
    otherwise are random; up to ``max_starts`` documents start at random positions of a row.
    """
    rng = np.random.default_rng(seed)
    row_len = seq_len + 1 if label_token else seq_len
    recs = []
    for si, (source, shard_rows) in enumerate(sorted(sources.items())):
        for k, rows in enumerate(shard_rows):
            tokens = rng.integers(3, vocab_size, size=(rows, row_len), dtype=np.uint32)
            ident = si * 1_000_000 + k * 1_000 + np.arange(rows)
            tokens[:, 0], tokens[:, 1] = ident // 1000, ident % 1000
            n_tok = np.full(rows, row_len, dtype=np.int32)
            if padded_last and rows:
                n_tok[-1] = max(3, row_len // 2)
                tokens[-1, n_tok[-1] :] = 0
            splits, values = [0], []
            for r in range(rows):
                size = min(rng.integers(0, max_starts + 1), n_tok[r] - 2)
                starts = sorted(set(rng.choice(np.arange(2, n_tok[r]), size=size, replace=False).tolist()))
                if r % 3 == 0:
                    starts = [0] + starts
                values += starts
                splits.append(len(values))
            meta = ShardMeta(
                tokenizer_fingerprint=fingerprint,
                vocab_size=vocab_size,
                seq_len=seq_len,
                row_len=row_len,
                eos_id=2,
                pad_id=0,
                bos_id=1,
                packing="concat",
                source=source,
                split=split,
                dtype="uint16",
                documents=len(values),
            )
            rel = f"shards/{source}/{split}-{k:05d}.arrow"
            meta = write_shard(root / rel, tokens, np.asarray(splits), np.asarray(values, dtype=np.int32), n_tok, meta)
            recs.append(
                {
                    "path": rel,
                    "source": source,
                    "split": split,
                    "rows": rows,
                    "tokens": meta.tokens,
                    "sha256": file_sha256(root / rel),
                    "tokenizer_fingerprint": fingerprint,
                    "seq_len": seq_len,
                    "row_len": row_len,
                }
            )
    write_manifest(root, recs)
    return root


def write_manifest(root: Path, recs: list[dict]) -> None:
    from datapipe.tokens.shard_writer import write_manifest as write_manifest_files

    table = pa.Table.from_pylist(
        recs,
        schema=pa.schema(
            [
                ("path", pa.string()),
                ("source", pa.string()),
                ("split", pa.string()),
                ("rows", pa.int64()),
                ("tokens", pa.int64()),
                ("sha256", pa.string()),
                ("tokenizer_fingerprint", pa.string()),
                ("seq_len", pa.int64()),
                ("row_len", pa.int64()),
            ]
        ),
    )
    (root / "shards").mkdir(parents=True, exist_ok=True)
    write_manifest_files(table, root / "shards" / "manifest.parquet")  # the Parquet file and the loader's copy


def refresh_sha256(root: Path) -> None:
    """Recompute the manifest's sha256 column after a test rewrote shards on purpose."""
    table = pq.read_table(root / "shards" / "manifest.parquet")
    recs = table.to_pylist()
    for rec in recs:
        rec["sha256"] = file_sha256(root / rec["path"])
    write_manifest(root, recs)


def ident(batch: dict) -> list[int]:
    """(source id, shard, row) of each sample, encoded as one int, from tokens 0 and 1."""
    ids = np.asarray(batch["input_ids"])
    return (ids[:, 0].astype(np.int64) * 1000 + ids[:, 1]).tolist()
