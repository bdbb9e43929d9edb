"""Raw text -> MinHash signature throughput: datapipe vs datasketch on the same real documents.

    PYTHONPATH=. python bench/minhash.py [--docs 2000] [--num-perm 128]

Three paths, each timed from raw text to signatures in this one run:
  A  usual datasketch: Python shingles, MinHash.update_batch with its default hash (SHA-1)
  B  datasketch given datapipe's shingles and H (zlib CRC-32) as hashfunc
  C  datapipe: batch shingling + hashing + signatures (numba kernels), one call per batch
Outputs are checked bit-identical between B and C before the ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from datasketch import MinHash

from datapipe.dedup.minhash import signatures
from datapipe.dedup.shingles import HAVE_NUMBA, shingle_hash, shingles

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "corpus"


def load(n_docs: int) -> list[str]:
    """Half Chinese (Wikipedia + TiDB docs, mixed zh/en), half English Wikipedia, real text."""
    out: list[str] = []
    for name, share in (("zh_wikipedia.jsonl", 0.35), ("zh_pingcap_docs.jsonl", 0.15), ("en_wikipedia.jsonl", 0.5)):
        with (DATA / name).open(encoding="utf-8") as f:
            docs = [json.loads(line)["text"] for line in f]
        out += docs[: int(n_docs * share)]
    return out


def run_datasketch(docs: list[str], num_perm: int, hashfunc=None) -> np.ndarray:
    kw = {} if hashfunc is None else {"hashfunc": hashfunc}
    rows = []
    for d in docs:
        m = MinHash(num_perm=num_perm, **kw)
        m.update_batch(shingles(d))
        rows.append(m.hashvalues)
    return np.array(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1000, help="datapipe batch size")
    args = ap.parse_args(argv)
    docs = load(args.docs)
    chars = sum(map(len, docs))
    signatures(docs[:10], num_perm=args.num_perm)  # JIT warm-up (cached on disk after the first run)

    t = time.perf_counter()
    run_datasketch(docs, args.num_perm)
    ta = time.perf_counter() - t
    t = time.perf_counter()
    ref = run_datasketch(docs, args.num_perm, shingle_hash)
    tb = time.perf_counter() - t
    t = time.perf_counter()
    ours = np.concatenate([signatures(docs[i:i + args.batch], num_perm=args.num_perm)
                           for i in range(0, len(docs), args.batch)])
    tc = time.perf_counter() - t
    if not np.array_equal(ref, ours):
        print("MISMATCH: datapipe signatures differ from datasketch's", file=sys.stderr)
        return 1

    print(f"{len(docs)} real docs ({chars / 1e6:.1f} M chars), num_perm={args.num_perm}, numba={HAVE_NUMBA}")
    print(f"{'path':<48} {'seconds':>8} {'docs/s':>9}")
    for name, sec in (("A datasketch, default hash (SHA-1)", ta), ("B datasketch, hashfunc=H (same shingles)", tb),
                      ("C datapipe batch (bit-identical to B)", tc)):
        print(f"{name:<48} {sec:8.2f} {len(docs) / sec:9.0f}")
    print(f"ratio C/A (vs usual datasketch path): {ta / tc:.1f}x")
    print(f"ratio C/B (vs datasketch with same shingles and H): {tb / tc:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
