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
