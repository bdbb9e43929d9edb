"""JSONL reader throughput: datapipe's read_jsonl against a plain `for line: json.loads` loop.

    python -m bench.perf.jsonl_read --repeats 5 [--json PATH]

Reads the real corpus files of ../shared/data/corpus (English and Chinese Wikipedia, TiDB docs,
OI-wiki: 27k documents, 59 MB, plain and gzipped) with reader_spec("jsonl").read (bounded line reads,
nesting-depth pre-check, Arrow batches) and with the plain loop (no caps, no Arrow), in one
process, alternating for --repeats pairs, by process CPU time (stable on a shared machine).
Prints MB/s of each (median, range) and the per-pair ratio datapipe / plain. To compare two versions of the reader, run
the script once with each first on PYTHONPATH (``python -P -m``): the plain loop is the common yardstick.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import SHARED

CORPUS = SHARED / "corpus"
FILES = ("en_wikipedia.jsonl", "zh_wikipedia.jsonl", "zh_pingcap_docs.jsonl", "zh_oiwiki.jsonl")


def run_datapipe(paths: list[Path]) -> int:
    from datapipe.pipeline.load import SourceConfig
    from datapipe.readers import InputFile, reader_spec

    src = SourceConfig.model_validate({"name": "s", "paths": ["x"]})
    n = 0
    for p in paths:
        for batch in reader_spec("jsonl").read(InputFile(p, p.name, src), 1024):
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


def cpu_timed(fn, paths: list[Path], counts: dict, name: str):  # type: ignore[no-untyped-def]
    def run() -> float:
        t = time.process_time()
        counts[name] = fn(paths)
        return time.process_time() - t

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gzip", action="store_true", help="also read gzipped copies")
    args = add_args(ap).parse_args()
    h = Harness("jsonl_read", args)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [CORPUS / f for f in FILES]
        if args.gzip:
            for p in list(paths):
                gz = Path(tmp) / (p.name + ".gz")
                with open(p, "rb") as src, gzip.open(gz, "wb", compresslevel=3) as dst:
                    shutil.copyfileobj(src, dst)
                paths.append(gz)
        mb = sum((CORPUS / f).stat().st_size for f in FILES) * (2 if args.gzip else 1) / 1e6
        counts: dict[str, int] = {}
        runs = h.interleave(
            {
                "plain json.loads loop": cpu_timed(run_plain, paths, counts, "plain"),
                "datapipe read_jsonl": cpu_timed(run_datapipe, paths, counts, "datapipe"),
            }
        )
        assert counts["plain"] == counts["datapipe"], counts
        print(f"{counts['datapipe']} documents, {mb:.1f} MB (uncompressed), process CPU time")
        for name, secs in runs.items():
            h.figure(f"{name} MB/CPU-s", [mb / s for s in secs], "MB/s")
        h.ratio("datapipe / plain (MB/s)", pair_ratios(runs["plain json.loads loop"], runs["datapipe read_jsonl"]))
        h.finish(documents=counts["datapipe"], mb=mb)


if __name__ == "__main__":
    main()
