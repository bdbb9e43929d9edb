"""The compiled quality signals equal their references bit for bit, on the real corpora.

``text.ngram_repetition`` (numba, one pass for all n) against ``ngram_repetition_reference``
(exact grouping, one Arrow dictionary encoding per n), ``zh.char_tokens`` (reads UTF-8 bytes,
stops at ``ngram_chars``) against ``char_tokens_reference``, ``zh.class_counts`` (one pass, a
code-point table) against one regex count per class; then every signal column of the filters
that use them (gopher_repetition, zh_repetition, zh, gopher_quality), computed both ways.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datapipe.stages.quality import gopher, text, zh
from datapipe.stages.quality.rules import FILTERS
from datapipe.stages.quality.text import Docs
from tests.support.shared_data import jsonl_texts, shared_path

pytest.importorskip("numba")

DEMO = Path(__file__).resolve().parents[2] / "pipelines" / "demo" / "data"
# (filter, settings): every configuration of the two repetition filters the rule sets use.
CONFIGS = [
    ("gopher_repetition", {}),
    ("zh_repetition", {}),
    ("zh_repetition", {"latin_words": True}),
    ("zh_repetition", {"markdown": True, "latin_words": True, "ngram_chars": 5000}),
    ("zh_repetition", {"markdown": True, "ngram_chars": 300}),
    ("zh", {}),
    ("zh", {"markdown": True}),
    ("gopher_quality", {}),
]


def _batches(texts: list[str], size: int = 1000) -> list[pa.Array]:
    return [pa.array(texts[i : i + size]) for i in range(0, len(texts), size)]


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """Names of the columns that differ (values, NaN-aware, or dtype)."""
    assert a.keys() == b.keys()
    return [k for k in a if a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k], equal_nan=True)]


def _check(batches: list[pa.Array], monkeypatch: pytest.MonkeyPatch) -> int:
    """Compare tokens, n-gram signals and whole filter outputs; returns the number of documents."""
    docs_seen = 0
    for arr in batches:
        docs_seen += len(arr)
        for view in (Docs(arr), Docs(arr).prose):
            for latin, limit in ((False, 5000), (True, 5000), (True, 40)):
                new, ref = zh.char_tokens(view, latin, limit), zh.char_tokens_reference(view, latin, limit)
                for x, y in zip(new, ref):
                    assert x.dtype == y.dtype and np.array_equal(x, y)
            for t in (view.text, view.lines.values):
                assert np.array_equal(zh.class_counts(t), zh.class_counts(t, reference=True))
            w = view.words
            for x, y in zip(gopher.word_classes(w.values), gopher.word_classes(w.values, reference=True)):
                assert x.dtype == y.dtype and np.array_equal(x, y)
            ids = text.to_np(pa.compute.dictionary_encode(w.values).indices).astype(np.int64)
            for ids_, doc, weight in ((ids, w.doc, w.lengths.astype(np.float64)), zh.char_tokens(view, True, 5000)):
                args = (ids_, doc, weight, view.n, gopher.TOP_NS, gopher.DUP_NS)
                assert not _equal(text.ngram_repetition(*args), text.ngram_repetition_reference(*args))
        for name, params in CONFIGS:
            new = FILTERS[name].compute(Docs(arr), params, pa.table({"text": arr}))
            with monkeypatch.context() as m:
                m.setattr(gopher, "ngram_repetition", text.ngram_repetition_reference)
                m.setattr(zh, "char_tokens", zh.char_tokens_reference)
                m.setattr(zh, "class_counts", lambda t, counts=zh.class_counts: counts(t, reference=True))
                m.setattr(gopher, "word_classes", lambda w, classes=gopher.word_classes: classes(w, reference=True))
                ref = FILTERS[name].compute(Docs(arr), params, pa.table({"text": arr}))
            assert set(new) == set(FILTERS[name].signals)
            assert not _equal(new, ref), (name, params)
    return docs_seen


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zh_wikipedia.jsonl", "zh_pingcap_docs.jsonl", "zh_oiwiki.jsonl"])
def test_kernels_equal_reference_on_chinese_corpora(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = jsonl_texts(shared_path("corpus", name), every=3)  # a third of each: the reference paths are slow in CI
    assert _check(_batches(texts), monkeypatch) == len(texts)


@pytest.mark.slow
def test_kernels_equal_reference_on_english_wikipedia(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = jsonl_texts(shared_path("corpus", "en_wikipedia.jsonl"), every=32)  # 767 of 24,535 pages
    assert _check(_batches(texts), monkeypatch) == len(texts)


def test_kernels_equal_reference_on_demo_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [t for p in sorted(DEMO.glob("*.jsonl")) for t in jsonl_texts(p)]
    assert texts
    assert _check(_batches(texts, 300), monkeypatch) == len(texts)


def test_edge_cases_equal_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty batches and texts, nulls, whitespace only, one token, runs longer than 64 letters."""
    cases = [
        "",
        " \n\u3000",
        "a",
        "好",
        None,
        "x" * 200 + " " + "x" * 199 + "y",
        "abc_1 " * 30,
        "重复重复重复重复重复重复",
        "=====\n=====\n=====",
        "𠀀𠀁𠀀𠀁𠀀𠀁 😀😀😀😀😀😀",
    ]
    assert _check([pa.array(cases, pa.string()), pa.array([], pa.string())], monkeypatch) == len(cases)


def test_a_hash_collision_of_the_former_code_does_not_merge_ngrams() -> None:
    """Two different 5-grams of a real TiDB page (``latin_words`` ids: ``<`` then the word ``57``,
    ``=`` then ``56``) had the same polynomial hash before the kernel; the kernel keeps them apart."""
    a, b = [60, 56000286, 46, 49, 46], [61, 55000283, 46, 49, 46]
    ids = np.array(a + [0] + b, np.int64)
    args = (ids, np.zeros(len(ids), np.int64), np.ones(len(ids)), 1, (), (5,))
    assert text.ngram_repetition(*args)["dup5"][0] == 0.0
    assert text.ngram_repetition_reference(*args)["dup5"][0] == 0.0
    assert text.ngram_repetition_reference(*args, exact=False)["dup5"][0] > 0.0  # the former hashing


def test_kernel_matches_a_counter_on_random_tokens() -> None:
    """Independent of both implementations: Gopher's definitions with a Python dict, few-symbol texts."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 60, 40)
    ids = rng.integers(0, 3, lengths.sum())
    weight = rng.integers(1, 5, lengths.sum()).astype(np.float64)
    doc = np.repeat(np.arange(len(lengths)), lengths)
    got = text.ngram_repetition(ids, doc, weight, len(lengths), (2, 3), (5, 9))
    for d in range(len(lengths)):
        t, w = ids[doc == d], weight[doc == d]
        total = w.sum()
        for n in (2, 3, 5, 9):
            grams = [tuple(t[i : i + n]) for i in range(len(t) - n + 1)]
            if n in (2, 3):
                counts: dict[tuple, int] = {}
                for g in grams:
                    counts[g] = counts.get(g, 0) + 1
                most = max(counts.values(), default=0)
                best = max(
                    (c * w[grams.index(g) : grams.index(g) + n].sum() for g, c in counts.items() if c == most and c > 1),
                    default=0.0,
                )
                want = np.float32(min(best / total, 1.0)) if total else np.float32(0)
                assert got[f"top{n}"][d] == want
            else:
                seen, covered = set(), np.zeros(len(t), bool)
                for i, g in enumerate(grams):
                    if g in seen:
                        covered[i : i + n] = True
                    seen.add(g)
                want = np.float32(w[covered].sum() / total) if total else np.float32(0)
                assert got[f"dup{n}"][d] == want
