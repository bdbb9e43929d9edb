"""The tokenize stage's encoder against ``tokenizers``, tiktoken and each candidate, on the whole shared corpus.

    python -m bench.perf.fast_encoder [--repeats 3] [--skip-variants] [--json bench/results/fast_encoder.json]

1. Equivalence, every document of the corpus (27,369), for the 32k benchmark BPE (bench/_support/bench_tokenizer.py,
   trained on the whole corpus) and for variants trained on a slice: 8k with ``add_prefix_space``, 16k
   Llama-3 split (digits in threes, case-insensitive contractions) with special tokens in the text, 64k
   GPT-2 split. Each encoder's ids per document against ``tokenizers``' (``encode_documents`` forced to it):

   * the chosen encoder, as the stage calls it: ``encode_documents`` with the engine the file gets (fastokens);
   * the old fast path: ``encode_documents`` forced to tiktoken over datapipe's plan (``fast_bpe.py``);
   * tiktoken as it is: ``tiktoken.Encoding`` given the plan's ranks, split regex and added tokens (tiktoken
     cannot read a tokenizer.json; where no plan exists it is not run), one ``encode`` per document;
   * fastokens' bare call (``encode_batch_flat``, no end tokens or Arrow lists);
   * ``bpe-openai``, ``rs-bpe``, ``quicktok``: listed with why they cannot load a tokenizer.json.

   Any differing document of the chosen encoder, or another engine than fastokens, fails the run.
2. Speed, 32k BPE: the corpus in batches of 1000 documents (the pipeline's batch size), each encoder
   in turn, interleaved, each pass with a fresh encoder; process CPU (all threads: ``tokenizers`` encodes on
   a Rayon pool, fastokens on its own pool unless ``FASTOKENS_BPE_THREADS``, which the stage sets to its
   task's CPUs) and wall, per MB of UTF-8. Run it with ``FASTOKENS_BPE_THREADS=1 RAYON_NUM_THREADS=1`` for
   what one Ray task of one CPU spends.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

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
# Candidates whose Python packages cannot load a tokenizer.json BPE with its split regex (docs/tokenizers.md).
NOT_RUN = {
    "bpe-openai": "builds only OpenAI's named encodings (build_encoding_from_name); no custom ranks or tokenizer.json",
    "rs-bpe": "rs_bpe.openai has cl100k_base/o200k_base only; bpe.BytePairEncoding has no constructor from ranks",
    "quicktok": "BasicTokenizer trains its own byte-level BPE (no split regex); cannot load a tokenizer.json",
}
CHOSEN = "chosen: fastokens via encode_documents"
OLD = "old fast path: tiktoken via encode_documents"
TIKTOKEN = "tiktoken as it is (plan's ranks + split regex)"
BARE = "fastokens bare (encode_batch_flat)"
REFERENCE = "tokenizers via encode_documents"


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


Encoder = Callable[[list[str]], pa.LargeListArray]


def encoders(info: tokenize.TokenizerInfo) -> tuple[dict[str, Encoder], dict[str, str]]:
    """Each encoder as a batch -> token lists as the stage frames them (EOS after each document), and
    the encoders that cannot load this file, with why. Built afresh on each call (caches empty)."""
    import fastokens
    import tiktoken

    tokenize._FAST.clear()
    tokenize._FASTOKENS.clear()
    out: dict[str, Encoder] = {}
    skipped: dict[str, str] = {}
    out[REFERENCE] = lambda b: tokenize.encode_documents(b, dataclasses.replace(info, engine="tokenizers"))
    out[CHOSEN] = lambda b: tokenize.encode_documents(b, info)
    out[OLD] = lambda b: tokenize.encode_documents(b, dataclasses.replace(info, engine="tiktoken"))
    plan = tokenize._plan(info)
    if isinstance(plan, str):
        skipped[TIKTOKEN] = f"no plan for this file: {plan}"
    else:
        enc = tiktoken.Encoding("bench", pat_str=plan.pattern, mergeable_ranks=plan.ranks, special_tokens=plan.added)
        added = set(plan.added)

        def tiktoken_as_is(b: list[str]) -> pa.LargeListArray:
            ids = [enc.encode_to_numpy(t, allowed_special=added, disallowed_special=()) for t in b]
            return _framed(ids, info)

        out[TIKTOKEN] = tiktoken_as_is
    fk = fastokens.Tokenizer.from_file(info.path)

    def bare(b: list[str]) -> pa.LargeListArray:
        flat, offsets = fk.encode_batch_flat(b, add_special_tokens=False)
        ids = np.frombuffer(flat, np.uint32)
        off = np.frombuffer(offsets, np.uint64).astype(np.int64)
        return tokenize._framed(ids, off, info)  # framed only for the comparison; timed without it

    out[BARE] = bare
    return out, {**skipped, **NOT_RUN}


def _framed(ids: list[np.ndarray], info: tokenize.TokenizerInfo) -> pa.LargeListArray:
    lengths = np.fromiter((len(x) for x in ids), np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(ids).astype(np.uint32) if ids else np.empty(0, np.uint32)
    return tokenize._framed(flat, offsets, info)


def differing_docs(got: pa.LargeListArray, want: pa.LargeListArray) -> list[int]:
    """Indexes of the documents whose lists differ."""
    go, wo = got.offsets.to_numpy(), want.offsets.to_numpy()
    gv, wv = got.values.to_numpy(), want.values.to_numpy()
    lengths_differ = np.diff(go) != np.diff(wo)
    if lengths_differ.any():
        same = ~lengths_differ
        bad = set(np.flatnonzero(lengths_differ).tolist())
        for i in np.flatnonzero(same).tolist():
            if not np.array_equal(gv[go[i] : go[i + 1]], wv[wo[i] : wo[i + 1]]):
                bad.add(i)
        return sorted(bad)
    wrong = np.flatnonzero(gv != wv)
    return sorted(set((np.searchsorted(go, wrong, side="right") - 1).tolist()))


def equivalence(info: tokenize.TokenizerInfo, texts: list[str]) -> dict:
    """Per encoder: documents differing from tokenizers' (and the first), and its CPU on this one pass."""
    fns, skipped = encoders(info)
    result: dict = {"engine": info.engine, "engine_note": info.engine_note, "docs": len(texts), "encoders": {}}
    stats: dict[str, dict[str, Any]] = {
        name: {"differing": 0, "first_differing_doc": None, "cpu_s": 0.0} for name in fns if name != REFERENCE
    }
    for start, b in zip(range(0, len(texts), 1000), batches(texts)):
        want = fns[REFERENCE](b)
        for name, s in stats.items():
            c0 = time.process_time()
            got = fns[name](b)
            s["cpu_s"] += time.process_time() - c0
            bad = differing_docs(got, want)
            s["differing"] += len(bad)
            if bad and s["first_differing_doc"] is None:
                s["first_differing_doc"] = start + bad[0]
    for name, s in stats.items():
        result["encoders"][name] = {**s, "cpu_s": round(s["cpu_s"], 3)}
    result["not_run"] = skipped
    result["engine_used"] = tokenize.encoder_used(info)
    return result


def speed(h: Harness, info: tokenize.TokenizerInfo, bs: list[list[str]], mb: float) -> dict[str, list[dict]]:
    """Encode CPU and wall of every encoder over the whole corpus, fresh encoders per pass, interleaved."""

    def side(name: str) -> Callable[[], dict]:
        def run() -> dict:
            import fastokens

            fns, _ = encoders(info)  # fresh encoders: their caches empty
            fn: Callable[[list[str]], object]
            if name == BARE:  # the bare call without the framing the comparison added
                fk = fastokens.Tokenizer.from_file(info.path)
                fn = lambda b: fk.encode_batch_flat(b, add_special_tokens=False)  # noqa: E731
            else:
                fn = fns[name]
            c0, w0 = time.process_time(), time.perf_counter()
            for b in bs:
                fn(b)
            return {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}

        return run

    names = [REFERENCE, CHOSEN, OLD, TIKTOKEN, BARE]
    runs = h.interleave({n: side(n) for n in names})
    for label, rs in runs.items():
        h.figure(f"{label} encode CPU per MB, 32k BPE", [r["cpu"] / mb * 1e3 for r in rs], "ms/MB")
        h.figure(f"{label} encode wall per MB", [r["wall"] / mb * 1e3 for r in rs], "ms/MB", show=True)
    cpu = {k: [r["cpu"] for r in v] for k, v in runs.items()}
    h.ratio(
        "encode CPU tokenizers/chosen (fastokens, 32k BPE, identical ids)",
        pair_ratios(cpu[REFERENCE], cpu[CHOSEN]),
        target=">= 3",
    )
    h.ratio("encode CPU old fast path/chosen", pair_ratios(cpu[OLD], cpu[CHOSEN]), target=">= 3")
    h.ratio("encode CPU tiktoken as it is/chosen", pair_ratios(cpu[TIKTOKEN], cpu[CHOSEN]))
    h.ratio("encode CPU chosen/fastokens bare call", pair_ratios(cpu[CHOSEN], cpu[BARE]))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-variants", action="store_true", help="only the 32k BPE")
    ap.add_argument("--skip-speed", action="store_true", help="only the equivalence (its JSON for --equivalence-from)")
    ap.add_argument(
        "--equivalence-from",
        type=Path,
        nargs="+",
        help="take the equivalence from these --skip-speed runs' JSON (waits for them): the parts in several processes",
    )
    ap.add_argument("--only", help="comma-separated tokenizers to compare (bpe32k and the variants' names; default all)")
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("fast_encoder", args, libs=["tokenizers", "tiktoken", "fastokens"])
    texts = corpus()
    chars = sum(map(len, texts))
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    print(f"corpus: {len(texts):,} documents, {chars:,} characters, {mb:.1f} MB UTF-8")
    bpe32k = bench_tokenizer(32000)
    info = info_for(bpe32k)
    print(f"bpe32k ({bpe32k.name}): {info.describe()}")
    wanted = set(args.only.split(",")) if args.only else {"bpe32k", *VARIANTS}
    if args.skip_variants or args.equivalence_from:
        wanted &= set() if args.equivalence_from else {"bpe32k"}
    exact: dict[str, dict] = {"bpe32k": equivalence(info, texts)} if "bpe32k" in wanted else {}
    print(f"bpe32k: {exact.get('bpe32k')}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (vocab, pre, special, in_text) in {k: v for k, v in VARIANTS.items() if k in wanted}.items():
            t0 = time.perf_counter()
            path = train_bpe(Path(tmp) / f"{name}.json", texts[::7][:4000], vocab, pre, special)
            vinfo = info_for(path)
            exact[name] = equivalence(vinfo, with_special_tokens(texts) if in_text else texts)
            print(f"{name}: {exact[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    facts = {"tokenizer": "bpe32k", "tokenizer_sha256": info.fingerprint, "docs": len(texts), "chars": chars, "mb": round(mb, 3)}
    if args.skip_speed:
        h.finish(**facts, equivalence=exact)
        return _verdict(exact)
    runs = speed(h, info, batches(texts), mb)
    envs = []
    for part in args.equivalence_from or []:
        while True:
            try:
                data = json.loads(part.read_text())
                break
            except (OSError, ValueError):  # not written yet
                time.sleep(10)
        exact.update(data["extra"]["equivalence"])
        envs.append(data["env"])
    h.finish(
        **facts,
        equivalence=exact,
        equivalence_env=envs,
        not_run=NOT_RUN,
        threads={k: os.environ.get(k) for k in ("FASTOKENS_BPE_THREADS", "RAYON_NUM_THREADS")},
        runs=runs,
    )
    return _verdict(exact)


def _verdict(exact: dict[str, dict]) -> int:
    bad = {
        k: v
        for k, v in exact.items()
        if v["engine"] != "fastokens" or v["engine_used"] != "fastokens" or v["encoders"][CHOSEN]["differing"]
    }

    if bad:
        print(f"FAILED: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
