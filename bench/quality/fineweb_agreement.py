"""Keep/drop agreement with datatrove's FineWeb filters: datapipe's default English rules and the
``fineweb_datatrove`` preset, per document, on the shared English documents.

    python -m bench.quality.fineweb_agreement [--datatrove-python /tmp/dt/bin/python]
        [--work /tmp/datapipe-fineweb-agreement] [--rerun-datatrove] [--datapipe-only] [--json PATH]

datatrove side (bench/_support/datatrove_agreement.py, in the datatrove venv): LanguageFilter(["en"]) and
GopherRepetitionFilter, GopherQualityFilter, C4QualityFilter, FineWebQualityFilter with their
defaults, chained as in bench/_support/datatrove_pipeline.py (FineWeb judges the text C4 rewrites), on
every document of ../shared/data/corpus (27,369). It takes ~1 hour on one core, so its output is
kept in --work and reused while the documents and that script are unchanged.

datapipe side: the langid stage (keep en) and the quality stage, once with its defaults
(``rules: auto``: en_web.yaml) and once with ``rules: {en_web: fineweb_datatrove}``, on every
document langid calls English; kept in --work too, keyed by the corpus and datapipe's quality
code (``--datapipe-only`` computes it and stops, e.g. while datatrove still runs elsewhere).

The shared English documents are those both language filters call English (24,268). Printed:
agreement overall, confusion counts, each side's drop reasons among the disagreements, for the
preset the agreement of the reason (datatrove's first failing rule) too, the disagreeing ids,
the words check (datapipe's re-implemented spaCy tokenizer against datatrove's words, per
document, by digest), and the quality stage's documents per CPU second (defaults, preset) and
datatrove's four filters' documents per second (wall, one process) where its run was timed whole.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench._support.corpus import CORPUS, FILES
from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT
from datapipe.assets.models import ensure_lid_model
from datapipe.stages.base import StageContext
from datapipe.stages.langid import LangId, LangIdOptions
from datapipe.stages.quality import Quality, QualityOptions
from datapipe.stages.quality.dt_view import clear_caches
from datapipe.text.spacy_en import english

DT_SCRIPT = ROOT / "bench" / "_support" / "datatrove_agreement.py"
PRESET = "fineweb_datatrove"


def write_docs(path: Path) -> list[dict]:
    docs = []
    for name in FILES:
        with open(CORPUS / name, encoding="utf-8") as f:
            docs += [{"id": d["source"], "text": d["text"]} for d in map(json.loads, f) if d]
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return docs


def run_datatrove(python: str, docs_path: Path, work: Path, rerun: bool) -> tuple[dict[str, dict], float | None]:
    key = hashlib.sha256(docs_path.read_bytes() + DT_SCRIPT.read_bytes()).hexdigest()[:16]
    out, meta = work / f"datatrove-{key}.jsonl", work / f"datatrove-{key}.json"
    if rerun or not meta.exists():
        print(f"datatrove: running {DT_SCRIPT.name} (about an hour) ...", flush=True)
        proc = subprocess.run(
            [python, str(DT_SCRIPT), str(docs_path), str(ensure_lid_model()), str(out)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"datatrove failed:\n{proc.stderr[-3000:]}")
        meta.write_text(proc.stdout.strip().splitlines()[-1])
    else:
        print(f"datatrove: reusing {out}")
    rows = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    return rows, json.loads(meta.read_text()).get("filter_seconds")


def english_ids(docs: list[dict], batch: int = 2000) -> set[str]:
    langid = LangId(LangIdOptions(keep=["en"]), StageContext(".", "."))
    langid.setup()
    out: set[str] = set()
    for i in range(0, len(docs), batch):
        part = docs[i : i + batch]
        b = pa.table({"id": [d["id"] for d in part], "kind": ["web"] * len(part), "text": [d["text"] for d in part]})
        reasons = langid.decide(langid.compute(b)).reason.to_pylist()
        out.update(d["id"] for d, r in zip(part, reasons) if r is None)
    return out


def quality_reasons(docs: list[dict], rules: object, batch: int = 1000) -> tuple[list[str | None], float]:
    stage = Quality(QualityOptions(rules=rules), StageContext(str(ROOT), str(ROOT)))  # type: ignore[arg-type]
    reasons: list[str | None] = []
    t = time.process_time()  # CPU seconds: this machine is shared, its wall time says more about the others
    for i in range(0, len(docs), batch):
        part = docs[i : i + batch]
        b = pa.table({"id": [d["id"] for d in part], "kind": ["web"] * len(part), "lang": ["en"] * len(part)})
        b = b.append_column("text", pa.array([d["text"] for d in part]))
        reasons += stage.decide(stage.compute(b)).reason.to_pylist()
    return reasons, time.process_time() - t


DT_TIMING = r"""
import json, sys, time
from datatrove.data import Document
from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
texts = json.load(open(sys.argv[1]))
filters = [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()]
t = time.process_time()
for text in texts:  # every filter on every document, FineWeb on C4's text as in the chain
    doc = Document(text=text, id="")
    for f in filters:
        f.filter(doc)
print(json.dumps({"cpu_seconds": time.process_time() - t}))
"""


def time_both(python: str, texts: list[str], work: Path) -> tuple[float, float]:
    """CPU seconds of datatrove's four filters (in its venv) and of the preset's quality stage on ``texts``."""
    path = work / "timing.json"
    path.write_text(json.dumps(texts))
    proc = subprocess.run([python, "-c", DT_TIMING, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"datatrove timing failed:\n{proc.stderr[-2000:]}")
    dt_cpu = json.loads(proc.stdout.strip().splitlines()[-1])["cpu_seconds"]
    clear_caches()  # as cold as datatrove's start
    _, ours = quality_reasons([{"id": str(i), "text": t} for i, t in enumerate(texts)], {"en_web": PRESET})
    return dt_cpu, ours


def datapipe_side(docs: list[dict], work: Path) -> dict:
    """langid, then the quality stage's decisions with the defaults and with the preset, on every
    document langid calls English; kept in ``work`` (keyed by the corpus and datapipe's quality
    code) so the datatrove side can be rerun without it."""
    src = b"".join(p.read_bytes() for p in sorted((ROOT / "datapipe" / "stages" / "quality").glob("*.py")))
    src += (ROOT / "datapipe" / "text" / "spacy_en.py").read_bytes() + (
        ROOT / "filters" / "quality" / "presets" / f"{PRESET}.yaml"
    ).read_bytes()
    key = hashlib.sha256((work / "docs.jsonl").read_bytes() + src).hexdigest()[:16]
    path = work / f"datapipe-{key}.json"
    if path.exists():
        print(f"datapipe: reusing {path}")
        return json.loads(path.read_text())
    english = english_ids(docs)
    en_docs = [d for d in docs if d["id"] in english]
    default, default_s = quality_reasons(en_docs, "auto")
    preset, preset_s = quality_reasons(en_docs, {"en_web": PRESET})
    out = {
        "english": [d["id"] for d in en_docs],
        "default": {d["id"]: r for d, r in zip(en_docs, default)},
        "preset": {d["id"]: r for d, r in zip(en_docs, preset)},
        "default_seconds": default_s,
        "preset_seconds": preset_s,
    }
    path.write_text(json.dumps(out))
    print(f"datapipe: {len(en_docs):,} English documents, defaults {default_s:.0f} CPU s, preset {preset_s:.0f} CPU s")
    return out


def dt_reason(r: str | None) -> str | None:
    """datatrove's "<filter>:<reason>" in the preset's naming (``datatrove_<filter>:<rule>``)."""
    if r is None:
        return None
    f, _, reason = r.partition(":")
    if f == "gopher_quality":
        reason = reason.removeprefix("gopher_")
    return f"datatrove_{f}:{reason}"


def compare(name: str, ids: list[str], ours: list[str | None], theirs: list[str | None], show_ids: int) -> dict:
    keep_o = np.array([r is None for r in ours])
    keep_t = np.array([r is None for r in theirs])
    agree = float((keep_o == keep_t).mean())
    conf = {
        "both keep": int((keep_o & keep_t).sum()),
        "both drop": int((~keep_o & ~keep_t).sum()),
        "datatrove drops, datapipe keeps": int((keep_o & ~keep_t).sum()),
        "datatrove keeps, datapipe drops": int((~keep_o & keep_t).sum()),
    }
    print(f"\n== {name}: agreement {agree:.2%} on {len(ids):,} documents")
    for k, v in conf.items():
        print(f"  {k:34s} {v:6,}")
    dt_only = collections.Counter(t for o, t in zip(ours, theirs) if o is None and t is not None)
    dp_only = collections.Counter(o for o, t in zip(ours, theirs) if o is not None and t is None)
    print("  datatrove drops that datapipe keeps, by datatrove's reason:")
    for k, v in dt_only.most_common():
        print(f"    {v:6,}  {k}")
    print("  datapipe drops that datatrove keeps, by datapipe's reason:")
    for k, v in dp_only.most_common():
        print(f"    {v:6,}  {k}")
    per_filter = {}
    both = collections.Counter(t.partition(":")[0] for o, t in zip(ours, theirs) if t is not None)
    print("  datatrove's drops per filter (first failing filter): count")
    for f, v in both.most_common():
        per_filter[f] = v
        print(f"    {v:6,}  {f}")
    wrong = [i for i, o, t in zip(ids, ours, theirs) if (o is None) != (t is None)]
    print(f"  disagreeing ids ({len(wrong)}): {' '.join(wrong[:show_ids])}{' ...' if len(wrong) > show_ids else ''}")
    return {
        "agreement": agree,
        "confusion": conf,
        "datatrove_only_drops": dict(dt_only),
        "datapipe_only_drops": dict(dp_only),
        "datatrove_drops_per_filter": per_filter,
        "disagreeing_ids": wrong,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datatrove-python", default="/tmp/dt/bin/python", help="python of a venv with datatrove[processing], spacy")
    ap.add_argument("--work", type=Path, default=Path("/tmp/datapipe-fineweb-agreement"), help="keeps datatrove's verdicts")
    ap.add_argument("--rerun-datatrove", action="store_true", help="run datatrove even when its verdicts are kept")
    ap.add_argument("--show-ids", type=int, default=200, help="disagreeing ids printed per comparison")
    ap.add_argument("--datapipe-only", action="store_true", help="compute and keep datapipe's side, then stop")
    ap.add_argument("--time-docs", type=int, default=0, help="also time both sides on this many shared documents")
    args = add_args(ap, repeats=1).parse_args()
    h = Harness("fineweb_agreement", args)
    args.work.mkdir(parents=True, exist_ok=True)
    docs_path = args.work / "docs.jsonl"
    docs = write_docs(docs_path)
    ours = datapipe_side(docs, args.work)
    if args.datapipe_only:
        return
    dt, dt_seconds = run_datatrove(args.datatrove_python, docs_path, args.work, args.rerun_datatrove)
    ours_en = set(ours["english"])
    shared = [d for d in docs if d["id"] in ours_en and dt[d["id"]]["en"]]
    print(
        f"{len(docs):,} documents; English by datapipe's langid {len(ours_en):,}, by datatrove's LanguageFilter "
        f"{sum(r['en'] for r in dt.values()):,}, both (the shared English documents) {len(shared):,}"
    )
    ids = [d["id"] for d in shared]
    theirs = [dt[i]["reason"] for i in ids]
    default = [ours["default"][i] for i in ids]
    preset = [ours["preset"][i] for i in ids]
    res_default = compare("datapipe defaults (rules: auto, en_web.yaml) vs datatrove", ids, default, theirs, args.show_ids)
    res_preset = compare(f"datapipe rules: {{en_web: {PRESET}}} vs datatrove", ids, preset, theirs, args.show_ids)
    mapped = [dt_reason(t) for t in theirs]
    same_reason = float(np.mean([o == t for o, t in zip(preset, mapped)]))
    print(f"  same first failing rule as datatrove (or both keep): {same_reason:.2%}")
    per_rule = collections.Counter((o, t) for o, t in zip(preset, mapped) if o != t)
    for (o, t), v in per_rule.most_common(20):
        print(f"    {v:6,}  datapipe {o}  datatrove {t}")
    default_s, preset_s = ours["default_seconds"], ours["preset_seconds"]
    n_timed = len(ours["english"])
    timing: list[tuple[float, float]] = []
    if args.time_docs:  # datatrove and the preset on the same documents, CPU time, alternating
        sample = [d["text"] for d in shared[: args.time_docs]]
        timing = [time_both(args.datatrove_python, sample, args.work) for _ in range(args.repeats)]

    # words: datapipe's tokenizer against datatrove's, by digest (when the datatrove run recorded them)
    tok = english()
    have = [d for d in shared if "words" in dt[d["id"]]]
    words_bad = [
        d["id"] for d in have if hashlib.sha1(" ".join(tok.words(d["text"])).encode("utf-8")).hexdigest() != dt[d["id"]]["words"]
    ]
    if have:
        print(
            f"\nwords: datapipe's spaCy re-implementation differs on {len(words_bad)} of {len(have):,} documents {words_bad[:20]}"
        )
    else:
        print("\nwords: not checked (the kept datatrove run predates the words digest; --rerun-datatrove)")

    print()
    # agreements as ratios (agreeing documents / documents) so the benchmarks table lists them
    h.ratio("fineweb_datatrove preset: keep/drop agreement with datatrove", [res_preset["agreement"]], target=">= 0.995")
    h.ratio("datapipe defaults (en_web): keep/drop agreement with datatrove", [res_default["agreement"]])
    h.figure("datapipe quality stage, preset, docs per CPU second", n_timed / preset_s, "docs/s")
    h.figure("datapipe quality stage, defaults, docs per CPU second", n_timed / default_s, "docs/s")
    if dt_seconds:
        n_dt = sum(r["en"] for r in dt.values())  # datatrove timed its filters on every document it calls English
        h.figure("datatrove's four filters, docs/s (wall, one process)", n_dt / dt_seconds, "docs/s")
    if timing:
        n = min(args.time_docs, len(shared))
        h.figure(f"datatrove's four filters, docs per CPU second ({n} docs)", [n / a for a, _ in timing], "docs/s")
        h.figure(f"fineweb_datatrove preset, docs per CPU second ({n} docs, fresh caches)", [n / b for _, b in timing], "docs/s")
        h.ratio("preset / datatrove docs per CPU second", [a / b for a, b in timing])
    h.finish(
        shared_docs=len(shared),
        default=res_default,
        preset=res_preset,
        preset_same_reason=same_reason,
        words_checked=len(have),
        words_differ=words_bad,
    )


if __name__ == "__main__":
    main()
