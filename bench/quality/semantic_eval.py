"""Precision/recall of the ``semantic`` stage's embeddings on real paraphrase-like pairs, and the
most similar unrelated pair among 10,000 random ones.

    python -m bench.quality.semantic_eval [--negatives 10000] [--stage-threshold T] [--json PATH]

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
whole set (in-process) at ``--stage-threshold`` (default: that threshold for fastText) and its
drops are scored per document (k-means splits included).
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
THRESHOLDS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99]


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


def stage_run(texts: list[str], groups: np.ndarray, threshold: float, work: Path, model: Path | None = None) -> dict:
    """The stage on the whole set (fold_script, in-process; fastText mode without ``model``):
    per-document precision and recall."""
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
    cfg = {
        "name": "sem",
        "sources": [{"name": "s", "paths": ["data/*.jsonl"]}],
        "stages": [{"semantic": {"threshold": threshold, "partitions": 4, "clusters": 16, "fold_script": True}}],
    }
    if model is not None:
        cfg["stages"][0]["semantic"]["model"] = str(model)
    (work / "pipeline.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    t0 = time.perf_counter()
    run_pipeline(
        load_pipeline(work / "pipeline.yaml"), output=work / "out", show_progress=False, in_process=True, log=lambda m: None
    )
    seconds = time.perf_counter() - t0
    with connect(work / "out") as con:
        dropped = con.execute("select id, dup_of from documents where reason = 'near_semantic'").fetchall()
    correct = sum(groups[ids[d]] == groups[ids[s]] for d, s in dropped)
    removable = len(texts) - len(set(groups.tolist()))
    return {
        "threshold": threshold,
        "dropped": len(dropped),
        "precision": correct / len(dropped) if dropped else 1.0,
        "recall": correct / removable,
        "removable": removable,
        "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--negatives", type=int, default=10_000)
    ap.add_argument("--stage-threshold", type=float, default=None)
    ap.add_argument("--no-stage", action="store_true")
    ap.add_argument("--embedders", nargs="+", choices=["fasttext", "static"], default=["fasttext", "static"])
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
        if "fasttext" in args.embedders:
            t0 = time.perf_counter()
            train_fasttext(texts, Path(tmp) / "ft.bin", dim=64, epoch=5, seed=0)
            embedders["fasttext"] = FastTextEmbedder(Path(tmp) / "ft.bin")
            print(f"fastText trained in {time.perf_counter() - t0:.1f} s")
        if "static" in args.embedders:
            build_static_model(texts, Path(tmp) / "static", dim=256)
            embedders["static"] = StaticEmbedder(Path(tmp) / "static")
        from datapipe.dedup.fold import fold_traditional

        folded = fold_traditional(texts)
        for name, emb in [(f"{n}{suffix}", e) for n, e in embedders.items() for suffix in ("", "+fold_script")]:
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
        for name in [] if args.no_stage else args.embedders:
            thr = args.stage_threshold or results[f"{name}+fold_script"]["safe_threshold"]
            model = Path(tmp) / "static" if name == "static" else None
            results[f"stage_{name}"] = stage_run(texts, groups, thr, Path(tmp) / f"stage-{name}", model)
            print(f"\nstage ({name}, fold_script, threshold {thr}): {results[f'stage_{name}']}")
    h.finish(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
