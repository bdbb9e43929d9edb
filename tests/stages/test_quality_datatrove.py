"""The ``fineweb_datatrove`` preset (datatrove 0.10.1's GopherRepetition, GopherQuality, C4 and
FineWeb filters) against datapipe's own en_web rules, on real English Wikipedia pages whose
decision differs in the ways docs/stages/quality.md documents. Each expectation is derived from
datatrove's rule definitions (datatrove/pipeline/filters/*.py) and spaCy's documented tokenization,
not copied from a run; bench/quality/fineweb_agreement.py measures the agreement with datatrove itself.
"""

from __future__ import annotations

import collections
import json
import re
import string

import pyarrow as pa
import pytest

from datapipe.stages.base import CheckContext, StageContext
from datapipe.stages.langid import LangIdOptions
from datapipe.stages.quality import Quality, QualityOptions
from datapipe.stages.quality.dt_view import ISSPACE
from datapipe.text.spacy_en import english
from tests.support.shared_data import shared_path

# Pages of ../shared/data/corpus/en_wikipedia.jsonl (by their source id), chosen for each case below.
NUMBERS = ["enwiki_zhouyii#18590950", "enwiki_zhouyii#18630594"]  # dates, sizes in parentheses
LIST_TAIL = "enwiki_zhouyii#18499141"  # prose, then a list of short headings without punctuation
ABBREVIATION = "enwiki_zhouyii#18838700"  # "P.L. Santoshi." in its last sentence


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    want = set(NUMBERS) | {LIST_TAIL, ABBREVIATION}
    out = {}
    with open(shared_path("corpus", "en_wikipedia.jsonl"), encoding="utf-8") as f:
        for line in f:
            if any(i in line for i in want):  # cheap before parsing: 24,535 pages
                d = json.loads(line)
                if d["source"] in want:
                    out[d["source"]] = d["text"]
    assert set(out) == want
    return out


def decide(texts: list[str], rules: object) -> tuple[list[str | None], pa.Table]:
    stage = Quality(QualityOptions(rules=rules), StageContext(".", "."))  # type: ignore[arg-type]
    b = pa.table({"id": [str(i) for i in range(len(texts))], "kind": ["web"] * len(texts), "lang": ["en"] * len(texts)})
    b = stage.compute(b.append_column("text", pa.array(texts)))
    return stage.decide(b).reason.to_pylist(), b


PRESET = {"en_web": "fineweb_datatrove"}


def test_words_are_spacys_documented_tokens():
    # spaCy's documentation (Linguistic Features, Tokenization) walks through these two
    words = english().words
    assert words("Apple is looking at buying U.K. startup for $1 billion") == [
        "Apple", "is", "looking", "at", "buying", "U.K.", "startup", "for", "$", "1", "billion",
    ]  # fmt: skip
    assert words('"Let\'s go to N.Y.!"') == ['"', "Let", "'s", "go", "to", "N.Y.", "!", '"']
    # prefixes, infixes and suffixes: punctuation leaves the word; a number stays whole
    assert words("(born 1895 – died 1977), co-op; 22–27\xa0mm.") == [
        "(", "born", "1895", "–", "died", "1977", ")", ",", "co", "-", "op", ";", "22–27", "mm", ".",
    ]  # fmt: skip
    assert words("don't") == ["do", "n't"]


def test_chunks_are_cut_where_python_sees_space():
    assert set(ISSPACE) == {chr(c) for c in range(0x110000) if chr(c).isspace()}


def test_punctuation_and_numbers_count_as_words(pages):
    """GopherQualityFilter: 80% of words must contain a letter, and datatrove's words are spaCy
    tokens, so "(10 March 1895 – 22 June 1977)" is 9 words of which 2 have a letter. Pages that
    datapipe's whitespace words keep fall under 0.8 there."""
    texts = [pages[i] for i in NUMBERS]
    default, _ = decide(texts, "auto")
    preset, b = decide(texts, PRESET)
    for text, ours, theirs, frac in zip(texts, default, preset, b["dt_alpha_words_frac"].to_pylist()):
        ws = text.split()
        assert sum(any(c.isalpha() for c in w) for w in ws) / len(ws) >= 0.8  # whitespace words: passes
        # punctuation marks and numbers split off as words of their own (a plain splitter, not spaCy's)
        plain = re.findall(rf"[^\s{re.escape(string.punctuation)}–—]+|[{re.escape(string.punctuation)}–—]", text)
        assert sum(any(c.isalpha() for c in w) for w in plain) / len(plain) < 0.8
        assert ours is None
        assert theirs == "datatrove_gopher_quality:below_alpha_threshold" and frac < 0.8


def test_fineweb_judges_the_lines_c4_keeps(pages):
    """In datatrove's chain C4QualityFilter rewrites the text to the lines it keeps (ending in
    . ? ! " ', 3+ words), and FineWebQualityFilter judges that text: a list of short headings at
    the end of a page, which datapipe's FineWeb rules count, is gone by then."""
    text = pages[LIST_TAIL]
    (ours,), _ = decide([text], "auto")
    (theirs,), b = decide([text], PRESET)
    assert ours is not None and ours.startswith("fineweb:")
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    kept = [x for x in lines if x.endswith((".", "?", "!", '"', "'")) and len(x.split()) >= 3]
    assert sum(len(x) <= 30 for x in kept) / len(kept) <= 0.67
    assert sum(x.endswith((".", "!", "?")) for x in kept) / len(kept) >= 0.12
    assert theirs is None
    assert b["dt_fw_short_line_ratio"][0].as_py() == sum(len(x) <= 30 for x in kept) / len(kept)


def test_sentences_are_spacys(pages):
    """C4QualityFilter counts sentences with spaCy's sentencizer: a sentence ends at a token that
    is a sentence-ending character, and "P.L." is one token, so it ends none; datapipe's c4
    counts a period before a space."""
    text = pages[ABBREVIATION]
    (ours,), a = decide([text], "auto")
    (theirs,), b = decide([text], PRESET)
    assert "P.L." in english().words(text)
    assert ours is None and a["c4_sentences"][0].as_py() >= 5
    assert theirs == "datatrove_c4:too_few_sentences"
    assert b["dt_c4_sentences"][0].as_py() == a["c4_sentences"][0].as_py() - 1  # the "P.L. " datapipe counts


def test_preset_is_picked_by_name(tmp_path):
    before = (("langid", LangIdOptions(keep=["en"])),)
    ctx = CheckContext(tmp_path, frozenset({"web"}), before)
    assert Quality.check(QualityOptions(rules=PRESET), ctx) == []
    problems = Quality.check(QualityOptions(rules={"en_web": "fineweb_datatrov"}), ctx)
    assert len(problems) == 1 and problems[0][0] == "rules.en_web" and "fineweb_datatrove" in problems[0][1]


def _top(words: list[str], n: int) -> int:
    """datatrove's find_top_duplicate: the most common space-joined n-gram, length x count."""
    grams = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0
    gram, count = collections.Counter(grams).most_common(1)[0]
    return len(gram) * count


def _dup(words: list[str], n: int) -> int:
    """datatrove's find_all_duplicate: the left-to-right walk over concatenated n-grams."""
    seen: set[str] = set()
    repeated = i = 0
    while i < len(words) - n + 1:
        gram = "".join(words[i : i + n])
        if gram in seen:
            repeated, i = repeated + len(gram), i + n
        else:
            seen.add(gram)
            i += 1
    return repeated


def test_repetition_walks_are_datatroves_on_real_pages():
    """The compiled n-gram walks (hash-keyed) against datatrove's own definitions written plainly."""
    with open(shared_path("corpus", "en_wikipedia.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(120), f)]
    _, b = decide(texts, PRESET)
    assert sum(x > 0 for x in b["dt_dup5_frac"].to_pylist()) >= 10  # pages with repeats to walk over
    words = english().words
    for i, text in enumerate(texts):
        w = words(text)
        for n in (2, 3, 4):
            assert b[f"dt_top{n}_frac"][i].as_py() == _top(w, n) / len(text), (i, n)
        for n in range(5, 11):
            assert b[f"dt_dup{n}_frac"][i].as_py() == _dup(w, n) / len(text), (i, n)
