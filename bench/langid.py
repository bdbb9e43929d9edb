"""Documents per second through the langid stage vs raw fastText predict, same texts, one run.

    PYTHONPATH=. python bench/langid.py --docs 4000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from bench._corpus import sample  # noqa: E402
from datapipe.stages.base import StageContext  # noqa: E402
from datapipe.stages.langid import LangId, LangIdOptions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=4000, help="documents from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7, help="best of N timings for each side (the box is noisy)")
    args = ap.parse_args()
    texts = [d["text"] for d in sample(args.docs)]
    stage = LangId(LangIdOptions(keep=["zh", "en"]), StageContext(".", "."))
    stage.setup()
    model, limit = stage._model, stage.options.max_chars

    def raw() -> None:  # what a bare fastText loop needs: one line per text, same prefix
        model.predict([t[:limit].replace("\n", " ") for t in texts], k=1)

    def ours() -> None:
        for i in range(0, len(texts), args.batch):
            b = stage.compute(pa.table({"text": texts[i:i + args.batch]}))
            stage.decide(b)

    best = {}
    for name, fn in (("fasttext predict", raw), ("langid stage", ours)) * args.repeat:
        t0 = time.perf_counter()
        fn()
        best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
    for name, sec in best.items():
        print(f"{name:18s} {len(texts) / sec:9.0f} docs/s  ({sec:.2f} s for {len(texts)} docs)")
    print(f"ratio stage/raw: {best['fasttext predict'] / best['langid stage']:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
