"""Precision/recall floors at the default threshold on real-text near-duplicates and UDHR pages."""

from __future__ import annotations

from datapipe.dedup import evalset, near_duplicates
from tests.support.shared_data import shared_path


def test_edited_copies_precision_recall():
    corpora = [
        (shared_path("corpus", "zh_wikipedia.jsonl"), "zh", 80, 600),
        (shared_path("corpus", "en_wikipedia.jsonl"), "en", 80, 1500),
        (shared_path("corpus", "zh_pingcap_docs.jsonl"), "zh", 40, 1000),
    ]
    texts, groups, _ = evalset.build(corpora, seed=0)
    p, r, n_pred, n_true = evalset.pair_scores(near_duplicates(texts).cluster, evalset.group_pairs(groups))
    print(f"edited copies: precision {p:.3f} recall {r:.3f} ({n_pred} predicted, {n_true} true pairs)")
    assert p >= 0.98 and r >= 0.93


def test_udhr_variants_precision_recall():
    texts, names, truth, neutral = evalset.udhr(shared_path("web", "html", "udhr"))
    p, r, n_pred, n_true = evalset.pair_scores(near_duplicates(texts).cluster, truth, neutral)
    print(f"UDHR: precision {p:.3f} recall {r:.3f} ({n_pred} predicted, {n_true} labelled pairs)")
    assert p >= 0.9 and r >= 0.5


def test_traditional_simplified_copies_found_when_folding():
    """Simplified zh Wikipedia articles and their Traditional conversions (OpenCC s2t, phrase level,
    as a Taiwan or Hong Kong mirror would publish them), some also edited."""
    import json
    import random

    import numpy as np
    import opencc

    from datapipe.dedup.fold import fold_traditional

    rng = random.Random(0)
    lines = shared_path("corpus", "zh_wikipedia.jsonl").read_text(encoding="utf-8").splitlines()
    docs = [t for t in (json.loads(x)["text"] for x in lines) if len(t) >= 600][:80]
    s2t = opencc.OpenCC("s2t")
    texts, groups = [], []
    for g, doc in enumerate(docs):
        copy = s2t.convert(doc)
        if g % 2:  # half the copies are also edited: a sentence dropped
            sents = copy.split("。")
            del sents[rng.randrange(len(sents))]
            copy = "。".join(sents)
        texts += [doc, copy]
        groups += [g, g]
    truth = evalset.group_pairs(np.array(groups))
    p_fold, r_fold, _, _ = evalset.pair_scores(near_duplicates(fold_traditional(texts)).cluster, truth)
    p_raw, r_raw, _, _ = evalset.pair_scores(near_duplicates(texts).cluster, truth)
    print(f"Traditional/Simplified copies: folded precision {p_fold:.3f} recall {r_fold:.3f}; unfolded recall {r_raw:.3f}")
    assert p_fold >= 0.98 and r_fold >= 0.9
    assert r_raw < r_fold  # without folding, script changes hide many copies
