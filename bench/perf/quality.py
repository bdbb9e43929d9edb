"""Documents per second of langid + quality per rule set, and datatrove's chain on the same documents.

    python -m bench.perf.quality --docs 2000 [--datatrove-python /tmp/dt/bin/python] [--repeats 5]

datatrove (with spacy) must live in its own venv: the comparison runs it in a subprocess on the
same sample (LanguageFilter -> GopherRepetition -> GopherQuality -> C4Quality -> FineWebQuality,
lid.176 from datapipe's cache, keeping zh and en as datapipe does). Both sides run on one core,
so docs/s is per core. The two sides alternate (--repeats pairs, datatrove in a fresh subprocess
each time, timing only its filter chain); the speed-up is taken per pair.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench._support.corpus import sample
from bench._support.harness import Harness, add_args, pair_ratios
from datapipe.assets.models import ensure_lid_model
from datapipe.stages.base import StageContext
from datapipe.stages.langid import LangId, LangIdOptions
from datapipe.stages.quality import Quality, QualityOptions

DATATROVE = r"""
import json, sys, time
from fasttext.FastText import _FastText
from datatrove.data import Document
from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                        GopherRepetitionFilter, LanguageFilter)
docs, model = json.load(open(sys.argv[1])), sys.argv[2]
lang = LanguageFilter(languages=["zh", "en"])  # the languages datapipe's langid keeps
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
        part = docs[i : i + batch]
        b = pa.table({"id": [str(j) for j in range(len(part))], "kind": ["web"] * len(part), "text": [d["text"] for d in part]})
        b = langid.compute(b)
        keep = np.array([r is None for r in langid.decide(b).reason.to_pylist()])
        b, files = b.filter(pa.array(keep)), [d["file"] for d, k in zip(part, keep) if k]
        for key, idx in quality.rows_by_rule_set(b).items():  # timed per rule set, same code path as compute
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
    ap.add_argument(
        "--datatrove-python",
        default="/tmp/dt/bin/python",
        help="python of a venv with datatrove[processing] and spacy; skipped when missing",
    )
    args = add_args(ap).parse_args()
    h = Harness("quality", args, libs=["fasttext-numpy2", "numba"])
    docs = sample(args.docs)
    inputs = collections.Counter(d["file"] for d in docs)
    have_dt = Path(args.datatrove_python).exists()
    tmp = Path("/tmp/datapipe-bench-quality.json")
    tmp.write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
    results: dict[str, dict] = {}

    def datatrove() -> float:
        proc = subprocess.run(
            [args.datatrove_python, "-c", DATATROVE, str(tmp), str(ensure_lid_model())], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"datatrove: failed\n{proc.stderr[-2000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results["datatrove"] = res
        return res["seconds"]

    def ours() -> float:
        total, per_set, kept = run_datapipe(docs, args.batch)
        results["datapipe"] = {"per_set": per_set, "kept": kept}
        return total

    sides = {"datatrove chain": datatrove} if have_dt else {}
    sides["datapipe langid+quality"] = ours
    runs = h.interleave(sides)
    print(f"{len(docs)} documents, one core each side")
    for name, secs in runs.items():
        h.figure(f"{name} docs/s", [len(docs) / s for s in secs], "docs/s")
    for key, rate in sorted(results["datapipe"]["per_set"].items()):
        print(f"  rule set {key:8s} {rate:8.0f} docs/s (quality stage alone, last run)")
    kept = results["datapipe"]["kept"]
    print("  datapipe kept per file: " + ", ".join(f"{f} {kept.get(f, 0)}/{n}" for f, n in sorted(inputs.items())))
    dt_kept: dict = {}
    if not have_dt:
        print(f"datatrove: skipped ({args.datatrove_python} not found)")
    else:
        dt_kept = collections.Counter(results["datatrove"]["kept"])
        print("  datatrove kept per file: " + ", ".join(f"{f} {dt_kept.get(f, 0)}/{n}" for f, n in sorted(inputs.items())))
        h.ratio(
            "speed-up datapipe/datatrove (docs/s)",
            pair_ratios(runs["datatrove chain"], runs["datapipe langid+quality"]),
            target=">= 5",
        )
    h.finish(
        docs=len(docs),
        inputs=dict(inputs),
        kept_datapipe=kept,
        kept_datatrove=dict(dt_kept),
        rule_set_docs_per_s=results["datapipe"]["per_set"],
    )


if __name__ == "__main__":
    main()
