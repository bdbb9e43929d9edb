"""Candidate pairs, union-find components, survivor rules and verification on constructed sets."""

from __future__ import annotations

import numpy as np
import pytest

import datapipe.dedup.cluster as C


def _planted(n: int = 3000, bands: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**63, size=(n, bands), dtype=np.uint64)
    keys[5, 0] = keys[0, 0]  # 0-5 via band 0
    keys[9, 2] = keys[5, 2]  # 5-9 via band 2: 0,5,9 one component through a chain
    keys[4, 1] = keys[3, 1]
    keys[100:111, 3] = keys[100, 3]  # a bucket of 11
    return keys


def test_components_and_rules():
    keys = _planted()
    n = len(keys)
    lengths = np.arange(n) % 7
    r = C.cluster_duplicates(keys, n, rule="longest", lengths=lengths)
    assert r.cluster[[0, 5, 9]].tolist() == [0, 0, 0] and r.cluster[[3, 4]].tolist() == [3, 3]
    assert (r.cluster[100:111] == 100).all() and r.cluster[7] == 7
    assert r.survivor[[0, 5, 9]].tolist() == [5, 5, 5]  # lengths 0, 5, 2
    assert r.survivor[100] == 104  # 104 % 7 == 6 is the longest
    assert r.duplicate.sum() == 2 + 1 + 10 and not r.duplicate[[5, 4, 104, 7]].any()
    assert r.candidate_pairs == 2 + 1 + 10
    e = C.cluster_duplicates(keys, n, rule="earliest")
    assert e.survivor[[5, 9, 4, 110]].tolist() == [0, 0, 3, 100]
    scores = np.zeros(n)
    scores[9] = 1.0
    b = C.cluster_duplicates(keys, n, rule="best", scores=scores)
    assert b.survivor[0] == 9 and b.duplicate[0] and not b.duplicate[9]


def test_valid_mask_excludes_docs():
    keys = _planted()
    valid = np.ones(len(keys), bool)
    valid[5] = False  # breaks the 0-5-9 chain
    r = C.cluster_duplicates(keys, len(keys), valid=valid)
    assert r.cluster[5] == 5 and r.cluster[9] == 9 and not r.duplicate[[0, 5, 9]].any()


def test_verification_drops_false_candidates():
    rng = np.random.default_rng(1)
    sigs = rng.integers(0, 2**32, size=(50, 64), dtype=np.uint64).astype(np.uint32)
    sigs[1] = sigs[0]
    sigs[1, :8] += 1  # estimated Jaccard 56/64 = 0.875
    keys = rng.integers(0, 2**63, size=(50, 2), dtype=np.uint64)
    keys[1, 0] = keys[0, 0]
    keys[2, 1] = keys[0, 1]  # 0-2 share a bucket but their signatures are unrelated
    r = C.cluster_duplicates(keys, 50, sigs=sigs, verify_threshold=0.8)
    assert r.cluster[1] == 0 and r.cluster[2] == 2
    assert (r.candidate_pairs, r.verified_pairs) == (2, 1)
    assert C.estimated_jaccard(sigs, np.array([0]), np.array([1]))[0] == pytest.approx(0.875)


def test_numpy_fallback_matches_numba(monkeypatch):
    keys = _planted(seed=3)
    rng = np.random.default_rng(3)
    extra = rng.integers(0, 400, size=(2000, 2))  # many random links: large components
    ref = C.UnionFind(len(keys))
    ref.union(extra[:, 0], extra[:, 1])
    monkeypatch.setattr(C, "HAVE_NUMBA", False)
    alt = C.UnionFind(len(keys))
    alt.union(extra[:, 0], extra[:, 1])
    assert np.array_equal(ref.roots(), alt.roots())


def test_candidate_edges_star_is_linear():
    keys = np.zeros(1000, dtype=np.uint64)  # one bucket of 1000 docs
    u, v = C.candidate_edges(np.arange(1000, dtype=np.int64)[::-1].copy(), keys)
    assert len(u) == 999 and (u == 0).all() and sorted(v.tolist()) == list(range(1, 1000))


def test_verified_pairs_read_by_doc_id_equal_the_matrix_ones():
    """The distributed stage reads only the paired documents' signatures; the in-memory path indexes
    the whole matrix: both verify the same pairs (the one verify path of both)."""
    rng = np.random.default_rng(5)
    sigs = rng.integers(0, 2**32, size=(400, 32), dtype=np.uint64).astype(np.uint32)
    for i in range(0, 400, 3):  # every third doc a near copy (~6/32 values changed) of a random earlier one
        j = int(rng.integers(0, i + 1))
        sigs[i] = sigs[j]
        sigs[i, rng.integers(0, 32, 6)] += 1
    keys = (sigs[:, 0] % 50).astype(np.uint64)  # coarse buckets: many false candidates
    doc_index = np.arange(400, dtype=np.int64)
    reads = []

    def read(docs: np.ndarray) -> np.ndarray:
        reads.append(docs)
        return sigs[docs]

    u, v, n = C.verified_pairs(doc_index, keys, 0.7, sigs)
    u2, v2, n2 = C.verified_pairs(doc_index, keys, 0.7, read)
    assert n == n2 > len(u) > 0 and np.array_equal(u, u2) and np.array_equal(v, v2)
    assert len(reads) == 1 and np.all(np.diff(reads[0]) > 0)  # sorted, distinct doc ids
    assert (C.estimated_jaccard(sigs, u, v) >= 0.7).all()
    assert C.verified_pairs(doc_index, keys, None)[2] == n  # without a threshold: the candidates


def test_settle_over_sparse_row_keys():
    ids, uf = C.union_of(np.array([900, 40, 7000], np.int64), np.array([40, 5, 8000], np.int64))
    assert ids.tolist() == [5, 40, 900, 7000, 8000]
    c = C.settle(uf, "longest", lengths=np.array([1, 3, 2, 1, 1]))
    assert c.cluster.tolist() == [0, 0, 0, 3, 3] and c.size.tolist() == [3, 3, 3, 2, 2]
    assert c.survivor.tolist() == [1, 1, 1, 3, 3]  # longest of {5, 40, 900}; tie -> lowest key
    assert c.kept.tolist() == [False, True, False, True, False]
    assert c.duplicate.tolist() == [True, False, True, False, True]
