"""Documents per second through the classify stage vs raw fastText predict, same texts, one process.

    python -m bench.perf.classify --docs 4000 [--repeats 5] [--json bench/results/classify.json]

Two models, trained here in a temporary folder on ../shared/data (seconds): one with the
``cjk-v1`` featuriser (as ``datapipe train-classifier`` writes them) and one with ``plain``
features (what a model downloaded from elsewhere gets). The raw side is the bare loop a user
would write: the same prefix and featurisation, then ``model.predict(texts, k=-1)`` (all labels'
probabilities, as the stage records). The stage side is ``Classify.compute`` on Arrow batches,
which also builds the score columns. Also printed: predict alone on pre-featurised texts, to
show what featurisation costs. The three alternate over ``--repeats`` rounds (``bench/_support/harness.py``);
the ratio stage/raw is taken per round and reported as median and range.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pyarrow as pa

from bench._support.corpus import CORPUS, sample
from bench._support.harness import Harness, add_args, pair_ratios
from datapipe.classify.features import featuriser
from datapipe.stages.base import StageContext
from datapipe.stages.classify import Classify, ClassifyOptions
from datapipe.train.classifier import TrainOptions, TrainParams, train_classifier


def train(folder: Path, feat: str) -> Path:
    options = TrainOptions(
        name=f"bench_{feat.replace('-', '_')}",
        out_dir=folder,
        featuriser=feat,
        max_per_class=500,
        params=TrainParams(dim=64, epoch=3),
    )
    result = train_classifier(
        [str(CORPUS / "zh_wikipedia.jsonl"), str(CORPUS / "en_wikipedia.jsonl")],
        [str(CORPUS / "zh_pingcap_docs.jsonl"), str(CORPUS / "zh_oiwiki.jsonl")],
        None,
        options,
        log=lambda m: None,
    )
    return result.model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=4000, help="documents from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    args = add_args(ap, repeats=5).parse_args()
    h = Harness("classify", args, libs=["fasttext-numpy2"])
    texts = [d["text"] for d in sample(args.docs)]
    with tempfile.TemporaryDirectory() as tmp:
        for feat in ("plain", "cjk-v1"):
            bench_model(h, train(Path(tmp), feat), feat, texts, args.batch)
    h.finish(docs=len(texts))


def bench_model(h: Harness, path: Path, feat: str, texts: list[str], batch: int) -> None:
    stage = Classify(ClassifyOptions(models={"q": {"path": str(path)}}), StageContext(str(path.parent), "."))
    stage.setup()
    clf = stage.scorers["q"]
    assert clf.featuriser == feat
    model, limit, fn = clf.model, stage.options.max_chars, featuriser(feat)
    pre = [fn(t[:limit]) for t in texts]
    kind = pa.array(["web"] * len(texts))

    def raw() -> None:  # the bare loop: same prefix and featurisation, then fastText's batched predict
        model.predict([fn(t[:limit]) for t in texts], k=-1)

    def raw_prefeaturised() -> None:
        model.predict(pre, k=-1)

    def ours() -> None:
        for i in range(0, len(texts), batch):
            stage.compute(pa.table({"text": texts[i : i + batch], "kind": kind[i : i + batch]}))

    runs = h.interleave(
        {f"{feat}: raw predict": raw, f"{feat}: classify stage": ours, f"{feat}: predict, pre-featurised": raw_prefeaturised},
        warmup=True,
    )
    n = len(texts)
    print(f"model with featuriser {feat}, {n} documents, batch {batch}:")
    for name, secs in runs.items():
        h.figure(f"{name} docs/s", [n / s for s in secs], "docs/s")
    h.ratio(
        f"{feat} model: stage/raw (docs/s)",
        pair_ratios(runs[f"{feat}: raw predict"], runs[f"{feat}: classify stage"]),
        target=">= 0.8",
    )
    stage_vs_pre = pair_ratios(runs[f"{feat}: predict, pre-featurised"], runs[f"{feat}: classify stage"])
    h.figure(f"{feat} model: stage/pre-featurised predict (docs/s)", stage_vs_pre)
    print()


if __name__ == "__main__":
    main()
