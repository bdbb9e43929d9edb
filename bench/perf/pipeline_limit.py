"""The whole pipeline's floor: the library calls it cannot avoid, each timed alone, against its measured CPU.

    python -m bench.perf.pipeline_limit RUN_FOLDER INPUT_FOLDER [--tokenizer bpe32k] [--json PATH]

RUN_FOLDER is a finished ``bench/perf/pipeline.py --work W`` run (``W/dp-out``), INPUT_FOLDER its input
(``W/input``). In one process, on one core, with the same inputs:

  read        pyarrow's JSON reader over the input files (the text must be parsed once)
  fastText    ``predict`` over what the langid stage reads of every input text, newlines as spaces: the
              windows of a text longer than ``sample.chars`` (its defaults, langid_sample.py) and its
              ``max_chars`` prefix again where their score is under ``sample.full_below``
  encode      the exact encoder the tokenize stage chooses for the tokenizer (fastokens where it loads the
              file, ``datapipe/tokens/encode.py``; else tiktoken through datapipe's fast path) over the kept
              texts, as one batch, on one thread (``FASTOKENS_BPE_THREADS=1``, as in a 1-CPU task)
  parquet     writing the kept documents, as read back from the run, with zstd (the docs/ output)

Their sum is what any pipeline with these outputs spends in library code; the pipeline's process-tree
CPU (from ``bench/results/pipeline.json`` or ``--pipeline-cpu``) over that sum is its distance from the floor.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from bench._support.bench_tokenizer import resolve
from bench._support.harness import Harness, add_args


def cpu(fn) -> float:  # noqa: ANN001
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("input", type=Path)
    ap.add_argument("--tokenizer", default="bpe32k")
    ap.add_argument("--pipeline-cpu", type=float, nargs="*", default=[], help="process-tree CPU seconds of pipeline runs")
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("pipeline_limit", args, libs=["fasttext-numpy2", "fastokens", "tiktoken", "pyarrow"])
    os.environ["FASTOKENS_BPE_THREADS"] = "1"  # one core: fastokens sizes its pool at its first use
    os.environ["RAYON_NUM_THREADS"] = "1"
    from datapipe.assets.models import ensure_lid_model
    from datapipe.config.sections import TokenizeConfig
    from datapipe.stages.langid import LangIdOptions
    from datapipe.stages.langid_sample import sample_text
    from datapipe.tokens.encode import FastokensEncoder, fast_encoder, load_tokenizer_info, with_engine

    files = sorted(glob.glob(str(args.input / "*.jsonl")))
    docs = pa.concat_tables(
        [pq.read_table(f) for f in sorted(glob.glob(str(args.run / "docs" / "**" / "*.parquet"), recursive=True))]
    )
    kept = docs["text"].to_pylist()
    tok = resolve(args.tokenizer)
    info = with_engine(load_tokenizer_info(tok, TokenizeConfig(tokenizer=str(tok))))
    enc = fast_encoder(info, kept)
    assert enc is not None, info.engine_note
    print(f"encode: {info.describe()}")
    import fasttext

    model = fasttext.load_model(str(ensure_lid_model()))
    texts: list[str] = []

    def read() -> None:
        texts.clear()
        for f in files:
            texts.extend(pj.read_json(f, read_options=pj.ReadOptions(block_size=1 << 24))["text"].to_pylist())

    o = LangIdOptions()
    assert o.sample is not None

    def predict() -> None:
        s = o.sample
        prefix = [t[: o.max_chars] for t in texts]
        sampled = [sample_text(t, s.chars, s.windows).replace("\n", " ") for t in prefix]
        scores = model.predict(sampled, k=1)[1]
        doubt = [t for t, p in zip(prefix, scores) if len(t) > s.chars and p[0] < s.full_below]
        model.predict([t.replace("\n", " ") for t in doubt], k=1)

    def encode() -> None:
        if isinstance(enc, FastokensEncoder):
            enc.encode_flat(kept)  # one batch, one thread: ids as one buffer, as the stage calls it
        else:
            enc.encode_batch(kept)  # the tiktoken path, one thread

    def write() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            pq.write_table(docs, Path(tmp) / "docs.parquet", compression="zstd")

    read()
    runs = h.interleave(
        {
            "read": lambda: cpu(read),
            "fastText": lambda: cpu(predict),
            "encode": lambda: cpu(encode),
            "parquet": lambda: cpu(write),
        }
    )
    total = [sum(v) for v in zip(*runs.values())]
    for k, v in runs.items():
        h.figure(f"{k} CPU alone", v, "s")
    h.figure("sum of the irreducible calls", total, "s")
    if args.pipeline_cpu:
        floor = sorted(total)[len(total) // 2]
        h.figure("pipeline process-tree CPU / floor", [c / floor for c in args.pipeline_cpu], "x")
    h.finish(
        input_docs=len(texts), kept_docs=len(kept), tokenizer=args.tokenizer, encoder=info.engine, pipeline_cpu=args.pipeline_cpu
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
