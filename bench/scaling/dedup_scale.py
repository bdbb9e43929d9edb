"""Clustering memory and time on synthetic signatures (1M/2M/4M docs with --sizes).

    python -m bench.scaling.dedup_scale [--sizes 200000 400000] [--num-perm 128] [--repeats 1] [--json PATH]

Each size runs in a fresh subprocess so its peak RSS (ru_maxrss) is its own. 2% of the documents
are planted near-copies (signature rows with 10% of values changed); the run checks they are found.
Steps: signatures (input, uint32) -> band keys (uint64) -> per-band buckets + union-find with
Jaccard verification -> survivors. With --repeats N each size runs N times (fresh processes, sizes
taking turns) and the table shows medians; the JSON has every run. There is no baseline.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT


def one(n: int, num_perm: int, threshold: float) -> dict:
    from datapipe.dedup.cluster import cluster_duplicates
    from datapipe.dedup.minhash import band_keys, lsh_params

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    sigs = rng.integers(0, 2**32, size=(n, num_perm), dtype=np.uint32)
    n_dup = n // 50
    src = rng.choice(n - n_dup, n_dup, replace=False)
    sigs[n - n_dup :] = sigs[src]
    cols = rng.integers(0, num_perm, size=(n_dup, num_perm // 10))
    rows = np.arange(n - n_dup, n)[:, None]
    sigs[rows, cols] = rng.integers(0, 2**32, size=cols.shape, dtype=np.uint32)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    b, r = lsh_params(threshold, num_perm)
    t1 = time.perf_counter()
    keys = band_keys(sigs, b, r)
    t2 = time.perf_counter()
    lengths = rng.integers(100, 10000, n)
    res = cluster_duplicates(keys, n, sigs=sigs, verify_threshold=threshold, rule="longest", lengths=lengths)
    t3 = time.perf_counter()
    found = float(np.mean(res.cluster[n - n_dup :] == res.cluster[src]))
    return {
        "n": n,
        "bands": b,
        "rows": r,
        "input_MiB": sigs.nbytes / 2**20,
        "rss_after_input_MiB": base,
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "keys_s": t2 - t1,
        "cluster_s": t3 - t2,
        "total_s": t3 - t0,
        "planted_found": found,
        "removed": int(res.duplicate.sum()),
        "candidates": res.candidate_pairs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[200_000, 400_000])
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--threshold", type=float, default=0.7)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = add_args(ap, repeats=1).parse_args(argv)
    if args.child:
        print(json.dumps(one(args.child, args.num_perm, args.threshold)))
        return 0
    h = Harness("dedup_scale", args, libs=["numba"])

    def child(n: int):  # noqa: ANN202 - a closure for the harness
        def run() -> dict:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    __spec__.name,
                    "--child",
                    str(n),
                    "--num-perm",
                    str(args.num_perm),
                    "--threshold",
                    str(args.threshold),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            return json.loads(out.stdout.strip().splitlines()[-1])

        return run

    runs = h.interleave({str(n): child(n) for n in args.sizes})
    print(
        f"{'docs':>9} {'b x r':>6} {'sigs MiB':>9} {'peak RSS MiB':>13} {'over sigs':>10} "
        f"{'keys s':>7} {'cluster s':>10} {'found':>6} {'removed':>8}"
    )
    rows = []
    for n in args.sizes:
        all_runs = runs[str(n)]
        s = {k: (float(np.median([r[k] for r in all_runs])) if isinstance(v, float) else v) for k, v in all_runs[0].items()}
        rows.append(s)
        h.figure(f"{n} docs peak RSS", [r["peak_rss_MiB"] for r in all_runs], "MiB", show=False)
        h.figure(f"{n} docs cluster seconds", [r["cluster_s"] for r in all_runs], "s", show=False)
        over = s["peak_rss_MiB"] - s["input_MiB"]
        print(
            f"{n:>9} {s['bands']:>3}x{s['rows']:<2} {s['input_MiB']:9.0f} {s['peak_rss_MiB']:13.0f} {over:10.0f} "
            f"{s['keys_s']:7.1f} {s['cluster_s']:10.1f} {s['planted_found']:6.3f} {s['removed']:>8}"
        )
    if len(rows) > 1:
        a, z = rows[0], rows[-1]
        per_doc = (z["peak_rss_MiB"] - a["peak_rss_MiB"]) * 2**20 / (z["n"] - a["n"])
        print(
            f"marginal peak RSS: {per_doc:.0f} bytes/doc (signatures alone: {args.num_perm * 4} bytes/doc); "
            f"10M docs -> ~{per_doc * 10e6 / 2**30:.1f} GiB in one process"
        )
    h.finish(runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
