"""Work the quality filters share or skip gives what the direct Arrow call gives, on real text.

Each shortcut stands for an Arrow call the filters made before: per-line word counts without
splitting the lines (``trimmed_word_counts``), word features per distinct word (``Docs.word_ids``),
one ASCII character counted in the UTF-8 buffer (``Docs.byte_counts``), the word lists read
with one scan for all of them (``distinct_hits_of_lists``) and C4's line rules applied in turn.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datapipe.stages.quality.blocklist import FILTERS_DIR, distinct_hits, distinct_hits_of_lists
from datapipe.stages.quality.c4 import POLICY
from datapipe.stages.quality.charclass import trimmed_word_counts
from datapipe.stages.quality.rules import FILTERS
from datapipe.stages.quality.text import ENDS_WITH_TERMINAL, SPLIT_WHITESPACE, Docs
from tests.support.shared_data import jsonl_texts, shared_path

pytest.importorskip("numba")

DEMO = Path(__file__).resolve().parents[2] / "pipelines" / "demo" / "data"


@pytest.fixture(scope="module")
def batches() -> list[Docs]:
    """The demo inputs and every 40th page of the shared English and Chinese corpora (~850 pages)."""
    texts = [t for p in sorted(DEMO.glob("*.jsonl")) for t in jsonl_texts(p)]
    corpus = shared_path("corpus")
    texts += jsonl_texts(corpus / "en_wikipedia.jsonl", every=40) + jsonl_texts(corpus / "zh_wikipedia.jsonl", every=40)
    texts += ["", "  \n\t ", "a  ", "\u3000x\u3000\u3000y  z\u2028", "{#}\n#..."]
    return [Docs(pa.array(texts[i : i + 300], pa.string())) for i in range(0, len(texts), 300)]


def test_split_whitespace_class_is_arrows_at_every_code_point() -> None:
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    between = pa.array(["a" + chr(c) + "a" for c in cps])
    cuts = pc.list_value_length(pc.utf8_split_whitespace(between)).to_numpy() == 2
    assert np.array_equal(cuts, trimmed_word_counts(between) == 2)
    assert np.array_equal(cuts, [chr(c).isspace() for c in cps])  # the class as the comment states it
    assert re.fullmatch(r"\[.*\]", SPLIT_WHITESPACE)


def test_line_word_counts_equal_arrows_split(batches: list[Docs]) -> None:
    lines = 0
    for docs in batches:
        values = docs.lines.values
        lines += len(values)
        want = pc.list_value_length(pc.utf8_split_whitespace(values)).to_numpy()
        assert np.array_equal(trimmed_word_counts(values), want)
    assert lines > 3_000


def test_word_features_per_distinct_word_equal_per_word(batches: list[Docs]) -> None:
    for docs in batches:
        ids, distinct = docs.word_ids
        words = docs.words.values
        assert len(distinct) < len(words)
        assert pc.take(distinct, pa.array(ids)).equals(words)
        assert np.array_equal(docs.word_lengths, pc.utf8_length(words).to_numpy())


@pytest.mark.parametrize("char", ["#", "\n", "{", "."])
def test_byte_counts_equal_regex_counts(batches: list[Docs], char: str) -> None:
    for docs in batches:
        assert np.array_equal(docs.byte_counts(char), docs.count(re.escape(char)))


def test_word_lists_in_one_scan_equal_one_scan_each(batches: list[Docs]) -> None:
    paths = {c: FILTERS_DIR / "words" / f"{c}.txt" for c in ("spam", "adult", "gambling")}
    edges = [  # word boundaries next to non-ASCII letters, digits, "_", "-" and odd spaces
        "Click here to buy now! 加微信 百家乐 porn",
        "casino bonus free spins",
        *"pornó|éporn|porn_x|x-porn-y|porn2|ñcasino bonus|casino bonusé|100% free trial|100%free trial".split("|"),
        *"click\u00a0here|click  here|clickhere|xxxl|微信号码 办证件|Essex chat|sex chat|İporn|nsfw-nsfw".split("|"),
    ]
    texts = [d.text for d in batches] + [pa.array(edges)]
    hits = 0
    for text in texts:
        lower = pc.utf8_lower(text)
        got = distinct_hits_of_lists(lower, paths)
        for key, path in paths.items():
            want = distinct_hits(lower, path)
            assert got[key].dtype == want.dtype and np.array_equal(got[key], want), key
            hits += int(want.sum())
    assert hits > 0


def test_c4_line_rules_in_turn_equal_all_rules_on_every_line(batches: list[Docs]) -> None:
    """C4 looks for notices and counts sentences only in the lines its earlier rules keep; the
    signals equal the rules applied to every line (C4's definition, written out here)."""
    kept = 0
    for docs in batches:
        got = FILTERS["c4"].compute(docs, {}, pa.table({"text": docs.text}))
        lines = docs.lines
        lower = pc.utf8_lower(lines.values)
        words = pc.list_value_length(pc.utf8_split_whitespace(lines.values)).to_numpy()
        good = (
            pc.match_substring_regex(lines.values, ENDS_WITH_TERMINAL).to_numpy(zero_copy_only=False)
            & (words >= 3)
            & ~pc.match_substring(lower, "javascript").to_numpy(zero_copy_only=False)
            & ~pc.match_substring_regex(lower, POLICY).to_numpy(zero_copy_only=False)
        )
        ends = pc.count_substring_regex(lines.values, r"[.!?。！？]+[\"'”’)]*(\s|$)").to_numpy().astype(np.float64)
        assert np.array_equal(got["c4_good_lines"], lines.per_doc(good).astype(np.int32))
        assert np.array_equal(got["c4_sentences"], lines.per_doc(ends * good).astype(np.int32))
        kept += int(good.sum())
    assert kept > 1000
