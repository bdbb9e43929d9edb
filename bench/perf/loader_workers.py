"""The loader inside a torch DataLoader, against LitData and Mosaic streaming, on the same tokens.

    python -m bench.perf.loader --dataloader --repeats 3 --json bench/results/loader_workers.json

(``bench.perf.loader --dataloader`` runs this module's ``main``.) One epoch of the same rows
(default 6,325 rows of 2,049 uint16 tokens = 12.96M tokens, the pipeline bench's 32k-BPE
output size; synthetic token values, since a loader never looks at them), batch 8, read as a
training loop does, by:

* ``datapipe``: ``PackedDataset(fields=TOKEN_FIELDS).dataloader(num_workers=W)`` over 4 packed
  shards (verify="full": the background sha256 included);
* ``litdata``: ``litdata.optimize`` with ``TokensLoader`` (int32 tokens: what its optimize
  writes from a torch tensor of the rows), ``StreamingDataset(item_loader=TokensLoader(2049),
  shuffle=True)`` in ``StreamingDataLoader(batch_size=8, num_workers=W)``;
* ``mds``: Mosaic streaming, packed MDS (one ``ndarray:uint16:2049`` column per sample),
  ``streaming.StreamingDataset(shuffle=True, batch_size=8)`` in ``StreamingDataLoader``.

W = 0 (main process) and W = 2. Each (library, W) runs in a fresh process, interleaved per repeat
(datapipe, litdata, mds, ...), and reports tokens/s over the whole epoch (wall: first batch
included), time to first batch (iterator creation to the first batch, after a full garbage
collection of the imports: see ``child``), the CPU of the process
tree (main + workers, from rusage) per epoch, and peak RSS of the main process and of the
largest worker (VmHWM, restarted at the process's and each worker's start and read by each
worker as it exits: a worker's pages shared with the main process count, as in RSS; not the
children's ru_maxrss, which also holds any short-lived helper process a library runs, with
the peak its parent had when it exec'd). Exact resume at 50%: the epoch stopped after half its batches, the
loader's state saved, a new loader restored from it, and the rest read; the batches of both
halves must equal the uninterrupted epoch's, in order (reported per library, W=2).

Needs litdata and mosaicml-streaming (bench-only; mosaicml-streaming pins numpy < 2.2 and
transformers < 5, so install both into a separate venv with ``--system-site-packages --no-deps``
and run this there); a library that does not import is reported as skipped.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import multiprocessing
import multiprocessing.util
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._support.harness import Harness

LIBS = ("datapipe", "litdata", "mds")


def _reset_peak(_worker_id: int = 0) -> None:
    """Restart this process's peak RSS (VmHWM, ru_maxrss) from its current RSS: a child exec'd by
    the bench would otherwise carry the bench process's peak, and a worker its parent's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# Each DataLoader worker's peak RSS, written as it exits (a shared array set up before the
# loader forks its workers: index = worker id, the largest over the loaders of one child).
_WORKER_PEAKS: Any = None


def _worker_start(worker_id: int) -> None:
    """worker_init_fn of every library: restart the peak, and record it when the worker exits
    (multiprocessing runs exit-priority finalizers as a worker process returns)."""
    _reset_peak()
    multiprocessing.util.Finalize(None, _record_peak, args=(worker_id,), exitpriority=0)


def _record_peak(worker_id: int) -> None:
    if _WORKER_PEAKS is not None and worker_id < len(_WORKER_PEAKS):
        _WORKER_PEAKS[worker_id] = max(_WORKER_PEAKS[worker_id], _vm_hwm_mib())


def _vm_hwm_mib() -> float:
    """This process's peak RSS since _reset_peak (ru_maxrss of an exec'd process keeps the peak its
    parent had at the exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def _digest(ids: object) -> str:
    a = np.ascontiguousarray(np.asarray(ids).astype(np.int64))
    return hashlib.sha1(a.tobytes()).hexdigest()[:16]


def _datapipe(root: Path, batch: int, workers: int):
    from datapipe.loader import PackedDataset
    from datapipe.loader.batch import TOKEN_FIELDS

    ds = PackedDataset(root / "datapipe", batch_size=batch, seed=1, fields=TOKEN_FIELDS)

    def fresh(state=None):
        if state is not None:
            ds.load_state_dict(state)
        else:
            ds.consumed_samples = 0
        return ds.dataloader(num_workers=workers, worker_init_fn=_worker_start if workers else None), ds.state_dict

    return fresh, lambda b: b["input_ids"]


def _litdata(root: Path, batch: int, workers: int, row_len: int):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    def fresh(state=None):
        ds = StreamingDataset(str(root / "litdata"), item_loader=TokensLoader(block_size=row_len), shuffle=True, seed=1)
        dl = StreamingDataLoader(ds, batch_size=batch, num_workers=workers, worker_init_fn=_worker_start if workers else None)
        if state is not None:
            dl.load_state_dict(state)
        return dl, dl.state_dict

    return fresh, lambda b: b[:, :-1]


def _mds(root: Path, batch: int, workers: int):
    from streaming import StreamingDataLoader, StreamingDataset

    def fresh(state=None):
        ds = StreamingDataset(local=str(root / "mds"), shuffle=True, shuffle_seed=1, batch_size=batch)
        dl = StreamingDataLoader(ds, batch_size=batch, num_workers=workers, worker_init_fn=_worker_start if workers else None)
        if state is not None:
            dl.load_state_dict(state)
        return dl, dl.state_dict

    return fresh, lambda b: b["tokens"][:, :-1]


def child(lib: str, root: Path, batch: int, workers: int, row_len: int, resume: bool) -> dict:
    """One epoch of one library in this (fresh) process; the figures as a dict."""
    global _WORKER_PEAKS
    _reset_peak()
    _WORKER_PEAKS = multiprocessing.Array("d", max(workers, 1), lock=False)
    if lib == "datapipe":
        fresh, ids_of = _datapipe(root, batch, workers)
    elif lib == "litdata":
        fresh, ids_of = _litdata(root, batch, workers, row_len)
    else:
        fresh, ids_of = _mds(root, batch, workers)
    # The interpreter's pending full collection (torch's import leaves ~10^6 objects) is run
    # before the clock starts, for every library alike: otherwise whichever first batch happens
    # to allocate past the collector's threshold pays a 0.2-0.8 s walk of those objects (on the
    # loaded 2-core box; in datapipe's W=0 first batch it was torch's DataLoader importing
    # torch.profiler._cupti_monitor), which times the interpreter's history, not the loader.
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    dl, _ = fresh()
    first, n, tokens, digests = None, 0, 0, []
    for b in dl:
        ids = ids_of(b)
        if first is None:
            first = time.perf_counter() - t0
        tokens += ids.numel()
        int(ids[0, 0])  # touch it, as a training step does
        if resume:
            digests.append(_digest(ids))
        n += 1
    wall, cpu_main = time.perf_counter() - t0, time.process_time() - c0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_peak = max(_WORKER_PEAKS) if workers else 0.0
    out = {
        "batches": n,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "first_batch_s": first,
        "cpu_s": cpu_main + kids.ru_utime + kids.ru_stime,
        "cpu_main_s": cpu_main,
        "peak_rss_main_mib": _vm_hwm_mib(),
        # None when no worker recorded its peak (a worker killed rather than shut down).
        "peak_rss_worker_mib": worker_peak or None,
        "load": os.getloadavg()[0],
    }
    if resume:
        half, got = n // 2, []
        dl, state_of = fresh()
        it = iter(dl)
        for _ in range(half):
            got.append(_digest(ids_of(next(it))))
        state = state_of()
        del it
        dl, _ = fresh(json.loads(json.dumps(state, default=_jsonable)))
        got += [_digest(ids_of(b)) for b in dl]
        out["resume_exact"] = got == digests
        out["resume_detail"] = f"{half} + {len(got) - half} batches vs {len(digests)}"
    return out


def _jsonable(v: object) -> object:
    if hasattr(v, "tolist"):
        return v.tolist()
    raise TypeError(f"{type(v).__name__} in a loader state")


def prepare(root: Path, rows: int, seq_len: int, shards: int) -> dict[str, str]:
    """The same rows three ways; a library that does not import is skipped (the reason returned)."""
    from bench.perf.loader import make_run

    skipped: dict[str, str] = {}
    tokens = make_run(root / "datapipe", shards, -(-rows // shards), seq_len, 4)[:rows]
    flat = root / "tokens.bin"
    tokens.tofile(flat)
    try:
        from litdata import TokensLoader, optimize

        from bench.perf.loader import _lit_row

        inputs = [(str(flat), tokens.shape, i) for i in range(len(tokens))]
        optimize(
            fn=_lit_row,
            inputs=inputs,
            output_dir=str(root / "litdata"),
            chunk_bytes="64MB",
            item_loader=TokensLoader(),
            num_workers=1,
        )
    except Exception as exc:  # noqa: BLE001 - any failure: that library is skipped, with the reason
        skipped["litdata"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    try:
        from streaming import MDSWriter

        with MDSWriter(out=str(root / "mds"), columns={"tokens": f"ndarray:uint16:{seq_len + 1}"}, size_limit="64mb") as w:
            for r in tokens:
                w.write({"tokens": r})
    except Exception as exc:  # noqa: BLE001
        skipped["mds"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return skipped


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=6325, help="rows of seq_len + 1 tokens (6,325 x 2,049 = 12.96M)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--shards", type=int, default=4, help="datapipe shards the rows are packed into")
    p.add_argument("--workers", default="0,2", help="DataLoader num_workers values, comma separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--child", nargs=4, metavar=("LIB", "ROOT", "WORKERS", "RESUME"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        lib, root, w, resume = args.child
        print(json.dumps(child(lib, Path(root), args.batch_size, int(w), args.seq_len + 1, resume == "1")))
        return
    note = f"{args.rows} rows x {args.seq_len + 1} tokens, batch {args.batch_size}; one epoch per fresh process"
    h = Harness("loader_workers", args, libs=["torch", "litdata", "mosaicml-streaming"], note=note)
    workers = [int(w) for w in args.workers.split(",")]
    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="dp-bench-dl-") as tmp:
        root = Path(tmp)
        skipped = prepare(root, args.rows, args.seq_len, args.shards)
        for lib, why in skipped.items():
            print(f"{lib}: skipped ({why})")
        libs = [lib for lib in LIBS if lib not in skipped]
        for rep in range(args.repeats):
            for w in workers:
                for lib in libs:  # interleaved: every library once per repeat and worker count
                    resume = "1" if rep == 0 and w == max(workers) else "0"
                    cmd = [
                        sys.executable,
                        "-m",
                        "bench.perf.loader_workers",
                        "--batch-size",
                        str(args.batch_size),
                        "--seq-len",
                        str(args.seq_len),
                        "--child",
                        lib,
                        str(root),
                        str(w),
                        resume,
                    ]
                    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    if r.returncode != 0:
                        print(f"{lib} W={w}: failed: {r.stderr.strip().splitlines()[-1:]}")
                        continue
                    res = json.loads(r.stdout.strip().splitlines()[-1])
                    runs.setdefault((lib, w), []).append(res)
                    print(
                        f"rep {rep} {lib:>8s} W={w}: {res['tok_s'] / 1e6:6.2f} Mtok/s wall, first batch "
                        f"{res['first_batch_s'] * 1e3:6.0f} ms, tree CPU {res['cpu_s']:.2f} s, peak RSS main "
                        f"{res['peak_rss_main_mib']:.0f} MiB, worker {res['peak_rss_worker_mib'] or 0:.0f} MiB, "
                        f"load {res['load']:.1f}"
                        + (f", resume exact: {res['resume_exact']} ({res['resume_detail']})" if "resume_exact" in res else "")
                    )
    for w in workers:
        mine = runs.get(("datapipe", w), [])
        for lib in ("litdata", "mds"):
            theirs = runs.get((lib, w), [])
            k = min(len(mine), len(theirs))
            if k:
                h.ratio(
                    f"W={w} datapipe / {lib} tokens/s (wall)",
                    [mine[i]["tok_s"] / theirs[i]["tok_s"] for i in range(k)],
                    target=">= 1.5" if lib == "litdata" and w > 0 else "",
                )
                h.ratio(f"W={w} {lib} / datapipe tree CPU per epoch", [theirs[i]["cpu_s"] / mine[i]["cpu_s"] for i in range(k)])
    h.finish(runs={f"{lib} W={w}": v for (lib, w), v in runs.items()}, skipped=skipped)


if __name__ == "__main__":
    main()
