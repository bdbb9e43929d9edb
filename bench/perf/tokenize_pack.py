"""Benchmark tokenize-and-pack against raw ``Tokenizer.encode_batch`` on the same documents.

    python -m bench.perf.tokenize_pack --docs 2000 --packing concat

In one process, alternating for ``--repeats`` rounds (median and range of the per-round ratios):
  baseline   ``tok.encode_batch(batch)`` per batch of ``--batch-size`` documents (what a
             hand-written loop does), and ``encode_batch_fast`` (no offsets) for reference;
  datapipe   the pipeline's own functions for the same batches: encode (EOS appended),
             split by id hash, write the per-shard token file, memory-map it back, pack into
             rows (concat or bestfit) and write the Arrow shards.
Throughput is the documents' own tokens per second (EOS not counted) for both, so the
ratio compares the same work. Ray scheduling is not included (one task does this loop).
Not a test: it prints a table and the ratio (target >= 0.8).
"""

from __future__ import annotations

import argparse
import glob
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT, SHARED
from datapipe.engine.tasks.sinks import TokenSink
from datapipe.pipeline.load import TokenizeConfig
from datapipe.tokens.encode import assign_split, encode_documents, load_tokenizer_info, with_engine
from datapipe.tokens.packing import ShardBuffer, make_packer, shard_meta_for
from datapipe.tokens.shard_format import ShardMeta
from datapipe.tokens.shard_writer import write_shard

DEFAULT_INPUTS = [str(SHARED / "corpus" / n) for n in ("zh_*.jsonl", "en_wikipedia.jsonl")]


def load_texts(patterns: list[str], limit: int) -> list[str]:
    texts: list[str] = []
    files = sorted({f for p in patterns for f in glob.glob(p)})
    per_file = -(-limit // max(len(files), 1))  # an even share per file: zh and en both present
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh):
                if n >= per_file:
                    break
                texts.append(json.loads(line)["text"])
    return texts[:limit]


def baseline(tok: Tokenizer, batches: list[list[str]], fast: bool) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    for b in batches:
        enc = tok.encode_batch_fast(b, add_special_tokens=False) if fast else tok.encode_batch(b)
        n += sum(len(e.ids) for e in enc)
    return time.perf_counter() - t0, n


def datapipe_path(cfg: TokenizeConfig, batches: list[list[str]], ids: list[list[str]], work: Path) -> tuple[float, int]:
    info = with_engine(load_tokenizer_info(Path(cfg.tokenizer), cfg))
    row_len = cfg.seq_len + cfg.labels
    dtype = np.dtype(info.dtype)
    t0 = time.perf_counter()
    sink = TokenSink(work / "tokens.arrow")
    n_docs_tokens = 0
    for b, i in zip(batches, ids):
        tokens = encode_documents(b, info)
        sink.write(pa.array(i, pa.string()), assign_split(i, cfg.val_fraction), tokens)
        n_docs_tokens += len(tokens.values) - len(b) * (1 + (info.bos_id is not None))
    sink.close()
    shards = 0
    for split in ("train", "val"):
        meta = ShardMeta(
            info.fingerprint,
            info.vocab_size,
            cfg.seq_len,
            row_len,
            info.eos_id,
            info.pad_id,
            info.bos_id,
            cfg.packing,
            "bench",
            split,
            info.dtype,
        )
        packer = make_packer(cfg.packing, row_len, info.pad_id, dtype, cfg.bestfit_window)
        buffer = ShardBuffer(cfg.rows_per_shard, row_len, dtype)
        with pa.memory_map(str(work / "tokens.arrow")) as mm:
            table = pa.ipc.open_file(mm).read_all()
            part = table.filter(pc.equal(table["split"], split))
            lists = part["tokens"].combine_chunks()
            offsets = lists.offsets.to_numpy()
            out = list(buffer.add(packer.add(lists.flatten().to_numpy(), offsets - offsets[0])))
            out += list(buffer.add(packer.finish())) + list(buffer.finish())
        for rows in out:
            write_shard(
                work / f"{split}-{shards:05d}.arrow",
                rows.tokens,
                rows.doc_start_splits,
                rows.doc_start_values,
                rows.n_tokens,
                shard_meta_for(meta, rows),
            )
            shards += 1
    return time.perf_counter() - t0, n_docs_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", nargs="+", default=DEFAULT_INPUTS, help="JSONL files (globs) with a text field")
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--tokenizer", default=str(ROOT / "tokenizer" / "demo.json"))
    ap.add_argument("--batch-size", type=int, default=1000, help="documents per batch (the pipeline's batch_size)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--packing", choices=["concat", "bestfit"], default="concat")
    args = add_args(ap).parse_args()
    h = Harness("tokenize", args, libs=["tokenizers"])

    texts = load_texts(args.inputs, args.docs)
    batches = [texts[i : i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    ids = [[f"bench#{i + k}" for k in range(len(b))] for i, b in zip(range(0, len(texts), args.batch_size), batches)]
    cfg = TokenizeConfig(
        tokenizer=args.tokenizer, seq_len=args.seq_len, val_fraction=0.01, packing=args.packing, rows_per_shard=8192
    )
    tok = Tokenizer.from_file(args.tokenizer)
    tok.encode_batch(batches[0][:10])  # warm up the thread pool outside the timings
    counts: dict[str, int] = {}

    def side(name: str):  # noqa: ANN202 - a closure for the harness
        def run() -> float:
            with tempfile.TemporaryDirectory() as tmp:
                if name == "datapipe":
                    sec, n = datapipe_path(cfg, batches, ids, Path(tmp))
                else:
                    sec, n = baseline(tok, batches, fast=name == "encode_batch_fast")
            counts[name] = n
            return sec

        return run

    runs = h.interleave({name: side(name) for name in ("encode_batch", "encode_batch_fast", "datapipe")})
    n_chars = sum(map(len, texts))
    print(
        f"{len(texts):,} documents, {n_chars:,} characters, {counts['encode_batch']:,} tokens, tokenizer "
        f"{Path(args.tokenizer).name}, packing {args.packing}, seq_len {args.seq_len}"
    )
    assert counts["datapipe"] == counts["encode_batch"], "the two paths must tokenize the same documents"
    for name, secs in runs.items():
        h.figure(f"{name} tokens/s", [counts[name] / s for s in secs], "tokens/s")
    h.ratio("datapipe / encode_batch (tokens/s)", pair_ratios(runs["encode_batch"], runs["datapipe"]), target=">= 0.8")
    h.ratio("datapipe / encode_batch_fast (tokens/s)", pair_ratios(runs["encode_batch_fast"], runs["datapipe"]))
    h.finish(docs=len(texts), chars=n_chars, tokens=counts["encode_batch"], packing=args.packing)


if __name__ == "__main__":
    main()
