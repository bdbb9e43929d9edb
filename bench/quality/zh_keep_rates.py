"""Keep rate of langid + quality per Chinese corpus, and drop rate on junk, with top drop reasons.

    python -m bench.quality.zh_keep_rates [--limit N] [--json bench/results/zh_keep_rates.json]

Corpora (../shared/data/corpus): zh Wikipedia (reference prose), TiDB docs and OI-wiki
(technical Markdown with code, math and tables). Junk: the demo's planted junk pages
(pipelines/demo/data, URLs under /junk/ and /404) and tests/fixtures/zh_junk.jsonl (spam-like pages
written for this project: ad stacks, keyword stuffing, navigation, link farms, tables, code dumps).
Documents are judged as source kind ``web``, as a crawl would bring them. A good rule set keeps
the corpora and drops the junk; the printed rates are the before/after numbers of issue 16.
The rates are counts on fixed sets, so one run gives them exactly (``--repeats`` is accepted and
ignored); the header and ``--json`` come from ``bench/_support/harness.py``.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import pyarrow as pa

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT, SHARED
from datapipe.stages.base import StageContext
from datapipe.stages.langid import LangId, LangIdOptions
from datapipe.stages.quality import Quality, QualityOptions

CORPUS = SHARED / "corpus"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def sets(limit: int) -> dict[str, tuple[list[str], bool]]:
    """name -> (texts, should be kept)."""
    out = {
        name: ([d["text"] for d in read_jsonl(CORPUS / f"{name}.jsonl")][: limit or None], True)
        for name in ("zh_wikipedia", "zh_pingcap_docs", "zh_oiwiki")
    }
    demo = [
        d
        for p in sorted((ROOT / "pipelines" / "demo" / "data").glob("web_zh-*.jsonl"))
        for ln in p.read_text(encoding="utf-8").splitlines()
        if ln.strip()
        for d in [_try_json(ln)]
        if d and "text" in d
    ]
    out["demo_zh_articles"] = ([d["text"] for d in demo if "/articles/" in d["url"]], True)
    out["demo_zh_junk"] = ([d["text"] for d in demo if "/junk/" in d["url"] or d["url"].endswith("/404")], False)
    out["zh_junk_fixture"] = ([d["text"] for d in read_jsonl(ROOT / "tests" / "fixtures" / "zh_junk.jsonl")], False)
    return out


def _try_json(line: str) -> dict | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def judge(texts: list[str], langid: LangId, quality: Quality) -> list[str | None]:
    """The drop reason per document (``langid:<reason>`` or the quality rule), None when kept."""
    n = len(texts)
    batch = pa.table(
        {"id": [str(i) for i in range(n)], "kind": ["web"] * n, "text": texts, "url": pa.array([None] * n, pa.string())}
    )
    batch = langid.compute(batch)
    reasons = [f"langid:{r}" if r else None for r in langid.decide(batch).reason.to_pylist()]
    keep = [i for i, r in enumerate(reasons) if r is None]
    if keep:
        sub = quality.compute(batch.take(pa.array(keep)))
        for i, r in zip(keep, quality.decide(sub).reason.to_pylist()):
            reasons[i] = r
    return reasons


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=0, help="documents per corpus (0: all)")
    ap.add_argument("--top", type=int, default=4, help="drop reasons to show per set")
    args = add_args(ap, repeats=1).parse_args()
    h = Harness("zh_keep_rates", args, libs=["fasttext-numpy2"])
    langid = LangId(LangIdOptions(keep=["zh", "en"]), StageContext(str(ROOT), str(ROOT)))
    langid.setup()
    quality = Quality(QualityOptions(), StageContext(str(ROOT), str(ROOT)))
    print(f"{'set':<18} {'docs':>5} {'kept':>6}  {'want':<5} top drop reasons")
    for name, (texts, good) in sets(args.limit).items():
        reasons = [r for b in range(0, len(texts), 256) for r in judge(texts[b : b + 256], langid, quality)]
        kept = sum(r is None for r in reasons) / max(len(reasons), 1)
        top = collections.Counter(r for r in reasons if r).most_common(args.top)
        print(
            f"{name:<18} {len(texts):>5} {kept:>6.1%}  {'keep' if good else 'drop':<5} " + ", ".join(f"{r} {c}" for r, c in top)
        )
        h.figure(
            f"{name} kept, % of {len(texts)} docs",
            100 * kept,
            "%",
            show=False,
            target="want kept" if good else "want dropped (0%)",
        )
        h.extra.setdefault("top_drop_reasons", {})[name] = dict(top)
    print()
    h.finish(limit=args.limit)


if __name__ == "__main__":
    main()
