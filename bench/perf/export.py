"""``python -m bench.perf.export [--docs 8000] [--repeats 3] [--json PATH]``: exports keep memory bounded, and their throughput.

Builds a synthetic run folder (docs/ Parquet, _work/tokens, one shard and the manifest, run.json;
documents of ~3,000 characters and ~700 tokens) with N and 4N documents, then exports it in each
format in a fresh process and reports the peak RSS of that process (``VmHWM``) and the input
bytes per second. The baseline is the data itself: if an export held the run in memory, its
peak would grow with the input (4x); streaming keeps the ratio of peaks near 1. Per format the
1x and 4x exports alternate over ``--repeats`` pairs (``bench/_support/harness.py``); the ratio of peaks is
taken per pair and reported as median and range.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT
from datapipe.tokens.shard_format import ShardMeta, file_sha256
from datapipe.tokens.shard_writer import write_shard

FILES_PER_SOURCE = 4
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forking parent (this script,
# which held a whole synthetic run while building it), while VmHWM belongs to the new process.
CHILD = """
import json, sys, time
from datapipe.export import export

def hwm():
    line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024

before = hwm()
t = time.perf_counter()
r = export(sys.argv[1], sys.argv[2], sys.argv[3])
print(json.dumps({"seconds": time.perf_counter() - t, "docs": r.documents, "import_mib": before, "peak_mib": hwm()}))
"""


def make_run(root: Path, n_docs: int, seed: int = 0) -> int:
    """A complete run folder with two sources; returns the bytes of docs/ and _work/tokens."""
    rng = np.random.default_rng(seed)
    words = np.array(["data", "pipeline", "token", "shard", "export", "train", "model", "语料", "数据", "训练"])
    meta = ShardMeta(
        tokenizer_fingerprint="bench",
        vocab_size=32000,
        seq_len=512,
        row_len=512,
        eos_id=0,
        pad_id=1,
        bos_id=None,
        packing="concat",
        source="a",
        split="train",
        dtype="uint16",
    )
    manifest = []
    for source in ("a", "b"):
        rows = np.ones((1, 512), np.uint16)
        rel = f"shards/{source}/train-00000.arrow"
        m = write_shard(root / rel, rows, np.array([0, 1]), np.array([0]), np.array([512]), meta)
        manifest.append(
            {
                "path": rel,
                "source": source,
                "split": "train",
                "rows": 1,
                "tokens": m.tokens,
                "documents": 1,
                "sha256": file_sha256(root / rel),
                "tokenizer_fingerprint": "bench",
                "seq_len": 512,
                "row_len": 512,
                "packing": "concat",
            }
        )
        per_file = n_docs // 2 // FILES_PER_SOURCE
        for k in range(FILES_PER_SOURCE):
            ids = [f"{source}/f{k}#L{i}" for i in range(per_file)]
            texts = [" ".join(rng.choice(words, 500)) for _ in range(per_file)]
            lengths = rng.integers(200, 1200, per_file)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            flat = rng.integers(2, 32000, offsets[-1]).astype(np.uint32)
            split = np.where(rng.random(per_file) < 0.05, "val", "train")
            docs = pa.table({"id": ids, "text": texts, "n_tokens": lengths, "split": split})
            (root / "docs" / source).mkdir(parents=True, exist_ok=True)
            # Row groups of 1,000 documents, as the pipeline writes them (one per batch).
            pq.write_table(docs, root / "docs" / source / f"{k:05d}.parquet", row_group_size=1000, compression="zstd")
            tokens = pa.table(
                {"id": ids, "split": split, "tokens": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))}
            )
            (root / "_work" / "tokens" / source).mkdir(parents=True, exist_ok=True)
            with pa.ipc.new_file(str(root / "_work" / "tokens" / source / f"{k:05d}.arrow"), tokens.schema) as w:
                w.write_table(tokens, max_chunksize=1000)  # record batches per map batch, as TokenSink
    pq.write_table(pa.Table.from_pylist(manifest), root / "shards" / "manifest.parquet")
    (root / "run.json").write_text(json.dumps({"status": "complete", "fingerprint": "bench", "config": {}}))
    return sum(p.stat().st_size for d in ("docs", "_work") for p in (root / d).rglob("*") if p.is_file())


FORMATS = ("megatron", "hf", "mds", "jsonl")


def export_once(run: Path, fmt: str, out: Path, size: int) -> dict:
    """One export in a fresh process: seconds, documents, peak RSS (VmHWM), input MiB/s."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(run), fmt, str(out)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r["mib_s"] = size / 2**20 / r["seconds"]
    shutil.rmtree(out)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--docs", type=int, default=8_000, help="documents in the small run (the large has 4x; the README's figure used 16,000)"
    )
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("export", args)
    with tempfile.TemporaryDirectory() as tmp:
        runs, sizes = {}, {}
        for n in (args.docs, 4 * args.docs):
            runs[n] = Path(tmp) / f"run{n}"
            t = time.perf_counter()
            sizes[n] = make_run(runs[n], n)
            print(
                f"run of {n} documents: {sizes[n] / 2**20:.0f} MiB of docs and token lists "
                f"(built in {time.perf_counter() - t:.0f}s)"
            )
        small, large = args.docs, 4 * args.docs
        for fmt in FORMATS:
            got = h.interleave(
                {
                    f"{fmt} 1x": lambda fmt=fmt: export_once(runs[small], fmt, Path(tmp) / "out", sizes[small]),
                    f"{fmt} 4x": lambda fmt=fmt: export_once(runs[large], fmt, Path(tmp) / "out", sizes[large]),
                }
            )
            a, b = got[f"{fmt} 1x"], got[f"{fmt} 4x"]
            h.noise(f"{fmt} 1x seconds", [r["seconds"] for r in a])
            print(f"  {fmt}: {a[-1]['docs']} / {b[-1]['docs']} docs, after imports {a[-1]['import_mib']:.0f} MiB")
            for label, rs in ((f"{fmt} 1x", a), (f"{fmt} 4x", b)):
                h.figure(f"{label} peak RSS", [r["peak_mib"] for r in rs], "MiB")
                h.figure(f"{label} input MiB/s", [r["mib_s"] for r in rs], "MiB/s")
            h.ratio(
                f"{fmt}: peak RSS 4x input / 1x input",
                [y["peak_mib"] / x["peak_mib"] for x, y in zip(a, b)],
                target="~1 (bounded; input 4.0x)",
            )
        h.finish(docs=[small, large], input_mib=[sizes[small] / 2**20, sizes[large] / 2**20])


if __name__ == "__main__":
    main()
