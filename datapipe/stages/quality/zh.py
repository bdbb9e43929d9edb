"""Chinese web rules: character-based, since Chinese has no spaces to count words by.

Lengths are non-whitespace characters; repetition is Gopher's, over characters instead of
words (``zh_repetition``). Thresholds and where they come from are in ``zh_web.yaml``.

With the setting ``markdown: true`` both filters judge the prose view of a document
(``markdown.py``: code blocks, math, tables, markup removed), so technical Chinese in Markdown is
judged by its sentences, not by its code; ``zh_prose_frac`` records how much of it was prose.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.stages.quality.gopher import repetition, repetition_filter
from datapipe.stages.quality.rules import Filter, Rule, register
from datapipe.stages.quality.text import Docs, Pieces, ratio, utf8_buffers
from datapipe.text import charclass

try:  # numba is a dependency; the numpy reference keeps the package importable without it
    from datapipe.stages.quality import _kernels
    from datapipe.stages.quality.charclass import CharClasses
except ImportError:  # pragma: no cover - only where numba is absent
    _kernels = None  # type: ignore[assignment]
    CharClasses = None  # type: ignore[assignment,misc]

F32 = pa.float32()
# Sentence ends: the ideographic full stop 。 and the full-width full stop ． (U+FF0E, which
# OI-wiki and much technical/academic Chinese use instead of 。), ! ? in both widths, the ellipsis.
ZH_TERMINAL = r"[。．！？…!?]+"
LIST_ITEM_HAN = 15
# Line ends that close a sentence or a quotation in Chinese and English text.
ZH_LINE_END = r"[。．！？…；.!?;][”’」』）)]*$"
BRACKETS = r"[\[\]{}()（）【】《》〈〉「」『』<>]"
SYMBOLS = r"[\p{S}\p{Co}�]"  # symbols (★ ■ ♥ ©, emoji), private use, replacement char


# One-character classes the rules count, in one pass per text (charclass.py); rows _SPACE.._SYM.
_SPACE, _HAN, _TERM, _BRACKET, _DIGIT, _SYM = range(6)
HAN = f"[{charclass.regex_class(charclass.HAN)}]"  # one Han character (datapipe.text.charclass)
_CLASS_PATTERNS = (r"\s", HAN, ZH_TERMINAL[:-1], BRACKETS, r"\pN", SYMBOLS)
_CLASS_RUNS = (False, False, True, False, False, False)  # ZH_TERMINAL is a run: `[...]+`
_classes = CharClasses(_CLASS_PATTERNS, _CLASS_RUNS) if CharClasses is not None else None


def class_counts(text: pa.Array, reference: bool = False) -> np.ndarray:
    """Counts of the ``_CLASS_PATTERNS`` in each text (int64, class x text), as ``Docs.count`` gives."""
    if _classes is not None and not reference:
        return _classes.counts(text)
    text = pc.fill_null(text, "")
    return np.array(
        [
            pc.count_substring_regex(text, p + "+" if r else p).to_numpy(zero_copy_only=False)
            for p, r in zip(_CLASS_PATTERNS, _CLASS_RUNS)
        ],
        dtype=np.int64,
    ).reshape(6, -1)


def _view(docs: Docs, params: dict[str, Any]) -> Docs:
    return docs.prose if params.get("markdown") else docs


def _list_sentences(lines: Pieces, params: dict[str, Any]) -> np.ndarray:
    """Markdown list items that are sentences without a full stop, per document (markdown only).

    Release notes and changelogs state one change per item and end none with 。 (119 of the 121
    TiDB pages that failed ``terminal_punct`` on prose were release notes). An item counts as a
    sentence when it has ``LIST_ITEM_HAN`` Han characters: link-farm and product-list items
    are titles of 5-10.
    """
    if not params.get("markdown"):
        return np.zeros(lines.n_docs)
    item = lines.matches(r"^(?:[-*+]|\d{1,3}[.)])\s") & ~lines.matches(ZH_LINE_END)
    han = class_counts(lines.values)[_HAN]
    return lines.per_doc((item & (han >= LIST_ITEM_HAN)).astype(np.float64))


def _zh(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    raw = class_counts(docs.text)
    all_chars = (docs.n_chars - raw[_SPACE]).astype(np.float64)
    view = _view(docs, params)
    counts = raw if view is docs else class_counts(view.text)
    docs = view
    chars = (docs.n_chars - counts[_SPACE]).astype(np.float64)
    han = counts[_HAN]
    lines = docs.lines
    n_lines = lines.per_doc()
    return {
        "zh_chars": chars.astype(np.int32),
        "zh_han_ratio": ratio(han, chars),
        "zh_line_punct_ratio": ratio(lines.per_doc(lines.matches(ZH_LINE_END)), n_lines),
        # Sentence ends per 100 Han characters: works for one-line pages, where line ends do not,
        # and counts only the prose of pages with code or formulas.
        "zh_terminal_per_100": 100 * ratio(counts[_TERM] + _list_sentences(lines, params), han),
        "zh_bracket_ratio": ratio(counts[_BRACKET], chars),
        "zh_digit_ratio": ratio(counts[_DIGIT], chars),
        "zh_symbol_ratio": ratio(counts[_SYM], chars),
        "zh_mean_line_len": ratio(chars, n_lines),
        "zh_prose_frac": np.minimum(ratio(chars, all_chars), 1.0),
    }


register(
    Filter(
        "zh",
        {
            "zh_chars": pa.int32(),
            "zh_han_ratio": F32,
            "zh_line_punct_ratio": F32,
            "zh_terminal_per_100": F32,
            "zh_bracket_ratio": F32,
            "zh_digit_ratio": F32,
            "zh_symbol_ratio": F32,
            "zh_mean_line_len": F32,
            "zh_prose_frac": F32,
        },
        (
            Rule("too_short", "zh_chars", "min", "min_chars"),
            Rule("too_long", "zh_chars", "max", "max_chars"),
            Rule("han_ratio", "zh_han_ratio", "min"),
            Rule("terminal_punct", "zh_terminal_per_100", "min"),
            Rule("line_punct", "zh_line_punct_ratio", "min"),
            Rule("bracket_ratio", "zh_bracket_ratio", "max"),
            Rule("digit_ratio", "zh_digit_ratio", "max"),
            Rule("symbol_ratio", "zh_symbol_ratio", "max"),
            Rule("mean_line_len", "zh_mean_line_len", "min"),
            Rule("prose_frac", "zh_prose_frac", "min"),
        ),
        _zh,
        frozenset({"markdown"}),
        frozenset({"markdown"}),
    )
)


def _char_repetition(docs: Docs, params: dict[str, Any], batch: pa.Table) -> dict[str, np.ndarray]:
    docs = _view(docs, params)
    # N-gram repetition of a long page is judged on its first `ngram_chars` characters: machine
    # repetition shows there too, and hashing every character of 50 kB manuals costs 10x more.
    ids, doc, weight = char_tokens(docs, bool(params.get("latin_words")), int(params.get("ngram_chars", 5000)))
    return repetition(docs, "zh_rep", ids, doc, weight)


def char_tokens(docs: Docs, latin_words: bool, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, documents and weights (characters) of the first ``limit`` characters of each text.

    A compiled pass over the UTF-8 bytes (``_kernels.char_tokens``) that stops at the limit;
    ``char_tokens_reference`` is the numpy definition it reproduces exactly (tested on real data).
    """
    if _kernels is None:  # pragma: no cover - only where numba is absent
        return char_tokens_reference(docs, latin_words, limit)
    data, offsets = utf8_buffers(docs.text)
    count = _kernels.char_tokens(
        data, offsets, latin_words, float(limit), _P, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    )
    ids, doc, weight = np.empty(count, np.int64), np.empty(count, np.int64), np.empty(count)
    _kernels.char_tokens(data, offsets, latin_words, float(limit), _P, ids, doc, weight)
    return ids, doc, weight


def char_tokens_reference(docs: Docs, latin_words: bool, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The numpy definition of ``char_tokens`` (tokenize every character, then keep the head)."""
    if latin_words:
        ids, doc, weight = _mixed_tokens(docs)
    else:
        cps, doc = docs.chars
        ids, weight = cps.astype(np.int64), np.ones(len(cps))
    starts = np.searchsorted(doc, np.arange(docs.n))
    head = (np.cumsum(weight) - weight - np.r_[0.0, np.cumsum(weight)][starts][doc]) < limit
    return ids[head], doc[head], weight[head]


_P = np.uint64(1_000_003) ** np.arange(64, dtype=np.uint64)  # powers for hashing a word's letters (wraps)


def _mixed_tokens(docs: Docs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens for mixed Chinese/Latin text: every non-space character, except that a run of ASCII
    letters, digits and ``_`` is one token (weighted by its length).

    Technical Chinese repeats its identifiers (TiDB, TiKV, Prometheus) in every sentence; as
    single letters each name is several repeated characters and inflates character n-gram
    repetition (half of the TiDB pages above ``dup5_frac`` 0.45). A word is one token, as a Han
    character (about a word) is; pure Chinese text tokenizes exactly as before.
    """
    texts = docs.text.to_pylist()
    cps = np.frombuffer("\n".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    doc = np.repeat(np.arange(docs.n), docs.n_chars + 1)[: len(cps)]
    space = np.isin(cps, _WS)
    word = ((cps >= 48) & (cps <= 57)) | ((cps >= 65) & (cps <= 90)) | ((cps >= 97) & (cps <= 122)) | (cps == 95)
    cont = np.zeros(len(cps), dtype=bool)  # continues the word of the previous character
    cont[1:] = word[1:] & word[:-1]
    keep = ~space
    start = keep & ~cont
    tok = np.cumsum(start) - 1  # token of every character (valid where keep)
    pos = np.arange(len(cps)) - np.flatnonzero(start)[np.maximum(tok, 0)] if start.any() else np.zeros(len(cps), int)
    h = cps * _P[np.clip(pos, 0, 63)]
    first = np.flatnonzero(start)
    ids = np.add.reduceat(np.where(keep, h, 0), first) if len(first) else np.zeros(0, np.uint64)
    weight = np.add.reduceat(keep.astype(np.float64), first) if len(first) else np.zeros(0)
    return ids.view(np.int64), doc[first], weight


_WS = np.array([ord(c) for c in " \t\n\r\v\f\u3000\u00a0"], dtype=np.uint64)


repetition_filter("zh_repetition", "zh_rep", _char_repetition, frozenset({"ngram_chars"}), frozenset({"markdown", "latin_words"}))
