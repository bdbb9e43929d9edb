"""The exact fast encoder against ``tokenizers`` on the whole shared corpus: identical ids, and encode CPU.

    python -m bench.perf.fast_encoder [--repeats 3] [--json bench/results/fast_encoder.json]

1. Equivalence, every document of the corpus (27,369): ``encode_documents`` with the engine the file
   gets (tiktoken) against the same function forced to ``tokenizers``, for the 32k benchmark BPE
   (bench/_support/bench_tokenizer.py, trained on the whole corpus) and for variants trained on a 4 MB slice:
   8k with ``add_prefix_space``, 16k Llama-3 split (digits in threes, case-insensitive contractions)
   with special tokens in the text, 64k GPT-2 split. Any differing document fails the run.
2. Speed, 32k BPE: the corpus in batches of 1000 documents (the pipeline's batch size), tokenizers then
   the fast path, interleaved; process CPU (all threads: ``tokenizers`` encodes on a Rayon pool) and wall.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from bench._support.bench_tokenizer import bench_tokenizer
from bench._support.corpus import CORPUS, FILES
from bench._support.harness import Harness, add_args, pair_ratios
from datapipe.pipeline.load import TokenizeConfig
from datapipe.tokens import encode as tokenize
from tests.support.bpe_variants import SPECIAL, train_bpe, with_special_tokens

VARIANTS = {
    # name: (vocabulary, pre-tokenizer, special tokens, special tokens put into the text)
    "prefix-space-8k": (8000, "prefix", SPECIAL[:2], False),
    "llama3-split-16k-specials": (16000, "llama3", SPECIAL, True),
    "bytelevel-64k": (64000, "bytelevel", SPECIAL[:2], False),
}


def corpus() -> list[str]:
    texts = []
    for name in FILES:
        with open(CORPUS / name, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def batches(texts: list[str], size: int = 1000) -> list[list[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def info_for(path: Path) -> tokenize.TokenizerInfo:
    return tokenize.with_engine(tokenize.load_tokenizer_info(path, TokenizeConfig(tokenizer=str(path))))


def differing(info: tokenize.TokenizerInfo, texts: list[str]) -> int:
    slow = dataclasses.replace(info, engine="tokenizers")
    tokenize._FAST.clear()
    n = 0
    for b in batches(texts):
        fast, ref = tokenize.encode_documents(b, info), tokenize.encode_documents(b, slow)
        n += sum(not fast[i].equals(ref[i]) for i in range(len(b)))
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-variants", action="store_true", help="only the 32k BPE")
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("fast_encoder", args, libs=["tokenizers", "tiktoken"])
    texts = corpus()
    chars = sum(map(len, texts))
    print(f"corpus: {len(texts):,} documents, {chars:,} characters")
    bpe32k = bench_tokenizer(32000)
    equivalence: dict[str, dict] = {}
    info = info_for(bpe32k)
    print(f"bpe32k ({bpe32k.name}): engine {info.engine} {info.engine_note}")
    equivalence["bpe32k"] = {"engine": info.engine, "docs": len(texts), "differing": differing(info, texts)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (vocab, pre, special, in_text) in ({} if args.skip_variants else VARIANTS).items():
            t0 = time.perf_counter()
            path = train_bpe(Path(tmp) / f"{name}.json", texts[::7][:4000], vocab, pre, special)
            vinfo = info_for(path)
            docs = with_special_tokens(texts) if in_text else texts
            equivalence[name] = {"engine": vinfo.engine, "docs": len(docs), "differing": differing(vinfo, docs)}
            print(f"{name}: engine {vinfo.engine} {vinfo.engine_note}; {equivalence[name]} ({time.perf_counter() - t0:.0f} s)")
    print(f"equivalence: {equivalence}")
    bad = {k: v for k, v in equivalence.items() if v["differing"] or v["engine"] != "tiktoken"}

    slow = dataclasses.replace(info, engine="tokenizers")
    bs = batches(texts)

    def side(i: tokenize.TokenizerInfo):
        def run() -> dict:
            tokenize._FAST.clear()
            c0, w0 = time.process_time(), time.perf_counter()
            for b in bs:
                tokenize.encode_documents(b, i)
            return {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}

        return run

    runs = h.interleave({"tokenizers": side(slow), "fast path (tiktoken)": side(info)})
    base, fast = runs["tokenizers"], runs["fast path (tiktoken)"]
    h.noise("tokenizers CPU", [r["cpu"] for r in base])
    for label, rs in runs.items():
        h.figure(f"{label} encode CPU, 32k BPE, whole corpus", [r["cpu"] for r in rs], "s")
        h.figure(f"{label} encode wall", [r["wall"] for r in rs], "s", show=True)
    h.ratio(
        "encode CPU tokenizers/fast path (32k BPE, identical ids)",
        pair_ratios([r["cpu"] for r in base], [r["cpu"] for r in fast]),
        target=">= 3",
    )
    h.ratio("encode wall tokenizers/fast path", pair_ratios([r["wall"] for r in base], [r["wall"] for r in fast]))
    h.finish(
        tokenizer="bpe32k", tokenizer_sha256=info.fingerprint, docs=len(texts), chars=chars, equivalence=equivalence, runs=runs
    )
    if bad:
        print(f"FAILED: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
