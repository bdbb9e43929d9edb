"""Precision/recall floors at the default threshold on real-text near-duplicates and UDHR pages."""

from __future__ import annotations

from datapipe.dedup import evalset, near_duplicates
from tests.shared_data import shared_path


def test_edited_copies_precision_recall():
    corpora = [(shared_path("corpus", "zh_wikipedia.jsonl"), "zh", 80, 600),
               (shared_path("corpus", "en_wikipedia.jsonl"), "en", 80, 1500),
               (shared_path("corpus", "zh_pingcap_docs.jsonl"), "zh", 40, 1000)]
    texts, groups, _ = evalset.build(corpora, seed=0)
    p, r, n_pred, n_true = evalset.pair_scores(near_duplicates(texts).cluster, evalset.group_pairs(groups))
    print(f"edited copies: precision {p:.3f} recall {r:.3f} ({n_pred} predicted, {n_true} true pairs)")
    assert p >= 0.98 and r >= 0.93


def test_udhr_variants_precision_recall():
    texts, names, truth, neutral = evalset.udhr(shared_path("web", "html", "udhr"))
    p, r, n_pred, n_true = evalset.pair_scores(near_duplicates(texts).cluster, truth, neutral)
    print(f"UDHR: precision {p:.3f} recall {r:.3f} ({n_pred} predicted, {n_true} labelled pairs)")
    assert p >= 0.9 and r >= 0.5
