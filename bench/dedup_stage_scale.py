"""Memory and time of the minhash stage's distributed path, one step per process, as Ray runs it.

    python bench/dedup_stage_scale.py --sizes 1000000 2000000 4000000 [--partitions 16]

For each size: synthetic signatures are written as map outputs (Parquet shards of 100k
documents: id, n_chars, minhash_sig) together with their shuffle files, exactly as the
map phase writes them (``MinHashDedup.shuffle`` + the engine's ``ShuffleSink``). Then every
partition task and the combine step run in a fresh child process each, so the peak RSS
printed for a step is what one Ray worker needs. 2% of the documents are planted copies with
10% of their signature values changed; the run checks they are all found. Peak memory, not
speed, is the figure, and there is no baseline: the harness adds the machine/commit header and
--json; --repeats N runs each size N times (the JSON keeps every run).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import Harness, add_args  # noqa: E402

SHARD_DOCS = 100_000


def _stage(num_perm: int, threshold: float, partitions: int):
    from datapipe.stages.base import StageContext
    from datapipe.stages.minhash import MinHashDedup, MinHashOptions

    opts = MinHashOptions(threshold=threshold, num_perm=num_perm, partitions=partitions, survivor="longest")
    return MinHashDedup(opts, StageContext(".", "."))


def write_inputs(work: Path, n: int, num_perm: int, threshold: float, partitions: int) -> dict:
    from datapipe.engine.tasks.sinks import ShuffleSink
    from datapipe.stages.row_keys import row_key

    stage = _stage(num_perm, threshold, partitions)
    rng = np.random.default_rng(0)
    planted = 0
    started = time.perf_counter()
    for shard, lo in enumerate(range(0, n, SHARD_DOCS)):
        m = min(SHARD_DOCS, n - lo)
        sigs = rng.integers(0, 2**32, size=(m, num_perm), dtype=np.uint32)
        k = m // 50  # copies of earlier rows of the same shard, 10% of values changed
        src = rng.choice(m - k, k, replace=False)
        sigs[m - k :] = sigs[src]
        cols = rng.integers(0, num_perm, size=(k, num_perm // 10))
        sigs[np.arange(m - k, m)[:, None], cols] = rng.integers(0, 2**32, size=cols.shape, dtype=np.uint32)
        planted += k
        column = pa.Array.from_buffers(pa.binary(4 * num_perm), m, [None, pa.py_buffer(sigs.tobytes())])
        lengths = rng.integers(100, 10_000, m)
        lengths[m - k :] = lengths[src] - 1  # the originals are longer: they survive under `longest`
        table = pa.table({"id": [f"s{shard}#{i}" for i in range(m)], "n_chars": lengths, "minhash_sig": column})
        pq.write_table(table, work / f"map-{shard:05d}.parquet")
        sink = ShuffleSink(work / f"shuffle-{shard:05d}.parquet")
        for b in range(0, m, 10_000):
            sink.write(stage.shuffle(table.slice(b, 10_000), row_key(shard, b)))
        sink.close()
    return {"planted": planted, "write_s": time.perf_counter() - started}


def step(work: Path, what: str, partition: int, num_perm: int, threshold: float, partitions: int) -> dict:
    import pyarrow.dataset as pads

    from datapipe.engine.tasks.reduce_inputs import ParquetReduceInputs as ReduceInputs

    stage = _stage(num_perm, threshold, partitions)
    started = time.perf_counter()
    if what == "baseline":  # imports only: what every worker process costs before any data
        out: dict = {}
    elif what == "partition":
        files = sorted(str(p) for p in work.glob("shuffle-*.parquet"))
        rows = pads.dataset(files, format="parquet").to_table(filter=pads.field("part") == partition)
        maps = sorted(work.glob("map-*.parquet"))  # verification reads the pairs' signatures back
        edges = stage.reduce_partition(rows, 0, ReduceInputs([str(p) for p in maps], list(range(len(maps))), str(work)))
        pq.write_table(edges, work / f"part-{partition:05d}.parquet")
        out = {"rows": rows.num_rows, "edges": edges.num_rows}
    else:
        maps = sorted(work.glob("map-*.parquet"))
        inputs = ReduceInputs([str(p) for p in maps], list(range(len(maps))), str(work))
        decisions = stage.combine(sorted(str(p) for p in work.glob("part-*.parquet")), inputs)
        planted_ok = sum(
            1 for i in decisions["id"].to_pylist() if int(i.split("#")[1]) >= min(SHARD_DOCS, _shard_size(work, i)) * 49 // 50
        )
        out = {"removed": decisions.num_rows, "removed_planted": planted_ok}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.update(seconds=time.perf_counter() - started, peak_rss_mib=peak)
    return out


def _shard_size(work: Path, doc_id: str) -> int:
    shard = int(doc_id[1:].split("#")[0])
    return pq.ParquetFile(work / f"map-{shard:05d}.parquet").metadata.num_rows


def child(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[200_000, 400_000])
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--threshold", type=float, default=0.7)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--step", choices=["partition", "combine", "baseline"], help=argparse.SUPPRESS)
    ap.add_argument("--partition", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    a = add_args(ap, repeats=1).parse_args(argv)
    common = ["--num-perm", str(a.num_perm), "--threshold", str(a.threshold), "--partitions", str(a.partitions)]
    if a.step:
        print(json.dumps(step(a.work, a.step, a.partition, a.num_perm, a.threshold, a.partitions)))
        return 0
    h = Harness("dedup_stage_scale", a, libs=["numba"])
    base = child(["--step", "baseline", "--work", ".", *common])["peak_rss_mib"]
    results = []
    print(f"process baseline after imports: {base:,.0f} MiB (included in the peaks below)")
    print(
        f"{'docs':>10} {'write s':>8} {'partition peak MiB':>19} {'partition s (sum)':>18} "
        f"{'combine peak MiB':>17} {'combine s':>10} {'removed':>8} {'planted found':>14}"
    )
    for n in [n for _ in range(a.repeats) for n in a.sizes]:
        work = Path(tempfile.mkdtemp(prefix="dp-dedup-scale-"))
        try:
            info = write_inputs(work, n, a.num_perm, a.threshold, a.partitions)
            parts = [
                child(["--step", "partition", "--partition", str(p), "--work", str(work), *common]) for p in range(a.partitions)
            ]
            comb = child(["--step", "combine", "--work", str(work), *common])
            print(
                f"{n:>10,} {info['write_s']:>8.1f} {max(p['peak_rss_mib'] for p in parts):>19,.0f} "
                f"{sum(p['seconds'] for p in parts):>18.1f} {comb['peak_rss_mib']:>17,.0f} "
                f"{comb['seconds']:>10.1f} {comb['removed']:>8,} {comb['removed_planted'] / info['planted']:>14.3f}",
                flush=True,
            )
            results.append(
                {
                    "docs": n,
                    **info,
                    "partition_peak_mib": max(p["peak_rss_mib"] for p in parts),
                    "partition_s": sum(p["seconds"] for p in parts),
                    "combine": comb,
                }
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    h.finish(baseline_mib=base, runs=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
