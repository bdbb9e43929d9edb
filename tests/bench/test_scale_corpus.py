"""bench/scaling/scale.py's corpus and accounting: copies of real documents are not duplicates of each other,
plants are what they claim, and the recall / false-positive count follows the pair rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from bench._support.corpus import FILES
from bench._support.scale_corpus import Corpus, load_base, similarity_check, write_corpus
from bench.scaling.scale import plants_found
from tests.support.shared_data import shared_path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The first 150 documents of each real corpus file (a slice: loading all takes ~30 s)."""
    src = shared_path("corpus")
    small = tmp_path_factory.mktemp("corpus")
    for name in FILES:
        with open(src / name, encoding="utf-8") as f:
            (small / name).write_text("".join(line for _, line in zip(range(150), f)), encoding="utf-8")
    return load_base(corpus=small)


def test_copies_are_far_apart_and_near_plants_close(base) -> None:
    sim = similarity_check(base, p=0.2, pairs=300, exact_pairs=40)
    assert sim["copies_minhash"]["at_or_above_threshold"] == 0
    assert sim["copies_true_jaccard"]["max"] < 0.5
    assert sim["near_true_jaccard"]["min"] >= 0.75


def test_corpus_holds_every_regular_document_once_and_plants_after_their_originals(base, tmp_path: Path) -> None:
    from datapipe.stages.dedup import normalize_for_hash

    n = 2 * len(base) + 37  # wraps around the base twice, mid-block
    corpus = write_corpus(tmp_path, base, n, files=3, rate=0.05, window=500, seed=3)
    rows = [json.loads(line) for f in corpus.files for line in f.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == corpus.docs == n + len(corpus.exact) + len(corpus.near)
    position = {r["url"]: i for i, r in enumerate(rows)}
    text = {r["url"]: r["text"] for r in rows}
    assert sorted(int(u.rsplit("/", 1)[1]) for u in position if "doc.example" in u) == list(range(n))
    assert len(corpus.exact) == int(0.05 * n) and 0 < len(corpus.near) <= len(corpus.exact)
    for kind, js in (("exact", corpus.exact), ("near", corpus.near)):
        plants = [f"https://{kind}.example/{j}" for j in js.tolist()]
        originals = [f"https://doc.example/{j}" for j in js.tolist()]
        assert all(position[a] > position[b] for a, b in zip(plants, originals))
        same = pc.equal(
            normalize_for_hash(pa.array([text[u] for u in plants])), normalize_for_hash(pa.array([text[u] for u in originals]))
        ).to_pylist()
        assert all(same) if kind == "exact" else not any(same)
    assert len({text[f"https://doc.example/{j}"] for j in range(n)}) == n  # no two copies alike


def test_recall_counts_pairs_that_reached_dedup() -> None:
    corpus = Corpus([], regular=10, exact=np.array([1, 2, 3]), near=np.array([4, 5]), bytes=0, seconds=0.0)
    removed = {
        "doc": {2: "quality", 7: "exact_duplicate", 8: "lang"},  # 2: its pair never reached dedup
        "exact": {1: "exact_duplicate", 2: "quality"},  # 3: missed (both kept)
        "near": {4: "near_duplicate", 5: "near_duplicate"},
    }
    removed["doc"][5] = "near_duplicate"  # both of pair 5 removed: not "found"
    got = plants_found(corpus, removed, lambda r: r.endswith("duplicate"))
    assert got["exact"] == {"planted": 3, "reached_dedup": 2, "found": 1, "both_removed": 0, "recall": 0.5}
    assert got["near"]["found"] == 1 and got["near"]["both_removed"] == 1
    # regular documents that are no plant's original: 0, 6, 7, 8, 9; 8 was dropped by langid
    assert got["false_positives"] == {"regular_reached_dedup": 4, "removed_as_duplicate": 1, "rate": 0.25}
