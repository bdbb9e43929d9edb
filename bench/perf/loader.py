"""Benchmark the streaming loader against a plain numpy memmap read of the same tokens.

    python -m bench.perf.loader --configs 8x2048,32x2048,8x4096 --repeats 7 \
        --json bench/results/loader.json

``--dataloader`` runs the other comparison instead: inside a torch DataLoader (0 and 2
workers) against LitData and Mosaic streaming (``bench/perf/loader_workers.py``).

For each batch x seq_len and each of two shard layouts it writes a synthetic run (packed
shards + manifest) and one flat file of the same rows, then measures in one process, on one
worker:

* time to first batch with all shards unopened (construction included);
* the first epoch (every shard opened on first touch, numba loaded after the first batch);
* steady state (the second epoch: shards open) of each mode against the baseline: the *same
  rows in the same order* (the loader's order, precomputed and not timed) gathered from one
  np.memmap with one fancy index per batch, returning input_ids and labels as views (tokens
  only). The first batches of every mode are compared with the baseline's for equality.

Modes: ``tokens`` (fields=TOKEN_FIELDS); ``compact``, *the full sample a trainer consumes*
when position_ids and loss_mask are built on the device: every host-side field it needs
(input_ids, labels, cu_seqlens, num_segments, label_end = batch.COMPACT_FIELDS), the
per-token fields left to ``datapipe.loader.device.expand_segments`` after the transfer (not
host work; ``--expand cuda`` times it too, ``--expand cpu`` on CPU torch for a machine
without a GPU); ``full`` and ``full16``: every field built on the host, position_ids int32
or int16 (the old all-on-host mode, for comparison).

Both sides consume batches as a training loop does: each batch is touched and dropped
before the next (keeping every batch in a list would time page faults of fresh memory,
not the loader). Each repeat runs the baseline once, then every mode once (interleaved, so
load on the box hits all alike); the ratio of each mode to that repeat's baseline is printed
as the median and range over repeats, in wall and in CPU time (process_time: steadier on a
loaded box). ``--rows 32768`` makes the data 1 GiB per seq_len. Optionally LitData's
TokensLoader when it imports. Not a test: it prints a table and ratios.

Two shard layouts, the same 16,384 rows (64 MiB at seq_len 2048, twice the 32 MiB L3 of the
machine these figures come from) in both:

* ``--shards 8 --rows 2048`` (the figures the targets apply to): shard files of 8 MiB (16 MiB
  at 4096). The pipeline's own are bigger still: its default rows_per_shard=8192 writes 33 MiB
  files at 2048, and only the last shard of each source and split is smaller;
* ``--stress-shards 1024 --stress-rows 16``: 68 KiB files, 1,024 of them open at once, every
  batch touching as many shards as it has rows: a worst case for opening, the address tables
  and the per-row metadata. Reported, without targets.

Through ``bench/_support/harness.py``: machine, date, commit and load average first; per config the
tokens-only and the full-sample (``compact``) ratios as median and range over the repeats, in
CPU time (the figure; targets >= 0.9 and >= 0.8) and in wall time; the noise (load average
after, the baseline's own spread); ``--json PATH`` writes it all.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._support.harness import Harness, add_args
from datapipe.loader import PackedDataset
from datapipe.loader.batch import COMPACT_FIELDS, TOKEN_FIELDS
from datapipe.tokens.shard_format import ShardMeta, file_sha256
from datapipe.tokens.shard_writer import write_manifest, write_shard


def make_run(root: Path, shards: int, rows: int, seq_len: int, docs_per_row: int, seed: int = 0) -> np.ndarray:
    """Write ``shards`` shards of ``rows`` rows; return all tokens as one (N, row_len) array."""
    import pyarrow as pa

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
        recs.append(
            {
                "path": rel,
                "source": source,
                "split": "train",
                "rows": rows,
                "tokens": meta.tokens,
                "sha256": file_sha256(root / rel),
                "tokenizer_fingerprint": "bench-tok",
                "seq_len": seq_len,
                "row_len": row_len,
            }
        )
        everything.append((source, rel, tokens))
    # as the pack phase writes it: the Parquet file and the loader's Arrow copy beside it
    write_manifest(pa.Table.from_pylist(recs), root / "shards" / "manifest.parquet")
    # Same row numbering as the manifest: the index below maps (shard id) -> rows of the flat file.
    order = sorted(range(len(everything)), key=lambda i: (everything[i][0], everything[i][1]))
    return np.concatenate([everything[i][2] for i in order])


def first_batch(run: Path, batch_size: int) -> float:
    t0 = time.perf_counter()
    ds = PackedDataset(run, batch_size=batch_size, seed=1, backend="numpy")
    next(iter(ds))
    return time.perf_counter() - t0


def loader_pass(ds: PackedDataset, keep: int = 3, expand=None) -> tuple[float, float, list[dict]]:
    """(tokens/s wall, tokens/s CPU) over the rest of the current epoch; copies of the first
    ``keep`` batches. ``expand(batch)`` (compact mode) builds the per-token fields as a
    trainer would after the transfer; its result is consumed like a batch."""
    first, n, touched = [], 0, 0
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in ds:
        touched += int(batch["input_ids"][0, 0])  # consume it, then drop it, as a training step does
        if expand is not None:  # after the host touch: reading a GPU tensor back would wait for the device
            batch = expand(batch)
        if n < keep:
            first.append({k: v.cpu().numpy() if hasattr(v, "cpu") else np.array(v) for k, v in batch.items()})
        n += 1
    if expand is not None:
        expand(None)  # wait for the device
    tok = n * ds.batch_size * ds.seq_len
    return tok / (time.perf_counter() - t0), tok / max(time.process_time() - c0, 1e-9), first


def baseline_pass(mm: np.memmap, rows: list[np.ndarray], seq_len: int, keep: int = 3) -> tuple[float, float, list]:
    first, touched = [], 0
    t0, c0 = time.perf_counter(), time.process_time()
    for r in rows:
        block = mm[r]
        ids, labels = block[:, :seq_len], block[:, 1:]
        touched += int(ids[0, 0])
        if len(first) < keep:
            first.append((ids.copy(), labels.copy()))
    tok = sum(len(r) for r in rows) * seq_len
    return tok / (time.perf_counter() - t0), tok / max(time.process_time() - c0, 1e-9), first


def epoch_rows(ds: PackedDataset, rows_per_shard: int) -> list[np.ndarray]:
    """The flat-file rows of each batch of the current epoch, in the loader's order (rank 0 of 1)."""
    start = ds.consumed_samples // ds.global_batch_size
    out = []
    for g in range(start, start + ds.batches_per_epoch):
        shard, row = ds.locate(ds.batch_indices(g))
        out.append(shard * rows_per_shard + row)
    return out


def expander(ds: PackedDataset, device: str):
    """expand_segments on ``device`` per batch; called with None at the end to synchronise."""
    import torch

    def expand(batch):
        if batch is None:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            return None
        return ds.expand_segments(batch, device)

    return expand


# What each mode hands the training step. "compact" is the full sample a trainer consumes
# when position_ids and loss_mask are built on the device (datapipe.loader.device): every
# field it needs, host side, with the per-token ones left to the GPU.
MODES = {
    "tokens": {"fields": TOKEN_FIELDS},
    "compact": {"fields": COMPACT_FIELDS},
    "full": {},  # every field built on the host (the default fields), position_ids int32
    "full16": {"position_dtype": "int16"},
}


def bench_config(work: Path, args: argparse.Namespace, batch_size: int, seq_len: int, layout: tuple[int, int]) -> dict:
    shards, rows_per_shard = layout
    run = work / f"run-{seq_len}-{shards}x{rows_per_shard}"
    flat = work / f"tokens-{seq_len}-{shards}x{rows_per_shard}.bin"
    if not flat.exists():
        make_run(run, shards, rows_per_shard, seq_len, args.docs_per_row).tofile(flat)
    res: dict = {"first": first_batch(run, batch_size)}
    mm = np.memmap(flat, dtype=np.uint16, mode="r").reshape(-1, seq_len + 1)
    modes = dict(MODES)
    if args.expand != "none":
        modes["expand"] = {"fields": COMPACT_FIELDS}
    sets, epoch1, rows = {}, None, None
    for mode, kw in modes.items():
        ds = PackedDataset(run, batch_size=batch_size, seed=1, backend="numpy", **kw)
        res[f"{mode}_cold"], _, _ = loader_pass(ds)  # epoch 0: opens every shard
        epoch1 = {**ds.state_dict(), "consumed_samples": ds.samples_per_epoch}
        sets[mode] = ds
    ds0 = sets["tokens"]
    ds0.load_state_dict(epoch1)
    rows = epoch_rows(ds0, rows_per_shard)
    ratios: dict[str, list] = {m: [] for m in modes}
    base_runs: list[float] = []
    batch_us: dict[str, list[float]] = {"memmap": [], "expand": []}  # wall per batch (tokens/s -> us)
    for _ in range(args.repeats):  # interleaved: one baseline pass, then each mode, per repeat
        base_w, base_c, ref = baseline_pass(mm, rows, seq_len)
        base_runs.append(base_c)
        batch_us["memmap"].append(batch_size * seq_len / base_w * 1e6)
        for mode, ds in sets.items():
            ds.load_state_dict(epoch1)  # epoch 1 again
            expand = expander(ds, args.expand) if mode == "expand" else None
            w, c, got = loader_pass(ds, expand=expand)
            for b, (ids, lab) in zip(got, ref):
                assert np.array_equal(b["input_ids"], ids) and np.array_equal(b["labels"], lab), "not the same rows"
            ratios[mode].append((w / base_w, c / base_c))
            if mode == "expand":  # loader + transfer + expand_segments
                batch_us["expand"].append(batch_size * seq_len / w * 1e6)
    res["ratios"] = {m: np.asarray(v) for m, v in ratios.items()}
    res["base_cpu_tok_s"] = base_runs
    res["batch_us"] = batch_us
    return res


def _fmt(r: np.ndarray) -> str:
    """median [min-max] of per-repeat ratios."""
    return f"{np.median(r):.2f} [{r.min():.2f}-{r.max():.2f}]"


def _lit_row(item: tuple[str, tuple[int, int], int]):
    """One row for litdata's optimize (module level: its workers pickle the function)."""
    import torch

    path, shape, i = item
    yield torch.from_numpy(np.array(np.memmap(path, dtype=np.uint16, mode="r", shape=shape)[i], dtype=np.int32))


def bench_litdata(tokens: np.ndarray, flat: Path, work: Path, args: argparse.Namespace) -> float | str:
    try:
        from litdata import StreamingDataset, TokensLoader, optimize  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import problem means: skip, say why
        return f"skipped: litdata does not import ({type(exc).__name__}: {exc})"
    try:
        out = work / "litdata"
        inputs = [(str(flat), tokens.shape, i) for i in range(len(tokens))]
        optimize(fn=_lit_row, inputs=inputs, output_dir=str(out), chunk_bytes="64MB", item_loader=TokensLoader(), num_workers=1)
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


# The two figures the loader is held to (issue 17): label, mode, target.
TARGETS = (("tokens-only", "tokens", ">= 0.9"), ("full sample (compact)", "compact", ">= 0.8"))


def main() -> None:
    if "--dataloader" in sys.argv[1:]:  # the DataLoader comparison against LitData and Mosaic streaming
        from bench.perf.loader_workers import main as dataloader_main

        dataloader_main([a for a in sys.argv[1:] if a != "--dataloader"])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=8, help="shards of the main layout (the targets')")
    p.add_argument("--rows", type=int, default=2048, help="rows (packed sequences) per shard, main layout")
    p.add_argument(
        "--stress-shards",
        type=int,
        default=1024,
        help="shards of the many-small-shards layout, reported without targets (0: skip it)",
    )
    p.add_argument("--stress-rows", type=int, default=16, help="rows per shard, many-small-shards layout")
    p.add_argument("--configs", default="8x2048,32x2048,8x4096", help="batch x seq_len, comma separated")
    p.add_argument("--docs-per-row", type=int, default=4)
    p.add_argument(
        "--expand",
        default="none",
        help="also time compact batches expanded by expand_segments on this torch device (cpu, cuda); none: skip",
    )
    p.add_argument("--litdata", action="store_true", help="also try LitData's TokensLoader")
    args = add_args(p, repeats=5).parse_args()
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    layouts = {"": (args.shards, args.rows)}  # label suffix -> (shards, rows per shard)
    if args.stress_shards > 0:
        layouts[f", {args.stress_shards} shards x {args.stress_rows} rows"] = (args.stress_shards, args.stress_rows)
    h = Harness(
        "loader",
        args,
        libs=["numba"],
        note=(
            f"{args.shards} shards x {args.rows} rows (the targets'); "
            + (
                f"also {args.stress_shards} shards x {args.stress_rows} rows (stress, no target); "
                if args.stress_shards > 0
                else ""
            )
            + "ratio = loader / numpy memmap gather of the same rows in the "
            "same order (tokens only), per interleaved repeat. tokens: input_ids + labels; compact: the full sample a "
            "trainer consumes, positions/mask built on the device (input_ids, labels, cu_seqlens, num_segments, "
            "label_end on the host); full / full16: every field on the host (position_ids int32 / int16, loss_mask)"
            + ("; expand: compact + expand_segments on " + args.expand if args.expand != "none" else "")
        ),
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="dp-bench-") as tmp:
        work = Path(tmp)
        for b, L in configs:
            for suffix, layout in layouts.items():
                cfg = f"{b}x{L}"
                r = bench_config(work, args, b, L, layout)
                print(
                    f"{cfg}, {layout[0]} shards x {layout[1]} rows: first batch {r['first'] * 1e3:.1f} ms; cold "
                    f"epoch Mtok/s tokens {r['tokens_cold'] / 1e6:.0f}, full {r['full_cold'] / 1e6:.0f}; ratios "
                    "in CPU time (wall):"
                )
                for mode, rat in r["ratios"].items():
                    print(f"  {mode:>8s}  cpu {_fmt(rat[:, 1])}  (wall {_fmt(rat[:, 0])})")
                for label, mode, target in TARGETS:
                    h.ratio(
                        f"{cfg} {label} loader / memmap{suffix}, CPU time",
                        r["ratios"][mode][:, 1].tolist(),
                        target="" if suffix else target,
                    )
                for label, mode, _ in TARGETS if not suffix else ():  # the stress layout's are in the JSON
                    h.ratio(f"{cfg} {label} loader / memmap, wall", r["ratios"][mode][:, 0].tolist())
                if r["batch_us"]["expand"]:  # absolute: a device's launch and copy latency is no host throughput
                    us = r["batch_us"]
                    print(
                        f"  expand on {args.expand}: {np.median(us['expand']):.0f} us per batch (loader, copy to "
                        f"the device, expand_segments) against {np.median(us['memmap']):.0f} us for the memmap "
                        "gather"
                    )
                    h.figure(
                        f"{cfg}{suffix} compact + expand_segments on {args.expand}, wall per batch",
                        us["expand"],
                        "us",
                        show=False,
                    )
                h.figure(f"{cfg}{suffix} first batch", r["first"] * 1e3, "ms", show=False)
                h.figure(
                    f"{cfg}{suffix} memmap baseline Mtok/s (CPU time)",
                    [v / 1e6 for v in r["base_cpu_tok_s"]],
                    "Mtok/s",
                    show=False,
                )
                h.noise(f"{cfg}{suffix} memmap tokens/s (CPU time)", r["base_cpu_tok_s"])
                results[f"{cfg}{suffix}"] = {
                    "shards": layout[0],
                    "rows_per_shard": layout[1],
                    "first_batch_s": r["first"],
                    "tokens_cold_tok_s": r["tokens_cold"],
                    "full_cold_tok_s": r["full_cold"],
                    "ratios_cpu": {m: v[:, 1].tolist() for m, v in r["ratios"].items()},
                    "ratios_wall": {m: v[:, 0].tolist() for m, v in r["ratios"].items()},
                    "batch_us": r["batch_us"],
                }
                print()
        if args.litdata:
            b, L = configs[0]
            lit_args = argparse.Namespace(**{**vars(args), "batch_size": b, "seq_len": L})
            flat = work / f"tokens-{L}-{args.shards}x{args.rows}.bin"
            tokens = np.fromfile(flat, dtype=np.uint16).reshape(-1, L + 1)
            lit = bench_litdata(tokens, flat, work, lit_args)
            print(f"litdata TokensLoader {b} x {L}: " + (f"{lit / 1e6:.0f} Mtok/s" if isinstance(lit, float) else lit))
            results["litdata_tok_s"] = lit
        print(
            "targets (main layout): tokens ratio >= 0.9; compact (full sample consumed) >= 0.8; first batch "
            f"< 1 s with {max(args.shards, args.stress_shards)} shards"
        )
    h.finish(configs=results)


if __name__ == "__main__":
    main()
