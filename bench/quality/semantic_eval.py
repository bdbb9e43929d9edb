"""Precision/recall of the ``semantic`` stage's embeddings on real paraphrase-like pairs, and the
most similar unrelated pair among 10,000 random ones.

    python -m bench.quality.semantic_eval [--negatives 10000] [--no-stage] [--no-sweep] [--runs clean] [--json PATH]

Positives (real text from ../shared/data):
  * edited: real zh/en Wikipedia and TiDB documents and two edited copies each (sentences inserted
    from another document, deleted, reordered, another site's header/footer: ``datapipe.dedup.evalset``);
  * ts: the 500 line-aligned UD Chinese GSD sentences, Simplified against the Traditional original
    re-punctuated (，→、 ；。→！ and full-width brackets dropped): the same sentence in the other script.
Negatives: 10,000 seeded random pairs of documents that are not copies of each other (any set).

Embedders: ``fasttext`` (what the stage trains when no model is given: fastText on the run's own
text, here the whole eval set; idf-weighted, common directions removed) and ``static`` (a model2vec-layout folder of idf-weighted
random token vectors built from the same text, the kind the tests build: a bag-of-words model, so a
lower bound for a trained static model), each also with ``fold_script`` (Traditional folded to
Simplified before embedding). For each: positives' and negatives' cosines, P/R per
threshold, and the lowest threshold with no negative above it. Then the stage itself runs on the
whole set (in-process): at 0.9 without a model (what a new user tried), at the documented
defaults (no model: 0.995; a model: 0.9), and at 0.99 without a model (the default before); per
document: dropped, wrongly (for a document of another group), less than the threshold similar to
the document named (what chains did), precision and recall (k-means splits included). And at the
defaults on held-out clean text (1,000 zh and 1,000 en Wikipedia documents, 848 of the zh ones the
CMRC 2018 dev paragraphs) with paraphrase-like copies of 200 of them planted (sentences reordered,
one in six left out, re-punctuated), after exact and MinHash dedup as the stage's page says to run
it, and alone (also at 0.9 without a model): no clean document should be dropped, the copies should.
Deterministic (fixed seeds): run once, no interleaving.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._support.harness import Harness, add_args
from bench._support.paths import SHARED
from datapipe.dedup import evalset
from datapipe.dedup.embed import FastTextEmbedder, StaticEmbedder, train_fasttext
from tests.support.static_embedding import build_static_model

DATA = SHARED
THRESHOLDS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 0.995]


def repunctuate(text: str) -> str:
    return text.replace("，", "、").replace("；", "。").replace("。", "！").replace("（", "").replace("）", "")


def eval_set() -> tuple[list[str], np.ndarray, dict[str, list[tuple[int, int]]]]:
    """Texts, group of each (copies share one) and the positive pairs of each kind."""
    c = DATA / "corpus"
    texts, groups, _ = evalset.build(
        [
            (c / "zh_wikipedia.jsonl", "zh", 150, 600),
            (c / "en_wikipedia.jsonl", "en", 150, 1500),
            (c / "zh_pingcap_docs.jsonl", "zh", 60, 1000),
        ]
    )
    groups = np.asarray(groups, np.int64)
    pairs = {"edited": sorted(evalset.group_pairs(groups))}
    hant = (DATA / "zh" / "ud_gsd_dev_hant.txt").read_text(encoding="utf-8").splitlines()
    hans = (DATA / "zh" / "ud_gsdsimp_dev_hans.txt").read_text(encoding="utf-8").splitlines()
    base, g0 = len(texts), int(groups.max()) + 1
    ts = []
    for k, (t, s) in enumerate(zip(hant, hans)):
        texts += [s, repunctuate(t)]
        ts.append((base + 2 * k, base + 2 * k + 1))
    groups = np.concatenate([groups, g0 + np.repeat(np.arange(len(hant)), 2)])
    pairs["ts"] = ts
    return texts, groups, pairs


def negatives(groups: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int]] = []
    seen = set()
    while len(out) < n:
        i, j = sorted(rng.integers(0, len(groups), 2).tolist())
        if groups[i] != groups[j] and (i, j) not in seen:
            seen.add((i, j))
            out.append((i, j))
    return np.asarray(out)


def scores(vectors: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    return np.round(np.einsum("ij,ij->i", vectors[pairs[:, 0]].astype(np.float64), vectors[pairs[:, 1]].astype(np.float64)), 6)


def sweep(pos: dict[str, np.ndarray], neg: np.ndarray) -> tuple[list[dict], float]:
    rows = []
    allpos = np.concatenate(list(pos.values()))
    for thr in THRESHOLDS:
        tp, fp = int((allpos >= thr).sum()), int((neg >= thr).sum())
        row = {"threshold": thr, "precision": tp / (tp + fp) if tp + fp else 1.0, "false_pairs": fp}
        row.update({f"recall_{k}": float((v >= thr).mean()) for k, v in pos.items()})
        rows.append(row)
    safe = min((t for t in THRESHOLDS if t > neg.max()), default=1.0)
    return rows, safe


def clean_set(per_language: int = 1000) -> list[str]:
    """Held-out clean text: zh and en Wikipedia documents with no planted copy (the first
    ``per_language`` of each of at least 200 characters; 848 of the zh ones are the CMRC 2018 dev
    paragraphs, the Simplified counterpart of DRCD's Traditional ones)."""
    texts = []
    for name in ("zh_wikipedia.jsonl", "en_wikipedia.jsonl"):
        with open(DATA / "corpus" / name, encoding="utf-8") as f:
            texts += [t for t in (json.loads(line)["text"] for line in f) if len(t) >= 200][:per_language]
    return list(dict.fromkeys(texts))


def paraphrase(text: str, rng: random.Random) -> str:
    """A paraphrase-like copy: the sentences reordered, about one in six left out, the rest
    re-punctuated (few shared 5-grams in order, most of the content)."""
    sents = evalset.split_sentences(text)
    rng.shuffle(sents)
    if len(sents) >= 3:
        sents = sents[: len(sents) - max(1, len(sents) // 6)]
    return " ".join(s.strip() for s in sents).replace(",", ";").replace("，", "、")


def held_out(planted: int = 200, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """The clean set and, beside it, a paraphrase-like copy of ``planted`` of its documents (seeded,
    half zh, half en): texts and a group per text (a copy shares its original's group; every other
    document is alone in its group, so dropping it loses clean text)."""
    clean = clean_set()
    rng = random.Random(seed)
    zh = [i for i, t in enumerate(clean) if any("\u4e00" <= c <= "\u9fff" for c in t[:50])]
    en = sorted(set(range(len(clean))) - set(zh))
    chosen = sorted(rng.sample(zh, planted // 2) + rng.sample(en, planted - planted // 2))
    copies = [paraphrase(clean[i], rng) for i in chosen]
    groups = np.concatenate([np.arange(len(clean)), np.asarray(chosen, np.int64)])
    return clean + copies, groups


def stage_run(
    texts: list[str],
    groups: np.ndarray,
    threshold: float | None,
    work: Path,
    model: Path | None = None,
    fold_script: bool = True,
    before: tuple[dict, ...] = (),
) -> dict:
    """The stage on ``texts`` (in-process; fastText mode without ``model``; ``threshold`` None: the
    documented default), after the ``before`` stages: per document, how many it dropped, how many
    of those for a document of another group (wrong), how many less than the threshold similar to
    the document they name (the chains SemDeDup's rule rules out), precision and recall."""
    import yaml

    from datapipe.audit.sql import connect
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    order = list(range(len(texts)))
    random.Random(0).shuffle(order)  # copies land anywhere in the run, in either file
    (work / "data").mkdir(parents=True)
    half = len(order) // 2
    for f, chunk in enumerate((order[:half], order[half:])):
        with open(work / "data" / f"part-{f}.jsonl", "w", encoding="utf-8") as out:
            for i in chunk:
                out.write(json.dumps({"text": texts[i], "g": int(groups[i])}, ensure_ascii=False) + "\n")
    ids = {}
    for f, chunk in enumerate((order[:half], order[half:])):
        for line, i in enumerate(chunk):
            ids[f"s/data/part-{f}.jsonl#L{line + 1}"] = i
    options: dict = {"partitions": 4, "clusters": 16, "fold_script": fold_script}
    if threshold is not None:
        options["threshold"] = threshold
    if model is not None:
        options["model"] = str(model)
    cfg = {"name": "sem", "sources": [{"name": "s", "paths": ["data/*.jsonl"]}], "stages": [*before, {"semantic": options}]}
    (work / "pipeline.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    t0 = time.perf_counter()
    pipeline = load_pipeline(work / "pipeline.yaml")
    run_pipeline(pipeline, output=work / "out", show_progress=False, in_process=True, log=lambda m: None)
    seconds = time.perf_counter() - t0
    with connect(work / "out") as con:
        columns = {r[0] for r in con.execute("describe documents").fetchall()}
        dropped = (  # a run in which the stage dropped nothing has no such columns
            con.execute("select id, dup_of, semantic_similarity from documents where reason = 'near_semantic'").fetchall()
            if "semantic_similarity" in columns
            else []
        )
        earlier = con.execute(
            "select id, stage from documents where status = 'rejected' and reason != 'near_semantic'"
        ).fetchall()
    from datapipe.stages.semantic import DEFAULT_FASTTEXT_THRESHOLD, DEFAULT_THRESHOLD

    used = threshold if threshold is not None else DEFAULT_THRESHOLD if model is not None else DEFAULT_FASTTEXT_THRESHOLD
    correct = sum(groups[ids[d]] == groups[ids[s]] for d, s, _ in dropped)
    removable = len(texts) - len(set(groups.tolist()))
    size = np.bincount(groups)
    alone = lambda d: bool(size[groups[ids[d]]] == 1)  # noqa: E731  (a document with no copy anywhere)
    before_copies = sum(not alone(d) for d, _ in earlier)
    return {
        "threshold": used,
        "fold_script": fold_script,
        "documents": len(texts),
        "dropped_before": len(earlier),
        # clean documents (no copy in the set) lost, by the earlier stages and by semantic
        "clean_lost_before": sum(alone(d) for d, _ in earlier),
        "clean_lost": sum(alone(d) for d, _, _ in dropped),
        # copies the earlier stages (dedup, minhash) removed, and what semantic found of the rest
        "copies_removed_before": before_copies,
        "recall_of_what_was_left": correct / (removable - before_copies) if removable > before_copies else None,
        "dropped": len(dropped),
        "wrong": len(dropped) - int(correct),
        "below_threshold": sum(1 for _, _, sim in dropped if sim < used),
        "lowest_similarity": min((sim for _, _, sim in dropped), default=None),
        "precision": correct / len(dropped) if dropped else 1.0,
        "recall": correct / removable if removable else None,
        "removable": removable,
        "seconds": round(seconds, 1),
        "warnings": pipeline.warnings if hasattr(pipeline, "warnings") else [],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--negatives", type=int, default=10_000)
    ap.add_argument("--no-stage", action="store_true")
    ap.add_argument(
        "--no-sweep", action="store_true", help="only the stage runs (the embeddings' cosines do not depend on the stage's rule)"
    )
    ap.add_argument("--embedders", nargs="+", choices=["fasttext", "static"], default=["fasttext", "static"])
    ap.add_argument("--runs", nargs="+", default=[], help="only the stage runs whose label contains one of these (e.g. clean)")
    args = add_args(ap, repeats=1).parse_args(argv)
    h = Harness("semantic_eval", args, libs=["fasttext", "safetensors", "tokenizers"])
    texts, groups, pairs = eval_set()
    neg_pairs = negatives(groups, args.negatives)
    print(
        f"{len(texts)} documents; positives: "
        + ", ".join(f"{k} {len(v)}" for k, v in pairs.items())
        + f"; negatives {len(neg_pairs)}"
    )
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        embedders: dict = {}
        if "fasttext" in args.embedders and not args.no_sweep:
            t0 = time.perf_counter()
            train_fasttext(texts, Path(tmp) / "ft.bin", dim=64, epoch=5, seed=0)
            embedders["fasttext"] = FastTextEmbedder(Path(tmp) / "ft.bin")
            print(f"fastText trained in {time.perf_counter() - t0:.1f} s")
        if "static" in args.embedders:
            build_static_model(texts, Path(tmp) / "static", dim=256)
            embedders["static"] = StaticEmbedder(Path(tmp) / "static")
        from datapipe.dedup.fold import fold_traditional

        folded = fold_traditional(texts)
        sweeps = [] if args.no_sweep else [(f"{n}{suffix}", e) for n, e in embedders.items() for suffix in ("", "+fold_script")]
        for name, emb in sweeps:
            v = emb.encode(folded if name.endswith("+fold_script") else texts)
            pos = {k: scores(v, np.asarray(p)) for k, p in pairs.items()}
            neg = scores(v, neg_pairs)
            rows, safe = sweep(pos, neg)
            top = [(float(neg[k]), texts[neg_pairs[k][0]][:40], texts[neg_pairs[k][1]][:40]) for k in np.argsort(-neg)[:3]]
            print(
                f"\n{name}: negatives max {neg.max():.4f}, 99.9th pct {np.quantile(neg, 0.999):.4f}; lowest safe threshold {safe}"
            )
            print(" ".join(f"{k} positives min/median {p.min():.3f}/{np.median(p):.3f};" for k, p in pos.items()))
            print(f"{'thr':>5} {'P':>6} " + " ".join(f"{'R ' + k:>9}" for k in pos) + f" {'false':>6}")
            for r in rows:
                print(
                    f"{r['threshold']:>5} {r['precision']:6.3f} "
                    + " ".join(f"{r['recall_' + k]:9.3f}" for k in pos)
                    + f" {r['false_pairs']:>6}"
                )
            print("most similar negatives: " + "; ".join(f"{c:.3f} {a!r} / {b!r}" for c, a, b in top))
            results[name] = {"negatives_max": float(neg.max()), "safe_threshold": safe, "sweep": rows, "top_negatives": top}
        if not args.no_stage:
            clean, clean_groups = held_out()
            dedup = ({"dedup": {"exact": True}}, {"minhash": {}})  # as the stage's page says: after them
            runs = {
                # the setting a new user tried: no model, 0.9
                "fasttext 0.9": ("fasttext", 0.9, False, texts, groups, ()),
                # the documented defaults: no model (0.995; 0.99 before), a model (0.9)
                "fasttext 0.99, fold_script": ("fasttext", 0.99, True, texts, groups, ()),
                "fasttext default, fold_script": ("fasttext", None, True, texts, groups, ()),
                "static default, fold_script": ("static", None, True, texts, groups, ()),
                "static 0.8, fold_script": ("static", 0.8, True, texts, groups, ()),
                # held-out clean text with planted paraphrases, at the defaults (after dedup and
                # minhash, as the page says, and alone) and at 0.9 without a model: no clean
                # document should go, the paraphrases should
                "clean: fasttext default": ("fasttext", None, False, clean, clean_groups, dedup),
                "clean: static default": ("static", None, False, clean, clean_groups, dedup),
                "clean alone: fasttext default": ("fasttext", None, False, clean, clean_groups, ()),
                "clean alone: static default": ("static", None, False, clean, clean_groups, ()),
                "clean alone: fasttext 0.9": ("fasttext", 0.9, False, clean, clean_groups, ()),
            }
            if "static" in args.embedders:
                build_static_model(clean, Path(tmp) / "static-clean", dim=256)
            for label, (name, thr, fold, docs, grp, before) in runs.items():
                if name not in args.embedders or (args.runs and not any(r in label for r in args.runs)):
                    continue
                model = (Path(tmp) / ("static-clean" if label.startswith("clean") else "static")) if name == "static" else None
                work = Path(tmp) / ("stage-" + label.replace(" ", "-").replace(",", "").replace(":", ""))
                results[f"stage {label}"] = stage_run(docs, grp, thr, work, model, fold, before)
                print(f"\nstage ({label}): {results[f'stage {label}']}", flush=True)
    h.finish(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
