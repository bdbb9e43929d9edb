"""JSONL reader throughput: datapipe's read_jsonl against a plain `for line: json.loads` loop.

    PYTHONPATH=. python bench/jsonl_read.py --rounds 3

Reads the real corpus files of ../shared/data/corpus (English and Chinese Wikipedia, TiDB docs,
OI-wiki: 27k documents, 59 MB, plain and gzipped) with READERS["jsonl"] (bounded line reads,
nesting-depth pre-check, Arrow batches) and with the plain loop (no caps, no Arrow), in one
process, alternating, best of --rounds by process CPU time (stable on a shared machine).
Prints MB/s of each and the ratio datapipe / plain. To compare two versions of the reader, run
the script once with each on PYTHONPATH: the plain loop is the common yardstick.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tempfile
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "corpus"
FILES = ("en_wikipedia.jsonl", "zh_wikipedia.jsonl", "zh_pingcap_docs.jsonl", "zh_oiwiki.jsonl")


def run_datapipe(paths: list[Path]) -> int:
    from datapipe.config import SourceConfig
    from datapipe.readers import READERS, InputFile

    src = SourceConfig.model_validate({"name": "s", "paths": ["x"]})
    n = 0
    for p in paths:
        for batch in READERS["jsonl"](InputFile(p, p.name, src), 1024):
            n += batch.docs.num_rows
    return n


def run_plain(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rb") as f:
            for line in f:
                if line.strip():
                    json.loads(line)["text"]
                    n += 1
    return n


def best(fn, paths: list[Path], rounds: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    times, n = [], 0
    for _ in range(rounds):
        t = time.process_time()
        n = fn(paths)
        times.append(time.process_time() - t)
    return min(times), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gzip", action="store_true", help="also read gzipped copies")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [CORPUS / f for f in FILES]
        if args.gzip:
            for p in list(paths):
                gz = Path(tmp) / (p.name + ".gz")
                with open(p, "rb") as src, gzip.open(gz, "wb", compresslevel=3) as dst:
                    shutil.copyfileobj(src, dst)
                paths.append(gz)
        mb = sum((CORPUS / f).stat().st_size for f in FILES) * (2 if args.gzip else 1) / 1e6
        plain_t, plain_n = best(run_plain, paths, args.rounds)
        dp_t, dp_n = best(run_datapipe, paths, args.rounds)
        assert plain_n == dp_n, (plain_n, dp_n)
        print(f"{dp_n} documents, {mb:.1f} MB (uncompressed)")
        print(f"plain json.loads loop: {mb / plain_t:7.1f} MB/s  ({plain_t:.2f} s CPU)")
        print(f"datapipe read_jsonl:   {mb / dp_t:7.1f} MB/s  ({dp_t:.2f} s CPU)")
        print(f"ratio datapipe / plain: {plain_t / dp_t:.2f}")


if __name__ == "__main__":
    main()
