"""Quality-stage speed before and after the compiled repetition kernels, same batches, one process.

    python -m bench.perf.quality_signals [--docs 6000] [--repeats 3] [--batch 1000] [--json PATH]

"before" is the former code path, kept in the package: n-gram repetition keyed by a 64-bit
polynomial hash, one Arrow dictionary encoding per n (``ngram_repetition_reference(exact=False)``),
Chinese tokens from the whole text (``zh.char_tokens_reference``) and one regex scan per
character class (``zh.class_counts`` and ``gopher.word_classes`` with ``reference=True``). "after" is the default (``_kernels``).
Everything else in the stage is the same code. Documents get their rule set from their file
(en_wikipedia -> en_web, zh_* -> zh_web), so no langid runs. Runs alternate
before/after ``--repeats`` times (``bench/_support/harness.py``); each line gives docs/s as median
[min-max], and the ratios after/before are taken per pair (median and range). Issue 18's targets:
the whole stage >= 3x faster, and zh_web after at least as fast as en_web before. Signal values
are compared too (they differ only where the former hash merged two n-grams:
tests/stages/test_quality_kernels.py). ``--docs 0`` runs the whole shared corpus (27,369 documents).
"""

from __future__ import annotations

import argparse
import collections
import time
from contextlib import contextmanager

import numpy as np
import pyarrow as pa

from bench._support.corpus import sample
from bench._support.harness import Harness, add_args, pair_ratios
from datapipe.stages.base import StageContext
from datapipe.stages.quality import Quality, QualityOptions, gopher, text, zh


def _before(ids, doc, weight, n_docs, top_ns, dup_ns):  # type: ignore[no-untyped-def]
    return text.ngram_repetition_reference(ids, doc, weight, n_docs, top_ns, dup_ns, exact=False)


@contextmanager
def former_code():  # type: ignore[no-untyped-def]
    saved = gopher.ngram_repetition, zh.char_tokens, zh.class_counts, gopher.word_classes
    gopher.ngram_repetition, zh.char_tokens = _before, zh.char_tokens_reference
    zh.class_counts = lambda t: saved[2](t, reference=True)  # one regex scan per class
    gopher.word_classes = lambda w: saved[3](w, reference=True)
    try:
        yield
    finally:
        gopher.ngram_repetition, zh.char_tokens, zh.class_counts, gopher.word_classes = saved


def batches(docs: list[dict], size: int) -> dict[str, list[pa.Table]]:
    """Per rule set, the batches of its documents (in sample order)."""
    by_set: dict[str, list[str]] = collections.defaultdict(list)
    for d in docs:
        by_set["en_web" if d["file"].startswith("en_") else "zh_web"].append(d["text"])
    out = {}
    for key, texts in sorted(by_set.items()):
        lang = key[:2]
        out[key] = [
            pa.table(
                {
                    "id": [str(j) for j in range(len(texts[i : i + size]))],
                    "kind": ["web"] * len(texts[i : i + size]),
                    "lang": [lang] * len(texts[i : i + size]),
                    "text": texts[i : i + size],
                }
            )
            for i in range(0, len(texts), size)
        ]
    return out


def run(quality: Quality, tables: list[pa.Table]) -> tuple[float, list[pa.Table]]:
    t0 = time.perf_counter()
    out = []
    for b in tables:
        b = quality.compute(b)
        quality.decide(b)
        out.append(b)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=6000, help="documents sampled from ../shared/data/corpus (0: all)")
    ap.add_argument("--batch", type=int, default=1000)
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("quality_signals", args, note=f"one process, batches of {args.batch}")
    quality = Quality(QualityOptions(), StageContext(".", "."))
    sets = batches(sample(args.docs), args.batch)
    run(quality, [t.slice(0, 20) for ts in sets.values() for t in ts[:1]])  # compile / load numba's cache
    total = {"before": [0.0] * h.repeats, "after": [0.0] * h.repeats}
    rates: dict[str, dict[str, list[float]]] = {}
    n_all = 0
    for key, tables in sets.items():
        n = sum(t.num_rows for t in tables)
        n_all += n
        outs: dict[str, list[pa.Table]] = {}

        def before(tables: list[pa.Table] = tables, outs: dict = outs) -> float:
            with former_code():
                t, outs["before"] = run(quality, tables)
            return t

        def after(tables: list[pa.Table] = tables, outs: dict = outs) -> float:
            t, outs["after"] = run(quality, tables)
            return t

        times = h.interleave({f"{key} before": before, f"{key} after": after})
        for r in range(h.repeats):
            total["before"][r] += times[f"{key} before"][r]
            total["after"][r] += times[f"{key} after"][r]
        cols = [c for c in quality.sets[key].columns()]
        differ = sum(
            int(
                np.sum(
                    ~np.isclose(
                        o[c].to_numpy(zero_copy_only=False).astype(float),
                        w[c].to_numpy(zero_copy_only=False).astype(float),
                        rtol=0,
                        atol=0,
                        equal_nan=True,
                    )
                )
            )
            for o, w in zip(outs["before"], outs["after"])
            for c in cols
        )
        rates[key] = {k: [n / t for t in v] for k, v in (("before", times[f"{key} before"]), ("after", times[f"{key} after"]))}
        report(h, f"{key} ({n} docs)", n, {"before": times[f"{key} before"], "after": times[f"{key} after"]})
        print(f"    signal values that differ from the former code: {differ} of {n * len(cols)}")
        h.extra.setdefault("signals_differ", {})[key] = [differ, n * len(cols)]
    report(h, f"whole stage ({n_all} docs)", n_all, total, target=">= 3x")
    if "zh_web" in rates and "en_web" in rates:
        h.ratio(
            "zh_web after / en_web before (docs/s)",
            pair_ratios(rates["zh_web"]["after"], rates["en_web"]["before"]),
            target=">= 1",
        )
    h.finish(docs=n_all, batch=args.batch)


def report(h: Harness, what: str, n: int, times: dict[str, list[float]], target: str = "") -> None:
    for k, v in times.items():
        h.figure(f"{what} {k} docs/s", [n / t for t in v], "docs/s")
    h.ratio(f"{what}: after / before (docs/s)", pair_ratios(times["before"], times["after"]), target=target)


if __name__ == "__main__":
    main()
