"""One batch of documents seen the way datatrove 0.10.1's English filters see them.

The ``datatrove_*`` filters (``dt_filters.py``) reproduce datatrove's GopherRepetitionFilter,
GopherQualityFilter, C4QualityFilter and FineWebQualityFilter with their default settings. They
share this view, computed once per batch:

* words: spaCy's English tokens (``datapipe/text/spacy_en.py``), as datatrove's
  ``split_into_words(text, "eng")``: "word," is two words, "(1990)." four;
* lines and paragraphs the way each filter cuts them (``\\n+`` and ``\\n{2,}`` for Gopher
  repetition, ``str.splitlines`` for Gopher quality and C4);
* C4's line pass: the lines C4QualityFilter keeps and what it rewrites ``doc.text`` to, which
  is the text FineWebQualityFilter then judges in datatrove's chain.

Everything is per document in Python except the n-gram walks (``_dt_kernels.py``); distinct
whitespace chunks are tokenized once per process.
"""

from __future__ import annotations

import json
import re
import unicodedata
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.stages.quality.text import Docs, to_np
from datapipe.text.spacy_en import RULES_FILE, english

_CHARS = json.loads((Path(__file__).resolve().parents[2] / "text" / "datatrove_chars.json").read_text(encoding="utf-8"))
PUNCTUATION_SET = frozenset(_CHARS["punctuation"]) | frozenset(_CHARS["terminal_punctuation"])
TERMINAL_PUNCTUATION = tuple(_CHARS["terminal_punctuation"])  # FineWeb's stop_chars
STOP_WORDS = frozenset(["the", "be", "to", "of", "and", "that", "have", "with"])  # GopherQualityFilter's
SENTENCE_PUNCT = frozenset(json.loads(RULES_FILE.read_text(encoding="utf-8"))["sentence_punct_chars"])

# C4QualityFilter (datatrove/pipeline/filters/c4_filters.py)
CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
MAX_WORD_LENGTH = 1000
MIN_WORDS_PER_LINE = 3

_PARAGRAPH = re.compile(r"\n{2,}")  # GopherRepetitionFilter
_LINE = re.compile("\n+")
_WHITESPACE_RUNS = re.compile(r"(\s+)")  # \s is str.isspace, where spaCy cuts chunks
# The same characters for Arrow's RE2 (whose \s is ASCII only): the code points str.isspace calls
# space (tests/stages/test_quality_datatrove.py checks the list against Python's).
ISSPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
_ISSPACE_RUNS = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in ISSPACE) + "]+"


@dataclass
class C4Pass:
    """C4QualityFilter on one document: what it counts, and the lines it keeps."""

    lorem_ipsum: bool  # in a line that reached the check (long-word, end-punctuation and 3-word checks passed)
    curly_bracket: bool  # likewise, and the line does not mention javascript
    sentences: int  # spaCy sentencizer sentences over the kept lines
    kept: list[str]  # stripped, citations removed; "\n".join(kept) is datatrove's new doc.text
    words: int  # spaCy words of the kept lines


def find_duplicates(pieces: list[str]) -> tuple[int, int]:
    """datatrove's ``find_duplicates``: repeats of an earlier piece, and their characters."""
    seen: set[str] = set()
    n = chars = 0
    for p in pieces:
        if p in seen:
            n += 1
            chars += len(p)
        else:
            seen.add(p)
    return n, chars


@lru_cache(maxsize=1 << 16)
def _is_punct(token: str) -> bool:
    """spaCy's lexical ``is_punct``: every character is in a Unicode P* category."""
    return all(unicodedata.category(c).startswith("P") for c in token)


def clear_caches() -> None:
    """Forget every chunk seen so far (tokens and sentences): a benchmark's cold start."""
    english().chunk_tokens.cache_clear()  # type: ignore[attr-defined]
    _chunk_sentences.cache_clear()


@lru_cache(maxsize=1 << 18)
def _chunk_sentences(chunk: str) -> tuple[int, bool, int, bool, int]:
    """The sentencizer over one chunk's tokens, from either state: (sentences started, period seen
    after) coming in without a pending period, the same coming in with one, and the token count."""
    tokens = english().chunk_tokens(chunk)
    out: list[int | bool] = []
    for seen_period in (False, True):
        started = 0
        for t in tokens:
            if t in SENTENCE_PUNCT:
                seen_period = True
            elif seen_period and not _is_punct(t):
                started, seen_period = started + 1, False
        out += [started, seen_period]
    return int(out[0]), bool(out[1]), int(out[2]), bool(out[3]), len(tokens)


def sentence_count(line: str) -> tuple[int, int]:
    """(``len(split_into_sentences(line, "eng"))``, its word count) for a non-empty line without
    trailing whitespace: spaCy's sentencizer starts a sentence at the first token that is neither
    punctuation nor a sentence-ending character after one that is sentence-ending. Whitespace
    other than one space between chunks is a token of its own (not punctuation)."""
    count, words, seen_period = 1, 0, False
    for k, part in enumerate(_WHITESPACE_RUNS.split(line)):
        if k % 2:  # a whitespace run: one space is no token, anything else one whitespace token
            if part != " " and seen_period:
                count, seen_period = count + 1, False
        elif part:
            a0, s0, a1, s1, n = _chunk_sentences(part)
            count, seen_period = (count + a1, s1) if seen_period else (count + a0, s0)
            words += n
    return count, words


def c4_pass(text: str) -> C4Pass:
    """C4QualityFilter.filter with its defaults, without the early returns (signals, not a decision)."""
    lorem = curly = False
    sentences = n_words = 0
    kept: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        words = line.split()
        if any(len(w) > MAX_WORD_LENGTH for w in words):
            continue
        line = CITATION.sub("", line)
        if not line.endswith(END_PUNCTUATION) or line.endswith("..."):
            continue
        if len(words) < MIN_WORDS_PER_LINE:
            continue
        low = line.lower()
        lorem = lorem or "lorem ipsum" in low
        if "javascript" in low:
            continue
        curly = curly or "{" in line
        if any(p in low for p in POLICY):
            continue
        n_sentences, words_in_line = sentence_count(line)
        sentences += n_sentences
        n_words += words_in_line
        kept.append(line)
    return C4Pass(lorem, curly, sentences, kept, n_words)


class DatatroveView:
    """The batch's words (token ids, per-document offsets) and per-document text facts."""

    def __init__(self, docs: Docs) -> None:
        text = docs.text
        self.text = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
        self.texts: list[str] = docs.text.to_pylist()
        self.n = len(self.texts)

    @cached_property
    def words(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(word ids, offsets per document, the distinct words by id).

        Arrow cuts the texts at ``str.isspace`` characters and finds the distinct chunks of the
        batch; only those are looked up (or tokenized) in Python, and numpy lays their word ids
        out per occurrence."""
        tok = english()
        pieces = pc.split_pattern_regex(self.text, _ISSPACE_RUNS)
        per_doc = to_np(pc.list_value_length(pieces)).astype(np.int64)
        flat = pc.list_flatten(pieces)
        nonempty = to_np(pc.utf8_length(flat)).astype(np.int64) > 0  # "" before leading / after trailing space
        doc_of = np.repeat(np.arange(self.n), per_doc)[nonempty]
        enc = pc.dictionary_encode(flat.filter(pa.array(nonempty)))
        occ = to_np(enc.indices).astype(np.int64)
        vocab: dict[str, int] = {}
        chunk_ids: list[int] = []
        chunk_n = []
        for chunk in enc.dictionary.to_pylist():
            tokens = tok.chunk_tokens(chunk)
            chunk_ids.extend(vocab.setdefault(t, len(vocab)) for t in tokens)
            chunk_n.append(len(tokens))
        n_tok = np.array(chunk_n, np.int64)
        start = np.concatenate([[0], np.cumsum(n_tok)])[:-1]
        reps = n_tok[occ]  # words of each chunk occurrence, in text order
        total = int(reps.sum())
        # position of every word: its chunk's first word id + its rank within the chunk
        rank = np.arange(total) - np.repeat(np.cumsum(reps) - reps, reps)
        ids = np.array(chunk_ids, np.int64)[np.repeat(start[occ], reps) + rank] if total else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(np.bincount(doc_of, reps, minlength=self.n))]).astype(np.int64)
        return ids, offsets, list(vocab)

    @cached_property
    def word_doc(self) -> np.ndarray:
        _, offsets, _ = self.words
        return np.repeat(np.arange(self.n), np.diff(offsets))

    def word_flags(self, test: Callable[[str], bool]) -> np.ndarray:
        """``test(word)`` for every word of the batch, evaluated once per distinct word."""
        ids, _, vocab = self.words
        per_id = np.array([bool(test(w)) for w in vocab], dtype=bool)
        return per_id[ids] if len(vocab) else np.zeros(0, bool)

    @cached_property
    def word_lengths(self) -> np.ndarray:
        ids, _, vocab = self.words
        return np.array([len(w) for w in vocab], np.int64)[ids] if len(vocab) else np.zeros(0, np.int64)

    def per_doc(self, weights: np.ndarray) -> np.ndarray:
        return np.bincount(self.word_doc, weights.astype(np.float64), minlength=self.n)

    @cached_property
    def n_words(self) -> np.ndarray:
        _, offsets, _ = self.words
        return np.diff(offsets).astype(np.float64)

    @cached_property
    def text_lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.texts], np.float64)

    @cached_property
    def c4(self) -> list[C4Pass]:
        return [c4_pass(t) for t in self.texts]

    @cached_property
    def ngrams(self) -> tuple[np.ndarray, np.ndarray]:
        """(top n-gram characters for n = 2..4, duplicated n-gram characters for n = 5..10), per document."""
        from datapipe.stages.quality import _dt_kernels

        ids, offsets, vocab = self.words
        top = np.zeros((3, self.n), np.int64)
        dup = np.zeros((6, self.n), np.int64)
        if not vocab:
            return top, dup
        joined = "".join(vocab)
        cps = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
        lens = np.array([len(w) for w in vocab], np.int64)
        th = _dt_kernels.char_hashes(cps, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        _dt_kernels.repetition(ids, lens, th, offsets, top, dup)
        return top, dup


_VIEWS: weakref.WeakKeyDictionary[Docs, DatatroveView] = weakref.WeakKeyDictionary()


def view(docs: Docs) -> DatatroveView:
    """The view of this batch, shared by the ``datatrove_*`` filters of one rule set."""
    v = _VIEWS.get(docs)
    if v is None:
        v = _VIEWS[docs] = DatatroveView(docs)
    return v
