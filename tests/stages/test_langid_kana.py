"""Kana decides Japanese only as a real share of the CJK text (issue 16 item 5).

Real data: Chinese Wikipedia articles that quote Japanese titles (6-14% kana) must stay ``zh``
with a Japanese share in their fractions; real Japanese (UDHR pages, lingua items, a sentence)
must stay ``ja``.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from datapipe.stages import cjk
from datapipe.stages.base import StageContext
from datapipe.stages.langid import LangId, LangIdOptions
from tests.stages.test_langid_accuracy import udhr_text
from tests.support.shared_data import shared_path


@pytest.fixture(scope="module")
def langid() -> LangId:
    stage = LangId(LangIdOptions(keep=["zh", "en"], fraction_langs=["zh", "en", "ja"]), StageContext(".", "."))
    stage.setup()
    return stage


def zh_wikipedia_with_kana(min_share: float) -> list[dict]:
    """The zh Wikipedia documents whose kana share of CJK letters is at least ``min_share``."""
    lines = shared_path("corpus", "zh_wikipedia.jsonl").read_text(encoding="utf-8").splitlines()
    docs = [json.loads(ln) for ln in lines]
    counts, _, _ = cjk.line_script_counts([d["text"] for d in docs])
    share = counts["kana"] / np.maximum(counts["han"] + counts["kana"], 1)
    return [d for d, s in zip(docs, share) if s >= min_share]


def run(stage: LangId, texts: list[str]) -> list[dict]:
    batch = pa.table({"id": [str(i) for i in range(len(texts))], "kind": ["web"] * len(texts), "text": texts})
    out = stage.compute(batch)
    reasons = stage.decide(out).reason.to_pylist()
    rows = out.drop_columns(["text"]).to_pylist()
    for r, reason in zip(rows, reasons):
        r["reason"] = reason
    return rows


def test_zh_articles_quoting_japanese_stay_zh_with_fractions(langid: LangId) -> None:
    docs = zh_wikipedia_with_kana(0.05)
    assert len(docs) >= 5, [d["source"] for d in docs]  # the five articles of the report (6-14% kana)
    for d, row in zip(docs, run(langid, [d["text"] for d in docs])):
        assert row["lang"] == "zh" and row["reason"] is None, (d["source"], row)
        # The quote shows as a Japanese share; the article is mostly Chinese.
        assert 0.0 < row["lang_frac_ja"] < 0.5 < row["lang_frac_zh"], (d["source"], row)


def test_every_zh_wikipedia_article_with_kana_is_zh(langid: LangId) -> None:
    docs = zh_wikipedia_with_kana(1e-9)
    rows = run(langid, [d["text"] for d in docs])
    assert [d["source"] for d, r in zip(docs, rows) if r["lang"] != "zh"] == []


@pytest.mark.parametrize("page", ["jpn", "jpn_osaka", "jpn_tokyo"])
def test_real_japanese_stays_ja(langid: LangId, page: str) -> None:
    text = udhr_text(page)
    row = run(langid, [text])[0]
    assert row["lang"] == "ja" and row["lang_frac_zh"] < 0.05 and row["lang_frac_ja"] > 0.9, row
    # Sentence by sentence too: the most kanji-heavy UDHR clause has 32% kana.
    lines = [ln.strip() for ln in text.split("\n") if sum(cjk.line_script_counts([ln])[0]["han"]) >= 20]
    got = [r["lang"] for r in run(langid, lines)]
    assert got.count("ja") == len(lines), [(ln, g) for ln, g in zip(lines, got) if g != "ja"]


def test_lingua_japanese_items_stay_ja(langid: LangId) -> None:
    items = [
        ln.strip()
        for ln in shared_path("langid", "lingua", "word-pairs", "ja.txt").read_text(encoding="utf-8").splitlines()
        if ln.strip()
    ]
    got = [r["lang"] for r in run(langid, items)]
    assert got.count("ja") / len(items) >= 0.98
