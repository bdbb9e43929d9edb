"""SemDeDup's pieces (Abbas et al. 2023): spherical k-means over unit vectors, then exact pairwise
cosine inside each k-means cluster.

Determinism comes first (a rerun, or a run on 1 or 2 workers, must give the same bytes): k-means
starts from a seeded choice of distinct sample points and runs a fixed number of Lloyd steps in
float64 with ties broken by the lower centroid index; its input is the sample in row-key order.
Pairwise cosine is a float32 matrix product in blocks of ``block`` rows (memory: block x cluster
size floats), and similarities are rounded to 6 decimals before they are compared with the
threshold, so a last-bit difference between BLAS builds cannot flip a pair.
"""

from __future__ import annotations

import numpy as np

SIM_DECIMALS = 6


def kmeans(vectors: np.ndarray, k: int, seed: int, iterations: int) -> np.ndarray:
    """(k', dim) unit centroids of ``vectors`` (unit rows), k' = min(k, distinct rows)."""
    x = np.asarray(vectors, dtype=np.float64)
    if len(x) == 0:
        return np.empty((0, x.shape[1] if x.ndim == 2 else 0), np.float32)
    _, first = np.unique(x, axis=0, return_index=True)
    distinct = np.sort(first)
    k = max(1, min(k, len(distinct)))
    rng = np.random.default_rng(seed)
    centroids = x[np.sort(rng.choice(distinct, size=k, replace=False))]
    for _ in range(iterations):
        labels = nearest(x, centroids)
        sums = np.zeros_like(centroids)
        np.add.at(sums, labels, x)
        norm = np.linalg.norm(sums, axis=1, keepdims=True)
        moved = np.where(norm > 0, sums / np.where(norm > 0, norm, 1), centroids)  # an empty cluster stays put
        if np.array_equal(moved, centroids):
            break
        centroids = moved
    return centroids.astype(np.float32)


def nearest(vectors: np.ndarray, centroids: np.ndarray, block: int = 8192) -> np.ndarray:
    """Index of each row's most similar centroid (highest dot product; ties: the lower index)."""
    c = np.asarray(centroids, dtype=np.float64)
    out = np.empty(len(vectors), np.int32)
    for s in range(0, len(vectors), block):
        sims = np.round(np.asarray(vectors[s : s + block], dtype=np.float64) @ c.T, SIM_DECIMALS)
        out[s : s + block] = np.argmax(sims, axis=1)  # argmax returns the first maximum
    return out


def similar_pairs(vectors: np.ndarray, threshold: float, block: int = 2048) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair (i, j), i < j, of rows whose cosine (rounded) reaches ``threshold``: (i, j, cosine),
    sorted by i then j. Rows are unit vectors; a block of rows at a time against the rows after it."""
    x = np.asarray(vectors, dtype=np.float32)
    n = len(x)
    found_i, found_j, found_s = [], [], []
    for s in range(0, n, block):
        e = min(n, s + block)
        sims = np.round(x[s:e] @ x[s:].T, SIM_DECIMALS)
        rows, cols = np.nonzero(sims >= threshold)
        i, j = rows + s, cols + s
        keep = j > i
        found_i.append(i[keep])
        found_j.append(j[keep])
        found_s.append(sims[rows[keep], cols[keep]])
    if not found_i:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    return (
        np.concatenate(found_i).astype(np.int64),
        np.concatenate(found_j).astype(np.int64),
        np.concatenate(found_s).astype(np.float32),
    )
