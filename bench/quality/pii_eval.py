"""PII precision/recall per type on the hand-labelled real sample (tests/fixtures/pii_labelled.jsonl).

    python -m bench.quality.pii_eval [--errors] [--json bench/results/pii_eval.json]

Run it as ``PYTHONPATH=OTHER:. python -P -m bench.quality.pii_eval`` to measure another checkout's
stage on the same sample (the before/after numbers of issue 16 item 8). The figures are counts on a fixed
sample, so one run gives them exactly (``--repeats`` is accepted and ignored); the header and
``--json`` come from ``bench/_support/harness.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT
from datapipe.stages.base import StageContext
from datapipe.stages.pii import Pii, PiiOptions

# The evaluator is this checkout's tests/support/pii_sample.py, loaded by path: PYTHONPATH picks which
# datapipe is measured and may point at a checkout without it.
_spec = importlib.util.spec_from_file_location("pii_sample", ROOT / "tests" / "support" / "pii_sample.py")
sample = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sample)  # type: ignore[union-attr]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--errors", action="store_true", help="list every misdetected candidate")
    args = add_args(ap, repeats=1).parse_args()
    import datapipe

    h = Harness("pii_eval", args, note=f"datapipe from {Path(datapipe.__file__).parent}")
    stage = Pii(PiiOptions(), StageContext(".", "."))
    rows = sample.load()
    labels = {t: sum(r["label"] == t for r in rows) for t in ("email", "phone", "id_card", "ip", "none")}
    print(f"{len(rows)} candidates, labels {labels}")
    scores = sample.scores(stage.redact, rows)
    for t, s in scores.items():
        print(
            f"{t:8} precision {s['precision']:.3f} ({s['tp']}/{s['tp'] + s['fp']})  "
            f"recall {s['recall']:.3f} ({s['tp']}/{s['tp'] + s['fn']})"
        )
    for t, s in scores.items():
        h.figure(f"{t} precision ({s['tp']}/{s['tp'] + s['fp']})", s["precision"], show=False)
        h.figure(f"{t} recall ({s['tp']}/{s['tp'] + s['fn']})", s["recall"], show=False)
    if args.errors:
        for label, got, match, source in sample.errors(stage.redact, rows):
            print(f"  label {label:7} got {got or 'none':7} {match!r}  {source}")
    h.finish(candidates=len(rows), labels=labels, scores=scores)


if __name__ == "__main__":
    main()
