"""Raw text -> MinHash signature throughput: datapipe vs datasketch on the same real documents.

    python -m bench.perf.minhash [--docs 2000] [--num-perm 128] [--repeats 5] [--json PATH]

Three paths, each timed from raw text to signatures, alternating A, B, C for --repeats rounds:
  A  usual datasketch: Python shingles, MinHash.update_batch with its default hash (SHA-1)
  B  datasketch given datapipe's shingles and H (zlib CRC-32) as hashfunc
  C  datapipe: batch shingling + hashing + signatures (numba kernels), one call per batch
Outputs are checked bit-identical between B and C before the ratios are printed. Ratios are
taken per round; the median and min-max are printed.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from datasketch import MinHash

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import SHARED
from datapipe.dedup.minhash import signatures
from datapipe.dedup.shingles import HAVE_NUMBA, shingle_hash, shingles

DATA = SHARED / "corpus"


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
    args = add_args(ap).parse_args(argv)
    h = Harness("minhash", args, libs=["datasketch", "numba"])
    docs = load(args.docs)
    chars = sum(map(len, docs))
    signatures(docs[:10], num_perm=args.num_perm)  # JIT warm-up (cached on disk after the first run)
    out: dict[str, np.ndarray] = {}

    def path_a() -> None:
        run_datasketch(docs, args.num_perm)

    def path_b() -> None:
        out["ref"] = run_datasketch(docs, args.num_perm, shingle_hash)

    def path_c() -> None:
        out["ours"] = np.concatenate(
            [signatures(docs[i : i + args.batch], num_perm=args.num_perm) for i in range(0, len(docs), args.batch)]
        )

    names = (
        "A datasketch, default hash (SHA-1)",
        "B datasketch, hashfunc=H (same shingles)",
        "C datapipe batch (bit-identical to B)",
    )
    runs = h.interleave(dict(zip(names, (path_a, path_b, path_c))))
    if not np.array_equal(out["ref"], out["ours"]):
        print("MISMATCH: datapipe signatures differ from datasketch's", file=sys.stderr)
        return 1

    print(f"{len(docs)} real docs ({chars / 1e6:.1f} M chars), num_perm={args.num_perm}, numba={HAVE_NUMBA}")
    for name in names:
        h.figure(f"{name} docs/s", [len(docs) / s for s in runs[name]], "docs/s")
    ta, tb, tc = (runs[n] for n in names)
    h.ratio("C/A (vs usual datasketch path)", pair_ratios(ta, tc), target=">= 10")
    h.ratio("C/B (vs datasketch with same shingles and H)", pair_ratios(tb, tc), target=">= 3")
    h.finish(docs=len(docs), chars=chars, num_perm=args.num_perm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
