"""Benchmark the streaming loader against a plain numpy memmap read of the same tokens.

    PYTHONPATH=. python bench/loader.py --shards 1000 --rows 16 --seq-len 2048 --batch-size 8

Writes a synthetic run (packed shards + manifest) to a temporary folder, then measures in
one process, on one worker: time to first batch (construction included) and tokens per
second of full samples (input_ids, labels, position_ids, cu_seqlens, loss_mask), against
reading the same rows in the same order from one np.memmap (index gather per batch, the
order precomputed and not timed). Optionally LitData's TokensLoader when it imports.
Not a test: it prints a table and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from datapipe.loader import PackedDataset
from datapipe.shard_format import ShardMeta, file_sha256, write_shard


def make_run(root: Path, shards: int, rows: int, seq_len: int, docs_per_row: int, seed: int = 0) -> np.ndarray:
    """Write ``shards`` shards of ``rows`` rows; return all tokens as one (N, row_len) array."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    row_len = seq_len + 1
    recs, everything = [], []
    for k in range(shards):
        source = f"src{k % 4}"
        tokens = rng.integers(3, 50_000, size=(rows, row_len), dtype=np.uint16)
        starts = np.sort(rng.integers(1, row_len, size=(rows, docs_per_row)), axis=1)
        values = np.concatenate([np.zeros((rows, 1), np.int32), starts.astype(np.int32)], axis=1).reshape(-1)
        splits = np.arange(rows + 1) * (docs_per_row + 1)
        meta = ShardMeta("bench-tok", 50_000, seq_len, row_len, 2, 0, 1, "concat", source, "train", "uint16")
        rel = f"shards/{source}/train-{k:05d}.arrow"
        meta = write_shard(root / rel, tokens, splits, values, np.full(rows, row_len, np.int32), meta)
        recs.append({"path": rel, "source": source, "split": "train", "rows": rows, "tokens": meta.tokens,
                     "sha256": file_sha256(root / rel), "tokenizer_fingerprint": "bench-tok",
                     "seq_len": seq_len, "row_len": row_len})
        everything.append((source, rel, tokens))
    pq.write_table(pa.Table.from_pylist(recs), root / "shards" / "manifest.parquet")
    # Same row numbering as the manifest: the index below maps (shard id) -> rows of the flat file.
    order = sorted(range(len(everything)), key=lambda i: (everything[i][0], everything[i][1]))
    return np.concatenate([everything[i][2] for i in order])


def bench_loader(run: Path, args: argparse.Namespace) -> tuple[float, float, list[np.ndarray]]:
    t0 = time.perf_counter()
    ds = PackedDataset(run, seq_len=args.seq_len, batch_size=args.batch_size, seed=1, backend="numpy")
    it = iter(ds)
    next(it)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = 0
    for _ in range(args.batches):
        try:
            next(it)
        except StopIteration:
            it = iter(ds)
            next(it)
        n += 1
    tps = n * args.batch_size * args.seq_len / (time.perf_counter() - t0)
    # The rows it read, for the baseline: global rows in manifest order (sorted by source, path).
    idx = np.arange(args.batch_size, (args.batches + 1) * args.batch_size) % ds.samples_per_epoch
    shard, row = ds.locate(idx)
    flat = shard * args.rows + row
    return first, tps, [flat[i:i + args.batch_size] for i in range(0, len(flat), args.batch_size)]


def bench_memmap(path: Path, shape: tuple[int, int], batches: list[np.ndarray], seq_len: int) -> float:
    mm = np.memmap(path, dtype=np.uint16, mode="r", shape=shape)
    t0 = time.perf_counter()
    for rows in batches:
        block = mm[rows]
        _inputs, _labels = block[:, :seq_len], block[:, 1:]
    return sum(len(b) for b in batches) * seq_len / (time.perf_counter() - t0)


def _lit_row(item: tuple[str, tuple[int, int], int]):
    """One row for litdata's optimize (module level: its workers pickle the function)."""
    import torch

    path, shape, i = item
    yield torch.from_numpy(np.array(np.memmap(path, dtype=np.uint16, mode="r", shape=shape)[i], dtype=np.int32))


def bench_litdata(tokens: np.ndarray, work: Path, args: argparse.Namespace) -> float | str:
    try:
        from litdata import StreamingDataset, TokensLoader, optimize  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import problem means: skip, say why
        return f"skipped: litdata does not import ({type(exc).__name__}: {exc})"
    try:
        out = work / "litdata"
        flat = work / "tokens.bin"
        inputs = [(str(flat), tokens.shape, i) for i in range(len(tokens))]
        optimize(fn=_lit_row, inputs=inputs, output_dir=str(out), chunk_bytes="64MB",
                 item_loader=TokensLoader(), num_workers=1)
        ds = StreamingDataset(str(out), item_loader=TokensLoader(block_size=args.seq_len + 1), shuffle=True)
        from litdata import StreamingDataLoader
        dl = StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=0)
        it = iter(dl)
        next(it)
        t0 = time.perf_counter()
        n = 0
        for batch in it:
            n += 1
            if n >= args.batches:
                break
        return n * args.batch_size * args.seq_len / (time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001
        return f"skipped: litdata failed offline ({type(exc).__name__}: {str(exc)[:120]})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--rows", type=int, default=16, help="rows (packed sequences) per shard")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--docs-per-row", type=int, default=4)
    p.add_argument("--litdata", action="store_true", help="also try LitData's TokensLoader")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="dp-bench-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        tokens = make_run(work / "run", args.shards, args.rows, args.seq_len, args.docs_per_row)
        flat = work / "tokens.bin"
        tokens.tofile(flat)
        print(f"wrote {args.shards} shards x {args.rows} rows x {args.seq_len + 1} tokens "
              f"in {time.perf_counter() - t0:.1f}s")
        first, tps, batches = bench_loader(work / "run", args)
        base = bench_memmap(flat, tokens.shape, batches, args.seq_len)
        rows = [("datapipe PackedDataset (full samples)", f"{tps / 1e6:10.2f}", f"{first * 1e3:8.1f}"),
                ("numpy memmap gather (same rows)", f"{base / 1e6:10.2f}", "       -")]
        lit = bench_litdata(tokens, work, args) if args.litdata else "skipped: pass --litdata"
        if isinstance(lit, float):
            rows.append(("litdata TokensLoader", f"{lit / 1e6:10.2f}", "       -"))
        print(f"\n{'loader (1 worker)':40s} {'Mtok/s':>10s} {'first ms':>8s}")
        for r in rows:
            print(f"{r[0]:40s} {r[1]} {r[2]}")
        if not isinstance(lit, float):
            print(f"litdata: {lit}")
        print(f"\nratio datapipe / memmap = {tps / base:.2f}   (target >= 0.9)")
        print(f"time to first batch with {args.shards} shards = {first:.3f}s   (target < 1s)")


if __name__ == "__main__":
    main()
