"""The GPU checks of issues 31, 32 and 33 in one run (one short call on a GPU machine), on the inputs
``bench/gpu/gpu_prepare.py`` made from ../shared/data (``--data``, default ``.gpudata``):

    python -m bench.gpu.gpu_checks [--data .gpudata] [--json $OUT/gpu_checks.json] [--device cuda] [--budget 330]

1. ``semantic`` (issue 32): ``datapipe.dedup.semantic``'s k-means, assignment and within-cluster
   pairwise cosine on the GPU (``device="cuda"``) against the numpy path, on real documents embedded
   by a static model built from them (plus paraphrased copies, so there are near-duplicates): the
   same centroids, clusters, pairs and survivors? (counts of any difference, and the pairs whose
   rounded cosine sits within 1e-6 of the threshold), and the time of each side.
2. ``classify`` (issue 31): ``TransformerClassifier`` (what the classify stage calls) of a BERT with
   4 layers, hidden 256 (random weights, WordPiece trained on the documents), on ``cpu`` and on the
   GPU: largest score difference (must be < 1e-4) and docs/s of each.
3. ``ablate`` (issue 33): ``datapipe.ablate.train.train`` (what ``datapipe ablate`` calls for one
   candidate and seed) of the ``small`` size (1,200 steps x 32 x 512 tokens) on the packed candidate,
   then ``evaluate`` on its held-out rows. Every step is timed (through the trainer's per-step
   ``fault_point``); if the run would pass the time left (``--budget`` seconds for the whole
   script), it stops there and the wall time of the whole candidate is extrapolated from the
   steady step time (said so in the output).

Each part runs in its own try block: one failing does not lose the others. ``--device cpu`` runs
the same code on the CPU (to check the script where there is no GPU; the ablate part then trains
``--cpu-steps`` steps of batch 2 only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

START = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - START


def say(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def versions(device: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cpus": os.cpu_count(),
        "device": device,
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["gpu"] = torch.cuda.get_device_name(0)
    for name in ("transformers", "tokenizers", "pydantic", "pyarrow"):
        try:
            out[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            out[name] = f"missing ({exc})"
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def paraphrase(text: str, rng: Any) -> str:
    """Sentences reordered and about one in six left out (as the semantic tests' copies)."""
    import re

    sents = [s for s in re.split(r"(?<=[.。])\s*", text) if s.strip()]
    rng.shuffle(sents)
    if len(sents) >= 3:
        sents = sents[: len(sents) - max(1, len(sents) // 6)]
    return " ".join(sents).replace(",", ";").replace("，", "、")


# -- 1. semantic -------------------------------------------------------------------------------------


def check_semantic(data: Path, device: str, docs: int) -> dict[str, Any]:
    import random

    from datapipe.dedup.cluster import UnionFind, survivors
    from datapipe.dedup.embed import StaticEmbedder
    from datapipe.dedup.semantic import kmeans, nearest, similar_pairs
    from tests.support.static_embedding import build_static_model

    texts = [t for t in pq.read_table(data / "docs.parquet", columns=["text"])["text"].to_pylist() if len(t) > 200][:docs]
    rng = random.Random(0)
    originals = rng.sample(range(len(texts)), len(texts) // 8)
    texts += [paraphrase(texts[i], rng) for i in originals]
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        model = build_static_model(texts, Path(tmp) / "m", dim=256)
        vectors = StaticEmbedder(model).encode(texts)
        embed_s = time.perf_counter() - t
    vectors = vectors[np.linalg.norm(vectors, axis=1) > 0]
    say(f"semantic: {len(vectors):,} documents embedded (dim 256) in {embed_s:.1f} s on the CPU")
    out: dict[str, Any] = {"documents": len(vectors), "copies": len(originals), "embed_cpu_s": embed_s}
    k, seed, iters = 64, 0, 20

    def timed(fn: Any, dev: str | None) -> tuple[Any, float]:
        fn(None if dev is None else dev)  # warm-up (CUDA context, kernels, BLAS threads)
        sync(dev or "cpu")
        t = time.perf_counter()
        r = fn(dev)
        sync(dev or "cpu")
        return r, time.perf_counter() - t

    c_cpu, out["kmeans_cpu_s"] = timed(lambda d: kmeans(vectors, k, seed, iters, device=d), None)
    c_gpu, out["kmeans_gpu_s"] = timed(lambda d: kmeans(vectors, k, seed, iters, device=d), device)
    out["centroids_bytes_equal"] = c_cpu.tobytes() == c_gpu.tobytes()
    out["centroids_max_abs_diff"] = float(np.abs(c_cpu - c_gpu).max())
    l_cpu, out["nearest_cpu_s"] = timed(lambda d: nearest(vectors, c_cpu, device=d), None)
    l_gpu, out["nearest_gpu_s"] = timed(lambda d: nearest(vectors, c_cpu, device=d), device)
    out["assignments_differing"] = int((l_cpu != l_gpu).sum())
    out["assignments_with_gpu_centroids_differing"] = int((nearest(vectors, c_gpu) != l_cpu).sum())
    say(
        f"semantic: k-means {out['kmeans_cpu_s']:.2f} s cpu / {out['kmeans_gpu_s']:.2f} s gpu, centroids equal "
        f"{out['centroids_bytes_equal']} (max diff {out['centroids_max_abs_diff']:.2e}); assignments differing "
        f"{out['assignments_differing']} (with the GPU's centroids: {out['assignments_with_gpu_centroids_differing']})"
    )
    order = np.argsort(l_cpu, kind="stable")
    sizes = np.bincount(l_cpu, minlength=len(c_cpu))
    out["largest_cluster"] = int(sizes.max())
    per_threshold = {}
    for threshold in (0.9, 0.8, 0.7, 0.5):
        res: dict[str, Any] = {}
        for side, dev in (("cpu", None), ("gpu", device)):
            pairs_n, pair_set, dropped = 0, set(), set()
            similar_pairs(vectors[:64], threshold, device=dev)  # warm-up
            sync(dev or "cpu")
            t = time.perf_counter()
            start = 0
            for c in range(len(c_cpu)):
                rows = order[start : start + sizes[c]]
                start += sizes[c]
                if len(rows) < 2:
                    continue
                i, j, _ = similar_pairs(vectors[rows], threshold, device=dev)
                pairs_n += len(i)
                pair_set.update(zip(rows[i].tolist(), rows[j].tolist()))
                if len(i):
                    uf = UnionFind(len(rows))
                    uf.union(i, j)
                    roots = uf.roots()
                    surv = survivors(roots, "earliest")
                    dropped.update(rows[np.flatnonzero(surv != np.arange(len(rows)))].tolist())
            sync(dev or "cpu")
            res[f"{side}_s"] = time.perf_counter() - t
            res[f"{side}_pairs"] = pairs_n
            res[f"_{side}_set"], res[f"_{side}_dropped"] = pair_set, dropped
        res["pairs_only_cpu"] = len(res["_cpu_set"] - res["_gpu_set"])
        res["pairs_only_gpu"] = len(res["_gpu_set"] - res["_cpu_set"])
        res["dropped"] = len(res["_cpu_dropped"])
        res["dropped_differing"] = len(res["_cpu_dropped"] ^ res["_gpu_dropped"])
        # pairs whose rounded cosine is within 1e-6 of the threshold: the only ones a last-bit difference can flip
        both = np.array(sorted(res["_cpu_set"] | res["_gpu_set"]), dtype=np.int64).reshape(-1, 2)
        sims = np.round(np.einsum("ij,ij->i", vectors[both[:, 0]], vectors[both[:, 1]]), 6)
        res["pairs_within_1e-6_of_threshold"] = int((np.abs(sims - threshold) <= 1e-6 + 1e-9).sum())
        for key in ("_cpu_set", "_gpu_set", "_cpu_dropped", "_gpu_dropped"):
            del res[key]
        per_threshold[str(threshold)] = res
        say(
            f"semantic: threshold {threshold}: pairs cpu {res['cpu_pairs']:,} gpu {res['gpu_pairs']:,} (only cpu "
            f"{res['pairs_only_cpu']}, only gpu {res['pairs_only_gpu']}), dropped {res['dropped']:,} (differing "
            f"{res['dropped_differing']}); {res['cpu_s']:.2f} s cpu / {res['gpu_s']:.2f} s gpu"
        )
    out["pairs"] = per_threshold
    # one big cluster: every vector against every other (the scale where a GPU pays)
    for side, dev in (("cpu", None), ("gpu", device)):
        similar_pairs(vectors[:64], 0.9, device=dev)
        sync(dev or "cpu")
        t = time.perf_counter()
        i, _, _ = similar_pairs(vectors, 0.9, device=dev)
        sync(dev or "cpu")
        out[f"one_cluster_{side}_s"] = time.perf_counter() - t
        out[f"one_cluster_{side}_pairs"] = int(len(i))
    say(
        f"semantic: all {len(vectors):,} as one cluster: {out['one_cluster_cpu_s']:.2f} s cpu "
        f"({out['one_cluster_cpu_pairs']:,} pairs) / {out['one_cluster_gpu_s']:.2f} s gpu "
        f"({out['one_cluster_gpu_pairs']:,} pairs)"
    )
    return out


# -- 2. classify ------------------------------------------------------------------------------------


def check_classify(data: Path, device: str, docs: int) -> dict[str, Any]:
    import torch

    from datapipe.classify.transformer import TransformerClassifier
    from tests.support.tiny_transformer import save_model

    table = pq.read_table(data / "docs.parquet", columns=["text", "lang"])
    texts_all, langs = table["text"].to_pylist(), table["lang"].to_pylist()
    en = [t for t, lang in zip(texts_all, langs) if lang == "en"]
    zh = [t for t, lang in zip(texts_all, langs) if lang == "zh"]
    train = [t[:2000] for t in zh[:200] + en[:200]]  # what tiny_transformer.corpus_texts reads
    texts = [t[:100_000] for t in en[1000 : 1000 + docs * 9 // 10] + zh[500 : 500 + docs // 10]]
    out: dict[str, Any] = {"documents": len(texts), "layers": 4, "hidden": 256, "max_tokens": 256}
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_model(
            Path(tmp) / "m", train, ["low", "high"], hidden=256, layers=4, heads=4, max_positions=512, init_range=0.2
        )
        threads = torch.get_num_threads()
        cpu = TransformerClassifier.load(folder, "cpu")
        cpu.scores(texts[:32], 256, 32)
        t = time.perf_counter()
        s_cpu = cpu.scores(texts, 256, 32)
        out["cpu_s"] = time.perf_counter() - t
        out["cpu_threads"] = threads
        gpu = TransformerClassifier.load(folder, device)
        gpu.scores(texts[:64], 256, 64)
        sync(device)
        t = time.perf_counter()
        s_gpu = gpu.scores(texts, 256, 64)
        sync(device)
        out["gpu_s"] = time.perf_counter() - t
        out["device_used"] = gpu.device
    out["max_abs_diff"] = float(np.abs(s_cpu - s_gpu).max())
    out["within_1e-4"] = bool(out["max_abs_diff"] < 1e-4)
    out["score_spread"] = [float(s_cpu[:, 1].min()), float(s_cpu[:, 1].max())]
    out["cpu_docs_per_s"] = len(texts) / out["cpu_s"]
    out["gpu_docs_per_s"] = len(texts) / out["gpu_s"]
    say(
        f"classify: {len(texts)} docs, max |cpu - gpu| {out['max_abs_diff']:.2e} (< 1e-4: {out['within_1e-4']}); "
        f"cpu ({threads} threads) {out['cpu_docs_per_s']:.0f} docs/s, {out['device_used']} {out['gpu_docs_per_s']:.0f} docs/s "
        f"({out['gpu_docs_per_s'] / out['cpu_docs_per_s']:.1f}x)"
    )
    return out


# -- 3. ablate --------------------------------------------------------------------------------------


class _OutOfTime(Exception):
    pass


def check_ablate(data: Path, device: str, budget: float, cpu_steps: int) -> dict[str, Any]:
    import torch

    import datapipe.ablate.train as train_mod
    from datapipe.ablate.evaluate import EvalSet, evaluate
    from datapipe.ablate.sizes import model_config

    cfg = model_config("small")
    if not device.startswith("cuda"):
        cfg = cfg.with_overrides(steps=cpu_steps, warmup=min(cfg.warmup, cpu_steps), batch_size=2)  # a dry run
    out: dict[str, Any] = {"size": "small", "config": cfg.__dict__, "tokens_per_step": cfg.batch_size * cfg.seq_len}
    stamps: list[tuple[int, float]] = []
    deadline = START + budget
    real_fault_point = train_mod.fault_point

    def per_step(name: str, step: int) -> None:  # the trainer calls it after every optimizer step (loss.item() synced)
        real_fault_point(name, step)
        stamps.append((step, time.perf_counter()))
        if time.perf_counter() > deadline and step < cfg.steps:
            raise _OutOfTime

    train_mod.fault_point = per_step  # type: ignore[assignment]
    z = np.load(data / "ablate" / "eval.npz")
    groups = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("tokens:")}
    ntok = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("n_tokens:")}
    ev = EvalSet(groups, ntok, [], int(z["pad_id"]), str(data / "tokenizer.json"))
    dev = train_mod.pick_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        finished = False
        try:
            model, info = train_mod.train(data / "ablate" / "data", None, cfg, 0, Path(tmp) / "run", dev, 0, 50, say)
            finished = True
        except _OutOfTime:
            model, info = None, {}
        finally:
            train_mod.fault_point = real_fault_point  # type: ignore[assignment]
        train_s = time.perf_counter() - t0
        steps_done = stamps[-1][0] if stamps else 0
        times = np.diff([s for _, s in stamps])
        steady = times[min(20, len(times) - 1) :] if len(times) > 1 else times  # past the first steps' warm-up
        step_s = float(statistics.median(steady)) if len(steady) else float("nan")
        mean_step_s = float(np.mean(steady)) if len(steady) else float("nan")  # the checkpoint saves included
        out.update(
            finished=finished,
            steps_done=steps_done,
            train_wall_s=train_s,
            first_step_s=float(stamps[0][1] - t0) if stamps else None,
            median_step_s=step_s,
            mean_step_s=mean_step_s,
            tokens_per_s=out["tokens_per_step"] / mean_step_s,
        )
        if finished and model is not None:
            t = time.perf_counter()
            result = evaluate(model, ev, cfg.seq_len, dev)
            out["eval_s"] = time.perf_counter() - t
            out["heldout_loss"] = result["heldout_loss"]
            out["train_loss_last"] = info.get("train_loss_last")
            out["params"] = info.get("params")
            out["candidate_wall_s"] = train_s + out["eval_s"]
            out["candidate_wall_is"] = "measured (train + evaluate)"
        else:
            out["candidate_wall_s"] = train_s + (cfg.steps - steps_done) * mean_step_s
            out["candidate_wall_is"] = (
                f"extrapolated: stopped at step {steps_done} of {cfg.steps} (time budget), mean step time after warm-up"
            )
    if device.startswith("cuda"):
        out["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    say(
        f"ablate small: {out['steps_done']}/{cfg.steps} steps, {out['tokens_per_s']:,.0f} tokens/s "
        f"(median step {out['median_step_s'] * 1000:.1f} ms), one candidate {out['candidate_wall_s']:.0f} s "
        f"({out['candidate_wall_is']})"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=Path(".gpudata"))
    ap.add_argument("--json", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_checks.json")
    ap.add_argument("--device", default="cuda", help="cuda (the GPU machine) or cpu (a dry run here)")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for the whole script (ablate stops there)")
    ap.add_argument("--semantic-docs", type=int, default=12000)
    ap.add_argument("--classify-docs", type=int, default=400)
    ap.add_argument("--cpu-steps", type=int, default=3, help="--device cpu: ablate steps")
    ap.add_argument("--parts", default="semantic,classify,ablate")
    args = ap.parse_args()
    os.environ.setdefault("DATAPIPE_CACHE_DIR", tempfile.mkdtemp(prefix="datapipe-cache-"))
    report: dict[str, Any] = {}

    def save() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))

    try:
        report["versions"] = versions(args.device)
        say("versions: " + json.dumps(report["versions"]))
    except Exception as exc:  # noqa: BLE001 - each part reports its own failure
        report["versions"] = {"error": repr(exc), "traceback": traceback.format_exc()}
        say(f"versions FAILED: {exc!r}")
    save()
    parts = {
        "semantic": lambda: check_semantic(args.data, args.device, args.semantic_docs),
        "classify": lambda: check_classify(args.data, args.device, args.classify_docs),
        "ablate": lambda: check_ablate(args.data, args.device, args.budget, args.cpu_steps),
    }
    for name in args.parts.split(","):
        t = time.perf_counter()
        try:
            report[name] = parts[name]()
        except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others
            report[name] = {"error": repr(exc), "traceback": traceback.format_exc()}
            say(f"{name} FAILED: {exc!r}\n{traceback.format_exc()}")
        report[name]["part_s"] = time.perf_counter() - t
        save()
    report["total_s"] = elapsed()
    save()
    print("\n== summary ==")
    print(json.dumps({k: v for k, v in report.items() if k != "versions"}, indent=1, default=str)[:9000])
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
