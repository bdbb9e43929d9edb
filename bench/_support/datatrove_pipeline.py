"""datatrove's equivalent of the datapipe bench pipeline. Run by bench/perf/pipeline.py with the python of
a venv holding ``datatrove[processing]`` and spacy; it imports nothing from datapipe.

    <venv>/bin/python -m bench._support.datatrove_pipeline CONFIG.json

Standard datatrove components, in datapipe's order, each block a LocalPipelineExecutor:
  1. JsonlReader -> LanguageFilter(zh, en) -> GopherRepetitionFilter -> GopherQualityFilter
     -> C4QualityFilter -> FineWebQualityFilter -> JsonlWriter              (tasks = input files)
  2. exact dedup: ExactDedupSignature (tasks = files) -> ExactFindDedups (1 task)
     -> ExactDedupFilter + JsonlWriter                                     (tasks = files)
  3. MinHash: MinhashDedupSignature (files) -> MinhashDedupBuckets (one task per bucket)
     -> MinhashDedupCluster (1) -> MinhashDedupFilter + JsonlWriter + DocumentTokenizer (files)
With ``"stages": "tokenize"`` only JsonlReader -> DocumentTokenizer runs.
Every block gets ``workers`` processes. lid.176 is the same file datapipe uses (no download).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    cfg = json.load(open(sys.argv[1]))
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter

    inp, work, workers, files = cfg["input"], cfg["work"], cfg["workers"], cfg["files"]
    timings: dict[str, float] = {}

    def run(name: str, pipeline: list, tasks: int) -> None:
        t = time.perf_counter()
        LocalPipelineExecutor(
            pipeline=pipeline, tasks=tasks, workers=min(workers, tasks), logging_dir=f"{work}/logs/{name}"
        ).run()
        timings[name] = time.perf_counter() - t

    def tokenizer() -> DocumentTokenizer:
        return DocumentTokenizer(
            output_folder=f"{work}/tokens", tokenizer_name_or_path=cfg["tokenizer"], eos_token=cfg["eos_token"]
        )

    if cfg["stages"] == "tokenize":
        run("tokenize", [JsonlReader(inp), tokenizer()], files)
        print(json.dumps({"timings": timings}))
        return

    from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.exact_dedup import ExactDedupConfig, ExactDedupFilter, ExactDedupSignature, ExactFindDedups
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
    )

    lang = LanguageFilter(languages=["zh", "en"])  # the languages datapipe's langid keeps
    lang.model.MODEL_URL = cfg["lid_model"]  # a local path: datatrove copies it into its cache once
    run(
        "quality",
        [
            JsonlReader(inp),
            lang,
            GopherRepetitionFilter(),
            GopherQualityFilter(),
            C4QualityFilter(),
            FineWebQualityFilter(),
            JsonlWriter(f"{work}/filtered"),
        ],
        files,
    )

    exact = ExactDedupConfig(content_getter=lambda doc: doc.text)
    run("exact_signature", [JsonlReader(f"{work}/filtered"), ExactDedupSignature(f"{work}/exact_sigs", config=exact)], files)
    run("exact_find", [ExactFindDedups(f"{work}/exact_sigs", f"{work}/exact_dups", config=exact)], 1)
    run(
        "exact_filter",
        [JsonlReader(f"{work}/filtered"), ExactDedupFilter(f"{work}/exact_dups", config=exact), JsonlWriter(f"{work}/exact")],
        files,
    )

    mh = MinhashConfig()
    run("minhash_signature", [JsonlReader(f"{work}/exact"), MinhashDedupSignature(f"{work}/mh_sigs", config=mh)], files)
    run("minhash_buckets", [MinhashDedupBuckets(f"{work}/mh_sigs", f"{work}/mh_buckets", config=mh)], mh.num_buckets)
    run("minhash_cluster", [MinhashDedupCluster(f"{work}/mh_buckets", f"{work}/mh_remove", config=mh)], 1)
    run(
        "minhash_filter+tokenize",
        [JsonlReader(f"{work}/exact"), MinhashDedupFilter(f"{work}/mh_remove"), JsonlWriter(f"{work}/final"), tokenizer()],
        files,
    )
    print(json.dumps({"timings": timings}))


if __name__ == "__main__":
    main()
