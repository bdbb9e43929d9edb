"""Documents per second through the classify stage vs raw fastText predict, same texts, one process.

    PYTHONPATH=. python bench/classify.py --docs 4000

Two models, trained here in a temporary folder on ../shared/data (seconds): one with the
``cjk-v1`` featuriser (as ``datapipe train-classifier`` writes them) and one with ``plain``
features (what a model downloaded from elsewhere gets). The raw side is the bare loop a user
would write: the same prefix and featurisation, then ``model.predict(texts, k=-1)`` (all labels'
probabilities, as the stage records). The stage side is ``Classify.compute`` on Arrow batches,
which also builds the score columns. Also printed: predict alone on pre-featurised texts, to
show what featurisation costs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from bench._corpus import CORPUS, sample  # noqa: E402
from datapipe.classify.features import featuriser  # noqa: E402
from datapipe.classify.train import TrainOptions, TrainParams, train_classifier  # noqa: E402
from datapipe.stages.base import StageContext  # noqa: E402
from datapipe.stages.classify import Classify, ClassifyOptions  # noqa: E402


def train(folder: Path, feat: str) -> Path:
    options = TrainOptions(name=f"bench_{feat.replace('-', '_')}", out_dir=folder, featuriser=feat, max_per_class=500,
                           params=TrainParams(dim=64, epoch=3))
    result = train_classifier([str(CORPUS / "zh_wikipedia.jsonl"), str(CORPUS / "en_wikipedia.jsonl")],
                              [str(CORPUS / "zh_pingcap_docs.jsonl"), str(CORPUS / "zh_oiwiki.jsonl")], None, options,
                              log=lambda m: None)
    return result.model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=4000, help="documents from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5, help="best of N timings for each side (the box is noisy)")
    args = ap.parse_args()
    texts = [d["text"] for d in sample(args.docs)]
    with tempfile.TemporaryDirectory() as tmp:
        for feat in ("plain", "cjk-v1"):
            bench_model(train(Path(tmp), feat), feat, texts, args.batch, args.repeat)


def bench_model(path: Path, feat: str, texts: list[str], batch: int, repeat: int) -> None:
    stage = Classify(ClassifyOptions(models={"q": {"path": str(path)}}), StageContext(str(path.parent), "."))
    stage.setup()
    clf = stage._classifiers[0][1]
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
            stage.compute(pa.table({"text": texts[i:i + batch], "kind": kind[i:i + batch]}))

    best: dict[str, float] = {}
    contenders = (("raw predict", raw), ("classify stage", ours), ("predict, pre-featurised", raw_prefeaturised))
    for name, f in contenders * repeat:
        t0 = time.perf_counter()
        f()
        best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
    print(f"model with featuriser {feat}:")
    for name, sec in best.items():
        print(f"  {name:24s} {len(texts) / sec:9.0f} docs/s  ({sec:.2f} s for {len(texts)} docs)")
    print(f"  ratio stage/raw: {best['raw predict'] / best['classify stage']:.2f} (target >= 0.8); "
          f"stage/pre-featurised predict: {best['predict, pre-featurised'] / best['classify stage']:.2f}")

if __name__ == "__main__":
    main()
