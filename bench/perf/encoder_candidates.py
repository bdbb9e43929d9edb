"""Exact-encoder candidates side by side on the whole shared corpus: ids per document, CPU per MB.

    python -m bench.perf.encoder_candidates [--variants] [--repeats 3] [--json bench/results/encoder_candidates.json]

For the benches' 32k BPE (bench/_support/bench_tokenizer.py) and, with ``--variants``, the three
variants ``bench.perf.fast_encoder`` trains (8k prefix-space, 16k Llama-3 split with special tokens
in the text, 64k), every document of the corpus is encoded by

* ``tokenizers`` (the reference: ``encode_documents`` forced to it, as the pipeline's fallback);
* the current fast path (``encode_documents`` with the engine the file gets: tiktoken over the
  planned split, ``datapipe/tokens/fast_bpe.py``);
* ``fastokens`` (``Tokenizer.from_file`` on the same tokenizer.json, ``encode_batch_flat``);

and the ids compared per document with the reference. Encode CPU (process time, all threads) and
wall per MB of UTF-8 text, interleaved per repeat, for the 32k BPE.

``bpe-openai``, ``rs-bpe`` and ``quicktok`` are listed with why they are not run: their Python
packages build encoders only for OpenAI's fixed vocabularies (``bpe_openai.build_encoding_from_name``;
``rs_bpe.openai.cl100k_base/o200k_base``, ``rs_bpe.bpe.BytePairEncoding`` has no constructor
from ranks) or train their own byte-level vocabulary without a split regex (``quicktok.BasicTokenizer``),
so none of them can load a ``tokenizer.json`` BPE like the benches' tokenizers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._support.bench_tokenizer import bench_tokenizer
from bench._support.harness import Harness, add_args, pair_ratios
from bench.perf.fast_encoder import NOT_RUN, VARIANTS, batches, corpus, info_for
from datapipe.tokens import encode as tokenize
from tests.support.bpe_variants import train_bpe, with_special_tokens


def fastokens_ids(tok, texts: list[str]) -> list[np.ndarray]:
    flat, offsets = tok.encode_batch_flat(texts, add_special_tokens=False)
    ids, off = np.frombuffer(flat, np.uint32), np.frombuffer(offsets, np.uint64)
    return [ids[off[i] : off[i + 1]] for i in range(len(texts))]


def compare(path: Path, texts: list[str]) -> dict:
    """Documents whose ids differ from tokenizers', for the fast path and for fastokens."""
    import fastokens

    info = dataclasses.replace(info_for(path), engine="tiktoken")  # the fast path (fastokens is what the file gets now)
    slow = dataclasses.replace(info, engine="tokenizers")
    tokenize._FAST.clear()
    fk = fastokens.Tokenizer.from_file(str(path))
    fast_bad, fk_bad, first_fk = 0, 0, None
    for start, b in zip(range(0, len(texts), 1000), batches(texts)):
        ref = tokenize.encode_documents(b, slow)
        fast = tokenize.encode_documents(b, info)
        mine = fastokens_ids(fk, b)
        for i in range(len(b)):
            # encode_documents adds the document's end (and start) token around the text's ids
            r = ref[i].values.to_numpy(zero_copy_only=False).astype(np.int64)
            ours = np.concatenate([[] if info.bos_id is None else [info.bos_id], mine[i], [info.eos_id]]).astype(np.int64)
            fast_bad += not fast[i].equals(ref[i])
            if not np.array_equal(ours, r):
                fk_bad += 1
                first_fk = first_fk if first_fk is not None else start + i
    return {
        "engine": info.engine,
        "docs": len(texts),
        "fast_path_differing": fast_bad,
        "fastokens_differing": fk_bad,
        "fastokens_first_differing_doc": first_fk,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", action="store_true", help="also the 8k / 16k Llama-3 / 64k variants (trains them)")
    ap.add_argument("--speed-only", action="store_true", help="skip the per-document comparison")
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("encoder_candidates", args, libs=["tokenizers", "tiktoken", "fastokens"])
    texts = corpus()
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    print(f"corpus: {len(texts):,} documents, {mb:.1f} MB UTF-8; not run: {NOT_RUN}")
    bpe32k = bench_tokenizer(32000)
    exact = {} if args.speed_only else {"bpe32k": compare(bpe32k, texts)}
    print(f"bpe32k: {exact.get('bpe32k', 'not compared (--speed-only)')}")
    if args.variants and not args.speed_only:
        with tempfile.TemporaryDirectory() as tmp:
            for name, (vocab, pre, special, in_text) in VARIANTS.items():
                path = train_bpe(Path(tmp) / f"{name}.json", texts[::7][:4000], vocab, pre, special)
                exact[name] = compare(path, with_special_tokens(texts) if in_text else texts)
                print(f"{name}: {exact[name]}")

    import fastokens

    info = dataclasses.replace(info_for(bpe32k), engine="tiktoken")
    slow = dataclasses.replace(info, engine="tokenizers")
    fk = [None]
    bs = batches(texts)

    def timed(fn):
        def run() -> dict:
            tokenize._FAST.clear()  # each pass starts cold: a fresh fast-path encoder
            fk[0] = fastokens.Tokenizer.from_file(str(bpe32k))  # and a fresh fastokens (its caches empty)
            c0, w0 = time.process_time(), time.perf_counter()
            for b in bs:
                fn(b)
            return {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}

        return run

    runs = h.interleave(
        {
            "tokenizers": timed(lambda b: tokenize.encode_documents(b, slow)),
            "fast path (tiktoken)": timed(lambda b: tokenize.encode_documents(b, info)),
            "fastokens": timed(lambda b: fastokens_ids(fk[0], b)),
        }
    )
    for label, rs in runs.items():
        h.figure(f"{label} encode CPU per MB, 32k BPE", [r["cpu"] / mb * 1e3 for r in rs], "ms/MB")
        h.figure(f"{label} encode wall per MB", [r["wall"] / mb * 1e3 for r in rs], "ms/MB", show=True)
    cpu = {k: [r["cpu"] for r in v] for k, v in runs.items()}
    h.ratio("encode CPU fast path / fastokens (32k BPE)", pair_ratios(cpu["fast path (tiktoken)"], cpu["fastokens"]))
    h.ratio("encode CPU tokenizers / fastokens (32k BPE)", pair_ratios(cpu["tokenizers"], cpu["fastokens"]))
    h.ratio("encode CPU tokenizers / fast path (32k BPE)", pair_ratios(cpu["tokenizers"], cpu["fast path (tiktoken)"]))
    h.finish(mb=mb, docs=len(texts), exact=exact, not_run=NOT_RUN, runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
