"""Documents/s and MB/s of the decontaminate stage against an index of all shared benchmarks, vs a
plain baseline on the same texts in the same process: a pure-Python set of word 13-grams (lower
case, ``\\w+`` words, n-grams joined by spaces), the lookup datatrove's n-gram decontamination does.
The baseline splits on words only, so on Chinese it sees whole clauses as single "words"; it is a
speed reference, not a recall one.

    python -m bench.perf.decontaminate --docs 6000 [--repeats 3] [--json bench/results/decontaminate.json]

The baseline and the stage alternate over ``--repeats`` pairs (``bench/_support/harness.py``); the ratio is
taken per pair and reported as median and range.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import tracemalloc

import pyarrow as pa

from bench._support.corpus import sample
from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT, SHARED
from datapipe.decontaminate.benchmarks import items
from datapipe.stages.base import StageContext
from datapipe.stages.decontaminate import Decontaminate, DecontaminateOptions

BENCH = SHARED / "benchmarks"
BENCHMARKS = [
    {"name": "gsm8k", "paths": [str(BENCH / "gsm8k_test.jsonl")], "fields": ["question", "answer"]},
    {
        "name": "humaneval",
        "paths": [str(BENCH / "HumanEval.jsonl.gz")],
        "fields": ["prompt", "canonical_solution"],
        "id_field": "task_id",
    },
    {
        "name": "cmrc2018",
        "paths": [str(BENCH / "cmrc2018_dev.jsonl")],
        "fields": ["context", "question", "answers"],
        "id_field": "id",
    },
    {
        "name": "agieval_gaokao",
        "paths": [str(BENCH / "agieval/gaokao-*.jsonl")],
        "fields": ["passage", "question", "options", "answer"],
    },
    {
        "name": "agieval_en",
        "paths": [str(BENCH / "agieval/sat-*.jsonl"), str(BENCH / "agieval/lsat-*.jsonl"), str(BENCH / "agieval/aqua-rat.jsonl")],
        "fields": ["passage", "question", "options", "other.solution"],
    },
]
WORD = re.compile(r"\w+")


def baseline_ngrams(text: str, n: int = 13) -> list[str]:
    w = WORD.findall(text.lower())
    return [" ".join(w[i : i + n]) for i in range(len(w) - n + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=6000, help="documents from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("decontaminate", args)
    texts = [d["text"] for d in sample(args.docs)]
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6

    t0 = time.perf_counter()
    # A fresh cache folder: the index is built here every run (and not left in the working tree).
    cache = tempfile.TemporaryDirectory(prefix="bench-decontam-")
    stage = Decontaminate(DecontaminateOptions.model_validate({"benchmarks": BENCHMARKS}), StageContext(str(ROOT), cache.name))
    stage.setup()
    build_s = time.perf_counter() - t0
    idx = stage.index

    tracemalloc.start()
    t0 = time.perf_counter()
    base_set: set[str] = set()
    for b in BENCHMARKS:
        spec = DecontaminateOptions.model_validate({"benchmarks": [b]}).benchmarks[0]
        from datapipe.stages.decontaminate import resolve_paths

        for it in items(spec.name, resolve_paths(spec, ROOT), spec.fields, spec.id_field):
            for t in it.texts:
                base_set.update(baseline_ngrams(t))
    base_build_s = time.perf_counter() - t0
    base_mem = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()

    found = {}

    def ours() -> None:
        n = 0
        for i in range(0, len(texts), args.batch):
            b = stage.compute(pa.table({"text": texts[i : i + args.batch]}))
            n += sum(r is not None for r in stage.decide(b).reason.to_pylist())
        found["ours"] = n

    def baseline() -> None:
        found["baseline"] = sum(any(g in base_set for g in baseline_ngrams(t)) for t in texts)

    runs = h.interleave({"baseline word set": baseline, "decontaminate stage": ours}, warmup=True)  # numba kernels
    n = len(texts)
    print(f"{n} documents, {mb:.1f} MB (shared corpus sample: en/zh Wikipedia, TiDB docs, OI-wiki)")
    print(
        f"index: {len(idx.keys):,} (n-gram, item) entries from {len(idx.item_ids):,} items, "
        f"{idx.nbytes / 2**20:.1f} MiB (numpy), built in {build_s:.1f} s; items too short: {idx.too_short}"
    )
    print(
        f"baseline index: {len(base_set):,} word 13-gram strings, {base_mem / 2**20:.1f} MiB (Python set), "
        f"built in {base_build_s:.1f} s"
    )
    print(f"decontaminate stage: {found['ours']} contaminated; baseline word set: {found['baseline']} with a hit")
    for name, secs in runs.items():
        h.figure(f"{name} docs/s", [n / s for s in secs], "docs/s")
        h.figure(f"{name} MB/s", [mb / s for s in secs], "MB/s")
    h.figure("stage index build (once per run)", build_s, "s")
    h.figure("baseline word set build", base_build_s, "s")
    h.ratio("stage / baseline word set (docs/s)", pair_ratios(runs["baseline word set"], runs["decontaminate stage"]))
    h.finish(
        docs=n,
        mb=mb,
        index_build_s=build_s,
        baseline_build_s=base_build_s,
        index_mib=idx.nbytes / 2**20,
        baseline_mib=base_mem / 2**20,
        contaminated=found,
    )
    cache.cleanup()


if __name__ == "__main__":
    main()
