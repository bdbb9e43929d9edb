"""The semantic stage's Hugging Face encoder on a GPU against the same encoder on the CPU (issue 32).

    python -m bench.gpu.gpu_encoder_check --prepare .gpudata          # here: a 4-layer BERT encoder (hidden
                                                                  # 256, WordPiece trained on the corpus)
    python -m bench.gpu.gpu_encoder_check --data .gpudata --json $OUT/gpu_encoder.json   # on the GPU machine

Embeds the same real documents with ``TransformerEmbedder`` (the class the stage loads) on the CPU
and with ``device="cuda"``, and prints the largest difference between the vectors, documents/s on
each, and whether the similar pairs at the stage's thresholds are the same on both sets of vectors.
The weights are random (no model hub here): the check is of the code path, not of the embedding's
quality (bench/quality/semantic_eval.py measures that).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from datapipe.dedup.embed_models import TransformerEmbedder
from datapipe.dedup.semantic import similar_pairs


def prepare(data: Path) -> None:
    from tests.support.tiny_transformer import save_encoder

    texts = pq.read_table(data / "docs.parquet", columns=["text"])["text"].to_pylist()
    save_encoder(data / "encoder", texts[:3000], seed=1, hidden=256, layers=4, max_positions=512)
    print(f"wrote {data / 'encoder'}")


def check(data: Path, n: int, out: Path | None) -> dict:
    import torch

    texts = pq.read_table(data / "docs.parquet", columns=["text"])["text"].to_pylist()[:n]
    result: dict = {"documents": len(texts), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    vectors = {}
    for device in ("cpu", "cuda"):
        embedder = TransformerEmbedder(data / "encoder", max_tokens=256, batch_size=64, device=device)
        embedder.encode(texts[:64])  # warm-up: kernels, allocator
        started = time.perf_counter()
        vectors[device] = embedder.encode(texts)
        seconds = time.perf_counter() - started
        result[f"{device}_s"] = seconds
        result[f"{device}_docs_per_s"] = len(texts) / seconds
        print(f"{device}: {len(texts):,} documents in {seconds:.2f} s ({len(texts) / seconds:,.0f}/s)", flush=True)
    result["max_abs_diff"] = float(np.abs(vectors["cpu"] - vectors["cuda"]).max())
    result["pairs"] = {}
    for threshold in (0.99, 0.95, 0.9):
        got = {d: set(zip(*(a.tolist() for a in similar_pairs(v, threshold)[:2]))) for d, v in vectors.items()}
        result["pairs"][str(threshold)] = {
            "cpu": len(got["cpu"]),
            "cuda": len(got["cuda"]),
            "only_cpu": len(got["cpu"] - got["cuda"]),
            "only_cuda": len(got["cuda"] - got["cpu"]),
        }
    print(json.dumps(result, indent=1))
    if out:
        out.write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(".gpudata"))
    ap.add_argument("--prepare", type=Path, help="write the encoder folder into this data folder and stop")
    ap.add_argument("--documents", type=int, default=4000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.prepare:
        prepare(a.prepare)
    else:
        check(a.data, a.documents, a.json)


if __name__ == "__main__":
    main()
