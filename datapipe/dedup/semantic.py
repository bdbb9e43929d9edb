"""SemDeDup's pieces (Abbas et al. 2023): spherical k-means over unit vectors, exact pairwise cosine
inside each k-means cluster, and the rule that drops a document only for a kept one
(``keep_in_order``).

Determinism comes first (a rerun, or a run on 1 or 2 workers, must give the same bytes): k-means
starts from a seeded choice of distinct sample points and runs a fixed number of Lloyd steps in
float64 with ties broken by the lower centroid index; its input is the sample in row-key order.
Pairwise cosine is a float32 matrix product in blocks of ``block`` rows (memory: block x cluster
size floats), and similarities are rounded to 6 decimals before they are compared with the
threshold, so a last-bit difference between BLAS builds cannot flip a pair.

The same three functions run on a GPU with torch when given ``device`` (``resolve_device``: torch
stays an optional import, the CPU path never needs it). They compute what the numpy path does, in
the same precisions (float64 k-means and assignment, float32 pairwise cosine with TF32 switched
off), decide with the same rounding and ties, and sum k-means clusters with a one-hot matrix
product (deterministic on a GPU, unlike scattered atomic adds). A GPU sums in another order than
BLAS on a CPU, so a cosine can differ in its last bits: it decides differently only where the
rounded value sits exactly on a rounding edge at the threshold (measured: docs/stages/semantic.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from datapipe.dedup.shingles import HAVE_NUMBA
from datapipe.errors import UsageError

SIM_DECIMALS = 6
DEVICES = ("auto", "cpu", "cuda")


class SemanticDeviceError(UsageError):
    """``device: cuda`` where this process has no GPU torch can use (exit code 2)."""


def resolve_device(device: str, key: str = "device") -> str | None:
    """The torch device to compute on, or None for the numpy path.

    ``cpu``: numpy. ``auto``: ``cuda`` where torch is installed and sees a GPU, else numpy; where the
    process was given no GPU (``CUDA_VISIBLE_DEVICES`` empty, as Ray sets it for a task that asked
    for none, or no NVIDIA driver) torch is not even imported. ``cuda``: a GPU, or an error naming
    ``key``. ``torch-cpu`` runs the torch code on the CPU (tests compare it with numpy)."""
    if device == "cpu":
        return None
    if device == "torch-cpu":
        return "cpu"
    if device not in DEVICES:
        raise SemanticDeviceError(f"{key}: {device!r} is not one of {', '.join(DEVICES)}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    no_gpu = visible is not None and visible.strip() in ("", "-1")
    no_driver = not (os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0"))
    has_gpu = False
    if not (no_gpu or no_driver):
        try:
            import torch

            has_gpu = bool(torch.cuda.is_available())
        except ImportError:
            has_gpu = False
    if has_gpu:
        return "cuda"
    if device == "cuda":
        raise SemanticDeviceError(
            f"{key}: cuda, but this process sees no GPU torch can use (torch missing, no NVIDIA driver, "
            f"CUDA_VISIBLE_DEVICES={visible!r}, or torch.cuda.is_available() is False)",
            hint="use device: auto (a GPU where the node has one, else the CPU) or device: cpu",
        )
    return None


def _torch() -> Any:
    import torch

    return torch


@contextmanager
def _exact_float32(torch: Any) -> Iterator[None]:
    """float32 matrix products in full float32 (no TF32), as on a CPU; restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def kmeans(vectors: np.ndarray, k: int, seed: int, iterations: int, device: str | None = None) -> np.ndarray:
    """(k', dim) unit centroids of ``vectors`` (unit rows), k' = min(k, distinct rows); the Lloyd
    steps on the torch ``device`` when one is given (``resolve_device``)."""
    x = np.asarray(vectors, dtype=np.float64)
    if len(x) == 0:
        return np.empty((0, x.shape[1] if x.ndim == 2 else 0), np.float32)
    _, first = np.unique(x, axis=0, return_index=True)
    distinct = np.sort(first)
    k = max(1, min(k, len(distinct)))
    rng = np.random.default_rng(seed)
    centroids = x[np.sort(rng.choice(distinct, size=k, replace=False))]
    if device is not None:
        return _kmeans_torch(x, centroids, iterations, device)
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


def _kmeans_torch(x: np.ndarray, centroids: np.ndarray, iterations: int, device: str, block: int = 65536) -> np.ndarray:
    """The Lloyd steps of ``kmeans`` with torch: float64, the same rounding, ties and stop rule.
    Cluster sums are a one-hot (k x rows) matrix product per block of rows: deterministic."""
    torch = _torch()
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    c = torch.from_numpy(np.ascontiguousarray(centroids)).to(device)
    k = c.shape[0]
    for _ in range(iterations):
        labels = _nearest_torch(torch, xt, c)
        sums = torch.zeros_like(c)
        for s in range(0, len(xt), block):
            part = labels[s : s + block]
            onehot = torch.zeros((k, len(part)), dtype=xt.dtype, device=xt.device)
            onehot[part, torch.arange(len(part), device=xt.device)] = 1.0
            sums += onehot @ xt[s : s + block]
        norm = torch.linalg.norm(sums, dim=1, keepdim=True)
        moved = torch.where(norm > 0, sums / torch.where(norm > 0, norm, torch.ones_like(norm)), c)
        if torch.equal(moved, c):
            break
        c = moved
    return c.cpu().numpy().astype(np.float32)


def _nearest_torch(torch: Any, x: Any, c: Any, block: int = 65536) -> Any:
    out = torch.empty(len(x), dtype=torch.int64, device=x.device)
    for s in range(0, len(x), block):
        sims = torch.round(x[s : s + block] @ c.T, decimals=SIM_DECIMALS)
        out[s : s + block] = torch.argmax(sims, dim=1)  # the first maximum, as numpy's
    return out


def nearest(vectors: np.ndarray, centroids: np.ndarray, block: int = 8192, device: str | None = None) -> np.ndarray:
    """Index of each row's most similar centroid (highest dot product; ties: the lower index)."""
    if device is not None:
        torch = _torch()
        x = torch.from_numpy(np.asarray(vectors, dtype=np.float64)).to(device)
        c = torch.from_numpy(np.asarray(centroids, dtype=np.float64)).to(device)
        return _nearest_torch(torch, x, c).cpu().numpy().astype(np.int32)
    c = np.asarray(centroids, dtype=np.float64)
    out = np.empty(len(vectors), np.int32)
    for s in range(0, len(vectors), block):
        sims = np.round(np.asarray(vectors[s : s + block], dtype=np.float64) @ c.T, SIM_DECIMALS)
        out[s : s + block] = np.argmax(sims, axis=1)  # argmax returns the first maximum
    return out


def similar_pairs(
    vectors: np.ndarray, threshold: float, block: int = 2048, device: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair (i, j), i < j, of rows whose cosine (rounded) reaches ``threshold``: (i, j, cosine),
    sorted by i then j. Rows are unit vectors; a block of rows at a time against the rows after it."""
    if device is not None:
        return _similar_pairs_torch(vectors, threshold, block, device)
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
    return _pairs(found_i, found_j, found_s)


def _pairs(
    found_i: list[np.ndarray], found_j: list[np.ndarray], found_s: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks' pairs as (i, j, cosine) arrays, in block order."""
    if not found_i:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    return (
        np.concatenate(found_i).astype(np.int64),
        np.concatenate(found_j).astype(np.int64),
        np.concatenate(found_s).astype(np.float32),
    )


def _similar_pairs_torch(
    vectors: np.ndarray, threshold: float, block: int, device: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``similar_pairs`` with torch: float32 products (no TF32), the same rounding and order."""
    torch = _torch()
    x = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(device)
    n = len(x)
    found_i, found_j, found_s = [], [], []
    with _exact_float32(torch):
        for s in range(0, n, block):
            e = min(n, s + block)
            sims = torch.round(x[s:e] @ x[s:].T, decimals=SIM_DECIMALS)
            rows, cols = torch.nonzero(sims >= threshold, as_tuple=True)  # row-major, as numpy's
            keep = cols > rows  # j = cols + s > i = rows + s
            rows, cols = rows[keep], cols[keep]
            found_i.append((rows + s).cpu().numpy())
            found_j.append((cols + s).cpu().numpy())
            found_s.append(sims[rows, cols].cpu().numpy())
    return _pairs(found_i, found_j, found_s)


def _keep_in_order(earlier, later, sim, kept, dup, dup_sim):
    for k in range(later.shape[0]):
        x, e = later[k], earlier[k]
        if kept[e] and (dup[x] < 0 or sim[k] > dup_sim[x]):
            dup[x] = e
            dup_sim[x] = sim[k]
            kept[x] = False


def keep_in_order(n: int, earlier: np.ndarray, later: np.ndarray, sim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SemDeDup's rule over ``n`` documents numbered in keep order (0 is kept first): walk them in that
    order and drop a document that is at least the threshold similar to one already *kept*; a
    document close only to dropped ones is kept, so no chain A-B-C drops C for A.

    ``earlier < later``, ``sim``: the pairs at or above the threshold and their cosine. Returns, per
    document, the kept document it is dropped for (-1: kept), the most similar such one (ties: the
    first in keep order), and that cosine."""
    order = np.lexsort((earlier, later))  # a document's pairs after those of every document before it
    e = np.ascontiguousarray(earlier[order], np.int64)
    x = np.ascontiguousarray(later[order], np.int64)
    s = np.ascontiguousarray(sim[order], np.float64)
    kept = np.ones(n, dtype=np.bool_)
    dup = np.full(n, -1, np.int64)
    dup_sim = np.zeros(n, np.float64)
    _keep_in_order(e, x, s, kept, dup, dup_sim)
    return dup, dup_sim


if HAVE_NUMBA:
    from datapipe.runtime.jit import lazy_numba

    numba = lazy_numba()  # compiled (or loaded from the cache) on first use
    _keep_in_order = numba.njit(cache=True, nogil=True)(_keep_in_order)
