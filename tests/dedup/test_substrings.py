"""Exact repeated spans (the ``substrings`` stage) against a brute-force reference, on real zh,
zh-Hant and en documents with planted repeats: inside paragraphs, across line breaks, full-width
vs half-width punctuation, Traditional vs Simplified. The stage runs through the engine's own task
functions in process (map, five partition rounds, apply); the reference is plain Python over every
window of every document. Determinism across reruns and 1 vs 2 Ray workers is in the e2e test."""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from datapipe.dedup.fold import t2s_table
from datapipe.dedup.shingles import _DIGIT_RE, TOKEN_RE
from datapipe.dedup.substrings import anchors, tokenize, winnow_params
from datapipe.engine.phases import plan_phases, run_here
from datapipe.engine.plan import make_spec
from datapipe.errors import DatapipeError
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path

MIN_TOKENS = 30
PARTITIONS = 3


# -- the reference ---------------------------------------------------------------------------


def ref_tokens(text: str) -> list[tuple[str, int, int]]:
    """(normalised token, first char, end char) by Python's regex over a per-character normalisation."""
    table = t2s_table()
    norm, src = [], []
    for i, ch in enumerate(text):
        for c in unicodedata.normalize("NFKC", ch).lower().translate(table):
            norm.append(c)
            src.append(i)
    s = _DIGIT_RE.sub("0", "".join(norm))
    return [(m.group(), src[m.start()], src[m.end() - 1] + 1) for m in TOKEN_RE.finditer(s)]


def reference(texts: list[str], n: int, keep: str) -> list[str]:
    """Each text with every window of n tokens that also occurs in an earlier document (keep first)
    or in any other document (keep none) cut: each maximal run of such tokens, first char to last."""
    toks = [ref_tokens(t) for t in texts]
    where: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for d, ts in enumerate(toks):
        for i in range(len(ts) - n + 1):
            where[tuple(t for t, _, _ in ts[i : i + n])].append(d)
    out = []
    for d, (text, ts) in enumerate(zip(texts, toks)):
        gone = [False] * len(ts)
        for i in range(len(ts) - n + 1):
            docs = where[tuple(t for t, _, _ in ts[i : i + n])]
            if (min(docs) < d) if keep == "first" else (len(set(docs)) > 1):
                gone[i : i + n] = [True] * n
        pieces, at, i = [], 0, 0
        while i < len(ts):
            if gone[i]:
                j = i
                while j + 1 < len(ts) and gone[j + 1]:
                    j += 1
                pieces.append(text[at : ts[i][1]])
                at = ts[j][2]
                i = j + 1
            else:
                i += 1
        out.append("".join(pieces) + text[at:])
    return out


# -- real documents with planted repeats -------------------------------------------------------


def _jsonl(name: str, n: int, min_chars: int, max_chars: int) -> list[str]:
    out = []
    with shared_path("corpus", name).open(encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)["text"]
            if len(t) >= min_chars:
                out.append(t[:max_chars])
            if len(out) == n:
                break
    return out


def _span(text: str, start_tok: int, count: int) -> str:
    ts = ref_tokens(text)
    return text[ts[start_tok][1] : ts[start_tok + count - 1][2]]


def planted_corpus() -> tuple[list[str], list[tuple[int, str]]]:
    """About 60 real documents; plants as (document index of the later copy, the copy's text)."""
    rng = random.Random(7)
    zh = _jsonl("zh_wikipedia.jsonl", 20, 300, 700)
    en = _jsonl("en_wikipedia.jsonl", 20, 1200, 1600)
    hant = shared_path("zh", "ud_gsd_dev_hant.txt").read_text(encoding="utf-8").splitlines()
    hans = shared_path("zh", "ud_gsdsimp_dev_hans.txt").read_text(encoding="utf-8").splitlines()
    # Sentence pairs that are the same text once folded (the UD Simplified edition differs from a
    # character fold in a few words): 6 documents of 6 consecutive ones, in each script.
    same = [i for i in range(len(hant)) if [t for t, *_ in ref_tokens(hant[i])] == [t for t, *_ in ref_tokens(hans[i])]]
    trad_docs = ["".join(hant[i] for i in same[6 * k : 6 * k + 6]) for k in range(6)]
    simp_docs = ["".join(hans[i] for i in same[6 * k : 6 * k + 6]) for k in range(6)]
    assert all(len(ref_tokens(t)) >= MIN_TOKENS for t in trad_docs)
    docs = zh[:10] + en[:10] + simp_docs + zh[10:] + en[10:]  # originals before their copies
    plants: list[tuple[int, str]] = []

    def plant(dst: int, copy: str, at: str = "middle") -> None:
        text = docs[dst]
        if at == "sentence":  # after a sentence end
            i = rng.choice([m.end() for m in re.finditer(r"[。.]\s*", text)][1:-1])
        else:
            i = {"start": 0, "end": len(text), "middle": len(text) // 2}[at]
        docs[dst] = text[:i] + copy + text[i:]
        plants.append((dst, copy))

    base_zh, base_en = 26, 36  # zh[10:] and en[10:] start here
    # zh, inside a paragraph (between two characters), 40 and 31 Han tokens
    plant(base_zh + 0, _span(zh[0], 20, 40))
    plant(base_zh + 1, _span(zh[1], 5, MIN_TOKENS + 1))
    # zh, full-width punctuation of the original as half-width in the copy, and the other way round
    plant(base_zh + 2, _span(zh[2], 10, 45).replace("，", ",").replace("。", ". ").replace("、", ","))
    plant(base_zh + 3, _span(zh[3], 10, 45).replace("，", "， ").replace("（", "(").replace("）", ")"))
    # en, across line breaks: the copy has a line break and a blank line where the original had spaces
    words = _span(en[0], 30, 60).split(" ")
    plant(base_en + 0, " " + " ".join(words[:20]) + "\n" + " ".join(words[20:40]) + "\n\n" + " ".join(words[40:]) + " ")
    plant(base_en + 1, " " + _span(en[1], 50, MIN_TOKENS).upper() + " ", at="sentence")  # case folds too
    # Traditional copies of Simplified documents, one whole and one as a paragraph of its own
    plant(base_zh + 4, "\n" + trad_docs[0] + "\n", at="sentence")
    plant(base_en + 2, "\n\n" + trad_docs[1][: len(trad_docs[1]) * 2 // 3] + "\n\n", at="sentence")
    # one document holding two planted spans and a too-short one (29 tokens: must stay)
    plant(base_zh + 5, _span(zh[4], 0, 35) + "。", at="start")
    plant(base_zh + 5, "“" + _span(zh[5], 40, 33) + "”", at="end")
    docs[base_zh + 6] = docs[base_zh + 6] + "\n" + _span(zh[6], 3, MIN_TOKENS - 1)
    return docs, plants


def run_stage(tmp_path: Path, texts: list[str], options: dict, files: int = 3) -> tuple[list[str | None], dict, dict]:
    """The texts through a [substrings] pipeline, by the engine's task functions in this process.
    Returns (each text as kept, None where rejected), kept rows by id, rejected rows by id."""
    data = tmp_path / "data"
    data.mkdir()
    per = len(texts) // files + 1
    ids = []
    for f in range(files):
        chunk = texts[f * per : (f + 1) * per]
        (data / f"p{f}.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in chunk))
        ids += [f"web/data/p{f}.jsonl#L{i + 1}" for i in range(len(chunk))]
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "ss",
            "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
            "split": {"target_bytes": 1 << 30, "group_small_files": False},
            "stages": [{"substrings": {"partitions": PARTITIONS, "min_tokens": MIN_TOKENS, **options}}],
        },
    )
    spec = make_spec(load_pipeline(pipeline), tmp_path / "out", tmp_path / "cache")
    assert len(spec.shards) == files  # the copies are in other shards than their originals
    run_here(spec, plan_phases(spec))  # the map tasks, every round's merges and partitions, the map tasks after
    out = tmp_path / "out"
    kept = {r["id"]: r for f in sorted((out / "docs").glob("**/*.parquet")) for r in pq.read_table(f).to_pylist()}
    rejected = {r["id"]: r for f in sorted((out / "rejected").glob("**/*.parquet")) for r in pq.read_table(f).to_pylist()}
    return [kept[i]["text"] if i in kept else None for i in ids], kept, rejected


def windows(text: str, n: int) -> set[tuple[str, ...]]:
    ts = [t for t, _, _ in ref_tokens(text)]
    return {tuple(ts[i : i + n]) for i in range(len(ts) - n + 1)}


@pytest.mark.parametrize("keep", ["first", "none"])
def test_every_planted_span_goes_and_the_reference_agrees_on_every_character(
    tmp_path: Path, keep: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if keep == "none":  # the rounds read 3 documents at a time here and tokenise 2,000 characters, across chunk ends
        monkeypatch.setattr("datapipe.stages.substrings.READ_DOCS", 3)
        monkeypatch.setattr("datapipe.stages.substrings.TOKENIZE_CHARS", 2000)
    docs, plants = planted_corpus()
    got, kept, rejected = run_stage(tmp_path, docs, {"keep": keep, "min_chars_after": 0})
    want = reference(docs, MIN_TOKENS, keep)
    assert not rejected
    for d, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"document {d} differs from the reference"
    # Found: no window of a planted copy is left in the document it was planted in (independent of
    # the reference: the copy's own tokens), and with keep: first the original still has it all.
    for dst, copy in plants:
        assert not windows(copy, MIN_TOKENS) & windows(got[dst] or "", MIN_TOKENS), f"plant in document {dst} left"
    changed = {d for d in range(len(docs)) if got[d] != docs[d]}
    assert {dst for dst, _ in plants} <= changed
    if keep == "first":
        assert changed == {dst for dst, _ in plants}  # these real documents repeat nothing else
        assert docs[32] == got[32]  # the 29-token repeat stays
    rows = [r for r in kept.values() if r["substr_spans_removed"]]
    if keep == "first":
        assert sum(r["substr_spans_removed"] for r in rows) == len(plants)
    assert all(r["substr_chars_removed"] > 0 and r["substr_removed"] for r in rows)


def test_short_leftovers_are_rejected_with_their_original_text(tmp_path: Path) -> None:
    zh = _jsonl("zh_wikipedia.jsonl", 3, 300, 500)
    docs = [zh[0], zh[1], "前言。" + zh[0] + "完", zh[2]]  # the third is a copy with 4 characters around it
    got, kept, rejected = run_stage(tmp_path, docs, {"min_chars_after": 20}, files=2)
    assert got[0] == docs[0] and got[1] == docs[1] and got[3] == docs[3]
    (row,) = rejected.values()
    assert row["reason"] == "substring_only" and row["text"] == docs[2] and row["stage"] == "substrings"
    assert "min_chars_after 20" in row["detail"]


def test_winnowing_anchors_hit_every_shared_window_of_min_tokens() -> None:
    """The guarantee the map phase relies on (proof in datapipe/dedup/substrings.py): two documents
    sharing a span of exactly min_tokens tokens share an anchor at the same offset inside it."""
    en = _jsonl("en_wikipedia.jsonl", 40, 800, 3000)
    rng = random.Random(3)
    for n in (8, 13, 30, 50):
        k, w = winnow_params(n)
        assert w + k - 1 == n
        for trial in range(20):
            a, b = rng.sample(en, 2)
            ta = ref_tokens(a)
            i = rng.randrange(len(ta) - n)
            span = a[ta[i][1] : ta[i + n - 1][2]]
            cut = rng.randrange(len(b))
            other = b[:cut] + " " + span + " " + b[cut:]
            toks = tokenize([a, other], fold=True)
            doc, pos, h = anchors(toks, n)
            at_a = {(p - i, x) for d, p, x in zip(doc, pos, h) if d == 0 and i <= p <= i + n - k}
            j = next(
                p
                for p in range(toks.count(1))
                if toks.strings(1, p, p + 1)[0] == toks.strings(0, i, i + 1)[0]
                and toks.strings(1, p, p + n) == toks.strings(0, i, i + n)
            )
            at_b = {(p - j, x) for d, p, x in zip(doc, pos, h) if d == 1 and j <= p <= j + n - k}
            assert at_a & at_b, (n, trial)


def test_offsets_map_tokens_back_to_the_original_characters() -> None:
    text = "Ｈｅｌｌｏ，世界！ Cafe\u0301 ﬁne 國語 12３"
    toks = tokenize([text], fold=True)
    got = [(toks.strings(0, i, i + 1)[0], text[toks.char_start[i] : toks.char_end[i]]) for i in range(toks.count(0))]
    assert got == [
        ("hello", "Ｈｅｌｌｏ"),
        ("世", "世"),
        ("界", "界"),
        ("café", "Cafe\u0301"),
        ("fine", "ﬁne"),
        ("国", "國"),
        ("语", "語"),
        ("000", "12３"),
    ]
    assert [t for t, _, _ in ref_tokens("Ｈｅｌｌｏ，世界！ 國語")] == ["hello", "世", "界", "国", "语"]


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"min_tokens": 3}, "min_tokens"),
        ({"keep": "last"}, "keep"),
        ({"kinds": ["webb"]}, "kinds[0]"),
        ({"max_recorded_spans": -1}, "max_recorded_spans"),
    ],
)
def test_bad_options_name_their_key(tmp_path: Path, options: dict, key: str) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    pipeline = write_pipeline(
        tmp_path, {"name": "t", "sources": [{"name": "w", "paths": ["a.jsonl"]}], "stages": [{"substrings": options}]}
    )
    with pytest.raises(DatapipeError) as err:
        load_pipeline(pipeline)
    assert f"stages[0].substrings.{key}: " in str(err.value)
