"""Benchmark the streaming loader against a plain numpy memmap read of the same tokens.

    PYTHONPATH=. python bench/loader.py --shards 1000 --rows 16 --configs 8x2048,32x2048,8x4096 [--json PATH]

For each batch x seq_len it writes a synthetic run (packed shards + manifest) and one flat
file of the same rows, then measures in one process, on one worker:

* time to first batch with all shards unopened (construction included);
* the first epoch (every shard opened on first touch, numba loaded after the first batch);
* steady state (the second epoch: shards open), tokens-only (``fields=("input_ids",
  "labels")``) and full samples (plus position_ids, cu_seqlens, num_segments, loss_mask),
  each against the baseline: the *same rows in the same order* (the loader's order,
  precomputed and not timed) gathered from one np.memmap with one fancy index per batch,
  returning input_ids and labels as views. The first batches of both are compared for
  equality, so both do the same essential work.

Both sides consume batches as a training loop does: each batch is touched and dropped
before the next (keeping every batch in a list would time page faults of fresh memory,
not the loader). Runs alternate loader and baseline; the table shows the best of
``--repeats`` for each and the median of the per-repeat ratios (the box is noisy); after the
table, the median and min-max of those paired ratios for every configuration.
``--rows 256`` makes the data (1 GiB per seq_len) larger than this machine's L3 cache.
Optionally LitData's TokensLoader when it imports. Not a test: it prints a table and ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import Harness, add_args  # noqa: E402
from datapipe.loader import PackedDataset  # noqa: E402
from datapipe.shard_format import ShardMeta, file_sha256, write_shard  # noqa: E402


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


def first_batch(run: Path, batch_size: int) -> float:
    t0 = time.perf_counter()
    ds = PackedDataset(run, batch_size=batch_size, seed=1, backend="numpy")
    next(iter(ds))
    return time.perf_counter() - t0


def loader_pass(ds: PackedDataset, keep: int = 3) -> tuple[float, list[dict]]:
    """Tokens/s over the rest of the current epoch; copies of the first ``keep`` batches."""
    first, n, touched = [], 0, 0
    t0 = time.perf_counter()
    for batch in ds:
        touched += int(batch["input_ids"][0, 0])  # consume it, then drop it, as a training step does
        if n < keep:
            first.append({k: np.array(v) for k, v in batch.items()})
        n += 1
    return n * ds.batch_size * ds.seq_len / (time.perf_counter() - t0), first


def baseline_pass(mm: np.memmap, rows: list[np.ndarray], seq_len: int, keep: int = 3) -> tuple[float, list[tuple]]:
    first, touched = [], 0
    t0 = time.perf_counter()
    for r in rows:
        block = mm[r]
        ids, labels = block[:, :seq_len], block[:, 1:]
        touched += int(ids[0, 0])
        if len(first) < keep:
            first.append((ids.copy(), labels.copy()))
    return sum(len(r) for r in rows) * seq_len / (time.perf_counter() - t0), first


def epoch_rows(ds: PackedDataset, rows_per_shard: int) -> list[np.ndarray]:
    """The flat-file rows of each batch of the current epoch, in the loader's order (rank 0 of 1)."""
    start = ds.consumed_samples // ds.global_batch_size
    out = []
    for g in range(start, start + ds.batches_per_epoch):
        shard, row = ds.locate(ds.batch_indices(g))
        out.append(shard * rows_per_shard + row)
    return out


def bench_config(work: Path, args: argparse.Namespace, batch_size: int, seq_len: int) -> dict:
    run = work / f"run-{seq_len}"
    flat = work / f"tokens-{seq_len}.bin"
    if not flat.exists():
        make_run(run, args.shards, args.rows, seq_len, args.docs_per_row).tofile(flat)
    res = {"first": first_batch(run, batch_size)}
    mm = np.memmap(flat, dtype=np.uint16, mode="r").reshape(-1, seq_len + 1)
    for mode, fields in (("tokens", ("input_ids", "labels")), ("full", None)):
        kw = {} if fields is None else {"fields": fields}
        ds = PackedDataset(run, batch_size=batch_size, seed=1, backend="numpy", **kw)
        res[f"{mode}_cold"], _ = loader_pass(ds)  # epoch 0: opens every shard
        epoch1 = {**ds.state_dict(), "consumed_samples": ds.samples_per_epoch}
        ds.load_state_dict(epoch1)
        rows = epoch_rows(ds, args.rows)
        best_l = best_b = 0.0
        ratios, bases = [], []
        for _ in range(args.repeats):
            ds.load_state_dict(epoch1)  # epoch 1 again
            tps, got = loader_pass(ds)
            base, ref = baseline_pass(mm, rows, seq_len)
            for b, (ids, lab) in zip(got, ref):
                assert np.array_equal(b["input_ids"], ids) and np.array_equal(b["labels"], lab), "not the same rows"
            best_l, best_b = max(best_l, tps), max(best_b, base)
            ratios.append(tps / base)
            bases.append(base)
        res[mode], res[f"{mode}_base"], res[f"{mode}_median"] = best_l, best_b, float(np.median(ratios))
        res[f"{mode}_ratios"], res[f"{mode}_base_runs"] = ratios, bases
    return res


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
        flat = work / f"tokens-{args.seq_len}.bin"
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
        for _batch in it:  # the rest of the epoch
            n += 1
        return n * args.batch_size * args.seq_len / (time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001
        return f"skipped: litdata failed offline ({type(exc).__name__}: {str(exc)[:120]})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--rows", type=int, default=16, help="rows (packed sequences) per shard")
    p.add_argument("--configs", default="8x2048,32x2048,8x4096", help="batch x seq_len, comma separated")
    p.add_argument("--docs-per-row", type=int, default=4)
    p.add_argument("--litdata", action="store_true", help="also try LitData's TokensLoader")
    args = add_args(p, repeats=7).parse_args()
    h = Harness("loader", args)
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    with tempfile.TemporaryDirectory(prefix="dp-bench-") as tmp:
        work = Path(tmp)
        print(f"{args.shards} shards x {args.rows} rows; Mtok/s per worker (best of {args.repeats}); ratio = loader / "
              "memmap gather of the same rows in the same order: of the best runs, and the median of paired runs\n")
        print(f"{'batch x seq':>12s} {'first ms':>8s} {'cold tok':>8s} {'cold full':>9s} | {'tokens':>7s} "
              f"{'memmap':>7s} {'ratio':>5s} {'median':>6s} | {'full':>7s} {'memmap':>7s} {'ratio':>5s} {'median':>6s}")
        results = {}
        for b, L in configs:
            r = bench_config(work, args, b, L)
            results[f"{b}x{L}"] = r
            print(f"{b:>5d} x {L:<5d} {r['first'] * 1e3:8.1f} {r['tokens_cold'] / 1e6:8.0f} {r['full_cold'] / 1e6:9.0f} | "
                  f"{r['tokens'] / 1e6:7.0f} {r['tokens_base'] / 1e6:7.0f} {r['tokens'] / r['tokens_base']:5.2f} "
                  f"{r['tokens_median']:6.2f} | {r['full'] / 1e6:7.0f} {r['full_base'] / 1e6:7.0f} "
                  f"{r['full'] / r['full_base']:5.2f} {r['full_median']:6.2f}")
        if args.litdata:
            b, L = configs[0]
            lit_args = argparse.Namespace(**{**vars(args), "batch_size": b, "seq_len": L})
            tokens = np.fromfile(work / f"tokens-{L}.bin", dtype=np.uint16).reshape(-1, L + 1)
            lit = bench_litdata(tokens, work, lit_args)
            print(f"\nlitdata TokensLoader {b} x {L}: " + (f"{lit / 1e6:.0f} Mtok/s" if isinstance(lit, float) else lit))
        print()
        for cfg, r in results.items():
            h.ratio(f"{cfg} tokens-only loader / memmap", r["tokens_ratios"], target=">= 0.9")
            h.ratio(f"{cfg} full samples loader / memmap", r["full_ratios"])
            h.figure(f"{cfg} first batch", r["first"] * 1e3, "ms", show=False)
            h.noise(f"{cfg} memmap tokens/s", r["tokens_base_runs"])
        print("targets: tokens-only ratio >= 0.9; first batch < 1 s with", args.shards, "shards")
        h.finish(configs=results)


if __name__ == "__main__":
    main()
