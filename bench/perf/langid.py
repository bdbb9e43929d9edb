"""Documents per second through the langid stage vs raw fastText predict, same texts, one run.

    python -m bench.perf.langid --docs 4000 [--repeats 7] [--json bench/results/langid.json]

Raw predict and the stage alternate (--repeats pairs); the ratio is taken per pair.
"""

from __future__ import annotations

import argparse

import pyarrow as pa

from bench._support.corpus import sample
from bench._support.harness import Harness, add_args, pair_ratios
from datapipe.stages.base import StageContext
from datapipe.stages.langid import LangId, LangIdOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=4000, help="documents from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    args = add_args(ap, repeats=7).parse_args()
    h = Harness("langid", args, libs=["fasttext-numpy2"])
    texts = [d["text"] for d in sample(args.docs)]
    stage = LangId(LangIdOptions(keep=["zh", "en"]), StageContext(".", "."))
    stage.setup()
    model, limit = stage.fasttext_model, stage.options.max_chars

    def raw() -> None:  # what a bare fastText loop needs: one line per text, same prefix
        model.predict([t[:limit].replace("\n", " ") for t in texts], k=1)

    def ours() -> None:
        for i in range(0, len(texts), args.batch):
            b = stage.compute(pa.table({"text": texts[i : i + args.batch]}))
            stage.decide(b)

    runs = h.interleave({"fasttext predict": raw, "langid stage": ours}, warmup=True)
    n = len(texts)
    print(f"{n} documents, batch {args.batch}")
    for name, secs in runs.items():
        h.figure(f"{name} docs/s", [n / s for s in secs], "docs/s")
    h.ratio("stage/raw (docs/s)", pair_ratios(runs["fasttext predict"], runs["langid stage"]), target=">= 0.8")
    h.finish(docs=n)


if __name__ == "__main__":
    main()
