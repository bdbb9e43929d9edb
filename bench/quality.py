"""Documents per second of langid + quality per rule set, and datatrove's chain on the same documents.

    PYTHONPATH=. python bench/quality.py --docs 2000 [--datatrove-python /tmp/dtvenv/bin/python]

datatrove (with spacy) must live in its own venv: the comparison runs it in a subprocess on the
same sample (LanguageFilter -> GopherRepetition -> GopherQuality -> C4Quality -> FineWebQuality,
lid.176 from datapipe's cache). Both sides run on one core, so docs/s is per core.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench._corpus import sample  # noqa: E402
from datapipe.models import ensure_lid_model  # noqa: E402
from datapipe.stages.base import StageContext  # noqa: E402
from datapipe.stages.langid import LangId, LangIdOptions  # noqa: E402
from datapipe.stages.quality import Quality, QualityOptions  # noqa: E402

DATATROVE = r"""
import json, sys, time
from fasttext.FastText import _FastText
from datatrove.data import Document
from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                        GopherRepetitionFilter, LanguageFilter)
docs, model = json.load(open(sys.argv[1])), sys.argv[2]
lang = LanguageFilter()
lang.model._model = _FastText(model)  # no download: the same lid.176 datapipe uses
chain = [lang, GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()]
data = [Document(text=d["text"], id=str(i), metadata={"file": d["file"]}) for i, d in enumerate(docs)]
t0 = time.perf_counter()
stream = iter(data)
for step in chain:
    stream = step.run(stream, 0, 1)
kept = [d.metadata["file"] for d in stream]
print(json.dumps({"seconds": time.perf_counter() - t0, "kept": kept}))
"""


def run_datapipe(docs: list[dict], batch: int) -> tuple[float, dict[str, float], dict[str, int]]:
    langid = LangId(LangIdOptions(keep=["zh", "en"]), StageContext(".", "."))
    langid.setup()
    quality = Quality(QualityOptions(), StageContext(".", "."))
    per_set: dict[str, float] = collections.defaultdict(float)
    per_set_n: dict[str, int] = collections.defaultdict(int)
    kept: dict[str, int] = collections.Counter()
    t0 = time.perf_counter()
    for i in range(0, len(docs), batch):
        part = docs[i:i + batch]
        b = pa.table({"id": [str(j) for j in range(len(part))], "kind": ["web"] * len(part),
                      "text": [d["text"] for d in part]})
        b = langid.compute(b)
        keep = np.array([r is None for r in langid.decide(b).reason.to_pylist()])
        b, files = b.filter(pa.array(keep)), [d["file"] for d, k in zip(part, keep) if k]
        for key, idx in quality._groups(b).items():  # timed per rule set, same code path as compute
            t1 = time.perf_counter()
            sub = quality.compute(b.take(pa.array(idx)))
            reasons = quality.decide(sub).reason.to_pylist()
            per_set[key] += time.perf_counter() - t1
            per_set_n[key] += len(idx)
            kept.update(files[j] for j, r in zip(idx, reasons) if r is None)
    total = time.perf_counter() - t0
    return total, {k: per_set_n[k] / v for k, v in per_set.items()}, dict(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=2000, help="documents sampled from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--datatrove-python", default="/tmp/dtvenv/bin/python",
                    help="python of a venv with datatrove[processing] and spacy; skipped when missing")
    args = ap.parse_args()
    docs = sample(args.docs)
    inputs = collections.Counter(d["file"] for d in docs)
    total, per_set, kept = run_datapipe(docs, args.batch)
    ours = len(docs) / total
    print(f"datapipe langid+quality: {ours:.0f} docs/s on one core ({len(docs)} docs, {total:.1f} s)")
    for key, rate in sorted(per_set.items()):
        print(f"  rule set {key:8s} {rate:8.0f} docs/s (quality stage alone)")
    print("  kept per file: " + ", ".join(f"{f} {kept.get(f, 0)}/{n}" for f, n in sorted(inputs.items())))
    if not Path(args.datatrove_python).exists():
        print(f"datatrove: skipped ({args.datatrove_python} not found)")
        return
    tmp = Path("/tmp/datapipe-bench-quality.json")
    tmp.write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
    proc = subprocess.run([args.datatrove_python, "-c", DATATROVE, str(tmp), str(ensure_lid_model())],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"datatrove: failed\n{proc.stderr[-2000:]}")
        return
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    theirs = len(docs) / res["seconds"]
    dt_kept = collections.Counter(res["kept"])
    print(f"datatrove chain: {theirs:.0f} docs/s on one core ({res['seconds']:.1f} s)")
    print("  kept per file: " + ", ".join(f"{f} {dt_kept.get(f, 0)}/{n}" for f, n in sorted(inputs.items())))
    print(f"speed-up datapipe/datatrove: {ours / theirs:.1f}x (target >= 5)")


if __name__ == "__main__":
    main()
