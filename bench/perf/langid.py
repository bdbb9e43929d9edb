"""The langid stage: against raw fastText predict (docs/s), and its bounded read against the whole prefix.

    python -m bench.perf.langid --docs 4000 [--repeats 7] [--json bench/results/langid.json]
    python -m bench.perf.langid --sample [--repeats 3] [--json bench/results/langid_prefix.json]

Default mode: raw predict and the stage alternate (--repeats pairs); the ratio is taken per pair.

``--sample``: the stage with ``sample: null`` (fastText reads each document's whole ``max_chars``
prefix, as before ``sample`` existed) against the default ``sample`` (windows of long documents,
langid_sample.py), on the whole shared corpus (../shared/data/corpus, the input of bench/perf/pipeline.py):

  CPU         process CPU of the stage's fastText calls and of the whole stage (compute + decide,
              batches of --batch), the two sides interleaved, --repeats pairs
  decisions   per document: kept/rejected, its reason and ``lang`` (keep: [zh, en], min_score 0.5,
              as the pipeline bench runs it); every difference listed (id, before/after lang and
              score, the windows' own answer, why)
  UDHR        ``lang`` before and after on all UDHR pages (484, most in languages lid.176 lacks)
  accuracy    per language, before and after: lingua single words and word pairs (10 languages), the
              UDHR pages of languages lid.176 knows, the mixed-script Chinese cases the tests use
              (zh Wikipedia articles quoting Japanese, UD Traditional/Simplified sentences: ``script``)
"""

from __future__ import annotations

import argparse
import html
import json
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from bench._support.corpus import CORPUS, FILES, sample
from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import SHARED
from datapipe.stages import cjk
from datapipe.stages.base import StageContext
from datapipe.stages.langid import LangId, LangIdOptions
from datapipe.stages.langid_sample import sample_text
from datapipe.stages.quality import markdown

# UDHR pages (web/html/udhr/<page>.html) of languages lid.176 has, with its code.
UDHR = {
    "arb": "ar", "cmn_hans": "zh", "cmn_hans_beijing": "zh", "cmn_hans_guiyang": "zh", "cmn_hans_harbin": "zh",
    "cmn_hans_nanjing": "zh", "cmn_hans_tianjin": "zh", "cmn_hant": "zh", "deu_1901": "de", "deu_1996": "de",
    "eng": "en", "fra": "fr", "hin": "hi", "ind": "id", "ita": "it", "jpn": "ja", "jpn_osaka": "ja", "jpn_tokyo": "ja",
    "kor": "ko", "nld": "nl", "pol": "pl", "por_BR": "pt", "por_PT": "pt", "rus": "ru", "spa": "es", "tha": "th",
    "tur": "tr", "ukr": "uk", "vie": "vi", "yue": "yue",
}  # fmt: skip
LINGUA = ("ar", "de", "en", "es", "fr", "ja", "ko", "ru", "vi", "zh")


class _Counted:
    """The stage's fastText model, with the process CPU of its ``predict`` calls added up."""

    def __init__(self, model: Any) -> None:
        self.model, self.cpu, self.chars = model, 0.0, 0

    def predict(self, texts: list[str], k: int = 1) -> Any:
        t0 = time.process_time()
        try:
            return self.model.predict(texts, k=k)
        finally:
            self.cpu += time.process_time() - t0
            self.chars += sum(map(len, texts))


def stage(sampled: bool) -> LangId:
    options = LangIdOptions(keep=["zh", "en"], min_score=0.5)
    s = LangId(options if sampled else options.model_copy(update={"sample": None}), StageContext(".", "."))
    s.setup()
    return s


def run_stage(s: LangId, texts: list[str], batch: int, kind: str = "web") -> tuple[pa.Table, list[str | None]]:
    tables, reasons = [], []
    for i in range(0, len(texts), batch):
        chunk = texts[i : i + batch]
        b = s.compute(pa.table({"text": chunk, "kind": [kind] * len(chunk)}))
        reasons += s.decide(b).reason.to_pylist()
        tables.append(b.drop_columns(["text"]))
    return pa.concat_tables(tables), reasons


def udhr_text(page: str) -> str:  # as tests/stages/test_langid_accuracy.py reads them
    raw = (SHARED / "web" / "html" / "udhr" / f"{page}.html").read_text(encoding="utf-8")
    raw = re.sub(r"(?s)<(script|style).*?</\1>", "", raw)
    return html.unescape(re.sub(r"<[^>]+>", "\n", raw))


def held_out_sets() -> list[tuple[str, str, str, list[str]]]:
    """(set, language, column, texts): each text's ``column`` should equal ``language``."""
    sets = []
    for kind in ("single-words", "word-pairs"):
        for lang in LINGUA:
            path = SHARED / "langid" / "lingua" / kind / f"{lang}.txt"
            items = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
            sets.append((f"lingua {kind}", lang, "lang", items))
    by_lang: dict[str, list[str]] = {}
    for page, lang in UDHR.items():
        by_lang.setdefault(lang, []).append(udhr_text(page))
    sets += [("udhr pages", lang, "lang", texts) for lang, texts in sorted(by_lang.items())]
    docs = [json.loads(ln) for ln in (CORPUS / "zh_wikipedia.jsonl").read_text(encoding="utf-8").splitlines() if ln.strip()]
    counts, _, _ = cjk.line_script_counts([d["text"] for d in docs])
    kana = [d["text"] for d, k in zip(docs, counts["kana"]) if k > 0]  # zh articles quoting Japanese
    sets.append(("zh wikipedia with kana", "zh", "lang", kana))
    for script, name in (("hant", "ud_gsd_dev_hant.txt"), ("hans", "ud_gsdsimp_dev_hans.txt")):
        lines = (SHARED / "zh" / name).read_text(encoding="utf-8").splitlines()
        sets.append(("UD zh sentences (script)", script, "script", lines))
    for s in ("hans", "hant"):
        sets.append(("udhr zh pages (script)", s, "script", [udhr_text(p) for p in UDHR if p.startswith(f"cmn_{s}")]))
    return sets


def accuracy(before: LangId, after: LangId) -> list[dict[str, Any]]:
    rows = []
    for name, lang, column, texts in held_out_sets():
        acc = {}
        for side, s in (("before", before), ("after", after)):
            got = run_stage(s, texts, 1000)[0][column].to_pylist()
            acc[side] = sum(g == lang for g in got) / len(texts)
        long = sum(len(t) > after.options.sample.chars for t in texts)
        rows.append({"set": name, "language": lang, "items": len(texts), "longer_than_sample": long, **acc})
        rows[-1]["delta"] = acc["after"] - acc["before"]
        print(f"  {name:<26} {lang:<5} {len(texts):>6} items ({long:>4} long)  {acc['before']:.4f} -> {acc['after']:.4f}")
    return rows


def differences(docs: list[dict], before: tuple[pa.Table, list], after: tuple[pa.Table, list], s: LangId) -> list[dict]:
    (tb, rb), (ta, ra) = before, after
    lb, la = tb["lang"].to_pylist(), ta["lang"].to_pylist()
    sb, sa = tb["lang_score"].to_pylist(), ta["lang_score"].to_pylist()
    out = []
    for i in np.flatnonzero([(x != y) or (p is None) != (q is None) for x, y, p, q in zip(lb, la, rb, ra)]):
        text = docs[i]["text"]
        o = s.options.sample
        prose = markdown.prose(pa.array([text]))[0].as_py()[: s.options.max_chars]  # what the stage reads
        sampled = sample_text(prose, o.chars, o.windows)
        out.append(
            {
                "id": docs[i]["source"],
                "chars": len(text),
                "before": {"lang": lb[i], "score": round(sb[i], 4), "reason": rb[i]},
                "after": {"lang": la[i], "score": round(sa[i], 4), "reason": ra[i]},
                "why": (
                    f"its {o.windows} windows ({len(sampled)} of {len(prose)} characters of prose) "
                    f"score {la[i]} {sa[i]:.3f} >= full_below {o.full_below}, while the whole prefix gives {lb[i]} {sb[i]:.3f}"
                ),
            }
        )
    return out


def sample_mode(args: argparse.Namespace) -> None:
    h = Harness("langid_prefix", args, libs=["fasttext-numpy2"])
    docs = []
    for name in FILES:
        with open(CORPUS / name, encoding="utf-8") as f:
            docs += [json.loads(line) for line in f if line.strip()]
    texts = [d["text"] for d in docs]
    before, after = stage(False), stage(True)
    counted = {"before": _Counted(before.fasttext_model), "after": _Counted(after.fasttext_model)}
    before._model, after._model = counted["before"], counted["after"]
    outputs: dict[str, tuple[pa.Table, list]] = {}

    def side(name: str, s: LangId) -> Callable[[], dict[str, float]]:
        def fn() -> dict[str, float]:
            counted[name].cpu, counted[name].chars = 0.0, 0
            t0 = time.process_time()
            outputs[name] = run_stage(s, texts, args.batch)
            return {"stage": time.process_time() - t0, "fasttext": counted[name].cpu, "chars": counted[name].chars}

        return fn

    print(f"{len(texts)} documents ({sum(map(len, texts)):,} characters), batch {args.batch}")
    runs = h.interleave({"before": side("before", before), "after": side("after", after)})
    for name in ("before", "after"):
        for part in ("fasttext", "stage"):
            h.figure(f"{name}: {part} CPU s", [r[part] for r in runs[name]], "s")
    for part in ("fasttext", "stage"):
        b, a = [r[part] for r in runs["before"]], [r[part] for r in runs["after"]]
        h.ratio(f"{part} CPU before/after", pair_ratios(b, a), target=">= 2" if part == "fasttext" else "")
    read = {name: runs[name][0]["chars"] for name in runs}
    print(f"fastText read {read['after']:,} characters, {read['after'] / read['before']:.1%} of {read['before']:,}")
    pages = sorted(p.stem for p in (SHARED / "web" / "html" / "udhr").glob("*.html"))
    udhr = [udhr_text(p) for p in pages]
    lb, la = (run_stage(s, udhr, 1000)[0]["lang"].to_pylist() for s in (before, after))
    udhr_diff = [{"page": p, "before": b, "after": a} for p, b, a in zip(pages, lb, la) if b != a]
    print(f"all {len(pages)} UDHR pages (most in languages lid.176 lacks): lang the same on {len(pages) - len(udhr_diff)}")
    for d in udhr_diff:
        print(f"  {d}")
    diff = differences(docs, outputs["before"], outputs["after"], after)
    same = 1 - len(diff) / len(docs)
    print(f"\ndecisions (kept/rejected, reason, lang) identical for {same:.4%} of {len(docs)} documents (target >= 99.9%)")
    for d in diff:
        print(f"  {d['id']}: {d['before']} -> {d['after']}: {d['why']}")
    sa, sb = (np.array(outputs[k][0]["lang_score"].to_pylist(), dtype=np.float64) for k in ("after", "before"))
    shift = np.abs(sa - sb)[sa != sb]
    moved = {
        "documents": len(shift),
        "median": float(np.median(shift)) if len(shift) else 0.0,
        "p99": float(np.percentile(shift, 99)) if len(shift) else 0.0,
        "max": float(shift.max()) if len(shift) else 0.0,
    }
    print(
        f"lang_score differs on {moved['documents']} documents: |change| median {moved['median']:.4f}, "
        f"99th percentile {moved['p99']:.4f}, max {moved['max']:.4f}"
    )
    print("\nheld-out accuracy (before -> after):")
    acc = accuracy(before, after)
    worst = max(abs(r["delta"]) for r in acc)
    print(f"largest change {worst:.4f} (target <= 0.001)")
    h.finish(
        documents=len(docs),
        sample=after.options.sample.model_dump(),
        decisions_identical=same,
        differences=diff,
        fasttext_chars=read,
        udhr_all_pages={"pages": len(pages), "lang_differs": udhr_diff},
        lang_score_moved=moved,
        accuracy=acc,
        accuracy_largest_change=worst,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=4000, help="documents from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--sample", action="store_true", help="the bounded read against the whole prefix (see above)")
    args = add_args(ap, repeats=7).parse_args()
    if args.sample:
        sample_mode(args)
        return
    h = Harness("langid", args, libs=["fasttext-numpy2"])
    texts = [d["text"] for d in sample(args.docs)]
    stage = LangId(LangIdOptions(keep=["zh", "en"], sample=None), StageContext(".", "."))
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
