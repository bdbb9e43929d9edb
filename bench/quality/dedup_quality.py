"""Precision/recall of near-duplicate detection on real text (edited copies) and UDHR variants.

    python -m bench.quality.dedup_quality [--n 3 5] [--threshold 0.5 0.6 0.7 0.8] [--json PATH]

Precision and recall are deterministic (fixed seeds), so there is nothing to repeat or interleave:
the harness only adds the machine/commit header and the JSON output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench._support.harness import Harness, add_args
from bench._support.paths import SHARED
from datapipe.dedup import evalset, near_duplicates

DATA = SHARED


def neardup_corpora(scale: int = 1) -> list[tuple[Path, str, int, int]]:
    c = DATA / "corpus"
    return [
        (c / "zh_wikipedia.jsonl", "zh", 150 * scale, 600),
        (c / "en_wikipedia.jsonl", "en", 150 * scale, 1500),
        (c / "zh_pingcap_docs.jsonl", "zh", 60 * scale, 1000),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, nargs="+", default=[5])
    ap.add_argument("--threshold", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8])
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--no-verify", action="store_true")
    args = add_args(ap, repeats=1).parse_args(argv)
    h = Harness("dedup_quality", args, libs=["numba"])
    rows = []
    texts, groups, _ = evalset.build(neardup_corpora())
    truth = evalset.group_pairs(groups)
    u_texts, _, u_truth, u_neutral = evalset.udhr(DATA / "web" / "html" / "udhr")
    _, _, _, strict_neutral = evalset.udhr(DATA / "web" / "html" / "udhr", adjudicated=False)
    print(
        f"edited-copy set: {len(texts)} docs, {len(truth)} true pairs; UDHR: {len(u_texts)} pages, {len(u_truth)} labelled pairs"
    )
    print(f"{'n':>2} {'thr':>4} | {'edit P':>6} {'edit R':>6} | {'udhr P':>6} {'(strict)':>8} {'udhr R':>6}")
    for n in args.n:
        for thr in args.threshold:
            kw = dict(threshold=thr, num_perm=args.num_perm, n=n, verify=not args.no_verify)
            p, r, _, _ = evalset.pair_scores(near_duplicates(texts, **kw).cluster, truth)
            uc = near_duplicates(u_texts, **kw).cluster
            up, ur, _, _ = evalset.pair_scores(uc, u_truth, u_neutral)
            sp, _, _, _ = evalset.pair_scores(uc, u_truth, strict_neutral)
            print(f"{n:>2} {thr:>4} | {p:6.3f} {r:6.3f} | {up:6.3f} {sp:8.3f} {ur:6.3f}")
            rows.append(
                {
                    "n": n,
                    "threshold": thr,
                    "edit_precision": p,
                    "edit_recall": r,
                    "udhr_precision": up,
                    "udhr_precision_strict": sp,
                    "udhr_recall": ur,
                }
            )
    h.finish(rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
