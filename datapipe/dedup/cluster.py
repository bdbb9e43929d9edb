"""LSH clustering: band-key buckets -> candidate pairs -> verified pairs -> union-find components ->
survivors. The one path of both the in-memory clustering (``cluster_duplicates``) and the distributed
minhash stage (``datapipe.stages.minhash``), which call the same steps: ``verified_pairs`` per band
or partition, ``union_of`` over sparse row keys, ``settle`` for clusters and survivors.

Memory is linear in the number of documents and bounded per step: bands are processed one at a
time (a band column may be a slice of an ``np.memmap``), each band allocates a few int64/uint64
arrays of n entries (sort order, sorted keys, edges), and the only state kept across bands is
the int64 union-find parent array. There is no per-document Python object.

Distributed use (``datapipe.stages.minhash``): shuffle ``(doc_index, band_key)`` rows by
``minhash.partition_of(key, P)`` -- keys already mix in the band index, so all bands can share
one shuffle -- call ``verified_pairs`` and ``spanning_forest`` per partition, then find the
components of all partitions' forests in star rounds partitioned by document
(``datapipe.dedup.components``) and pick each cluster's ``survivors`` where it is settled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from datapipe.dedup.shingles import HAVE_NUMBA

SURVIVOR_RULES = ("earliest", "longest", "best")
# Signatures for verification: the (docs, num_perm) matrix indexed by doc index, or a function that
# returns the rows of the given sorted doc ids (a partition reads them back from the map outputs).
Signatures = np.ndarray | Callable[[np.ndarray], np.ndarray]


def candidate_edges(doc_index: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs of one band (or one partition): every doc sharing a key with the bucket's
    lowest doc index is paired with it (a star: m-1 pairs per bucket of m, enough for
    connectivity and linear even for huge buckets of boilerplate)."""
    order = np.lexsort((doc_index, keys))  # by key, then doc index: bucket head = lowest index
    k = keys[order]
    d = doc_index[order]
    same = k[1:] == k[:-1]
    if not same.any():
        return np.empty(0, np.int64), np.empty(0, np.int64)
    # head position of each element's bucket: last index where a new key starts, carried forward
    starts = np.ones(len(k), dtype=bool)
    starts[1:] = ~same
    head_pos = np.maximum.accumulate(np.where(starts, np.arange(len(k)), 0))
    member = ~starts
    return d[head_pos[member]].astype(np.int64), d[member].astype(np.int64)


def _find(parent, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]  # path halving
        x = parent[x]
    return x


def _union_kernel(parent, u, v):
    for i in range(u.shape[0]):
        a = _find(parent, u[i])
        b = _find(parent, v[i])
        if a < b:  # the lower index is the root: cluster ids do not depend on edge order
            parent[b] = a
        elif b < a:
            parent[a] = b


def _flatten_kernel(parent):
    for i in range(parent.shape[0]):  # parent[i] <= i, so one forward pass resolves every root
        parent[i] = parent[parent[i]]


if HAVE_NUMBA:
    from datapipe.runtime.jit import arr, lazy_numba

    numba = lazy_numba()  # compiled (or loaded from the cache) on first use

    _find = numba.njit(cache=True, nogil=True)(_find)
    _union_kernel = numba.njit(cache=True, nogil=True, warm=[(arr("int64"), arr("int64"), arr("int64"))])(_union_kernel)
    _flatten_kernel = numba.njit(cache=True, nogil=True, warm=[(arr("int64"),)])(_flatten_kernel)


class UnionFind:
    """Connected components over doc indices 0..n-1; root = lowest index of the component."""

    def __init__(self, n: int) -> None:
        self.parent = np.arange(n, dtype=np.int64)

    def union(self, u: np.ndarray, v: np.ndarray) -> None:
        u = np.ascontiguousarray(u, dtype=np.int64)
        v = np.ascontiguousarray(v, dtype=np.int64)
        if HAVE_NUMBA:
            _union_kernel(self.parent, u, v)
            return
        # numpy fallback: min-label propagation with pointer jumping until stable
        p = self.parent
        while True:
            ru, rv = p[u], p[v]
            m = np.minimum(ru, rv)
            before = p.copy()
            np.minimum.at(p, ru, m)
            np.minimum.at(p, rv, m)
            while True:
                pp = p[p]
                if np.array_equal(pp, p):
                    break
                p[:] = pp
            if np.array_equal(before, p):
                break

    def roots(self) -> np.ndarray:
        if HAVE_NUMBA:
            _flatten_kernel(self.parent)
        else:
            while True:
                pp = self.parent[self.parent]
                if np.array_equal(pp, self.parent):
                    break
                self.parent[:] = pp
        return self.parent


def union_of(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, UnionFind]:
    """Union-find over the distinct ids of edges (u, v) (arbitrary int64 ids, e.g. row keys): the
    sorted ids, and the union-find whose index i stands for ``ids[i]`` (so roots are lowest ids)."""
    ids = np.unique(np.concatenate([u, v]))
    uf = UnionFind(len(ids))
    uf.union(np.searchsorted(ids, u), np.searchsorted(ids, v))
    return ids, uf


def spanning_forest(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The components of edges (u, v) over arbitrary int64 ids, as (root, member) edges: one per
    member, root = the component's lowest id. Same connectivity as the input, at most one edge per
    distinct id: what a partition hands on instead of all its pairs."""
    if len(u) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ids, uf = union_of(u, v)
    roots = uf.roots()
    member = roots != np.arange(len(ids))
    return ids[roots[member]], ids[member]


def estimated_jaccard(sigs: np.ndarray, u: np.ndarray, v: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """Fraction of equal signature values per pair (datasketch's MinHash.jaccard), chunked."""
    return pair_jaccard(sigs, u, sigs, v, chunk)


def pair_jaccard(a: np.ndarray, u: np.ndarray, b: np.ndarray, v: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """``estimated_jaccard`` of rows ``a[u]`` and ``b[v]`` (two signature matrices), as float32 like it,
    so a pair compares with the threshold the same way wherever it is verified."""
    out = np.empty(len(u), dtype=np.float32)
    for s in range(0, len(u), chunk):
        out[s : s + chunk] = (a[u[s : s + chunk]] == b[v[s : s + chunk]]).mean(axis=1)
    return out


def verified_pairs(
    doc_index: np.ndarray, keys: np.ndarray, threshold: float | None = None, sigs: Signatures | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Candidate pairs of one band (or one partition), verified: (u, v, number of candidates).

    With a ``threshold``, only pairs whose estimated Jaccard reaches it are kept, cutting LSH false
    positives at the cost of one signature comparison per pair; ``sigs`` gives the signatures."""
    u, v = candidate_edges(doc_index, keys)
    n_candidates = len(u)
    if threshold is None or n_candidates == 0:
        return u, v, n_candidates
    if sigs is None:
        raise ValueError("verification needs sigs")
    if callable(sigs):  # only the paired documents' signatures, read by sorted doc id
        docs = np.unique(np.concatenate([u, v]))
        keep = estimated_jaccard(sigs(docs), np.searchsorted(docs, u), np.searchsorted(docs, v)) >= threshold
    else:
        keep = estimated_jaccard(sigs, u, v) >= threshold
    return u[keep], v[keep], n_candidates


def survivors(
    roots: np.ndarray, rule: str = "earliest", lengths: np.ndarray | None = None, scores: np.ndarray | None = None
) -> np.ndarray:
    """Survivor index per document: per component, the best by the rule, ties -> lowest index."""
    n = len(roots)
    idx = np.arange(n, dtype=np.int64)
    if rule == "earliest":
        return roots.copy()  # roots are the lowest index of each component
    if rule == "longest":
        if lengths is None:
            raise ValueError("rule 'longest' needs lengths")
        primary = -np.asarray(lengths, dtype=np.float64)
    elif rule == "best":
        if scores is None:
            raise ValueError("rule 'best' needs scores")
        primary = -np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    else:
        raise ValueError(f"rule must be one of {SURVIVOR_RULES}, got {rule!r}")
    order = np.lexsort((idx, primary, roots))
    first = np.ones(n, dtype=bool)
    first[1:] = roots[order][1:] != roots[order][:-1]
    best_of_root = np.empty(n, dtype=np.int64)
    best_of_root[roots[order][first]] = order[first]
    return best_of_root[roots]


@dataclass
class Clusters:
    cluster: np.ndarray  # int64 per doc: lowest doc index of its component (itself if alone)
    survivor: np.ndarray  # int64 per doc: the index kept for its component
    size: np.ndarray  # int64 per doc: documents in its component

    @property
    def duplicate(self) -> np.ndarray:
        """bool per doc: removed (in a component of two or more and not its survivor)."""
        return (self.size > 1) & (self.survivor != np.arange(len(self.survivor)))

    @property
    def kept(self) -> np.ndarray:
        """bool per doc: the survivor of a component of two or more."""
        return (self.size > 1) & (self.survivor == np.arange(len(self.survivor)))


def settle(
    uf: UnionFind, rule: str = "earliest", lengths: np.ndarray | None = None, scores: np.ndarray | None = None
) -> Clusters:
    """Components of a union-find and the survivor of each by ``rule`` (see ``survivors``)."""
    roots = uf.roots()
    surv = survivors(roots, rule, lengths, scores)
    return Clusters(roots, surv, np.bincount(roots, minlength=len(roots))[roots])


@dataclass
class DedupResult(Clusters):
    candidate_pairs: int = 0
    verified_pairs: int = 0


def cluster_duplicates(
    band_columns: Iterable[np.ndarray] | np.ndarray,
    n_docs: int,
    *,
    valid: np.ndarray | None = None,
    sigs: np.ndarray | None = None,
    verify_threshold: float | None = None,
    rule: str = "earliest",
    lengths: np.ndarray | None = None,
    scores: np.ndarray | None = None,
) -> DedupResult:
    """Cluster n_docs documents from their band keys (an (n, bands) array or one column per band).

    valid: docs to consider (default all); pass ``~minhash.empty_mask(sigs)`` so that documents
    without shingles, which all share the empty signature, are not clustered together.
    verify_threshold: keep only candidate pairs whose estimated Jaccard (from ``sigs``) reaches
    it, cutting LSH false positives at the cost of one signature comparison per pair.
    """
    if isinstance(band_columns, np.ndarray):
        matrix = band_columns
        band_columns = (matrix[:, i] for i in range(matrix.shape[1]))
    if verify_threshold is not None and sigs is None:
        raise ValueError("verify_threshold needs sigs")
    doc_index = np.arange(n_docs, dtype=np.int64) if valid is None else np.flatnonzero(valid).astype(np.int64)
    uf = UnionFind(n_docs)
    n_cand = n_ver = 0
    for column in band_columns:
        keys = np.asarray(column)
        keys = keys if valid is None else keys[doc_index]
        u, v, n = verified_pairs(doc_index, keys, verify_threshold, sigs)
        n_cand += n
        n_ver += len(u)
        uf.union(u, v)
        del keys, u, v
    c = settle(uf, rule, lengths, scores)
    return DedupResult(c.cluster, c.survivor, c.size, n_cand, n_ver)
