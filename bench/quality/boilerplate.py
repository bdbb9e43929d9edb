"""Boilerplate removal: planted site templates removed, article text kept, and throughput.

The planted set: real zh and en Wikipedia articles from ../shared/data/corpus, half of them wrapped
in one of six site templates (navigation, cookie banner, share line, footer; tests/support/boilerplate_corpus.py).
The pipeline runs through the engine's task functions in process (no Ray): map, shuffle partitions,
reduce, and the map segment that removes the lines. Throughput is compared with the same pipeline
without stages (read + write only), as a ratio: the two pipelines alternate over ``--repeats`` pairs
(``bench/_support/harness.py``: machine, date, median and range, ``--json``).

With --web it also runs over the real pages in ../shared/data/web (Common Crawl WARC/WET, warcio
samples, the UDHR pages) and prints the most removed lines, to judge by eye whether they are boilerplate.
With --markup it runs over the shared TiDB docs and OI-wiki pages (Markdown with code fences, LaTeX
math), each corpus a run of its own, and prints the lines removed and the documents whose fence or
environment balance changed (none may).

    python -m bench.quality.boilerplate [--n 1000] [--min-docs 10] [--web] [--markup] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import SHARED
from datapipe.engine.phases import plan_phases, run_here
from datapipe.engine.plan import make_spec
from datapipe.pipeline.load import load_pipeline
from tests.support import boilerplate_corpus

DATA = SHARED


def run_tasks(folder: Path, sources: list[dict[str, Any]], stages: list[dict[str, Any]]) -> tuple[dict, dict, float]:
    """Every task of the pipeline in process, in plan order. Returns (kept by id, rejected by id, seconds)."""
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "bench", "sources": sources, "stages": stages}, allow_unicode=True))
    spec = make_spec(load_pipeline(path), folder / "out", folder / "cache")
    started = time.perf_counter()
    run_here(spec, plan_phases(spec))  # every phase's tasks, in order, as the engine plans them
    seconds = time.perf_counter() - started
    out = folder / "out"
    kept = {r["id"]: r for f in sorted((out / "docs").glob("**/*.parquet")) for r in pq.read_table(f).to_pylist()}
    rejected = {r["id"]: r for f in sorted((out / "rejected").glob("**/*.parquet")) for r in pq.read_table(f).to_pylist()}
    return kept, rejected, seconds


def planted(h: Harness, n: int, min_docs: int, files: int = 4) -> None:
    docs = boilerplate_corpus.build(DATA / "corpus", n_per_lang=n, share=0.5, seed=0)
    results: dict[str, tuple[dict, dict, float]] = {}

    def pipeline(label: str, stages: list[dict[str, Any]]) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "data").mkdir()
            per = len(docs) // files + 1
            for f in range(files):
                chunk = docs[f * per : (f + 1) * per]
                (root / "data" / f"p{f}.jsonl").write_text(
                    "".join(json.dumps({"text": d.text}, ensure_ascii=False) + "\n" for d in chunk)
                )
            results[label] = run_tasks(root, [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}], stages)
        return results[label][2]

    stages = [{"boilerplate": {"min_docs": min_docs, "partitions": 4}}]
    runs = h.interleave(
        {"read+write only": lambda: pipeline("baseline", []), "boilerplate": lambda: pipeline("boilerplate", stages)}
    )
    per = len(docs) // files + 1
    ids = [f"web/data/p{f}.jsonl#L{i + 1}" for f in range(files) for i in range(len(docs[f * per : (f + 1) * per]))]
    kept, rejected, _ = results["boilerplate"]  # the outputs are the same every repeat: the last one is scored
    assert len(kept) + len(rejected) == len(docs)
    outputs = [kept[i]["text"] if i in kept else None for i in ids]
    print(
        f"planted set: {len(docs)} documents ({n} zh + {n} en articles), "
        f"{sum(d.site is not None for d in docs)} with a site template, min_docs={min_docs}"
    )
    scores = {}
    for lang in ("zh", "en", "all"):
        pairs = [(d, o) for d, o in zip(docs, outputs) if lang == "all" or d.lang == lang]
        s = scores[lang] = boilerplate_corpus.score([d for d, _ in pairs], [o for _, o in pairs])
        print(
            f"  {lang:>3}: template lines removed {s['template_removed']:.2%} of {s['template_lines']:,}; "
            f"article characters kept {s['article_kept']:.3%} of {s['article_chars']:,}"
        )
    print(f"  dropped as boilerplate_only: {len(rejected)}")
    for name, secs in runs.items():
        h.figure(f"{name} docs/s (in process, one core)", [len(docs) / s for s in secs], "docs/s")
    h.ratio("template lines removed, % (zh+en)", [100 * scores["all"]["template_removed"]], target=">= 95%")
    h.ratio("article characters kept, % (zh+en)", [100 * scores["all"]["article_kept"]], target=">= 99%")
    h.ratio("docs/s with boilerplate / read+write only", pair_ratios(runs["read+write only"], runs["boilerplate"]))
    h.extra.update(docs=len(docs), rejected=len(rejected), scores={k: {m: v for m, v in s.items()} for k, s in scores.items()})


def web(min_docs: int) -> None:
    w = DATA / "web"
    sources = [
        {
            "name": "warc",
            "kind": "web",
            "paths": [str(p) for p in sorted((w / "warc").glob("*.warc.gz"))]
            + [str(w / "warc" / "whirlwind_whirlwind.warc.wet.gz")],
        },
        {"name": "udhr", "kind": "web", "format": "html", "paths": [str(w / "html" / "udhr")]},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        kept, rejected, seconds = run_tasks(Path(tmp), sources, [{"boilerplate": {"min_docs": min_docs, "partitions": 4}}])
    rows = list(kept.values()) + [r for r in rejected.values() if r["stage"] == "boilerplate"]
    chars_in = sum(r["n_chars"] + r["chars_removed"] if r["id"] in kept else r["n_chars"] for r in rows)
    removed = sum(r["chars_removed"] for r in rows)
    lines = Counter(x.strip() for r in rows for x in (r["removed_lines"] or []))
    print(
        f"\nreal web pages: {len(rows)} documents read ({len(rejected) - (len(rows) - len(kept))} rejected while "
        f"reading), {sum(r['lines_removed'] > 0 for r in rows)} lost lines, "
        f"{sum(r['lines_removed'] for r in rows):,} lines / {removed:,} of {chars_in:,} characters removed "
        f"({removed / max(chars_in, 1):.2%}); {len(rows) - len(kept)} dropped as boilerplate_only; "
        f"{len(rows) / seconds:,.0f} docs/s"
    )
    print("most removed lines (documents):")
    for line, n in lines.most_common(20):
        print(f"  {n:>5}  {line[:90]!r}")


_FENCE_LINE = re.compile(r"^[ \t>]*(?:```|~~~)", re.M)


def _balance(text: str) -> tuple[int, int, int]:
    """Open fences (0/1), \\begin minus \\end, open $$ (0/1): what a cut fence or environment changes."""
    return len(_FENCE_LINE.findall(text)) % 2, text.count("\\begin{") - text.count("\\end{"), text.count("$$") % 2


def markup(min_docs: int, unit: str = "line") -> None:
    for name in ("zh_pingcap_docs.jsonl", "zh_oiwiki.jsonl"):
        path = DATA / "corpus" / name
        texts = {f"s/{name}#L{i + 1}": json.loads(line)["text"] for i, line in enumerate(path.open(encoding="utf-8"))}
        with tempfile.TemporaryDirectory() as tmp:
            kept, rejected, _ = run_tasks(
                Path(tmp),
                [{"name": "s", "kind": "text", "paths": [str(path)]}],
                [{"boilerplate": {"unit": unit, "min_docs": min_docs, "partitions": 4}}],
            )
        rows = list(kept.values()) + [r for r in rejected.values() if r["stage"] == "boilerplate"]
        changed = sum(_balance(r["text"]) != _balance(texts[i]) for i, r in kept.items())
        lines = Counter(x.strip() for r in rows for x in (r["removed_lines"] or []))
        print(
            f"\n{name}: {len(texts)} documents, {sum(r['lines_removed'] or 0 for r in rows):,} {unit}s removed from "
            f"{sum((r['lines_removed'] or 0) > 0 for r in rows)}, {len(rows) - len(kept)} dropped; "
            f"fence or environment balance changed in {changed}"
        )
        for line, n in lines.most_common(10):
            print(f"  {n:>5}  {line[:90]!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1000, help="articles per language")
    ap.add_argument("--min-docs", type=int, default=10)
    ap.add_argument("--web", action="store_true", help="also run over ../shared/data/web")
    ap.add_argument("--markup", action="store_true", help="also run over the shared TiDB docs and OI-wiki pages")
    args = add_args(ap, repeats=3).parse_args(argv)
    h = Harness("boilerplate", args)
    planted(h, args.n, args.min_docs)
    if args.web:
        web(args.min_docs)
    if args.markup:
        markup(args.min_docs)
    h.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
