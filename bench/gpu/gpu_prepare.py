"""Prepare, on a CPU machine, the inputs ``bench/gpu/gpu_checks.py`` needs on a GPU machine that cannot
see ``../shared/data``: a compact copy of real documents and a packed candidate for ``datapipe ablate``.

    python -m bench.gpu.gpu_prepare [--out .gpudata] [--en-docs 12000] [--train-tokens 6000000]

Writes (``--out``, an ignored folder carried to the GPU machine):

- ``docs.parquet`` (zstd): id, source, lang, text of the first ``--en-docs`` English Wikipedia articles
  and every zh_wikipedia and zh_pingcap_docs document of ``../shared/data/corpus`` (CC BY-SA: the
  ``source`` ids are kept, and the corpus README is copied beside it);
- ``tokenizer.json``: a 32k byte-level BPE (``<|endoftext|>`` its EOS, ``<|pad|>`` its pad) trained
  here on those documents with ``tokenizers``;
- ``ablate/data/``: the documents not held out (``datapipe.ablate.candidates.heldout``, 2%), encoded
  (``encode_documents``) and packed by ``datapipe.ablate.candidates.pack_candidate`` at the ``small`` size's
  seq_len, as ``datapipe ablate`` packs a candidate, cut to ``--train-tokens`` tokens (uint16 ids;
  the trainer loops over epochs, so a subset measures the same throughput);
- ``ablate/eval.npz``: the held-out documents packed per lang/source as ``build_heldout`` does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._support.corpus import CORPUS

FILES = (("en_wikipedia.jsonl", "en", "wiki"), ("zh_wikipedia.jsonl", "zh", "wiki"), ("zh_pingcap_docs.jsonl", "zh", "docs"))


def read_docs(en_docs: int) -> pa.Table:
    rows: dict[str, list[str]] = {"id": [], "source": [], "lang": [], "text": []}
    for name, lang, source in FILES:
        with open(CORPUS / name, encoding="utf-8") as f:
            for n, line in enumerate(f):
                if name.startswith("en") and n >= en_docs:
                    break
                doc = json.loads(line)
                if not doc["text"].strip():
                    continue
                rows["id"].append(doc.get("source") or f"{name}#{n}")
                rows["source"].append(source)
                rows["lang"].append(lang)
                rows["text"].append(doc["text"])
    return pa.table(rows)


def train_bpe(texts: list[str], path: Path, vocab: int = 32000) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(".gpudata"))
    ap.add_argument("--en-docs", type=int, default=12000)
    ap.add_argument("--train-tokens", type=int, default=6_000_000)
    ap.add_argument("--bpe-chars", type=int, default=15_000_000, help="characters the BPE is trained on")
    args = ap.parse_args()

    from datapipe.ablate.candidates import heldout, pack_candidate
    from datapipe.ablate.sizes import SIZES
    from datapipe.config.sections import TokenizeConfig
    from datapipe.tokens.encode import encode_documents, load_tokenizer_info, with_engine
    from datapipe.tokens.packing import ConcatPacker

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    docs = read_docs(args.en_docs)
    pq.write_table(docs, out / "docs.parquet", compression="zstd", compression_level=9)
    shutil.copy(CORPUS.parent / "README.md", out / "CORPUS_README.md")
    texts = docs["text"].to_pylist()
    print(f"docs: {docs.num_rows:,} ({time.perf_counter() - t0:.0f} s)", flush=True)

    tok_path = out / "tokenizer.json"
    if not tok_path.is_file():
        budget, picked = args.bpe_chars, []
        for t in texts[:: max(1, len(texts) // 4000)] + texts:  # a spread first, then the rest up to the budget
            if budget <= 0:
                break
            picked.append(t)
            budget -= len(t)
        train_bpe(picked, tok_path)
    print(f"tokenizer: {tok_path} ({time.perf_counter() - t0:.0f} s)", flush=True)

    seq_len = SIZES["small"].seq_len
    info = with_engine(load_tokenizer_info(tok_path, TokenizeConfig(tokenizer=str(tok_path))))
    held = heldout(docs["id"].to_pylist(), 0.02)
    langs, sources = docs["lang"].to_pylist(), docs["source"].to_pylist()
    by_source: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
    for source in sorted(set(sources)):
        picked = [t for t, h, s in zip(texts, held, sources) if not h and s == source]
        enc = encode_documents(picked, info)
        flat, offsets = enc.values.to_numpy(), enc.offsets.to_numpy()
        by_source[source] = (flat, offsets, len(picked))
    total = sum(len(f) for f, _, _ in by_source.values())
    if total > args.train_tokens:  # cut every source by the same share, at a document boundary
        share = args.train_tokens / total
        for source, (flat, offsets, _) in list(by_source.items()):
            n = int(np.searchsorted(offsets, share * len(flat), side="right")) - 1
            by_source[source] = (flat[: offsets[n]], offsets[: n + 1], n)
    data = out / "ablate" / "data"
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    pack_candidate(data, by_source, info, seq_len)
    print(
        f"packed: {sum(len(f) for f, _, _ in by_source.values()):,} tokens of {total:,} "
        f"(vocab {info.vocab_size}, {info.dtype}) ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )

    groups: dict[str, list[str]] = {}
    for h, lang, source, text in zip(held, langs, sources, texts):
        if h:
            groups.setdefault(f"{lang}/{source}", []).append(text)
    arrays: dict[str, np.ndarray] = {}
    for g, group in sorted(groups.items()):
        enc = encode_documents(group, info)
        packer = ConcatPacker(seq_len + 1, info.pad_id, np.dtype(info.dtype))
        parts = [p for p in (packer.add(enc.values.to_numpy(), enc.offsets.to_numpy()), packer.finish()) if len(p.n_tokens)]
        arrays[f"tokens:{g}"] = np.concatenate([p.tokens for p in parts])[:24]  # Settings.eval_rows
        arrays[f"n_tokens:{g}"] = np.concatenate([p.n_tokens for p in parts])[:24]
    np.savez(out / "ablate" / "eval.npz", pad_id=np.int64(info.pad_id), **arrays)  # type: ignore[arg-type]
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"done: {out} {size / 2**20:.1f} MiB ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
